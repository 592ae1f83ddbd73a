"""Depth-wise attention: the one operation behind every AttnRes read (paper Eqs. 2-4).

    h = sum_s softmax_s( q . RMSNorm(v_s) ) * v_s

Keys are the RMS-normalised sources, values are the raw sources, there is no 1/sqrt(d) and no temperature,
and the softmax and every weighted sum run in fp32 whatever the input dtype (as in Kimi's production code).

The residual schemes build their reads from the ops below. Each op has one plain-torch reference
(``*_reference``: differentiable, what torch.compile traces, the path wherever no kernel applies, and what the
tests check the kernels against) and at most one fused kernel per device, chosen per call by the op's
dispatch function:

    op                    CPU, fp32, eager (cpu_kernels.py: C)   CUDA (gpu_kernels.py: Triton custom ops)
    key_logits            -                                      - (computed inside attend and merge)
    attend_batched        - (key_logits + mix_sources_batched)   attnres::attend
    mix_sources_batched   attnres_mix_forward / _backward        - (the schemes use attend_batched)
    merge_read            attnres_merge_forward / _backward      attnres::merge
    mix_sources           mix_sources_batched (Q = 1), then merge_read (K = 0)

Memory contract of the kernels (the references leave what to keep to autograd): the sources are never stacked;
a read fused with the PreNorm normalisation (``normalize_eps``) keeps its normalised output and rstd [B, T]
for backward, never the read h itself; mix_sources_batched keeps none of its outputs (a phase-1 output lives
only until merge_read consumes it). Design and measurements: docs/depth_ops.md.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from . import cpu_kernels, gpu_kernels
from .grad_sinks import GradSink, sinks_of, track_source

__all__ = [
    "attend_batched",
    "depth_attention",
    "key_logits",
    "merge_read",
    "mix_sources",
    "mix_sources_batched",
    "read_dtype",
    "rms_normalize",
    "rmsnorm_unit",
    "track_source",
]


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / RMS(x) over the last dim, computed in fp32 (no gain: the gain is folded into the query)."""
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rmsnorm_unit(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm with unit gain, returned in x's dtype: the normalisation of every sublayer's PreNorm (the gain is
    applied by the model's RMSNorm module). Computed in fp32 for stability under bf16 autocast."""
    return rms_normalize(x, eps).to(x.dtype)


def depth_attention(values: torch.Tensor, query: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Reference depth attention over stacked sources.

    values: [S, ..., D] stacked sources; query: [D] (pseudo-query, RMSNorm gain already folded in).
    Returns [..., D] in the dtype of ``values``.
    """
    if values.dim() < 2 or query.shape != values.shape[-1:]:
        raise ValueError(
            "depth_attention: values must be [S, ..., D] and query [D]; "
            f"got {tuple(values.shape)} and {tuple(query.shape)}"
        )
    keys = rms_normalize(values, eps)  # [S, ..., D] fp32
    logits = (keys * query.to(keys.dtype)).sum(-1)  # [S, ...]
    alpha = logits.softmax(dim=0)  # [S, ...] fp32 (or wider), sums to 1 over sources
    return (alpha.unsqueeze(-1) * values.to(keys.dtype)).sum(0).to(values.dtype)


def read_dtype(values: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> torch.dtype:
    """The dtype of a read of these sources: their promoted dtype (mix_sources' output; merge_read's out_dtype)."""
    out_dtype = values[0].dtype
    for v in values[1:]:
        out_dtype = torch.promote_types(out_dtype, v.dtype)
    return out_dtype


def _accumulation_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """fp32, or the widest of ``dtypes`` if that is wider (float64 stays float64)."""
    acc = torch.float32
    for dtype in dtypes:
        acc = torch.promote_types(acc, dtype)
    return acc


def _rstd(x: torch.Tensor, eps: float, dtype: torch.dtype | None = None) -> torch.Tensor:
    """(mean_D x^2 + eps)^-1/2 [...], the sum of squares accumulated in ``dtype`` inside the kernel (no widened
    copy of x, and autograd keeps x itself)."""
    return torch.rsqrt(torch.linalg.vector_norm(x, dim=-1, dtype=dtype).square() / x.shape[-1] + eps)


# ---------------------------------------------------------------------------------------------------------
# References: plain differentiable torch, one per op


def key_logits_reference(source: torch.Tensor, queries: torch.Tensor, eps: float) -> torch.Tensor:
    """logits[b, t, r] = queries[r] . RMSNorm(source[b, t]) = rstd[b, t] * (source[b, t] . queries[r]).

    source [B, T, D], queries [R, D] -> [B, T, R] in fp32 (or wider). A matmul scaled by 1/RMS: the normalised key
    is never materialised. The products run in fp32 (a bf16 logit is too coarse for the softmax)."""
    acc = _accumulation_dtype(source.dtype, queries.dtype)
    rstd = _rstd(source, eps, dtype=acc)  # [B, T], straight from the (possibly bf16) source
    return (source.to(acc) @ queries.to(acc).t()) * rstd.unsqueeze(-1)  # [B, T, R]


def mix_sources_batched_reference(weights: torch.Tensor, values: list[torch.Tensor]) -> list[torch.Tensor]:
    """Q weighted sums of the same S sources: out_q = sum_s weights[s, :, :, q] * values[s].

    weights [S, B, T, Q], values S x [B, T, D] -> Q tensors [B, T, D] in fp32 (or wider). Source by source, one
    multiply-add each (a contraction over a stack of the sources would keep the stack for backward); a bf16
    source is widened inside the product, and autograd keeps the source itself, not a widened copy."""
    acc = _accumulation_dtype(*(v.dtype for v in values))
    w = weights.to(acc).unsqueeze(-1)  # [S, B, T, Q, 1]
    outs = []
    for q in range(w.shape[3]):
        out = w[0, :, :, q] * values[0]  # [B, T, D]
        for s in range(1, len(values)):
            out = torch.addcmul(out, w[s, :, :, q], values[s])
        outs.append(out)
    return outs


def merge_read_reference(
    base: torch.Tensor,
    z: torch.Tensor | None,
    extras: list[torch.Tensor],
    normalize_eps: float | None,
    out_dtype: torch.dtype,
    queries: torch.Tensor | None = None,
    key_eps: float = 1e-5,
) -> torch.Tensor:
    """One read's online-softmax merge (paper Algorithm 1, phase 2), then optionally the PreNorm normalisation:

        h = a_0 * base + sum_k a_k * extras[k],   a = softmax([0, z_1, .., z_K])   -> h, or rmsnorm_unit(h)

    base [B, T, D] is the softmax-weighted mix of the read's other sources (logit 0 relative to their log-sum-exp
    lse), extras K x [B, T, D], z [K, B, T]: each extra's logit minus lse. With ``queries`` [K, D] the extras'
    logits key_logits(extras[k], queries[k]) (with ``key_eps``) are added to z here. K = 0: h = base. Returned in
    ``out_dtype``."""
    h = base
    if extras:
        assert z is not None  # the extras' logits [K, B, T]
        if queries is not None:  # [K, B, T]
            z = z + torch.stack([key_logits(e, queries[k : k + 1], key_eps)[..., 0] for k, e in enumerate(extras)])
        zeros = torch.zeros_like(z[:1], dtype=base.dtype)
        a = torch.cat([zeros, z.to(base.dtype)]).softmax(0).unsqueeze(-1)  # [K + 1, B, T, 1]
        h = base * a[0]
        for k, e in enumerate(extras):
            h = torch.addcmul(h, a[k + 1], e)  # a bf16 extra is widened inside the product
    if normalize_eps is not None:
        h = rms_normalize(h, normalize_eps)
    return h.to(out_dtype, copy=h is base)  # a new tensor: base is left alone


def mix_sources_reference(
    weights: torch.Tensor, values: list[torch.Tensor], normalize_eps: float | None = None
) -> torch.Tensor:
    """One read: sum_s weights[s] * values[s] (rmsnorm_unit of it with ``normalize_eps``), weights [S, B, T],
    values S x [B, T, D] -> [B, T, D] in the values' promoted dtype."""
    base = mix_sources_batched_reference(weights.unsqueeze(-1), values)[0]
    return merge_read_reference(base, None, [], normalize_eps, read_dtype(values))


def attend_batched_reference(
    sources: list[torch.Tensor], queries: torch.Tensor, eps: float
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Phase 1 of Q reads with static queries over S sources: (outs Q x [B, T, D] fp32, lse [B, T, Q]) with
    l[s, q] = key_logits(sources[s], queries[q]), lse = logsumexp_s l, out_q = sum_s exp(l[s, q] - lse_q) v_s."""
    logits = torch.stack([key_logits(v, queries, eps) for v in sources])  # [S, B, T, Q] fp32
    lse = torch.logsumexp(logits, dim=0)  # [B, T, Q]
    return mix_sources_batched(torch.exp(logits - lse), sources), lse


# ---------------------------------------------------------------------------------------------------------
# The ops: one dispatch each (reference, or the device's kernel)


_LOW_PRECISION = (torch.bfloat16, torch.float16)


def _reference(fn: Callable[..., Any], *inputs: torch.Tensor, recompute: bool = False) -> Any:
    """fn(*inputs), fn a reference, autocast kept out. Under autograd (eager), with a bf16 / fp16 input or with
    ``recompute``, fn runs on fp32 copies of the inputs and autograd keeps only the inputs, running fn again in
    backward (_Recomputed): no fp32 copy of a low-precision source and none of fn's intermediates are kept, and a
    low-precision input's gradient is summed in fp32 over the whole op (and over ops, in its sink, for a tracked
    source) and rounded once, as the kernels do. Outputs: a tensor or a tuple."""
    low = recompute or any(t.dtype in _LOW_PRECISION for t in inputs)
    if low and torch.is_grad_enabled() and not torch.compiler.is_compiling():  # compiled: the compiler decides
        return _Recomputed.apply(fn, sinks_of(inputs), *inputs)
    with torch.autocast(device_type=inputs[0].device.type, enabled=False):
        return fn(*inputs)


def _widened(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


class _Recomputed(torch.autograd.Function):
    """fn(*inputs) on fp32 copies of the inputs, for which autograd keeps only the inputs: backward runs fn again,
    with autograd, and differentiates that (activation recomputation, as torch.utils.checkpoint, for one op). A
    tracked input's fp32 gradient goes into its sink (``sinks``, one per input)."""

    @staticmethod
    def forward(ctx, fn: Callable[..., Any], sinks: list[GradSink | None], *inputs: torch.Tensor) -> Any:
        ctx.fn, ctx.sinks = fn, sinks
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*inputs)
        with torch.autocast(device_type=inputs[0].device.type, enabled=False):
            return fn(*(_widened(t) for t in inputs))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        inputs = ctx.saved_tensors
        wide = [_widened(x.detach()).requires_grad_(need) for x, need in zip(inputs, ctx.needs_input_grad[2:])]
        with torch.enable_grad(), torch.autocast(device_type=inputs[0].device.type, enabled=False):
            outs = ctx.fn(*wide)
        outs = outs if isinstance(outs, tuple) else (outs,)
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        wanted = [w for w in wide if w.requires_grad]
        if not wanted or not pairs:
            return (None, None) + (None,) * len(inputs)
        got = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True))
        result: list[torch.Tensor | None] = []
        for x, w, sink in zip(inputs, wide, ctx.sinks):
            g = next(got) if w.requires_grad else None
            if g is not None and sink is not None:
                sink.add(g, deferrable=False)  # fp32: summed with the source's other terms, rounded once
                g = None
            result.append(None if g is None else g.to(x.dtype))
        return (None, None, *result)


