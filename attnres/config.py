"""Model configuration: one dataclass, validated at construction.

Vocabulary used throughout the library (it follows the paper, §2.1):
  * a *transformer block* is one attention sublayer followed by one MLP sublayer; ``n_layers`` counts them (L_b);
  * a *sublayer* (the paper's "layer") is one attention or one MLP; there are L = 2 * n_layers of them;
  * a *read* is one depth-wise aggregation: one before every sublayer plus one final read before the LM head,
    so a model has L + 1 reads.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from . import registry

FFN_KINDS = ("dense", "moe")


@dataclass(frozen=True)
class MoEConfig:
    """Options of the mixture-of-experts feed-forward (``ModelConfig.ffn="moe"``; attnres/moe.py, docs/moe.md).

    The design is DeepSeek-V3's / Moonlight's / Kimi Linear's: ``n_shared`` always-on SwiGLU experts plus
    ``n_experts`` routed SwiGLU experts of width ``ModelConfig.d_ff`` of which each token uses ``top_k``; the
    router scores s = sigmoid(x W_r) (or softmax), experts are *selected* on s + b (b: a per-expert bias buffer
    moved outside the gradient towards balanced load, the auxiliary-loss-free balancing), and the selected
    experts' scores are renormalised to sum to 1 and multiplied by ``routed_scaling``. Dropless: every token
    reaches its k experts. Defaults: top-8 of 64 routed experts, 1 shared, sigmoid, 2.446 (the paper's 48B model
    has 256/8/1, sigmoid, 2.446; the scaling sizes' counts are not stated: docs/moe.md says why 64).
    """

    n_experts: int = 64  # routed experts E
    top_k: int = 8  # routed experts per token k
    n_shared: int = 1  # always-on shared experts
    shared_d_ff: int | None = None  # width of each shared expert; default: d_ff (as DeepSeek-V3 / Kimi Linear)
    score: Literal["sigmoid", "softmax"] = "sigmoid"  # router score function
    renormalize: bool = True  # weights = selected scores / their sum (DeepSeek-V3's norm_topk_prob)
    routed_scaling: float = 2.446  # multiplies the routed weights (Moonlight / Kimi Linear routed_scaling_factor)
    bias_update_rate: float = 1e-3  # u in b_i += u * sign(mean load - load_i), once per optimizer step
    aux_loss_alpha: float = 1e-4  # DeepSeek-V3's sequence-wise balance loss weight (0: off)
    dispatch: Literal["auto", "grouped_mm", "loop"] = "auto"  # expert matmuls (attnres.moe.grouped_mm_supported)

    def __post_init__(self) -> None:
        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"model.moe.{name}={getattr(self, name)!r} (ModelConfig.moe.{name}) must be {rule}")

        for name in ("n_experts", "top_k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise bad(name, "a positive integer")
        if not isinstance(self.n_shared, int) or isinstance(self.n_shared, bool) or self.n_shared < 0:
            raise bad("n_shared", "an integer >= 0")
        if self.top_k > self.n_experts:
            raise bad("top_k", f"at most n_experts={self.n_experts}")
        sd = self.shared_d_ff
        if sd is not None and (not isinstance(sd, int) or isinstance(sd, bool) or sd < 1):
            raise bad("shared_d_ff", "a positive integer or None (= d_ff)")
        if self.score not in ("sigmoid", "softmax"):
            raise bad("score", "'sigmoid' or 'softmax'")
        if self.dispatch not in ("auto", "grouped_mm", "loop"):
            raise bad("dispatch", "'auto', 'grouped_mm' or 'loop'")
        if not isinstance(self.renormalize, bool):
            raise bad("renormalize", "True or False")
        for name in ("routed_scaling", "bias_update_rate", "aux_loss_alpha"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or not math.isfinite(v):
                raise bad(name, "a finite number >= 0")
        if self.routed_scaling == 0:
            raise bad("routed_scaling", "> 0")

    @classmethod
    def parse(cls, value: MoEConfig | dict[str, Any] | None) -> MoEConfig:
        """From ``model.moe`` (a mapping of these fields, missing keys at their defaults), naming unknown keys."""
        if isinstance(value, MoEConfig):
            return value
        value = dict(value or {})
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise ValueError(f"model.moe has {unknown}, which is not an MoE setting; allowed: {', '.join(allowed)}")
        return cls(**value)


@dataclass
class ModelConfig:
    vocab_size: int = 256
    n_layers: int = 4  # transformer blocks L_b (each = attention + MLP sublayer)
    d_model: int = 128
    n_heads: int = 4
    head_dim: int | None = None  # default d_model // n_heads; may differ so that n_heads * head_dim != d_model
    d_ff: int | None = None  # SwiGLU hidden width; default: 8/3 * d_model rounded up to a multiple of 32
    max_seq_len: int = 256
    residual: str = "baseline"
    # Block geometry, read (and checked) only by schemes with uses_block_geometry (Block AttnRes):
    n_blocks: int | None = 8  # number of blocks N (block size S = ceil(L / N) sublayers)
    block_size: int | None = None  # sublayers per block S; when set it wins over n_blocks
    tie_embeddings: bool = False
    rope_theta: float = 10000.0
    # every RMSNorm, including AttnRes key norms. Small enough that an AttnRes read at init (the mean of its
    # sources, mean square ~4e-4 / J^2 at embedding std 0.02) keeps zero-init == baseline (docs/results/norm_eps.md)
    norm_eps: float = 1e-8
    init_std: float = 0.02
    # Options of the residual scheme (ablations, peers), as given; ``options`` is their typed, checked form.
    residual_options: dict[str, Any] = field(default_factory=dict)
    # The MLP sublayer: "dense" (one SwiGLU of width d_ff) or "moe" (attnres.moe.MoEFeedForward, routed experts of
    # width d_ff; options in ``moe``, which must stay None for dense). Any residual scheme works with either.
    ffn: str = "dense"
    moe: MoEConfig | None = None

    def __post_init__(self) -> None:
        scheme = registry.get(self.residual)  # ValueError listing the registered names
        for name in ("vocab_size", "n_layers", "d_model", "n_heads", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name}={value!r} must be a positive integer")
        if self.head_dim is None:
            if self.d_model % self.n_heads != 0:
                raise ValueError(
                    f"ModelConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                    "either choose n_heads among the divisors of d_model or set head_dim explicitly"
                )
            self.head_dim = self.d_model // self.n_heads
        if not isinstance(self.head_dim, int) or self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(
                f"ModelConfig.head_dim={self.head_dim!r} must be a positive even integer (RoPE rotates pairs)"
            )
        if self.d_ff is None:
            self.d_ff = 32 * math.ceil(8 * self.d_model / 3 / 32)
        if not isinstance(self.d_ff, int) or self.d_ff <= 0:
            raise ValueError(f"ModelConfig.d_ff={self.d_ff!r} must be a positive integer")
        if self.norm_eps <= 0 or self.init_std <= 0 or self.rope_theta <= 0:
            raise ValueError("ModelConfig.norm_eps, init_std and rope_theta must be > 0")
        self.residual_options = dict(self.residual_options or {})
        if self.ffn not in FFN_KINDS:
            raise ValueError(f"ModelConfig.ffn={self.ffn!r} (model.ffn) is unknown; allowed values: dense, moe")
        if self.ffn == "moe":
            self.moe = MoEConfig.parse(self.moe)
        elif self.moe is not None:
            raise ValueError("ModelConfig.moe (model.moe) is set but ffn='dense' reads no MoE option; set ffn='moe'")
        if scheme.uses_block_geometry:  # other schemes ignore (and do not check) n_blocks and block_size
            self._check_block_geometry()
        scheme.Options.parse(self.residual_options, self)  # ValueError naming a bad option

    def _check_block_geometry(self) -> None:
        if self.block_size is not None:
            if not isinstance(self.block_size, int) or not 1 <= self.block_size <= self.n_sublayers:
                raise ValueError(
                    f"ModelConfig.block_size={self.block_size!r} must be an integer in [1, {self.n_sublayers}] "
                    f"(sublayers per block; the model has 2 * n_layers = {self.n_sublayers} sublayers)"
                )
        elif self.n_blocks is None:
            raise ValueError(f"ModelConfig: residual={self.residual!r} needs n_blocks or block_size")
        elif not isinstance(self.n_blocks, int) or not 1 <= self.n_blocks <= self.n_sublayers:
            raise ValueError(
                f"ModelConfig.n_blocks={self.n_blocks!r} must be an integer in [1, {self.n_sublayers}] "
                f"(the model has 2 * n_layers = {self.n_sublayers} sublayers)"
            )

    @property
    def options(self) -> registry.SchemeOptions:
        """The residual scheme's typed options: ``residual_options`` over the scheme's defaults, checked."""
        return registry.get(self.residual).Options.parse(self.residual_options, self)

    # ---- derived quantities -------------------------------------------------------------------------------
    @property
    def n_sublayers(self) -> int:
        """L in the paper: one per attention and one per MLP."""
        return 2 * self.n_layers

    @property
    def n_reads(self) -> int:
        """Depth-wise reads: one before each sublayer plus the final read."""
        return self.n_sublayers + 1

    @property
    def attn_dim(self) -> int:
        return self.n_heads * self.head_dim  # type: ignore[operator]

    @property
    def sublayers_per_block(self) -> int:
        """Block AttnRes block size S in sublayers (the last block may be shorter)."""
        if self.block_size is not None:
            return self.block_size
        assert self.n_blocks is not None
        return math.ceil(self.n_sublayers / self.n_blocks)

    @property
    def reads_block_geometry(self) -> bool:
        """Whether the residual scheme reads n_blocks / block_size (its class's ``uses_block_geometry``); for any
        other scheme they are neither checked nor used."""
        return bool(registry.get(self.residual).uses_block_geometry)

    @property
    def effective_n_blocks(self) -> int:
        """Number of blocks actually formed: ceil(L / S) (can be < n_blocks when L is not divisible)."""
        return math.ceil(self.n_sublayers / self.sublayers_per_block)

    @property
    def moe_options(self) -> MoEConfig:
        """The MoE options of an ffn='moe' model (ValueError for a dense one)."""
        if self.moe is None:
            raise ValueError(f"ModelConfig.ffn={self.ffn!r}: the model has no MoE options")
        return self.moe

    @property
    def shared_d_ff(self) -> int:
        """Width of each shared expert of an MoE model (MoEConfig.shared_d_ff, default d_ff)."""
        assert self.d_ff is not None
        return self.moe_options.shared_d_ff or self.d_ff

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
