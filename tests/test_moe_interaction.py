"""analysis.studies.moe_interaction: the per-rung same-seed differences with and without MoE, and their interaction."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.studies.moe_interaction import interaction_markdown, interaction_table, plot_interaction


def _runs(effect: dict[int, float], offset: float = 0.0, d_model=None) -> pd.DataFrame:
    rows = []
    for n_layers, gain in effect.items():
        for seed, noise in ((0, 0.01), (1, -0.02), (2, 0.03)):
            base = 3.0 - 0.1 * n_layers + noise + offset
            d = (d_model or {}).get(n_layers, 2 * n_layers)
            rows.append(("baseline", n_layers, d, seed, base))
            rows.append(("block_attnres", n_layers, d, seed, base + gain + 0.001 * seed))
    return pd.DataFrame(rows, columns=["variant", "n_layers", "d_model", "seed", "val_loss"]).assign(
        lr_protocol="baseline"
    )


def test_the_table_recovers_known_effects_and_their_interaction(tmp_path):
    moe, dense = _runs({8: 0.05, 10: -0.01}, offset=-0.1), _runs({8: -0.02, 10: -0.04, 12: -0.05})
    t = interaction_table(moe, dense)
    assert t["n_layers"].tolist() == [8, 10]  # only the rungs both hold
    assert t["delta_moe"].tolist() == pytest.approx([0.051, -0.009])
    assert t["delta_dense"].tolist() == pytest.approx([-0.019, -0.039])
    assert t["interaction"].tolist() == pytest.approx([0.07, 0.03])
    lo, hi = t["interaction_ci95"][0]  # the same per-seed offsets on both sides: the interval is a point
    assert lo == pytest.approx(0.07)
    assert hi == pytest.approx(0.07)
    assert t["verdict_moe"].tolist() == ["loses", "wins"]
    assert "| 8 | 16 | 0,1,2 |" in interaction_markdown(t)
    assert plot_interaction(t, tmp_path / "f.png").stat().st_size > 5000
    assert plot_interaction(t.iloc[:1], tmp_path / "one.png").stat().st_size > 5000  # a single rung


def test_a_rung_whose_shape_differs_is_refused():
    with pytest.raises(ValueError, match="d_model"):
        interaction_table(_runs({8: 0.0}, d_model={8: 32}), _runs({8: 0.0}))
