"""Fig. 6 (laws.fixed_shape.block_size_sweep, studies.block_size) and Table 4 (laws.fixed_shape.ablation_table,
studies.ablations) on hand-made result tables: same-seed pairs, the references drawn from other studies at the same
shape, lr protocol and seeds only, the paper's order and numbers, the t intervals, the verdicts, the figures' data and
the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.__main__ import main as analysis_main
from analysis.laws import fixed_shape
from analysis.laws import paired as seed_stats
from analysis.render import figures
from analysis.studies import block_size

SEEDS = (0, 1, 2)
SEED_OFFSET = {0: 0.0, 1: 0.03, 2: -0.02}  # noise every arm of a seed shares: pairs cancel it


def _run(study, kind, variant, seed, loss, size="deep_L16", block=None, protocol="baseline"):
    return {
        "run_id": f"{variant}_{size}_s{seed}_{study}_{protocol}_{block}",
        "study": study,
        "study_kind": kind,
        "variant": variant,
        "seed": seed,
        "val_loss": loss + SEED_OFFSET.get(seed, 0.0),
        "size": size,
        "block_size": block,
        "lr_protocol": protocol,
        "status": "completed",
        "n_layers": 16,
        "d_model": 32,
        "tokens": 800.0,
        "params_non_embedding": 100.0,
    }


def _block_size_table() -> pd.DataFrame:
    rows = []
    for s in SEEDS:
        jitter = 0.001 * s
        rows += [_run("bs", "block_size", "block_attnres", s, 1.40 + 0.004 * S + jitter, block=S) for S in (1, 2, 8)]
        # The ladder's own runs: the references and the S = 4 point the sweep skipped.
        rows += [_run("deep", "scaling", "baseline", s, 1.50), _run("deep", "scaling", "full_attnres", s, 1.39)]
        rows.append(_run("deep", "scaling", "block_attnres", s, 1.42 + jitter, block=4))
        # Not the sweep's: another lr protocol, another seed, another size.
        rows.append(_run("deep", "scaling", "baseline", s, 9.0, protocol="per_arm"))
        rows.append(_run("deep", "scaling", "full_attnres", s, 9.0, size="deep_L8"))
    rows.append(_run("deep", "scaling", "baseline", 20, 9.0))
    return pd.DataFrame(rows)


def test_t_interval_is_students_with_n_minus_1_degrees_of_freedom():
    x = np.array([0.1, 0.3, 0.2, 0.6])
    lo, hi = seed_stats.t_interval(x)
    half = stats.t.ppf(0.975, 3) * x.std(ddof=1) / 2
    assert lo == pytest.approx(x.mean() - half)
    assert hi == pytest.approx(x.mean() + half)
    assert all(math.isnan(v) for v in seed_stats.t_interval(np.array([1.0])))


def test_verdicts_follow_the_interval():
    assert seed_stats.verdict([-0.03, -0.01], 3) == "wins"
    assert seed_stats.verdict([0.01, 0.03], 3) == "loses"
    assert seed_stats.verdict([-0.01, 0.03], 3) == "undecided"
    assert seed_stats.verdict(None, 1) == "undecided"
    assert seed_stats.verdict(None, 0) == "missing"


def test_block_size_pairs_seeds_and_takes_references_from_the_same_shape_only():
    sw = fixed_shape.block_size_sweep(_block_size_table())
    assert sw is not None
    assert [p["block_size"] for p in sw["points"]] == [1, 2, 4, 8]  # S = 4 from the ladder's study
    assert sw["baseline"]["n_runs"] == 3  # not the per_arm runs, nor seed 20
    assert sw["baseline"]["val_loss"] == pytest.approx(1.50 + np.mean(list(SEED_OFFSET.values())))
    assert sw["full"]["n_runs"] == 3  # not deep_L8's
    p8 = sw["points"][-1]
    # The seeds' shared offsets cancel in the pairs: arm - baseline = 1.432 + 0.001 s - 1.50.
    assert p8["vs_baseline"]["delta"] == pytest.approx(1.432 + 0.001 - 1.50)
    assert p8["vs_baseline"]["delta_ci95"][1] < 0
    assert p8["vs_baseline"]["verdict"] == "wins"
    assert p8["vs_full"]["verdict"] == "loses"
    assert p8["vs_baseline"]["pair_seeds"] == list(SEEDS)
    assert sw["n_sublayers"] == 32
    assert sw["tokens_per_param"] == pytest.approx(8.0)


def test_block_size_rejects_two_runs_of_one_seed():
    df = _block_size_table()
    df = pd.concat([df, df[(df["study"] == "bs") & (df["seed"] == 0)].head(1)])
    with pytest.raises(ValueError, match="several completed runs of seed"):
        fixed_shape.block_size_sweep(df)


def test_block_size_report_figure_and_verdict(tmp_path):
    doc = block_size.analyse_block_size(_block_size_table(), tmp_path)
    assert (tmp_path / "fig6_block_size.png").is_file()
    saved = json.loads((tmp_path / "block_size.json").read_text())
    assert saved["points"][0]["vs_baseline"]["verdict"] == "wins"
    assert "S in {1, 2, 4, 8} beat the baseline" in doc["verdict"]
    assert "the paper's ordering is seen" in doc["verdict"]  # S = 8 loses to Full at 95%
    table = (tmp_path / "block_size_summary.md").read_text()
    assert "| 1 (= Full) | 3 |" in table
    assert "| 2 | 3 |" in table
    assert "1.746 | -0.020 |" in table  # the paper's S = 2 loss and its difference from the paper's baseline


def _ablation_table_frame() -> pd.DataFrame:
    effects = {"laurel": 0.01, "mhc": -0.02, "full_sigmoid": -0.01, "denseformer": 0.0, "block_multihead": -0.03}
    rows = []
    for s in SEEDS:
        rows += [_run("abl", "ablations", v, s, 1.70 + e + 0.002 * s, size="deep_L12") for v, e in effects.items()]
        rows.append(_run("deep", "scaling", "baseline", s, 1.70, size="deep_L12"))
        rows.append(_run("deep", "scaling", "full_attnres", s, 1.68 + 0.001 * s, size="deep_L12"))
        rows.append(_run("deep", "scaling", "full_attnres", s, 9.0, size="deep_L12", protocol="per_arm"))
    return pd.DataFrame(rows)


def test_ablation_rows_follow_the_papers_order_with_its_numbers():
    table = fixed_shape.ablation_table(_ablation_table_frame())
    assert table is not None
    order = [r["variant"] for r in table]
    assert order == ["baseline", "denseformer", "mhc", "laurel", "full_attnres", "full_sigmoid", "block_multihead"]
    by = {r["variant"]: r for r in table}
    assert by["baseline"]["delta_vs_baseline"] is None
    assert by["mhc"]["delta_vs_baseline"] == pytest.approx(-0.02 + 0.002)
    assert by["mhc"]["verdict"] == "wins"
    assert by["laurel"]["verdict"] == "loses"
    assert by["laurel"]["paper_loss"] is None  # the paper does not report LAuReL
    assert by["mhc"]["paper_delta"] == pytest.approx(1.747 - 1.766)
    assert by["full_attnres"]["n_runs"] == 3  # its own-lr runs are another protocol
    assert "study deep" in by["full_attnres"]["note"]


def test_ablation_report_figure_and_cli(tmp_path, capsys):
    results = tmp_path / "results.csv"
    _ablation_table_frame().to_csv(results, index=False)
    assert analysis_main(["ablations", "--results", str(results), "--out", str(tmp_path / "out")]) == 0
    doc = json.loads((tmp_path / "out" / "ablations.json").read_text())
    assert (tmp_path / "out" / "fig_table4_ablations.png").is_file()
    assert "4 beat it" in doc["verdict"]  # mhc, full, full_sigmoid, block_multihead
    assert "1 lose to it (laurel)" in doc["verdict"]
    md = (tmp_path / "out" / "table4_ablations.md").read_text()
    assert md.count("\n| ") == 1 + 7  # the header and 7 arms (the rule line starts "|---")
    assert analysis_main(["block-size", "--results", str(results), "--out", str(tmp_path / "bs")]) == 2
    assert "no block-size study" in capsys.readouterr().err


def test_ablation_figure_draws_every_arm_and_the_papers_deltas(tmp_path, monkeypatch):
    drawn = {}
    real = figures.plt.Axes.errorbar

    def spy(self, x, y, *a, **k):
        drawn["x"], drawn["y"] = np.asarray(x), np.asarray(y)
        return real(self, x, y, *a, **k)

    monkeypatch.setattr(figures.plt.Axes, "errorbar", spy)
    table = fixed_shape.ablation_table(_ablation_table_frame())
    figures.ablation_figure(table, tmp_path / "fig")
    expected = [r["delta_vs_baseline"] for r in table if r["delta_vs_baseline"] is not None]
    assert drawn["x"] == pytest.approx(expected)
    assert len(drawn["y"]) == 6


def test_an_arm_that_failed_to_train_is_marked_at_the_edge_not_stretching_the_axis(tmp_path, monkeypatch):
    df = _ablation_table_frame()
    broken = df[df["variant"] == "laurel"].assign(variant="full_sliding_window")
    broken["val_loss"] += 0.7
    df = pd.concat([df, broken], ignore_index=True)
    df["run_id"] = [f"r{i}" for i in range(len(df))]
    table = fixed_shape.ablation_table(df)
    limits = {}
    real = figures.plt.Figure.savefig

    def spy(self, *a, **k):
        ax = self.axes[0]
        limits["x"] = ax.get_xlim()
        limits["texts"] = [t.get_text() for t in ax.texts]
        return real(self, *a, **k)

    monkeypatch.setattr(figures.plt.Figure, "savefig", spy)
    figures.ablation_figure(table, tmp_path / "fig")
    assert limits["x"][1] < 0.2
    assert limits["texts"] == ["+0.71"]  # laurel's +0.01, shifted by 0.7
