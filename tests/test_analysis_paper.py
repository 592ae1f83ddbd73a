"""The paper's published numbers (analysis/data/paper.json) refit to the paper's own laws."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.__main__ import main
from analysis.studies.paper import load_paper, paper_comparison, paper_results, refit_laws

PUBLISHED = {"baseline": (1.891, 0.057), "block_attnres": (1.870, 0.058), "full_attnres": (1.865, 0.057)}


def test_compute_reconstruction_matches_the_paper_range() -> None:
    C = paper_results().groupby("size", sort=False)["pflops_days"].first().to_numpy()
    # 6 N_act D + causal attention term: the largest point is the paper's "5.6 PFLOP/s-days".
    assert pytest.approx([0.72, 1.04, 1.72, 3.48, 5.62], abs=0.01) == C


@pytest.mark.parametrize("variant", list(PUBLISHED))
def test_refit_reproduces_published_laws(variant: str) -> None:
    law = refit_laws()[variant]
    A, alpha = PUBLISHED[variant]
    assert pytest.approx(A, abs=0.01) == law.A
    assert law.alpha == pytest.approx(alpha, abs=0.002)


def test_block_multiplier_at_5_6() -> None:
    M = paper_comparison()["M"]["block_attnres"]
    # From the published (3-digit) laws the paper's 1.25x is exact to rounding ...
    assert M["published_laws"] == pytest.approx(1.25, abs=0.01)
    assert M["L_variant_published_law"] == pytest.approx(1.692, abs=5e-4)
    # ... and from our refit of the 3-digit Table 2 losses (with the reconstructed C) it is 1.27.  M is very
    # sensitive (a 0.001 change in alpha moves it by ~0.02), hence the wider stated tolerance.
    assert M["refit"] == pytest.approx(1.25, abs=0.03)


def test_paper_data_is_complete() -> None:
    p = load_paper()
    assert len(p["table2"]["rows"]) == 5
    assert len(p["table4"]["rows"]) == 12
    assert p["fig6"]["block_size"] == [1, 2, 4, 8, 16, 32]
    assert len(p["fig6"]["loss"]) == 6
    assert all(len(r) == 5 for r in p["fig7"]["baseline"] + p["fig7"]["attnres"])
    assert "6 * N_act * D + 3 * L_b * T * (H * 128) * D" in p["compute"]["formula"]


def test_paper_cli(tmp_path: Path) -> None:
    out = tmp_path / "paper"
    assert main(["paper", "--out", str(out), "--bootstrap", "200", "--seed-sigma", "0.003"]) == 0
    for name in ("fig4_scaling", "fig6_block_size", "fig7_architecture"):
        assert (out / f"{name}.png").stat().st_size > 20_000
        assert (out / f"{name}.pdf").stat().st_size > 5_000
    doc = json.loads((out / "fit.json").read_text())
    assert doc["variants"]["block_attnres"]["alpha"] == pytest.approx(0.058, abs=0.002)
    block = doc["multipliers"]["block_attnres"]
    assert block["paper_M"] == pytest.approx(1.25, abs=0.03)
    assert block["m_ci95"][0] < block["m"] < block["m_ci95"][1]
    assert doc["bootstrap"]["mode"] == "parametric"
    assert doc["bootstrap"]["sigma"] == 0.003
    md = (out / "summary.md").read_text()
    assert "Refit vs the paper's published laws" in md
    assert "1.25x compute advantage" in md
    assert (out / "table4_ablations.md").read_text().count("\n|") == 14
