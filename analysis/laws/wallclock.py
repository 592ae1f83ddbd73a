"""The wall-clock multiplier beside a compute multiplier: m_wall = m · s_ref / s_arm, s a run's seconds per FLOP
(geometric mean per rung, then over the rungs both arms ran), with the step-time ratio beside it; the time ratio's
interval from a bootstrap over runs within each (arm, rung), combined with m's in log as independent.
docs/analysis.md, "Wall-clock multiplier".
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..io.runs import completed_runs
from .bootstrap import CI_LEVEL

TIME_COLUMNS = ("cpu_time_s", "flops", "steps")


@dataclass(frozen=True)
class WallclockOptions:
    """How the time ratio is measured: time, arm and rung columns, and the bootstrap's ``B`` and ``seed``."""

    time: str = "auto"  # "auto": steady-state step_cpu_s x steps when every run of both arms has it, else cpu_time_s
    arm_column: str = "variant"
    rung: str = "size"
    B: int = 2000
    seed: int = 0


STEADY = "steady_cpu_s"  # the derived column: step_cpu_s x steps
TIME_SOURCES = {
    STEADY: "step_cpu_s x steps (steady-state CPU time per step; compilation, the first steps and evaluations "
    "excluded)",
    "cpu_time_s": "cpu_time_s (the whole run's CPU time: compilation, evaluations and checkpoints included)",
}


def _time_column(df: pd.DataFrame, reference: str, arm: str, o: WallclockOptions) -> tuple[pd.DataFrame, str, str]:
    """(rows to read, the time column, what it measures). ``auto``: the runs with a steady-state ``step_cpu_s``
    where every (arm, rung) stratum has one, else every run's ``cpu_time_s``; never a mix."""
    if o.time != "auto":
        return df, o.time, TIME_SOURCES.get(o.time, o.time)
    if {"step_cpu_s", "steps", o.arm_column, o.rung} <= set(df.columns):
        d = completed_runs(df[df[o.arm_column].isin([reference, arm])])
        step = pd.to_numeric(d["step_cpu_s"], errors="coerce")
        strata = set(zip(d[o.arm_column], d[o.rung].astype(str)))
        timed = d[step > 0]
        if strata and strata == set(zip(timed[o.arm_column], timed[o.rung].astype(str))):
            timed = timed.assign(**{STEADY: pd.to_numeric(timed["step_cpu_s"]) * pd.to_numeric(timed["steps"])})
            return timed, STEADY, TIME_SOURCES[STEADY]
    return df, "cpu_time_s", TIME_SOURCES["cpu_time_s"]


