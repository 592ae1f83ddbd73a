"""The lr rule of one arm: ``ln lr* = a + b ln N + c ln D`` over its cells' optima, by least squares weighted by
1 / se^2 (se from each cell's interval on ln lr), with bootstrap intervals (each cell at its j-th draw) and a
leave-one-cell-out check. A term the cells do not vary (or collinear ln D) is not fitted (None). Arrays in, a dict
out; docs/analysis.md, "Several budgets: the optimum per budget and the lr rule".
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

from .bootstrap import CI_LEVEL

TERMS = ("a", "b", "c")  # intercept, ln N, ln D


def rule_terms(ln_n: np.ndarray, ln_d: np.ndarray) -> tuple[str, ...]:
    """``a``, with ``b`` where N varies and ``c`` where D varies and is not collinear with the others."""
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
    """(a, b, c) of the (weighted) least-squares fit of ``terms`` (the others nan; rows for a 2-D ``ln_lr``), None
    where the cells do not determine them."""
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


def interval_weights(ci_ln: np.ndarray, level: float = CI_LEVEL) -> np.ndarray | None:
    """1 / se^2 per cell from its interval on ln lr; None where some interval is not finite and of positive width."""
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
    """Per cell: ``predicted_ln_lr`` by the rule refitted without it and ``inside`` its interval (None: unchecked)."""
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
    level: float = CI_LEVEL,
) -> dict[str, Any]:
    """The rule over n cells (``ln_lr``, ``ln_n``, ``ln_d``: (n,); ``ci_ln``: (n, 2); ``draws``: (B, n), nan for no
    draw): ``terms``, ``a``, ``b``, ``c`` with ``_ci95``, ``weighted``, ``method``, ``n_cells``, ``n_boot``,
    ``residuals``, ``loo``, ``loo_inside``, ``loo_n``; or ``error`` where the cells do not determine it."""
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
