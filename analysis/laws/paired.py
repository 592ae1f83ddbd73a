"""Seed statistics: Student-t intervals for means over few seeds and same-seed differences of two arms (``arm -
reference``, negative: the arm wins). :func:`paired_comparison` is the one comparison every study reports; the rest
are its parts and the selection of a fixed-shape study's runs."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from ..io.runs import AnalysisWarning, check_one_lr_per_cell, completed_runs
from .bootstrap import CI_LEVEL


def t_interval(values: np.ndarray, level: float = CI_LEVEL) -> tuple[float, float]:
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


def loss_summary(losses: pd.Series, level: float = CI_LEVEL) -> dict[str, Any]:
    """A group of runs' final val losses (indexed by seed): mean, sd (None for one run), t interval, runs, seeds."""
    v = losses.to_numpy(float)
    return {
        "val_loss": float(v.mean()),
        "val_loss_sd": float(v.std(ddof=1)) if len(v) > 1 else None,
        "val_loss_ci95": _interval_or_none(v, level),
        "n_runs": len(v),
        "seeds": sorted(int(s) for s in losses.index),
    }


def paired_delta(arm: pd.Series, reference: pd.Series, level: float = CI_LEVEL) -> dict[str, Any]:
    """``arm - reference`` (Series of val loss by seed) on their common seeds: mean, sd, t interval, seeds."""
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
    """The val loss of ``rows`` (one arm at one shape) by seed; a ValueError naming ``what`` for a repeated seed."""
    dup = rows["seed"].duplicated(keep=False)
    if dup.any():
        seeds = sorted({int(s) for s in rows.loc[dup, "seed"]})
        raise ValueError(f"{what}: several completed runs of seed(s) {seeds}; one run per arm and seed")
    return pd.Series(rows["val_loss"].to_numpy(float), index=rows["seed"].astype(int).to_numpy())


def verdict(interval: list[float] | None, n_pairs: int) -> str:
    """'wins' (the interval below 0), 'loses' (above), 'undecided' (holds 0, or none) or 'missing' (no pair)."""
    if n_pairs == 0:
        return "missing"
    if interval is None or not all(math.isfinite(x) for x in interval):
        return "undecided"
    lo, hi = interval
    return "wins" if hi < 0 else ("loses" if lo > 0 else "undecided")


def same_shape(df: pd.DataFrame, size: str, protocol: str | None, seeds: set[int]) -> pd.DataFrame:
    """The completed runs of ``df`` at ``size``, lr ``protocol`` (when recorded) and a seed in ``seeds``."""
    done = completed_runs(df)
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
    """One arm's runs in ``pool``: the study's own when it trained the arm, else the other studies'."""
    rows = pool[pool["variant"] == variant]
    own = rows[rows["study"] == study]
    return own if not own.empty else rows


def paired_comparison(
    runs: pd.DataFrame,
    reference: str,
    arms: Sequence[str],
    cells: Sequence[str] = (),
    condition: str | None = None,
    *,
    arm_column: str = "variant",
    level: float = CI_LEVEL,
) -> pd.DataFrame:
    """Each arm's same-seed difference from ``reference`` in final val loss, per cell of the ``cells`` columns
    (none: one cell), with its t interval and verdict. One row per cell (ascending) and arm where both ran: the
    cell's keys, ``arm``, ``seeds``, ``n_pairs``, ``ref_loss``, ``arm_loss``, ``delta``, ``delta_sd``,
    ``delta_ci95`` (None under two pairs) and ``verdict``.

    ``condition``: a column with exactly two values (in order of appearance); each row then holds, on the seeds all
    four runs share, ``ref_loss_<c>``, ``delta_<c>``, ``delta_<c>_ci95`` and ``verdict_<c>`` per value, and the
    interaction delta_first - delta_second as ``interaction``, ``interaction_ci95``, ``n_pairs``. A repeated seed,
    or one arm's runs of a cell and condition at different lrs, is a ValueError."""
    levels: list[Any] = [None]
    if condition is not None:
        levels = list(pd.unique(runs[condition]))
        if len(levels) != 2:
            raise ValueError(f"a paired comparison by {condition!r} needs two values of it, got {levels}")
    compared = runs[runs[arm_column].isin([reference, *arms])]
    keys = [*cells, *([condition] if condition is not None else []), arm_column]
    check_one_lr_per_cell(compared, keys, "the paired comparison")
    groups = runs.groupby(list(cells), sort=True) if cells else [((), runs)]
    rows = []
    for key, cell in groups:
        key = key if isinstance(key, tuple) else (key,)
        where = " ".join(f"{c}={k}" for c, k in zip(cells, key))
        parts = {c: cell if condition is None else cell[cell[condition] == c] for c in levels}
        for arm in arms:
            series = {
                (c, name): by_seed(part[part[arm_column] == name], " ".join(f"{c or ''} {name} {where}".split()))
                for c, part in parts.items()
                for name in (arm, reference)
            }
            if any(s.empty for s in series.values()):
                continue
            row = dict(zip(cells, key)) | {"arm": arm}
            if condition is None:
                row |= _pair(series[(None, arm)], series[(None, reference)], level)
            else:
                row |= _interaction(series, levels, arm, reference, level)
            rows.append(row)
    return pd.DataFrame(rows)


