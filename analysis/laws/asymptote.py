"""The multiplier's sensitivity to the asymptote E (fit.json ``e_sensitivity``): m of the joint fit with E fitted,
as the ladder fit chose, E = 0 and E pinned at fractions of the lowest observed loss, each with its Huber objective.
docs/analysis.md ("--e-sensitivity"). Numbers only.
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
    """Per variant against the baseline (``runs``: arms as fitted): rows ``E_mode`` (``fitted``, ``auto``, ``0``,
    ``<f> x min L``) with E, alpha, m, the Huber objective and its excess over the best row."""
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
    return {"E_mode": mode, "E": fit.E, "E_over_min_L": fit.E / L_min, "form": fit.form} | {
        k: getattr(fit, k) for k in ("alpha", "m", "objective")
    }
