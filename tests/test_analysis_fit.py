"""Scaling-law fits (analysis.fit): exact recovery on noiseless ladders, NNLS exactness, known multipliers."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import nnls

from analysis.fit import (
    PowerLaw,
    fit_joint,
    fit_power_law,
    multiplier_curve,
    nnls3,
    per_size_multipliers,
)
from analysis.synthetic import synthetic_ladder

CPU_C = np.geomspace(2e-6, 2e-4, 5)  # CPU-ladder compute: tiny numbers in PFLOP/s-days


def _ladder(m: float, saturating: bool, overhead: float = 0.01) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Noiseless baseline + variant at CPU-scale compute; the variant is the baseline at m x its compute."""
    law = PowerLaw(A=1.5 * 1e-5**0.25, alpha=0.25, E=2.0) if saturating else PowerLaw(A=3.0 * 1e-5**0.08, alpha=0.08)
    C = np.r_[CPU_C, CPU_C * (1 + overhead)]
    isv = np.r_[np.zeros(5, bool), np.ones(5, bool)]
    L = np.where(isv, law.loss(C * m), law.loss(C))
    return C, L, isv


def test_power_law_is_exact_at_tiny_compute() -> None:
    C = np.geomspace(1e-7, 1e-4, 6)
    law = fit_power_law(C, 3.1 * C**-0.07)
    assert law.A == pytest.approx(3.1, rel=1e-10)
    assert law.alpha == pytest.approx(0.07, rel=1e-10)
    assert law.compute_for_loss(law.loss(2e-6)) == pytest.approx(2e-6, rel=1e-10)


def test_multiplier_curve_matches_closed_form() -> None:
    base, var = PowerLaw(1.891, 0.057), PowerLaw(1.870, 0.058)
    C = np.array([0.5, 1.0, 5.6, 10.0])
    # Pure power laws: M(C) = (A_b/A_v)^(1/alpha_b) * C^(alpha_v/alpha_b - 1)
    closed = (1.891 / 1.870) ** (1 / 0.057) * C ** (0.058 / 0.057 - 1)
    np.testing.assert_allclose(multiplier_curve(base, var, C), closed, rtol=1e-10)
    # The paper's headline, from its own published laws: 1.25x at 5.6 PFLOP/s-days.
    assert float(multiplier_curve(base, var, 5.6)) == pytest.approx(1.254, abs=2e-3)
    # Equal exponents: a constant multiplier.
    M = multiplier_curve(base, PowerLaw(1.865, 0.057), C)
    np.testing.assert_allclose(M, M[0], rtol=1e-12)


def test_nnls3_is_exact_nnls() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = 8
        x = rng.random(n) * 3
        isv = rng.random(n) < 0.5
        isv[:2] = [False, True]
        Phi = np.stack([np.ones(n), x * ~isv, x * isv], 1)
        y = rng.normal(size=n) * 2 + rng.normal()
        G, h = Phi.T @ Phi, Phi.T @ y
        got = nnls3(G[0, 0], G[0, 1], G[0, 2], G[1, 1], G[2, 2], h[0], h[1], h[2])
        np.testing.assert_allclose(got, nnls(Phi, y)[0], atol=1e-8)


@pytest.mark.parametrize("m", [1.0, 1.25, 1.6])
@pytest.mark.parametrize("saturating", [True, False])
def test_joint_fit_recovers_known_multiplier(m: float, saturating: bool) -> None:
    C, L, isv = _ladder(m, saturating)
    fit = fit_joint(C, L, isv)
    assert fit.m == pytest.approx(m, rel=1e-3)
    if saturating:
        assert fit.form == "saturating" and fit.fallback is None
        assert fit.E == pytest.approx(2.0, rel=1e-3)
        assert fit.alpha == pytest.approx(0.25, rel=1e-3)
    else:
        # No saturation in the data: E lands on its bound and the fit says it fell back to E = 0.
        assert fit.form == "power_law" and fit.E == 0.0
        assert "E hit its lower bound" in fit.fallback
        assert fit.alpha == pytest.approx(0.08, rel=1e-4)
    # A is reported in the original units (A at C = 1 PFLOP/s-day), not the internal normalised ones.
    assert fit.base_law().loss(C[0]) == pytest.approx(L[0], rel=1e-4)


@pytest.mark.parametrize("m", [1.0, 1.25, 1.6])
def test_joint_fit_with_seed_noise_is_close(m: float) -> None:
    # One fixed draw (seeded): sigma = 0.01 on ~3-nat losses, 2 seeds per cell.
    df = synthetic_ladder({"v": m}, seeds=(0, 1), sigma=0.01, rng=7)
    fit = fit_joint(df["pflops_days"], df["val_loss"], df["variant"] == "v")
    assert abs(np.log(fit.m / m)) < 0.05


def test_per_size_inversion_recovers_truth() -> None:
    base = PowerLaw(A=1.9, alpha=0.06)
    C_v = np.array([0.7, 1.0, 1.7, 3.5, 5.6])
    m_s = per_size_multipliers(base, C_v, base.loss(1.3 * C_v))
    np.testing.assert_allclose(m_s, 1.3, rtol=1e-10)


def test_bad_inputs_are_clear_errors() -> None:
    C, L, isv = _ladder(1.25, True)
    with pytest.raises(ValueError, match="form='nope'"):
        fit_joint(C, L, isv, form="nope")
    with pytest.raises(ValueError, match="variant at two or more compute"):
        fit_joint(np.r_[C[:5], [1e-5] * 5], L, isv)
    with pytest.raises(ValueError, match="two distinct compute"):
        fit_power_law([1e-5, 1e-5], [3.0, 3.1])
    with pytest.raises(ValueError, match="> 0"):
        fit_power_law([1e-5, 0.0], [3.0, 3.1])
    forced = fit_joint(*_ladder(1.25, False), form="saturating")
    assert forced.form == "saturating" and forced.fallback is None