def time_ratio(
    df: pd.DataFrame, reference: str, arm: str, options: WallclockOptions = WallclockOptions()
) -> dict[str, Any]:
    """The seconds-per-FLOP ratio t = ``s_ref_over_s_arm``, ``step_time_ratio`` (arm ÷ reference) with intervals,
    ``flops_per_step_ratio``, ``per_rung``, ``rungs``, ``n_runs``, ``error`` (why there is no ratio) and ``note``
    (why no interval), from the two arms' completed, timed runs in ``df``."""
    o = options
    df, time_column, source = _time_column(df, reference, arm, o)
    o = WallclockOptions(time_column, o.arm_column, o.rung, o.B, o.seed)
    out: dict[str, Any] = {"time_source": source, "reference": reference, "arm": arm}
    ratios = ("s_ref_over_s_arm", "s_ref_over_s_arm_ci95", "step_time_ratio", "step_time_ratio_ci95")
    out |= dict.fromkeys((*ratios, "flops_per_step_ratio")) | {"per_rung": [], "rungs": []}
    out |= {"n_runs": {"reference": 0, "arm": 0}, "error": None, "note": None}
    missing = [c for c in (o.time, "flops", "steps", o.arm_column, o.rung) if c not in df.columns]
    if missing:
        out["error"] = f"no column(s) {', '.join(missing)} in the records"
        return out
    d = completed_runs(df[df[o.arm_column].isin([reference, arm])])
    t, f, n = (pd.to_numeric(d[c], errors="coerce") for c in (o.time, "flops", "steps"))
    d = d[(t > 0) & (f > 0) & (n > 0)]
    logs = np.log(d[o.time].to_numpy(float) / d["flops"].to_numpy(float))  # ln s per run
    log_step = np.log(d[o.time].to_numpy(float) / d["steps"].to_numpy(float))
    is_arm, rung = (d[o.arm_column] == arm).to_numpy(), d[o.rung].astype(str).to_numpy()
    both = [r for r in pd.unique(rung) if (is_arm & (rung == r)).any() and (~is_arm & (rung == r)).any()]
    flops = d["flops"].to_numpy(float)
    rungs = sorted(both, key=lambda r: (float(np.median(flops[rung == r])), r))  # by compute, as size_order
    if not rungs:
        out["error"] = f"no rung with timed runs ({o.time} > 0) of both {reference!r} and {arm!r}"
        return out
    strata = [(r, a) for r in rungs for a in (False, True)]
    index = {k: np.flatnonzero((rung == k[0]) & (is_arm == k[1])) for k in strata}
    per_rung = [_rung_ratios(r, index[(r, False)], index[(r, True)], logs, log_step) for r in rungs]
    ln_t = float(np.mean([math.log(p["s_ref_over_s_arm"]) for p in per_rung]))
    ln_step = float(np.mean([math.log(p["step_time_ratio"]) for p in per_rung]))
    ln_fps = float(np.mean([math.log(p["flops_per_step_ratio"]) for p in per_rung]))
    out |= {"s_ref_over_s_arm": math.exp(ln_t), "step_time_ratio": math.exp(ln_step), "per_rung": per_rung}
    out |= {"flops_per_step_ratio": math.exp(ln_fps), "rungs": rungs}
    out["n_runs"] = {"reference": int((~is_arm).sum()), "arm": int(is_arm.sum())}
    if min(len(i) for i in index.values()) >= 2:
        boot_t, boot_step = _bootstrap(logs, log_step, rungs, index, o)
        scale = math.sqrt(float(np.mean([len(i) / (len(i) - 1) for i in index.values()])))
        out["s_ref_over_s_arm_ci95"] = _log_interval(ln_t, boot_t, scale)
        out["step_time_ratio_ci95"] = _log_interval(ln_step, boot_step, scale)
    else:
        thin = [f"{k[0]} {arm if k[1] else reference}" for k, i in index.items() if len(i) < 2]
        out["note"] = f"one timed run only at {', '.join(thin)}: no spread to resample, no interval"
    return out


def _rung_ratios(rung: str, ref: np.ndarray, arm: np.ndarray, logs: np.ndarray, log_step: np.ndarray) -> dict[str, Any]:
    """One rung's geometric-mean seconds per FLOP and per step of each arm (row indices ``ref``, ``arm``), ratios."""
    s_ref, s_arm = math.exp(logs[ref].mean()), math.exp(logs[arm].mean())
    st_ref, st_arm = math.exp(log_step[ref].mean()), math.exp(log_step[arm].mean())
    out = {"rung": rung, "n_ref": len(ref), "n_arm": len(arm), "s_ref": s_ref, "s_arm": s_arm}
    out |= {"s_ref_over_s_arm": s_ref / s_arm, "step_time_ref": st_ref, "step_time_arm": st_arm}
    return out | {"step_time_ratio": st_arm / st_ref, "flops_per_step_ratio": (st_arm / s_arm) / (st_ref / s_ref)}


def _bootstrap(
    logs: np.ndarray,
    log_step: np.ndarray,
    rungs: list[str],
    index: dict[tuple[str, bool], np.ndarray],
    o: WallclockOptions,
) -> tuple[np.ndarray, np.ndarray]:
    """Replicates of ln t and ln r_step: each (arm, rung) stratum's runs drawn with replacement."""
    rng = np.random.default_rng([o.seed, zlib.crc32(b"wallclock")])
    mean = {}
    for k, idx in index.items():
        picks = idx[rng.integers(0, len(idx), size=(o.B, len(idx)))]
        mean[k] = (logs[picks].mean(1), log_step[picks].mean(1))
    ln_t = np.mean([mean[(r, False)][0] - mean[(r, True)][0] for r in rungs], axis=0)
    ln_step = np.mean([mean[(r, True)][1] - mean[(r, False)][1] for r in rungs], axis=0)
    return ln_t, ln_step