def key_logits(source: torch.Tensor, queries: torch.Tensor, eps: float) -> torch.Tensor:
    """key_logits_reference (see _reference for a low-precision source)."""
    return _reference(functools.partial(key_logits_reference, eps=eps), source, queries)


def mix_sources_batched(weights: torch.Tensor, values: list[torch.Tensor]) -> list[torch.Tensor]:
    """Q reads at once: weights [S, B, T, Q], values S x [B, T, D] -> Q tensors [B, T, D] in fp32 (or wider),
    out_q = sum_s weights[s, :, :, q] * values[s] (mix_sources_batched_reference). CPU fp32 eager: the C kernel,
    which loads every token's S sources once for all Q reads, in both passes."""
    if weights.dim() != 4 or weights.shape[0] != len(values):
        raise ValueError(
            f"mix_sources_batched: weights must be [S, B, T, Q] with S = {len(values)} sources; "
            f"got {tuple(weights.shape)}"
        )
    if weights.dtype == torch.float32 and cpu_kernels.applies(*values):
        return list(_MixSourcesBatchedC.apply(weights.contiguous(), sinks_of(values), *values))
    return list(_reference(lambda w, *vs: tuple(mix_sources_batched_reference(w, list(vs))), weights, *values))


def merge_read(
    base: torch.Tensor,
    z: torch.Tensor | None,
    extras: list[torch.Tensor],
    normalize_eps: float | None,
    out_dtype: torch.dtype,
    queries: torch.Tensor | None = None,
    key_eps: float = 1e-5,
) -> torch.Tensor:
    """merge_read_reference: a_0 * base + sum_k a_k * extras[k], a = softmax([0, z (+ key logits)]), then
    rmsnorm_unit with ``normalize_eps``, in ``out_dtype``. base [B, T, D] (a phase-1 output, fp32), z [K, B, T],
    queries [K, D] or None.

    The caller hands base over: the fused CPU kernel (``normalize_eps``, out_dtype == base.dtype, fp32) writes the
    result into it. Kernels: CUDA (``normalize_eps``, K <= gpu_kernels.MAX_EXTRAS) and CPU fp32 eager as just said;
    both keep the normalised output and rstd, never h or base."""
    if (z is None and extras) or (z is not None and z.shape[0] != len(extras)):
        raise ValueError(
            f"merge_read: z must be [K, B, T] for K = {len(extras)} extra sources; "
            f"got {None if z is None else tuple(z.shape)}"
        )
    if queries is not None and queries.shape[0] != len(extras):
        raise ValueError(f"merge_read: queries must be [K, D] for K = {len(extras)} extra sources")
    if not extras:
        z = queries = None
    if normalize_eps is not None and len(extras) <= gpu_kernels.MAX_EXTRAS and gpu_kernels.applies(base, *extras):
        return gpu_kernels.merge_read(base, z, extras, normalize_eps, out_dtype, queries, key_eps)
    if normalize_eps is not None and out_dtype == base.dtype and len(extras) <= cpu_kernels.MAX_EXTRAS:
        zc = None if z is None else z.contiguous()  # [K, B, T]
        qc = None if queries is None else queries.contiguous()  # [K, D]
        if cpu_kernels.applies(base, *extras, *(t for t in (zc, qc) if t is not None)):
            return _MergeReadC.apply(base, zc, qc, key_eps, normalize_eps, sinks_of(extras), *extras)
    small = [t for t in (z, queries) if t is not None]

    def merged(b: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        zz, qq = (rest[0], rest[1] if queries is not None else None) if extras else (None, None)
        return merge_read_reference(b, zz, list(rest[len(small) :]), normalize_eps, out_dtype, qq, key_eps)

    return _reference(merged, base, *small, *extras, recompute=True)  # keeps neither h nor a product of base


def mix_sources(weights: torch.Tensor, values: list[torch.Tensor], normalize_eps: float | None = None) -> torch.Tensor:
    """One read: sum_s weights[s] * values[s], weights [S, B, T] and values S x [B, T, D] -> [B, T, D] in the
    values' promoted dtype (accumulated in fp32); with ``normalize_eps``, rmsnorm_unit of it: the read fused with
    the PreNorm normalisation of the sublayer that consumes it (mix_sources_reference).

    Computed as mix_sources_batched with Q = 1 followed by merge_read with K = 0, so the CPU kernels apply and
    the un-normalised read is not kept for backward there."""
    if weights.dim() != 3 or weights.shape[0] != len(values):
        raise ValueError(
            f"mix_sources: weights must be [S, B, T] with S = {len(values)} sources; got {tuple(weights.shape)}"
        )
    base = mix_sources_batched(weights.unsqueeze(-1), values)[0]  # [B, T, D] fp32
    return merge_read(base, None, [], normalize_eps, read_dtype(values))


def attend_batched(
    sources: list[torch.Tensor], queries: torch.Tensor, eps: float
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Phase 1 of Q reads with static queries over the same S sources (paper Algorithm 1), scoring included:
    attend_batched_reference, returning (Q outputs [B, T, D] fp32, lse [B, T, Q]); the gradient flows through
    both (merge_read's z is an extra's logit minus lse). sources S x [B, T, D], queries [Q, D] (gains folded in).
    CUDA: one Triton kernel scores and mixes the sources for all Q reads (gpu_kernels.attend)."""
    if queries.dim() != 2 or queries.shape[-1] != sources[0].shape[-1]:
        raise ValueError(
            f"attend_batched: queries must be [Q, D] with D = {sources[0].shape[-1]}; got {tuple(queries.shape)}"
        )
    if gpu_kernels.attend_fits(*queries.shape) and gpu_kernels.applies(*sources):
        return gpu_kernels.attend_batched(sources, queries, eps)
    return attend_batched_reference(sources, queries, eps)  # made of ops: key_logits, mix_sources_batched (C)


# ---------------------------------------------------------------------------------------------------------
# The CPU kernels as autograd Functions (the arithmetic is in csrc/depth_mix.c)


def _target(sink: GradSink | None, like: torch.Tensor) -> tuple[torch.Tensor, int, torch.Tensor | None]:
    """Where a kernel's backward puts a source's gradient: (tensor, mode, gradient to return). A tracked source's
    sink (GradSink.target: mode 1 write or 2 add; None returned), else a fresh tensor (mode 1) that is returned."""
    if sink is not None:
        return (*sink.target(like), None)
    grad = torch.empty_like(like)
    return grad, 1, grad


class _MixSourcesBatchedC(torch.autograd.Function):
    """mix_sources_batched on the C kernel (weights contiguous, every tensor fp32 on the CPU). Saves the weights
    and the sources (alive anyway), none of the outputs. A tracked source's terms go into its sink: deferred while
    its sink has no tensor yet and the group has room (GradSink.can_defer), else added by the kernel."""

    @staticmethod
    def forward(
        ctx, weights: torch.Tensor, sinks: list[GradSink | None], *values: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)  # an unused read hands back None, not a zero [B, T, D]
        ctx.sinks = sinks
        outs = [torch.empty_like(values[0]) for _ in range(weights.shape[-1])]  # Q x [B, T, D]
        cpu_kernels.mix_forward(weights, list(values), outs)
        ctx.save_for_backward(weights, *values)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        weights, *values = ctx.saved_tensors
        used = [q for q, g in enumerate(grads) if g is not None]
        grad_values: list[torch.Tensor | None] = [None] * len(values)
        if not used:
            return (None, None, *grad_values)
        grads_c = [None if g is None else g.contiguous() for g in grads]
        targets: list[torch.Tensor | None] = [None] * len(values)
        modes = [0] * len(values)
        for s, (v, sink) in enumerate(zip(values, ctx.sinks)):
            if not ctx.needs_input_grad[2 + s]:
                continue
            if sink is not None and sink.can_defer(len(used)):  # the outputs' gradients are read once, here
                for q in used:
                    sink.add(grads_c[q], weights[s, :, :, q].unsqueeze(-1))
            else:
                targets[s], modes[s], grad_values[s] = _target(sink, v)
        grad_weights = torch.empty_like(weights) if ctx.needs_input_grad[0] else None  # [S, B, T, Q]
        cpu_kernels.mix_backward(weights, values, grads_c, grad_weights, targets, modes)
        return (grad_weights, None, *grad_values)


class _MergeReadC(torch.autograd.Function):
    """merge_read fused with the normalisation on the C kernel, written into base (every tensor fp32 on the CPU).

    Saves a [K + 1, B, T, 1], the output y (= base), rstd [B, T, 1], the extras (alive anyway) and, with queries,
    the extras' logits and key rstd [K, B, T]; never base's own values, which backward does not need: with
    g = dL/dh, softmax's backward dL/dz_k = a_k (g.extra_k - g.h) takes only h's dot product g.h, and the norm's
    backward g = rstd (g_y - y m), m = mean_D(g_y y), gives g.h = m (D - sum y^2) / rstd = m D eps rstd.
    A tracked extra's gradient goes into its sink (GradSink.target)."""

    @staticmethod
    def forward(
        ctx,
        base: torch.Tensor,
        z: torch.Tensor | None,
        queries: torch.Tensor | None,
        key_eps: float,
        normalize_eps: float,
        sinks: list[GradSink | None],
        *extras: torch.Tensor,
    ) -> torch.Tensor:
        K, lead = len(extras), base.shape[:-1]
        a, rstd = base.new_empty((K + 1, *lead, 1)), base.new_empty((*lead, 1))
        logits = key_rstd = None
        if queries is not None:
            logits, key_rstd = base.new_empty((K, *lead)), base.new_empty((K, *lead))
        cpu_kernels.merge_forward(base, z, list(extras), queries, key_eps, normalize_eps, a, rstd, logits, key_rstd)
        ctx.mark_dirty(base)
        ctx.normalize_eps, ctx.sinks = normalize_eps, sinks
        ctx.save_for_backward(a, base, rstd, queries, logits, key_rstd, *extras)
        return base

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        a, y, rstd, queries, logits, key_rstd, *extras = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_base = torch.empty_like(grad_out)
        grad_z = grad_out.new_empty((len(extras), *grad_out.shape[:-1])) if extras else None  # [K, B, T]
        targets: list[torch.Tensor | None] = [None] * len(extras)
        grad_extras: list[torch.Tensor | None] = [None] * len(extras)
        modes = [0] * len(extras)
        for k, (e, sink) in enumerate(zip(extras, ctx.sinks)):
            if ctx.needs_input_grad[6 + k]:
                targets[k], modes[k], grad_extras[k] = _target(sink, e)
        grad_queries = cpu_kernels.merge_backward(
            grad_out,
            y,
            a,
            rstd,
            ctx.normalize_eps,
            extras,
            queries,
            logits,
            key_rstd,
            grad_base,
            grad_z,
            targets,
            modes,
        )
        if not ctx.needs_input_grad[2]:
            grad_queries = None
        return grad_base, grad_z, grad_queries, None, None, None, *grad_extras
