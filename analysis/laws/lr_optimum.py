"""The optimum of loss against ln lr on one grid: the vertex of a parabola fitted near the grid minimum.

    loss(x) = a + b (x - x_k) + c (x - x_k)^2,    x = ln(lr),

fitted by least squares to the grid points within ``WINDOW`` steps of the grid minimum x_k (loss against log-lr is
parabolic only near its minimum: the high-lr side steepens towards divergence); the optimum is the vertex
x* = x_k - b / (2c), kept inside the fitted window (:func:`quadratic_vertex`). A scipy reference
(:func:`reference_optimum`, a bounded scalar minimisation of the same quadratic) checks the closed-form vertex in the
tests. Used by the lr study (analysis.studies.lr) and the lr check of a multi-budget study (analysis.laws.lr_check).
Numbers only: arrays in, numbers out.
"""

from __future__ import annotations

import warnings

import numpy as np

WINDOW = 2  # grid steps on each side of the grid minimum used by the quadratic fit


def quadratic_vertex(x: np.ndarray, y: np.ndarray, window: int = WINDOW) -> tuple[float, float, float, int, int]:
    """(x*, y(x*), c, lo, hi) of the least-squares parabola through the points ``lo..hi`` around the minimum of y.

    x must be sorted ascending; y may hold +inf for grid points whose runs diverged (they bound the window
    but are not fitted). x* is the vertex when c > 0 and lies inside [x_lo, x_hi], else the window's best grid
    point clipped to that range. With fewer than 3 finite points the best grid point is returned with c = nan.
    """
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    finite = np.isfinite(y)
    if not finite.any():
        return float("nan"), float("nan"), float("nan"), 0, len(x) - 1
    k = int(np.nanargmin(np.where(finite, y, np.inf)))
    lo, hi = max(0, k - window), min(len(x) - 1, k + window)
    sel = np.arange(lo, hi + 1)
    sel = sel[finite[sel]]
    if sel.size < 3:
        return float(x[k]), float(y[k]), float("nan"), lo, hi
    u = x[sel] - x[k]
    c2, b, a = np.polyfit(u, y[sel], 2)
    if not c2 > 0:
        return float(x[k]), float(y[k]), float(c2), lo, hi
    v = -b / (2 * c2)
    v = float(np.clip(v, x[sel].min() - x[k], x[sel].max() - x[k]))
    return float(x[k] + v), float(a + b * v + c2 * v * v), float(c2), lo, hi


def reference_optimum(x: np.ndarray, y: np.ndarray, window: int = WINDOW) -> float:
    """scipy reference for :func:`quadratic_vertex` (tests): fit the same parabola with scipy.optimize.curve_fit
    and minimise it with a bounded scalar search over the fitted window."""
    from scipy.optimize import curve_fit, minimize_scalar

    x = np.asarray(x, float)
    y = np.asarray(y, float)
    k = int(np.nanargmin(np.where(np.isfinite(y), y, np.inf)))
    lo, hi = max(0, k - window), min(len(x) - 1, k + window)
    sel = [i for i in range(lo, hi + 1) if np.isfinite(y[i])]
    xs, ys = x[sel], y[sel]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "covariance could not be estimated" on exact fits: only the fit is used
        (a, b, c), _ = curve_fit(lambda t, a, b, c: a + b * t + c * t * t, xs, ys, p0=(float(ys.mean()), 0.0, 1.0))
    res = minimize_scalar(
        lambda t: a + b * t + c * t * t, bounds=(xs.min(), xs.max()), method="bounded", options={"xatol": 1e-10}
    )
    return float(res.x)


def loss_at(x: np.ndarray, y: np.ndarray, x0: float, window: int = WINDOW) -> float:
    """The loss at ln lr ``x0`` read off one grid. Inside the window :func:`quadratic_vertex` fits (``window`` steps
    around the grid minimum): that same parabola, so the loss there is never below the vertex's; elsewhere the
    least-squares parabola (a line with two points) through the finite points within ``window`` steps of the grid
    point nearest x0. nan where x0 lies outside the grid or fewer than two points are near it. x sorted ascending;
    y may hold +inf (diverged) or nan."""
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    finite = np.isfinite(y)
    if not (np.isfinite(x0) and finite.any() and x[0] - 1e-9 <= x0 <= x[-1] + 1e-9):
        return float("nan")
    k = int(np.nanargmin(np.where(finite, y, np.inf)))
    if not x[max(0, k - window)] - 1e-9 <= x0 <= x[min(len(x) - 1, k + window)] + 1e-9:
        k = int(np.argmin(np.abs(x - x0)))
    sel = np.arange(max(0, k - window), min(len(x) - 1, k + window) + 1)
    sel = sel[finite[sel]]
    if sel.size < 2:
        return float("nan")
    coefs = np.polyfit(x[sel] - x0, y[sel], min(2, sel.size - 1))
    return float(coefs[-1])
