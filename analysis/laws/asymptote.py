"""The multiplier's sensitivity to the asymptote E (fit.json ``e_sensitivity``): m of the joint fit
``L_arm = E + A_arm C^-alpha`` with E fitted, with E = 0, and with E pinned at fractions of the lowest observed loss.

A ladder over a small compute range rarely determines E; m = (A_b / A_v)^(1/alpha) moves with it (Marin #4447
found exponents 0.058 and 0.091 for a free and a pinned asymptote). One table per variant says how far: every row
is the same Huber log-loss fit (analysis.laws.fit), only E's treatment differs, and the objective beside m says which E
the data prefer. docs/analysis.md, "Sensitivity to the asymptote".

Numbers only: summary.md's tables are analysis.render.multiplier_text.e_sensitivity_markdown.

Plain functions on tidy DataFrames; no torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .fit import fit_joint, fit_joint_pinned
from .fit_options import FitOptions

FRACTIONS = (0.5, 0.8, 0.9, 0.95)  # E pinned at these fractions of the pair's lowest observed loss


def e_sensitivity(
    runs: pd.DataFrame, options: FitOptions | None = None, fractions: tuple[float, ...] = FRACTIONS
) -> dict[str, Any]:
    """For each variant against the baseline (``runs``: a fitted ladder's runs, arms as fitted): rows ``E_mode``
    (``fitted``: the saturating fit, never falling back, with ``at_bound`` saying whether E or alpha ended on a
    bound; ``auto``: the form the ladder fit chose; ``0``; ``<f> x min L``), each with E, alpha, m and the Huber
    objective (and its excess over the row's best)."""
    opt = options if options is not None else FitOptions()
    base, compute = opt.baseline, opt.compute
    out: dict[str, Any] = {"fractions": list(fractions), "variants": {}}
    for v in [str(x) for x in pd.unique(runs["variant"]) if x != base]:
        d = pd.concat([runs[runs["variant"] == base], runs[runs["variant"] == v]], ignore_index=True)
        C, L = d[compute].to_numpy(float), d["val_loss"].to_numpy(float)
        isv = (d["variant"] == v).to_numpy()
        L_min = float(L.min())
        rows = []
        free = fit_joint(C, L, isv, form="saturating", delta=opt.delta)
        auto = fit_joint(C, L, isv, form="auto", delta=opt.delta)
        at_bound = bool(1e-6 * L_min >= free.E or L_min * (1 - 1e-4) <= free.E)
        rows.append(_row("fitted", free, L_min) | {"at_bound": at_bound})
        rows.append(_row("auto", auto, L_min) | {"fallback": auto.fallback})
        rows.append(_row("0", fit_joint_pinned(C, L, isv, 0.0, delta=opt.delta), L_min))
        for f in fractions:
            rows.append(_row(f"{f:g} x min L", fit_joint_pinned(C, L, isv, f * L_min, delta=opt.delta), L_min))
        best = min(r["objective"] for r in rows)
        for r in rows:
            r["objective_excess"] = r["objective"] - best
        ms = np.array([r["m"] for r in rows], float)
        out["variants"][v] = {
            "L_min": L_min,
            "rows": rows,
            "m_range": [float(np.nanmin(ms)), float(np.nanmax(ms))],
        }
    return out


def _row(mode: str, fit: Any, L_min: float) -> dict[str, Any]:
    return {
        "E_mode": mode,
        "E": fit.E,
        "E_over_min_L": fit.E / L_min,
        "form": fit.form,
        "alpha": fit.alpha,
        "m": fit.m,
        "objective": fit.objective,
    }
