"""Seed statistics of the fixed-shape studies (the map, block size, ablations): a Student-t interval for a mean
over few seeds, and same-seed pairs of two arms.

Two runs of one seed share their data order and, where the residual scheme zero-initialises what it adds, their
starting weights, so an arm's effect is measured on same-seed differences (``arm - reference``, negative: the arm
wins). With three to six seeds a normal or bootstrap interval is overconfident; the t interval with n - 1 degrees
of freedom is the honest one (its coverage is checked by simulation in tests/test_depth_width_map.py).

The same pairs across two conditions of a ladder's rungs (MoE vs dense MLPs, one training recipe vs another):
:func:`rung_interaction`, the per-rung differences under each and their difference, the interaction.

Plain functions on tidy DataFrames (analysis.io.runs.load_results); no torch.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from ..io.runs import AnalysisWarning

LEVEL = 0.95


def t_interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The Student-t interval for the mean of ``values`` (NaNs when fewer than two)."""
    n = len(values)
    if n < 2:
        return (math.nan, math.nan)
    half = stats.t.ppf(0.5 + level / 2, n - 1) * float(np.std(values, ddof=1)) / math.sqrt(n)
    m = float(np.mean(values))
    return (m - half, m + half)


def _interval_or_none(values: np.ndarray, level: float) -> list[float] | None:
    lo, hi = t_interval(values, level)
    return None if math.isnan(lo) else [lo, hi]


def loss_summary(losses: pd.Series, level: float = LEVEL) -> dict[str, Any]:
    """A group of runs' final val losses (indexed by seed): mean, sd (None for one run), t interval, runs, seeds."""
    v = losses.to_numpy(float)
    return {
        "val_loss": float(v.mean()),
        "val_loss_sd": float(v.std(ddof=1)) if len(v) > 1 else None,
        "val_loss_ci95": _interval_or_none(v, level),
        "n_runs": len(v),
        "seeds": sorted(int(s) for s in losses.index),
    }


def paired_delta(arm: pd.Series, reference: pd.Series, level: float = LEVEL) -> dict[str, Any]:
    """``arm - reference`` on the seeds both hold (each a Series of val loss indexed by seed): the mean difference,
    its sd, t interval and the pairs' seeds. No common seed: delta None and n_pairs 0."""
    common = sorted(set(arm.index) & set(reference.index))
    d = (arm.loc[common] - reference.loc[common]).to_numpy(float)
    return {
        "delta": float(d.mean()) if len(d) else None,
        "delta_sd": float(d.std(ddof=1)) if len(d) > 1 else None,
        "delta_ci95": _interval_or_none(d, level),
        "n_pairs": len(d),
        "pair_seeds": [int(s) for s in common],
    }


def by_seed(rows: pd.DataFrame, what: str) -> pd.Series:
    """The val loss of ``rows`` (one arm at one shape) indexed by seed; several runs of one seed are an error naming
    ``what`` (two studies' copies of one run would otherwise count twice)."""
    dup = rows["seed"].duplicated(keep=False)
    if dup.any():
        seeds = sorted({int(s) for s in rows.loc[dup, "seed"]})
        raise ValueError(f"{what}: several completed runs of seed(s) {seeds}; one run per arm and seed")
    return pd.Series(rows["val_loss"].to_numpy(float), index=rows["seed"].astype(int).to_numpy())


def verdict(interval: list[float] | None, n_pairs: int) -> str:
    """What a difference's 95% interval says about the arm: 'wins' (all of it below 0), 'loses' (all above),
    'undecided' (it holds 0, or one pair gives no interval), 'missing' (no pair)."""
    if n_pairs == 0:
        return "missing"
    if interval is None or not all(math.isfinite(x) for x in interval):
        return "undecided"
    lo, hi = interval
    return "wins" if hi < 0 else ("loses" if lo > 0 else "undecided")


def same_shape(df: pd.DataFrame, size: str, protocol: str | None, seeds: set[int]) -> pd.DataFrame:
    """The completed runs of ``df`` at ``size``, trained under lr ``protocol`` (when the table records one), with a
    seed in ``seeds``: the pool a fixed-shape study's rows and its references are drawn from."""
    done = df[df["status"] == "completed"] if "status" in df.columns else df
    pool = done[(done["size"] == size) & done["seed"].isin(list(seeds))]
    if protocol is not None and "lr_protocol" in pool.columns:
        pool = pool[pool["lr_protocol"].fillna("baseline") == protocol]
    return pool


