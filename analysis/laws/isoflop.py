"""Chinchilla's approach 2 (isoFLOP profiles) on a multi-budget study, beside approach 3 (analysis.laws.frontier).

Per arm, each (rung, budget) cell's mean loss over its seeds is one point at the cell's compute C (the median of its
runs' ``pflops_days``). Along a rung's budgets L is interpolated linearly in ln C (at one N, ln C = ln D + a
constant), only inside the rung's measured C: a rung "reaches" a compute level when its smallest and largest budgets
bracket it. At each of ISO_POINTS compute levels on the measured span (the frontier's span), the rungs that reach it
give points (ln N, L); with at least MIN_RUNGS of them, the parabola L = a + b x + c x^2 in x = ln N (least squares;
through three points exactly) gives

    N_opt(C) = exp(-b / 2c),   L_opt(C) = a - b^2 / 4c,

where it opens upwards (c > 0) and its vertex lies inside the reaching rungs' N range; elsewhere the level is not
fitted and says why (fewer than MIN_RUNGS rungs reach it; the parabola opens downwards; N_opt beyond the rungs, where
the profile does not bracket its minimum). Then M(C) = C'/C with L_opt_ref(C') = L_opt_arm(C), C' interpolated in
ln C between two neighbouring fitted levels of the reference (no interpolation across a level that is not fitted, no
extrapolation): NaN where the arm's L_opt lies outside the reference's fitted stretch.

Bands: the paired cluster bootstrap over seeds per rung (analysis.laws.bootstrap with the rung as the stratum: both
arms and every budget of a (rung, seed) drawn together, since a seed's budgets share one trunk), every replicate
re-averaged, re-interpolated and refitted; 95% percentile intervals (scaled as the cluster intervals are), over the
replicates where the quantity is defined (``undefined`` counts the others).

Numbers only: the headline line and the length report's table are analysis.render.frontier_text's.

Plain functions on tidy DataFrames (analysis.laws.frontier.frontier_runs); no torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from . import bootstrap as bs

ISO_POINTS = 49  # compute levels over the measured span
MIN_RUNGS = 3  # a parabola needs three rungs


def cell_table(d: pd.DataFrame) -> pd.DataFrame:
    """One row per (variant, rung, cell) of ``d`` (frontier_runs' columns): N, ln C (median over its runs), in order
    of variant, N, C."""
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
    code per row: 0 fitted, 1 opens downwards, 2 vertex above the x range, 3 below it."""
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
    """ln C' - ln C per level where ``target`` (R, K: the arm's L_opt) lies between two neighbouring fitted levels of
    the reference's L_opt (R, K), linearly interpolated in ln C; NaN elsewhere."""
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
    """length.json ``frontier.approach2``: per compute level (ISO_POINTS over ``d``'s span of C) each arm's
    reaching rungs, N_opt and L_opt with intervals (or the reason they are not fitted), and M(C) with its interval;
    ``fitted_levels`` counts the levels where both arms' profiles are fitted."""
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
                entry |= {"N_opt": _num(N_opt[0, k]), "N_opt_ci95": _band(N_opt[0, k], N_opt[1:, k], plan, True)}
                entry |= {"L_opt": _num(L_opt[0, k]), "L_opt_ci95": _band(L_opt[0, k], L_opt[1:, k], plan, False)}
            rows[k]["arms"][a] = entry
        opt[a] = {"N_opt": N_opt, "L_opt": L_opt}
    lnM = _m_between(levels, opt[reference]["L_opt"], opt[arm]["L_opt"])
    for k, row in enumerate(rows):
        m = float(np.exp(lnM[0, k]))
        row |= {"M": _num(m), "M_ci95": _band(m, np.exp(lnM[1:, k]), plan, True)}
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


def _num(x: float) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None
