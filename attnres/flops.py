"""Training FLOPs per token, written out so a result can state exactly what "compute" means.

Per training token (forward + backward = 3 x forward):

    C_token = 6 * N_matmul                      every weight matrix: q/k/v/o, SwiGLU, LM head (embedding lookup: 0)
            + 6 * L_b * T * d_attn              causal self-attention: QK^T and AV, 2 * 2 * T * d_attn forward per
                                                layer at full length, halved because a token sees T/2 keys on average
            + 3 * F_mix                         the residual scheme's own forward FLOPs per token: for AttnRes
                                                2*D per (read, source) pair for the logits and 2*D for the mix

6 * N_matmul is the PaLM / nanoGPT convention extended to the AttnRes extras. ``six_nd`` is the plain 6 * N
(non-embedding parameters) count, reported beside it for comparison. Compute for a run is C = C_token * D.
PFLOP/s-days: 1e15 FLOP/s for one day, i.e. 8.64e19 FLOPs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .config import ModelConfig
from .residual import RESIDUAL_SCHEMES

PFLOP_S_DAY = 1e15 * 86400


@dataclass(frozen=True)
class FlopCount:
    matmul: float  # 6 * N_matmul
    attention: float  # 6 * L_b * T * d_attn
    mixing: float  # 3 * forward FLOPs of the residual scheme
    six_n: float  # 6 * non-embedding parameters (plain 6ND per token)

    @property
    def total(self) -> float:
        return self.matmul + self.attention + self.mixing

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


def matmul_params(config: ModelConfig) -> int:
    """Weights of every matmul in the decoder (not the embedding lookup; the LM head counts even when tied)."""
    d, a, f = config.d_model, config.attn_dim, config.d_ff
    assert f is not None  # set by ModelConfig.__post_init__
    per_layer = d * 3 * a + a * d + d * 2 * f + f * d
    return config.n_layers * per_layer + d * config.vocab_size


def non_embedding_params(config: ModelConfig) -> int:
    """Kaplan's N: parameters outside the token embedding and LM head (= Transformer.num_params(True))."""
    import torch

    from .model import Transformer  # local import: building on the meta device costs no memory

    with torch.device("meta"):
        return Transformer(config).num_params(non_embedding=True)


def flops_per_token(config: ModelConfig, seq_len: int | None = None) -> FlopCount:
    """Training FLOPs per token for ``config`` at context ``seq_len`` (default: config.max_seq_len)."""
    T = config.max_seq_len if seq_len is None else seq_len
    mixing = RESIDUAL_SCHEMES[config.residual].mixing_flops(config)
    return FlopCount(
        matmul=6.0 * matmul_params(config),
        attention=6.0 * config.n_layers * T * config.attn_dim,
        mixing=3.0 * mixing,
        six_n=6.0 * non_embedding_params(config),
    )


def to_pflops_days(flops: float) -> float:
    return flops / PFLOP_S_DAY
