"""The length study under two lr protocols side by side (analysis.laws.length_protocols, its text
analysis.render.length_protocols_text): on the committed shared-lr records and a copy of them with known per-arm,
per-budget loss changes, every shift, gain and growth is the planted one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.io.runs import load_results
from analysis.laws.length_protocols import OWN, SHARED, compare_protocols
from analysis.render.length_protocols_text import protocols_markdown

REPO = Path(__file__).resolve().parents[1]
SHARED_RESULTS = REPO / "docs" / "results" / "cpu_deep_budgets" / "results.csv"


def _own_lr_copy(shared: pd.DataFrame, change: dict[tuple[str, float], float]) -> pd.DataFrame:
    """The shared-lr table as if rerun at each budget's own lr: the lr halved per 4x budget, each (arm, budget)'s
    loss moved by ``change`` plus seed noise that cancels in the mean."""
    own = shared.copy()
    tpp = own["budget"].astype(float)  # tokens per parameter of the baseline's N, as the launch planned it
    own["lr"] = own["lr"] * (8.0 / tpp) ** 0.5
    noise = np.where(own["seed"] < 10, 1e-3, -1e-3)  # design seeds 0-2 up, held-out 20-22 down
    own["val_loss"] = own["val_loss"] + [change.get((v, t), 0.0) for v, t in zip(own["variant"], tpp)] + noise
    return own


def test_shift_gain_and_growth_are_the_planted_ones() -> None:
    shared = load_results(SHARED_RESULTS)
    change = {("baseline", 128.0): -0.010, ("block_attnres", 128.0): -0.026, ("block_attnres", 32.0): -0.004}
    doc = compare_protocols(shared, _own_lr_copy(shared, change))
    cells = {(c["size"], c["tokens_per_param"]): c for c in doc["cells"]}
    assert len(cells) == 12  # 4 rungs x 3 budgets
    for (_size, tpp), c in cells.items():
        planted_gain_ref = change.get(("baseline", tpp), 0.0)
        planted_gain_arm = change.get(("block_attnres", tpp), 0.0)
        assert c["gain_baseline"] == pytest.approx(planted_gain_ref, abs=1e-9)
        assert c["gain_block_attnres"] == pytest.approx(planted_gain_arm, abs=1e-9)
        assert c["shift"] == pytest.approx(planted_gain_arm - planted_gain_ref, abs=1e-9)
        assert c[f"delta_{OWN}"] == pytest.approx(c[f"delta_{SHARED}"] + c["shift"], abs=1e-9)
        assert c["n_pairs"] == 6
        assert c[f"lr_baseline_{OWN}"] == pytest.approx(c[f"lr_baseline_{SHARED}"] * (8 / tpp) ** 0.5)
    growth = {(g["size"], g["protocol"]): g for g in doc["growth"]}
    for size in {s for s, _ in cells}:
        shared_growth = cells[(size, 128.0)][f"delta_{SHARED}"] - cells[(size, 8.0)][f"delta_{SHARED}"]
        assert growth[(size, SHARED)]["growth"] == pytest.approx(shared_growth, abs=1e-9)
        assert growth[(size, OWN)]["growth"] == pytest.approx(shared_growth - 0.016, abs=1e-9)
    text = "\n".join(protocols_markdown(doc))
    assert "at each budget's own lr: block_attnres's gain grows with training length at" in text
    assert text.count("| deep_L16 |") == 4  # three budgets and one growth row


def test_a_cell_mixing_lrs_within_one_protocol_stops() -> None:
    shared = load_results(SHARED_RESULTS)
    own = _own_lr_copy(shared, {})
    own.loc[own.index[0], "lr"] *= 0.5
    with pytest.raises(ValueError, match="runs at 2 lrs"):
        compare_protocols(shared, own)


def test_the_length_command_puts_both_protocols_side_by_side(tmp_path: Path) -> None:
    """``python -m analysis length --compare-to``: the section in length_summary.md, ``lr_protocols`` in length.json
    and the growth sentences in the printed headline."""
    import json

    from analysis.__main__ import run

    shared = load_results(SHARED_RESULTS)
    own_csv = tmp_path / "own.csv"
    _own_lr_copy(shared, {("block_attnres", 128.0): -0.02}).to_csv(own_csv, index=False)
    out = tmp_path / "report"
    argv = ["length", "--results", str(own_csv), "--out", str(out), "--no-fit", "--no-figures", "--bootstrap", "50"]
    rc, _ = run([*argv, "--compare-to", str(SHARED_RESULTS)])
    assert rc == 0
    doc = json.loads((out / "length.json").read_text())
    assert len(doc["lr_protocols"]["cells"]) == 12
    summary = (out / "length_summary.md").read_text()
    assert "at one shared lr against each budget at its own lr" in summary
    assert "- at each budget's own lr: block_attnres's gain grows with training length at 4 of 4 rungs" in summary


def test_best_against_best_is_the_planted_difference(tmp_path: Path) -> None:
    """The arm at its own optimum in some cells (the study's ``lr_protocol`` per_arm runs): Δ best, Δ at the
    reference's lr and the arm's gain are the planted ones, on the seeds the three runs share; only the cells
    ``best`` holds are reported."""
    import json

    from analysis.__main__ import run
    from analysis.laws.length_protocols import best_against_best

    own = _own_lr_copy(load_results(SHARED_RESULTS), {})
    cell = (own["size"] == "deep_L16") & (own["budget"].astype(float) == 128.0) & (own["variant"] == "block_attnres")
    best = own[cell & own["seed"].isin([0, 1, 2])].copy()
    best["lr"] *= 1.4
    best["val_loss"] -= 0.003
    rows = best_against_best(own, best)
    assert [(r["size"], r["tokens_per_param"]) for r in rows] == [("deep_L16", 128.0)]
    r = rows[0]
    assert r["n_pairs"] == 3
    assert r["seeds"] == [0, 1, 2]
    assert r["arm_gain"] == pytest.approx(-0.003, abs=1e-9)
    assert r["delta_best"] == pytest.approx(r["delta_own"] - 0.003, abs=1e-9)
    assert r["lr_arm_best"] == pytest.approx(1.4 * r["lr_arm_own"])
    assert r["lr_reference"] == r["lr_arm_own"]
    both_csv, out = tmp_path / "both.csv", tmp_path / "report"
    pd.concat([own.assign(lr_protocol="baseline"), best.assign(lr_protocol="per_arm")]).to_csv(both_csv, index=False)
    argv = ["length", "--results", str(both_csv), "--out", str(out), "--no-fit", "--no-figures", "--bootstrap", "50"]
    assert run(argv)[0] == 0
    summary = (out / "length_summary.md").read_text()
    assert "## Best against best: block_attnres at its own optimum lr" in summary
    assert "- best against best at deep_L16 @ 128 tokens/param: block_attnres " in summary
    assert "lr_check" not in json.loads((out / "length.json").read_text())  # the per-arm runs are not an lr grid
    assert ", 3 seeds)" in summary


def test_a_best_cell_without_the_paper_protocol_s_pairs_is_left_out_with_a_warning() -> None:
    from analysis.io.runs import AnalysisWarning
    from analysis.laws.length_protocols import best_against_best

    own = _own_lr_copy(load_results(SHARED_RESULTS), {})
    cell = (own["size"] == "deep_L16") & (own["budget"].astype(float) == 128.0)
    best = own[cell & (own["variant"] == "block_attnres") & own["seed"].isin([0, 1, 2])].copy()
    best["lr"] *= 1.4
    with pytest.warns(AnalysisWarning, match="deep_L16 @ 128 tokens/param; left out"):
        assert best_against_best(own[~cell], best) == []


def test_one_best_against_best_seed_says_it_has_no_verdict() -> None:
    from analysis.render.length_protocols_text import best_lines

    row = {"size": "deep_L16", "tokens_per_param": 128.0, "delta_best": -0.0576, "delta_best_ci95": None, "n_pairs": 1}
    assert best_lines([row], "block_attnres") == [
        "best against best at deep_L16 @ 128 tokens/param: block_attnres -0.0576 (no interval) (no verdict, 1 seed)"
    ]
