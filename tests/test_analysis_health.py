"""The outlier rule (analysis.health) and how the analysis reports it; the two learning-rate protocols."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from synthetic_records import synthetic_ladder

from analysis import health
from analysis.io.runs import OWN_LR, AnalysisWarning
from analysis.laws.fit_options import FitOptions
from analysis.laws.scaling_ladder import analyse_scaling, flag_runs
from analysis.render.fit_report import run_fit

TOTAL = 1000


def _curve(rng: np.random.Generator, spike_at: int | None = None, plateau: bool = False, noise: float = 0.08):
    """A healthy small-batch run's metrics: train loss every 10 steps (batch noise), val loss every 100."""
    steps = np.arange(10, TOTAL + 1, 10)
    clean = 1.7 + 2.5 * np.exp(-steps / 150) + 0.4 * (1 - steps / TOTAL)
    if plateau:
        clean = np.where(steps > 300, clean[steps == 300][0], clean)
    train = clean * (1 + noise * rng.standard_normal(steps.size))
    if spike_at is not None:  # an instability: the loss jumps 2x and takes ~100 steps to come back
        after = (steps >= spike_at) & (steps < spike_at + 100)
        train[after] *= 1 + 1.2 * np.exp(-(steps[after] - spike_at) / 60)
    val_steps = np.arange(100, TOTAL + 1, 100)
    val = np.interp(val_steps, steps, clean) - 0.02
    return steps, train, val_steps, val


def test_clean_runs_are_not_flagged() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        assert health.curve_flags(*_curve(rng), TOTAL) == []


def test_planted_spike_is_caught_with_its_step() -> None:
    rng = np.random.default_rng(1)
    assert health.curve_flags(*_curve(rng, spike_at=600), TOTAL) == ["spike@600"]


def test_one_hard_batch_is_not_a_spike() -> None:
    """A single batch of unusual text (seen at 512-token batches: 1.7x the running median, the next batch back to
    normal) is data, not an instability."""
    steps, train, vs, val = _curve(np.random.default_rng(6))
    train = train.copy()
    train[steps == 620] *= 1.8
    train[steps == 630] *= 1.25
    assert health.curve_flags(steps, train, vs, val, TOTAL) == []


def test_spike_during_warmup_is_not_a_spike() -> None:
    rng = np.random.default_rng(2)
    assert health.curve_flags(*_curve(rng, spike_at=50), TOTAL) == []


def test_validation_rise_is_a_spike() -> None:
    steps, train, vs, val = _curve(np.random.default_rng(3))
    val = val.copy()
    val[6] = val[5] * 1.05  # the eval at step 700 is 5% above the best before it
    assert health.curve_flags(steps, train, vs, val, TOTAL) == ["spike@700"]


def test_plateau_is_caught() -> None:
    assert health.curve_flags(*_curve(np.random.default_rng(4), plateau=True), TOTAL) == ["plateau"]


def test_off_seed_mates_flags_only_the_odd_run() -> None:
    assert health.off_seed_mates([2.000, 2.004, 2.100], sigma=0.005) == [False, False, True]
    assert health.off_seed_mates([2.000, 2.004, 2.010], sigma=0.005) == [False, False, False]
    assert health.off_seed_mates([2.000, 2.100], sigma=0.005) == [False, False]  # two runs: no odd one
    # the floor: a tiny pooled sd does not make 0.015 nats an outlier
    assert health.off_seed_mates([2.000, 2.001, 2.016], sigma=0.001) == [False, False, False]
    # robust pooled sd: one outlier cell does not inflate it
    assert health.pooled_seed_sd([[1, 1.01, 1.0], [2, 2.01, 2.0], [3, 3.3, 3.0]]) == pytest.approx(
        0.0058 / 0.83, rel=0.02
    )


def test_a_spike_shared_by_another_trajectory_on_the_same_batches_is_the_data_s() -> None:
    """Seen in the length study: every run of seed 21 (4 depths, 2 arms, several lrs) spiked at step 1880, where
    its batches held a stretch of hard text; a branch of the run's own trunk is no second witness."""
    orders = [(21, "fp"), (21, "fp"), (21, "fp"), (0, "fp"), (21, "other data"), (21, "fp")]
    trajectories = ["a", "b", "c", "d", "e", "a"]
    steps = [1880, 1890, 1880 + health.DATA_EVENT_STEPS + 20, 1880, 1880, 1880]
    assert health.data_events(steps, orders, trajectories) == [True, True, False, False, False, True]
    # the run alone with its own branch: not the data's
    assert health.data_events([700, 700], [(0, "fp")] * 2, ["t", "t"]) == [False, False]
    assert health.data_events([None, 700], [(0, "fp")] * 2, ["a", "b"]) == [False, False]


