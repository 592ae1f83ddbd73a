"""Depth-wise attention: the one operation behind every AttnRes read (paper Eqs. 2-4).

    h = sum_s softmax_s( q . RMSNorm(v_s) ) * v_s

Keys are the RMS-normalised sources, values are the raw sources, there is no 1/sqrt(d) and no temperature,
and the softmax runs in fp32 whatever the input dtype (as in Kimi's production code).

The two hot paths have one fused kernel per device behind the functions below, and the torch code here is the
reference both are tested against and the path everywhere else:
  * CPU, fp32, eager: compiled C kernels (cpu_kernels.py, csrc/depth_mix.c) for mix_sources_batched and
    merge_read, when a C compiler is there;
  * CUDA: Triton kernels (gpu_kernels.py, depth_mix_triton.py) for attend_batched (phase 1 with the key logits
    computed in the same pass) and merge_read, when triton imports; torch.library custom ops, so they are used
    under torch.compile too.
"""

from __future__ import annotations

import threading

import torch

from . import cpu_kernels, gpu_kernels


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
        raise ValueError(f"depth_attention: values must be [S, ..., D] and query [D]; got {tuple(values.shape)} and {tuple(query.shape)}")
    keys = rms_normalize(values, eps)  # [S, ..., D] fp32
    logits = (keys * query.to(keys.dtype)).sum(-1)  # [S, ...]
    alpha = logits.softmax(dim=0)  # [S, ...] fp32 (or wider), sums to 1 over sources
    return (alpha.unsqueeze(-1) * values.to(keys.dtype)).sum(0).to(values.dtype)


class _MixSources(torch.autograd.Function):
    """out = sum_s weights[s] * values[s] without keeping a stacked copy of the values for backward.

    weights is [S, B, T] (the weights of one read); values are S tensors [B, T, D]; out is [B, T, D]. (Several
    reads of the same sources at once: _MixSourcesBatched.)

    Only the (already alive) source tensors and the small weights are saved, so activation memory stays
    O(L * B*T*D) (an einsum over ``torch.stack(values)`` saves an [S, B, T, D] stack at every read, O(L^2)).
    Both passes go source by source, one fused multiply-add over [B, T, D] each: stacking copies every source
    at every read, and a contraction with per-token weights lowers to a batched matmul of tiny matrices
    ([1, S] x [S, D] per token), which CPU kernels run one token at a time. Measured at 16 layers x d 256 on
    CPU this loop is several times faster (docs/perf_proposals.md). The arithmetic runs in fp32, as in Kimi's
    production code, and autocast is kept out of it.

    With ``normalize_eps`` the output is the read followed by the consuming sublayer's PreNorm
    normalisation, rmsnorm_unit(h) = h * rstd: the read h itself is then never stored. Backward needs only the
    normalised output (which the PreNorm gain's multiply keeps anyway) and rstd [B, T]:
        dh = rstd * (g - out * mean_D(g * out))
    An unfused read would hand h to the PreNorm, which keeps it for its own backward: one more [B, T, D] per read
    on top of the sources (for Block AttnRes, where every partial sum is a source, that doubles the per-sublayer
    residual memory the baseline has).
    """

    @staticmethod
    def forward(ctx, weights: torch.Tensor, normalize_eps: float | None, *values: torch.Tensor) -> torch.Tensor:
        ctx.sinks = [getattr(v, "_attnres_sink", None) for v in values]
        out_dtype, acc = _mix_dtypes(values)
        ctx.compute_dtype = acc
        ctx.normalized = normalize_eps is not None
        with torch.autocast(device_type=weights.device.type, enabled=False):
            w = weights.to(acc).unsqueeze(-1)  # [S, B, T, 1]
            # Mixed-dtype multiply-adds: a bf16 source is read as bf16 and widened inside the kernel (no fp32
            # copy of it), and the sum accumulates in fp32. On a GPU these passes are memory-bound.
            out = torch.mul(values[0], w[0])  # [B, T, D], fp32
            for s in range(1, len(values)):
                out.addcmul_(values[s], w[s])
            if not ctx.normalized:
                ctx.save_for_backward(weights, *values)
                return out.to(out_dtype)
            # in place on the fresh accumulator (a new [B, T, D] per step costs page faults on CPU)
            rstd = _rstd(out, normalize_eps, keepdim=True)  # [B, T, 1]
            out = out.mul_(rstd).to(out_dtype)
            ctx.save_for_backward(weights, out, rstd, *values)
            return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        if ctx.normalized:
            weights, normed, rstd, *values = ctx.saved_tensors
        else:
            weights, *values = ctx.saved_tensors
        incoming = grad_out  # autograd's tensor: may be changed after this backward, so never deferred
        with torch.autocast(device_type=weights.device.type, enabled=False):
            acc = ctx.compute_dtype
            w = weights.to(acc).unsqueeze(-1)  # [S, B, T, 1]
            if ctx.normalized:  # back through the normalisation: the gradient of the read h, in fp32
                g, y = grad_out.to(acc), normed.to(acc)
                mean_gy = torch.mul(g, y, out=_scratch_like(g)).mean(-1, keepdim=True)  # [B, T, 1]
                grad_out = torch.addcmul(g, y, mean_gy, value=-1).mul_(rstd)  # rstd * (g - y * mean_gy)
            # Low-precision sources (bf16 sublayer outputs under autocast) are multiplied with a copy of the
            # gradient in their own dtype, made once per read: the products read 2 + 2 bytes per element instead
            # of widening every source. Sums still accumulate in fp32. In fp32 nothing is copied.
            g_by_dtype = {grad_out.dtype: grad_out}

            def grad_in(dtype: torch.dtype) -> torch.Tensor:
                if dtype not in g_by_dtype:
                    g_by_dtype[dtype] = grad_out.to(dtype)
                return g_by_dtype[dtype]

            grad_weights = None
            if ctx.needs_input_grad[0]:
                # d out / d weights[s] = values[s]: one dot product over D per token (and read), the product
                # written into a reused scratch buffer instead of a fresh [B, T, D] per source
                dots = []
                for v in values:
                    g = grad_in(v.dtype)
                    dots.append(torch.mul(g, v, out=_scratch_like(g)).sum(-1, dtype=acc))
                grad_weights = torch.stack(dots).to(weights.dtype)
            grads = []
            for s, v in enumerate(values):
                if not ctx.needs_input_grad[2 + s]:
                    grads.append(None)
                    continue
                g = grad_in(v.dtype)
                if ctx.sinks[s] is not None:  # accumulate in place (track_source)
                    ctx.sinks[s].add(g, w[s], deferrable=g is not incoming)
                    grads.append(None)
                else:
                    grads.append(torch.mul(g, w[s]).to(v.dtype))
        return (grad_weights, None, *grads)


