"""The CPU ladder's two training paths side by side: ``python -m experiments.bench --ladder`` (issue 21, "twice the
training per CPU-second"; results and how to read them: docs/performance.md, "The compiled CPU step").

**Runs.** For every ladder size and arm it trains real ``experiments.train.train`` runs in this process, composed
as the ladder composes them (``experiment=cpu_ladder size=<size> model=<arm> threads=1 logger=none``, evaluation
and checkpoints as the ladder does them) on ``train_path=eager`` and ``train_path=compiled``; ``--ladder-fraction``
scales ``train.tokens`` (1.0: the real run). Per size there are ``--ladder-seeds`` K rounds; round r trains seed r
of every arm (the arms' order rotates by one per round), each arm on both paths, eager first in even rounds and
compiled first in odd ones. The arms of a size and the two paths of an arm thus run next to each other in time,
and every ratio below is taken between runs of the same round.

**What a run reports.** steps, tokens, wall seconds and CPU seconds (:func:`experiments.training.compiler.cpu_seconds`
around ``train()``: data and model setup, compilation with the C++ compiler's child processes, training,
evaluation, checkpoints), ``tokens_per_cpu_s`` = tokens / CPU seconds, the first step (compilation included on
the compiled path) and the **steady step**: the median gap between consecutive training-batch starts
(:class:`LadderTimer`), the first :data:`WARMUP_GAPS` gaps and every gap that holds an evaluation or a checkpoint
dropped (the per-step grad-norm statistics of the logged steps stay in). The load other processes put on the
machine during each run (machine_load.CoreMonitor) is recorded with it.

**Compilation is counted.** Round 0's compiled run of every (size, arm) is **cold**: it compiles into a fresh,
empty inductor cache (a new ``$TORCHINDUCTOR_CACHE_DIR`` under a temporary directory, inductor's in-memory caches
cleared). Later rounds are **warm in-process**: the same process has that shape's compiled code already (dynamo
guards on shapes, not on the model object: experiments/training/compiler.py). With ``--ladder-disk-warm`` each shape
also gets one compiled run in a **new process** that finds only the warm disk cache (a study worker's first run of a
shape another worker compiled). The **amortised** figure for a study with K runs per shape and worker is
tokens / ((cold + (K - 1) warm) / K) CPU seconds.

**GEMM floor** (experiments.bench.gemm_floor). Every aten mm/addmm/bmm/baddbmm of one eager training step (forward and
backward) of the baseline at the size is recorded with a TorchDispatchMode, SDPA forced to its math backend so that
attention's QK^T and PV and their four backward bmm are among them; each recorded (op, shapes, strides, dtype) is
then timed alone on random tensors, one thread, and the times summed with their counts. That sum is the step's
GEMM floor; a step at the floor would do nothing but its matmuls. :func:`matmul_peak` times a 512^3 fp32 mm on one
thread, the machine's large-matmul peak. Every arm is compared with the baseline's floor (AttnRes adds no GEMM of
note; its depth mixing is overhead by design). The math backend computes attention's full T x T scores, so the
floor's attention share is that of an unmasked attention (``attention_share``).

Lightning is imported here only (as in experiments.bench.harness); ``python -m experiments.bench --help`` stays
fast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from ..run.run_env import cpu_seconds
from ..training.compiler import CACHE_ENV
from .gemm_floor import matmul_peak, record_matmuls, time_floor
from .machine_load import CoreMonitor
from .sample_stats import summarize
from .settings import BenchSettings
from .shapes import REPO

LADDER_SIZES = ("cpu_xs", "cpu_s", "cpu_m", "cpu_l")  # the default study's sizes (conf/sweep/cpu_ladder.yaml)
LADDER_SCHEMES = ("baseline", "block_attnres", "full_attnres")  # conf/model/ names; the first is the reference
PATHS = ("eager", "compiled")
WARMUP_GAPS = 10  # steady step: gaps between batch starts from the 11th on (compiled: step 1 compiles)
STUDY_SEEDS = 3  # seeds per (arm, size) of the default study: the amortised figures use K = 1 .. this
SPEED_TARGET = 2.0  # compiled / eager tokens per CPU-second (issue 21)
FLOOR_TARGET = 0.45  # fraction of the GEMM floor, whole run (issue 21)
RATIO_TARGETS = {"block_attnres": 1.10, "full_attnres": 1.20}  # step / baseline step (issue 21)


# ---------------------------------------------------------------------------------------------------------
# Step stamps of a training run


class LadderTimer(pl.Callback):
    """Stamps the start of every training batch, in wall time and in this process's CPU time, notes which gaps
    between stamps hold an evaluation or a checkpoint, and sums the CPU seconds of the evaluations; writes
    ``{"stamps", "cpu_stamps", "dirty" (gap indices), "eval_cpu_s", "evals"}`` to ``path`` at every teardown (the
    end of fit, and of the final evaluation where train() runs one after fit)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.stamps: list[float] = []
        self.cpu_stamps: list[float] = []
        self.dirty: set[int] = set()
        self.eval_cpu_s, self.evals = 0.0, 0
        self._eval_start: float | None = None

    def _mark(self) -> None:
        if self.stamps:  # the gap that started at the last stamp
            self.dirty.add(len(self.stamps) - 1)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.stamps.append(time.perf_counter())
        self.cpu_stamps.append(time.process_time())

    def on_validation_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self._mark()
        self._eval_start = time.process_time()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if self._eval_start is not None:
            self.eval_cpu_s += time.process_time() - self._eval_start
            self.evals += 1
            self._eval_start = None

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self._mark()

    def teardown(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        if trainer.is_global_zero:
            state = {"stamps": self.stamps, "cpu_stamps": self.cpu_stamps, "dirty": sorted(self.dirty)}
            self.path.write_text(json.dumps({**state, "eval_cpu_s": self.eval_cpu_s, "evals": self.evals}))


def steady_gaps(stamps: Sequence[float], dirty: Sequence[int], warmup: int = WARMUP_GAPS) -> list[float]:
    """The gaps between consecutive stamps, without the first ``warmup`` and without the ``dirty`` ones."""
    skip = set(dirty)
    return [b - a for i, (a, b) in enumerate(pairwise(stamps)) if i >= warmup and i not in skip]


# ---------------------------------------------------------------------------------------------------------
# One run


def ladder_overrides(
    size: str,
    scheme: str,
    path: str,
    seed: int,
    runs_root: Path,
    timer_path: Path,
    fraction: float = 1.0,
    data_cache: str | None = None,
    data_max_bytes: int | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The overrides of one ladder run as the study launches it (one thread, no external logger, no progress bar),
    on training path ``path``, with ``train.tokens`` scaled by ``fraction`` (at least 16 steps' worth), then
    ``extra``."""
    from ..config.compose import compose

    o = [
        "experiment=cpu_ladder",
        f"size={size}",
        f"model={scheme}",
        f"train_path={path}",
        f"seed={seed}",
        "threads=1",
        "logger=none",
        "trainer.enable_progress_bar=false",
        "force=true",
        f"paths.runs_root={runs_root}",
        f"paths.hydra_root={runs_root / 'outputs'}",
        "+callbacks.ladder_timer._target_=experiments.bench.ladder.LadderTimer",
        f"+callbacks.ladder_timer.path={timer_path}",
    ]
    if data_cache:
        o.append(f"data.cache_dir={data_cache}")
    if data_max_bytes:
        o.append(f"data.max_bytes={data_max_bytes}")
    if fraction != 1.0:
        s = compose([f"size={size}"]).size
        step_tokens = int(s.batch_size) * int(s.seq_len)
        o.append(f"train.tokens={max(16 * step_tokens, round(float(s.tokens) * fraction))}")
    return o + list(extra)


def full_steps(size: str) -> int:
    """Optimizer steps of the real ladder run at ``size`` (train.tokens = size.tokens, in whole batches)."""
    from ..config.compose import compose
    from ..sizes import steps_for

    s = compose([f"size={size}"]).size
    return steps_for(float(s.tokens), int(s.batch_size), int(s.seq_len))


def train_once(overrides: Sequence[str], timer_path: Path) -> dict[str, Any]:
    """Train one run in this process (experiments.train.train); its measurements as a dict (module docstring)."""
    from ..config.compose import compose
    from ..train import train

    cfg = compose(list(overrides))
    monitor = CoreMonitor()
    monitor.start()
    wall0, cpu0, own0 = time.perf_counter(), cpu_seconds(), time.process_time()
    record = train(cfg)
    wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
    load = monitor.stop()
    timer = json.loads(timer_path.read_text())
    dirty = timer["dirty"]
    cpu_gaps = [b - a for a, b in pairwise(timer["cpu_stamps"])]
    wall_gaps = [b - a for a, b in pairwise(timer["stamps"])]
    steady = steady_gaps(timer["cpu_stamps"], dirty)
    steady_wall = steady_gaps(timer["stamps"], dirty)
    steps, tokens = int(record["steps"]), int(record["tokens"])
    return {
        "steps": steps,
        "tokens": tokens,
        "wall_s": wall,
        "cpu_s": cpu,
        "record_cpu_time_s": record.get("cpu_time_s"),
        "record_wall_time_s": record.get("wall_time_s"),
        "train_path": record.get("train_path"),
        "val_loss": record.get("val_loss"),
        "tokens_per_cpu_s": tokens / cpu,
        "tokens_per_wall_s": tokens / wall,
        "cpu_s_per_step": cpu / steps,
        "first_step_s": cpu_gaps[0] if cpu_gaps else None,
        "first_step_wall_s": wall_gaps[0] if wall_gaps else None,
        "steady_step_s": statistics.median(steady) if steady else None,
        "steady_step_mean_s": statistics.fmean(steady) if steady else None,
        "steady_step_wall_s": statistics.median(steady_wall) if steady_wall else None,
        "steady_steps": len(steady),
        "dirty_gaps": len(dirty),
        "setup_cpu_s": timer["cpu_stamps"][0] - own0 if timer["cpu_stamps"] else None,
        "eval_cpu_s": timer["eval_cpu_s"],
        "evals": timer["evals"],
        "other_cores_busy": load,
    }


@contextlib.contextmanager
def inductor_cache(path: Path, fresh: bool) -> Iterator[Path]:
    """``$TORCHINDUCTOR_CACHE_DIR`` = ``path`` inside the block (experiments.training.compiler keeps a directory that is
    set);
    ``fresh``: inductor's in-memory caches are cleared first, so nothing compiled before is reused but the code
    dynamo already holds for other shapes."""
    from torch._inductor.utils import clear_caches

    old = os.environ.get(CACHE_ENV)
    path.mkdir(parents=True, exist_ok=True)
    os.environ[CACHE_ENV] = str(path)
    if fresh:
        clear_caches()
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = old


def child_run(spec: dict[str, Any], timeout_s: float = 3600) -> dict[str, Any]:
    """One run in a new process (``python -m experiments.bench.ladder --child``) with the inductor cache
    ``spec["cache"]``; the run's measurements plus the process's own CPU seconds (imports included)."""
    root = str(REPO)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        CACHE_ENV: str(spec["cache"]),
        "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
    }
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.bench.ladder", "--child", json.dumps(spec)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ladder child run failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_wall_s"] = time.perf_counter() - t0
    return out


# ---------------------------------------------------------------------------------------------------------
# The ladder


def amortised_cpu_s(cold: float, warm: float, k: int) -> float:
    """CPU seconds per run when one run in ``k`` compiles cold and the other ``k - 1`` reuse the compiled code."""
    return (cold + (k - 1) * warm) / k


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _median(xs: Sequence[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return statistics.median(v) if v else None


def _residual(scheme: str) -> str:
    return {"baseline": "baseline", "block_attnres": "block", "full_attnres": "full"}.get(scheme, scheme)


def rates(cpu_s_per_step: float | None, floor_s: float, step_flops: float, peak_gflop_per_s: float) -> dict[str, Any]:
    """A step of ``cpu_s_per_step`` CPU seconds against the GEMM floor and the matmul peak: ``floor_fraction`` =
    floor / step, ``gflop_per_s`` = the step's FLOPs (attnres.flops_per_token x tokens) / step,
    ``peak_fraction`` = that / the peak."""
    if not cpu_s_per_step:
        return {"floor_fraction": None, "gflop_per_s": None, "peak_fraction": None}
    gf = step_flops / cpu_s_per_step / 1e9
    return {"floor_fraction": floor_s / cpu_s_per_step, "gflop_per_s": gf, "peak_fraction": gf / peak_gflop_per_s}


def derive_run(r: dict[str, Any], floor_s: float, step_flops: float, peak: float) -> dict[str, Any]:
    """``r`` (:func:`train_once`) with its step against the floor and the peak of its round: ``steady`` (the
    steady step) and ``whole`` (the run's CPU seconds per step: setup, compilation, evaluation, checkpoints)."""
    r["steady"] = rates(r["steady_step_s"], floor_s, step_flops, peak)
    r["whole"] = rates(r["cpu_s_per_step"], floor_s, step_flops, peak)
    r["floor_s"], r["peak_gflop_per_s"] = floor_s, peak
    return r


def _figures(rs: Sequence[dict[str, Any]], eager: dict[int, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """Medians over the runs ``rs``; ``vs_eager``: the median over rounds of tokens per CPU-second / that of the
    eager run of the same round."""
    if not rs:
        return None
    out: dict[str, Any] = {
        "runs": len(rs),
        "tokens_per_cpu_s": _median([r["tokens_per_cpu_s"] for r in rs]),
        "cpu_s": _median([r["cpu_s"] for r in rs]),
        "cpu_s_per_step": _median([r["cpu_s_per_step"] for r in rs]),
        "steady_step_s": _median([r["steady_step_s"] for r in rs]),
        "first_step_s": _median([r["first_step_s"] for r in rs]),
        "first_step_wall_s": _median([r["first_step_wall_s"] for r in rs]),
    }
    for part in ("steady", "whole"):
        out[part] = {k: _median([r[part][k] for r in rs]) for k in ("floor_fraction", "gflop_per_s", "peak_fraction")}
    if eager is not None:
        out["vs_eager"] = _median(
            [r["tokens_per_cpu_s"] / eager[r["round"]]["tokens_per_cpu_s"] for r in rs if r["round"] in eager]
        )
    return out


def project_cpu_s(r: dict[str, Any], steps: int) -> float | None:
    """Run ``r``'s CPU seconds had it trained ``steps`` steps: its setup and evaluations as measured (a run makes
    eval_count evaluations however long it is) plus ``steps`` x its CPU seconds per step outside them (steps,
    checkpoints, compilation on a cold run spread over its steps: use it for warm and eager runs)."""
    if r.get("setup_cpu_s") is None or r.get("eval_cpu_s") is None:
        return None
    fixed = r["setup_cpu_s"] + r["eval_cpu_s"]
    return fixed + steps * (r["cpu_s"] - fixed) / r["steps"]


def summarize_arm(
    runs: Sequence[dict[str, Any]],
    floor_s: float,
    step_flops: float,
    peak: float,
    steps: int,
    full_steps: int | None = None,
) -> dict[str, Any]:
    """One arm of one size: its ``eager`` runs, the ``compiled`` runs as ``cold`` / ``warm`` / ``disk`` figures,
    the compilation's CPU seconds over a warm run, and the ``amortised`` figures for a study with K = 1 ..
    STUDY_SEEDS runs of the shape per worker (one of them cold). With ``full_steps`` (the real run's, when the
    bench trained a fraction of it): ``projected``, the same figures for runs of that length from the measured
    parts (:func:`project_cpu_s`; cold = projected warm + the measured compilation; ``disk_amortised``: one
    disk-warm run in STUDY_SEEDS, as when a study starts with the inductor cache of an earlier one)."""
    eager = [r for r in runs if r["kind"] == "eager"]
    by_round = {r["round"]: r for r in eager}
    kinds = {k: [r for r in runs if r["kind"] == k] for k in ("cold", "warm", "disk")}
    out: dict[str, Any] = {"eager": _figures(eager)}
    for k, rs in kinds.items():
        out[k] = _figures(rs, by_round if k != "disk" else None)
    eager_tpc = (out["eager"] or {}).get("tokens_per_cpu_s")
    if out["disk"] is not None:
        out["disk"]["vs_eager"] = _ratio(out["disk"]["tokens_per_cpu_s"], eager_tpc)
    if out["cold"] is not None and out["warm"] is not None:
        cold, warm = out["cold"]["cpu_s"], out["warm"]["cpu_s"]
        out["compile_cpu_s"] = {
            "cold": cold - warm,  # the cold run's CPU seconds above a warm run's (the same steps)
            "disk": out["disk"]["cpu_s"] - warm if out["disk"] is not None else None,
        }
        tokens = kinds["cold"][0]["tokens"]
        out["amortised"] = {}
        for k in range(1, STUDY_SEEDS + 1):
            cpu = amortised_cpu_s(cold, warm, k)
            out["amortised"][str(k)] = {
                "tokens_per_cpu_s": tokens / cpu,
                "vs_eager": _ratio(tokens / cpu, eager_tpc),
                **rates(cpu / steps, floor_s, step_flops, peak),
            }
    if full_steps and out["eager"] is not None and out["warm"] is not None and "compile_cpu_s" in out:
        proj = _projected(eager, kinds["warm"], out["compile_cpu_s"], floor_s, step_flops, peak, full_steps)
        if proj is not None:
            out["projected"] = proj
    return out


def _projected(
    eager: Sequence[dict[str, Any]],
    warm: Sequence[dict[str, Any]],
    compile_cpu_s: dict[str, float | None],
    floor_s: float,
    step_flops: float,
    peak: float,
    full_steps: int,
) -> dict[str, Any] | None:
    """summarize_arm's ``projected`` figures for runs of ``full_steps`` steps (None where a projection is
    missing)."""
    tps = warm[0]["tokens"] / warm[0]["steps"]
    pe = _median([project_cpu_s(r, full_steps) for r in eager])
    pw = _median([project_cpu_s(r, full_steps) for r in warm])
    if pe is None or pw is None:
        return None
    cold_extra, disk_extra = compile_cpu_s["cold"], compile_cpu_s["disk"]
    assert cold_extra is not None  # summarize_arm sets it whenever it sets compile_cpu_s
    pc = pw + cold_extra

    def figures(cpu: float) -> dict[str, Any]:
        return {
            "tokens_per_cpu_s": full_steps * tps / cpu,
            "vs_eager": pe / cpu,
            **rates(cpu / full_steps, floor_s, step_flops, peak),
        }

    proj: dict[str, Any] = {
        "steps": full_steps,
        "eager_tokens_per_cpu_s": full_steps * tps / pe,
        "warm_tokens_per_cpu_s": full_steps * tps / pw,
        "cold_tokens_per_cpu_s": full_steps * tps / pc,
        "warm_vs_eager": pe / pw,
        "cold_vs_eager": pe / pc,
        "disk_vs_eager": pe / (pw + disk_extra) if disk_extra is not None else None,
        "eager": rates(pe / full_steps, floor_s, step_flops, peak),
        "amortised": {str(k): figures(amortised_cpu_s(pc, pw, k)) for k in range(1, STUDY_SEEDS + 1)},
    }
    if disk_extra is not None:  # the inductor cache warm on disk when the study starts
        proj["disk_amortised"] = {"k": STUDY_SEEDS, **figures(amortised_cpu_s(pw + disk_extra, pw, STUDY_SEEDS))}
    return proj


def step_ratios(runs: Sequence[dict[str, Any]], base: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """An arm's step against the baseline's on the same path, round by round: ``steady`` (steady steps),
    ``whole`` (CPU seconds per step of the whole runs), ``whole_warm`` (the same, warm in-process runs only: no
    compilation in them)."""
    b = {(r["round"], r["kind"]): r for r in base}
    pairs = [(r, b[(r["round"], r["kind"])]) for r in runs if (r["round"], r["kind"]) in b]
    return {
        "steady": summarize([r["steady_step_s"] / q["steady_step_s"] for r, q in pairs]),
        "whole": summarize([r["cpu_s_per_step"] / q["cpu_s_per_step"] for r, q in pairs]),
        "whole_warm": summarize([r["cpu_s_per_step"] / q["cpu_s_per_step"] for r, q in pairs if r["kind"] == "warm"]),
    }


def _run_line(scheme: str, path: str, r: dict[str, Any]) -> str:
    busy = r.get("other_cores_busy")
    return (
        f"  {scheme:13s} {path:8s} {r['kind']:5s} seed {r['seed']}: {r['steps']} steps, {r['wall_s']:6.1f} s wall, "
        f"{r['cpu_s']:6.1f} s CPU, {r['tokens_per_cpu_s']:6.0f} tok/CPU-s, steady {1e3 * r['steady_step_s']:.2f} "
        f"ms/step (CPU), first step {r['first_step_wall_s']:.2f} s"
        + (f"  (other cores busy {busy:.2f})" if busy is not None else "")
    )


def bench_ladder(settings: BenchSettings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The ladder section of experiments.bench (module docstring), from the settings' ladder_* fields (sizes,
    schemes, paths, fraction, seeds, disk_warm, override: extra overrides of every run), data_cache and
    data_max_bytes."""
    from ..config.compose import initialize

    initialize()
    sizes, schemes, paths = list(settings.ladder_sizes), list(settings.ladder_schemes), list(settings.ladder_paths)
    seeds, fraction = int(settings.ladder_seeds), float(settings.ladder_fraction)
    log(
        f"\n== CPU ladder: {', '.join(sizes)} x {', '.join(schemes)} on {' and '.join(paths)}, {seeds} round(s), "
        f"train.tokens x {fraction:g}, 1 thread"
    )
    with tempfile.TemporaryDirectory(prefix="attnres_ladder_") as tmp:
        out_sizes = [_ladder_size(name, settings, Path(tmp), log) for name in sizes]
    out = {
        "sizes_run": sizes,
        "schemes": schemes,
        "paths": paths,
        "fraction": fraction,
        "seeds": seeds,
        "overrides": list(settings.ladder_override),
        "disk_warm": bool(settings.ladder_disk_warm),
        "warmup_gaps": WARMUP_GAPS,
        "study_seeds": STUDY_SEEDS,
        "threads": 1,
        "sizes": out_sizes,
    }
    out["checks"] = ladder_checks(out)
    return out


def _ladder_size(size_name: str, settings: BenchSettings, tmpdir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Every round of one size (round ``seeds``: the disk-warm round in new processes), then its summary."""
    from attnres import flops_per_token

    from .shapes import conf_size

    schemes, paths = list(settings.ladder_schemes), list(settings.ladder_paths)
    bsize = conf_size(size_name)
    tps = bsize.batch_size * bsize.seq_len
    calls = record_matmuls(bsize.model_config("baseline"), bsize.batch_size, bsize.seq_len)
    flops = {s: flops_per_token(bsize.model_config(_residual(s)), bsize.seq_len).total * tps for s in schemes}
    runs: list[dict[str, Any]] = []
    caches: dict[str, Path] = {}
    rounds: list[dict[str, Any]] = []
    floors: list[dict[str, Any]] = []
    log(f"\n-- {size_name}")
    monitor = CoreMonitor()
    disk = settings.ladder_disk_warm and "compiled" in paths
    for rnd in range(settings.ladder_seeds + (1 if disk else 0)):
        monitor.start()
        floor, peak = time_floor(calls), matmul_peak()
        log(
            f"  round {rnd}{' (new processes, warm disk cache)' if rnd == settings.ladder_seeds else ''}: GEMM floor "
            f"{1e3 * floor['floor_s']:.2f} ms/step ({floor['calls']} matmuls, {floor['gflop_per_s']:.1f} "
            f"GFLOP/s, attention bmm {100 * floor['attention_share']:.0f}%), matmul peak "
            f"{peak['gflop_per_s']:.1f} GFLOP/s"
        )
        k = rnd % len(schemes)
        for scheme in schemes[k:] + schemes[:k]:
            for res in _ladder_arm_runs(size_name, scheme, rnd, settings, tmpdir, caches):
                derive_run(res, floor["floor_s"], flops[scheme], peak["gflop_per_s"])
                runs.append(res)
                log(_run_line(scheme, res["path"], res))
        rounds.append(
            {
                "round": rnd,
                "other_cores_busy": monitor.stop(),
                "floor_s": floor["floor_s"],
                "floor_gflop_per_s": floor["gflop_per_s"],
                "peak_gflop_per_s": peak["gflop_per_s"],
            }
        )
        floors.append(floor)
    full = full_steps(size_name) if settings.ladder_fraction != 1.0 else None
    return _size_summary(bsize.to_dict(), tps, schemes, paths, flops, runs, rounds, floors, full)


def _ladder_arm_runs(
    size_name: str, scheme: str, rnd: int, settings: BenchSettings, tmpdir: Path, caches: dict[str, Path]
) -> Iterator[dict[str, Any]]:
    """The runs of one arm in round ``rnd``: both paths (eager first in even rounds), or in the disk round one
    compiled run in a new process with the arm's warm cache. ``caches``: the arm's inductor cache, made cold in
    its first compiled run (round 0)."""
    paths = list(settings.ladder_paths)
    disk_round = rnd == settings.ladder_seeds
    order = ("compiled",) if disk_round else paths if rnd % 2 == 0 else paths[::-1]
    for path in order:
        tag = f"{size_name}_{scheme}_{path}_r{rnd}"
        timer = tmpdir / f"timer_{tag}.json"
        overrides = ladder_overrides(
            size_name,
            scheme,
            path,
            rnd,
            tmpdir / f"runs_{tag}",
            timer,
            float(settings.ladder_fraction),
            settings.data_cache,
            settings.data_max_bytes,
            settings.ladder_override,
        )
        if disk_round:
            kind = "disk"
            res = child_run({"overrides": overrides, "timer": str(timer), "cache": str(caches[scheme])})
        elif path == "compiled":
            kind = "warm" if scheme in caches else "cold"
            cache = caches.setdefault(scheme, tmpdir / f"inductor_{size_name}_{scheme}")
            with inductor_cache(cache, fresh=kind == "cold"):
                res = train_once(overrides, timer)
        else:
            kind = "eager"
            res = train_once(overrides, timer)
        res.update(scheme=scheme, path=path, kind=kind, round=rnd, seed=rnd)
        yield res


def _size_summary(
    size: dict[str, Any],
    tps: int,
    schemes: Sequence[str],
    paths: Sequence[str],
    flops: dict[str, float],
    runs: list[dict[str, Any]],
    rounds: list[dict[str, Any]],
    floors: list[dict[str, Any]],
    full: int | None,
) -> dict[str, Any]:
    """One size's JSON entry: the floor and peak (medians over rounds), every arm's summary, the step ratios to
    the first arm, the runs."""
    floor_s = statistics.median(r["floor_s"] for r in rounds)
    peak_gf = statistics.median(r["peak_gflop_per_s"] for r in rounds)
    steps = runs[0]["steps"]
    arms = {
        s: {
            "flops_per_step": flops[s],
            **summarize_arm([r for r in runs if r["scheme"] == s], floor_s, flops[s], peak_gf, steps, full),
        }
        for s in schemes
    }
    ratios = {
        s: {
            p: step_ratios(
                [r for r in runs if r["scheme"] == s and r["path"] == p],
                [r for r in runs if r["scheme"] == schemes[0] and r["path"] == p],
            )
            for p in paths
        }
        for s in schemes[1:]
    }
    busy = [r["other_cores_busy"] for r in rounds if r["other_cores_busy"] is not None]
    return {
        "size": size,
        "steps": steps,
        "full_steps": full,
        "tokens_per_step": tps,
        "gemm_floor": {  # the matmul table of round 0; floor_s: the median over rounds
            **floors[0],
            "floor_s": floor_s,
            "gflop_per_s": floors[0]["flops"] / floor_s / 1e9,
        },
        "matmul_peak_gflop_per_s": peak_gf,
        "rounds": rounds,
        "other_cores_busy": summarize(busy) if busy else None,
        "arms": arms,
        "step_ratios": ratios,
        "runs": runs,
    }


def ladder_checks(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 21's targets per size and arm, where measured: compiled / eager tokens per CPU-second >= 2 (amortised
    over the study's seeds per shape, and warm), the compiled step at >= 0.45 of its GEMM floor (whole run,
    amortised), and the compiled arms' steady step <= 1.10x (Block) / 1.20x (Full) of the compiled baseline's."""
    out: list[dict[str, Any]] = []

    def check(name: str, value: float | None, limit: float, above: bool) -> None:
        if value is not None:
            ok = value >= limit if above else value <= limit
            out.append({"name": name, "value": value, "limit": limit, "pass": ok})

    k = str(STUDY_SEEDS)
    for s in res["sizes"]:
        size = s["size"]["name"]
        for scheme, a in s["arms"].items():
            am = (a.get("amortised") or {}).get(k) or {}
            warm = a.get("warm") or {}
            check(
                f"{size} {scheme}: compiled/eager tokens per CPU-s, 1 cold in {k}",
                am.get("vs_eager"),
                SPEED_TARGET,
                True,
            )
            check(f"{size} {scheme}: compiled/eager tokens per CPU-s, warm", warm.get("vs_eager"), SPEED_TARGET, True)
            check(
                f"{size} {scheme}: compiled step / GEMM floor, whole run, 1 cold in {k}",
                am.get("floor_fraction"),
                FLOOR_TARGET,
                True,
            )
            pr = ((a.get("projected") or {}).get("amortised") or {}).get(k) or {}
            check(
                f"{size} {scheme}: compiled/eager tokens per CPU-s, 1 cold in {k}, projected to the full run",
                pr.get("vs_eager"),
                SPEED_TARGET,
                True,
            )
            check(
                f"{size} {scheme}: compiled step / GEMM floor, whole run, 1 cold in {k}, projected to the full run",
                pr.get("floor_fraction"),
                FLOOR_TARGET,
                True,
            )
        for scheme, limit in RATIO_TARGETS.items():
            r = (s["step_ratios"].get(scheme) or {}).get("compiled")
            if r and r["steady"]["median"] is not None:
                check(f"{size} {scheme}: compiled steady step / baseline's", r["steady"]["median"], limit, False)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """``--child SPEC``: one ladder run in this (new) process, its measurements printed as one JSON line;
    ``--markdown BENCH_JSON``: the tables of a bench --ladder run (:func:`markdown`)."""
    cpu_at_start = cpu_seconds()  # torch and Lightning imported already (this module's imports)
    p = argparse.ArgumentParser(prog="python -m experiments.bench.ladder", description=main.__doc__)
    p.add_argument("--child", help="JSON: overrides, timer, cache")
    p.add_argument("--markdown", metavar="BENCH_JSON", help="print a bench --ladder JSON's tables as Markdown")
    a = p.parse_args(argv)
    if a.markdown:
        from .ladder_report import markdown

        print(markdown(json.loads(Path(a.markdown).read_text())["ladder"]))
        return
    if not a.child:
        p.error("one of --child, --markdown")
    spec = json.loads(a.child)
    from ..config.compose import initialize

    initialize()
    with inductor_cache(Path(spec["cache"]), fresh=False):
        res = train_once(spec["overrides"], Path(spec["timer"]))
    res["process_cpu_s"] = cpu_seconds()
    res["process_cpu_imports_s"] = cpu_at_start
    print(json.dumps(res))


if __name__ == "__main__":
    main()
