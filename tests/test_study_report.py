"""What `python -m sweeps.study` prints at its end beside its own fit: the committed full result of the same study
and one sentence on the regime its runs measured."""

from __future__ import annotations

import pytest

from analysis.render.study_headline import committed_lines, regime_sentence
from results import ledger as records
from sweeps.study import DEFAULT_STUDY, REPO, STUDIES

COMMITTED_LADDER = "docs/results/cpu_ladder/pooled/fit.json"  # 6 seeds (3 design + 3 held-out), d = 32 ladder
COMMITTED_DEEP = "docs/results/cpu_deep/pooled/fit.json"  # 6 seeds (3 design + 3 held-out), the deep ladder


def test_the_regime_sentence_describes_the_runs_shape(tmp_path):
    study = tmp_path / "s"
    for i, (n_layers, d_model, heads, params, tokens) in enumerate(
        [(4, 32, 2, 47392, 432000), (7, 32, 2, 93750, 843776), (7, 32, 2, 93750, 843776)]
    ):
        records.add_record(
            study,
            records.make_record(
                run_id=f"r{i}",
                status="completed" if i < 2 else "failed",
                n_layers=n_layers,
                d_model=d_model,
                n_heads=heads,
                seq_len=128,
                params_non_embedding=params,
                tokens=tokens,
                val_loss=2.0,
                pflops_days=1e-9,
            ),
        )
    text = regime_sentence(study / "results.csv")
    assert text.startswith("regime: L_b 4-7 transformer blocks (8-14 sublayers), d_model 32 (2 heads), context 128, 9")
    assert "tokens per parameter" in text
    assert "24-34 sublayers" in text
    assert "docs/results/cpu_map/" in text
    # a study says why it measures at its shape, at the end of the same sentence
    why = regime_sentence(study / "results.csv", STUDIES["deep"].why)
    assert why.startswith(text.split("(where")[0].rstrip())
    assert why.endswith(STUDIES["deep"].why)
    assert "d_model = 2 L_b" in why


def test_the_default_study_is_the_deep_ladders_slice_beside_its_committed_result():
    """`python -m sweeps.study` runs the deep ladder's baseline and Block AttnRes; the full result it prints beside
    its own is the committed six-seed deep ladder, and every study of that ladder says why it measures there."""
    deep = STUDIES[DEFAULT_STUDY]
    assert DEFAULT_STUDY == "deep"
    assert deep.sweep == "cpu_deep"
    assert "model=baseline,block_attnres" in deep.overrides
    assert deep.committed == STUDIES["deep_full"].committed == COMMITTED_DEEP
    assert all(STUDIES[name].why for name in ("deep", "deep_full", "deep_per_arm", "cpu", "tiny"))
    lines = committed_lines(REPO / COMMITTED_DEEP, REPO)
    assert len(lines) == 4  # Block and Full, each at the shared and at its own lr
    assert any("block_attnres: m = 1.075x (95% CI 0.975-1.158)" in line for line in lines)
    assert all("6 seeds per size" in line for line in lines)


def test_the_d32_ladder_prints_the_committed_result_beside_its_own():
    assert STUDIES["cpu"].committed == STUDIES["tiny"].committed == COMMITTED_LADDER
    lines = committed_lines(REPO / COMMITTED_LADDER, REPO)
    assert len(lines) == 2
    assert "block_attnres: m = 0.879x (95% CI 0.799-1.013)" in lines[0]
    assert "6 seeds per size" in lines[0]
    assert committed_lines(REPO / "docs" / "no_such_fit.json") == []


SHAPE_KEYS = ("size", "size.n_layers", "size.d_model", "size.d_over_lb", "size.heads_over_lb")