def cell_heterogeneity(
    runs: pd.DataFrame,
    reference: str,
    arm: str,
    cells: Sequence[str],
    *,
    arm_column: str = "variant",
) -> dict[str, Any]:
    """Is ``arm - reference`` the same in every cell? The Alexander-Govern test of equal means over the cells'
    same-seed differences: ``statistic``, ``p`` (None under two cells), ``n_cells`` (those with two pairs or more)
    and ``cells_left_out`` (those with one)."""
    differences, left_out = [], []
    for key, cell in runs.groupby(list(cells), sort=True):
        key = key if isinstance(key, tuple) else (key,)
        where = " ".join(f"{c}={k}" for c, k in zip(cells, key))
        a = by_seed(cell[cell[arm_column] == arm], f"{arm} {where}")
        r = by_seed(cell[cell[arm_column] == reference], f"{reference} {where}")
        common = sorted(set(a.index) & set(r.index))
        if not common:
            continue
        if len(common) < 2:
            left_out.append(where)
            continue
        differences.append((a.loc[common] - r.loc[common]).to_numpy(float))
    out: dict[str, Any] = {"statistic": None, "p": None, "n_cells": len(differences), "cells_left_out": left_out}
    if len(differences) >= 2:
        test = stats.alexandergovern(*differences)
        out |= {"statistic": float(test.statistic), "p": float(test.pvalue)}
    return out


def comparison_entry(row: Any) -> dict[str, Any]:
    """One row of :func:`paired_comparison` as a document part (a missing number is None)."""

    def num(x: Any) -> float | None:
        return None if x is None or pd.isna(x) else float(x)

    return {
        "delta": num(row["delta"]),
        "delta_sd": num(row["delta_sd"]),
        "delta_ci95": row["delta_ci95"],
        "n_pairs": int(row["n_pairs"]),
        "pair_seeds": list(row["seeds"]),
        "verdict": row["verdict"],
    }


def _pair(arm: pd.Series, reference: pd.Series, level: float) -> dict[str, Any]:
    d = paired_delta(arm, reference, level)
    seeds = d["pair_seeds"]
    ref_loss, arm_loss = (float(s.loc[seeds].mean()) if seeds else math.nan for s in (reference, arm))
    row = {"seeds": seeds, "n_pairs": d["n_pairs"], "ref_loss": ref_loss, "arm_loss": arm_loss}
    row |= {k: d[k] for k in ("delta", "delta_sd", "delta_ci95")}
    return row | {"verdict": verdict(d["delta_ci95"], d["n_pairs"])}


def _interaction(
    series: dict[tuple[Any, str], pd.Series], levels: list[Any], arm: str, reference: str, level: float
) -> dict[str, Any]:
    seeds = sorted(set.intersection(*(set(s.index) for s in series.values())))
    row: dict[str, Any] = {"seeds": seeds}
    per_seed = {}
    for c in levels:
        arm_loss, ref_loss = series[(c, arm)].loc[seeds], series[(c, reference)].loc[seeds]
        d = paired_delta(arm_loss, ref_loss, level)
        row[f"ref_loss_{c}"] = float(ref_loss.mean())
        row[f"delta_{c}"] = d["delta"]
        row[f"delta_{c}_ci95"] = d["delta_ci95"]
        row[f"verdict_{c}"] = verdict(d["delta_ci95"], d["n_pairs"])
        per_seed[c] = arm_loss - ref_loss
    inter = paired_delta(per_seed[levels[0]], per_seed[levels[1]], level)
    return row | {"interaction": inter["delta"], "interaction_ci95": inter["delta_ci95"], "n_pairs": inter["n_pairs"]}


def rung_interaction(
    conditions: dict[str, pd.DataFrame], arm: str, reference: str, level: float = CI_LEVEL
) -> pd.DataFrame:
    """:func:`paired_comparison` by condition over the rungs (``n_layers``) both of two ``conditions`` ({name: runs},
    first and second) hold: one row per rung. A rung whose ``d_model`` differs between them is a ValueError."""
    if len(conditions) != 2:
        raise ValueError(f"rung_interaction compares two conditions, got {len(conditions)}: {list(conditions)}")
    (first, a), (second, b) = conditions.items()
    rungs = sorted(set(a["n_layers"]) & set(b["n_layers"]))
    for n_layers in rungs:
        dm = a[a["n_layers"] == n_layers]["d_model"].unique()
        dd = b[b["n_layers"] == n_layers]["d_model"].unique()
        if len(dm) != 1 or list(dm) != list(dd):
            raise ValueError(f"rung n_layers={n_layers}: d_model {list(dm)} with {first}, {list(dd)} with {second}")
    runs = pd.concat([df.assign(condition=name) for name, df in conditions.items()], ignore_index=True)
    runs = runs[runs["n_layers"].isin(rungs) & runs["variant"].isin([arm, reference])]
    if runs.empty:
        return pd.DataFrame()
    table = paired_comparison(runs, reference, [arm], ("n_layers", "d_model"), "condition", level=level)
    return table.astype({"n_layers": int, "d_model": int}).drop(columns="arm")
