"""Does one compute multiplier describe every rung? The test behind a pooled m, and what a report says instead when
it rejects (fit.json ``multipliers.<arm>.rung_test`` and ``least_squares``).

The per-size multipliers m_s (laws.multipliers: the baseline's curve inverted at the variant's runs of that size,
i.e. the horizontal distance between the arms at that size's compute) and their bootstrap replicates give a Wald test
of "every ln m_s is one ln m": with S the replicates' covariance of ln m_s (deviations scaled as the intervals are;
the sizes share the baseline curve, so S is not diagonal), x the point values and x̄ their generalised-least-squares
mean, Q = (x - x̄)' S⁻¹ (x - x̄) (Cochran's Q with the correlations). S is estimated from a few seeds per size, so
Q / (k - 1) is read against F(k - 1, ν), ν = Σ (seeds per size - 1) (chi² on k - 1 under the parametric bootstrap,
whose sigma is given). Measured on synthetic 5-rung ladders with one planted multiplier (30 each, B = 300): at 6 seeds
per size it rejected 1 of 30 at the 5% level (chi² would have rejected 2), at 3 seeds 4 of 30 (chi²: 6): with 3 seeds
the test is anti-conservative and a p near the level is weak evidence. Where it
rejects (p < P_REJECT), a pooled m describes no rung: the headline says so and gives m(C), the m_s at the measured C,
and the trend d ln m / d ln C (least squares over the sizes, its interval from the same replicates). Under a trend the
shared-exponent joint fit that supplies E is itself misspecified, so the m_s order the rungs but are distorted (a
planted 0.6 ... 1.6 over five rungs reads 0.73 ... 2.24, tests/test_rung_test.py): m(C) says where the gain changes,
not by exactly how much.

The pooled joint fit's loss is stated in every report: Huber on log-loss with threshold delta (analysis.laws.fit), which
down-weights points whose residual exceeds delta, beside an ordinary least-squares fit of the same law (the Huber
threshold LSQ_DELTA, which no log residual reaches); where either m lies outside the other's interval the report
shows both and says they disagree.

Numbers only (and the fit loss's label, :func:`fit_loss_text`, which fit.json's ``least_squares.loss`` stores): the
headline lines and summary.md's section that print them are analysis.render.multiplier_text's (rung_headline,
rung_markdown); :func:`rung_part` keeps what they read.

Plain functions on plain data; no torch.
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
    """The Wald (correlated Cochran's Q) test of one multiplier over the sizes of ``ln_m`` (ln m_s per size), from
    their bootstrap replicates ``ln_boot`` (arrays of one length), each size's compute ``C`` and ``noise_dof`` (ν of
    the F reference; None: chi²): ``Q``, ``dof``, ``p``, ``reference`` (the distribution p is read from),
    ``one_multiplier`` (p >= P_REJECT; None without a test), ``m_common`` (the GLS-pooled m), the trend ``slope`` of
    ln m against ln C with ``slope_ci95``, and ``m_of_C`` (size, C, m, m_ci95) in order of C."""
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
    """Each rung's seconds-per-FLOP ratio t = s_ref / s_arm from a wall-clock entry (analysis.laws.wallclock
    .time_ratio's ``per_rung``): m_wall at a rung is m_s · t of that rung. Empty without timing."""
    return {str(p["rung"]): float(p["s_ref_over_s_arm"]) for p in (timing or {}).get("per_rung") or []}


def rung_part(mult: dict[str, Any], timing: dict[str, Any] | None = None) -> dict[str, Any]:
    """What analysis.render.multiplier_text's rung_headline and rung_markdown read from a fit.json multiplier, for a
    report that keeps only part of it: m, its interval, the Huber threshold, the rung test, the least-squares fit and
    their verdict, and with ``timing`` (a wall-clock entry) each rung's time ratio (``rung_time``)."""
    keys = ("m", "m_ci95", "rung_test", "least_squares", "loss_disagreement")
    part = {k: mult.get(k) for k in keys} | {"joint": {"huber_delta": (mult.get("joint") or {}).get("huber_delta")}}
    return part | {"rung_time": rung_time_ratios(timing)}
