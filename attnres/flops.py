"""Training FLOPs per token, written out so a result can state exactly what "compute" means.

Per training token (forward + backward = 3 x forward):

    C_token = 6 * N_matmul                      every weight matrix a token goes through: q/k/v/o, SwiGLU, LM head
                                                (embedding lookup: 0); for an MoE MLP (ffn="moe") the *activated*
                                                ones: router D E + top_k routed experts 3 D d_ff + shared 3 D S
            + 6 * L_b * T * d_attn              causal self-attention: QK^T and AV, 2 * 2 * T * d_attn forward per
                                                layer at full length, halved because a token sees T/2 keys on average
            + 3 * F_mix                         the residual scheme's own forward FLOPs per token: for AttnRes
                                                2*D per (read, source) pair for the logits and 2*D for the mix

6 * N_matmul is the PaLM / nanoGPT convention extended to the AttnRes extras. ``six_n`` is the plain 6 * N
(activated non-embedding parameters: the paper's Table 2 count) count, reported beside it for comparison. An MoE
layer's element-wise work (the router's sigmoid and top-k, the weighting and the sum over the k experts) is not
counted, as the RMSNorms are not. Compute for a run is C = C_token * D.
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
    six_n: float  # 6 * activated non-embedding parameters (plain 6ND per token)

    @property
    def total(self) -> float:
        return self.matmul + self.attention + self.mixing

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


def ffn_matmul_params(config: ModelConfig) -> int:
    """Matmul weights one token goes through in one MLP sublayer: dense SwiGLU 3 D d_ff; MoE router D E + top_k
    routed experts 3 D d_ff + the shared experts 3 D (n_shared shared_d_ff)."""
    d, f = config.d_model, config.d_ff
    assert f is not None  # set by ModelConfig.__post_init__
    if config.ffn == "dense":
        return 3 * d * f
    moe = config.moe_options
    return d * moe.n_experts + moe.top_k * 3 * d * f + moe.n_shared * 3 * d * config.shared_d_ff


def matmul_params(config: ModelConfig) -> int:
    """Weights of every matmul one token goes through in the decoder (MoE: the activated experts; not the embedding
    lookup; the LM head counts even when tied)."""
    d, a = config.d_model, config.attn_dim
    per_layer = d * 3 * a + a * d + ffn_matmul_params(config)
    return config.n_layers * per_layer + d * config.vocab_size


def non_embedding_params(config: ModelConfig, activated: bool = False) -> int:
    """Kaplan's N: parameters outside the token embedding and LM head (= Transformer.num_params(True)); with
    ``activated``, only those one token uses (MoE: k of the E routed experts; the paper's Table 2 count)."""
    return param_counts(config)["activated_non_embedding" if activated else "non_embedding"]


def param_counts(config: ModelConfig) -> dict[str, int]:
    """total, non_embedding, activated and activated_non_embedding parameter counts of ``config`` (equal pairs
    for a dense model), from a model built on the meta device (no memory)."""
    import torch

    from .model import Transformer  # local import: building on the meta device costs no memory

    with torch.device("meta"):
        model = Transformer(config)
    return {
        "total": model.num_params(),
        "non_embedding": model.num_params(non_embedding=True),
        "activated": model.num_params(activated=True),
        "activated_non_embedding": model.num_params(non_embedding=True, activated=True),
    }


def flops_per_token(config: ModelConfig, seq_len: int | None = None) -> FlopCount:
    """Training FLOPs per token for ``config`` at context ``seq_len`` (default: config.max_seq_len)."""
    T = config.max_seq_len if seq_len is None else seq_len
    mixing = RESIDUAL_SCHEMES[config.residual].mixing_flops(config)
    return FlopCount(
        matmul=6.0 * matmul_params(config),
        attention=6.0 * config.n_layers * T * config.attn_dim,
        mixing=3.0 * mixing,
        six_n=6.0 * non_embedding_params(config, activated=True),
    )


def to_pflops_days(flops: float) -> float:
    return flops / PFLOP_S_DAY
