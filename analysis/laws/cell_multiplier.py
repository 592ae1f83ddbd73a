"""Per-cell token multipliers of a multi-budget study: at each (rung, budget) cell, m = D* / D, the tokens the
reference needs at that rung's N to reach the arm's loss, read off the rung's own law L_ref(D) = E_r + B_r
D^-beta_r anchored at the cell: ln m = -ln(1 + Delta / s) / beta_r, s = B_r D^-beta_r, Delta the same-seed
difference. Interval: Delta's t distribution with the law's seed-cluster bootstrap, independent (P(ln m <= q) =
mean_j P(Delta >= s_j (e^(-beta_j q) - 1))); m_wall = m / the cell's step-time ratio. docs/analysis.md,
"Per-cell multipliers and the frontier's checks". Numbers only.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from ..io.runs import completed_runs
from ..io.token_budget import tokens_per_param
from .bootstrap import CI_LEVEL
from .paired import t_interval

MIN_BUDGETS = 3  # the rung's law has three parameters
MAX_EXTRAPOLATION = 10.0  # D* beyond 10 D_max (or below D_min / 10) is not measured
BETA_RANGE = (0.01, 3.0)  # the law's exponent; 0.01 is a logarithm in D for every purpose here
B_LAW = 2000  # the law's bootstrap replicates (each a least-squares fit of three parameters: cheap)
_GRID = 121  # ln beta grid before the golden-section polish
_GOLDEN = 60  # golden-section steps between the grid's neighbours of its best point


def _sums(beta: np.ndarray, lnx: np.ndarray, L: np.ndarray, W: np.ndarray):
    """Weighted least squares of L on (1, x), x = exp(-beta lnx), for each replicate row of W (R, n) and each beta
    (R, G): the sum of squares, B (clipped at 0) and E, each (R, G)."""
    x = np.exp(-beta[..., None] * lnx)  # (R, G, n)
    w = W[:, None, :]
    sw, sx, sl = w.sum(-1), (w * x).sum(-1), (w * L).sum(-1)
    vx = (w * x * x).sum(-1) - sx * sx / sw
    cxl = (w * x * L).sum(-1) - sx * sl / sw
    vl = (w * L * L).sum(-1) - sl * sl / sw
    ok = (vx > 1e-300) & (cxl > 0)
    B = np.where(ok, cxl / np.where(ok, vx, 1.0), 0.0)
    sse = vl - np.where(ok, cxl * B, 0.0)
    return sse, B, (sl - B * sx) / sw


def fit_d_laws(D: np.ndarray, L: np.ndarray, W: np.ndarray) -> dict[str, np.ndarray]:
    """L = E + B D^-beta by weighted least squares once per row of ``W`` (R, n), beta in BETA_RANGE (ln beta grid,
    then golden section), B >= 0. Arrays of R: ``E``, ``B``, ``beta``, ``s_scale``, ``D0`` (B D^-beta = s_scale
    (D / D0)^-beta) and ``flat`` (B = 0)."""
    D, L, W = np.asarray(D, float), np.asarray(L, float), np.atleast_2d(np.asarray(W, float))
    D0 = float(np.exp(np.mean(np.log(D))))
    lnx = np.log(D / D0)
    grid = np.linspace(*np.log(BETA_RANGE), _GRID)
    sse, _, _ = _sums(np.broadcast_to(np.exp(grid), (len(W), _GRID)), lnx, L, W)
    i = np.argmin(sse, axis=1)
    a, b = grid[np.maximum(i - 1, 0)], grid[np.minimum(i + 1, _GRID - 1)]
    g = (math.sqrt(5) - 1) / 2
    for _ in range(_GOLDEN):  # golden section on ln beta, every replicate at once
        c, d = b - g * (b - a), a + g * (b - a)
        fc = _sums(np.exp(c)[:, None], lnx, L, W)[0][:, 0]
        fd = _sums(np.exp(d)[:, None], lnx, L, W)[0][:, 0]
        left = fc <= fd
        a, b = np.where(left, a, c), np.where(left, d, b)
    beta = np.exp((a + b) / 2)
    _, Bn, E = (v[:, 0] for v in _sums(beta[:, None], lnx, L, W))
    return {"E": E, "B": Bn * D0**beta, "beta": beta, "s_scale": Bn, "D0": np.full(len(W), D0), "flat": Bn <= 0}


def log_multiplier(delta: Any, s: Any, beta: Any) -> np.ndarray:
    """ln m = -ln(1 + delta / s) / beta (broadcast): +inf where 1 + delta / s <= 0; for s = 0, +inf / 0 / -inf as
    delta is < 0, 0, > 0."""
    delta, s, beta = np.broadcast_arrays(*(np.asarray(v, float) for v in (delta, s, beta)))
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(s > 0, delta / np.where(s > 0, s, 1.0), np.sign(delta) * np.inf)
        out = np.where(u > -1, -np.log1p(np.maximum(u, -1 + 1e-300)) / beta, np.inf)
    return np.where((s <= 0) & (delta == 0), 0.0, np.where((s <= 0) & (delta > 0), -np.inf, out))


def log_multiplier_interval(
    delta: float, se: float, dof: int, s: np.ndarray, beta: np.ndarray, bounds: tuple[float, float]
) -> tuple[list[float], list[bool]]:
    """The 95% interval of ln m, delta ~ delta + se t(dof), over the law's (s_j, beta_j) replicates, clipped to
    ``bounds``, and whether each end lies beyond them."""
    s, beta = np.asarray(s, float), np.asarray(beta, float)
    flat = s <= 0
    beta = np.where(flat, 1.0, beta)

    def share_at_most(q: float) -> float:  # P(ln m <= q) = mean_j P(delta >= s_j (e^(-beta_j q) - 1))
        x = np.where(flat, 0.0, s * np.expm1(-beta * q))
        return float(np.mean(stats.t.sf((x - delta) / se, dof)))

    ends, beyond = [], []
    for level in ((1 - CI_LEVEL) / 2, (1 + CI_LEVEL) / 2):
        a, b = bounds
        if share_at_most(a) >= level or share_at_most(b) <= level:  # the quantile lies below the floor / above the cap
            ends.append(a if share_at_most(a) >= level else b)
            beyond.append(True)
            continue
        for _ in range(60):
            mid = (a + b) / 2
            a, b = (mid, b) if share_at_most(mid) < level else (a, mid)
        ends.append((a + b) / 2)
        beyond.append(False)
    return ends, beyond


def rung_law(ref: pd.DataFrame, B: int = B_LAW, seed: int = 0) -> dict[str, Any]:
    """The reference's law at one rung (its runs ``ref``): ``point``, ``B`` seed-cluster replicates (``boot``),
    ``n_seeds``; or ``error``."""
    budgets = ref["tokens_per_param"].nunique()
    if budgets < MIN_BUDGETS:
        return {"error": f"{budgets} budget(s) at this rung: the law L = E + B D^-beta needs {MIN_BUDGETS}"}
    D, L = ref["tokens"].to_numpy(float), ref["val_loss"].to_numpy(float)
    point = {k: float(v[0]) for k, v in fit_d_laws(D, L, np.ones((1, len(ref)))).items()}
    codes, seeds = pd.factorize(ref["seed"])
    rng = np.random.default_rng([seed, zlib.crc32(("cell:" + str(ref["size"].iloc[0])).encode())])
    picks = rng.integers(0, len(seeds), size=(B, len(seeds)))
    counts = (picks[:, :, None] == np.arange(len(seeds))).sum(1)  # (B, seeds): times each seed was drawn
    boot = fit_d_laws(D, L, counts[:, codes]) if len(seeds) > 1 else None
    return {"point": point, "boot": boot, "n_seeds": len(seeds)}


def _headroom(law: dict[str, Any], D: float) -> float | np.ndarray:
    """s = B D^-beta of a law (point dict or replicate arrays) at tokens D."""
    return law["s_scale"] * np.exp(-law["beta"] * np.log(D / law["D0"]))


def step_time_ratio(cell: pd.DataFrame, arm: str, reference: str) -> dict[str, Any]:
    """The step-time ratio arm / reference at one cell: the geometric mean over seed pairs of ``step_cpu_s`` (else
    ``cpu_time_s / steps``) with its t interval in log; None where untimed."""

    def per_step(rows: pd.DataFrame) -> pd.Series:
        step = pd.to_numeric(rows.get("step_cpu_s"), errors="coerce") if "step_cpu_s" in rows else None
        if step is None or not (step > 0).all():
            if not {"cpu_time_s", "steps"} <= set(rows.columns):
                return pd.Series(dtype=float)
            step = pd.to_numeric(rows["cpu_time_s"], errors="coerce") / pd.to_numeric(rows["steps"], errors="coerce")
        return pd.Series(step.to_numpy(float), index=rows["seed"].to_numpy())

    a, r = (per_step(cell[cell["variant"] == v]) for v in (arm, reference))
    common = sorted(set(a.index) & set(r.index))
    logs = np.log((a.loc[common] / r.loc[common]).to_numpy(float)) if common else np.zeros(0)
    logs = logs[np.isfinite(logs)]
    if not len(logs):
        return {"ratio": None, "ratio_ci95": None}
    lo, hi = t_interval(logs)
    ci = [math.exp(lo), math.exp(hi)] if math.isfinite(lo) else None
    return {"ratio": math.exp(float(logs.mean())), "ratio_ci95": ci}


def _divide(m: float | None, m_ci: list[float] | None, beyond: list[bool], r: dict[str, Any]) -> tuple[Any, Any]:
    """m / r with its interval (combined in log as independent, each end apart; an end beyond m's limits: None)."""
    if m is None or r["ratio"] is None:
        return None, None
    mw = m / r["ratio"]
    if m_ci is None or r["ratio_ci95"] is None:
        return mw, None
    d_r = [math.log(r["ratio"] / r["ratio_ci95"][0]), math.log(r["ratio_ci95"][1] / r["ratio"])]
    ends = []
    for end, out, sign, dr in ((m_ci[0], beyond[0], -1, d_r[1]), (m_ci[1], beyond[1], 1, d_r[0])):
        ends.append(None if out else mw * math.exp(sign * math.hypot(math.log(end / m), dr)))
    return mw, ends


def multiplier_at_cell(
    delta: float, delta_ci: list[float] | None, n_pairs: int, D: float, D_range: tuple[float, float], law: dict
) -> dict[str, Any]:
    """m, its interval and D* / D_max at one cell (tokens ``D``, the rung's ``D_range``) under ``law`` (rung_law's
    form); ``note`` says why m is None."""
    floor, cap = D_range[0] / MAX_EXTRAPOLATION / D, MAX_EXTRAPOLATION * D_range[1] / D
    out: dict[str, Any] = {"m": None, "m_ci95": None, "m_ci95_beyond": [False, False], "note": None}
    out |= {"d_star_over_d_max": None, "m_floor": floor, "m_cap": cap}
    if law["point"]["flat"]:
        out["note"] = "flat: the reference's loss does not fall with D at this rung"
        return out
    ln_m = float(log_multiplier(delta, _headroom(law["point"], D), law["point"]["beta"]))
    out["d_star_over_d_max"] = math.exp(ln_m) * D / D_range[1] if math.isfinite(ln_m) else None
    if not math.log(floor) <= ln_m <= math.log(cap):
        out["note"] = ">10x" if ln_m > 0 else "<0.1x"
    else:
        out["m"] = math.exp(ln_m)
    boot = law.get("boot")
    if delta_ci is not None and n_pairs >= 2 and boot is not None:
        se = (delta_ci[1] - delta_ci[0]) / 2 / float(stats.t.ppf((1 + CI_LEVEL) / 2, n_pairs - 1))
        bounds = (math.log(floor), math.log(cap))
        ends, beyond = log_multiplier_interval(delta, se, n_pairs - 1, _headroom(boot, D), boot["beta"], bounds)
        out["m_ci95"], out["m_ci95_beyond"] = [math.exp(e) for e in ends], beyond
    return out


def cell_multipliers(
    df: pd.DataFrame,
    table: pd.DataFrame,
    arm: str,
    reference: str,
    B: int = B_LAW,
    seed: int = 0,
    approach3: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One entry per row of ``table`` (size, tokens_per_param, delta, delta_ci95, n_pairs) from ``df``'s completed
    runs: the cell, D, ``D_range``, ``law``, m with its interval and limits, the step-time ratio and ``m_wall``, and
    with ``approach3`` (a law in rung_law's form) the same m under it."""
    done = completed_runs(df)
    done = done.assign(tokens_per_param=tokens_per_param(done))
    out = []
    for rung, cells in table.groupby("size", sort=False):
        here = done[done["size"].astype(str) == str(rung)]
        ref = here[here["variant"] == reference]
        law = rung_law(ref, B, seed)
        D_by_budget = ref.groupby("tokens_per_param")["tokens"].median()
        D_range = (float(D_by_budget.min()), float(D_by_budget.max()))
        for r in cells.itertuples():
            D = float(D_by_budget[r.tokens_per_param])
            entry: dict[str, Any] = {"size": str(rung), "tokens_per_param": float(r.tokens_per_param), "D": D}
            entry |= {"D_range": list(D_range), "delta": r.delta, "delta_ci95": r.delta_ci95, "n_pairs": int(r.n_pairs)}
            if "error" in law:
                entry |= {"law": {"error": law["error"]}, "m": None, "m_ci95": None, "m_ci95_beyond": [False, False]}
                entry["note"] = f"no law at this rung ({law['error']})"
            else:
                entry["law"] = {k: law["point"][k] for k in ("E", "B", "beta")} | {"n_seeds": law["n_seeds"]}
                entry |= multiplier_at_cell(r.delta, r.delta_ci95, r.n_pairs, D, D_range, law)
            timing = step_time_ratio(here[here["tokens_per_param"] == r.tokens_per_param], arm, reference)
            m_wall, m_wall_ci = _divide(entry.get("m"), entry.get("m_ci95"), entry.get("m_ci95_beyond"), timing)
            entry |= {"step_time_ratio": timing["ratio"], "step_time_ratio_ci95": timing["ratio_ci95"]}
            entry |= {"m_wall": m_wall, "m_wall_ci95": m_wall_ci}
            if approach3 is not None:
                a3 = multiplier_at_cell(r.delta, r.delta_ci95, r.n_pairs, D, D_range, approach3)
                entry["approach3"] = {k: a3[k] for k in ("m", "m_ci95", "m_ci95_beyond", "note", "d_star_over_d_max")}
            out.append(entry)
    return out