def _log_interval(point: float, boot: np.ndarray, scale: float, level: float = CI_LEVEL) -> list[float]:
    q = 100 * (1 - level) / 2
    lo, hi = np.percentile(point + scale * (boot - point), [q, 100 - q])
    return [math.exp(lo), math.exp(hi)]


def combine(m: float | None, m_ci95: list[float] | None, timing: dict[str, Any]) -> dict[str, Any]:
    """``m_wall`` = m · t with its interval (``m_ci95`` and :func:`time_ratio`'s combined in log as independent,
    each end apart); None where m or t is missing, the interval None where either is."""
    t, t_ci = timing.get("s_ref_over_s_arm"), timing.get("s_ref_over_s_arm_ci95")
    if m is None or t is None or not (m > 0 and math.isfinite(m)):
        return {"m_wall": None, "m_wall_ci95": None}
    m_wall = m * t
    ok = [m_ci95, t_ci] if m_ci95 is not None and t_ci is not None else []
    if not ok or not all(x is not None and math.isfinite(x) and x > 0 for c in ok for x in c):
        return {"m_wall": m_wall, "m_wall_ci95": None}
    lo = math.hypot(math.log(m / m_ci95[0]), math.log(t / t_ci[0]))
    hi = math.hypot(math.log(m_ci95[1] / m), math.log(t_ci[1] / t))
    return {"m_wall": m_wall, "m_wall_ci95": [m_wall * math.exp(-lo), m_wall * math.exp(hi)]}


def wallclock_multiplier(
    df: pd.DataFrame,
    reference: str,
    arm: str,
    m: float | None,
    m_ci95: list[float] | None,
    options: WallclockOptions = WallclockOptions(),
) -> dict[str, Any]:
    """:func:`time_ratio`'s fields plus ``m``, ``m_ci95`` and :func:`combine`'s ``m_wall``, ``m_wall_ci95``."""
    timing = time_ratio(df, reference, arm, options)
    return {**timing, "m": m, "m_ci95": m_ci95, **combine(m, m_ci95, timing)}


def ladder_wallclock(
    runs: pd.DataFrame, baseline: str, multipliers: dict[str, Any], options: WallclockOptions = WallclockOptions()
) -> dict[str, dict[str, Any]]:
    """fit.json ``wallclock``: :func:`wallclock_multiplier` per variant of ``multipliers`` ({variant: a dict or an
    object with ``m``, ``m_ci95``}) on the ladder's ``runs`` as analysed; empty without CPU times."""
    if "cpu_time_s" not in runs.columns or not (pd.to_numeric(runs["cpu_time_s"], errors="coerce") > 0).any():
        return {}
    out = {}
    for name, mult in multipliers.items():
        get = mult.get if isinstance(mult, dict) else lambda k, _m=mult: getattr(_m, k, None)
        out[name] = wallclock_multiplier(runs, baseline, name, get("m"), get("m_ci95"), options)
    return out


def document_wallclock(doc: Any) -> dict[str, dict[str, Any]]:
    """A fit document's ``wallclock`` section, else :func:`ladder_wallclock` of the runs its ``source`` names (empty
    when they cannot be read or hold no CPU times)."""
    if doc.wallclock is not None:
        return dict(doc.wallclock)
    import warnings
    from pathlib import Path

    from ..io.runs import load_results, scaling_runs, select_completed, split_lr_protocols

    source = Path(str(doc.source))
    if not source.exists() and (source.parent / "records").is_dir():
        source = source.parent  # a study's table is derived from its records (results.ledger)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs, _ = select_completed(load_results(source), doc.compute or "pflops_days")
            ladder = split_lr_protocols(scaling_runs(runs, doc.study), doc.baseline or "baseline")
    except (OSError, TypeError, ValueError):
        return {}
    return ladder_wallclock(ladder, doc.baseline or "baseline", doc.multipliers)
