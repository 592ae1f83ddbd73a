"""studies.recipe and laws.wallclock: the recipe study's report on synthetic records drawn from known laws
(tests/synthetic_records.py, synthetic_recipe_study): a planted speed-up of the baseline, planted arm multipliers
under each recipe and the interaction they imply per rung are recovered within their intervals; the wall-clock
multiplier on a hand-computed example; one-line errors; failed runs never fitted; a degenerate study still
reports."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pandas as pd
import pytest
from synthetic_records import synthetic_ladder, synthetic_recipe_study, write_study

from analysis.__main__ import main
from analysis.laws.fit_options import FitOptions
from analysis.laws.wallclock import combine, wallclock_multiplier
from analysis.studies.recipe import RecipeOptions, analyse_recipe, run_recipe

SPEEDUP = 2.0  # the Muon + WSD baseline reaches the AdamW + cosine baseline's loss with half the compute
BLOCK = {"adamw+cosine": 1.15, "muon+wsd": 1.30}
S_REF, S_MUON = 1e-10, 1.25e-10  # seconds per FLOP: Muon's step 1.25x dearer at equal FLOPs


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


@pytest.fixture(scope="module")
def study():
    df = synthetic_recipe_study(
        {r: {"block_attnres": m} for r, m in BLOCK.items()},
        speedup=SPEEDUP,
        sigma=0.004,
        seconds_per_flop={("adamw+cosine", "*"): S_REF, ("muon+wsd", "*"): S_MUON},
        rng=3,  # one fixed draw: 95% intervals of 3-6 seeds miss now and then (draws 1-3 all within 2% of truth)
    )
    return df, _quiet(analyse_recipe, df, RecipeOptions(fit=FitOptions(B=300))).parts


def _covers(est: dict, truth: float) -> bool:
    lo, hi = est["m_ci95"]
    return lo <= truth <= hi


def test_the_planted_speedup_of_the_baseline_is_recovered(study):
    _, doc = study
    assert list(doc["seed_sets"]) == ["design", "held_out", "all"]
    for name, a in doc["baseline_recipe"].items():
        for est in ("joint", "paired"):
            assert _covers(a[est], SPEEDUP), (name, est, a[est])
            assert a[est]["m"] == pytest.approx(SPEEDUP, rel=0.02)
        assert a["n_runs"] == {"reference": 4 * len(doc["seed_sets"][name]), "arm": 4 * len(doc["seed_sets"][name])}
    # (d): time = compute x seconds per FLOP, so the clock gives back what Muon's dearer step costs
    a = doc["baseline_recipe"]["all"]
    t = a["timing"]["s_ref_over_s_arm"]
    assert t == pytest.approx(S_REF / S_MUON, rel=0.03)
    assert a["joint"]["m_wall"] == pytest.approx(a["joint"]["m"] * t)
    assert a["paired"]["m_wall"] == pytest.approx(a["paired"]["m"] * t)
    assert a["joint"]["m_wall"] == pytest.approx(SPEEDUP * S_REF / S_MUON, rel=0.06)
    assert a["timing"]["step_time_ratio"] == pytest.approx(1 / t)  # equal FLOPs per step: the same number
    assert a["timing"]["flops_per_step_ratio"] == pytest.approx(1.0)


def test_each_arm_is_fitted_against_the_baseline_of_its_own_recipe(study):
    _, doc = study
    for recipe, truth in BLOCK.items():
        for name, fits in doc["arms_vs_baseline"][recipe].items():
            block = fits["block_attnres"]
            for est in ("joint", "paired"):
                assert _covers(block[est], truth), (recipe, name, est, block[est])
                assert block[est]["m"] == pytest.approx(truth, rel=0.02)
                lo, hi = block[est]["m_ci95"]
                assert block[est]["half_width_pct"] == pytest.approx((hi - lo) / 2 / block[est]["m"] * 100)
    muon = doc["arms_vs_baseline"]["muon+wsd"]["all"]["block_attnres"]["joint"]["m"]
    adamw = doc["arms_vs_baseline"]["adamw+cosine"]["all"]["block_attnres"]["joint"]["m"]
    assert muon > adamw * 1.08  # the two recipes' baselines are not mixed up
    checks = {(h["comparison"], h["estimator"]) for h in doc["held_out_check"]}
    assert ("block_attnres vs baseline under muon+wsd", "joint") in checks
    assert len(checks) == 6  # (a) and Block under each recipe, joint and paired


def test_the_planted_interaction_is_recovered_per_rung(study):
    df, doc = study
    truth = df.groupby(["optimizer", "variant", "n_layers"])["true_loss"].first()
    rows = doc["interaction"]
    assert [r["n_layers"] for r in rows] == [2, 3, 4, 5]
    for r in rows:
        n = r["n_layers"]
        delta = {o: truth[(o, "block_attnres", n)] - truth[(o, "baseline", n)] for o in ("adamw", "muon")}
        planted = delta["muon"] - delta["adamw"]  # -0.042 at L_b 2 to -0.013 at L_b 5
        assert r["seeds"] == [0, 1, 2, 20, 21, 22]
        assert r["delta"]["adamw+cosine"]["delta"] == pytest.approx(delta["adamw"], abs=0.006)
        assert r["interaction"] == pytest.approx(planted, abs=0.008)
        lo, hi = r["interaction_ci95"]
        assert lo <= planted <= hi
        assert r["interaction_verdict"] == "gains more under muon+wsd"


def test_the_wallclock_multiplier_on_a_hand_computed_example():
    rows = [  # (variant, size, cpu_time_s, flops, steps, status)
        ("baseline", "r1", 10.0, 1e11, 100, "completed"),  # s = 1e-10
        ("baseline", "r1", 40.0, 1e11, 100, "completed"),  # s = 4e-10: geometric mean 2e-10
        ("block", "r1", 36.0, 1.2e11, 100, "completed"),  # s = 3e-10
        ("block", "r1", 36.0, 1.2e11, 100, "completed"),
        ("baseline", "r2", 10.0, 1e11, 100, "completed"),  # s = 1e-10
        ("baseline", "r2", 90.0, 1e11, 100, "completed"),  # s = 9e-10: geometric mean 3e-10
        ("block", "r2", 24.0, 1.2e11, 100, "completed"),  # s = 2e-10
        ("block", "r2", 6.0, 1.2e11, 100, "completed"),  # s = 0.5e-10: geometric mean 1e-10
        ("block", "r2", 9000.0, 1.2e11, 100, "failed"),  # never counted
        ("baseline", "r2", float("nan"), 1e11, 100, "completed"),  # no time recorded: not counted
    ]
    df = pd.DataFrame(rows, columns=["variant", "size", "cpu_time_s", "flops", "steps", "status"])
    w = wallclock_multiplier(df, "baseline", "block", 1.5, [1.2, 1.8])
    s_ref, s_arm = math.sqrt(2e-10 * 3e-10), math.sqrt(3e-10 * 1e-10)
    assert w["s_ref_over_s_arm"] == pytest.approx(s_ref / s_arm)  # sqrt(2) (arithmetic means would give 1.83)
    assert w["m_wall"] == pytest.approx(1.5 * s_ref / s_arm)  # 2.1213
    # step time (cpu_time_s / steps): r1 0.2 -> 0.36 (1.8x), r2 0.3 -> 0.12 (0.4x); FLOPs per step 1.2x
    assert w["step_time_ratio"] == pytest.approx(math.sqrt(1.8 * 0.4))
    assert w["flops_per_step_ratio"] == pytest.approx(1.2)
    assert w["m_wall"] == pytest.approx(1.5 / w["step_time_ratio"] * w["flops_per_step_ratio"])
    assert [p["rung"] for p in w["per_rung"]] == ["r1", "r2"]
    assert w["n_runs"] == {"reference": 4, "arm": 4}
    lo, hi = w["m_wall_ci95"]
    t, (t_lo, t_hi) = w["s_ref_over_s_arm"], w["s_ref_over_s_arm_ci95"]
    assert t_lo < t < t_hi
    assert lo == pytest.approx(w["m_wall"] * math.exp(-math.hypot(math.log(1.5 / 1.2), math.log(t / t_lo))))
    assert hi == pytest.approx(w["m_wall"] * math.exp(math.hypot(math.log(1.8 / 1.5), math.log(t_hi / t))))
    # the two intervals combined in log, each end apart: equal 25% half-widths give sqrt(2) x 25% in log
    c = combine(2.0, [1.6, 2.5], {"s_ref_over_s_arm": 0.5, "s_ref_over_s_arm_ci95": [0.4, 0.625]})
    assert c["m_wall"] == pytest.approx(1.0)
    assert c["m_wall_ci95"] == pytest.approx([math.exp(-math.sqrt(2) * math.log(1.25)), 1.25 ** math.sqrt(2)])
    assert combine(2.0, None, {"s_ref_over_s_arm": 0.5, "s_ref_over_s_arm_ci95": [0.4, 0.6]})["m_wall_ci95"] is None
    one = wallclock_multiplier(df[df["size"] == "r1"].iloc[[0, 2]], "baseline", "block", 1.5, [1.2, 1.8])
    assert one["m_wall"] == pytest.approx(1.5 * 1e-10 / 3e-10)
    assert one["m_wall_ci95"] is None  # one run per arm: no spread, no interval
    assert "one timed run only" in one["note"]
    assert "cpu_time_s" in wallclock_multiplier(df.drop(columns="cpu_time_s"), "baseline", "block", 1.5, None)["error"]


@pytest.mark.parametrize("drop", [["optimizer", "lr_schedule"], ["lr_schedule"]])
def test_missing_recipe_columns_are_one_line_naming_them(drop):
    df = synthetic_recipe_study(n_sizes=3, seeds=(0, 1)).drop(columns=drop)
    with pytest.raises(ValueError, match="a recipe study needs each run's optimizer and lr_schedule") as e:
        analyse_recipe(df)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"has no {' or '.join(drop)} column:" in msg  # names what is missing, and only that


def test_one_recipe_is_one_line_naming_the_missing_one(tmp_path, capsys):
    df = synthetic_recipe_study(n_sizes=3, seeds=(0, 1))
    only = df[df["optimizer"] == "adamw"]
    with pytest.raises(ValueError, match=r"none of muon\+wsd \(it holds adamw\+cosine \(\d+ run\(s\)\)\)"):
        _quiet(analyse_recipe, only)
    table = tmp_path / "results.csv"
    synthetic_ladder(n_sizes=3).to_csv(table, index=False)  # records of before the recipe fields
    assert main(["recipe", "--results", str(table), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("error: ")
    assert "has no optimizer or lr_schedule column" in err[0]


def test_failed_and_diverged_runs_are_never_fitted():
    df = synthetic_recipe_study(n_sizes=3, seeds=(0, 1), rng=4)
    opts = RecipeOptions(fit=FitOptions(B=100))
    clean = _quiet(analyse_recipe, df, opts).parts
    bad = df[(df["variant"] == "baseline") & (df["optimizer"] == "muon")].head(3).copy()
    bad["run_id"] = bad["run_id"] + "-bad"
    bad["status"] = ["failed", "diverged", "interrupted"]
    bad["val_loss"] = [0.5, np.nan, 9.0]  # a fitted failed run would move m far
    bad["cpu_time_s"] = 1e9
    bad["seed"] = [7, 8, 9]  # seeds of their own: as fitted runs they would form a seed set
    with_bad = _quiet(analyse_recipe, pd.concat([df, bad], ignore_index=True), opts).parts
    assert sorted(e["run_id"] for e in with_bad["excluded_runs"]) == sorted(bad["run_id"])
    assert with_bad["seed_sets"] == clean["seed_sets"]
    for name in clean["seed_sets"]:
        a, b = clean["baseline_recipe"][name], with_bad["baseline_recipe"][name]
        assert b["joint"]["m"] == a["joint"]["m"]
        assert b["timing"]["s_ref_over_s_arm"] == a["timing"]["s_ref_over_s_arm"]
        assert b["n_runs"] == a["n_runs"]


def test_a_one_rung_one_seed_study_reports_na_and_draws(tmp_path):
    df = synthetic_recipe_study(n_sizes=1, seeds=(0,))
    doc = _quiet(run_recipe, df, tmp_path, RecipeOptions(fit=FitOptions(B=50)))
    assert "error" in doc["baseline_recipe"]["design"]
    assert doc["baseline_recipe"]["design"]["timing"]["step_time_ratio"] == pytest.approx(1.25, rel=0.2)
    (row,) = doc["interaction"]
    assert row["interaction_ci95"] is None
    assert row["n_pairs"] == 1
    md = (tmp_path / "recipe_summary.md").read_text()
    for text in ("| n/a |", "needs at least 3 sizes", "one timed run only"):
        assert text in md
    json.loads((tmp_path / "recipe.json").read_text())
    for fig in ("fig_recipe_interaction.png", "fig_recipe_baseline.png"):
        assert (tmp_path / fig).stat().st_size > 5000


def test_the_command_reads_a_study_directory(tmp_path, capsys):
    df = synthetic_recipe_study(n_sizes=3, seeds=(0, 1, 2, 20), rng=2)
    write_study(tmp_path / "study", df, curves=False, diagnostics=False, extra_studies=False, failed=True)
    out = tmp_path / "report"
    argv = ["recipe", "--results", str(tmp_path / "study"), "--out", str(out), "--bootstrap", "60", "--no-figures"]
    assert _quiet(main, [*argv, "--seeds", "0,1,2"]) == 0
    doc = json.loads((out / "recipe.json").read_text())
    assert doc["seed_sets"] == {"design": [0, 1, 2]}  # --seeds left seed 20 out
    assert doc["files"] == ["recipe.json", "recipe_summary.md"]
    assert [e["status"] for e in doc["excluded_runs"]] == ["diverged"]
    printed = capsys.readouterr().out
    assert "(a) baseline muon+wsd vs adamw+cosine, design: m = " in printed


def test_steady_state_step_time_is_used_only_when_every_stratum_has_it_and_timing_runs_supply_it():
    from analysis.laws.wallclock import time_ratio

    rows = [  # (variant, size, cpu_time_s incl. compilation, step_cpu_s, flops, steps)
        ("baseline", "r1", 50.0, 0.10, 1e11, 100),
        ("block", "r1", 90.0, 0.30, 1e11, 100),
        ("baseline", "r2", 50.0, None, 1e11, 100),
        ("block", "r2", 60.0, 0.20, 1e11, 100),
    ]
    df = pd.DataFrame(rows, columns=["variant", "size", "cpu_time_s", "step_cpu_s", "flops", "steps"])
    mixed = time_ratio(df, "baseline", "block")  # r2's baseline has no steady-state time: whole cpu_time_s for all
    assert mixed["time_source"].startswith("cpu_time_s")
    assert mixed["step_time_ratio"] == pytest.approx(math.sqrt(90 / 50 * 60 / 50))
    timing = pd.DataFrame([("baseline", "r2", 70.0, 0.25, 1e11, 100)], columns=df.columns)
    steady = time_ratio(pd.concat([df, timing]), "baseline", "block")  # a timing re-run fills the stratum
    assert steady["time_source"].startswith("step_cpu_s")
    assert steady["step_time_ratio"] == pytest.approx(math.sqrt(0.30 / 0.10 * 0.20 / 0.25))


def test_timing_runs_enter_the_time_ratios_and_are_never_fitted(study):
    df, parts = study
    timing = df[(df["seed"] == 0) & (df["recipe"] == "adamw+cosine")].copy() if "recipe" in df else None
    if timing is None:
        timing = df[(df["seed"] == 0) & (df["optimizer"] == "adamw")].copy()
    timing["val_loss"] = timing["val_loss"] + 1.0  # a fit that read them would move
    timing["cpu_time_s"] = timing["cpu_time_s"] * 3.0  # the AdamW arms' time triples where they are read
    with_timing = _quiet(analyse_recipe, df, RecipeOptions(fit=FitOptions(B=300)), timing).parts
    assert with_timing["timing_runs"] == len(timing)
    e0, e1 = parts["baseline_recipe"]["all"], with_timing["baseline_recipe"]["all"]
    assert e1["joint"]["m"] == pytest.approx(e0["joint"]["m"])  # not fitted
    assert e1["timing"]["step_time_ratio"] < e0["timing"]["step_time_ratio"]  # but timed: AdamW's time grew
