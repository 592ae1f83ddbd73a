"""The depth-by-width map's analysis (studies.depth_width_map): same-seed pairs per cell, an interval that covers
at the pair counts the study uses (shown by simulation), verdicts, the boundary along depth, and a figure that
renders on degenerate inputs. No torch."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.studies import depth_width_map as dwm


def _records(deltas: dict[tuple[int, int], list[float]], base_loss: float = 2.0) -> pd.DataFrame:
    rows = []
    for (n_layers, d_model), ds in deltas.items():
        params = 12 * n_layers * d_model**2
        for seed, delta in enumerate(ds):
            loss = base_loss + 0.01 * seed
            for variant, val in (("baseline", loss), ("block_attnres", loss + delta)):
                rows.append(
                    {
                        "variant": variant,
                        "status": "completed",
                        "n_layers": n_layers,
                        "d_model": d_model,
                        "seed": seed,
                        "val_loss": val,
                        "params_non_embedding": params,
                        "tokens": 8 * params,
                        "study_kind": "map",
                    }
                )
    return pd.DataFrame(rows)


def _coverage(
    n_pairs: int, sd: float = 0.02, n_sim: int = 20000, level: float = 0.95, df: float | None = None, seed: int = 0
) -> float:
    """The share of simulated cells whose t interval holds the true delta 0: ``n_pairs`` differences drawn normal with
    ``sd`` (or Student-t with ``df`` degrees of freedom scaled to ``sd``)."""
    rng = np.random.default_rng(seed)
    if df is None:
        x = rng.normal(0.0, sd, size=(n_sim, n_pairs))
    else:
        x = rng.standard_t(df, size=(n_sim, n_pairs)) * sd / math.sqrt(df / (df - 2))
    m, s = x.mean(axis=1), x.std(axis=1, ddof=1)
    half = stats.t.ppf(0.5 + level / 2, n_pairs - 1) * s / math.sqrt(n_pairs)
    return float(np.mean(np.abs(m) <= half))


@pytest.mark.parametrize("n_pairs", [3, 6])
@pytest.mark.parametrize("df", [None, 3.0])
def test_the_t_interval_covers_at_the_studys_pair_counts(n_pairs, df):
    cover = _coverage(n_pairs, sd=0.02, n_sim=20000, df=df, seed=1)
    assert 0.935 <= cover <= 0.975, cover  # normal: 0.95; heavy tails (t with 3 df): slightly conservative


def test_a_normal_interval_on_three_pairs_would_not_cover():
    """Why Student-t: mean +- 1.96 sd/sqrt(n) on three pairs holds the truth far less often than 95%."""
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 0.02, size=(20000, 3))
    half = 1.96 * x.std(axis=1, ddof=1) / math.sqrt(3)
    assert np.mean(np.abs(x.mean(axis=1)) <= half) < 0.82


def test_cells_pair_by_seed_and_give_verdicts():
    df = _records(
        {
            (4, 32): [0.03, 0.04, 0.05, 0.035, 0.045, 0.04],  # loses
            (8, 32): [-0.02, 0.03, 0.0, -0.01, 0.02, -0.015],  # undecided
            (8, 64): [-0.02, -0.025, -0.015, -0.02, -0.03, -0.018],  # wins
            (16, 64): [-0.04],  # one pair: no interval
        }
    )
    df = pd.concat([df, df.iloc[[0]].assign(variant="block_attnres", seed=99)])  # an arm without its pair: left out
    cells = dwm.cell_table(df, cells=[(4, 128)]).set_index(["n_layers", "d_model"])
    assert cells.loc[(4, 32), "verdict"] == "loses"
    assert cells.loc[(8, 32), "verdict"] == "undecided"
    assert cells.loc[(8, 64), "verdict"] == "wins"
    assert cells.loc[(16, 64), "verdict"] == "undecided"
    assert math.isnan(cells.loc[(16, 64), "half_width"])
    assert cells.loc[(4, 128), "verdict"] == "missing"
    assert cells.loc[(4, 32), "n_pairs"] == 6
    assert cells.loc[(8, 64), "delta"] == pytest.approx(np.mean([-0.02, -0.025, -0.015, -0.02, -0.03, -0.018]))
    assert cells.loc[(4, 32), "tokens_per_param"] == pytest.approx(8.0)
    lo, hi = cells.loc[(8, 64), ["ci_lo", "ci_hi"]]
    assert lo < cells.loc[(8, 64), "delta"] < hi < 0


def test_failed_runs_are_not_paired_and_duplicates_are_refused():
    df = _records({(4, 32): [0.01, 0.02, 0.03]})
    df.loc[(df["variant"] == "block_attnres") & (df["seed"] == 1), "status"] = "failed"
    (cell,) = dwm.cell_table(df).itertuples()
    assert cell.n_pairs == 2
    assert cell.seeds == [0, 2]
    with pytest.raises(ValueError, match="share a"):
        dwm.pairs(pd.concat([df, df]))


def test_the_boundary_is_where_the_mean_crosses_zero_along_depth():
    df = _records(
        {
            (4, 32): [0.02, 0.025, 0.015, 0.02],
            (8, 32): [-0.02, -0.025, -0.015, -0.02],
            (16, 32): [-0.04, -0.05, -0.03, -0.04],
            (4, 64): [0.03, 0.03, 0.03, 0.03],
            (8, 64): [0.01, 0.012, 0.008, 0.01],
        }
    )
    bounds = dwm.boundaries(df, dwm.MapOptions(B=400)).set_index("d_model")
    assert bounds.loc[32, "crossing"] == pytest.approx(2 ** (2 + 0.5))  # halfway in log2 between L_b 4 and 8
    assert 4 <= bounds.loc[32, "ci_lo"] <= bounds.loc[32, "crossing"] <= bounds.loc[32, "ci_hi"] <= 8
    assert math.isinf(bounds.loc[64, "crossing"])  # never negative within the map
    assert bounds.loc[64, "p_no_crossing"] == 1.0


def test_the_report_and_figure_render_on_degenerate_maps(tmp_path):
    for name, deltas in {
        "full": {(4, 32): [0.01, 0.02, 0.0], (8, 32): [-0.01, -0.02, 0.0], (8, 64): [-0.03, -0.02, -0.01]},
        "one_pair": {(4, 32): [0.01]},
        "constant": {(4, 32): [0.0, 0.0, 0.0]},
    }.items():
        out = tmp_path / name
        doc = dwm.analyse_map(_records(deltas), out, dwm.MapOptions(B=100), cells=[(16, 128)])
        assert (out / "fig7_map.png").stat().st_size > 5000
        text = (out / "map_summary.md").read_text()
        assert "not run" in text
        assert {c["verdict"] for c in doc["cells"]} >= {"missing"}


def test_the_cli_writes_the_map(tmp_path, capsys):
    from analysis.__main__ import main

    path = tmp_path / "results.csv"
    rec = _records({(4, 32): [0.01, 0.02, 0.03], (8, 64): [-0.01, -0.02, -0.03]})
    rec["run_id"] = [f"run{i}" for i in range(len(rec))]
    rec["pflops_days"] = 1e-9
    rec.to_csv(path, index=False)
    assert main(["map", "--results", str(path), "--out", str(tmp_path / "out"), "--bootstrap", "50"]) == 0
    out = capsys.readouterr().out
    assert "L_b 8 x d 64: delta -0.0200" in out
    assert (tmp_path / "out" / "map.json").is_file()
