"""The lr check of a multi-budget study (length.json ``lr_check``): per (arm, rung, budget) the best lr (the vertex
of laws.lr_optimum's parabola in ln lr; ``on_edge``, ``no_curvature`` flagged), whether it moves with the budget
(the best grid point changes or the optima span more than MOVE_FACTOR), and the arm's gain at each arm's best lr
beside the same-seed gain at the shared lr; and what a protocol's lr costs (:func:`protocol_costs`).
docs/analysis.md, "The lr check". Numbers only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from ..io.runs import completed_runs
from ..io.token_budget import tokens_per_param
from .lr_optimum import loss_at, quadratic_vertex
from .paired import comparison_entry, paired_comparison

MOVE_FACTOR = math.sqrt(2.0)


def has_lr_grid(df: pd.DataFrame) -> bool:
    """Whether some arm, rung, budget and seed of the completed runs ran at several lrs."""
    done = completed_runs(df)
    if "lr" not in done.columns or done.empty:
        return False
    keys = done.assign(tpp=tokens_per_param(done))
    return bool((keys.groupby(["variant", "size", "tpp", "seed"])["lr"].nunique() > 1).any())


def shared_lr_of(lrs: list[float]) -> float:
    """The grid's middle lr (its geometric median; the lower middle of an even grid)."""
    grid = sorted(lrs)
    return float(grid[(len(grid) - 1) // 2])


def _same_lr(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6)


def best_lr(curve: pd.Series) -> dict[str, Any]:
    """The best lr of one curve (mean loss indexed by lr): ``best_lr``, ``loss_at_best``, ``on_edge``,
    ``no_curvature`` and the grid point with the lowest loss (``grid_best_lr``)."""
    curve = curve.sort_index()
    x, y = np.log(curve.index.to_numpy(float)), curve.to_numpy(float)
    k = int(np.argmin(y))
    x_opt, y_opt, c, _, _ = quadratic_vertex(x, y)
    on_edge = k in (0, len(y) - 1)
    curved = bool(np.isfinite(c) and c > 0)
    if on_edge or not curved:
        x_opt, y_opt = float(x[k]), float(y[k])
    return {
        "best_lr": math.exp(x_opt),
        "loss_at_best": float(y_opt),
        "grid_best_lr": float(curve.index[k]),
        "on_edge": bool(on_edge),
        "no_curvature": not curved,
        "losses": {f"{lr:.6g}": float(v) for lr, v in curve.items()},
    }


def lr_check(
    df: pd.DataFrame, arm: str = "block_attnres", reference: str = "baseline", shared_lr: float | None = None
) -> dict[str, Any]:
    """length.json ``lr_check``: ``shared_lr``, ``rows`` (per rung and budget: each arm's :func:`best_lr`,
    ``delta_shared`` with its interval, ``delta_best``) and ``moves`` (per arm and rung)."""
    done = completed_runs(df)
    done = done[done["variant"].isin([arm, reference])].assign(tpp=tokens_per_param(done))
    lrs = sorted({float(x) for x in done["lr"]})
    shared = float(shared_lr) if shared_lr is not None else shared_lr_of(lrs)
    if not any(_same_lr(shared, x) for x in lrs):
        raise ValueError(f"shared lr {shared:g} is not on the grid ({', '.join(f'{x:g}' for x in lrs)})")
    at_shared = done[[_same_lr(float(x), shared) for x in done["lr"]]]
    vs = paired_comparison(at_shared, reference, [arm], ("size", "tpp"))
    at = {(r["size"], r["tpp"]): comparison_entry(r) for _, r in vs.iterrows()}
    missing = {"delta": None, "delta_ci95": None, "n_pairs": 0}  # an arm without runs at the shared lr
    rows = []
    for (size, tpp), g in done.groupby(["size", "tpp"], sort=False):
        best = {}
        for v in (reference, arm):
            mine = g[g["variant"] == v]
            if mine["lr"].nunique() < 2:
                break
            best[v] = best_lr(mine.groupby("lr")["val_loss"].mean())
        if len(best) < 2:
            continue
        d = at.get((size, tpp), missing)
        N = float(g["params_non_embedding"].median())
        row = {"size": str(size), "tokens_per_param": float(tpp), "params_non_embedding": N, "arms": best}
        row |= {"delta_shared": d["delta"], "delta_shared_ci95": d["delta_ci95"], "n_pairs": d["n_pairs"]}
        rows.append(row | {"delta_best": best[arm]["loss_at_best"] - best[reference]["loss_at_best"]})
    rows.sort(key=lambda r: (r["params_non_embedding"], r["tokens_per_param"]))
    return {"shared_lr": shared, "lrs": lrs, "move_factor": MOVE_FACTOR, "rows": rows, "moves": _moves(rows)}


def _moves(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for size in dict.fromkeys(r["size"] for r in rows):
        mine = [r for r in rows if r["size"] == size]
        for v in mine[0]["arms"]:
            best = {f"{r['tokens_per_param']:g}": r["arms"][v]["best_lr"] for r in mine}
            grid = {r["arms"][v]["grid_best_lr"] for r in mine}
            span = max(best.values()) / min(best.values())
            row = {"arm": v, "size": size, "best_lr": best, "span": span}
            row["moves"] = bool(len(grid) > 1 or span > MOVE_FACTOR)
            out.append(row | {"any_on_edge": any(r["arms"][v]["on_edge"] for r in mine)})
    return out


def protocol_costs(table: pd.DataFrame, reference: str = "baseline") -> pd.DataFrame:
    """Per row of a multi-budget lr study's optimum table: ``reference_lr`` (the reference's optimum there) and
    ``trunk_lr`` (at the size's smallest budget), each with the arm's excess loss at it over its own optimum
    (``excess_reference``, ``excess_trunk``; nan off the arm's grid)."""
    ref = table[table["variant"] == reference]
    ref_lr = {(r.size, float(r.tokens_per_param)): float(r.lr) for r in ref.itertuples()}
    smallest = ref.groupby("size")["tokens_per_param"].min()
    rows = []
    for r in table.itertuples():
        x = np.log(np.asarray(r.grid, float))
        y = np.array([np.nan if v is None else v for v in r.mean_loss], float)
        at_ref = ref_lr.get((r.size, float(r.tokens_per_param)), math.nan)
        at_trunk = ref_lr.get((r.size, float(smallest.get(r.size, math.nan))), math.nan)
        row = {"variant": r.variant, "size": r.size, "tokens_per_param": float(r.tokens_per_param), "lr": float(r.lr)}
        row |= {"on_edge": bool(r.on_edge), "reference_lr": at_ref, "excess_reference": _excess(x, y, at_ref, r)}
        rows.append(row | {"trunk_lr": at_trunk, "excess_trunk": _excess(x, y, at_trunk, r)})
    return pd.DataFrame(rows)


EXCESS_FLOOR = 1e-12  # nats: below it an excess is the rounding of two equal losses (its sign the BLAS's): 0


def _excess(x: np.ndarray, y: np.ndarray, lr: float, row: Any) -> float:
    """The loss at ``lr`` on the grid curve (x, y) over the row's own optimum (nan unless lr > 0)."""
    if not lr > 0:
        return math.nan
    excess = loss_at(x, y, math.log(lr)) - row.loss_at_optimum
    return 0.0 if abs(excess) < EXCESS_FLOOR else excess  # nan (off the grid) stays nan
