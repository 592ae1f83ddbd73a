"""The compute-optimal frontier of a multi-budget study (several rungs, each at several tokens per parameter), per
arm, and the compute multiplier along it.

Per arm, Chinchilla's approach 3 (analysis.laws.nd_fit: L(N, D) = E + A N^-alpha + B D^-beta, Huber on log-loss,
L-BFGS-B from a grid of starts, as Besiroglu et al. 2024). Compute is the records' own (``pflops_days``, what the
compute fits use): per arm C = k(N) N D, with ln k = c0 + c1 ln N fitted to the arm's records by least squares
(k / 6 is the FLOPs per token over 6N: the attention and, for Block AttnRes, the depth mixing), so that the
frontier counts each arm's own cost. Then

    L*(C) = min over N of L(N, C / (k(N) N))          (a dense grid in ln N, N_opt reported),
    M(C)  = C' / C  where  L*_reference(C') = L*_arm(C):

the reference's compute to reach the arm's frontier loss at C, over the arm's; > 1: the arm is worth M x compute
there. Where the arm's frontier loss lies below every loss of the reference's frontier (its E), M is unbounded
(reported as n/a). Over the measured span of C (the records' smallest to largest compute), twice: with N free over
the rungs' range widened e^N_SPAN each way (the law extrapolated in N where N_opt leaves the rungs), and with N kept
inside the measured rungs (``within_rungs``: what the measured model sizes reach; at the top of C on a ladder whose
compute-optimal model is larger than its largest rung, that rung's). The bands: the paired
cluster bootstrap over seeds (analysis.laws.bootstrap; both arms of a (rung, budget, seed) cell drawn together), each
replicate refitted from the point estimate, 95% percentile intervals.

The rollout holds out the largest rung (every budget) and, separately, the largest budget (every rung), fits the
rest and predicts each held-out cell's mean loss per arm: ln L_pred ± sqrt(d_fit² + (1.96 s)²) per end, d_fit the
bootstrap interval's distance, s the rms log residual of the fitted cells' means about the fit (dof: cells - 5), as
analysis.laws.rollout.

Plain functions on tidy DataFrames; no torch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from ..io.token_budget import tokens_per_param
from . import bootstrap as bs
from .fit import HUBER_DELTA
from .nd_fit import fit_theta, log_loss, refit_theta
from .rollout import Z95

N_GRID = 1201  # points of the ln N grid the frontier is minimised on
N_SPAN = 4.0  # the grid spans the measured ln N range widened by this on each side (a factor e^4 = 55)
C_POINTS = 25  # points of the M(C) curve over the measured span of C
COMPUTE = "pflops_days"
MIN_CELLS = 6  # (rung, budget) cells per arm: the five-parameter law needs at least six


def frontier_runs(df: pd.DataFrame, arm: str, reference: str) -> pd.DataFrame:
    """The completed runs of the two arms with ``N`` (params_non_embedding), ``D`` (tokens), ``C`` (pflops_days),
    ``rung`` (the size), ``cell`` (``<rung>@<tokens per param>``, the bootstrap's stratum) and ``size`` = ``cell``."""
    done = df[df["status"] == "completed"] if "status" in df.columns else df
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
    """One arm's fitted law: theta on N / N0, D / D0 (analysis.laws.nd_fit's parametrisation) and its compute model
    ln(C / (N D)) = c0 + c1 ln N."""

    def __init__(self, theta: np.ndarray, N0: float, D0: float, k: tuple[float, float]):
        self.theta, self.N0, self.D0, self.k = theta, N0, D0, k

    def loss(self, N: Any, D: Any) -> np.ndarray:
        return np.exp(
            log_loss(self.theta, np.log(np.asarray(N, float) / self.N0), np.log(np.asarray(D, float) / self.D0))
        )

    def frontier(self, C: np.ndarray, lnN_grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """L*(C) and N_opt(C): the law minimised over the ln N grid at each C (D = C / (k(N) N))."""
        c0, c1 = self.k
        lnC = np.log(np.asarray(C, float))[:, None]
        lnN = lnN_grid[None, :]
        lnD = lnC - c0 - (1.0 + c1) * lnN
        lnL = log_loss(self.theta, lnN - math.log(self.N0), lnD - math.log(self.D0))
        i = np.argmin(lnL, axis=1)
        return np.exp(lnL[np.arange(len(i)), i]), np.exp(lnN_grid[i])


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
    """Each arm's law (point estimate) and its bootstrap replicates, from one paired draw of ``d``'s cells."""
    plan = bs.plan_resampling(d, B=B, seed=seed, mode="auto", residual_sigma=0.01)
    Ls, Ws = bs.draw(d, plan, bs.rng_for(plan, "frontier"))
    N0, D0 = float(np.exp(np.log(d["N"]).mean())), float(np.exp(np.log(d["D"]).mean()))
    point: dict[str, ArmLaw] = {}
    boot: dict[str, list[ArmLaw]] = {}
    with threadpool_limits(limits=1, user_api="blas"):
        for arm in arms:
            rows = (d["variant"] == arm).to_numpy()
            sub = d[rows]
            lnN, lnD, lnL = _normalised(sub, N0, D0)
            k = compute_model(sub)
            theta, _ = fit_theta(lnN, lnD, lnL, np.ones(len(sub)), delta)
            point[arm] = ArmLaw(theta, N0, D0, k)
            boot[arm] = []
            for i in range(plan.B):
                lnLi = np.log(np.maximum(Ls[i, rows], 1e-9))
                boot[arm].append(ArmLaw(refit_theta(lnN, lnD, lnLi, Ws[i, rows], delta, theta), N0, D0, k))
    return point, boot, plan


def multiplier_at(base: ArmLaw, arm: ArmLaw, C: np.ndarray, lnN_grid: np.ndarray) -> np.ndarray:
    """M(C) = C' / C with L*_base(C') = L*_arm(C); NaN where the arm's loss lies outside the reference's frontier
    over C / 1e4 .. C x 1e4."""
    L_arm, _ = arm.frontier(C, lnN_grid)
    Cq = np.geomspace(C.min() / 1e4, C.max() * 1e4, 801)
    L_base, _ = base.frontier(Cq, lnN_grid)
    # L*_base falls with C: interpolate ln C' against -L*
    ok = np.isfinite(L_base)
    x, y = -L_base[ok], np.log(Cq[ok])
    order = np.argsort(x)
    x, y = x[order], y[order]
    lnC_equal = np.interp(-L_arm, x, y, left=np.nan, right=np.nan)
    return np.exp(lnC_equal) / C


def _lnN_grid(d: pd.DataFrame, span: float = N_SPAN) -> np.ndarray:
    """The ln N grid: the measured rungs' range widened by ``span`` on each side (0: the measured range only)."""
    lo, hi = np.log(d["N"].min()), np.log(d["N"].max())
    return np.linspace(lo - span, hi + span, N_GRID)


def _band(point: np.ndarray, boot: np.ndarray, plan: bs.ResamplePlan, log: bool) -> tuple[list, list]:
    lo, hi = [], []
    for j in range(len(point)):
        ok = np.isfinite(point[j])
        c = bs.interval(float(point[j]), boot[:, j], plan, log=log) if ok else [float("nan")] * 2
        lo.append(_num(c[0]))
        hi.append(_num(c[1]))
    return lo, hi


def _num(x: float) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def _curves(
    d: pd.DataFrame,
    C: np.ndarray,
    grid: np.ndarray,
    arms: tuple[str, str],
    point: dict[str, ArmLaw],
    boot: dict[str, list[ArmLaw]],
    plan: bs.ResamplePlan,
) -> dict[str, Any]:
    """L*(C) per arm (``arms``: reference, arm) and M(C) with their bands, minimised over ``grid`` (ln N)."""
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
    half = (hi[top] - lo[top]) / 2 / M[top] if lo[top] and hi[top] and np.isfinite(M[top]) else None
    out["M"] = {
        "M": [_num(m) for m in M],
        "ci95_lo": lo,
        "ci95_hi": hi,
        "undefined_replicates": int((~np.isfinite(Mb)).any(axis=1).sum()),
        "half_width_over_M_at_top": half,
    }
    return out


def frontier_curves(
    d: pd.DataFrame, arm: str, reference: str, point: dict[str, ArmLaw], boot: dict[str, list[ArmLaw]], plan
) -> dict[str, Any]:
    """On the measured span of C: L*(C) per arm and M(C) with their bands and the half-width of M at the top, with
    N free over the measured rungs' range widened by N_SPAN (``arms``, ``M``: the law extrapolated in N where N_opt
    leaves the rungs) and with N kept inside the measured rungs (``within_rungs``: the best the measured model
    sizes reach at C, no extrapolation in N)."""
    C = np.geomspace(d["C"].min(), d["C"].max(), C_POINTS)
    free = _curves(d, C, _lnN_grid(d), (reference, arm), point, boot, plan)
    within = _curves(d, C, _lnN_grid(d, 0.0), (reference, arm), point, boot, plan)
    return {"C": C.tolist(), **free, "within_rungs": within}


def _law_text(law: ArmLaw) -> str:
    a, alpha, b, beta, e = (float(t) for t in law.theta)
    A, B = math.exp(a + alpha * math.log(law.N0)), math.exp(b + beta * math.log(law.D0))
    return f"L = {math.exp(e):.4g} + {A:.4g}/N^{alpha:.4g} + {B:.4g}/D^{beta:.4g}"


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
            rows.append(
                {
                    "arm": a,
                    "cell": str(cell),
                    "n_runs": len(g),
                    "predicted": pred,
                    "prediction_interval95": pi,
                    "measured": measured,
                    "inside": bool(pi[0] <= measured <= pi[1]),
                }
            )
    return rows


def analyse_frontier(
    df: pd.DataFrame,
    arm: str = "block_attnres",
    reference: str = "baseline",
    B: int = 400,
    seed: int = 0,
    delta: float = HUBER_DELTA,
) -> dict[str, Any]:
    """length.json ``frontier``: each arm's approach-3 law, L*(C) per arm, M(C) with its band, and the two
    rollouts (largest rung held out, largest budget held out); or ``error`` saying why there is none."""
    d = frontier_runs(df, arm, reference)
    arms = [reference, arm]
    cells = d.groupby("variant")["cell"].nunique().reindex(arms).fillna(0)
    if cells.min() < MIN_CELLS:
        return {"error": f"{int(cells.min())} (rung, budget) cells for one arm: the (N, D) law needs {MIN_CELLS}"}
    if d["tokens_per_param"].nunique() < 2 or d["rung"].nunique() < 2:
        return {"error": "one rung or one budget only: N and D cannot be told apart"}
    point, boot, plan = fit_arms(d, arms, B, seed, delta)
    doc: dict[str, Any] = {
        "model": "L = E + A / N^alpha + B / D^beta per arm; C = k(N) N D (the records' pflops_days)",
        "loss": f"Huber (delta = {delta:g}) on log-loss, L-BFGS-B from a grid of starts",
        "bootstrap": plan.mode,
        "B": plan.B,
        "n_runs": len(d),
        "rungs": sorted(d["rung"].unique(), key=lambda r: float(d.loc[d["rung"] == r, "N"].iloc[0])),
        "budgets": sorted(float(t) for t in d["tokens_per_param"].unique()),
        "laws": {a: _law_text(point[a]) for a in arms},
        "compute_model": {a: {"c0": point[a].k[0], "c1": point[a].k[1]} for a in arms},
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
        doc["rollout"][name] = {"cells": rollout_cells(d, held.to_numpy(), arms, B, seed, delta)}
    return doc


def _ci(lo: float | None, hi: float | None, spec: str = ".3f") -> str:
    return f"[{lo:{spec}}, {hi:{spec}}]" if lo is not None and hi is not None else "[n/a]"


def _m_cell(M: dict[str, Any], i: int) -> str:
    """A table cell: M(C) at point ``i`` of a curve (``M``: an ``M`` entry of the frontier) with its interval."""
    m = M["M"][i]
    return f"{'n/a' if m is None else f'{m:.3f}x'} {_ci(M['ci95_lo'][i], M['ci95_hi'][i])}"


def frontier_lines(fr: dict[str, Any] | None, arm: str, reference: str) -> list[str]:
    """The headline: M(C) at the bottom, middle and top of the measured C with its band, and each rollout."""
    if not fr:
        return []
    if "error" in fr:
        return [f"compute-optimal frontier: n/a ({fr['error']})"]
    C = fr["C"]

    def points(M: dict[str, Any]) -> str:
        pts = []
        for i in (0, len(C) // 2, len(C) - 1):
            m = M["M"][i]
            pts.append(f"M({C[i]:.3g}) = " + (f"{m:.3f}x {_ci(M['ci95_lo'][i], M['ci95_hi'][i])}" if m else "n/a"))
        half = M["half_width_over_M_at_top"]
        return f"{', '.join(pts)} (95% half-width at the top {'n/a' if half is None else f'{100 * half:.0f}%'})"

    free = (
        f"frontier: {reference}'s compute to reach {arm}'s frontier loss, over {arm}'s (C in PFLOP/s-days), N free "
        f"(extrapolated past the rungs where N_opt leaves them): {points(fr['M'])}"
    )
    lines = [free]
    if fr.get("within_rungs"):
        lines.append(f"frontier with N inside the measured rungs (no extrapolation): {points(fr['within_rungs']['M'])}")
    for name, ro in fr["rollout"].items():
        if "error" in ro:
            lines.append(f"frontier rollout without the {name.replace('_', ' ')}: n/a ({ro['error']})")
            continue
        inside = sum(c["inside"] for c in ro["cells"])
        lines.append(
            f"frontier rollout without the {name.replace('_', ' ')}: {inside} of {len(ro['cells'])} held-out cells "
            "inside their predicted intervals"
        )
    return lines


def frontier_markdown(fr: dict[str, Any] | None, arm: str, reference: str) -> list[str]:
    """length_summary.md's section: the laws, M(C) on the measured span, L*(C) per arm, and the rollouts."""
    if not fr:
        return []
    head = [f"## The compute-optimal frontier: {arm} against {reference}", ""]
    if "error" in fr:
        return [*head, f"n/a: {fr['error']}.", ""]
    lines = [
        *head,
        (
            f"{fr['model']}; {fr['loss']}; {fr['n_runs']} runs, rungs {', '.join(fr['rungs'])}, budgets "
            f"{', '.join(f'{b:g}' for b in fr['budgets'])} tokens per parameter; bands: {fr['bootstrap']} bootstrap "
            f"over seeds, B = {fr['B']}. M(C) = the {reference}'s compute to reach the {arm}'s frontier loss at C, "
            "over C."
        ),
        "",
        *(f"* {a}: {law}" for a, law in fr["laws"].items()),
        "",
        f"| C (PFLOP/s-days) | L* {reference} [95%] | L* {arm} [95%] | N_opt {reference} | N_opt {arm} | M(C) [95%] |",
        "|---|---|---|---|---|---|",
    ]
    ref, mine, M = fr["arms"][reference], fr["arms"][arm], fr["M"]
    for i in range(0, len(fr["C"]), 4):
        lines.append(
            f"| {fr['C'][i]:.3g} | {ref['L_star'][i]:.4f} {_ci(ref['ci95_lo'][i], ref['ci95_hi'][i], '.4f')} "
            f"| {mine['L_star'][i]:.4f} {_ci(mine['ci95_lo'][i], mine['ci95_hi'][i], '.4f')} "
            f"| {ref['N_opt'][i]:.3g} | {mine['N_opt'][i]:.3g} | {_m_cell(M, i)} |"
        )
    outside = [a for a in (reference, arm) if fr["arms"][a]["N_opt_outside_rungs"]]
    if outside:
        lines += ["", (f"N_opt lies outside the measured rungs somewhere on the span for {', '.join(outside)}: "
                  "there the frontier extrapolates the law in N.")]  # fmt: skip
    within = fr.get("within_rungs")
    if within:
        lines += ["", "With N kept inside the measured rungs (the best the measured model sizes reach at C):", ""]
        lines += [f"| C (PFLOP/s-days) | N_opt {reference} | N_opt {arm} | M(C) [95%] |", "|---|---|---|---|"]
        for i in range(0, len(fr["C"]), 4):
            n_ref, n_arm = within["arms"][reference]["N_opt"][i], within["arms"][arm]["N_opt"][i]
            lines.append(f"| {fr['C'][i]:.3g} | {n_ref:.3g} | {n_arm:.3g} | {_m_cell(within['M'], i)} |")
        at_edge = [a for a in (reference, arm) if within["arms"][a]["N_opt_at_largest_rung"]]
        if at_edge:
            lines += ["", (f"N_opt reaches the largest rung on the span for {', '.join(at_edge)}: there the compute-"
                      "optimal model is at least that large, and this frontier is the largest rung's.")]  # fmt: skip
    lines += ["", *(f"* {line}" for line in frontier_lines(fr, arm, reference)), ""]
    for name, ro in fr["rollout"].items():
        if "error" in ro:
            continue
        lines += [
            f"Rollout without the {name.replace('_', ' ')}:",
            "",
            "| arm | cell | predicted [95% prediction interval] | measured | inside |",
            "|---|---|---|---|---|",
        ]
        for c in ro["cells"]:
            lo, hi = c["prediction_interval95"]
            lines.append(
                f"| {c['arm']} | {c['cell']} | {c['predicted']:.4f} [{lo:.4f}, {hi:.4f}] | {c['measured']:.4f} "
                f"| {'yes' if c['inside'] else '**no**'} |"
            )
        lines.append("")
    return lines
