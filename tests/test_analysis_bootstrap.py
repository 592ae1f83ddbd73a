"""Bootstrap intervals (analysis.laws.bootstrap + scaling_ladder.analyse_scaling): pairing, reproducibility and
coverage.

The coverage tests are the acceptance check that the 95% interval of the joint-fit multiplier m is honest:
over many synthetic ladders with known m the interval must contain the truth at a stated rate.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from synthetic_records import synthetic_ladder

from analysis.io.runs import AnalysisWarning
from analysis.laws import bootstrap as bs
from analysis.laws.fit_options import FitOptions
from analysis.laws.scaling_ladder import analyse_scaling

TRUE_M = (1.0, 1.25, 1.6)


def test_default_B_is_at_least_2000() -> None:
    assert bs.DEFAULT_B >= 2000


def test_plan_picks_cluster_or_parametric() -> None:
    two = synthetic_ladder({"v": 1.25}, seeds=(0, 1))
    plan = bs.plan_resampling(two)
    assert plan.mode == "paired_cluster"
    assert plan.scale == pytest.approx(np.sqrt(2))
    one = synthetic_ladder({"v": 1.25}, seeds=(0,))
    plan = bs.plan_resampling(one, sigma=0.01, rho=0.5)
    assert (plan.mode, plan.sigma, plan.rho) == ("parametric", 0.01, 0.5)
    with pytest.raises(ValueError, match="--seed-sigma"):
        bs.plan_resampling(one)
    assert bs.plan_resampling(one, residual_sigma=0.02).sigma == 0.02
    # Mixed: extra seeds at the two smallest sizes (a pilot) give a pooled seed sd for the parametric bootstrap.
    pilot = synthetic_ladder({"v": 1.25}, seeds=(1, 2), n_sizes=2, C_range=(2e-6, 2e-6 * 100**0.25), sigma=0.01, rng=3)
    plan = bs.plan_resampling(pd.concat([one, pilot]))
    assert plan.mode == "parametric"
    assert "pooled" in plan.sigma_source
    assert 0.002 < plan.sigma < 0.03
    with pytest.raises(ValueError, match="single-seed sizes"):
        bs.plan_resampling(one, mode="cluster")


def test_cluster_draw_keeps_both_arms_of_a_cell_together() -> None:
    df = synthetic_ladder({"v": 1.25}, seeds=(0, 1, 2))
    plan = bs.plan_resampling(df, B=500, seed=1)
    L, W = bs.draw(df, plan, bs.rng_for(plan, "x"))
    cell_w = pd.DataFrame(W.T).assign(size=df["size"], seed=df["seed"]).groupby(["size", "seed"])
    assert (cell_w.max() == cell_w.min()).all().all()  # baseline and variant of a cell share every weight
    per_size = pd.DataFrame(W.T).assign(size=df["size"]).groupby("size").sum() / 2  # two arms per cell
    assert (per_size == 3).all().all()  # each size stratum draws exactly its 3 seeds
    np.testing.assert_array_equal(L, np.broadcast_to(df["val_loss"].to_numpy(), L.shape))


def test_parametric_draw_has_the_stated_noise() -> None:
    df = synthetic_ladder({"v": 1.25}, seeds=(0,))
    plan = bs.plan_resampling(df, B=20000, sigma=0.01, rho=0.5)
    L, W = bs.draw(df, plan, bs.rng_for(plan, "x"))
    noise = L - df["val_loss"].to_numpy()
    assert noise.std() == pytest.approx(0.01, rel=0.03)
    pair = np.corrcoef(noise[:, 0], noise[:, 1])[0, 1]  # baseline and variant of the first cell
    assert pair == pytest.approx(0.5, abs=0.05)
    assert (W == 1).all()


def test_bootstrap_is_reproducible_and_seeded() -> None:
    df = synthetic_ladder({"v": 1.25}, seeds=(0, 1), rng=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnalysisWarning)
        a = analyse_scaling(df, FitOptions(B=300, seed=11)).parts["multipliers"]["v"]
        b = analyse_scaling(df, FitOptions(B=300, seed=11)).parts["multipliers"]["v"]
        c = analyse_scaling(df, FitOptions(B=300, seed=12)).parts["multipliers"]["v"]
    assert a["m_ci95"] == b["m_ci95"]
    assert a["per_size"] == b["per_size"]
    assert a["m"] == c["m"]
    assert a["m_ci95"] != c["m_ci95"]


def _coverage(seeds: tuple[int, ...], n_rep: int, B: int, **kw) -> dict[str, np.ndarray]:
    hits, est, width, p_le_1, truth = [], [], [], [], []
    for r in range(n_rep):
        m = TRUE_M[r % 3]
        # Alternate the truth between a saturating law (E = 2) and a pure power law (E = 0).
        law = {} if r % 2 == 0 else {"E": 0.0, "A": 3.0, "alpha": 0.08}
        df = synthetic_ladder({"v": m}, seeds=seeds, sigma=0.01, rho=0.5, rng=1000 + r, **law)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AnalysisWarning)
            res = analyse_scaling(df, FitOptions(B=B, seed=r, **kw)).parts["multipliers"]["v"]
        lo, hi = res["m_ci95"]
        hits.append(lo <= m <= hi)
        est.append(res["m"])
        width.append((hi - lo) / m)
        p_le_1.append(res["p_m_le_1"])
        truth.append(m)
    return {k: np.array(v) for k, v in {"hits": hits, "est": est, "width": width, "p": p_le_1, "truth": truth}.items()}


def test_cluster_bootstrap_coverage() -> None:
    """90 ladders (5 sizes x 2 arms x 2 seeds, sigma = 0.01 of which half is shared within a cell), true m
    cycling through 1.0 / 1.25 / 1.6; B = 200 per ladder to keep the test fast (the CLI default is 2000).

    Stated rate: the nominal-95% interval must cover the truth in >= 85% of ladders (with 2 seeds the
    sqrt(n/(n-1))-corrected paired cluster bootstrap measured ~0.92; 85% leaves room for the binomial spread
    of 90 draws, sd ~0.03, and for B = 200 percentiles) and must not be uselessly wide (median < 15% of m)."""
    r = _coverage(seeds=(0, 1), n_rep=90, B=200)
    assert r["hits"].mean() >= 0.85, f"coverage {r['hits'].mean():.3f}"
    assert np.median(r["width"]) < 0.15
    for m in TRUE_M:  # the point estimate is recovered: median within 2% of the truth for every m
        assert np.median(r["est"][r["truth"] == m]) == pytest.approx(m, rel=0.02)
    # P(m <= 1): ~0.5 when there is no effect, ~0 for a 1.6x multiplier.
    assert 0.2 < r["p"][r["truth"] == 1.0].mean() < 0.8
    assert r["p"][r["truth"] == 1.6].max() < 0.01


def test_parametric_bootstrap_coverage() -> None:
    """One seed per cell: the parametric bootstrap with the true sigma and rho (as from a pilot seed study).
    30 ladders, B = 200.  Stated rate: >= 85% coverage (measured ~0.95)."""
    r = _coverage(seeds=(0,), n_rep=30, B=200, seed_sigma=0.01, seed_rho=0.5)
    assert r["hits"].mean() >= 0.85, f"coverage {r['hits'].mean():.3f}"
    assert np.median(r["width"]) < 0.25