def study_shape(rows: pd.DataFrame, what: str) -> tuple[str, str | None, set[int]]:
    """The one size (the most common, with a warning naming the others), lr protocol and seed set of a study."""
    sizes = sorted(set(rows["size"]))
    if len(sizes) > 1:
        warnings.warn(f"{what} spans several sizes ({', '.join(sizes)}); using the most common", AnalysisWarning, 3)
    size = str(rows["size"].mode().iloc[0])
    rows = rows[rows["size"] == size]
    protocol = str(rows["lr_protocol"].fillna("baseline").mode().iloc[0]) if "lr_protocol" in rows.columns else None
    return size, protocol, {int(s) for s in rows["seed"]}


def arm_rows(pool: pd.DataFrame, study: str, variant: str) -> pd.DataFrame:
    """One arm's runs at a fixed-shape study's shape: the study's own when it trained the arm, else those of the
    other studies in ``pool`` (the arm was trained there first, and a relaunch of the study skipped it)."""
    rows = pool[pool["variant"] == variant]
    own = rows[rows["study"] == study]
    return own if not own.empty else rows


def rung_interaction(
    conditions: dict[str, pd.DataFrame], arm: str, reference: str, level: float = LEVEL
) -> pd.DataFrame:
    """The arm's same-seed effect per rung under two conditions and its change between them.

    ``conditions``: exactly two {name: completed runs (columns variant, n_layers, d_model, seed, val_loss)}, in
    order (first, second); only ``arm`` and ``reference`` rows are read. One row per rung (``n_layers`` = L_b) both
    hold: ``n_layers``, ``d_model``, ``seeds`` (those all four runs share), then per condition ``ref_loss_<name>``
    (the reference's mean loss), ``delta_<name>`` (arm - reference on those seeds), ``delta_<name>_ci95`` (t
    interval, None under two pairs) and ``verdict_<name>`` (:func:`verdict`), then ``interaction`` (per seed:
    delta_first - delta_second, averaged), ``interaction_ci95`` and ``n_pairs``. A rung whose ``d_model`` differs
    between the conditions is a ValueError: then the condition is not the only change; several runs of one arm and
    seed are one too (:func:`by_seed`)."""
    if len(conditions) != 2:
        raise ValueError(f"rung_interaction compares two conditions, got {len(conditions)}: {list(conditions)}")
    (first, a), (second, b) = conditions.items()
    rows = []
    for n_layers in sorted(set(a["n_layers"]) & set(b["n_layers"])):
        dm = a[a["n_layers"] == n_layers]["d_model"].unique()
        dd = b[b["n_layers"] == n_layers]["d_model"].unique()
        if len(dm) != 1 or list(dm) != list(dd):
            raise ValueError(f"rung n_layers={n_layers}: d_model {list(dm)} with {first}, {list(dd)} with {second}")
        series = {
            (kind, v): by_seed(
                df[(df["variant"] == v) & (df["n_layers"] == n_layers)], f"{kind} {v} n_layers={n_layers}"
            )
            for kind, df in conditions.items()
            for v in (arm, reference)
        }
        seeds = sorted(set.intersection(*(set(s.index) for s in series.values())))
        row: dict[str, Any] = {"n_layers": int(n_layers), "d_model": int(dm[0]), "seeds": seeds}
        per_seed = {}
        for kind in (first, second):
            arm_loss, ref_loss = series[(kind, arm)].loc[seeds], series[(kind, reference)].loc[seeds]
            d = paired_delta(arm_loss, ref_loss, level)
            row[f"ref_loss_{kind}"] = float(ref_loss.mean())
            row[f"delta_{kind}"] = d["delta"]
            row[f"delta_{kind}_ci95"] = d["delta_ci95"]
            row[f"verdict_{kind}"] = verdict(d["delta_ci95"], d["n_pairs"])
            per_seed[kind] = arm_loss - ref_loss
        inter = paired_delta(per_seed[first], per_seed[second], level)
        row["interaction"] = inter["delta"]
        row["interaction_ci95"] = inter["delta_ci95"]
        row["n_pairs"] = inter["n_pairs"]
        rows.append(row)
    return pd.DataFrame(rows)
