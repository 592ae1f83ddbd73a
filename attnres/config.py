"""Model configuration: one dataclass, validated at construction.

Vocabulary used throughout the library (it follows the paper, §2.1):
  * a *transformer block* is one attention sublayer followed by one MLP sublayer; ``n_layers`` counts them (L_b);
  * a *sublayer* (the paper's "layer") is one attention or one MLP; there are L = 2 * n_layers of them;
  * a *read* is one depth-wise aggregation: one before every sublayer plus one final read before the LM head,
    so a model has L + 1 reads.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from . import registry


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
    def effective_n_blocks(self) -> int:
        """Number of blocks actually formed: ceil(L / S) (can be < n_blocks when L is not divisible)."""
        return math.ceil(self.n_sublayers / self.sublayers_per_block)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
