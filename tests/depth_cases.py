"""Inputs and computations shared by the depth-op tests (test_depth.py, test_cpu_kernels.py,
test_triton_kernels.py)."""

from __future__ import annotations

import torch

from attnres import ModelConfig, Transformer
from attnres.depth import mix_sources, track_source


def reads_sharing_sources(
    vs: list[torch.Tensor], w1: torch.Tensor, w2: torch.Tensor, track: bool, eps: float | None = None
) -> torch.Tensor:
    """A loss over sources mixed by several reads, one source depending on an earlier read (as in Full AttnRes).
    w1 [2, B, T], w2 [4, B, T]. With eps the reads are fused with the PreNorm normalisation (the model's path,
    where sinks defer their terms)."""
    t = track_source if track else (lambda v: v)
    a, b = t(vs[0]), t(vs[1] * 2)
    o1 = mix_sources(w1, [a, b], eps)
    c, d = t(vs[2] + o1), t(vs[3])
    o2 = mix_sources(w2, [a, b, c, d], eps)
    o3 = mix_sources(w1, [d, a], eps)
    o4 = mix_sources(w2, [d, c, b, a], eps)  # more reads of a than a sink's group: a flush before the hand-over
    o5 = mix_sources(w1, [a, d], eps)
    o6 = mix_sources(w1, [b, a], eps)
    return o1.sum() * 0.3 + (o2 * o2).sum() + o1.pow(2).sum() + (o3 * o2).sum() + (o4 * o5).sum() + o6.sum()


def merge_case(K: int, B: int, T: int, D: int, with_queries: bool, extra_dtype: torch.dtype = torch.float32):
    """Random inputs of a merge_read with K extras (seed 1): (base [B, T, D], z [K, B, T] or None, queries [K, D]
    or None, extras, the inputs whose gradients a test compares)."""
    torch.manual_seed(1)
    base = torch.randn(B, T, D, requires_grad=True)
    extras = [(torch.randn(B, T, D) * 0.5).to(extra_dtype).requires_grad_() for _ in range(K)]
    z = (torch.randn(K, B, T) * 2).requires_grad_() if K else None
    queries = torch.randn(K, D, requires_grad=True) if with_queries else None
    inputs = [base] + ([z] if K else []) + ([queries] if with_queries else []) + extras
    return base, z, queries, extras, inputs


def sharp_model(cfg: ModelConfig) -> Transformer:
    """A model of ``cfg`` (seed 0) whose pseudo-queries are drawn from N(0, 1) instead of zero: sharp depth
    softmaxes, so a read is not the uniform mean a zero-initialised query makes it."""
    torch.manual_seed(0)
    model = Transformer(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("queries"):
                p.normal_(0, 1.0)
    return model