_workspace = threading.local()


def _scratch_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A buffer shaped like t (in t's dtype or ``dtype``) for a product that is reduced at once: its contents are
    never returned or saved, and each use ends before the next begins. On the CPU it is reused across calls (one
    per dtype and thread): a fresh [B, T, D] there page-faults whenever glibc has handed the previous one back to
    the OS, which costs more than the product itself."""
    dtype = dtype or t.dtype
    if t.device.type != "cpu":
        return torch.empty_like(t, dtype=dtype)  # the CUDA caching allocator already reuses memory
    buffers = _workspace.__dict__.setdefault("buffers", {})
    buf = buffers.get(dtype)
    if buf is None or buf.numel() < t.numel():
        buf = buffers[dtype] = torch.empty(t.numel(), dtype=dtype)
    return buf[: t.numel()].view(t.shape)


def _rstd(x: torch.Tensor, eps: float, dtype: torch.dtype | None = None, keepdim: bool = False) -> torch.Tensor:
    """(mean_D x^2 + eps)^-1/2, the sum of squares accumulated in ``dtype`` inside the kernel (no widened copy)."""
    return torch.rsqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=keepdim, dtype=dtype).square() / x.shape[-1] + eps)


def read_dtype(values: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> torch.dtype:
    """The dtype of a read of these sources: their promoted dtype (mix_sources' output; merge_read's out_dtype)."""
    out_dtype = values[0].dtype
    for v in values[1:]:
        out_dtype = torch.promote_types(out_dtype, v.dtype)
    return out_dtype


def _mix_dtypes(values: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> tuple[torch.dtype, torch.dtype]:
    """(output dtype: the sources' promoted dtype, accumulation dtype: that or fp32, whichever is wider)."""
    out_dtype = read_dtype(values)
    return out_dtype, torch.promote_types(out_dtype, torch.float32)


class _GradSink:
    """Gradient accumulator of one tracked source (see track_source): grad = sum over reads of weight * g.

    Terms are applied in groups of up to DEFER: the sink [B, T, D] is then read and written once per group (the
    group's multiply-adds run back to back while it is in cache) instead of once per read. The pending gradients
    are the reads' own (every sink of a read shares them), so at most DEFER - 1 [B, T, D] read gradients stay
    alive a little longer. Deferring also delays the sink's allocation: the final read sees every source, and
    allocating all their sinks in its backward, before any activation is freed, raised Full's peak by ~33 B*T*d."""

    DEFER = 4

    def __init__(self) -> None:
        self.grad: torch.Tensor | None = None
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []

    def add(self, g: torch.Tensor, weight: torch.Tensor, deferrable: bool = True) -> None:
        """Add weight * g ([B, T, 1] * [B, T, D]); ``g`` must not be modified afterwards if deferred."""
        self.pending.append((g, weight))
        if not deferrable or len(self.pending) >= self.DEFER:
            self.flush()

    def flush(self) -> torch.Tensor | None:
        for g, weight in self.pending:
            if self.grad is None:
                self.grad = torch.mul(g, weight)  # fp32 (the weights are)
            else:
                self.grad.addcmul_(g, weight)
        self.pending.clear()
        return self.grad


def _kernel_target(sink: _GradSink | None, like: torch.Tensor) -> tuple[torch.Tensor, int, torch.Tensor | None]:
    """Where a compiled kernel puts a source's gradient: (tensor, mode, gradient to return). A tracked source's sink
    sum, pending terms applied, to add into (mode 2), or when it has none yet a fresh sum to write (mode 1, the sink
    keeps it); an untracked source gets a fresh tensor (mode 1) that backward returns."""
    if sink is None:
        grad = torch.empty_like(like)
        return grad, 1, grad
    if sink.flush() is not None:
        return sink.grad, 2, None
    sink.grad = torch.empty_like(like, dtype=torch.float32)
    return sink.grad, 1, None


class _TrackSource(torch.autograd.Function):
    """Identity whose backward adds the gradient that depth-mixing reads accumulated in place in its sink."""

    @staticmethod
    def forward(ctx, value: torch.Tensor, sink: _GradSink) -> torch.Tensor:
        ctx.sink = sink
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        acc, ctx.sink.grad = ctx.sink.flush(), None  # consumed (a retained graph starts from zero again)
        if acc is None:
            return grad, None
        return acc.add_(grad.to(acc.dtype)).to(grad.dtype), None


def track_source(value: torch.Tensor) -> torch.Tensor:
    """Mark a tensor that several depth-mixing reads will use as a source.

    Autograd sums the gradient a source receives from every read that mixed it: each read's backward allocates
    weight * grad ([B, T, D]) and the engine adds it to the running sum, two passes over memory per (read,
    source) pair. For a tracked source, mix_sources' backward instead accumulates in place into the source's
    sink (one fused multiply-add), and the sink hands the sum over once, when autograd reaches the source
    (after every read that used it: the reads consume the tracked tensor). The sink holds no reference back
    into the graph, so nothing outlives the backward pass. Without autograd, and under torch.compile (which
    cannot trace the in-place side effect, and fuses the plain path itself), this is the identity.
    """
    if not (torch.is_grad_enabled() and value.requires_grad) or torch.compiler.is_compiling():
        return value  # under torch.compile the plain path traces into one graph and the compiler fuses it
    sink = _GradSink()
    out = _TrackSource.apply(value, sink)
    out._attnres_sink = sink  # read by _MixSources.forward
    return out


def mix_sources(weights: torch.Tensor, values: list[torch.Tensor],
                normalize_eps: float | None = None) -> torch.Tensor:
    """One read: sum_s weights[s] * values[s], weights [S, B, T] and values S x [B, T, D] -> [B, T, D] in the
    values' dtype (accumulated in fp32).

    ``normalize_eps``: return rmsnorm_unit(sum, eps) instead, the read fused with the PreNorm normalisation of
    the sublayer that consumes it, so the un-normalised read is never stored for backward.

    Eager: the hand-written kernels above. Under torch.compile: plain differentiable ops, which the compiler fuses
    into one pass itself (and torch 2.11's compiler returned zero gradients through _MixSources: every parameter
    upstream of the depth mixing got none, found on an H200 and reproduced on the CPU)."""
    if weights.dim() != 3 or weights.shape[0] != len(values):
        raise ValueError(f"mix_sources: weights must be [S, B, T] with S = {len(values)} sources; "
                         f"got {tuple(weights.shape)}")
    if torch.compiler.is_compiling():
        return _mix_sources_traced(weights, values, normalize_eps)
    return _MixSources.apply(weights, normalize_eps, *values)


def _mix_sources_traced(weights: torch.Tensor, values: list[torch.Tensor],
                        normalize_eps: float | None = None) -> torch.Tensor:
    """The same sum as _MixSources with ordinary autograd (fp32 accumulation, output in the values' dtype)."""
    out_dtype, acc = _mix_dtypes(values)
    with torch.autocast(device_type=weights.device.type, enabled=False):
        w = weights.to(acc).unsqueeze(-1)  # [S, B, T, 1]
        out = values[0].to(acc) * w[0]
        for s in range(1, len(values)):
            out = out + values[s].to(acc) * w[s]
        if normalize_eps is not None:
            out = rms_normalize(out, normalize_eps)
    return out.to(out_dtype)


class _MixSourcesBatched(torch.autograd.Function):
    """Q reads of the same S sources: out_q = sum_s weights[s, :, :, q] * values[s] for q < Q, each [B, T, D] in
    the accumulation dtype (fp32, like _MixSources' accumulator; these are intermediates, see merge_read).

    Every source is loaded once for all Q reads, in both passes: forward updates the Q accumulators while the
    source is in cache; backward takes the Q dot products with it and applies its Q gradient terms in one
    read-modify-write of its sink. Block AttnRes' phase 1 (paper Algorithm 1) uses this for the completed
    blocks, which every read of a block sees, and Full AttnRes for its read groups: one load per (group, source)
    instead of one per (read, source). That pays where the sources do not fit in cache (Full AttnRes on the CPU:
    1.175 -> 1.134x the baseline's step); the number of multiply-adds and dot products stays the same, and
    Block AttnRes at 16 x 256, whose sources fit in L3, did not get measurably faster with torch ops. On the CPU
    in fp32 both passes run as one compiled kernel instead (cpu_kernels: every token's S sources and Q reads in
    L1 at once), which is what made Block cheaper there (docs/performance.md).

    Saves only the weights and the sources (alive anyway), none of the outputs.
    """

    @staticmethod
    def forward(ctx, weights: torch.Tensor, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)  # an unused read hands back None, not a zero [B, T, D]
        ctx.sinks = [getattr(v, "_attnres_sink", None) for v in values]
        weights = weights.contiguous()
        if cpu_kernels.applies(weights, *values):  # one pass over every token's S sources and Q outputs
            outs = [torch.empty_like(values[0]) for _ in range(weights.shape[-1])]
            cpu_kernels.mix_forward(weights, list(values), outs)
            ctx.save_for_backward(weights, *values)
            return tuple(outs)
        _, acc = _mix_dtypes(values)
        with torch.autocast(device_type=weights.device.type, enabled=False):
            w = _per_read(weights.to(acc))  # [S, Q, B, T, 1]
            outs = [torch.mul(values[0], w[0, q]) for q in range(w.shape[1])]  # Q x [B, T, D]
            for s in range(1, len(values)):
                for q, out in enumerate(outs):
                    out.addcmul_(values[s], w[s, q])
        ctx.save_for_backward(weights, *values)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None):
        weights, *values = ctx.saved_tensors
        used = [q for q, g in enumerate(grads) if g is not None]
        grad_weights, grad_values = None, [None] * len(values)
        if not used:
            return (grad_weights, *grad_values)
        grads = [None if g is None else g.contiguous() for g in grads]
        if cpu_kernels.applies(weights, *values, *(grads[q] for q in used)):
            return _MixSourcesBatched._backward_kernel(ctx, weights, values, grads, used)
        with torch.autocast(device_type=weights.device.type, enabled=False):
            acc = grads[used[0]].dtype
            w = _per_read(weights.to(acc))  # [S, Q, B, T, 1]
            buf = _scratch_like(grads[used[0]])  # one reused product buffer for the dot products
            S, Q = w.shape[:2]
            dots = weights.new_zeros((S, Q) + weights.shape[1:3], dtype=acc) if ctx.needs_input_grad[0] else None
            for s, v in enumerate(values):  # source-major: v is loaded once for its Q dots
                if dots is not None:
                    for q in used:
                        torch.sum(torch.mul(grads[q], v, out=buf), -1, out=dots[s, q])
                if not ctx.needs_input_grad[1 + s]:
                    continue
                if ctx.sinks[s] is not None:  # accumulate in place (track_source), up to DEFER terms in one pass
                    for q in used:  # the gradients of outputs read once, by merge_read, which made them
                        ctx.sinks[s].add(grads[q], w[s, q])
                else:
                    gv = torch.mul(grads[used[0]], w[s, used[0]])
                    for q in used[1:]:
                        gv.addcmul_(grads[q], w[s, q])
                    grad_values[s] = gv.to(v.dtype)
            if dots is not None:
                grad_weights = dots.permute(0, 2, 3, 1).to(weights.dtype)  # [S, B, T, Q]
        return (grad_weights, *grad_values)

    @staticmethod
    def _backward_kernel(ctx, weights: torch.Tensor, values: list[torch.Tensor], grads: list[torch.Tensor | None],
                         used: list[int]) -> tuple[torch.Tensor | None, ...]:
        """The same backward in one compiled pass (cpu_kernels). A tracked source's sink that has no tensor yet
        keeps deferring (_GradSink.DEFER), as above, so that sinks are still allocated only when their sum is due
        (allocating them all at the last read raised Full's peak); its dot products still come from the pass."""
        grad_values: list[torch.Tensor | None] = [None] * len(values)
        targets: list[torch.Tensor | None] = [None] * len(values)
        modes = [0] * len(values)
        for s, v in enumerate(values):
            if not ctx.needs_input_grad[1 + s]:
                continue
            sink = ctx.sinks[s]
            if sink is not None and sink.grad is None and len(sink.pending) + len(used) < _GradSink.DEFER:
                for q in used:
                    sink.add(grads[q], weights[s, :, :, q].unsqueeze(-1))
            else:
                targets[s], modes[s], grad_values[s] = _kernel_target(sink, v)
        dots = torch.empty_like(weights) if ctx.needs_input_grad[0] else None  # [S, B, T, Q]
        cpu_kernels.mix_backward(weights, values, grads, dots, targets, modes)
        return (dots, *grad_values)


def _per_read(weights: torch.Tensor) -> torch.Tensor:
    """[S, B, T, Q] -> [S, Q, B, T, 1], contiguous: each (source, read) weight a dense [B, T, 1] broadcast over D."""
    return weights.permute(0, 3, 1, 2).contiguous().unsqueeze(-1)


def mix_sources_batched(weights: torch.Tensor, values: list[torch.Tensor]) -> list[torch.Tensor]:
    """Q reads at once: weights [S, B, T, Q], values S x [B, T, D] -> Q tensors [B, T, D] in fp32 (or wider),
    out_q = sum_s weights[s, :, :, q] * values[s]. Each source is loaded once for all Q (see _MixSourcesBatched)."""
    if weights.dim() != 4 or weights.shape[0] != len(values):
        raise ValueError(f"mix_sources_batched: weights must be [S, B, T, Q] with S = {len(values)} sources; "
                         f"got {tuple(weights.shape)}")
    if torch.compiler.is_compiling():
        _, acc = _mix_dtypes(values)
        with torch.autocast(device_type=weights.device.type, enabled=False):
            w = weights.to(acc).unsqueeze(-1)  # [S, B, T, Q, 1]
            return [sum(v.to(acc) * w[s, :, :, q] for s, v in enumerate(values)) for q in range(weights.shape[-1])]
    return list(_MixSourcesBatched.apply(weights, *values))


class _MergeRead(torch.autograd.Function):
    """Online-softmax merge of K more sources into a read (paper Algorithm 1, phase 2), fused with the PreNorm
    normalisation like _MixSources:

        h = a_0 * base + sum_k a_k * extras[k],   a = softmax([0, z_1, .., z_K])   -> h, or rmsnorm_unit(h)

    base is the softmax-weighted mix of the other sources (log-sum-exp of their logits: lse) and extra k has
    logit l_k, z_k = l_k - lse: a is the softmax over all the read's sources with base's group collapsed into one
    entry, so h is the full read. K = 0: h = base. With ``queries`` the extras' logits are computed here, as in
    key_logits (l_k = q_k . extra_k / RMS(extra_k)), and the given z is the offset -lse: Block AttnRes' partial sum
    is scored by exactly one read, so its key logit's gradient joins the merge's gradient of the same tensor
    instead of being a separate [B, T, D] that autograd adds.

    Backward never needs base itself (it is not saved, so a phase-1 output lives only until its read): with
    g = dL/dh, softmax's backward dL/dz_k = a_k (g.extra_k - g.h) only takes h's own dot product g.h (base's
    entry needs none: its logit is the constant 0). With the normalisation fused, g.h comes free from the norm's
    backward: g = rstd (g_y - y m) with m = mean_D(g_y y) and y = h rstd, so g.h = m (D - sum y^2) = m D eps rstd^2.
    Tracked extras (track_source) receive their gradient in their sinks, as in _MixSources.
    """

    @staticmethod
    def forward(ctx, base: torch.Tensor, z: torch.Tensor | None, queries: torch.Tensor | None, key_eps: float,
                normalize_eps: float | None, out_dtype: torch.dtype, *extras: torch.Tensor) -> torch.Tensor:
        ctx.normalize_eps, ctx.base_dtype = normalize_eps, base.dtype
        ctx.sinks = [getattr(e, "_attnres_sink", None) for e in extras]
        # The fused read is written into base (consumed, ctx.mark_dirty) when it has the output's dtype: a
        # phase-1 output is read exactly once, and a fresh [B, T, D] costs page faults on the CPU.
        in_place = normalize_eps is not None and out_dtype == base.dtype
        ctx.kernel = (in_place and len(extras) <= cpu_kernels.MAX_EXTRAS
                      and cpu_kernels.applies(base, *extras, *(t for t in (z, queries) if t is not None)))
        if ctx.kernel:  # the whole read in one pass per token, in place into base
            K, lead = len(extras), base.shape[:-1]
            a, rstd = base.new_empty((K + 1, *lead, 1)), base.new_empty((*lead, 1))
            logits = key_rstd = None
            if queries is not None:
                logits, key_rstd = base.new_empty((K, *lead)), base.new_empty((K, *lead))
            cpu_kernels.merge_forward(base, z, list(extras), queries, key_eps, normalize_eps, a, rstd, logits,
                                      key_rstd)
            ctx.mark_dirty(base)
            ctx.save_for_backward(a, base, rstd, queries, logits, key_rstd, *extras)
            return base
        with torch.autocast(device_type=base.device.type, enabled=False):
            logits = key_rstd = None
            if queries is not None:  # [K, B, T] each, fp32
                pairs = [_key_logits_and_rstd(e, queries[k: k + 1], key_eps) for k, e in enumerate(extras)]
                logits = torch.stack([lg[..., 0] for lg, _ in pairs])
                key_rstd = torch.stack([r for _, r in pairs])
                z = z + logits
            a = None
            if not extras:
                h = base
            else:
                zeros = torch.zeros_like(z[:1], dtype=base.dtype)
                a = torch.cat([zeros, z.to(base.dtype)]).softmax(0).unsqueeze(-1)  # [K + 1, B, T, 1]
                if len(extras) == 1 and in_place and extras[0].dtype == base.dtype:
                    h = base.lerp_(extras[0], a[1])  # one pass: a_0 = 1 - a_1
                else:
                    h = base.mul_(a[0]) if in_place else torch.mul(base, a[0])
                    for k, e in enumerate(extras):
                        h.addcmul_(e, a[k + 1])  # a bf16 extra is read as bf16 and widened in the kernel
            if normalize_eps is None:
                out, rstd = h.to(out_dtype, copy=h is base), None
                saved = h if extras else None
            else:
                rstd = _rstd(h, normalize_eps, keepdim=True)  # [B, T, 1]
                if in_place:
                    ctx.mark_dirty(base)
                    out = h.mul_(rstd)
                else:
                    out = (torch.mul(h, rstd) if h is base else h.mul_(rstd)).to(out_dtype)
                saved = out
            ctx.save_for_backward(a, saved, rstd, queries, logits, key_rstd, *extras)
            return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        a, saved, rstd, queries, logits, key_rstd, *extras = ctx.saved_tensors
        if ctx.kernel:
            return _MergeRead._backward_kernel(ctx, grad_out, a, saved, rstd, queries, logits, key_rstd, extras)
        with torch.autocast(device_type=grad_out.device.type, enabled=False):
            acc = ctx.base_dtype
            buf = _scratch_like(grad_out, acc)  # reused product buffer
            if ctx.normalize_eps is None:  # saved = h
                if not extras:
                    return grad_out.to(acc), None, None, None, None, None
                u, scale = grad_out.to(acc), None  # dL/dh = u
                gh = torch.mul(u, saved, out=buf).sum(-1, keepdim=True)  # [B, T, 1]
            else:  # saved = y = rmsnorm_unit(h)
                g_y, y = grad_out.to(acc), saved.to(acc)
                m = torch.mul(g_y, y, out=buf).mean(-1, keepdim=True)  # [B, T, 1]
                u = torch.addcmul(g_y, y, m, value=-1)  # dL/dh = rstd * u (rstd is folded into the uses below)
                if not extras:
                    return u.mul_(rstd), None, None, None, None, None
                scale = rstd
                gh = m * (y.shape[-1] * ctx.normalize_eps) * rstd  # g.h / rstd (class docstring): in units of u
            # dL/dz_k = a_k (g.e_k - g.h), with g = scale * u
            dots = torch.stack([torch.mul(u, e, out=buf).sum(-1, keepdim=True) for e in extras])  # [K, B, T, 1]
            grad_z = a[1:] * (dots - gh)
            if scale is not None:
                grad_z = grad_z * scale
                a = a * scale  # the weights of the gradient terms, rstd folded in
            grad_z = grad_z.squeeze(-1)  # [K, B, T]
            own = u is not grad_out  # a fresh tensor may become base's gradient in place
            grad_queries = None
            if queries is not None:  # l_k = rstd_k (e_k . q_k), one query per extra: [K, B, T, 1] each
                key_scaled, key_coef = _key_logit_grad_terms(grad_z.unsqueeze(-1), logits.unsqueeze(-1), key_rstd,
                                                             extras[0].shape[-1])
                if ctx.needs_input_grad[2]:
                    grad_queries = torch.stack([(key_scaled[k].reshape(1, -1) @ e.to(acc).reshape(-1, e.shape[-1]))[0]
                                                for k, e in enumerate(extras)]).to(queries.dtype)  # [K, D]
            grad_extras = []
            for k, e in enumerate(extras):
                if not ctx.needs_input_grad[6 + k]:
                    grad_extras.append(None)
                    continue
                terms = [(u, a[k + 1])]
                if queries is not None:  # the key logit's terms: -coef e + scaled q
                    terms += [(e, key_coef[k].neg()), (queries[k].to(acc), key_scaled[k])]
                if ctx.sinks[k] is not None:  # tracked source: accumulate in place now (u becomes base's gradient
                    for g, w in terms:      # below; deferring it would keep one more [B, T, D] per read alive)
                        ctx.sinks[k].add(g, w, deferrable=False)
                    grad_extras.append(None)
                else:
                    grad = torch.mul(*terms[0])
                    for g, w in terms[1:]:
                        grad.addcmul_(g, w)
                    grad_extras.append(grad.to(e.dtype))
            grad_base = u.mul_(a[0]) if own else torch.mul(u, a[0])
        return grad_base, grad_z, grad_queries, None, None, None, *grad_extras

    @staticmethod
    def _backward_kernel(ctx, grad_out: torch.Tensor, a: torch.Tensor, y: torch.Tensor, rstd: torch.Tensor,
                         queries: torch.Tensor | None, logits: torch.Tensor | None, key_rstd: torch.Tensor | None,
                         extras: list[torch.Tensor]) -> tuple[torch.Tensor | None, ...]:
        """The same backward in one compiled pass (cpu_kernels); tracked extras' terms go into their sinks now."""
        grad_out = grad_out.to(y.dtype).contiguous()
        grad_base = torch.empty_like(grad_out)
        grad_z = grad_out.new_empty((len(extras), *grad_out.shape[:-1])) if extras else None
        targets: list[torch.Tensor | None] = [None] * len(extras)
        grad_extras: list[torch.Tensor | None] = [None] * len(extras)
        modes = [0] * len(extras)
        for k, e in enumerate(extras):
            if not ctx.needs_input_grad[6 + k]:
                continue
            targets[k], modes[k], grad_extras[k] = _kernel_target(ctx.sinks[k], e)
        grad_queries = cpu_kernels.merge_backward(grad_out, y, a, rstd, ctx.normalize_eps, extras, queries, logits,
                                                  key_rstd, grad_base, grad_z, targets, modes)
        if grad_queries is not None:
            grad_queries = grad_queries.to(queries.dtype) if ctx.needs_input_grad[2] else None
        return grad_base, grad_z, grad_queries, None, None, None, *grad_extras


def merge_read(base: torch.Tensor, z: torch.Tensor | None, extras: list[torch.Tensor],
               normalize_eps: float | None, out_dtype: torch.dtype,
               queries: torch.Tensor | None = None, key_eps: float = 1e-5) -> torch.Tensor:
    """a_0 * base + sum_k a_k * extras[k] with a = softmax([0, z_1, .., z_K]) (just base when there are no extras),
    then rmsnorm_unit with ``normalize_eps``, returned in ``out_dtype``.

    base [B, T, D] (fp32, a phase-1 output of mix_sources_batched), extras K x [B, T, D], z [K, B, T]: each extra's
    logit minus the log-sum-exp of base's sources. With ``queries`` [K, D] (gains folded in), extra k's logit
    q_k . extra_k / RMS(extra_k) (key_logits, with ``key_eps``) is computed here and z is the rest (-lse). See
    _MergeRead. With ``normalize_eps`` and out_dtype == base.dtype, base is consumed: the result is written into it."""
    if (z is None and extras) or (z is not None and z.shape[0] != len(extras)):
        raise ValueError(f"merge_read: z must be [K, B, T] for K = {len(extras)} extra sources; "
                         f"got {None if z is None else tuple(z.shape)}")
    if queries is not None and queries.shape[0] != len(extras):
        raise ValueError(f"merge_read: queries must be [K, D] for K = {len(extras)} extra sources")
    if (normalize_eps is not None and len(extras) <= gpu_kernels.MAX_EXTRAS
            and gpu_kernels.applies(base, *extras)):  # CUDA: one Triton pass (eager and compiled)
        return gpu_kernels.merge_read(base, z, extras, normalize_eps, out_dtype, queries, key_eps)
    if torch.compiler.is_compiling():
        with torch.autocast(device_type=base.device.type, enabled=False):
            h = base
            if extras:
                if queries is not None:
                    z = z + torch.stack([_key_logits_and_rstd(e, queries[k: k + 1], key_eps)[0][..., 0]
                                         for k, e in enumerate(extras)])
                a = torch.cat([torch.zeros_like(z[:1], dtype=base.dtype), z.to(base.dtype)]).softmax(0).unsqueeze(-1)
                h = base * a[0]
                for k, e in enumerate(extras):
                    h = h + e.to(base.dtype) * a[k + 1]
            if normalize_eps is not None:
                h = rms_normalize(h, normalize_eps)
            return h.to(out_dtype)
    if not extras:
        z = queries = None
    return _MergeRead.apply(base, z, queries, key_eps, normalize_eps, out_dtype, *extras)


def attend_batched(sources: list[torch.Tensor], queries: torch.Tensor, eps: float
                   ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Phase 1 of Q reads with static queries over the same S sources (paper Algorithm 1), scoring included:
    logits l[s, q] = queries[q] . RMSNorm(sources[s]) (key_logits, with ``eps``), lse [B, T, Q] = logsumexp_s l,
    and the Q mixes out_q = sum_s exp(l[s, q] - lse_q) * sources[s] ([B, T, D] fp32). Returns (outs, lse); the
    gradient flows through both (merge_read's z is an extra's logit minus lse).

    sources S x [B, T, D], queries [Q, D] (gains folded in). On CUDA one Triton pass reads each source once for
    its RMS, its Q logits and its Q multiply-adds (gpu_kernels.attend); elsewhere the reference below, the same
    ops the residual schemes run when they score every source once, as it is written (key_logits, cached)."""
    if queries.dim() != 2 or queries.shape[-1] != sources[0].shape[-1]:
        raise ValueError(f"attend_batched: queries must be [Q, D] with D = {sources[0].shape[-1]}; "
                         f"got {tuple(queries.shape)}")
    if gpu_kernels.attend_fits(*queries.shape) and gpu_kernels.applies(*sources):
        return gpu_kernels.attend_batched(sources, queries, eps)
    logits = torch.stack([key_logits(v, queries, eps) for v in sources])  # [S, B, T, Q] fp32
    lse = torch.logsumexp(logits, dim=0)  # [B, T, Q]
    return mix_sources_batched(torch.exp(logits - lse), sources), lse


def _key_logit_grad_terms(grad: torch.Tensor, logits: torch.Tensor, rstd: torch.Tensor,
                          dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of l_r = rstd (x . q_r), rstd = (mean_D x^2 + eps)^-1/2, for the upstream gradient grad [..., R]:
        dx = sum_r scaled_r q_r - coef x,   dq_r = sum over tokens of scaled_r x
    Returns scaled = grad * rstd [..., R] and coef = (sum_r grad_r l_r) rstd^2 / D [..., 1]."""
    return grad * rstd.unsqueeze(-1), (grad * logits).sum(-1, keepdim=True) * rstd.unsqueeze(-1).square() / dim


def _key_logits_and_rstd(source: torch.Tensor, queries: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, T, R] and rstd [B, T], both in fp32 (or wider), with plain differentiable ops."""
    acc = torch.promote_types(torch.promote_types(source.dtype, queries.dtype), torch.float32)
    rstd = _rstd(source, eps, dtype=acc)  # straight from the (possibly bf16) source
    return (source.to(acc) @ queries.to(acc).t()) * rstd.unsqueeze(-1), rstd


class _KeyLogits(torch.autograd.Function):
    """logits[b, t, r] = rstd[b, t] * (x[b, t] . q[r]), rstd = (mean_D x^2 + eps)^-1/2, computed in fp32.

    Saves the source as it is (bf16 under autocast: a tensor the depth mixing keeps alive anyway) and the tiny
    rstd, not an fp32 copy of the source, which autograd's matmul would keep for every source (2x the bf16
    source's bytes, ~48 x B*T*d of bf16 at 24 sublayers). Backward widens the source again, transiently:
        dq = (G * rstd)^T x,    dx = (G * rstd) q - (rstd^2 / D) (sum_r G_r logits_r) x
    """

    @staticmethod
    def forward(ctx, source: torch.Tensor, queries: torch.Tensor, eps: float) -> torch.Tensor:
        logits, rstd = _key_logits_and_rstd(source, queries, eps)
        ctx.save_for_backward(source, queries, rstd, logits)
        return logits

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        source, queries, rstd, logits = ctx.saved_tensors
        x = source.to(logits.dtype).contiguous()  # [B, T, D] fp32, transient (addmm_ into its product below
        # needs rows: a non-contiguous source is copied)
        g_scaled, coef = _key_logit_grad_terms(grad, logits, rstd, x.shape[-1])  # [B, T, R], [B, T, 1]
        grad_source = grad_queries = None
        if ctx.needs_input_grad[0]:
            # one fresh [B, T, D] (-coef * x), the query term added in place: on CPU every new [B, T, D] costs
            # page faults, more than the arithmetic; one query (Block's partial sum) is an element-wise outer product
            grad_source = x * coef.neg()
            if queries.shape[0] == 1:
                grad_source.addcmul_(g_scaled, queries[0].to(x.dtype))
            else:
                grad_source.view(-1, x.shape[-1]).addmm_(g_scaled.reshape(-1, queries.shape[0]), queries.to(x.dtype))
            grad_source = grad_source.to(source.dtype)
        if ctx.needs_input_grad[1]:
            grad_queries = (g_scaled.flatten(0, -2).t() @ x.flatten(0, -2)).to(queries.dtype)  # [R, D]
        return grad_source, grad_queries, None


def key_logits(source: torch.Tensor, queries: torch.Tensor, eps: float) -> torch.Tensor:
    """Logits of one source against R queries: q_r . RMSNorm(v) = (v . q_r) / RMS(v).

    source [B, T, D], queries [R, D] (gains folded in) -> [B, T, R] in fp32 (autocast kept out). A matmul scaled
    by 1/RMS, so the normalised key is never materialised; the products run in fp32 (a bf16 logit would be off by
    up to 0.4%, too coarse for the softmax), and backward keeps no fp32 copy of the source (_KeyLogits)."""
    with torch.autocast(device_type=source.device.type, enabled=False):
        if torch.compiler.is_compiling():  # plain ops: the compiler fuses them and decides what to keep
            return _key_logits_and_rstd(source, queries, eps)[0]
        return _KeyLogits.apply(source, queries, eps)
