"""The architecture grid (study kind ``arch_grid``, paper Fig. 7): final val loss per variant over the (H/L_b rows,
d/L_b columns) grid at fixed compute: fit.json's ``arch_grid``. Numbers only."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd

from ..io.runs import AnalysisWarning, runs_of_kind

_SHAPE_COLUMNS = ("size", "n_layers", "d_model", "n_heads", "d_ff", "params_non_embedding")
# The record columns read as numbers here (a table read from CSV holds strings until then).
_NUMERIC = ("d_over_lb", "heads_over_lb", "flops_budget", *_SHAPE_COLUMNS[1:], "tokens", "flops")


def arch_grid_table(
    df_all: pd.DataFrame, baseline: str = "baseline", study: str | None = None
) -> dict[str, Any] | None:
    """Fig. 7 data of the study of kind ``arch_grid`` (or named ``study``): seed-mean losses per variant on the
    runs' nominal (``heads_over_lb`` rows, largest first; ``d_over_lb`` columns) grid, the shapes rounded to under
    ``cells``; the most common compute budget only (with a warning)."""
    if "study" not in df_all.columns:
        return None
    rows = df_all[df_all["study"] == study] if study is not None else runs_of_kind(df_all, "arch_grid")
    if rows.empty:
        return None
    study = str(rows["study"].iloc[0])
    picked = _grid_runs(rows, study)
    if picked is None:
        return None
    rows, budgets = picked
    xs = sorted({float(x) for x in rows["d_over_lb"]})
    ys = sorted({float(y) for y in rows["heads_over_lb"]}, reverse=True)
    variants = list(pd.unique(rows["variant"]))
    if baseline in variants:
        variants.remove(baseline)
        variants.insert(0, baseline)
    loss, sd, n_runs, best = _variant_grids(rows, variants, xs, ys)
    delta = None
    if baseline in loss:
        b = np.array(loss[baseline], dtype=float)
        delta = {v: _nested(np.array(loss[v], dtype=float) - b) for v in variants if v != baseline}
    return {
        "study": study,
        "baseline": baseline if baseline in loss else None,
        "flops_budget": float(rows["flops_budget"].iloc[0]) if budgets else None,
        "d_over_lb": xs,
        "heads_over_lb": ys,
        "variants": variants,
        "val_loss": loss,
        "val_loss_sd": sd,
        "n_runs": n_runs,
        "delta_vs_baseline": delta,
        "best": best,
        "cells": _cells(rows, baseline),
    }


def _grid_runs(rows: pd.DataFrame, study: str) -> tuple[pd.DataFrame, list[float]] | None:
    """The study's runs on the grid at its most common budget (numeric columns) and the budgets; None if none."""
    missing = [c for c in ("d_over_lb", "heads_over_lb") if c not in rows.columns]
    if missing:
        warnings.warn(
            f"{study} runs lack column(s) {', '.join(missing)} (a table without the grid coordinates); "
            "no architecture-grid table",
            AnalysisWarning,
            stacklevel=3,
        )
        return None
    rows = rows.copy()
    for col in _NUMERIC:
        if col in rows.columns:
            rows[col] = pd.to_numeric(rows[col], errors="coerce")
    off_grid = rows[rows["d_over_lb"].isna() | rows["heads_over_lb"].isna()]
    if not off_grid.empty:
        warnings.warn(
            f"{len(off_grid)} {study} run(s) have no grid coordinates (a size not derived from d/L_b, H/L_b) "
            f"and are left out: {', '.join(off_grid['run_id'].astype(str))}",
            AnalysisWarning,
            stacklevel=3,
        )
        rows = rows.drop(off_grid.index)
    if rows.empty:
        return None
    budgets = sorted(set(rows["flops_budget"].dropna())) if "flops_budget" in rows.columns else []
    if len(budgets) > 1:
        keep = rows["flops_budget"].mode().iloc[0]
        warnings.warn(
            f"{study} holds runs at several compute budgets ({', '.join(f'{b:.3g}' for b in budgets)}); "
            f"using the most common, {keep:.3g} FLOPs",
            AnalysisWarning,
            stacklevel=3,
        )
        rows = rows[rows["flops_budget"] == keep]
    return rows, budgets


def _nested(grid: np.ndarray) -> list[list[float | None]]:
    return [[None if np.isnan(c) else float(c) for c in r] for r in grid]


def _variant_grids(
    rows: pd.DataFrame, variants: list[str], xs: list[float], ys: list[float]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Per variant: mean loss, seed sd and run count per cell (rows: ys, columns: xs), and its best cell."""
    loss: dict[str, list[list[float | None]]] = {}
    sd: dict[str, list[list[float | None]]] = {}
    n_runs: dict[str, list[list[int]]] = {}
    best: dict[str, Any] = {}
    for v in variants:
        d = rows[rows["variant"] == v]
        grid, sgrid = np.full((len(ys), len(xs)), np.nan), np.full((len(ys), len(xs)), np.nan)
        ngrid = np.zeros((len(ys), len(xs)), int)
        for (x, y), g in d.groupby(["d_over_lb", "heads_over_lb"]):
            i, j = ys.index(float(y)), xs.index(float(x))
            grid[i, j] = g["val_loss"].mean()
            sgrid[i, j] = g["val_loss"].std(ddof=1) if len(g) > 1 else np.nan
            ngrid[i, j] = len(g)
        loss[v], sd[v] = _nested(grid), _nested(sgrid)
        n_runs[v] = ngrid.tolist()
        if np.isfinite(grid).any():
            i, j = np.unravel_index(np.nanargmin(grid), grid.shape)
            best[v] = {"val_loss": float(grid[i, j]), "d_over_lb": xs[j], "heads_over_lb": ys[i]}
    return loss, sd, n_runs, best


def _cells(rows: pd.DataFrame, baseline: str) -> list[dict[str, Any]]:
    """Per grid cell: the shape it was rounded to (the baseline's run, else the first) and each variant's tokens."""
    shape_cols = [c for c in _SHAPE_COLUMNS if c in rows.columns]
    cells = []
    for (x, y), g in rows.groupby(["d_over_lb", "heads_over_lb"], sort=True):
        first = g[g["variant"] == baseline].iloc[0] if (g["variant"] == baseline).any() else g.iloc[0]
        cell = {"d_over_lb": float(x), "heads_over_lb": float(y)}
        for c in shape_cols:
            cell[c] = first[c] if c == "size" else (None if pd.isna(first[c]) else int(first[c]))
        if cell.get("n_layers"):
            cell["achieved_d_over_lb"] = cell["d_model"] / cell["n_layers"] if cell.get("d_model") else None
            cell["achieved_heads_over_lb"] = cell["n_heads"] / cell["n_layers"] if cell.get("n_heads") else None
        cell["tokens"] = {str(v): float(t["tokens"].mean()) for v, t in g.groupby("variant")} if "tokens" in g else None
        cells.append(cell)
    return cells
