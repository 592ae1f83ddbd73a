"""Does one compute multiplier describe every rung? The Wald test (Cochran's Q with the m_s' bootstrap
correlations, Q / (k - 1) against F(k - 1, Σ(seeds per size - 1))) behind a pooled m, the trend d ln m / d ln C
where it rejects, and the Huber-vs-least-squares check of the fit's loss: fit.json ``multipliers.<arm>.rung_test``
and ``least_squares`` (docs/analysis.md, "The rung test", "The fit's loss"). Numbers only (and the fit loss's label).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

from . import bootstrap as bs

P_REJECT = 0.05  # the test's level
LSQ_DELTA = 1.0  # a Huber threshold on log-loss residuals that no residual reaches (a factor e in loss): least squares


def rung_test(
    ln_m: dict[str, float],
    ln_boot: dict[str, np.ndarray],
    C: dict[str, float],
    plan: bs.ResamplePlan,
    noise_dof: int | None = None,
) -> dict[str, Any]:
    """The test of one multiplier over the sizes of ``ln_m`` from their replicates ``ln_boot``, compute ``C`` and
    ``noise_dof`` (the F's ν; None: chi²): ``Q``, ``dof``, ``p``, ``reference``, ``one_multiplier``, ``m_common``
    (GLS-pooled), the trend ``slope`` with ``slope_ci95``, and ``m_of_C`` in order of C."""
    sizes = sorted(ln_m, key=lambda s: C[s])
    x = np.array([ln_m[s] for s in sizes], float)
    X = np.stack([np.asarray(ln_boot[s], float) for s in sizes], axis=1) if sizes else np.zeros((0, 0))
    lnC = np.log(np.array([C[s] for s in sizes], float))
    curve = [
        {
            "size": s,
            "C": C[s],
            "m": math.exp(ln_m[s]),
            "m_ci95": bs.interval(math.exp(ln_m[s]), np.exp(X[:, i]), plan, log=True),
        }
        for i, s in enumerate(sizes)
    ]
    out: dict[str, Any] = {"Q": None, "dof": len(sizes) - 1, "p": None, "one_multiplier": None, "m_common": None}
    out |= {"slope": None, "slope_ci95": None, "level": P_REJECT, "m_of_C": curve}
    ok = np.all(np.isfinite(X), axis=1) if len(sizes) else np.zeros(0, bool)
    if len(sizes) < 2 or not np.all(np.isfinite(x)) or ok.sum() < 2 * len(sizes):
        return out
    D = plan.scale * (X[ok] - x)
    S = np.atleast_2d(np.cov(D, rowvar=False))
    Si = np.linalg.pinv(S)
    one = np.ones(len(x))
    mean = float(one @ Si @ x / (one @ Si @ one))
    r = x - mean
    Q = float(r @ Si @ r)
    k1 = len(x) - 1
    if noise_dof:  # S is estimated from the seeds: Q / (k - 1) against F(k - 1, noise_dof), not chi²
        p, ref = float(stats.f.sf(Q / k1, k1, noise_dof)), f"F({k1}, {noise_dof})"
    else:
        p, ref = float(stats.chi2.sf(Q, k1)), f"chi2({k1})"
    slope = float(np.polyfit(lnC, x, 1)[0]) if np.ptp(lnC) > 0 else None
    out |= {"Q": Q, "p": p, "reference": ref, "one_multiplier": bool(p >= P_REJECT), "m_common": math.exp(mean)}
    if slope is not None:
        slopes = np.polyfit(lnC, (x + D).T, 1)[0]
        out |= {"slope": slope, "slope_ci95": bs.interval(slope, slopes, plan)}
    return out


def loss_summary(entry: dict[str, Any], delta: float) -> dict[str, Any]:
    """A pair fit's headline under one loss: m with its interval, the per-size m_s and the rung test's p."""
    test = entry.get("rung_test") or {}
    return {
        "loss": fit_loss_text(delta),
        "m": entry["m"],
        "m_ci95": entry["m_ci95"],
        "per_size": {s: {"m": p["m"], "m_ci95": p["m_ci95"]} for s, p in entry["per_size"].items()},
        "rung_test_p": test.get("p"),
    }


def fit_loss_text(delta: float) -> str:
    return "least squares on log-loss" if delta >= LSQ_DELTA else f"Huber (delta = {delta:g}) on log-loss"


def losses_disagree(m_a: float, ci_a: list[float] | None, m_b: float, ci_b: list[float] | None) -> bool:
    """Whether either m lies outside the other's 95% interval (an undefined interval counts as no evidence)."""

    def outside(m: float, ci: list[float] | None) -> bool:
        return bool(ci and all(c is not None and math.isfinite(c) for c in ci) and not ci[0] <= m <= ci[1])

    return outside(m_a, ci_b) or outside(m_b, ci_a)


def rung_time_ratios(timing: dict[str, Any] | None) -> dict[str, float]:
    """Each rung's t = s_ref / s_arm from a wall-clock entry's ``per_rung`` (empty without timing)."""
    return {str(p["rung"]): float(p["s_ref_over_s_arm"]) for p in (timing or {}).get("per_rung") or []}


def rung_part(mult: dict[str, Any], timing: dict[str, Any] | None = None) -> dict[str, Any]:
    """The part of a fit.json multiplier that multiplier_text's rung lines read, with each rung's time ratio."""
    keys = ("m", "m_ci95", "rung_test", "least_squares", "loss_disagreement")
    part = {k: mult.get(k) for k in keys} | {"joint": {"huber_delta": (mult.get("joint") or {}).get("huber_delta")}}
    return part | {"rung_time": rung_time_ratios(timing)}
