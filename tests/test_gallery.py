"""The gallery page (analysis/gallery.py): every entry's sentence follows its numbers, a missing study never hides
the others, links resolve, and the runs' wall time leaves out pauses between sessions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from analysis.io import provenance
from analysis.io.fit_document import FitDocument
from analysis.render import gallery

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results"


def test_active_wall_time_is_the_union_of_run_spans_without_long_pauses():
    t = pd.Timestamp("2026-12-01T10:00:00Z")
    s = pd.Timedelta(seconds=1)
    df = pd.DataFrame(
        {
            "started_at": [t, t + 50 * s, t + 100 * s, t + 10_000 * s],  # two overlapping, one after, one much later
            "finished_at": [t + 100 * s, t + 120 * s, t + 160 * s, t + 10_030 * s],
        }
    )
    assert provenance.active_wall_s(df) == pytest.approx(160 + 30)
    assert provenance.active_wall_s(df.iloc[:0]) == 0.0


def test_the_scaling_entry_states_the_committed_multiplier_and_where_the_papers_lies():
    entry = gallery.scaling_entry(RESULTS / "cpu_deep" / "pooled", None, "cmd", "a regime")
    block = FitDocument.from_json(RESULTS / "cpu_deep" / "pooled" / "fit.json").multipliers["block_attnres"]
    lo, hi = block.m_ci95
    assert f"m = {block.m:.3f} [{lo:.3f}, {hi:.3f}]" in entry.verdict
    expected = "inside our interval" if lo <= 1.25 <= hi else ("above our interval" if hi < 1.25 else "below it")
    assert f"the paper's 1.25 is {expected}" in entry.verdict
    assert ("not decided" in entry.verdict) == (lo <= 1.0 <= hi)
    assert any(row.startswith("| block_attnres |") for row in entry.ours)


def _map_json(tmp_path: Path, cells: list[dict]) -> Path:
    (tmp_path / "map.json").write_text(json.dumps({"cells": cells}))
    return tmp_path


def _cell(L: int, d: int, delta: float, verdict: str) -> dict:
    return {
        "n_layers": L,
        "d_model": d,
        "n_pairs": 6,
        "delta": delta,
        "ci_lo": delta - 0.01,
        "ci_hi": delta + 0.01,
        "verdict": verdict,
    }


def test_the_map_entry_counts_verdicts_and_claims_a_direction_only_when_the_cells_show_one(tmp_path):
    deep_wins = _map_json(tmp_path, [_cell(16, 32, -0.03, "wins"), _cell(4, 64, 0.02, "loses")])
    e = gallery.map_entry(deep_wins, None, "cmd")
    assert "wins in 1 (L_b 16 x d 32), loses in 1 (L_b 4 x d 64) and is undecided in 0" in e.verdict
    assert "deeper and narrower" in e.verdict
    shallow_wins = _map_json(tmp_path, [_cell(4, 64, -0.03, "wins"), _cell(16, 32, 0.02, "loses")])
    assert "deeper and narrower" not in gallery.map_entry(shallow_wins, None, "cmd").verdict


def test_a_missing_study_becomes_a_not_yet_run_entry_and_the_page_keeps_the_others(tmp_path):
    sources = gallery.GallerySources.committed(RESULTS)
    sources = gallery.GallerySources(**{**sources.__dict__, "paper_refit": tmp_path / "nowhere"})
    entries = gallery.gallery_entries(sources)
    by_key = {e.key: e for e in entries}
    assert by_key["table2"].verdict.startswith("no result yet")
    assert not by_key["table2"].figures
    assert by_key["fig4"].figures
    assert by_key["table3"].reachable is False
    page = gallery.write_gallery(entries, tmp_path / "docs" / "README.md")
    text = page.read_text()
    assert text.index("## Table 2") < text.index("## Fig. 4") < text.index("## Table 3") < text.index("## Fig. 7")
    for link in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
        assert (page.parent / link).resolve().is_file(), link
    assert "not yet run" in text  # the summary table marks the missing entry


def test_the_figures_command_restores_runs_each_study_then_writes_the_page(tmp_path, monkeypatch):
    from sweeps import study

    calls: list[list[str]] = []
    analyses: list[list[str]] = []
    monkeypatch.setattr(study, "main", lambda argv: calls.append(list(argv)) or 0)
    monkeypatch.setattr(study, "run_analysis", lambda argv: analyses.append(list(argv[:1])) or (0, None))
    runs, reports = tmp_path / "runs", tmp_path / "reports"
    assert study.run_figures(2, runs, reports, fresh=False) == 0
    assert [c[0] for c in calls] == [name for name, _, _ in study.FIGURE_STUDIES]
    assert calls[0][-2:] == ["--seeds", "0,1,2,20,21,22"]
    committed = len(list((RESULTS / "deep_block_size" / "records").glob("*.json")))
    assert len(list((runs / "deep_block_size" / "records").glob("*.json"))) >= committed
    assert analyses == [["map"], ["paper"]]
    page = (reports / "README.md").read_text()
    for item in ("Table 2", "Fig. 4", "Fig. 5", "Table 3", "Table 4", "Fig. 6", "Fig. 7", "Fig. 8"):
        assert f"## {item}" in page


def test_the_figures_command_stops_at_an_interrupted_study_and_fresh_restores_nothing(tmp_path, monkeypatch):
    from sweeps import study

    calls: list[str] = []
    monkeypatch.setattr(study, "main", lambda argv: calls.append(argv[0]) or 130)
    assert study.run_figures(1, tmp_path / "runs", tmp_path / "reports", fresh=True) == 130
    assert calls == [study.FIGURE_STUDIES[0][0]]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.json"))


def test_a_reading_entry_without_a_fresh_figure_shows_the_committed_one_and_says_so(tmp_path):
    entry = gallery.reading_entry("fig8", tmp_path / "fig8_depth_weights.png", None, "cmd")
    assert entry.figures == [gallery.COMMITTED_SCALING / "fig8_depth_weights.png"]
    assert "the committed figure is shown" in entry.verdict
    committed = gallery.reading_entry("fig8", gallery.COMMITTED_SCALING / "fig8_depth_weights.png", None, "cmd")
    assert committed.verdict == gallery.load_gallery_text()["fig8"]["ours_reading"]


def test_the_scaling_entry_adds_the_frontier_multiplier_where_a_length_report_has_one(tmp_path):
    """M(C) along the compute-optimal frontier (a training-length report's length.json) joins Fig. 4's verdict with
    its band at the top of the measured C, and its figure joins the entry; no report, no sentence."""
    import json

    front = {
        "rungs": ["deep_L8", "deep_L16"],
        "budgets": [8.0, 128.0],
        "C": [1e-9, 1e-8, 1e-7],
        "M": {
            "M": [0.5, 1.0, 1.3],
            "ci95_lo": [0.4, 0.9, 1.2],
            "ci95_hi": [0.6, 1.1, 1.42],
            "half_width_over_M_at_top": 0.0846,
        },
        "within_rungs": {
            "M": {
                "M": [0.5, 1.1, 2.0],
                "ci95_lo": [0.4, 1.0, 1.5],
                "ci95_hi": [0.6, 1.2, 2.5],
                "half_width_over_M_at_top": 0.25,
            }
        },
        "rollout": {"largest_rung": {"cells": [{"inside": False}, {"inside": True}]}},
    }
    (tmp_path / "length.json").write_text(json.dumps({"frontier": front}))
    text = gallery.frontier_sentence(tmp_path)
    assert "L_b 8, 16 x 8, 128 tokens per parameter" in text
    assert "M = 1.10x [1.00, 1.20] in the middle of the measured C (1e-08 PF-days)" in text
    assert "2.00x [1.50, 2.50] with N kept inside the measured rungs, half-width 25%" in text
    assert "1.30x [1.20, 1.42] with N free, half-width 8%" in text
    assert "predicts 1 of its 2 cells" in text
    assert gallery.frontier_sentence(tmp_path / "nowhere") == ""
    entry = gallery.gallery_entries(gallery.GallerySources.committed(RESULTS))[1]
    assert entry.key == "fig4"
    assert "compute-optimal frontier" in entry.verdict
    assert any(f.name == "fig_frontier.png" for f in entry.figures)
