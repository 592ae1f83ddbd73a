"""Fits over parameters and tokens (fit.json ``nd_fit``): Chinchilla's approach 3, L(N, D) = E + A / N^alpha +
B / D^beta per arm, as replicated by Besiroglu et al. 2024: log-sum-exp parametrisation, Huber on log-loss,
L-BFGS-B from the best points of a grid of starts, E <= the lowest observed loss, a seed bootstrap within each
(size, tokens) cell. N, D are normalised by their geometric means while fitting. D proportional to N is refused.
docs/analysis.md ("--nd").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import minimize
from scipy.special import logsumexp, softmax
from threadpoolctl import threadpool_limits

from . import bootstrap as bs
from .fit import HUBER_DELTA, huber

MIN_RATIO_SPREAD = 0.5  # ln(D/N) must span at least this (a factor 1.65) for the two terms to separate


@dataclass(frozen=True)
class NDOptions:
    """How the (N, D) fit runs: the bootstrap (as laws.bootstrap.plan_resampling), the Huber ``delta``, the N and D
    columns, and the ``n_starts`` grid points polished for the point estimate."""

    B: int = 400
    seed: int = 0
    bootstrap_mode: str = "auto"
    seed_sigma: float | None = None
    delta: float = HUBER_DELTA
    n_column: str = "params_non_embedding"
    d_column: str = "tokens"
    n_starts: int = 8


_GRID_EXP = (0.1, 0.3, 0.6, 1.0)  # alpha, beta starts
_GRID_FRAC = (0.05, 0.4, 0.9)  # E / min L starts
_GRID_AMP = (0.05, 0.3, 1.0)  # each term's share of min L at the geometric-mean N, D


def _objective(theta: np.ndarray, lnN: np.ndarray, lnD: np.ndarray, lnL: np.ndarray, w: np.ndarray, delta: float):
    """Huber(delta) log-loss of theta = (a, alpha, b, beta, e) and its gradient, scaled by 1/delta^2."""
    a, alpha, b, beta, e = theta
    terms = np.stack([a - alpha * lnN, b - beta * lnD, np.full_like(lnN, e)])
    r = lnL - logsumexp(terms, axis=0)
    p = softmax(terms, axis=0)
    g = -w * np.clip(r, -delta, delta) / (delta * delta)  # d f / d lse
    grad = np.array(
        [(g * p[0]).sum(), -(g * p[0] * lnN).sum(), (g * p[1]).sum(), -(g * p[1] * lnD).sum(), (g * p[2]).sum()]
    )
    return float((w * huber(r, delta)).sum() / (delta * delta)), grad


def _grid_objective(lnN, lnD, lnL, w, delta, grid: np.ndarray) -> np.ndarray:
    a, alpha, b, beta, e = (grid[:, i : i + 1] for i in range(5))
    terms = np.stack(np.broadcast_arrays(a - alpha * lnN, b - beta * lnD, e + 0 * lnN))
    return (w * huber(lnL - logsumexp(terms, axis=0), delta)).sum(-1)


def _grid(L_min: float) -> np.ndarray:
    ln = math.log(L_min)
    grid = product(_GRID_EXP, _GRID_EXP, _GRID_AMP, _GRID_AMP, _GRID_FRAC)
    return np.array([(ln + math.log(fa), ea, ln + math.log(fb), eb, ln + math.log(fe)) for ea, eb, fa, fb, fe in grid])


def _solve(lnN, lnD, lnL, w, delta, starts: np.ndarray) -> tuple[np.ndarray, float]:
    e_max = float(np.log(np.exp(lnL[w > 0]).min()))
    bounds = [(None, None), (0.0, 3.0), (None, None), (0.0, 3.0), (None, e_max)]
    best_x, best_f = starts[0], math.inf
    with threadpool_limits(limits=1, user_api="blas"):
        for x0 in starts:
            x0 = x0.copy()
            x0[4] = min(x0[4], e_max)
            res = minimize(
                _objective, x0, args=(lnN, lnD, lnL, w, delta), jac=True, method="L-BFGS-B", bounds=bounds,
                options={"maxiter": 500, "ftol": 1e-14, "gtol": 1e-9},
            )  # fmt: skip
            if np.isfinite(res.fun) and res.fun < best_f:
                best_x, best_f = np.asarray(res.x, float), float(res.fun)
    return best_x, best_f * delta * delta


def fit_theta(
    lnN: np.ndarray, lnD: np.ndarray, lnL: np.ndarray, w: np.ndarray, delta: float, n_starts: int = 8
) -> tuple[np.ndarray, float]:
    """theta = (a, alpha, b, beta, e) of log L = LSE(a - alpha lnN, b - beta lnD, e) (normalised lnN, lnD), polished
    from the ``n_starts`` best grid points, and its objective (unscaled)."""
    grid = _grid(float(np.exp(lnL[w > 0]).min()))
    order = np.argsort(_grid_objective(lnN, lnD, lnL, w, delta, grid))
    return _solve(lnN, lnD, lnL, w, delta, grid[order[:n_starts]])


def refit_theta(
    lnN: np.ndarray, lnD: np.ndarray, lnL: np.ndarray, w: np.ndarray, delta: float, start: np.ndarray
) -> np.ndarray:
    """theta refitted from ``start`` alone (a bootstrap replicate: weights ``w``, losses ``lnL``)."""
    return _solve(lnN, lnD, lnL, w, delta, start[None, :])[0]


def log_loss(theta: np.ndarray, lnN: np.ndarray, lnD: np.ndarray) -> np.ndarray:
    """ln L of theta at normalised ln N, ln D (broadcast)."""
    a, alpha, b, beta, e = theta
    return np.logaddexp(np.logaddexp(a - alpha * np.asarray(lnN, float), b - beta * np.asarray(lnD, float)), e)


def nd_fit(runs: pd.DataFrame, options: NDOptions | None = None) -> dict[str, Any]:
    """fit.json ``nd_fit``: per arm of the completed ``runs`` the law with bootstrap intervals, or its ``error``."""
    o = options if options is not None else NDOptions()
    out: dict[str, Any] = {
        "model": "L = E + A / N^alpha + B / D^beta",
        "N": o.n_column,
        "D": o.d_column,
        "loss": f"Huber (delta = {o.delta:g}) on log-loss, log-sum-exp parametrisation, L-BFGS-B from a grid",
        "E_bound": "E <= the arm's lowest observed loss",
        "arms": {},
    }
    for arm in [str(v) for v in pd.unique(runs["variant"])]:
        out["arms"][arm] = _fit_arm(runs[runs["variant"] == arm].reset_index(drop=True), arm, o)
    return out


def _fit_arm(d: pd.DataFrame, arm: str, o: NDOptions) -> dict[str, Any]:
    missing = [c for c in (o.n_column, o.d_column) if c not in d.columns]
    if missing:
        return {"error": f"no column(s) {', '.join(missing)}"}
    N, D = pd.to_numeric(d[o.n_column], errors="coerce"), pd.to_numeric(d[o.d_column], errors="coerce")
    d = d[(N > 0) & (D > 0)].reset_index(drop=True)
    N, D, L = d[o.n_column].to_numpy(float), d[o.d_column].to_numpy(float), d["val_loss"].to_numpy(float)
    ratio = np.log(D / N)
    if len(d) < 6:
        return {"error": f"{len(d)} runs: the five-parameter fit needs at least 6", "n_runs": len(d)}
    if np.ptp(ratio) < MIN_RATIO_SPREAD:
        return {
            "error": f"every run at {math.exp(ratio.mean()):.3g} tokens per parameter (D proportional to N): A/N^alpha "
            "and B/D^beta cannot be told apart; train several budgets per rung (train.budgets)",
            "n_runs": len(d),
        }
    N0, D0 = float(np.exp(np.log(N).mean())), float(np.exp(np.log(D).mean()))
    lnN, lnD, lnL = np.log(N / N0), np.log(D / D0), np.log(L)
    w = np.ones(len(d))
    theta, obj = fit_theta(lnN, lnD, lnL, w, o.delta, o.n_starts)
    # the bootstrap: seeds resampled within each (size, tokens) cell, or seed noise where a cell holds one run
    cells = d.assign(size=d["size"].astype(str) + "@" + d[o.d_column].astype(str))
    resid = lnL - logsumexp(np.stack([theta[0] - theta[1] * lnN, theta[2] - theta[3] * lnD, theta[4] + 0 * lnN]), 0)
    plan = bs.plan_resampling(
        cells, B=o.B, seed=o.seed, mode=o.bootstrap_mode, sigma=o.seed_sigma,
        residual_sigma=float(np.std(L * resid, ddof=1)),
    )  # fmt: skip
    Ls, Ws = bs.draw(cells, plan, bs.rng_for(plan, "nd:" + arm))
    starts = theta[None, :]
    boot = np.array([_solve(lnN, lnD, np.log(np.maximum(Ls[i], 1e-9)), Ws[i], o.delta, starts)[0] for i in range(o.B)])
    law = law_terms(theta, N0, D0)
    boots = [law_terms(t, N0, D0) for t in boot]
    entry: dict[str, Any] = {
        "n_runs": len(d),
        "tokens_per_param": [float(np.exp(ratio.min())), float(np.exp(ratio.max()))],
    }
    for k in ("E", "A", "alpha", "B", "beta"):
        entry[k] = law[k]
        samples = np.array([b[k] for b in boots])
        entry[f"{k}_ci95"] = bs.interval(law[k], samples, plan, log=k in ("A", "B"))
    entry |= {
        "law": law_text(law),
        "E_at_bound": bool(law["E"] >= L.min() * (1 - 1e-4)),
        "objective": obj,
        "rmse_log": float(np.sqrt(np.mean(resid**2))),
        "bootstrap": plan.mode,
        "n_bootstrap": o.B,  # not "B": that key is the law's coefficient
    }
    return entry


def law_text(law: dict[str, float]) -> str:
    return f"L = {law['E']:.4g} + {law['A']:.4g}/N^{law['alpha']:.4g} + {law['B']:.4g}/D^{law['beta']:.4g}"


E_FLOOR = 1e-9  # nats: an E below it is the lower bound 0, which the log-sum-exp parametrisation only approaches


def law_terms(theta: np.ndarray, N0: float, D0: float) -> dict[str, float]:
    """E, A, alpha, B, beta in the original units of N and D (theta on N / N0, D / D0); E below ``E_FLOOR`` is 0 (where
    it sits is the solver's path: it differs with the BLAS)."""
    a, alpha, b, beta, e = (float(t) for t in theta)
    return {
        "E": math.exp(e) if e >= math.log(E_FLOOR) else 0.0,
        "A": math.exp(a + alpha * math.log(N0)),
        "alpha": alpha,
        "B": math.exp(b + beta * math.log(D0)),
        "beta": beta,
    }
