"""The compute-optimal frontier per arm and its multiplier M(C) (analysis.laws.frontier) against plain references, on
multi-budget studies drawn from planted Chinchilla laws (tests/synthetic_records.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.optimize import brentq, minimize_scalar
from synthetic_records import synthetic_budget_ladder

from analysis.__main__ import main
from analysis.laws.frontier import ArmLaw, analyse_frontier, multiplier_at

ALPHA = 0.3
LAWS = {"baseline": (1.8, 40.0, ALPHA, 60.0, 0.28), "block_attnres": (1.8, 30.0, ALPHA, 60.0, 0.28)}


def _law(E: float, A: float, alpha: float, B: float, beta: float, k: tuple[float, float]) -> ArmLaw:
    N0, D0 = 1e5, 1e6
    theta = np.array([math.log(A) - alpha * math.log(N0), alpha, math.log(B) - beta * math.log(D0), beta, math.log(E)])
    return ArmLaw(theta, N0, D0, k)


def test_the_frontier_and_m_match_a_brute_force_minimisation_and_root():
    k = (math.log(7.8e-20), -0.05)  # C = k(N) N D in PFLOP/s-days, k falling slowly with N as the records' does
    base, arm = _law(1.8, 40.0, 0.3, 60.0, 0.28, k), _law(1.7, 35.0, 0.32, 55.0, 0.3, k)
    grid = np.linspace(math.log(1e3), math.log(1e8), 20001)
    C = np.array([1e-9, 1e-8])
    L, N_opt = base.frontier(C, grid)

    def loss_at(law: ArmLaw, c: float, lnN: float) -> float:
        N = math.exp(lnN)
        return float(law.loss(N, c / (math.exp(k[0]) * N ** (1 + k[1]))))

    for c, l_star, n in zip(C, L, N_opt):
        ref = minimize_scalar(lambda x, c=c: loss_at(base, c, x), bounds=(grid[0], grid[-1]), method="bounded")
        assert l_star == pytest.approx(ref.fun, rel=1e-7)
        assert math.log(n) == pytest.approx(ref.x, abs=2e-3)
    M = multiplier_at(base, arm, C, grid)
    for c, m in zip(C, M):
        target = arm.frontier(np.array([c]), grid)[0][0]
        lnc = brentq(
            lambda x, t=target: base.frontier(np.array([math.exp(x)]), grid)[0][0] - t, math.log(c) - 9, math.log(c) + 9
        )
        assert m == pytest.approx(math.exp(lnc) / c, rel=1e-3)


def test_arms_that_differ_only_in_a_have_a_constant_known_multiplier(tmp_path):
    # with every exponent and the compute per token shared, L*_arm(C) = L*_base(C M) with M = (A_b / A_v)^(1 / alpha)
    truth = (40.0 / 30.0) ** (1 / ALPHA)
    df = synthetic_budget_ladder(LAWS, seeds=(0, 1, 2), sigma=0.002, rng=11)
    block = df["variant"] == "block_attnres"
    df["params_non_embedding"] = (
        df["params_non_embedding"].astype(float).where(~block, df["params_non_embedding"] * 1.001)
    )
    fr = analyse_frontier(df, B=30)
    M, lo, hi = (np.array(fr["M"][k], float) for k in ("M", "ci95_lo", "ci95_hi"))
    assert np.all(np.abs(M / truth - 1) < 0.05)
    assert np.all(lo < M)
    assert np.all(hi > M)
    assert fr["M"]["half_width_over_M_at_top"] < 0.15
    assert len(fr["C"]) == 25
    assert fr["C"][0] == pytest.approx(df["pflops_days"].min())
    assert fr["C"][-1] == pytest.approx(df["pflops_days"].max())
    # the frontier with N kept inside the measured rungs: its N_opt never leaves them, and where the free N_opt of
    # both arms lies inside them (at both C and C M) the two frontiers' M agree
    within = fr["within_rungs"]
    n_lo, n_hi = df["params_non_embedding"].min(), df["params_non_embedding"].max()
    for arm in ("baseline", "block_attnres"):
        n_opt = np.array(within["arms"][arm]["N_opt"])
        assert np.all((n_opt >= n_lo * 0.999) & (n_opt <= n_hi * 1.001))
        assert not within["arms"][arm]["N_opt_outside_rungs"]
    free_inside = [
        i
        for i in range(len(fr["C"]))
        if all(n_lo * 1.05 < fr["arms"][a]["N_opt"][i] < n_hi / 1.05 for a in ("baseline", "block_attnres"))
    ]
    assert len(free_inside) >= 5  # planted so: the comparison is not vacuous
    for i in free_inside:
        base_n = np.interp(math.log(fr["C"][i] * M[i]), np.log(fr["C"]), np.log(fr["arms"]["baseline"]["N_opt"]))
        if math.log(n_lo) < base_n < math.log(n_hi):
            assert within["M"]["M"][i] == pytest.approx(M[i], rel=2e-3)
    for name in ("largest_rung", "largest_budget"):
        cells = fr["rollout"][name]["cells"]
        assert len(cells) == (6 if name == "largest_rung" else 8)  # 3 budgets or 4 rungs, two arms
        assert sum(c["inside"] for c in cells) >= len(cells) // 2  # the planted law predicts them (sigma = 0.002)
        for c in cells:
            lo_c, hi_c = c["prediction_interval95"]
            assert lo_c < c["predicted"] < hi_c
            assert abs(c["measured"] / c["predicted"] - 1) < 0.005


def test_too_few_cells_give_a_reason_and_the_length_report_carries_the_frontier(tmp_path, capsys):
    df = synthetic_budget_ladder(LAWS, n_sizes=2, seeds=(0, 1), sigma=0.002, rng=12)
    assert "error" in analyse_frontier(df[df["budget"] == 128], B=5)
    df.to_csv(tmp_path / "results.csv", index=False)
    args = ["length", "--results", str(tmp_path / "results.csv"), "--out", str(tmp_path / "o")]
    assert main([*args, "--bootstrap", "20", "--frontier-bootstrap", "10"]) == 0
    doc = json.loads((tmp_path / "o" / "length.json").read_text())
    assert "error" not in doc["frontier"]
    assert doc["frontier"]["rollout"]["largest_rung"]["error"]  # one rung left: no law over N
    assert "fig_frontier.png" in doc["files"]
    assert (tmp_path / "o" / "fig_frontier.png").exists()
    assert "## The compute-optimal frontier" in (tmp_path / "o" / "length_summary.md").read_text()
    out = capsys.readouterr().out
    assert "frontier: baseline's compute to reach block_attnres's frontier loss" in out
    assert "frontier with N inside the measured rungs (no extrapolation): M(" in out
    assert "With N kept inside the measured rungs" in (tmp_path / "o" / "length_summary.md").read_text()
