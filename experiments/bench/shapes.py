"""The model shapes the benchmarks time (:class:`BenchSize`): built in (the issue's target, the --quick size) or
from conf/size/.

No torch at import: ``python -m experiments.bench --help`` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import resolvers

REPO = Path(__file__).resolve().parents[2]
CONF_SIZES = REPO / "conf" / "size"


@dataclass(frozen=True)
class BenchSize:
    """One model shape to benchmark. ``n_blocks`` is Block AttnRes' N (the other schemes ignore it); ``ffn`` and
    ``moe`` are ModelConfig's (``moe``: the MoEConfig fields of an ``ffn="moe"`` size, as in conf/size/)."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    head_dim: int | None
    d_ff: int | None
    seq_len: int
    batch_size: int
    n_blocks: int = 8
    vocab_size: int = 256
    ffn: str = "dense"
    moe: dict[str, Any] | None = field(default=None, hash=False)
    note: str = ""

    def model_config(self, residual: str):
        from attnres import ModelConfig

        return ModelConfig(
            vocab_size=self.vocab_size,
            n_layers=self.n_layers,
            d_model=self.d_model,
            n_heads=self.n_heads,
            head_dim=self.head_dim,
            d_ff=self.d_ff,
            max_seq_len=self.seq_len,
            residual=residual,
            n_blocks=self.n_blocks if residual == "block" else 8,
            ffn=self.ffn,
            moe=dict(self.moe) if self.moe is not None else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# The target: 16 transformer blocks (32 sublayers) x d_model 256 x context 256; N = 8 blocks as in the
# paper's scaling runs (S = 4 sublayers per block). Batch 8 x 256 = 2,048 tokens keeps one step near 1-2 s.
TARGET = BenchSize(
    "attnres16x256",
    n_layers=16,
    d_model=256,
    n_heads=4,
    head_dim=64,
    d_ff=None,
    seq_len=256,
    batch_size=8,
    n_blocks=8,
    note="issue target: 16 layers x d 256 x context 256, N = 8 blocks",
)
# --quick: seconds, every code path.
TINY = BenchSize(
    "tiny",
    n_layers=2,
    d_model=64,
    n_heads=2,
    head_dim=32,
    d_ff=None,
    seq_len=64,
    batch_size=4,
    n_blocks=2,
    note="--quick smoke size",
)
BUILTIN = {TARGET.name: TARGET, TINY.name: TINY}


def size_names() -> list[str]:
    """Every name --sizes (and --moe-pairs) accepts: the built-in sizes, then conf/size/."""
    return sorted([*BUILTIN, *(p.stem for p in CONF_SIZES.glob("*.yaml"))])


def check_moe_pair(moe: BenchSize, dense: BenchSize) -> None:
    """A --moe-pairs entry names an ffn="moe" size, then a dense one (ValueError naming the flag otherwise)."""
    if moe.ffn != "moe" or dense.ffn != "dense":
        raise ValueError(f"--moe-pairs: {moe.name}:{dense.name} must name an MoE size, then a dense one")


def conf_size(name: str, batch_size: int | None = None, seq_len: int | None = None) -> BenchSize:
    """A size from conf/size/<name>.yaml. The CPU ladder's Block uses N = 4 (conf/experiment/cpu_ladder.yaml),
    the paper sizes N = 8. Paper sizes default to 2 sequences per step (16k tokens at context 8192)."""
    from omegaconf import OmegaConf

    resolvers.register()  # derived sizes (paper_arch, cpu_arch) interpolate ${attnres_arch:...}
    path = CONF_SIZES / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"--sizes: unknown size {name!r}; allowed values: {', '.join(size_names())}")
    s = OmegaConf.load(path)
    paper = name.startswith("paper_")
    moe = s.get("moe")
    return BenchSize(
        name,
        n_layers=int(s.n_layers),
        d_model=int(s.d_model),
        n_heads=int(s.n_heads),
        head_dim=int(s.head_dim),
        d_ff=int(s.d_ff),
        seq_len=int(seq_len or s.seq_len),
        batch_size=int(batch_size or (2 if paper else s.batch_size)),
        n_blocks=8 if paper else 4,
        ffn=str(s.get("ffn", "dense")),
        moe=OmegaConf.to_container(moe, resolve=True) if moe is not None else None,  # type: ignore[arg-type]
        note=f"conf/size/{name}.yaml",
    )


def resolve_size(name: str, batch_size: int | None = None, seq_len: int | None = None) -> BenchSize:
    """A built-in size (batch_size / seq_len replaced where given) or :func:`conf_size`."""
    if name in BUILTIN:
        s = BUILTIN[name]
        changes = {k: v for k, v in (("batch_size", batch_size), ("seq_len", seq_len)) if v}
        return BenchSize(**{**s.to_dict(), **changes}) if changes else s
    return conf_size(name, batch_size, seq_len)
