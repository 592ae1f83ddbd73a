"""Launch configurations of the Triton depth kernels (depth_mix_triton.py): one choice per call shape.

Every kernel walks D in chunks of CHUNK = 32 (a warp's width: tokens across warps, one element of a row per
lane, D padded to a multiple of 32 at most), so a compiled kernel does not depend on D; what varies is its tile:
tokens per program step, warps, how far its loops are unrolled (the loads in flight together), and the
persistent grid's programs per SM. ``launch(kernel, D, n, has_q, low)`` is what gpu_kernels.py launches with,
for n = Q reads (attend; the kernel is compiled for Q padded to a power of two) or K extras (merge).

The choice is a pure function of the call's key, so a run and its resume launch the same programs and round the
same way. In order:
  1. ``ATTNRES_TRITON_LAUNCH=<file>``: a table timed on a GPU (experiments/depth_roofline.py ``--tune`` writes one
     from ``candidates``), by key with D, then without;
  2. the packaged table (triton_launch.json): chosen without a GPU by compiling every candidate for sm_90a and
     reading ptxas's registers and spills (scripts/triton_aot_report.py ``--select``; the rule is ``select``);
  3. ``fallback``: a small tile that compiles without spills for any Q and K the kernels take.
S (the number of sources) is not part of the key: it is a loop bound, and changes neither the compiled kernel nor
what a program keeps in registers. Neither is the dtype: it changes the loads' width, not the tile's registers.
Measurements and the reasons: docs/performance.md, "Triton kernels on CUDA".
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

KERNELS = ("attend_fwd", "attend_bwd", "merge_fwd", "merge_bwd")
ENV_TABLE = "ATTNRES_TRITON_LAUNCH"  # a JSON file of launches tuned on a GPU (optional)
PACKAGED = Path(__file__).with_name("triton_launch.json")

# Hopper (H100 / H200, sm_90): what bounds the blocks resident per SM
REGISTERS_PER_SM = 65536
MAX_THREADS_PER_SM = 2048
MAX_BLOCKS_PER_SM = 32
SHARED_PER_SM = 228 * 1024
SHARED_RESERVED_PER_BLOCK = 1024
REGISTER_GRANULE = 256  # registers are allocated per warp in units of 256 (8 per thread)

CHUNK = 32
MIN_WARPS_PER_SM = 16  # select: the occupancy a tile must leave (below it, another is chosen if one compiles)
IN_FLIGHT_BYTES = 32 * 1024  # select: loads in flight per SM that cover HBM's latency (4.8 TB/s x ~0.9 us / 132)


@dataclass(frozen=True)
class Tile:
    """What a table holds for one key: ``block_t`` tokens per program step (a multiple of ``warps``), ``warps``,
    ``unroll`` (how far the loops over chunks or sources are unrolled: the loads issued together), ``stages``
    (Triton's software pipelining; it pipelines no load of these kernels, so 1), and ``per_sm`` programs per SM of
    the persistent grid (the blocks that fit one SM, from the compiled kernel's registers)."""

    block_t: int
    warps: int
    unroll: int
    stages: int = 1
    per_sm: int = 4


@dataclass(frozen=True)
class Launch:
    """A Tile at width D: D in ``n_chunks`` chunks of ``chunk``."""

    block_t: int
    chunk: int
    n_chunks: int
    warps: int
    stages: int = 1
    per_sm: int = 4
    unroll: int = 1

    @property
    def padded(self) -> int:
        """D as the kernel's lanes cover it: a multiple of the chunk."""
        return self.chunk * self.n_chunks


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def table_n(kernel: str, n: int) -> int:
    """The n a kernel is compiled for: Q padded to a power of two (attend), K itself (merge)."""
    return _pow2(n) if kernel.startswith("attend") else n


def key(kernel: str, n: int, has_q: bool = True, D: int | None = None) -> str:
    """A table key: kernel, the compiled n (table_n), whether a merge scores its extras, and optionally D."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {KERNELS}")
    width = f"/D{D}" if D is not None else ""
    scored = "" if kernel.startswith("attend") else ("/q" if has_q else "/noq")
    return f"{kernel}{width}/n{table_n(kernel, n)}{scored}"


def blocks_per_sm(registers: int, warps: int, shared: int = 0) -> int:
    """Blocks of ``warps`` warps that fit on one Hopper SM with ``registers`` per thread and ``shared`` bytes of
    shared memory per block (registers rounded up to the allocation granule, per warp)."""
    per_warp = _cdiv(max(registers, 1) * 32, REGISTER_GRANULE) * REGISTER_GRANULE
    by_registers = (REGISTERS_PER_SM // per_warp) // warps
    by_threads = MAX_THREADS_PER_SM // (32 * warps)
    by_shared = SHARED_PER_SM // (shared + SHARED_RESERVED_PER_BLOCK)
    return min(by_registers, by_threads, by_shared, MAX_BLOCKS_PER_SM)


def candidates(kernel: str) -> list[Tile]:
    """The small set the tables are chosen from: 4, 8 or 16 tokens per step, 4 or 8 warps (at least one token per
    warp), loops unrolled 1, 2, 4 or 8 times; one stage (more change nothing: the compiled code is identical)."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {KERNELS}")
    return [
        Tile(block_t, warps, unroll)
        for warps in (4, 8)
        for block_t in (4, 8, 16)
        if block_t >= warps
        for unroll in (1, 2, 4, 8)
    ]


def row_bytes(kernel: str, n: int) -> int:
    """Bytes one token's chunk of D brings in per step of the kernel's main loop (bf16 sources, fp32 base, y and
    gradients): attend one source; merge_fwd base and the K extras; merge_bwd dL/dy, y and the K extras."""
    if kernel.startswith("attend"):
        return 2 * CHUNK
    if kernel == "merge_fwd":
        return (4 + 2 * n) * CHUNK
    return (8 + 2 * n) * CHUNK


def select(compiled: list[tuple[Tile, int, int, int]], kernel: str, n: int) -> Tile:
    """The rule of the packaged table, given (tile, registers, spill bytes, blocks per SM) of every candidate of
    one key: no spills; then at least MIN_WARPS_PER_SM resident warps if any tile leaves them; then the bytes its
    loops have in flight per SM (blocks x block_t x unroll x row_bytes: what hides the memory latency), up to
    IN_FLIGHT_BYTES; then the least unrolling (code size and compile time), fewer registers, the earlier
    candidate. The tile's per_sm is its blocks per SM."""
    clean = [c for c in compiled if c[2] == 0] or list(compiled)
    full = [c for c in clean if c[3] * c[0].warps >= MIN_WARPS_PER_SM]
    pool = full or clean

    def score(c):
        t, registers, _, blocks = c
        in_flight = min(IN_FLIGHT_BYTES, blocks * t.block_t * t.unroll * row_bytes(kernel, n))
        return (in_flight, -t.unroll, -registers, -compiled.index(c))

    tile, _, _, blocks = max(pool, key=score)
    return Tile(tile.block_t, tile.warps, tile.unroll, tile.stages, max(1, blocks))


def fallback(kernel: str, n: int, has_q: bool = True) -> Tile:
    """The tile for a key no table has: 4 tokens, 4 warps, no unrolling (the smallest state: at K = 16, the most
    extras a merge takes, it compiles for sm_90a without spills, 242-249 registers; docs/performance.md)."""
    return Tile(4, 4, 1, 1, 4)


@lru_cache(maxsize=8)
def _table(path: str) -> dict[str, Tile]:
    with open(path) as f:
        raw = json.load(f)
    return {k: Tile(**v) for k, v in raw.get("launches", {}).items()}


def table_path() -> str | None:
    """The GPU-tuned table in use (ATTNRES_TRITON_LAUNCH), or None."""
    return os.environ.get(ENV_TABLE) or None


_FORCED: list[Tile] = []


@contextmanager
def forced(t: Tile) -> Iterator[None]:
    """Every launch inside takes tile ``t`` (what a tuner does to time a candidate)."""
    _FORCED.append(t)
    try:
        yield
    finally:
        _FORCED.pop()


def tile(kernel: str, n: int, has_q: bool = True, D: int | None = None) -> Tile:
    """The tile for this key: the tuned table's (ATTNRES_TRITON_LAUNCH; by key with D, then without), else the
    packaged table's, else ``fallback`` (inside ``forced``, the forced tile)."""
    if _FORCED:
        return _FORCED[-1]
    tables = [table_path(), str(PACKAGED) if PACKAGED.exists() else None]
    for path in tables:
        if path:
            found = _table(path)
            for k in ([key(kernel, n, has_q, D)] if D is not None else []) + [key(kernel, n, has_q)]:
                if k in found:
                    return found[k]
    return fallback(kernel, n, has_q)


def launch(kernel: str, D: int, n: int, has_q: bool = True, low: str = "bf16") -> Launch:
    """The launch of ``kernel`` for a call of width D with n = Q or K (``low``, the call's low-precision dtype,
    does not change the choice). Deterministic for a given key and tables."""
    t = tile(kernel, n, has_q, D)
    return Launch(t.block_t, CHUNK, _cdiv(D, CHUNK), t.warps, t.stages, t.per_sm, t.unroll)


def write_table(path: str | Path, launches: dict[str, Tile], meta: dict) -> None:
    """Write a table in the format ``tile`` reads (the packaged one, or one for ATTNRES_TRITON_LAUNCH)."""
    doc = {"meta": meta, "launches": {k: asdict(v) for k, v in sorted(launches.items())}}
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")
