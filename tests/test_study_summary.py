"""sweeps.study_summary: a study's report as one W&B run in the study's group, offline without a key."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from sweeps.study_summary import log_study_summary, report_files


def _report(tmp_path):
    report = tmp_path / "report"
    (report / "fit").mkdir(parents=True)
    (report / "paired.csv").write_text("n_layers,delta\n8,-0.03\n10,-0.02\n")
    (report / "paired.md").write_text("| n_layers | Δ |\n|---|---|\n| 8 | -0.03 |\n")
    (report / "sweep.log").write_text("not a report file\n")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    fig.savefig(report / "fit" / "fig_scaling.png")
    plt.close(fig)
    return report


def test_the_report_files_are_its_tables_figures_and_pages(tmp_path):
    report = _report(tmp_path)
    (report / "wandb").mkdir()
    (report / "wandb" / "media.png").write_bytes(b"")  # W&B's own files are not the report's
    files = report_files(report)
    assert [p.name for p in files["csv"]] == ["paired.csv"]
    assert [p.relative_to(report).as_posix() for p in files["png"]] == ["fit/fig_scaling.png"]
    assert [p.name for p in files["md"]] == ["paired.md"]


def test_disabled_logs_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    report = _report(tmp_path)
    assert log_study_summary(report, "attnres-test", "cpu_study", ["a line"]) is None
    assert not (report / "wandb").exists()


def test_offline_without_a_key_writes_one_run_in_the_studys_group(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    report = _report(tmp_path)
    run_dir = log_study_summary(report, "attnres-test", "cpu_study", ["Block wins 3 of 4 cells"])
    assert run_dir is not None
    assert run_dir.is_dir()
    assert run_dir.parent.parent == report / "wandb"  # offline-run-*/files under the report
    media = run_dir / "media"
    (table,) = media.glob("table/table/paired_*.table.json")
    assert json.loads(table.read_text())["data"] == [["8", "-0.03"], ["10", "-0.02"]]
    assert len(list(media.glob("images/figure/fit/fig_scaling_*.png"))) == 1
    (page,) = media.glob("html/page/paired_*.html")
    assert "| 8 | -0.03 |" in page.read_text()
    (headline,) = media.glob("html/page/headline_*.html")
    assert "Block wins 3 of 4 cells" in headline.read_text()
    # the run's own log (protobuf records, its strings as they are), flushed by shutting W&B's service down: its
    # group, job type, name and headline
    import wandb

    wandb.teardown()
    log = next(run_dir.parent.glob("run-*.wandb")).read_bytes()
    for text in ("cpu_study", "study_summary", "cpu_study/summary", "Block wins 3 of 4 cells"):
        assert text.encode() in log, text


def test_a_study_logs_its_report_and_headline_after_its_analysis(tmp_path, monkeypatch, capsys):
    """sweeps.study.analyse: the analysis writes the report, then the report goes to W&B as one run whose summary
    holds the study's headline lines."""
    import pandas as pd

    from sweeps.study import Plan, analyse
    from sweeps.study_spec import Study

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    rows = []
    for seq_len, gain in ((128, -0.03), (512, -0.05)):
        for n_layers in (8, 10):
            for seed, noise in ((0, 0.01), (1, -0.02), (2, 0.03)):
                base = 3.0 - 0.1 * n_layers + noise
                for variant, loss in (("baseline", base), ("block_attnres", base + gain + 0.001 * seed)):
                    rows.append(
                        {
                            "run_id": f"r{len(rows)}",
                            "variant": variant,
                            "size": f"deep_L{n_layers}",
                            "seed": seed,
                            "status": "completed",
                            "pflops_days": 1e-9,
                            "val_loss": loss,
                            "n_layers": n_layers,
                            "d_model": 2 * n_layers,
                            "n_heads": 2,
                            "tokens": 8e4,
                            "params_non_embedding": 1e4,
                            "seq_len": seq_len,
                            "study": "cpu_context",
                        }
                    )
    results = tmp_path / "runs" / "results.csv"
    results.parent.mkdir()
    pd.DataFrame(rows).to_csv(results, index=False)
    study = Study(sweep="cpu_deep", what="context", analysis="paired", analysis_args=("--condition", "seq_len"))
    plan = Plan([], "scaling", "cpu_context", "0,1,2", results, tmp_path / "report", "attnres-test")
    assert analyse(study, plan, None, 0.0) == 0
    out = capsys.readouterr().out
    assert "block_attnres: Δ 128 − Δ 512 below 0 in 0, above 0 in 2 of 2 cells" in out
    assert "the report as one W&B run (cpu_context/summary, group cpu_context)" in out
    (page,) = (tmp_path / "report" / "wandb").glob("offline-run-*/files/media/html/page/headline_*.html")
    assert "Δ 128 − Δ 512" in page.read_text()
