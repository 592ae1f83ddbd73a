"""The compute-optimal frontier of a multi-budget study per arm (approach 3, analysis.laws.nd_fit, with each arm's
compute C = k(N) N D, ln k linear in ln N), the multiplier M(C) = C' / C with L*_reference(C') = L*_arm(C) along
it (N free over the rungs widened by N_SPAN, and N ``within_rungs``), paired-bootstrap bands (adaptive at the top
of the span), the equal-exponent test, approach 2 (analysis.laws.isoflop) and two rollouts. docs/analysis.md
(issues 44 and 49) has the methods. Numbers only (each arm's law as one string excepted).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from ..io.runs import completed_runs
from ..io.token_budget import tokens_per_param
from . import bootstrap as bs
from .fit import HUBER_DELTA
from .isoflop import finite_or_none, isoflop_profiles
from .nd_fit import fit_theta, law_terms, law_text, log_loss, refit_theta
from .rollout import Z95

N_GRID = 1201  # points of the ln N grid the frontier is minimised on
N_SPAN = 4.0  # the grid spans the measured ln N range widened by this on each side (a factor e^4 = 55)
C_POINTS = 25  # points of the M(C) curve over the measured span of C
COMPUTE = "pflops_days"
MIN_CELLS = 6  # (rung, budget) cells per arm: the five-parameter law needs at least six
FRONTIER_B = 1000  # the bootstrap replicates of M(C) to start from (each refits both arms' five-parameter laws)
FRONTIER_B_MAX = 8000  # ... doubled until the top's half-width is stable (fit_arms_adaptive), at most this
HALF_WIDTH_TOL = 0.02  # the agreement sought between two bootstrap draws of M's half-width at the top (95%)
ROLLOUT_B = 400  # the rollouts' replicates (prediction intervals of cell means: no extreme quantile)


def frontier_runs(df: pd.DataFrame, arm: str, reference: str) -> pd.DataFrame:
    """The two arms' completed runs with ``N``, ``D``, ``C`` (pflops_days), ``rung`` (the size) and ``cell`` =
    ``size`` = ``<rung>@<tokens per param>`` (the bootstrap's stratum)."""
    done = completed_runs(df)
    done = done[done["variant"].isin([arm, reference])]
    tpp = tokens_per_param(done)
    out = pd.DataFrame(
        {
            "variant": done["variant"].astype(str).to_numpy(),
            "rung": done["size"].astype(str).to_numpy(),
            "seed": done["seed"].to_numpy(),
            "N": pd.to_numeric(done["params_non_embedding"], errors="coerce").to_numpy(float),
            "D": pd.to_numeric(done["tokens"], errors="coerce").to_numpy(float),
            "C": pd.to_numeric(done[COMPUTE], errors="coerce").to_numpy(float),
            "tokens_per_param": tpp.to_numpy(float),
            "val_loss": done["val_loss"].to_numpy(float),
        }
    )
    out = out[(out["N"] > 0) & (out["D"] > 0) & (out["C"] > 0) & np.isfinite(out["val_loss"])]
    out["cell"] = [f"{r}@{t:g}" for r, t in zip(out["rung"], out["tokens_per_param"])]
    return out.assign(size=out["cell"]).reset_index(drop=True)


class ArmLaw:
    """One arm's law: theta on N / N0, D / D0 (nd_fit's) and compute model ln(C / (N D)) = c0 + c1 ln N."""

    def __init__(self, theta: np.ndarray, N0: float, D0: float, k: tuple[float, float]):
        self.theta, self.N0, self.D0, self.k = theta, N0, D0, k

    def loss(self, N: Any, D: Any) -> np.ndarray:
        return np.exp(
            log_loss(self.theta, np.log(np.asarray(N, float) / self.N0), np.log(np.asarray(D, float) / self.D0))
        )

    def frontier(self, C: np.ndarray, lnN_grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """L*(C) and N_opt(C): the law minimised over the ln N grid at each C (D = C / (k(N) N))."""
        L, N_opt, _ = self.frontier_slope(np.log(np.asarray(C, float)), lnN_grid)
        return L, N_opt

    def frontier_slope(self, lnC: np.ndarray, lnN_grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """L*, N_opt and dL*/d ln C (the law's dL/d ln D at N_opt: the envelope theorem) at each ln C."""
        c0, c1 = self.k
        lnN = lnN_grid[None, :]
        lnD = np.asarray(lnC, float)[:, None] - c0 - (1.0 + c1) * lnN
        lnL = log_loss(self.theta, lnN - math.log(self.N0), lnD - math.log(self.D0))
        i = np.argmin(lnL, axis=1)
        rows = np.arange(len(i))
        b, beta = self.theta[2], self.theta[3]
        slope = -beta * np.exp(b - beta * (lnD[rows, i] - math.log(self.D0)))
        return np.exp(lnL[rows, i]), np.exp(lnN_grid[i]), slope

    def tokens_per_param(self, C: np.ndarray, N: np.ndarray) -> np.ndarray:
        """D / N at compute C and size N (D = C / (k(N) N))."""
        c0, c1 = self.k
        lnN = np.log(np.asarray(N, float))
        return np.exp(np.log(np.asarray(C, float)) - c0 - (1.0 + c1) * lnN - lnN)

    def d_law(self) -> dict[str, Any]:
        """The law's D-term B D^-beta in analysis.laws.cell_multiplier's form (s_scale (D / D0)^-beta)."""
        return {"s_scale": math.exp(self.theta[2]), "beta": float(self.theta[3]), "D0": self.D0, "flat": False}


def compute_model(d: pd.DataFrame) -> tuple[float, float]:
    """(c0, c1) of ln(C / (N D)) = c0 + c1 ln N by least squares over ``d``'s runs (c1 = 0 with one N)."""
    y = np.log(d["C"] / (d["N"] * d["D"])).to_numpy(float)
    x = np.log(d["N"]).to_numpy(float)
    if np.ptp(x) < 1e-9:
        return float(y.mean()), 0.0
    c1, c0 = np.polyfit(x, y, 1)
    return float(c0), float(c1)


def _normalised(d: pd.DataFrame, N0: float, D0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.log(d["N"].to_numpy(float) / N0),
        np.log(d["D"].to_numpy(float) / D0),
        np.log(d["val_loss"].to_numpy(float)),
    )


def fit_arms(
    d: pd.DataFrame, arms: list[str], B: int, seed: int, delta: float
) -> tuple[dict[str, ArmLaw], dict[str, list[ArmLaw]], bs.ResamplePlan]:
    """Each arm's law and its ``B`` replicates, from one paired draw of ``d``'s cells."""
    plan = bs.plan_resampling(d, B=B, seed=seed, mode="auto", residual_sigma=0.01)
    point = point_laws(d, arms, delta)
    return point, replicate_laws(d, arms, point, plan, "frontier", delta), plan


def point_laws(d: pd.DataFrame, arms: list[str], delta: float) -> dict[str, ArmLaw]:
    """Each arm's approach-3 law fitted to its runs in ``d`` (N and D normalised by the geometric means of ``d``)."""
    N0, D0 = float(np.exp(np.log(d["N"]).mean())), float(np.exp(np.log(d["D"]).mean()))
    point: dict[str, ArmLaw] = {}
    with threadpool_limits(limits=1, user_api="blas"):
        for arm in arms:
            sub = d[(d["variant"] == arm).to_numpy()]
            lnN, lnD, lnL = _normalised(sub, N0, D0)
            point[arm] = ArmLaw(fit_theta(lnN, lnD, lnL, np.ones(len(sub)), delta)[0], N0, D0, compute_model(sub))
    return point


def replicate_laws(
    d: pd.DataFrame, arms: list[str], point: dict[str, ArmLaw], plan: bs.ResamplePlan, key: str, delta: float
) -> dict[str, list[ArmLaw]]:
    """``plan.B`` paired replicates of each arm's law (one draw from the rng of ``key``), started from ``point``."""
    Ls, Ws = bs.draw(d, plan, bs.rng_for(plan, key))
    boot: dict[str, list[ArmLaw]] = {}
    with threadpool_limits(limits=1, user_api="blas"):
        for arm in arms:
            rows = (d["variant"] == arm).to_numpy()
            law = point[arm]
            lnN, lnD, _ = _normalised(d[rows], law.N0, law.D0)
            boot[arm] = [
                ArmLaw(
                    refit_theta(lnN, lnD, np.log(np.maximum(Ls[i, rows], 1e-9)), Ws[i, rows], delta, law.theta),
                    law.N0,
                    law.D0,
                    law.k,
                )
                for i in range(plan.B)
            ]
    return boot


def fit_arms_adaptive(
    d: pd.DataFrame, arms: list[str], B: int, B_max: int, seed: int, delta: float
) -> tuple[dict[str, ArmLaw], dict[str, list[ArmLaw]], bs.ResamplePlan, list[dict[str, Any]]]:
    """:func:`fit_arms` with the replicates doubled from ``B`` until two draws would give M's half-width at the top
    within HALF_WIDTH_TOL (1.96 sqrt(2) se <= HALF_WIDTH_TOL, N free and within the rungs) or ``B_max`` is reached;
    also returns each step's B, half-widths and se."""
    point, boot, plan = fit_arms(d, arms, B, seed, delta)
    reference, arm = arms
    C_top = np.array([d["C"].max()])
    grids = {"free": _lnN_grid(d), "within_rungs": _lnN_grid(d, 0.0)}
    history: list[dict[str, Any]] = []
    while True:
        total = bs.ResamplePlan(**{**plan.to_dict(), "B": len(boot[arm])})
        step: dict[str, Any] = {"B": total.B}
        for name, grid in grids.items():
            M = multiplier_at(point[reference], point[arm], C_top, grid)
            Mb = np.array([multiplier_at(br, ba, C_top, grid) for br, ba in zip(boot[reference], boot[arm])])
            half, se = top_half_width(M, Mb, total)
            step[name] = {"half_width": half, "se": se}
        history.append(step)
        stable = all(
            e["se"] is None or Z95 * math.sqrt(2) * e["se"] <= HALF_WIDTH_TOL for e in (step[n] for n in grids)
        )
        if stable or B_max <= total.B:
            step["stopped"] = "stable" if stable else f"B_max = {B_max} reached"
            return point, boot, total, history
        more = bs.ResamplePlan(**{**plan.to_dict(), "B": min(total.B, B_max - total.B)})
        extra = replicate_laws(d, arms, point, more, f"frontier:{len(history)}", delta)
        boot = {a: boot[a] + extra[a] for a in arms}


def top_half_width(M: np.ndarray, Mb: np.ndarray, plan: bs.ResamplePlan) -> tuple[float | None, float | None]:
    """M's 95% half-width over M at the last C (replicates ``Mb``: (B, C)) and its se = sd(the replicates'
    quarters' half-widths) / 2 (None under 8 replicates or an undefined end)."""
    top = len(M) - 1
    lo, hi = _band(M[top:], Mb[:, top:], plan, log=True)
    half = _half_width(M[top], lo, hi)
    if half is None or len(Mb) < 8:
        return half, None
    quarters = np.array_split(np.arange(len(Mb)), 4)
    parts = [_half_width(M[top], *_band(M[top:], Mb[q, top:], plan, log=True)) for q in quarters]
    if any(p is None for p in parts):
        return half, None
    return half, float(np.std(parts, ddof=1)) / 2


M_REACH = 1e4  # M(C) is sought within C / M_REACH .. C x M_REACH; beyond it, NaN


def multiplier_at(base: ArmLaw, arm: ArmLaw, C: np.ndarray, lnN_grid: np.ndarray) -> np.ndarray:
    """M(C) = C' / C with L*_base(C') = L*_arm(C) (NaN outside C / M_REACH .. C x M_REACH): Newton's method on
    ln C', bisecting where a step leaves the bracket."""
    lnC = np.log(np.asarray(C, float))
    target, _ = arm.frontier(C, lnN_grid)
    lo, hi = lnC - math.log(M_REACH), lnC + math.log(M_REACH)
    L_lo, L_hi = base.frontier(np.exp(lo), lnN_grid)[0], base.frontier(np.exp(hi), lnN_grid)[0]
    ok = (target <= L_lo) & (target >= L_hi)  # L*_base falls with C: the root is bracketed
    x = np.clip(lnC, lo, hi)
    for _ in range(100):
        L, _, slope = base.frontier_slope(x, lnN_grid)
        f = L - target
        done = ~ok | (np.abs(f) <= 1e-13 * np.abs(target)) | (hi - lo < 1e-12)
        if done.all():
            break
        lo, hi = np.where(f > 0, x, lo), np.where(f > 0, hi, x)
        with np.errstate(divide="ignore", invalid="ignore"):
            step = x - f / slope
        inside = np.isfinite(step) & (step >= lo) & (step <= hi)
        x = np.where(done, x, np.where(inside, step, (lo + hi) / 2))
    return np.where(ok, np.exp(x - lnC), np.nan)


def _lnN_grid(d: pd.DataFrame, span: float = N_SPAN) -> np.ndarray:
    """The ln N grid: the measured rungs' range widened by ``span`` on each side (0: the measured range only)."""
    lo, hi = np.log(d["N"].min()), np.log(d["N"].max())
    return np.linspace(lo - span, hi + span, N_GRID)


def _band(point: np.ndarray, boot: np.ndarray, plan: bs.ResamplePlan, log: bool) -> tuple[list, list]:
    lo, hi = [], []
    for j in range(len(point)):
        ok = np.isfinite(point[j])
        c = bs.interval(float(point[j]), boot[:, j], plan, log=log) if ok else [float("nan")] * 2
        lo.append(finite_or_none(c[0]))
        hi.append(finite_or_none(c[1]))
    return lo, hi


def _curves(
    d: pd.DataFrame,
    C: np.ndarray,
    grid: np.ndarray,
    arms: tuple[str, str],
    point: dict[str, ArmLaw],
    boot: dict[str, list[ArmLaw]],
    plan: bs.ResamplePlan,
) -> dict[str, Any]:
    """L*(C) per arm (``arms``: reference, arm), M(C) with their bands over ``grid`` (ln N), and ``reads``."""
    reference, arm = arms
    out: dict[str, Any] = {"arms": {}}
    for a in arms:
        L, N_opt = point[a].frontier(C, grid)
        Lb = np.array([b.frontier(C, grid)[0] for b in boot[a]])
        lo, hi = _band(L, Lb, plan, log=False)
        out["arms"][a] = {
            "L_star": L.tolist(),
            "ci95_lo": lo,
            "ci95_hi": hi,
            "N_opt": N_opt.tolist(),
            "N_opt_outside_rungs": bool((N_opt < d["N"].min() * 0.999).any() or (N_opt > d["N"].max() * 1.001).any()),
            "N_opt_at_largest_rung": bool(np.isclose(N_opt, np.exp(grid[-1]), rtol=1e-3).any()),
        }
    M = multiplier_at(point[reference], point[arm], C, grid)
    Mb = np.array([multiplier_at(br, ba, C, grid) for br, ba in zip(boot[reference], boot[arm])])
    lo, hi = _band(M, Mb, plan, log=True)
    top = len(C) - 1
    out["M"] = {
        "M": [finite_or_none(m) for m in M],
        "ci95_lo": lo,
        "ci95_hi": hi,
        "undefined_replicates": int((~np.isfinite(Mb)).any(axis=1).sum()),
        "half_width_over_M_at_top": _half_width(M[top], lo[top], hi[top]),
        # how much the top's half-width still moves with the draws: its standard error from quarters of them
        "half_width_at_top_se": top_half_width(M, Mb, plan)[1],
    }
    out["reads"] = _reads(d, C, M, grid, point[reference], point[arm])
    return out


def _half_width(m: float, lo: Any, hi: Any) -> float | None:
    """(hi - lo) / 2 / m, or None where an end or m is undefined (``lo``/``hi`` may be one-element lists)."""
    lo, hi = (x[0] if isinstance(x, list) else x for x in (lo, hi))
    return (hi - lo) / 2 / m if lo and hi and np.isfinite(m) else None


def _reads(d: pd.DataFrame, C: np.ndarray, M: np.ndarray, grid: np.ndarray, base: ArmLaw, arm: ArmLaw) -> dict:
    """Where M(C) reads each law (the arm's at C, the reference's at C' = M(C) C): N_opt, D / N against the
    measured range, and N_opt's reach beyond the rungs (a factor >= 1)."""
    _, n_arm = arm.frontier(C, grid)
    Cp = C * np.where(np.isfinite(M), M, np.nan)
    ok = np.isfinite(Cp)
    n_ref = np.full(len(C), np.nan)
    if ok.any():
        n_ref[ok] = base.frontier(Cp[ok], grid)[1]
    tpp_arm, tpp_ref = arm.tokens_per_param(C, n_arm), base.tokens_per_param(Cp, n_ref)
    n_lo, n_hi = d["N"].min(), d["N"].max()
    n_all = np.concatenate([n_arm, n_ref[ok]])
    return {
        "reference_N": [finite_or_none(x) for x in n_ref],
        "reference_tokens_per_param": [finite_or_none(x) for x in tpp_ref],
        "arm_N": n_arm.tolist(),
        "arm_tokens_per_param": tpp_arm.tolist(),
        "largest_tokens_per_param_read": finite_or_none(np.nanmax(np.concatenate([tpp_arm, tpp_ref]))),
        "largest_tokens_per_param_measured": float(d["tokens_per_param"].max()),
        "smallest_tokens_per_param_read": finite_or_none(np.nanmin(np.concatenate([tpp_arm, tpp_ref]))),
        "smallest_tokens_per_param_measured": float(d["tokens_per_param"].min()),
        "N_reach": float(max(n_all.max() / n_hi, n_lo / n_all.min(), 1.0)),
    }


def frontier_curves(
    d: pd.DataFrame, arm: str, reference: str, point: dict[str, ArmLaw], boot: dict[str, list[ArmLaw]], plan
) -> dict[str, Any]:
    """:func:`_curves` on the measured span of C with N free (top level) and ``within_rungs``."""
    C = np.geomspace(d["C"].min(), d["C"].max(), C_POINTS)
    free = _curves(d, C, _lnN_grid(d), (reference, arm), point, boot, plan)
    within = _curves(d, C, _lnN_grid(d, 0.0), (reference, arm), point, boot, plan)
    return {"C": C.tolist(), **free, "within_rungs": within}


def rollout_cells(
    d: pd.DataFrame, held: np.ndarray, arms: list[str], B: int, seed: int, delta: float
) -> list[dict[str, Any]]:
    """Fit without the ``held`` rows, predict each held-out cell's mean loss per arm with its interval."""
    kept = d[~held].reset_index(drop=True)
    point, boot, plan = fit_arms(kept, arms, B, seed, delta)
    rows = []
    for a in arms:
        law = point[a]
        mine = kept[kept["variant"] == a]
        means = mine.groupby("cell").agg(N=("N", "first"), D=("D", "median"), L=("val_loss", "mean"))
        resid = np.log(means["L"].to_numpy()) - np.log(law.loss(means["N"], means["D"]))
        s = math.sqrt(float((resid**2).sum()) / max(len(resid) - 5, 1))
        test = d[held & (d["variant"] == a).to_numpy()]
        for cell, g in test.groupby("cell", sort=False):
            N, D = float(g["N"].iloc[0]), float(g["D"].median())
            pred = float(law.loss(N, D))
            reps = np.array([float(b.loss(N, D)) for b in boot[a]])
            lo, hi = bs.interval(pred, reps, plan, log=True)
            d_lo, d_hi = math.log(pred / lo), math.log(hi / pred)
            pi = [pred * math.exp(-math.hypot(d_lo, Z95 * s)), pred * math.exp(math.hypot(d_hi, Z95 * s))]
            measured = float(g["val_loss"].mean())
            row = {"arm": a, "cell": str(cell), "n_runs": len(g), "predicted": pred, "prediction_interval95": pi}
            rows.append(row | {"measured": measured, "inside": bool(pi[0] <= measured <= pi[1])})
    return rows


def exponent_test(point: dict[str, ArmLaw], boot: dict[str, list[ArmLaw]], plan, arms: tuple[str, str]) -> dict:
    """Per exponent (alpha, beta): arm - reference with its paired-bootstrap 95% interval, ``differ`` where that
    excludes 0 (then M(C) changes with C)."""
    reference, arm = arms
    out: dict[str, Any] = {}
    for name, i in (("alpha", 1), ("beta", 3)):
        diff = float(point[arm].theta[i] - point[reference].theta[i])
        reps = np.array([ba.theta[i] - br.theta[i] for br, ba in zip(boot[reference], boot[arm])])
        lo, hi = bs.interval(diff, reps, plan)
        out[name] = {"reference": float(point[reference].theta[i]), "arm": float(point[arm].theta[i])}
        out[name] |= {"difference": diff, "ci95": [lo, hi], "differ": bool(lo > 0 or hi < 0)}
    out["differ"] = any(out[k]["differ"] for k in ("alpha", "beta"))
    return out


def crossings(C: list[float], M: list[float | None]) -> list[float]:
    """The C where M(C) crosses 1 (interpolated in ln C between neighbouring defined points)."""
    out = []
    for i in range(len(C) - 1):
        a, b = M[i], M[i + 1]
        if a is None or b is None or (a - 1) * (b - 1) > 0 or a == b:
            continue
        t = math.log(a) / (math.log(a) - math.log(b))
        out.append(math.exp(math.log(C[i]) + t * (math.log(C[i + 1]) - math.log(C[i]))))
    return out


def frontier_with_laws(
    df: pd.DataFrame,
    arm: str = "block_attnres",
    reference: str = "baseline",
    B: int = FRONTIER_B,
    seed: int = 0,
    delta: float = HUBER_DELTA,
    B_max: int | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(length.json ``frontier``, or its ``error``; the reference's approach-3 D-term in cell_multiplier's form
    ``{"point", "boot"}``, None without a frontier). ``B`` replicates, doubled up to ``B_max`` when given
    (:func:`fit_arms_adaptive`); the rollouts use min(B, ROLLOUT_B)."""
    d = frontier_runs(df, arm, reference)
    arms = [reference, arm]
    cells = d.groupby("variant")["cell"].nunique().reindex(arms).fillna(0)
    if cells.min() < MIN_CELLS:
        return {"error": f"{int(cells.min())} (rung, budget) cells for one arm: the (N, D) law needs {MIN_CELLS}"}, None
    if d["tokens_per_param"].nunique() < 2 or d["rung"].nunique() < 2:
        return {"error": "one rung or one budget only: N and D cannot be told apart"}, None
    history = None
    if B_max is not None and B_max > B:
        point, boot, plan, history = fit_arms_adaptive(d, arms, B, B_max, seed, delta)
    else:
        point, boot, plan = fit_arms(d, arms, B, seed, delta)
    doc: dict[str, Any] = {
        "model": "L = E + A / N^alpha + B / D^beta per arm; C = k(N) N D (the records' pflops_days)",
        "loss": f"Huber (delta = {delta:g}) on log-loss, L-BFGS-B from a grid of starts",
        "bootstrap": plan.mode,
        "B": plan.B,
        "seed": seed,
        "adaptive": history,
        "n_runs": len(d),
        "rungs": sorted(d["rung"].unique(), key=lambda r: float(d.loc[d["rung"] == r, "N"].iloc[0])),
        "budgets": sorted(float(t) for t in d["tokens_per_param"].unique()),
        "laws": {a: law_text(law_terms(point[a].theta, point[a].N0, point[a].D0)) for a in arms},
        "compute_model": {a: {"c0": point[a].k[0], "c1": point[a].k[1]} for a in arms},
        "exponents": exponent_test(point, boot, plan, (reference, arm)),
    }
    doc |= frontier_curves(d, arm, reference, point, boot, plan)
    doc["rollout"] = {}
    largest_rung = d["rung"] == d.loc[d["N"].idxmax(), "rung"]  # by name: the arms' N differ at one rung
    largest_budget = d["tokens_per_param"] == d["tokens_per_param"].max()
    for name, held in (("largest_rung", largest_rung), ("largest_budget", largest_budget)):
        kept = d[~held.to_numpy()]
        few = kept.groupby("variant")["cell"].nunique().reindex(arms).fillna(0).min() < MIN_CELLS
        if few or kept["rung"].nunique() < 2 or kept["tokens_per_param"].nunique() < 2:
            doc["rollout"][name] = {"error": "too few rungs, budgets or cells left to fit the (N, D) law"}
            continue
        doc["rollout"][name] = {"cells": rollout_cells(d, held.to_numpy(), arms, min(B, ROLLOUT_B), seed, delta)}
    doc["approach2"] = isoflop_profiles(d, arm, reference, B=plan.B, seed=seed)
    laws = [point[reference].d_law(), *(b.d_law() for b in boot[reference])]
    d_law = {"point": laws[0], "boot": {k: np.array([x[k] for x in laws[1:]]) for k in laws[0]}}
    return doc, d_law
