"""What the benchmarks share (experiments.bench and experiments.bench_harness): the sizes they time
(:class:`BenchSize`: built in, or from conf/size/), the summary statistics of a sample of times
(:func:`summarize`) and the load other processes put on the machine meanwhile (:class:`CoreMonitor`).

No torch at import: ``python -m experiments.bench --help`` stays fast.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import resolvers

REPO = Path(__file__).resolve().parents[1]
CONF_SIZES = REPO / "conf" / "size"


# ---------------------------------------------------------------------------------------------------------
# Sizes


@dataclass(frozen=True)
class BenchSize:
    """One model shape to benchmark. ``n_blocks`` is Block AttnRes' N (the other schemes ignore it)."""

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


def conf_size(name: str, batch_size: int | None = None, seq_len: int | None = None) -> BenchSize:
    """A size from conf/size/<name>.yaml. The CPU ladder's Block uses N = 4 (conf/experiment/cpu_ladder.yaml),
    the paper sizes N = 8. Paper sizes default to 2 sequences per step (16k tokens at context 8192)."""
    from omegaconf import OmegaConf

    resolvers.register()  # derived sizes (paper_arch, cpu_arch) interpolate ${attnres_arch:...}
    path = CONF_SIZES / f"{name}.yaml"
    if not path.is_file():
        allowed = sorted([*BUILTIN, *(p.stem for p in CONF_SIZES.glob("*.yaml"))])
        raise ValueError(f"--sizes: unknown size {name!r}; allowed values: {', '.join(allowed)}")
    s = OmegaConf.load(path)
    paper = name.startswith("paper_")
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
        note=f"conf/size/{name}.yaml",
    )


def resolve_size(name: str, batch_size: int | None = None, seq_len: int | None = None) -> BenchSize:
    if name in BUILTIN:
        s = BUILTIN[name]
        changes = {k: v for k, v in (("batch_size", batch_size), ("seq_len", seq_len)) if v}
        return BenchSize(**{**s.to_dict(), **changes}) if changes else s
    return conf_size(name, batch_size, seq_len)


# ---------------------------------------------------------------------------------------------------------
# Statistics and machine load


def summarize(samples: Sequence[float]) -> dict[str, Any]:
    """Median, interquartile range (q1, q3), min and max of samples (and the samples themselves)."""
    xs = sorted(float(x) for x in samples)
    if not xs:
        return {"median": None, "q1": None, "q3": None, "min": None, "max": None, "n": 0, "samples": []}
    if len(xs) >= 2:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    else:
        q1 = q3 = xs[0]
    return {
        "median": statistics.median(xs),
        "q1": q1,
        "q3": q3,
        "min": xs[0],
        "max": xs[-1],
        "n": len(xs),
        "samples": [float(x) for x in samples],
    }


class CoreMonitor:
    """Cores used by other processes during a window: busy jiffies of the whole machine (/proc/stat) minus
    this process's own CPU time, divided by the wall time. None where /proc/stat is unavailable."""

    def __init__(self) -> None:
        self.available = os.path.exists("/proc/stat")
        self._start: tuple[float, float, float] | None = None

    @staticmethod
    def _busy_seconds() -> float:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
        user, nice, system, _idle, _iowait, irq, softirq, steal = fields
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_seconds() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def start(self) -> None:
        if self.available:
            self._start = (time.perf_counter(), self._busy_seconds(), self._own_seconds())

    def stop(self) -> float | None:
        if not self.available or self._start is None:
            return None
        t0, busy0, own0 = self._start
        wall = time.perf_counter() - t0
        other = (self._busy_seconds() - busy0) - (self._own_seconds() - own0)
        return max(0.0, other / wall) if wall > 0 else None

    def wait_quiet(self, max_wait_s: float, threshold: float = 0.25, probe_s: float = 1.0) -> float | None:
        """Sleep until other processes use less than `threshold` cores over a `probe_s` window, or until
        `max_wait_s` passed; returns the last probe (None without /proc/stat or when max_wait_s <= 0)."""
        if not self.available or max_wait_s <= 0:
            return None
        deadline = time.perf_counter() + max_wait_s
        while True:
            self.start()
            time.sleep(probe_s)
            load = self.stop()
            if load is None or load < threshold or time.perf_counter() >= deadline:
                return load