def _study_shapes(name: str) -> list[dict[str, float]]:
    """One row per shape a study's sweep trains (its study overrides applied; budgets: one row per budget), as a
    completed run of that shape would record it."""
    from conftest import compose
    from hydra.core.override_parser.overrides_parser import OverridesParser

    s = STUDIES[name]
    params = {
        str(k): str(v)
        for k, v in (compose([f"+sweep={s.sweep}"], return_hydra_config=True).hydra.sweeper.params or {}).items()
    }
    fixed = []
    parser = OverridesParser.create()
    for text, o in zip(s.overrides, parser.parse_overrides(list(s.overrides))):
        if o.is_sweep_override():
            params[o.key_or_group] = text.split("=", 1)[1]
        else:
            fixed.append(text)
    axes = [
        [f"{o.key_or_group}={v}" for v in (o.sweep_string_iterator() if o.is_sweep_override() else [o.value()])]
        for o in parser.parse_overrides([f"{k}={v}" for k, v in params.items() if k in SHAPE_KEYS])
    ]
    cells: list[list[str]] = [[]]
    for axis in axes:
        cells = [[*c, v] for c in cells for v in axis]
    rows = []
    for cell in cells:
        cfg = compose([f"+sweep={s.sweep}", *fixed, *cell])
        n = float(cfg.size.target_params)
        tokens = cfg.train.get("tokens") or float(cfg.train.flops_budget) / (6 * n)
        for budget in cfg.train.get("budgets") or [None]:
            rows.append(
                {
                    "run_id": f"r{len(rows)}",
                    "status": "completed",
                    "n_layers": cfg.model.n_layers,
                    "d_model": cfg.model.d_model,
                    "n_heads": cfg.model.n_heads,
                    "seq_len": cfg.train.seq_len,
                    "tokens": budget * n if budget is not None else tokens,
                    "params_non_embedding": n,
                }
            )
    return rows


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_every_studys_regime_sentence_says_whether_its_runs_are_at_the_papers_shapes(tmp_path, name):
    """The sentence is built from the runs: the paper's studies (Table 2's sizes, context and ~200 tokens per
    parameter) speak for the paper's regime, every CPU study for its own shape, not the paper's."""
    import pandas as pd

    table = tmp_path / "results.csv"
    pd.DataFrame(_study_shapes(name)).to_csv(table, index=False)
    text = regime_sentence(table, STUDIES[name].why)
    assert "the paper's claim is at 24-34 sublayers, d_model 896-1264 and ~200 tokens per parameter" in text
    if STUDIES[name].sweep.startswith("paper_"):
        assert "not for the paper's" not in text
        assert (
            "these runs are at the paper's shapes and training length, so a result here speaks for its regime" in text
        )
        assert "L_b 12-17 transformer blocks (24-34 sublayers), d_model 896-1264" in text
    else:
        assert "so a result here speaks for this shape, not for the paper's" in text
        assert "paper's shapes" not in text
    if STUDIES[name].why:
        assert text.endswith(f"; {STUDIES[name].why}")


def test_runs_at_the_papers_shapes_but_not_its_length_say_so(tmp_path):
    import pandas as pd

    row = {"run_id": "r0", "status": "completed", "n_layers": 12, "d_model": 896, "n_heads": 12, "seq_len": 8192}
    table = tmp_path / "results.csv"
    pd.DataFrame([{**row, "tokens": 20 * 194e6, "params_non_embedding": 194e6}]).to_csv(table, index=False)
    text = regime_sentence(table)
    assert (
        "at the paper's shapes but 20 tokens per parameter, so a result here speaks for the paper's shapes at this"
        in text
    )
    assert "not for the paper's" not in text
    assert "docs/results/cpu_map" not in text  # the CPU map's note is for CPU shapes
    pd.DataFrame([{**row, "n_layers": 18, "tokens": 200 * 194e6, "params_non_embedding": 194e6}]).to_csv(
        table, index=False
    )
    assert "(36-36 sublayers)" in regime_sentence(table)  # one depth past the paper's 34 sublayers: not its shape
    assert "speaks for this shape, not for the paper's" in regime_sentence(table)