def test_analysis_does_not_flag_the_data_s_spikes_and_reports_them(tmp_path: Path) -> None:
    df = _ladder()
    both = (df["size"] == "cpu_s") & (df["seed"] == 1)  # both arms spike at one step on the same batches
    df.loc[both, "health"] = "spike@400"
    alone = (df["variant"] == "block_attnres") & (df["size"] == "cpu_m") & (df["seed"] == 0)
    df.loc[alone, "health"] = "spike@400"  # another seed's batches: its own spike
    df.attrs["source"] = "synthetic"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnalysisWarning)
        doc = run_fit(df, tmp_path, FitOptions(B=100), make_figures=False)
    assert [f["run_id"] for f in doc.outliers.flagged] == [df.loc[alone, "run_id"].item()]
    assert doc.outliers.data_spikes == [
        {"seed": 1, "step": 400, "last_step": 400, "n_runs": 2, "run_ids": sorted(df.loc[both, "run_id"])}
    ]
    assert doc.outliers.rule["data_event_steps"] == health.DATA_EVENT_STEPS
    summary = (tmp_path / "summary.md").read_text()
    assert "Not flagged, the data's" in summary
    assert "seed 1 at step 400 (2 runs)" in summary


def test_spikes_of_one_seed_that_chain_within_the_window_are_one_data_event(tmp_path: Path) -> None:
    """Seen in the length study: seed 22's runs spiked at steps 5480, 5490 and 5510, one stretch of hard text, not
    three events; a spike of the same seed further on is another event."""
    df = _ladder()
    s1 = (df["seed"] == 1).to_numpy().nonzero()[0]
    steps = [400, 400 + health.DATA_EVENT_STEPS, 400 + 2 * health.DATA_EVENT_STEPS, 2000, 2000 + 10]
    for i, step in zip(s1, steps):
        df.loc[df.index[i], "health"] = f"spike@{step}"
    df.attrs["source"] = "synthetic"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnalysisWarning)
        doc = run_fit(df, tmp_path, FitOptions(B=100), make_figures=False)
    events = [(e["seed"], e["step"], e["last_step"], e["n_runs"]) for e in doc.outliers.data_spikes]
    assert events == [(1, 400, 400 + 2 * health.DATA_EVENT_STEPS, 3), (1, 2000, 2010, 2)]
    assert f"seed 1 at step 400–{400 + 2 * health.DATA_EVENT_STEPS} (3 runs)" in (tmp_path / "summary.md").read_text()


def _ladder(seed: int = 0) -> pd.DataFrame:
    df = synthetic_ladder({"block_attnres": 1.2}, seeds=(0, 1, 2), sigma=0.004, rho=0.7, rng=seed)
    df["health"] = "ok"
    return df


def test_analysis_flags_a_planted_outlier_keeps_it_and_reports_the_fit_without_it() -> None:
    df = _ladder()
    hit = (df["variant"] == "baseline") & (df["size"] == "cpu_m") & (df["seed"] == 1)
    df.loc[hit, "val_loss"] += 0.15
    df.loc[(df["variant"] == "block_attnres") & (df["size"] == "cpu_s") & (df["seed"] == 0), "health"] = "spike@300"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = analyse_scaling(df, FitOptions(B=200))
    doc = fit.parts
    msgs = [str(w.message) for w in caught if issubclass(w.category, AnalysisWarning)]
    flagged = {f["run_id"]: f["flags"] for f in doc["outliers"]["flagged"]}
    assert flagged == {
        df.loc[hit, "run_id"].item(): "off_mates",
        df.loc[
            (df["variant"] == "block_attnres") & (df["size"] == "cpu_s") & (df["seed"] == 0), "run_id"
        ].item(): "spike@300",
    }
    assert any("outlier rule" in m and "off_mates" in m for m in msgs)
    assert any("seeds disagree: baseline at cpu_m" in m for m in msgs)
    assert doc["n_runs"] == len(df)  # kept, never silently dropped
    assert set(doc["without_flagged"]) == {"block_attnres"}
    frame = fit.runs
    assert (frame.loc[frame["run_id"] == df.loc[hit, "run_id"].item(), "flags"] == "off_mates").all()
    ex = analyse_scaling(df, FitOptions(B=200, outliers="exclude")).parts
    assert ex["n_runs"] == len(df) - 2
    assert {e["reason"] for e in ex["excluded_runs"]} == {
        "outlier rule: off_mates",
        "outlier rule: spike@300",
    }


