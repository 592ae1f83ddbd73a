"""Chinchilla's approach 2 (isoFLOP profiles) on a multi-budget study, beside approach 3 (analysis.laws.frontier):
per arm each rung's cell-mean loss interpolated in ln C along its budgets (inside its measured C only); at each of
ISO_POINTS compute levels a parabola in ln N through the rungs reaching it (at least MIN_RUNGS) gives N_opt(C) and
L_opt(C) where it opens upwards with its vertex inside them; M(C) from the two L_opt curves, interpolated in ln C
between neighbouring fitted levels. Bands: the paired cluster bootstrap over (rung, seed). docs/analysis.md,
"Approach 2". Numbers only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from . import bootstrap as bs

ISO_POINTS = 49  # compute levels over the measured span
MIN_RUNGS = 3  # a parabola needs three rungs


def cell_table(d: pd.DataFrame) -> pd.DataFrame:
    """One row per (variant, rung, cell) of ``d`` (frontier_runs'): median N, C and ln C, by variant, N, C."""
    g = d.groupby(["variant", "rung", "cell"], sort=False)
    t = g.agg(N=("N", "median"), C=("C", "median")).reset_index()
    t["lnC"] = np.log(t["C"])
    return t.sort_values(["variant", "N", "lnC"], kind="stable").reset_index(drop=True)


def cell_means(d: pd.DataFrame, cells: pd.DataFrame, W: np.ndarray) -> np.ndarray:
    """(R, cells): each cell's weighted mean loss under each row of weights ``W`` (R, runs of ``d``)."""
    key = pd.MultiIndex.from_frame(cells[["variant", "rung", "cell"]])
    idx = key.get_indexer(pd.MultiIndex.from_frame(d[["variant", "rung", "cell"]]))
    onehot = np.zeros((len(d), len(cells)))
    onehot[np.arange(len(d)), idx] = 1.0
    L = d["val_loss"].to_numpy(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (W @ (onehot * L[:, None])) / (W @ onehot)


def rung_at(cells: pd.DataFrame, means: np.ndarray, arm: str, lnC: float) -> tuple[list[float], np.ndarray]:
    """The rungs of ``arm`` that reach ln C: their ln N and (R, rungs) losses interpolated in ln C."""
    xs, ys = [], []
    for _, g in cells[cells["variant"] == arm].groupby("rung", sort=False):
        x = g["lnC"].to_numpy()
        if len(x) < 2 or not x[0] <= lnC <= x[-1]:
            continue
        j = min(int(np.searchsorted(x, lnC, side="right")) - 1, len(x) - 2)
        t = (lnC - x[j]) / (x[j + 1] - x[j])
        cols = g.index.to_numpy()
        ys.append((1 - t) * means[:, cols[j]] + t * means[:, cols[j + 1]])
        xs.append(float(np.log(g["N"].iloc[0])))
    return xs, (np.stack(ys, axis=1) if ys else np.zeros((len(means), 0)))


def parabola_optimum(x: list[float], y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least-squares parabolas in x through each row of ``y`` (R, k): N_opt, L_opt (NaN where not fitted) and a
    code: 0 fitted, or a key of REASONS."""
    xv = np.asarray(x, float)
    x0 = xv.mean()
    X = np.stack([np.ones_like(xv), xv - x0, (xv - x0) ** 2], axis=1)
    coef = y @ np.linalg.pinv(X).T  # (R, 3)
    a, b, c = coef[:, 0], coef[:, 1], coef[:, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        v = -b / (2 * c)
        L = a - b * b / (4 * c)
    code = np.where(c <= 0, 1, np.where(v + x0 > xv.max(), 2, np.where(v + x0 < xv.min(), 3, 0)))
    ok = code == 0
    return np.where(ok, np.exp(v + x0), np.nan), np.where(ok, L, np.nan), code


REASONS = {
    1: "the parabola through the rungs opens downwards (no minimum)",
    2: "N_opt above the largest rung that reaches this C (the profile does not bracket its minimum)",
    3: "N_opt below the smallest rung that reaches this C (the profile does not bracket its minimum)",
}


def _m_between(levels: np.ndarray, L_ref: np.ndarray, target: np.ndarray) -> np.ndarray:
    """ln C' - ln C per level where ``target`` (R, K) lies between two neighbouring fitted levels of ``L_ref``."""
    R, K = target.shape
    out = np.full((R, K), np.nan)
    for j in range(K - 1):
        a, b = L_ref[:, j : j + 1], L_ref[:, j + 1 : j + 2]
        inside = np.isfinite(a) & np.isfinite(b) & ((a - target) * (b - target) <= 0) & (a != b)
        with np.errstate(divide="ignore", invalid="ignore"):
            lnCp = levels[j] + (target - a) / (b - a) * (levels[j + 1] - levels[j])
        out = np.where(inside & np.isnan(out), lnCp - levels[None, :], out)
    return out


def _band(est: float, reps: np.ndarray, plan: bs.ResamplePlan, log: bool) -> list[float | None] | None:
    if not np.isfinite(est):
        return None
    lo, hi = bs.interval(est, reps[np.isfinite(reps)], plan, log=log)
    return [float(lo), float(hi)] if np.isfinite(lo) and np.isfinite(hi) else None


def isoflop_profiles(d: pd.DataFrame, arm: str, reference: str, B: int = 400, seed: int = 0) -> dict[str, Any]:
    """length.json ``frontier.approach2``: per compute level each arm's reaching rungs, N_opt and L_opt with
    intervals (or why not fitted), and M(C) with its interval."""
    cells = cell_table(d)
    strata = d.assign(size=d["rung"])  # a (rung, seed) is the cluster: both arms, every budget
    plan = bs.plan_resampling(strata, B=B, seed=seed, mode="auto", residual_sigma=0.01)
    _, Wb = bs.draw(strata, plan, bs.rng_for(plan, "isoflop"))
    W = np.vstack([np.ones((1, len(d))), Wb])  # row 0: the point estimate
    means = cell_means(d, cells, W)
    levels = np.log(np.geomspace(d["C"].min(), d["C"].max(), ISO_POINTS))
    opt: dict[str, dict[str, np.ndarray]] = {}
    rows: list[dict[str, Any]] = [{"C": float(np.exp(v)), "arms": {}} for v in levels]
    for a in (reference, arm):
        N_opt, L_opt = np.full((len(W), len(levels)), np.nan), np.full((len(W), len(levels)), np.nan)
        for k, lnC in enumerate(levels):
            x, y = rung_at(cells, means, a, float(lnC))
            entry: dict[str, Any] = {"rungs": len(x)}
            if len(x) < MIN_RUNGS:
                entry["note"] = f"{len(x)} rung(s) reach this C: the parabola needs {MIN_RUNGS}"
            else:
                N_opt[:, k], L_opt[:, k], code = parabola_optimum(x, y)
                entry["note"] = REASONS.get(int(code[0]))
                for name, v, log in (("N_opt", N_opt, True), ("L_opt", L_opt, False)):
                    entry |= {name: finite_or_none(v[0, k]), f"{name}_ci95": _band(v[0, k], v[1:, k], plan, log)}
            rows[k]["arms"][a] = entry
        opt[a] = {"N_opt": N_opt, "L_opt": L_opt}
    lnM = _m_between(levels, opt[reference]["L_opt"], opt[arm]["L_opt"])
    for k, row in enumerate(rows):
        m = float(np.exp(lnM[0, k]))
        row |= {"M": finite_or_none(m), "M_ci95": _band(m, np.exp(lnM[1:, k]), plan, True)}
        row["M_undefined_replicates"] = int(np.isnan(lnM[1:, k]).sum()) if np.isfinite(m) else None
    fitted = [r for r in rows if all(r["arms"][a].get("L_opt") is not None for a in (reference, arm))]
    return {
        "method": (
            f"approach 2: per arm, each rung's mean loss interpolated in ln C along its budgets, a parabola in ln N "
            f"through the rungs reaching C (at least {MIN_RUNGS}), its vertex N_opt(C), L_opt(C)"
        ),
        "bootstrap": plan.mode,
        "B": plan.B,
        "levels": rows,
        "fitted_levels": len(fitted),
        "M_levels": sum(r["M"] is not None for r in rows),
    }


def finite_or_none(x: float) -> float | None:
    """float(x), or None where x is None or not finite."""
    return float(x) if x is not None and np.isfinite(x) else None
