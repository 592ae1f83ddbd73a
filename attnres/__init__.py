"""attnres: a Llama-style PreNorm decoder with interchangeable residual schemes (baseline, Full and Block
Attention Residuals, ablations and peers). Pure torch.

Importing the package registers every residual scheme (attnres/registry.py): those of attnres.residual, then
the peers of attnres.peers."""

from . import flops, registry
from .config import ModelConfig, MoEConfig
from .depth import depth_attention, mix_sources
from .flops import FlopCount, flops_per_token, to_pflops_days
from .model import KVCache, Transformer
from .moe import MoEFeedForward
from .peers import (
    DenseFormer,
    DenseFormerOptions,
    HyperConnections,
    HyperConnectionsOptions,
    LAuReL,
    LAuReLOptions,
    ManifoldHyperConnections,
    ManifoldHyperConnectionsOptions,
)
from .registry import SchemeOptions
from .residual import (
    RESIDUAL_SCHEMES,
    AttnResOptions,
    BaselineOptions,
    BlockAttnRes,
    BlockAttnResOptions,
    FullAttnRes,
    FullAttnResOptions,
    PreNormResidual,
    ResidualScheme,
    build_residual,
)

__all__ = [
    "RESIDUAL_SCHEMES",
    "AttnResOptions",
    "BaselineOptions",
    "BlockAttnRes",
    "BlockAttnResOptions",
    "DenseFormer",
    "DenseFormerOptions",
    "FlopCount",
    "FullAttnRes",
    "FullAttnResOptions",
    "HyperConnections",
    "HyperConnectionsOptions",
    "KVCache",
    "LAuReL",
    "LAuReLOptions",
    "ManifoldHyperConnections",
    "ManifoldHyperConnectionsOptions",
    "MoEConfig",
    "MoEFeedForward",
    "ModelConfig",
    "PreNormResidual",
    "ResidualScheme",
    "SchemeOptions",
    "Transformer",
    "build_residual",
    "depth_attention",
    "flops",
    "flops_per_token",
    "mix_sources",
    "registry",
    "to_pflops_days",
]
