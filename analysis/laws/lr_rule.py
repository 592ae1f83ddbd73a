"""The lr rule of one arm: ``ln lr* = a + b ln N + c ln D`` over the optima of its (size, budget) cells (N the
non-embedding parameters, D the training tokens), with a bootstrap interval on each coefficient and a
leave-one-cell-out check. Numbers only: arrays in, a dict out (analysis.studies.lr builds the cells and renders it).

Fit: weighted least squares, each cell weighted by 1 / se^2, se = the width of its 95% interval on ln lr / (2 z_0.975)
(a cell whose optimum is pinned down tightly counts more); where some cell has no finite, positive-width interval,
plain least squares for every cell (said in ``method``).

Terms: ``b`` only where the cells span more than one N, ``c`` only where they span more than one D, and ``c`` is
dropped where ln D is collinear with the other columns (one budget per size: D = budget x N); a dropped term is None
(not identified by these cells). The fit needs a slope (b or c) and at least as many cells as coefficients.

Interval (95% percentile): in replicate j every cell's optimum is its j-th bootstrap draw (the draws its own interval
came from, analysis.studies.lr), and the rule is refitted with the same weights; replicates where some cell has no
draw are left out.

Leave-one-cell-out: for each cell, the rule refitted without it (same terms) predicts that cell's optimum; the check
counts the cells whose prediction lies inside the cell's own interval (``loo_inside`` of ``loo_n``). A cell is checked
only where the others still determine every coefficient (more cells than coefficients, full rank).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

LEVEL = 0.95
TERMS = ("a", "b", "c")  # intercept, ln N, ln D


def rule_terms(ln_n: np.ndarray, ln_d: np.ndarray) -> tuple[str, ...]:
    """The coefficients these cells identify: ``a`` always, ``b`` where N varies, ``c`` where D varies and is not
    collinear with ln N and the intercept."""
    terms = ["a"]
    if len(ln_n) == 0:
        return ("a",)
    if np.ptp(ln_n) > 1e-9:
        terms.append("b")
    if np.ptp(ln_d) > 1e-9:
        trial = _design(ln_n, ln_d, (*terms, "c"))
        if np.linalg.matrix_rank(trial, tol=1e-8 * max(1.0, float(np.abs(trial).max()))) == trial.shape[1]:
            terms.append("c")
    return tuple(terms)


def _design(ln_n: np.ndarray, ln_d: np.ndarray, terms: tuple[str, ...]) -> np.ndarray:
    columns = {"a": np.ones_like(ln_n, dtype=float), "b": np.asarray(ln_n, float), "c": np.asarray(ln_d, float)}
    return np.column_stack([columns[t] for t in terms])


def fit_rule(
    ln_lr: np.ndarray, ln_n: np.ndarray, ln_d: np.ndarray, terms: tuple[str, ...], weights: np.ndarray | None = None
) -> np.ndarray | None:
    """(a, b, c) of the (weighted) least-squares fit with only ``terms`` free (the others nan); None where the cells do
    not determine them (fewer cells than terms, or a rank-deficient design). ``ln_lr`` may be 2-D (replicates x
    cells): one fit per row, returned as rows."""
    X = _design(np.asarray(ln_n, float), np.asarray(ln_d, float), terms)
    if X.shape[0] < X.shape[1] or np.linalg.matrix_rank(X) < X.shape[1]:
        return None
    w = np.ones(X.shape[0]) if weights is None else np.asarray(weights, float)
    sw = np.sqrt(w)
    Y = np.atleast_2d(np.asarray(ln_lr, float))
    beta, *_ = np.linalg.lstsq(X * sw[:, None], (Y * sw[None, :]).T, rcond=None)
    out = np.full((Y.shape[0], 3), np.nan)
    for i, t in enumerate(terms):
        out[:, TERMS.index(t)] = beta[i]
    return out if np.ndim(ln_lr) == 2 else out[0]


def predict(coef: np.ndarray, ln_n: float | np.ndarray, ln_d: float | np.ndarray) -> np.ndarray:
    """ln lr* of the rule ``coef`` = (a, b, c) at (ln N, ln D); a term that is nan (not fitted) contributes 0."""
    a, b, c = (0.0 if not np.isfinite(v) else float(v) for v in coef)
    return a + b * np.asarray(ln_n, float) + c * np.asarray(ln_d, float)


def interval_weights(ci_ln: np.ndarray, level: float = LEVEL) -> np.ndarray | None:
    """1 / se^2 per cell from its interval on ln lr (rows [lo, hi]); None where some interval is not finite with a
    positive width (then the fit is unweighted)."""
    ci_ln = np.asarray(ci_ln, float)
    width = ci_ln[:, 1] - ci_ln[:, 0]
    if not (np.isfinite(width).all() and (width > 0).all()):
        return None
    se = width / (2 * stats.norm.ppf(0.5 + level / 2))
    return 1.0 / se**2


def _interval(draws: np.ndarray, level: float) -> list[list[float] | None]:
    q = 100 * (1 - level) / 2
    out: list[list[float] | None] = []
    for k in range(3):
        col = draws[:, k]
        col = col[np.isfinite(col)]
        out.append([float(v) for v in np.percentile(col, [q, 100 - q])] if col.size >= 2 else None)
    return out


def leave_one_out(
    ln_lr: np.ndarray,
    ln_n: np.ndarray,
    ln_d: np.ndarray,
    ci_ln: np.ndarray,
    terms: tuple[str, ...],
    weights: np.ndarray | None,
) -> list[dict[str, Any]]:
    """Per cell: ``predicted_ln_lr`` of the rule refitted without it (None where the other cells do not determine
    ``terms``) and ``inside`` (the prediction inside the cell's interval ``ci_ln``; None when not checked)."""
    out = []
    n = len(ln_lr)
    for i in range(n):
        keep = np.arange(n) != i
        w = None if weights is None else weights[keep]
        coef = fit_rule(ln_lr[keep], ln_n[keep], ln_d[keep], terms, w) if n - 1 >= len(terms) else None
        if coef is None:
            out.append({"predicted_ln_lr": None, "inside": None})
            continue
        pred = float(predict(coef, ln_n[i], ln_d[i]))
        lo, hi = ci_ln[i]
        inside = bool(lo <= pred <= hi) if np.isfinite(lo) and np.isfinite(hi) else None
        out.append({"predicted_ln_lr": pred, "inside": inside})
    return out


def lr_rule(
    ln_lr: np.ndarray,
    ln_n: np.ndarray,
    ln_d: np.ndarray,
    ci_ln: np.ndarray,
    draws: np.ndarray | None = None,
    *,
    weighted: bool = True,
    level: float = LEVEL,
) -> dict[str, Any]:
    """The rule over n cells: ``ln_lr``, ``ln_n``, ``ln_d`` (n,), ``ci_ln`` (n, 2) each cell's interval on ln lr,
    ``draws`` (B, n) each cell's bootstrap draws of its ln lr* (nan: no draw).

    Returns ``terms`` (the coefficients fitted), ``a``, ``b``, ``c`` (None: not identified) and ``a_ci95``, ``b_ci95``,
    ``c_ci95`` (None without draws), ``weighted`` (whether the fit used the intervals' weights), ``method`` (in
    words), ``n_cells``, ``n_boot`` (replicates used), ``residuals`` (per cell, ln lr* minus the rule), ``loo`` (per
    cell, :func:`leave_one_out`), ``loo_inside`` and ``loo_n`` (cells checked); ``error`` (and no coefficients) where
    the cells do not determine the rule (fewer cells than coefficients, or no slope: one N and one D)."""
    ln_lr, ln_n, ln_d = (np.asarray(v, float) for v in (ln_lr, ln_n, ln_d))
    ci_ln = np.asarray(ci_ln, float).reshape(-1, 2)
    terms = rule_terms(ln_n, ln_d)
    weights = interval_weights(ci_ln, level) if weighted else None
    method = (
        "weighted least squares, weights 1/se^2 with se = the width of the cell's 95% interval on ln lr / 3.92"
        if weights is not None
        else "least squares, unweighted" + (" (some cell's interval is missing or of zero width)" if weighted else "")
    )
    doc: dict[str, Any] = {"terms": list(terms), "weighted": weights is not None, "method": method}
    doc |= {"n_cells": len(ln_lr), "level": level}
    coef = fit_rule(ln_lr, ln_n, ln_d, terms, weights) if len(terms) > 1 else None
    if coef is None:
        why = (
            "they span one N and one D: no slope to fit"
            if len(terms) == 1
            else f"too few to determine {len(terms)} coefficients"
        )
        return doc | {
            "error": f"{len(ln_lr)} cell(s) with a located optimum: {why}",
            "loo": [],
            "loo_inside": 0,
            "loo_n": 0,
        }
    for name, v in zip(TERMS, coef):
        doc[name] = float(v) if np.isfinite(v) else None
    doc["residuals"] = [float(r) for r in ln_lr - predict(coef, ln_n, ln_d)]
    intervals: list[list[float] | None] = [None, None, None]
    n_boot = 0
    if draws is not None and draws.size:
        draws = np.asarray(draws, float).reshape(-1, len(ln_lr))
        draws = draws[np.isfinite(draws).all(1)]
        n_boot = len(draws)
        reps = fit_rule(draws, ln_n, ln_d, terms, weights) if n_boot else None
        if reps is not None:
            intervals = _interval(np.asarray(reps).reshape(-1, 3), level)
    for name, ci in zip(TERMS, intervals):
        doc[f"{name}_ci95"] = ci if name in terms else None
    doc["n_boot"] = n_boot
    loo = leave_one_out(ln_lr, ln_n, ln_d, ci_ln, terms, weights)
    checked = [r for r in loo if r["inside"] is not None]
    return doc | {"loo": loo, "loo_inside": sum(r["inside"] for r in checked), "loo_n": len(checked)}
