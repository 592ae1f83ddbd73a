"""The one paired comparison (analysis.laws.paired.paired_comparison) against a plain reference written here with
numpy and scipy, per cell and arm and by condition (the interaction); and the one way a Δ is drawn
(analysis.render.figures.delta_errorbar, save)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.laws.paired import comparison_entry, paired_comparison, rung_interaction
from analysis.render.figures import delta_errorbar, interval_errors, plt, save


def _runs(seed: int = 0) -> pd.DataFrame:
    """Two cells (n_layers 4, 8) x three arms x seeds 0-3, with seed 3 missing for one arm in one cell."""
    rng = np.random.default_rng(seed)
    rows = []
    for n_layers in (8, 4):
        for variant, shift in (("baseline", 0.0), ("block", -0.02), ("full", 0.01)):
            for s in range(4):
                if (n_layers, variant, s) == (4, "full", 3):
                    continue
                rows.append(
                    {"n_layers": n_layers, "variant": variant, "seed": s, "val_loss": 2 + shift + rng.normal(0, 0.01)}
                )
    return pd.DataFrame(rows)


def _reference(runs: pd.DataFrame, n_layers: int, arm: str) -> dict:
    """The plain same-seed comparison: differences on the common seeds, their mean, sd and Student-t interval."""
    a = runs[(runs["n_layers"] == n_layers) & (runs["variant"] == arm)].set_index("seed")["val_loss"]
    b = runs[(runs["n_layers"] == n_layers) & (runs["variant"] == "baseline")].set_index("seed")["val_loss"]
    seeds = sorted(set(a.index) & set(b.index))
    d = np.array([a[s] - b[s] for s in seeds])
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return {"seeds": seeds, "delta": d.mean(), "sd": d.std(ddof=1), "ci": (d.mean() - half, d.mean() + half)}


def test_paired_comparison_matches_the_plain_reference_per_cell_and_arm():
    runs = _runs()
    table = paired_comparison(runs, "baseline", ["full", "block"], ("n_layers",))
    assert list(zip(table["n_layers"], table["arm"])) == [(4, "full"), (4, "block"), (8, "full"), (8, "block")]
    for r in table.itertuples():
        ref = _reference(runs, r.n_layers, r.arm)
        assert r.seeds == ref["seeds"]
        assert r.n_pairs == len(ref["seeds"])
        assert r.delta == pytest.approx(ref["delta"], abs=1e-12)
        assert r.delta_sd == pytest.approx(ref["sd"], abs=1e-12)
        assert r.delta_ci95 == pytest.approx(ref["ci"], abs=1e-12)
        lo, hi = ref["ci"]
        assert r.verdict == ("wins" if hi < 0 else "loses" if lo > 0 else "undecided")
    assert table.set_index(["n_layers", "arm"]).loc[(4, "full"), "n_pairs"] == 3  # seed 3 has no pair there


def test_one_pair_has_no_interval_and_an_arm_without_runs_has_no_row():
    runs = _runs()
    one = runs[(runs["seed"] == 0) | (runs["variant"] == "baseline")]
    (row,) = paired_comparison(one[one["n_layers"] == 8], "baseline", ["block", "absent"]).itertuples()
    assert (row.n_pairs, row.delta_ci95, row.verdict) == (1, None, "undecided")
    assert comparison_entry(row._asdict())["delta_sd"] is None


def test_no_common_seed_is_missing_and_several_runs_of_a_seed_are_an_error():
    runs = _runs()
    apart = runs.assign(seed=np.where(runs["variant"] == "block", runs["seed"] + 10, runs["seed"]))
    row = paired_comparison(apart, "baseline", ["block"], ("n_layers",)).iloc[0]
    assert (row["n_pairs"], row["verdict"]) == (0, "missing")
    assert comparison_entry(row)["delta"] is None
    with pytest.raises(ValueError, match="several completed runs of seed"):
        paired_comparison(pd.concat([runs, runs.iloc[:1]]), "baseline", ["block"], ("n_layers",))


def test_condition_gives_each_side_and_the_interaction_on_the_seeds_all_four_share():
    a, b = _runs(1), _runs(2)
    runs = pd.concat([a.assign(mlp="moe"), b.assign(mlp="dense")])
    table = paired_comparison(runs, "baseline", ["full"], ("n_layers",), "mlp").set_index("n_layers")
    row = table.loc[4]
    assert row["seeds"] == [0, 1, 2]  # seed 3 of `full` is missing under both
    for name, df in (("moe", a), ("dense", b)):
        ref = _reference(df[df["seed"] < 3], 4, "full")
        assert row[f"delta_{name}"] == pytest.approx(ref["delta"], abs=1e-12)
        assert row[f"delta_{name}_ci95"] == pytest.approx(ref["ci"], abs=1e-12)
    per_seed = [
        (
            a.set_index(["n_layers", "variant", "seed"])["val_loss"]
            - b.set_index(["n_layers", "variant", "seed"])["val_loss"]
        ).loc[(4, v, s)]
        for s in range(3)
        for v in ("full", "baseline")
    ]
    inter = np.array(per_seed[0::2]) - np.array(per_seed[1::2])
    assert row["interaction"] == pytest.approx(inter.mean(), abs=1e-12)
    assert row["n_pairs"] == 3
    with pytest.raises(ValueError, match="needs two values"):
        paired_comparison(runs.assign(mlp="moe"), "baseline", ["full"], ("n_layers",), "mlp")


def test_rung_interaction_is_the_comparison_by_condition_and_checks_the_shapes():
    a, b = (df.assign(d_model=64) for df in (_runs(1), _runs(2)))
    table = rung_interaction({"moe": a, "dense": b}, "full", "baseline")
    direct = paired_comparison(
        pd.concat([a.assign(condition="moe"), b.assign(condition="dense")]),
        "baseline",
        ["full"],
        ("n_layers", "d_model"),
        "condition",
    )
    assert list(table.columns)[:3] == ["n_layers", "d_model", "seeds"]
    assert table["interaction"].tolist() == direct["interaction"].tolist()
    with pytest.raises(ValueError, match="d_model"):
        rung_interaction({"moe": a, "dense": b.assign(d_model=128)}, "full", "baseline")


def test_delta_errorbar_draws_each_interval_and_save_writes_each_format(tmp_path):
    y = np.array([-0.02, 0.01, 0.0])
    ci = [[-0.03, -0.01], None, [-0.005, 0.005]]
    np.testing.assert_allclose(interval_errors(y, ci), [[0.01, 0.0, 0.005], [0.01, 0.0, 0.005]], atol=1e-15)
    fig, ax = plt.subplots()
    bars = delta_errorbar(ax, [0, 1, 2], y, ci, fmt="o")
    (segments,) = bars.lines[2]
    spans = [tuple(seg[:, 1]) for seg in segments.get_segments()]
    assert spans == pytest.approx([(-0.03, -0.01), (0.01, 0.01), (-0.005, 0.005)])
    flat = delta_errorbar(ax, [0, 1, 2], y, ci, horizontal=True, fmt="o")
    assert [tuple(seg[:, 0]) for seg in flat.lines[2][0].get_segments()] == pytest.approx(spans)
    paths = save(fig, tmp_path / "sub" / "fig", (".png", ".pdf"), dpi=72, tight=False)
    assert [p.name for p in paths] == ["fig.png", "fig.pdf"]
    assert all(p.stat().st_size > 0 for p in paths)
    assert fig.number not in plt.get_fignums()  # closed


def test_one_arms_runs_of_one_cell_at_two_lrs_are_a_one_line_error_naming_the_cell_and_seeds():
    rows = [
        {"size": "deep_L16", "tokens_per_param": 128.0, "variant": v, "seed": s, "lr": 4.553e-3, "val_loss": 2.0}
        for v in ("baseline", "block_attnres")
        for s in (0, 1, 2, 20, 21, 22)
    ]
    rows += [
        {"size": "deep_L16", "tokens_per_param": 128.0, "variant": v, "seed": 104, "lr": 2.2765e-3, "val_loss": 2.0}
        for v in ("baseline", "block_attnres")
    ]
    runs = pd.DataFrame(rows)
    with pytest.raises(ValueError, match="runs at 2 lrs") as err:
        paired_comparison(runs, "baseline", ["block_attnres"], ("size", "tokens_per_param"))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        "deep_L16 @ 128 tokens/param, baseline: runs at 2 lrs (4.553e-3: seeds 0,1,2,20,21,22; 2.2765e-3: seed 104); "
        "select one lr (keep records of one lr) for the paired comparison"
    )
    one_lr = runs[runs["lr"] == 4.553e-3]
    assert paired_comparison(one_lr, "baseline", ["block_attnres"], ("size", "tokens_per_param"))[
        "n_pairs"
    ].tolist() == [6]
    # arms at their own lrs (lr_protocol per_arm), an arm not compared, and two conditions at two lrs are fine
    own = one_lr.assign(lr=np.where(one_lr["variant"] == "block_attnres", 3e-3, 4.553e-3))
    other = own.iloc[:2].assign(variant="full", lr=[1e-3, 2e-3])
    assert len(paired_comparison(pd.concat([own, other]), "baseline", ["block_attnres"], ("size",))) == 1
    recipes = pd.concat([own.assign(recipe="adamw"), own.assign(recipe="muon", lr=own["lr"] * 3)])
    assert len(paired_comparison(recipes, "baseline", ["block_attnres"], ("size",), "recipe")) == 1
