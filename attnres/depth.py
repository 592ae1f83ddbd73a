"""Depth-wise attention: the one operation behind every AttnRes read (paper Eqs. 2-4).

    h = sum_s softmax_s( q . RMSNorm(v_s) ) * v_s

Keys are the RMS-normalised sources, values are the raw sources, there is no 1/sqrt(d) and no temperature,
and the softmax runs in fp32 whatever the input dtype (as in Kimi's production code).
"""

from __future__ import annotations

import torch


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / RMS(x) over the last dim, computed in fp32 (no gain: the gain is folded into the query)."""
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


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

    weights is [S, B, T] (one read) or [S, B, T, Q] (Q reads at once); values are S tensors [B, T, D]; out is
    [B, T, D] or [Q, B, T, D].

    Only the (already alive) source tensors and the small weights are saved, so activation memory stays
    O(L * B*T*D) (an einsum over ``torch.stack(values)`` saves an [S, B, T, D] stack at every read, O(L^2)).
    Both passes go source by source, one fused multiply-add over [B, T, D] each: stacking copies every source
    at every read, and a contraction with per-token weights lowers to a batched matmul of tiny matrices
    ([1, S] x [S, D] per token), which CPU kernels run one token at a time. Measured at 16 layers x d 256 on
    CPU this loop is several times faster (docs/perf_proposals.md). The arithmetic runs in fp32, as in Kimi's
    production code, and autocast is kept out of it.
    """

    @staticmethod
    def forward(ctx, weights: torch.Tensor, *values: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weights, *values)
        ctx.sinks = [getattr(v, "_attnres_sink", None) for v in values]
        out_dtype = values[0].dtype
        for v in values[1:]:
            out_dtype = torch.promote_types(out_dtype, v.dtype)
        ctx.compute_dtype = acc = torch.promote_types(out_dtype, torch.float32)  # fp32 at least
        with torch.autocast(device_type=weights.device.type, enabled=False):
            w = _per_source(weights.to(acc))  # [S, B, T, 1] or [S, Q, B, T, 1]
            out = values[0].to(acc) * w[0]  # [B, T, D] or [Q, B, T, D]
            for s in range(1, len(values)):
                out.addcmul_(values[s].to(acc), w[s])
        return out.to(out_dtype)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        weights, *values = ctx.saved_tensors
        with torch.autocast(device_type=weights.device.type, enabled=False):
            acc = ctx.compute_dtype
            g = grad_out.to(acc)  # [B, T, D] or [Q, B, T, D]
            w = _per_source(weights.to(acc))
            grad_weights = None
            if ctx.needs_input_grad[0]:
                # d out / d weights[s] = values[s]: one dot product over D per token (and read), computed
                # through one reused scratch buffer instead of a fresh [B, T, D] product per source
                scratch = torch.empty_like(g)
                dots = torch.stack([torch.mul(g, v.to(acc), out=scratch).sum(-1) for v in values])
                grad_weights = (dots if weights.dim() == 3 else dots.movedim(1, -1)).to(weights.dtype)
            grads = []
            for s, v in enumerate(values):
                if not ctx.needs_input_grad[1 + s]:
                    grads.append(None)
                elif weights.dim() == 3 and ctx.sinks[s] is not None:  # accumulate in place (track_source)
                    sink = ctx.sinks[s]
                    if sink.grad is None:
                        sink.grad = w[s] * g
                    else:
                        sink.grad.addcmul_(w[s], g)
                    grads.append(None)
                elif weights.dim() == 3:
                    grads.append((w[s] * g).to(v.dtype))
                else:  # summed over the Q reads that mixed this source
                    gv = w[s, 0] * g[0]
                    for q in range(1, g.shape[0]):
                        gv.addcmul_(w[s, q], g[q])
                    grads.append(gv.to(v.dtype))
        return (grad_weights, *grads)


def _per_source(weights: torch.Tensor) -> torch.Tensor:
    """[S, B, T] -> [S, B, T, 1]; [S, B, T, Q] -> [S, Q, B, T, 1]: broadcastable against [B, T, D] values."""
    if weights.dim() == 3:
        return weights.unsqueeze(-1)
    return weights.movedim(-1, 1).unsqueeze(-1)


class _GradSink:
    """Gradient accumulator of one tracked source (see track_source)."""

    def __init__(self) -> None:
        self.grad: torch.Tensor | None = None


class _TrackSource(torch.autograd.Function):
    """Identity whose backward adds the gradient that depth-mixing reads accumulated in place in its sink."""

    @staticmethod
    def forward(ctx, value: torch.Tensor, sink: _GradSink) -> torch.Tensor:
        ctx.sink = sink
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        acc, ctx.sink.grad = ctx.sink.grad, None  # consumed (a retained graph starts from zero again)
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


def mix_sources(weights: torch.Tensor, values: list[torch.Tensor]) -> torch.Tensor:
    """sum_s weights[s] * values[s]: weights [S, B, T] -> [B, T, D], or [S, B, T, Q] -> [Q, B, T, D]."""
    if weights.shape[0] != len(values):
        raise ValueError(f"mix_sources: {weights.shape[0]} weights for {len(values)} sources")
    return _MixSources.apply(weights, *values)


def key_logits(source: torch.Tensor, queries: torch.Tensor, eps: float) -> torch.Tensor:
    """Logits of one source against R queries: q_r . RMSNorm(v) = (v . q_r) / RMS(v).

    source [B, T, D], queries [R, D] (gains folded in) -> [B, T, R] in fp32 (autocast kept out). Written as a
    matmul scaled by 1/RMS so the normalised key is never materialised (one pass over the source for the dot
    products, one for its norm)."""
    with torch.autocast(device_type=source.device.type, enabled=False):
        v = source.to(torch.promote_types(source.dtype, torch.float32))
        rstd = torch.rsqrt(torch.linalg.vecdot(v, v) / v.shape[-1] + eps)  # [B, T]
        return (v @ queries.to(v.dtype).t()) * rstd.unsqueeze(-1)