def test_clean_ladder_flags_nothing() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        doc = analyse_scaling(_ladder(), FitOptions(B=200)).parts
    assert doc["outliers"]["flagged"] == []
    assert doc["outliers"]["cells_disagreeing"] == []
    assert "without_flagged" not in doc
    assert not [w for w in caught if "outlier" in str(w.message) or "disagree" in str(w.message)]


def test_paired_deltas_per_size() -> None:
    df = _ladder()
    doc = analyse_scaling(df, FitOptions(B=100)).parts
    rows = {r["size"]: r for r in doc["paired_deltas"]}
    assert list(rows) == ["cpu_xs", "cpu_s", "cpu_m", "cpu_l", "cpu_xl"]
    for size, r in rows.items():
        b = df[(df["variant"] == "baseline") & (df["size"] == size)].set_index("seed")["val_loss"]
        v = df[(df["variant"] == "block_attnres") & (df["size"] == size)].set_index("seed")["val_loss"]
        assert r["n_pairs"] == 3
        assert r["mean"] == pytest.approx((v - b).mean())
        assert r["sd"] == pytest.approx((v - b).std())
        assert r["mean"] < 0
    pr = doc["precision"]
    for size, sd in pr["baseline_seed_sd"].items():
        assert sd == pytest.approx(df[(df["variant"] == "baseline") & (df["size"] == size)]["val_loss"].std())
    assert pr["baseline_decreasing"] is True
    assert pr["baseline_rmse_log_runs"] == doc["variants"]["baseline"]["rmse_log"]
    lo, hi = doc["multipliers"]["block_attnres"]["m_ci95"]
    assert pr["m_half_width_over_m"]["block_attnres"] == pytest.approx(
        (hi - lo) / 2 / doc["multipliers"]["block_attnres"]["m"]
    )


def test_two_lr_protocols_give_both_multipliers_and_their_ratio(tmp_path: Path) -> None:
    """Block at the baseline's lr (m = 1.15) and at its own lr (m = 1.30): both recovered, ratio ~1.13 with an
    interval from the same bootstrap replicates."""
    df = synthetic_ladder({"block_attnres": 1.15, "own": 1.30}, seeds=(0, 1, 2), sigma=0.003, rho=0.7, rng=4)
    own = df["variant"] == "own"
    df.loc[own, "variant"] = "block_attnres"
    df.loc[own, "run_id"] = df.loc[own, "run_id"] + "-own"
    df["lr_protocol"] = np.where(own, "per_arm", "baseline")
    df["health"] = "ok"
    df.loc[df.index[own][0], "health"] = "spike@120"  # one flagged own-lr run: the fit without it is a refit
    df.attrs["source"] = "synthetic"
    doc = run_fit(df, tmp_path, FitOptions(B=400), make_figures=True)
    assert set(doc.multipliers) == {"block_attnres", "block_attnres" + OWN_LR}
    assert set(doc.without_flagged) == set(doc.multipliers)  # the refit does not rename the arms again
    p = doc.protocols["block_attnres"]
    assert p.shared_lr["m"] == pytest.approx(1.15, rel=0.05)
    assert p.own_lr["m"] == pytest.approx(1.30, rel=0.05)
    lo, hi = p.ratio_ci95
    assert lo < p.ratio_own_over_shared < hi
    assert lo < 1.30 / 1.15 < hi
    assert lo > 1.0
    summary = (tmp_path / "summary.md").read_text()
    assert "## Learning-rate protocols" in summary
    assert "own / shared" in summary
    assert json.loads((tmp_path / "fit.json").read_text())["protocols"]["block_attnres"]["ratio_ci95"] == pytest.approx(
        p.ratio_ci95
    )
    assert (tmp_path / "fig4_scaling.png").is_file()


def test_curve_flags_from_metrics_csv_for_records_without_health(tmp_path: Path) -> None:
    df = _ladder().drop(columns=["health"])
    row = df.index[0]
    run_dir = tmp_path / str(df.loc[row, "run_id"])
    run_dir.mkdir()
    steps, train, vs, val = _curve(np.random.default_rng(5), spike_at=500)
    m = pd.DataFrame({"step": steps, "train_loss": train, "val_loss": np.nan})
    m.loc[m["step"].isin(vs), "val_loss"] = val
    m.to_csv(run_dir / "metrics.csv", index=False)
    df.loc[row, "steps"] = TOTAL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnalysisWarning)
        flagged_df, flagged, _, _ = flag_runs(df, str(tmp_path))
    assert [f["flags"] for f in flagged] == ["spike@500"]
    assert flagged_df.loc[row, "flags"] == "spike@500"
