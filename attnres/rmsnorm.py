"""RMSNorm, the one normalisation of every sublayer (attention, dense MLP, MoE MLP) and of the final read."""

from __future__ import annotations

import torch
import torch.nn as nn

from .depth import rmsnorm_unit


class RMSNorm(nn.Module):
    """weight * x / RMS(x). The normalisation (rmsnorm_unit, fp32 inside) and the gain are separate steps so that
    a residual scheme can fuse the first into its read (ResidualScheme.read_normalized)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale(rmsnorm_unit(x, self.eps))

    def scale(self, normalized: torch.Tensor) -> torch.Tensor:
        """The gain alone, applied to an already normalised input."""
        return normalized * self.weight
