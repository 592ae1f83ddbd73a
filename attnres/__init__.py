"""attnres: a Llama-style PreNorm decoder with interchangeable residual schemes (baseline, Full and Block
Attention Residuals, ablations and peers). Pure torch."""

from . import flops
from .config import ModelConfig
from .depth import depth_attention, mix_sources
from .flops import FlopCount, flops_per_token, to_pflops_days
from .model import KVCache, Transformer
from .peers import DenseFormer, HyperConnections, LAuReL, ManifoldHyperConnections
from .residual import RESIDUAL_SCHEMES, BlockAttnRes, FullAttnRes, PreNormResidual, ResidualScheme, build_residual

__all__ = [
    "ModelConfig", "Transformer", "KVCache", "depth_attention", "mix_sources", "flops", "FlopCount", "flops_per_token",
    "to_pflops_days", "RESIDUAL_SCHEMES", "ResidualScheme", "PreNormResidual", "FullAttnRes", "BlockAttnRes",
    "build_residual", "DenseFormer", "HyperConnections", "ManifoldHyperConnections", "LAuReL",
]
