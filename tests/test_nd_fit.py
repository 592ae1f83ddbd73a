"""Fits over parameters and tokens (analysis.laws.nd_fit, Chinchilla's approach 3) and the gain per rung by training
length (studies.training_length), on multi-budget studies drawn from planted laws (tests/synthetic_records.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from synthetic_records import synthetic_budget_ladder, synthetic_ladder

from analysis.__main__ import main
from analysis.laws.nd_fit import NDOptions, law_terms, nd_fit
from analysis.studies.training_length import analyse_length, budget_points, gain_by_length, headline_lines

LAWS = {"baseline": (1.8, 40.0, 0.3, 60.0, 0.28), "block_attnres": (1.8, 30.0, 0.3, 60.0, 0.28)}


def test_a_planted_chinchilla_law_is_recovered_with_intervals_that_hold_it():
    df = synthetic_budget_ladder(LAWS, seeds=(0, 1, 2), sigma=0.002, rng=11)
    nd = nd_fit(df, NDOptions(B=30))
    for arm, (E, _, alpha, _, beta) in LAWS.items():
        e = nd["arms"][arm]
        assert e.get("error") is None
        assert e["n_runs"] == 36
        assert e["E"] == pytest.approx(E, abs=0.05)
        assert e["alpha"] == pytest.approx(alpha, abs=0.03)
        assert e["beta"] == pytest.approx(beta, abs=0.02)
        assert e["E"] <= df[df["variant"] == arm]["val_loss"].min()  # E bounded by the lowest observed loss
        for k, truth in (("E", E), ("alpha", alpha), ("beta", beta)):
            lo, hi = e[f"{k}_ci95"]  # three seeds, 30 replicates: the truth within twice the interval
            assert lo < e[k] < hi
            assert abs(e[k] - truth) < (hi - lo), (arm, k, lo, truth, hi)
    assert nd["arms"]["block_attnres"]["A"] < nd["arms"]["baseline"]["A"]


def test_an_E_the_log_sum_exp_fit_only_approaches_zero_with_is_zero():
    """Below E_FLOOR nats E is its lower bound 0 (where the solver leaves it is the BLAS's), above it itself."""
    theta = np.array([0.0, 0.3, 0.0, 0.3, math.log(1e-12)])
    assert law_terms(theta, 1e5, 1e6)["E"] == 0.0
    theta[4] = math.log(0.5)
    assert law_terms(theta, 1e5, 1e6)["E"] == pytest.approx(0.5, rel=1e-12)


def test_a_ladder_at_one_tokens_per_parameter_gets_a_reason_not_a_fit():
    df = synthetic_ladder(seeds=(0, 1))
    df["tokens"] = 8 * df["params_non_embedding"]  # every rung at 8 tokens per parameter, as the CPU ladders
    nd = nd_fit(df, NDOptions(B=5))
    assert all("D proportional to N" in e["error"] for e in nd["arms"].values())


def test_the_gain_per_rung_and_budget_has_t_intervals(tmp_path):
    # block's A is smaller: its gain A_b/N^alpha - A_v/N^alpha is fixed per rung, so Delta is the same at every budget
    df = synthetic_budget_ladder(LAWS, n_sizes=2, seeds=(0, 1, 2, 3), sigma=0.002, rng=12)
    t = gain_by_length(df)
    assert list(t["tokens_per_param"]) == [8.0, 32.0, 128.0] * 2
    assert set(t["n_pairs"]) == {4}
    for r in t.itertuples():
        truth = -10.0 / r.params_non_embedding**0.3
        lo, hi = r.delta_ci95
        assert lo < truth < hi
        assert r.verdict == "wins"
    # without the budget column the ratio tokens / params_non_embedding stands in
    assert list(gain_by_length(df.drop(columns=["budget"]))["tokens_per_param"]) == list(t["tokens_per_param"])
    # the command: JSON, Markdown and the figure
    df.to_csv(tmp_path / "results.csv", index=False)
    args = ["length", "--results", str(tmp_path / "results.csv"), "--out", str(tmp_path / "o")]
    assert main([*args, "--no-fit"]) == 0
    doc = json.loads((tmp_path / "o" / "length.json").read_text())
    assert len(doc["rows"]) == 6
    assert "fig_length.png" in doc["files"]
    assert "fit" not in doc
    assert not (tmp_path / "o" / "fit").exists()


def test_the_length_report_fits_every_rung_and_budget_as_one_compute_point(tmp_path, capsys):
    # block's A is 3/4 of the baseline's: it wins at every point, so the multiplier over the points is above 1
    df = synthetic_budget_ladder(LAWS, n_sizes=2, seeds=(0, 1, 2), sigma=0.002, rng=14)
    points = budget_points(df)
    assert sorted(points["size"].unique()) == sorted(f"{s}@{b:g}" for s in df["size"].unique() for b in (8, 32, 128))
    assert list(points["rung"]) == list(df["size"])
    df.to_csv(tmp_path / "results.csv", index=False)
    args = ["length", "--results", str(tmp_path / "results.csv"), "--out", str(tmp_path / "o"), "--no-figures"]
    assert main([*args, "--bootstrap", "40"]) == 0
    doc = json.loads((tmp_path / "o" / "length.json").read_text())
    fit = doc["fit"]
    assert fit["dir"] == "fit"
    assert "fit/" in doc["files"]
    assert fit["m"] > 1
    assert fit["m_ci95"][0] > 1
    held_out = {p["size"] for p in fit["rollout_points"]}  # the largest compute point: top rung, top budget
    top = df.loc[df["params_non_embedding"].idxmax(), "size"]
    assert held_out == {f"{top}@128"}
    lo, hi = fit["e_sensitivity_m_range"]
    assert lo <= fit["m"] <= hi
    fitted = json.loads((tmp_path / "o" / "fit" / "fit.json").read_text())
    assert set(fitted["nd_fit"]["arms"]) == {"baseline", "block_attnres"}
    out = capsys.readouterr().out
    assert "compute multiplier over the (rung, budget) points" in out
    assert "rollout:" in out
    assert "Compute fit over the (rung, budget) points" in (tmp_path / "o" / "length_summary.md").read_text()


def test_too_few_points_for_a_fit_leave_the_differences_and_say_why(tmp_path):
    df = synthetic_budget_ladder(LAWS, n_sizes=2, seeds=(0, 1), sigma=0.002, rng=15)
    one_budget = df[df["budget"] == 128]  # two points per arm: no ladder fit
    doc = analyse_length(one_budget, tmp_path / "o", make_figures=False, bootstrap=20)
    assert len(doc["rows"]) == 2
    assert "error" in doc["fit"]
    assert "fit/" not in doc["files"]
    assert any("n/a" in line for line in headline_lines(doc))


def test_fit_nd_adds_the_section(tmp_path):
    df = synthetic_budget_ladder(LAWS, n_sizes=3, seeds=(0, 1), rng=13)
    df.to_csv(tmp_path / "results.csv", index=False)
    args = ["fit", "--results", str(tmp_path / "results.csv"), "--out", str(tmp_path / "o"), "--no-figures"]
    assert main([*args, "--bootstrap", "20", "--nd"]) == 0
    doc = json.loads((tmp_path / "o" / "fit.json").read_text())
    assert set(doc["nd_fit"]["arms"]) == {"baseline", "block_attnres"}
    assert "## Fit over parameters and tokens" in (tmp_path / "o" / "summary.md").read_text()
