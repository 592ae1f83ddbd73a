"""The optimum of loss against x = ln lr on one grid: the vertex of the least-squares parabola through the grid
points within ``WINDOW`` steps of the grid minimum (:func:`quadratic_vertex`), kept inside that window; a scipy
reference for the tests (:func:`reference_optimum`) and the loss read off a grid at any lr (:func:`loss_at`).
"""

from __future__ import annotations

import warnings

import numpy as np

WINDOW = 2  # grid steps on each side of the grid minimum used by the quadratic fit


def quadratic_vertex(x: np.ndarray, y: np.ndarray, window: int = WINDOW) -> tuple[float, float, float, int, int]:
    """(x*, y(x*), c, lo, hi) of the least-squares parabola through the finite points ``lo..hi`` around the minimum
    of y (x ascending): the vertex clipped to the window where c > 0, else the best grid point (c = nan under three
    finite points)."""
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
    """scipy reference for :func:`quadratic_vertex`: curve_fit's parabola minimised over the window."""
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
    """The loss at ln lr ``x0`` off one grid: the parabola (a line with two points) through the finite points within
    ``window`` steps of the grid minimum where x0 lies there, else of the grid point nearest x0; nan outside the
    grid or with under two points."""
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
