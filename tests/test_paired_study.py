"""analysis.studies.paired_study: a condition study from its axes alone (cells, condition, arms), every number from
analysis.laws.paired; and a new condition study as one study file."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.__main__ import run
from analysis.laws.paired import cell_heterogeneity
from analysis.studies.paired_study import PairedOptions, analyse_paired, headline_lines, paired_markdown, write_paired

SEEDS = ((0, 0.01), (1, -0.02), (2, 0.03))


def _runs(effect: dict[tuple[int, int], float], seq_len: int = 128, offset: float = 0.0) -> pd.DataFrame:
    """Both arms per (n_layers, seq_len) cell and seed: Block - baseline = effect + 0.001 seed."""
    rows = []
    for (n_layers, s), gain in effect.items():
        for seed, noise in SEEDS:
            base = 3.0 - 0.1 * n_layers + noise + offset
            common = {"n_layers": n_layers, "d_model": 2 * n_layers, "seq_len": s, "seed": seed}
            rows.append(common | {"variant": "baseline", "val_loss": base})
            rows.append(common | {"variant": "block_attnres", "val_loss": base + gain + 0.001 * seed})
    return pd.DataFrame(rows).assign(lr_protocol="baseline")


def test_effects_interaction_and_heterogeneity_recover_planted_values(tmp_path):
    runs = pd.concat(
        [_runs({(8, 128): 0.05, (10, 128): -0.01}), _runs({(8, 512): -0.02, (10, 512): -0.04, (12, 512): -0.05})]
    )
    with pytest.warns(UserWarning, match="only one of 128 / 512 .*n_layers=12"):
        doc = analyse_paired(runs, PairedOptions(condition="seq_len"))
    assert doc["levels"] == [128, 512]
    assert doc["arms"] == ["block_attnres"]
    inter = doc["interactions"]
    assert inter["n_layers"].tolist() == [8, 10]  # the cells both values hold
    assert inter["delta_128"].tolist() == pytest.approx([0.051, -0.009])
    assert inter["delta_512"].tolist() == pytest.approx([-0.019, -0.039])
    assert inter["interaction"].tolist() == pytest.approx([0.07, 0.03])
    assert inter["verdict_128"].tolist() == ["loses", "wins"]
    effects = doc["effects"]
    assert len(effects[effects["condition"] == 512]) == 3  # each value's own table keeps its own cells
    # the planted effects differ by far more than the per-seed spread (0.001): one effect over the cells is rejected
    het = {h["condition"]: h for h in doc["heterogeneity"]}
    assert het[512]["n_cells"] == 3
    assert het[512]["p"] < 1e-4
    md = paired_markdown(doc)
    assert "| 8 | 16 | 0,1,2 | 2.207 / 2.207 | +0.0510" in md
    lines = headline_lines(doc)
    assert lines[0].startswith("block_attnres − baseline under 128: wins 1, loses 1, undecided 0 of 2 cells")
    assert "Δ 128 − Δ 512 below 0 in 0, above 0 in 2 of 2 cells" in lines[-1]
    files = write_paired(doc, tmp_path)
    assert [f.name for f in files] == ["fig_paired.png", "paired.csv", "paired.json", "paired.md"]
    assert files[0].stat().st_size > 5000
    assert json.loads(files[2].read_text())["interactions"][0]["interaction"] == pytest.approx(0.07)


def test_one_effect_everywhere_is_not_rejected_and_a_lone_pair_is_left_out():
    rng = np.random.default_rng(0)
    rows = []
    for n_layers in (8, 10, 12):
        for seed in range(6):
            base = 2.0 + rng.normal(0, 0.01)
            rows += [
                {"variant": "baseline", "n_layers": n_layers, "seed": seed, "val_loss": base},
                {
                    "variant": "block_attnres",
                    "n_layers": n_layers,
                    "seed": seed,
                    "val_loss": base - 0.02 + rng.normal(0, 0.005),
                },
            ]
    rows += [{"variant": v, "n_layers": 16, "seed": 0, "val_loss": 1.5} for v in ("baseline", "block_attnres")]
    h = cell_heterogeneity(pd.DataFrame(rows), "baseline", "block_attnres", ["n_layers"])
    assert h["n_cells"] == 3
    assert h["cells_left_out"] == ["n_layers=16"]
    assert h["p"] > 0.05


def test_without_a_condition_each_cell_is_one_comparison(tmp_path):
    doc = analyse_paired(_runs({(8, 128): -0.03, (10, 128): -0.01}), PairedOptions(cells=("n_layers",)))
    assert doc["levels"] == [None]
    assert doc["interactions"].empty
    assert doc["effects"]["delta"].tolist() == pytest.approx([-0.029, -0.009])
    assert "| 8 | 0,1,2 |" in paired_markdown(doc)
    assert write_paired(doc, tmp_path)[0].stat().st_size > 5000


def test_a_missing_axis_or_no_pair_fails_in_one_line(tmp_path):
    table = tmp_path / "runs.csv"
    _record_table(_runs({(8, 128): 0.0})).to_csv(table, index=False)
    rc, _ = run(["paired", "--results", str(table), "--condition", "context", "--out", str(tmp_path / "o")])
    assert rc == 2
    assert not (tmp_path / "o").exists()
    with pytest.raises(ValueError, match="no cell holds both baseline and one of nope"):
        analyse_paired(_runs({(8, 128): 0.0}), PairedOptions(arms=("nope",)))


def _record_table(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` as a results table the loader reads (the columns a completed record must have)."""
    return runs.assign(
        run_id=[f"r{i}" for i in range(len(runs))],
        size=[f"deep_L{n}" for n in runs["n_layers"]],
        status="completed",
        pflops_days=1e-9,
        study="cpu_context",
    )


def test_a_new_condition_study_is_one_study_file(tmp_path, capsys):
    """A user's "Block vs baseline at context 128 against 512": a study file naming the paired command and its
    condition, no module; its analysis runs through sweeps.study's own argv."""
    from experiments.config.compose import conf_dir
    from sweeps.study import analysis_argv
    from sweeps.study_spec import load_studies

    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "deep_context.yaml").write_text(
        "sweep: cpu_deep\n"
        "what: Block AttnRes against the baseline at context 128 and 512\n"
        "overrides: [study=cpu_deep_context]\n"
        "passes: [[size.seq_len=128], [size.seq_len=512, size.batch_size=1]]\n"
        "analysis: paired\n"
        "analysis_args: [--condition, seq_len]\n"
    )
    study = load_studies(tmp_path / "studies", Path(conf_dir()))["deep_context"]
    runs = pd.concat([_runs({(8, 128): -0.03, (10, 128): -0.02}), _runs({(8, 512): -0.05, (10, 512): -0.04}, 512)])
    table = tmp_path / "results.csv"
    _record_table(runs).to_csv(table, index=False)
    argv = analysis_argv(study, "scaling", str(table), str(tmp_path / "report"), args=list(study.analysis_args))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one study's two contexts are not duplicate cells
        rc, doc = run(argv)
    assert rc == 0
    assert doc["condition"] == "seq_len"
    assert doc["levels"] == [128, 512]
    assert [r["interaction"] for r in doc["interactions"]] == pytest.approx([0.02, 0.02])
    assert (tmp_path / "report" / "paired.md").is_file()
    assert "Δ 128 − Δ 512" in capsys.readouterr().out
