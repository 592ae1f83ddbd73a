"""Seed statistics of the fixed-shape studies (the map, block size, ablations): a Student-t interval for a mean
over few seeds, and same-seed pairs of two arms.

Two runs of one seed share their data order and, where the residual scheme zero-initialises what it adds, their
starting weights, so an arm's effect is measured on same-seed differences (``arm - reference``, negative: the arm
wins). With three to six seeds a normal or bootstrap interval is overconfident; the t interval with n - 1 degrees
of freedom is the honest one (its coverage is checked by simulation in tests/test_depth_width_map.py).

:func:`paired_comparison` is the one comparison every study reports (reference, arms, cell keys, and a condition
for an interaction: the same pairs across MoE vs dense MLPs, or one training recipe vs another); the rest of this
module are its parts (:func:`paired_delta`, :func:`t_interval`, :func:`verdict`) and the selection of a
fixed-shape study's runs.

Plain functions on tidy DataFrames (analysis.io.runs.load_results); no torch.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from ..io.runs import AnalysisWarning, check_one_lr_per_cell

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


def paired_comparison(
    runs: pd.DataFrame,
    reference: str,
    arms: Sequence[str],
    cells: Sequence[str] = (),
    condition: str | None = None,
    *,
    arm_column: str = "variant",
    level: float = LEVEL,
) -> pd.DataFrame:
    """The paired comparison every study reports: each arm's same-seed difference from ``reference`` in final val
    loss (``arm - reference``, negative: the arm wins), per cell, with its t interval and verdict.

    ``runs``: completed runs with columns ``arm_column`` (which arm a run is), ``seed``, ``val_loss`` and the
    ``cells`` columns; a cell is one value of those (the map's ``("n_layers", "d_model")``, a length study's
    ``("size", "tokens_per_param")``; none: the table is one cell). One row per cell (ascending) and arm (in the
    order of ``arms``) where both the arm and the reference ran: the cell's keys, ``arm``, ``seeds`` (the pairs',
    ascending), ``n_pairs``, ``ref_loss`` and ``arm_loss`` (means over those seeds), ``delta``, ``delta_sd``,
    ``delta_ci95`` (None under two pairs) and ``verdict`` (:func:`verdict`; no common seed: ``missing``).

    ``condition``: a column with exactly two values (first and second in order of appearance, e.g. MoE then dense
    MLPs, or one training recipe then another); each row then holds, on the seeds all four runs share, per value
    ``c`` the ``ref_loss_<c>``, ``delta_<c>``, ``delta_<c>_ci95`` and ``verdict_<c>``, and the interaction
    (per seed: delta_first - delta_second, averaged) as ``interaction``, ``interaction_ci95`` and ``n_pairs``.
    Several runs of one arm, cell, condition and seed are a ValueError (:func:`by_seed`), and so are one arm's runs
    of one cell and condition trained at different lrs (analysis.io.runs.check_one_lr_per_cell; a table without an
    ``lr`` column is not checked): pairs are only taken among runs of one lr."""
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
    """Is ``arm - reference`` the same in every cell? Per cell the same-seed differences (:func:`paired_delta`'s
    pairs), and the Alexander-Govern test of equal means (scipy.stats.alexandergovern: one-way, without assuming the
    cells' seed noise equal). Returns ``statistic``, ``p``, ``n_cells`` (the cells with at least two pairs, the only
    ones the test reads) and ``cells_left_out`` (cells with fewer); ``statistic`` and ``p`` are None under two
    cells."""
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
    """One row of :func:`paired_comparison` (a Series or a named tuple) as a document part: ``delta``, ``delta_sd``,
    ``delta_ci95``, ``n_pairs``, ``pair_seeds``, ``verdict``; a missing number is None."""

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
    return {
        "seeds": seeds,
        "n_pairs": d["n_pairs"],
        "ref_loss": float(reference.loc[seeds].mean()) if seeds else math.nan,
        "arm_loss": float(arm.loc[seeds].mean()) if seeds else math.nan,
        "delta": d["delta"],
        "delta_sd": d["delta_sd"],
        "delta_ci95": d["delta_ci95"],
        "verdict": verdict(d["delta_ci95"], d["n_pairs"]),
    }


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
    conditions: dict[str, pd.DataFrame], arm: str, reference: str, level: float = LEVEL
) -> pd.DataFrame:
    """The arm's same-seed effect per rung under two conditions and its change between them: the
    :func:`paired_comparison` by condition over the rungs both hold (``n_layers`` = L_b).

    ``conditions``: exactly two {name: completed runs (columns variant, n_layers, d_model, seed, val_loss)}, in
    order (first, second). One row per rung: ``n_layers``, ``d_model``, ``seeds``, per condition ``ref_loss_<name>``,
    ``delta_<name>``, ``delta_<name>_ci95``, ``verdict_<name>``, then ``interaction``, ``interaction_ci95`` and
    ``n_pairs``. A rung whose ``d_model`` differs between the conditions is a ValueError: then the condition is not
    the only change."""
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
    table = table.astype({"n_layers": int, "d_model": int}).drop(columns="arm")
    return table
