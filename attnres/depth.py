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

    weights is [S, B, T] (one read) or [S, B, T, Q] (Q reads at once, Block AttnRes phase 1); values are S
    tensors [B, T, D]; out is [B, T, D] or [Q, B, T, D].

    A plain ``einsum(weights, torch.stack(values))`` saves the [S, B, T, D] stack for backward at every read,
    which makes Full AttnRes activation memory O(L^2 * B*T*D). Here only the (already alive) source tensors and
    the small weights are saved, so memory stays O(L * B*T*D); the stack is a temporary in both passes. The
    arithmetic runs in fp32, as in Kimi's production code, and autocast is kept out of it.
    """

    @staticmethod
    def forward(ctx, weights: torch.Tensor, *values: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weights, *values)
        out_dtype = values[0].dtype
        for v in values[1:]:
            out_dtype = torch.promote_types(out_dtype, v.dtype)
        ctx.compute_dtype = acc = torch.promote_types(out_dtype, torch.float32)  # fp32 at least
        with torch.autocast(device_type=weights.device.type, enabled=False):
            stacked = torch.stack([v.to(acc) for v in values])  # [S, B, T, D] temporary
            if weights.dim() == 3:
                out = torch.einsum("sbt,sbtd->btd", weights.to(acc), stacked)
            else:
                out = torch.einsum("sbtq,sbtd->qbtd", weights.to(acc), stacked)
        return out.to(out_dtype)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        weights, *values = ctx.saved_tensors
        single = weights.dim() == 3
        with torch.autocast(device_type=weights.device.type, enabled=False):
            acc = ctx.compute_dtype
            grad_out = grad_out.to(acc)
            w = weights.to(acc)
            grad_weights = None
            if ctx.needs_input_grad[0]:
                stacked = torch.stack([v.to(acc) for v in values])  # [S, B, T, D] temporary
                eq = "btd,sbtd->sbt" if single else "qbtd,sbtd->sbtq"
                grad_weights = torch.einsum(eq, grad_out, stacked).to(weights.dtype)
            grads = []
            for s, v in enumerate(values):
                if not ctx.needs_input_grad[1 + s]:
                    grads.append(None)
                elif single:
                    grads.append((w[s].unsqueeze(-1) * grad_out).to(v.dtype))
                else:
                    grads.append(torch.einsum("btq,qbtd->btd", w[s], grad_out).to(v.dtype))
        return (grad_weights, *grads)


def mix_sources(weights: torch.Tensor, values: list[torch.Tensor]) -> torch.Tensor:
    """sum_s weights[s] * values[s]: weights [S, B, T] -> [B, T, D], or [S, B, T, Q] -> [Q, B, T, D]."""
    if weights.shape[0] != len(values):
        raise ValueError(f"mix_sources: {weights.shape[0]} weights for {len(values)} sources")
    return _MixSources.apply(weights, *values)
