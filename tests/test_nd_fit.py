"""Fits over parameters and tokens (analysis.nd_fit, Chinchilla's approach 3) and the gain per rung by training
length (analysis.training_length), on multi-budget studies drawn from planted laws (tests/synthetic_records.py)."""

from __future__ import annotations

import json

import pytest
from synthetic_records import synthetic_budget_ladder, synthetic_ladder

from analysis.__main__ import main
from analysis.nd_fit import NDOptions, nd_fit
from analysis.training_length import gain_by_length

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
    assert main(["length", "--results", str(tmp_path / "results.csv"), "--out", str(tmp_path / "o")]) == 0
    doc = json.loads((tmp_path / "o" / "length.json").read_text())
    assert len(doc["rows"]) == 6
    assert "fig_length.png" in doc["files"]


def test_fit_nd_adds_the_section(tmp_path):
    df = synthetic_budget_ladder(LAWS, n_sizes=3, seeds=(0, 1), rng=13)
    df.to_csv(tmp_path / "results.csv", index=False)
    args = ["fit", "--results", str(tmp_path / "results.csv"), "--out", str(tmp_path / "o"), "--no-figures"]
    assert main([*args, "--bootstrap", "20", "--nd"]) == 0
    doc = json.loads((tmp_path / "o" / "fit.json").read_text())
    assert set(doc["nd_fit"]["arms"]) == {"baseline", "block_attnres"}
    assert "## Fit over parameters and tokens" in (tmp_path / "o" / "summary.md").read_text()
