"""The lr check of a multi-budget study (laws.lr_check, and through ``python -m analysis length``): each arm's best
lr per budget, whether it moves, and the gain at the best lrs beside the gain at the shared lr, on records with
planted parabolas in ln lr."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from synthetic_records import synthetic_budget_ladder

from analysis.__main__ import main
from analysis.laws.lr_check import has_lr_grid, lr_check

LR0 = 9.451e-3
GRID = (LR0 / 2, LR0, 2 * LR0)
CURV = 0.05  # nats per (ln lr)^2
# per arm and budget: (loss at the optimum, optimum / LR0)
PLANTED = {
    "baseline": {8.0: (2.0, 1.0), 32.0: (1.8, 1.0), 128.0: (1.6, 1.0)},
    "block_attnres": {8.0: (1.99, 1.3), 32.0: (1.78, 1.0), 128.0: (1.57, 0.8)},
}


def _lr_records(planted=PLANTED) -> pd.DataFrame:
    one = synthetic_budget_ladder(n_sizes=1, seeds=(11,), sigma=0.0, rng=0)
    rows = []
    for lr in GRID:
        for r in one.to_dict("records"):
            L_opt, ratio = planted[r["variant"]][float(r["budget"])]
            rows.append(r | {"lr": lr, "val_loss": L_opt + CURV * math.log(lr / (ratio * LR0)) ** 2})
    return pd.DataFrame(rows)


def test_each_arms_optimum_the_moves_and_both_gains_are_recovered():
    df = _lr_records()
    assert has_lr_grid(df)
    assert not has_lr_grid(df[df["lr"] == LR0])
    check = lr_check(df)
    assert check["shared_lr"] == pytest.approx(LR0)
    assert [r["tokens_per_param"] for r in check["rows"]] == [8.0, 32.0, 128.0]
    for r in check["rows"]:
        for arm, by_budget in PLANTED.items():
            L_opt, ratio = by_budget[r["tokens_per_param"]]
            b = r["arms"][arm]
            assert b["best_lr"] == pytest.approx(ratio * LR0, rel=1e-6)  # three points: the parabola is exact
            assert b["loss_at_best"] == pytest.approx(L_opt, abs=1e-9)
            assert not b["on_edge"]
        (La, ra), (Lb, rb) = (PLANTED[a][r["tokens_per_param"]] for a in ("block_attnres", "baseline"))
        assert r["delta_best"] == pytest.approx(La - Lb, abs=1e-9)
        shared = (La + CURV * math.log(1 / ra) ** 2) - (Lb + CURV * math.log(1 / rb) ** 2)
        assert r["delta_shared"] == pytest.approx(shared, abs=1e-9)
        assert r["n_pairs"] == 1
        assert r["delta_shared_ci95"] is None  # one tuning seed: no interval
    moves = {m["arm"]: m for m in check["moves"]}
    assert moves["baseline"]["moves"] is False
    assert moves["block_attnres"]["moves"] is True  # 1.3 -> 0.8 of LR0: a factor 1.63
    assert moves["block_attnres"]["span"] == pytest.approx(1.3 / 0.8, rel=1e-6)


def test_an_optimum_beyond_the_grid_is_flagged_and_read_at_the_edge():
    planted = {a: dict(b) for a, b in PLANTED.items()}
    planted["baseline"][8.0] = (2.0, 3.0)  # above the top of the grid
    check = lr_check(_lr_records(planted))
    b = check["rows"][0]["arms"]["baseline"]
    assert b["on_edge"] is True
    assert b["best_lr"] == pytest.approx(2 * LR0)
    assert b["loss_at_best"] == pytest.approx(2.0 + CURV * math.log(2 / 3) ** 2)
    assert next(m for m in check["moves"] if m["arm"] == "baseline")["any_on_edge"] is True
    with pytest.raises(ValueError, match=r"shared lr 0\.005 is not on the grid"):
        lr_check(_lr_records(), shared_lr=0.005)


def test_the_length_command_reads_an_lr_grid(tmp_path, capsys):
    _lr_records().to_csv(tmp_path / "results.csv", index=False)
    args = ["length", "--results", str(tmp_path / "results.csv"), "--out", str(tmp_path / "o"), "--no-figures"]
    assert main([*args, "--no-fit"]) == 0
    doc = json.loads((tmp_path / "o" / "length.json").read_text())
    assert len(doc["lr_check"]["rows"]) == 3
    assert len(doc["rows"]) == 3  # the per-budget table reads the shared lr's runs only
    out = capsys.readouterr().out
    assert "lr check block_attnres at cpu_xs: the best lr moves with the budget" in out
    assert "lr check baseline at cpu_xs: the best lr stays with the budget" in out
    assert "## The lr check" in (tmp_path / "o" / "length_summary.md").read_text()


def test_the_length_command_stops_on_a_cell_with_runs_at_two_lrs(tmp_path, capsys):
    """A relaunch of one seed at another lr beside the committed records (no seed ran both lrs, so it is no lr grid):
    the paired comparison would pool it with the others; the command stops with one line naming the cell."""
    study = synthetic_budget_ladder(n_sizes=1, seeds=(0, 1, 2), sigma=0.003, rng=1).assign(lr=LR0)
    extra = synthetic_budget_ladder(n_sizes=1, seeds=(104,), sigma=0.003, rng=2).assign(lr=LR0 / 2)
    df = pd.concat([study, extra], ignore_index=True)
    assert not has_lr_grid(df)
    df.to_csv(tmp_path / "results.csv", index=False)
    args = ["length", "--results", str(tmp_path / "results.csv"), "--out", str(tmp_path / "o"), "--no-figures"]
    assert main([*args, "--no-fit"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith(
        "error: cpu_xs @ 8 tokens/param, baseline: runs at 2 lrs (9.451e-3: seeds 0,1,2; 4.7255e-3: seed 104); "
        "select one lr"
    )
    df[df["seed"] != 104].to_csv(tmp_path / "results.csv", index=False)  # the records of one lr: reported
    assert main([*args, "--no-fit"]) == 0
