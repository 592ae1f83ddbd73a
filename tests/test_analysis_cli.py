"""`python -m analysis fit` end to end on a synthetic study: fit.json schema, summary.md, figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
from synthetic_records import synthetic_ladder, write_study

from analysis.__main__ import main
from analysis.io.runs import AnalysisWarning

REPO = Path(__file__).resolve().parents[1]
FIGURES = ["fig4_scaling", "loss_curves", "fig5_dynamics", "fig8_depth_weights", "fig6_block_size"]
TRUTH = {"full_attnres": 1.25, "block_attnres": 1.15}  # synthetic.DEFAULT_MULTIPLIERS


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, list[str]]:
    root = tmp_path_factory.mktemp("study")
    write_study(root / "study")  # ladder + block-size sweep + ablations + one diverged run
    out = root / "report"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc = main(["fit", "--results", str(root / "study"), "--out", str(out), "--bootstrap", "300"])
    return out, rc, [str(w.message) for w in caught if issubclass(w.category, AnalysisWarning)]


def test_fit_json_schema(report: tuple[Path, int, list[str]]) -> None:
    out, rc, _ = report
    assert rc == 0
    doc = json.loads((out / "fit.json").read_text())
    for v in ("baseline", "full_attnres", "block_attnres"):
        f = doc["variants"][v]
        assert f["A"] > 0
        assert 0 < f["alpha"] < 1
        assert f["A_ci95"][0] < f["A"] < f["A_ci95"][1]
        assert f["alpha_ci95"][0] < f["alpha"] < f["alpha_ci95"][1]
    assert set(doc["multipliers"]) == set(TRUTH)
    for v, truth in TRUTH.items():
        m = doc["multipliers"][v]
        for key in ("paper_M", "m", "m_ci95", "p_m_le_1", "per_size"):
            assert key in m
        lo, hi = m["m_ci95"]
        assert lo < m["m"] < hi
        assert abs(m["m"] / truth - 1) < 0.1
        assert 0.0 <= m["p_m_le_1"] <= 0.05
        assert list(m["per_size"]) == ["cpu_xs", "cpu_s", "cpu_m", "cpu_l", "cpu_xl"]  # ordered by compute
        assert all(p["m"] > 1 for p in m["per_size"].values())
        assert m["joint"]["form"] in ("saturating", "power_law")
        assert m["exponents"]["significant"] in (True, False)
        assert m["paper_M_at_C"] == pytest.approx(max(p["C"] for p in m["per_size"].values()), rel=0.01)
    assert doc["bootstrap"]["mode"] == "paired_cluster"
    assert doc["bootstrap"]["B"] == 300
    assert [p["block_size"] for p in doc["block_size_sweep"]["points"]] == [1, 2, 4, 8]
    assert doc["block_size_sweep"]["baseline"]["n_runs"] == 2
    assert len(doc["ablations"]) == 12
    assert doc["ablations"][0]["variant"] == "baseline"


def test_excluded_run_is_reported(report: tuple[Path, int, list[str]]) -> None:
    out, _, warned = report
    doc = json.loads((out / "fit.json").read_text())
    (bad,) = doc["excluded_runs"]
    assert bad["status"] == "diverged"
    assert bad["run_id"] in " ".join(warned)
    assert bad["run_id"] in (out / "summary.md").read_text()


def test_summary_tables(report: tuple[Path, int, list[str]]) -> None:
    md = (out := report[0]).joinpath("summary.md").read_text()
    for heading in (
        "Validation loss per size",
        "Fitted laws",
        "Compute multipliers vs baseline",
        "Block size sweep",
        "Ablations",
    ):
        assert f"## {heading}" in md
    assert "| cpu_xl |" in md
    assert "full_attnres (Δ vs baseline)" in md
    assert (out / "table4_ablations.md").read_text().count("\n|") == 14  # header, rule and 12 variants


def test_figures_are_written_and_not_empty(report: tuple[Path, int, list[str]]) -> None:
    out = report[0]
    for name in FIGURES:
        png, pdf = out / f"{name}.png", out / f"{name}.pdf"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert png.stat().st_size > 20_000, name
        assert pdf.read_bytes()[:5] == b"%PDF-", name
        assert pdf.stat().st_size > 5_000, name


def test_missing_run_files_are_skipped_with_a_warning(tmp_path: Path) -> None:
    df = synthetic_ladder({"full_attnres": 1.25}, seeds=(0,), n_sizes=3)
    path = write_study(tmp_path / "s", df, failed=False)
    gone = df["run_id"].iloc[0]
    (tmp_path / "s" / "runs" / gone / "metrics.csv").unlink()
    for f in (tmp_path / "s" / "runs").glob("*/diagnostics.json"):
        f.unlink()
    with pytest.warns(AnalysisWarning) as rec:
        rc = main(
            ["fit", "--results", str(path), "--out", str(tmp_path / "r"), "--bootstrap", "50", "--seed-sigma", "0.01"]
        )
    msgs = " ".join(str(w.message) for w in rec)
    assert rc == 0
    assert f"loss curves: no usable metrics.csv for 1 run(s): {gone}" in msgs
    assert "depth-weight heatmaps skipped" in msgs
    assert (tmp_path / "r" / "loss_curves.png").stat().st_size > 10_000
    assert not (tmp_path / "r" / "fig8_depth_weights.png").exists()
    doc = json.loads((tmp_path / "r" / "fit.json").read_text())
    assert doc["bootstrap"]["mode"] == "parametric"
    assert doc["bootstrap"]["sigma"] == 0.01


def test_cli_errors_exit_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    df = synthetic_ladder({"full_attnres": 1.25}, seeds=(0, 1))
    df.drop(columns=["val_loss"]).to_csv(tmp_path / "no_loss.csv", index=False)
    assert main(["fit", "--results", str(tmp_path / "no_loss.csv"), "--out", str(tmp_path / "o")]) == 2
    assert "lacks column(s) needed for a scaling fit: val_loss" in capsys.readouterr().err
    df[df["size"] == "cpu_xs"].to_csv(tmp_path / "one_size.csv", index=False)
    assert main(["fit", "--results", str(tmp_path / "one_size.csv"), "--out", str(tmp_path / "o")]) == 2
    assert "at only 1 size(s) (cpu_xs); a scaling-law fit needs at least 3 sizes" in capsys.readouterr().err
    assert main(["fit", "--results", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "o")]) == 2


def test_help_lists_every_registered_study_and_the_cli_module_imports_nothing_heavy() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "analysis", "--help"], cwd=REPO, capture_output=True, text=True, check=True
    )
    for name in (*SWEEP_COMMANDS, "gallery", "block-size"):
        assert name in res.stdout
    res = subprocess.run(
        [sys.executable, "-m", "analysis", "fit", "--help"], cwd=REPO, capture_output=True, text=True, check=True
    )
    for opt in ("--results", "--wandb", "--baseline", "--bootstrap", "--seed-sigma", "--form"):
        assert opt in res.stdout
    code = "import sys, analysis.__main__; assert not {'pandas', 'scipy', 'matplotlib'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


HEAVY = {"pandas", "scipy", "matplotlib"}


@pytest.mark.parametrize("argv", [["--help"], [], ["no-such-command"]])
def test_the_top_level_help_and_its_errors_import_no_study(argv: list[str]) -> None:
    """``python -m analysis --help`` (and a missing or unknown command) lists the commands from the registry's plain
    table: none of pandas, scipy or matplotlib is imported (Python's own import log, PYTHONPROFILEIMPORTTIME)."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    res = subprocess.run([sys.executable, "-m", "analysis", *argv], cwd=REPO, env=env, capture_output=True, text=True)
    assert res.returncode == (0 if argv == ["--help"] else 2), res.stderr[-2000:]
    log = [line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")]
    assert "analysis.studies.study_registry" in log  # the log is the one asked for
    assert not HEAVY & {name.split(".")[0] for name in log}
    assert "recipe" in (res.stdout if argv == ["--help"] else res.stderr)


def test_the_plain_command_table_is_what_the_registry_holds() -> None:
    """COMMANDS (what --help lists without importing a study) equals the registered studies' names, help lines and
    aliases; the assertion prints the table that matches the registry."""
    from analysis.studies import study_registry

    registered = {s.name: (s.help, s.aliases) for s in study_registry.load().values()}
    table = "\n".join(f"    {name!r}: {entry!r}," for name, entry in sorted(registered.items()))
    assert registered == study_registry.COMMANDS, (
        f"analysis/studies/study_registry.py COMMANDS differs from the registry; the registry's:\n{table}"
    )


# the ``analysis:`` command names a study's config gives (sweeps/study.py): one registered study each
SWEEP_COMMANDS = ("fit", "lr", "map", "block_size", "ablations", "length", "recipe", "paired", "paper")


def test_the_registry_holds_each_study_once_with_its_headline() -> None:
    from analysis.studies import recipe, study_registry, training_length

    studies = study_registry.load()
    assert set(SWEEP_COMMANDS) <= set(studies)
    assert study_registry.get("block-size") is studies["block_size"]  # the alias reaches the same study
    assert study_registry.get("arch_grid") is studies["fit"]  # the grid is reported by the fit
    assert studies["length"].headline is training_length.headline_lines
    assert studies["fit"].headline is not None  # sweeps.study prints what the registry's headline says
    # each study kind measured at one shape (and the lr kind) is reported by the one command registered for it
    kinds = {k: study_registry.for_kind(k).name for k in ("lr", "map", "block_size", "ablations")}
    assert kinds == {"lr": "lr", "map": "map", "block_size": "block_size", "ablations": "ablations"}
    assert study_registry.for_kind("scaling") is None  # a scaling study names its own analysis
    assert all(s.files for s in studies.values())
    assert studies["recipe"].headline is recipe.headline_lines
    assert study_registry.headline_lines("map", {"cells": []}) == []  # a study without a headline
    with pytest.raises(ValueError, match="'nope' is not registered; registered: ablations, block_size"):
        study_registry.get("nope")


def test_a_name_taken_twice_is_an_error_naming_both() -> None:
    from analysis.studies import study_registry

    def args(p):
        return None

    study_registry.load()
    with pytest.raises(ValueError, match="'block-size' of 'other' is already registered by 'block_size'"):
        study_registry.register("other", help="", arguments=args, aliases=("block-size",))(lambda a, v: None)
    with pytest.raises(ValueError, match="study kind 'map' of 'other' is already reported by 'map'"):
        study_registry.register("other", help="", arguments=args, study_kind="map")(lambda a, v: None)
    assert "other" not in study_registry.STUDIES


def test_compute_column_choice(tmp_path: Path) -> None:
    df = synthetic_ladder({"full_attnres": 1.25}, seeds=(0, 1))
    df.to_csv(tmp_path / "r.csv", index=False)
    rc = main(
        [
            "fit",
            "--results",
            str(tmp_path / "r.csv"),
            "--out",
            str(tmp_path / "o"),
            "--bootstrap",
            "50",
            "--compute",
            "pflops_days_6nd",
            "--no-figures",
        ]
    )
    assert rc == 0
    doc = json.loads((tmp_path / "o" / "fit.json").read_text())
    assert doc["compute"] == "pflops_days_6nd"
    assert doc["variants"]["baseline"]["C_max"] == pytest.approx(
        pd.to_numeric(df["pflops_days_6nd"]).max() / 1.01, rel=0.02
    )
    assert not list((tmp_path / "o").glob("*.png"))


def test_different_exponents_report_a_curve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A variant whose exponent differs from the baseline's (0.12 vs 0.08): the check flags it and the outputs
    report M(C) instead of a single multiplier."""
    df = synthetic_ladder({"v": 1.0}, seeds=(0, 1), E=0.0, A=3.0, alpha=0.08, sigma=0.002, rng=5)
    v = df["variant"] == "v"
    df.loc[v, "val_loss"] = 2.9 * (df.loc[v, "pflops_days"] / 1e-5) ** -0.12
    df.to_csv(tmp_path / "r.csv", index=False)
    assert (
        main(
            [
                "fit",
                "--results",
                str(tmp_path / "r.csv"),
                "--out",
                str(tmp_path / "o"),
                "--bootstrap",
                "200",
                "--no-figures",
            ]
        )
        == 0
    )
    assert "exponents differ significantly: M(C) runs from" in capsys.readouterr().out
    m = json.loads((tmp_path / "o" / "fit.json").read_text())["multipliers"]["v"]
    assert m["exponents"]["significant"]
    assert m["headline"] == "curve"
    assert m["exponents"]["diff"] == pytest.approx(0.04, abs=0.01)
    assert m["exponents"]["diff_ci95"][0] > 0
    curve = m["paper_M_curve"]["M"]
    assert curve[-1] > 1.5 * curve[0]  # the multiplier grows with compute
    assert "not one number" in (tmp_path / "o" / "summary.md").read_text()


def test_loss_curve_panels_of_a_size_zoom_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The zoom skips the first ~10% of training per variant, so the tokens and FLOPs panels show the same points:
    AttnRes spends more FLOPs per token, and 10% of the largest FLOPs once cut off the baseline's first point in
    the FLOPs panel only."""
    import matplotlib.pyplot as plt

    from analysis.render import figures

    rows = []
    for variant, flops_per_token, first_loss in (("baseline", 1.0, 5.0), ("block_attnres", 1.3, 4.0)):
        run = tmp_path / variant
        run.mkdir()
        tokens = [100 * (k + 1) for k in range(10)]
        losses = [first_loss] + [3.0 - 0.1 * k for k in range(1, 10)]
        pd.DataFrame(
            {"step": range(1, 11), "tokens": tokens, "flops": [t * flops_per_token for t in tokens], "val_loss": losses}
        ).to_csv(run / "metrics.csv", index=False)
        rows.append(
            {
                "run_id": variant,
                "run_dir": str(run),
                "variant": variant,
                "size": "cpu_xs",
                "seed": 0,
                "val_loss": losses[-1],
                "pflops_days": 1.0,
            }
        )
    limits = []
    monkeypatch.setattr(
        figures, "save", lambda fig, stem: limits.extend(ax.get_ylim() for ax in fig.axes) or plt.close(fig) or []
    )
    figures.loss_curves_figure(pd.DataFrame(rows), tmp_path / "loss_curves")
    (tokens_lo, tokens_hi), (flops_lo, flops_hi) = limits
    assert tokens_hi == flops_hi == 5.0
    assert tokens_lo == pytest.approx(flops_lo)


def test_a_run_directory_that_never_evaluated_gives_no_loss_curve_and_no_crash(tmp_path: Path) -> None:
    """A run directory whose metrics.csv holds only its header (a launch stopped before its first evaluation, left
    beside the records that name it) is named in the warning, and a figure without any curve is not drawn."""
    from analysis.io.runs import AnalysisWarning
    from analysis.render import figures

    run = tmp_path / "stopped"
    run.mkdir()
    (run / "metrics.csv").write_text("step,tokens,flops,train_loss,val_loss\n")
    row = {"run_id": "stopped", "run_dir": str(run), "variant": "baseline", "size": "cpu_xs", "seed": 0}
    with pytest.warns(AnalysisWarning, match=r"stopped \(metrics.csv has no val_loss\)"):
        assert figures.loss_curves_figure(pd.DataFrame([row | {"val_loss": 3.0}]), tmp_path / "curves") == []


@pytest.mark.parametrize("name", ["fit.json", "heldout/fit.json", "pooled/fit.json"])
def test_committed_fit_documents_load_typed_and_round_trip(name: str) -> None:
    """The committed study's fit.json files load into the typed document and are written back unchanged."""
    from analysis.io.fit_document import FitDocument, JointLaw, Multiplier, SizeMultiplier

    path = REPO / "docs" / "results" / "cpu_ladder" / name
    raw = json.loads(path.read_text())
    doc = FitDocument.from_json(path)
    assert doc.to_dict() == raw
    assert list(doc.to_dict()) == list(raw)
    assert doc.baseline == "baseline"
    assert doc.bootstrap.mode == raw["bootstrap"]["mode"]
    m = doc.multipliers["block_attnres"]
    assert isinstance(m, Multiplier)
    assert isinstance(m.joint, JointLaw)
    assert m.joint.form in ("saturating", "power_law")
    block = raw["multipliers"]["block_attnres"]
    assert m.m == block["m"]
    assert block["paper_M_curve"]["C"] == m.paper_M_curve.C
    assert all(isinstance(p, SizeMultiplier) and p.m > 0 for p in m.per_size.values())
    assert doc.variants["baseline"].alpha == raw["variants"]["baseline"]["alpha"]
    assert all(not part.extra for part in [doc, m, m.joint, m.exponents, doc.bootstrap, *m.per_size.values()])


def test_fit_document_keeps_unknown_keys_and_tolerates_missing_ones() -> None:
    """A document from a newer writer (an extra key anywhere) round-trips; an older or partial one loads with
    defaults."""
    from analysis.io.fit_document import FitDocument

    raw = {"multipliers": {"v": {"m": 1.2, "m_ci95": [1.0, 1.5], "new_estimator": {"m": 1.1}}}, "new_top": [1]}
    doc = FitDocument.from_dict(raw)
    assert doc.multipliers["v"].m == 1.2
    assert doc.multipliers["v"].extra == {"new_estimator": {"m": 1.1}}
    assert doc.extra == {"new_top": [1]}
    assert doc.variants == {}
    assert doc.bootstrap is None
    out = doc.to_dict()
    assert out["new_top"] == [1]
    assert out["multipliers"]["v"]["new_estimator"] == {"m": 1.1}
    assert out["multipliers"]["v"]["paper_M"] is None
    assert "without_flagged" not in out
    assert "paper" not in out
    assert FitDocument.from_dict(out).to_dict() == out


def test_the_fit_document_is_what_run_fit_writes(report: tuple[Path, int, list[str]]) -> None:
    from analysis.io.fit_document import FitDocument

    out = report[0]
    raw = json.loads((out / "fit.json").read_text())
    doc = FitDocument.from_json(out / "fit.json")
    assert doc.to_dict() == raw
    assert doc.block_size_sweep.size == raw["block_size_sweep"]["size"]
    assert doc.block_size_sweep.full.val_loss > 0
    assert doc.arch_grid is None
    assert doc.files == raw["files"]
