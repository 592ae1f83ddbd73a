"""Reference scaling-law fits written plainly with ``scipy.optimize.least_squares``: the definitions the fast fits
of :mod:`analysis.laws.fit` are tested against (same models, residuals, Huber loss, bounds and C_ref;
docs/analysis.md, "The reference fit and the fast path"). Huber fits take integer weights (point multiplicities):
least_squares has no per-residual weights for a robust loss.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.optimize import least_squares
from threadpoolctl import threadpool_limits

from analysis.laws.fit import ALPHA_BOUNDS, HUBER_DELTA, JointFit, PowerLaw, _joint_result, huber

_TOL = 1e-14  # ftol = xtol = gtol: well below any difference the tests resolve, above machine epsilon
_TOLS = {"ftol": _TOL, "xtol": _TOL, "gtol": _TOL}


def _points(C: Any, L: Any, is_variant: Any, weights: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(lnc, L, isv) with every point repeated ``weights`` times, and C_ref (from all points, as analysis.laws.fit)."""
    C = np.asarray(C, dtype=float)
    L = np.asarray(L, dtype=float)
    isv = np.asarray(is_variant, dtype=bool)
    w = np.ones(L.shape, dtype=int) if weights is None else np.asarray(weights)
    if np.any(w < 0) or not np.all(w == np.round(w)):
        raise ValueError("the reference Huber fits take non-negative integer weights (point multiplicities)")
    w = np.round(w).astype(int)
    C_ref = float(np.exp(np.mean(np.log(C))))
    return np.repeat(np.log(C / C_ref), w), np.repeat(L, w), np.repeat(isv, w), C_ref


def reference_power_law(C: Any, L: Any, weights: Any = None) -> PowerLaw:
    """Paper form ``L = A C^-alpha``: least squares of log L on log C (weights multiply the squared residuals)."""
    lnC = np.log(np.asarray(C, dtype=float))
    lnL = np.log(np.asarray(L, dtype=float))
    sw = np.sqrt(np.ones_like(lnL) if weights is None else np.asarray(weights, dtype=float))

    def resid(theta: np.ndarray) -> np.ndarray:  # theta = (log A, alpha)
        return sw * (lnL - theta[0] + theta[1] * lnC)

    def jac(theta: np.ndarray) -> np.ndarray:
        return np.stack([-sw, sw * lnC], 1)

    res = least_squares(resid, np.zeros(2), jac=jac, loss="linear", method="trf", **_TOLS)
    return PowerLaw(A=float(np.exp(res.x[0])), alpha=float(res.x[1]))


def reference_joint_power_law(
    C: Any, L: Any, is_variant: Any, weights: Any = None, *, delta: float = HUBER_DELTA
) -> JointFit:
    """Shared-exponent power law ``log L = a_arm - alpha log(C / C_ref)``, Huber(delta): convex, one local solve."""
    lnc, L, isv, C_ref = _points(C, L, is_variant, weights)
    lnL = np.log(L)

    def resid(theta: np.ndarray) -> np.ndarray:  # theta = (a_b, a_v, alpha)
        return lnL - np.where(isv, theta[1], theta[0]) + theta[2] * lnc

    def jac(theta: np.ndarray) -> np.ndarray:
        return np.stack([-(~isv).astype(float), -isv.astype(float), lnc], 1)

    start = least_squares(resid, np.zeros(3), jac=jac, loss="linear", method="trf")
    with threadpool_limits(limits=1, user_api="blas"):
        res = least_squares(resid, start.x, jac=jac, loss="huber", f_scale=delta, method="trf", **_TOLS)
    a_b, a_v, alpha = (float(t) for t in res.x)
    return _joint_result("power_law", 0.0, a_b, a_v, alpha, float(res.cost), C_ref)


def reference_joint_saturating(
    C: Any,
    L: Any,
    is_variant: Any,
    weights: Any = None,
    *,
    delta: float = HUBER_DELTA,
    alpha_bounds: tuple[float, float] = ALPHA_BOUNDS,
    n_alpha: int = 4,
    E_starts: tuple[float, ...] = (0.01, 0.5),
) -> JointFit:
    """Saturating joint fit ``L_arm = E + A_arm C^-alpha``, Huber(delta) on log residuals, 0 <= E <= min(L), alpha
    in ``alpha_bounds``: the lowest-cost trust-region solve from ``n_alpha`` exponents x ``E_starts`` fractions."""
    lnc, L, isv, C_ref = _points(C, L, is_variant, weights)
    lnL = np.log(L)
    E_max = float(L.min())

    def parts(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # theta = (E, a_b, a_v, alpha)
        T = np.exp(np.where(isv, theta[2], theta[1]) - theta[3] * lnc)  # the power-law part of Lhat
        return T, theta[0] + T

    def resid(theta: np.ndarray) -> np.ndarray:
        return lnL - np.log(parts(theta)[1])

    def jac(theta: np.ndarray) -> np.ndarray:
        T, Lhat = parts(theta)
        return np.stack([-1.0 / Lhat, -T / Lhat * ~isv, -T / Lhat * isv, T * lnc / Lhat], 1)

    lo, hi = alpha_bounds
    bounds = ([0.0, -np.inf, -np.inf, lo], [E_max, np.inf, np.inf, hi])
    best = None
    with threadpool_limits(limits=1, user_api="blas"):
        for alpha0 in np.geomspace(lo, hi, n_alpha + 2)[1:-1]:  # strictly inside the bounds, as trf needs
            for frac in E_starts:
                E0 = frac * E_max
                y = np.log(L - E0) + alpha0 * lnc
                x0 = np.array([E0, y[~isv].mean(), y[isv].mean(), alpha0])
                res = least_squares(
                    resid, x0, jac=jac, bounds=bounds, loss="huber", f_scale=delta, method="trf", max_nfev=2000, **_TOLS
                )
                if best is None or res.cost < best.cost:
                    best = res
    E, a_b, a_v, alpha = (float(t) for t in best.x)
    return _joint_result("saturating", E, a_b, a_v, alpha, float(best.cost), C_ref)


def reference_joint(
    C: Any,
    L: Any,
    is_variant: Any,
    weights: Any = None,
    *,
    form: str,
    delta: float = HUBER_DELTA,
    alpha_bounds: tuple[float, float] = ALPHA_BOUNDS,
) -> JointFit:
    """The reference joint fit of one ``form`` ("saturating" or "power_law"; no fallback between them)."""
    if form == "saturating":
        return reference_joint_saturating(C, L, is_variant, weights, delta=delta, alpha_bounds=alpha_bounds)
    if form == "power_law":
        return reference_joint_power_law(C, L, is_variant, weights, delta=delta)
    raise ValueError(f"form={form!r} is unknown; allowed values: saturating, power_law")


def huber_objective(
    fit: JointFit, C: Any, L: Any, is_variant: Any, weights: Any = None, delta: float = HUBER_DELTA
) -> float:
    """``sum_i w_i huber(log L_i - log Lhat_i, delta)`` of a joint fit (A values in original C units)."""
    C = np.asarray(C, dtype=float)
    L = np.asarray(L, dtype=float)
    isv = np.asarray(is_variant, dtype=bool)
    w = np.ones_like(L) if weights is None else np.asarray(weights, dtype=float)
    Lhat = np.where(isv, fit.variant_law().loss(C), fit.base_law().loss(C))
    return float((w * huber(np.log(L) - np.log(Lhat), delta)).sum())
