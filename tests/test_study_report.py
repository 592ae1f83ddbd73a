"""What `python -m sweeps.study` prints at its end beside its own fit: the committed full result of the same study
and one sentence on the regime its runs measured."""

from __future__ import annotations

from results import ledger as records
from sweeps.study import (
    COMMITTED_DEEP,
    COMMITTED_LADDER,
    DEFAULT_STUDY,
    REPO,
    STUDIES,
    committed_lines,
    regime_sentence,
)


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
    lines = committed_lines(REPO / COMMITTED_DEEP)
    assert len(lines) == 4  # Block and Full, each at the shared and at its own lr
    assert any("block_attnres: m = 1.075x (95% CI 0.975-1.158)" in line for line in lines)
    assert all("6 seeds per size" in line for line in lines)


def test_the_d32_ladder_prints_the_committed_result_beside_its_own():
    assert STUDIES["cpu"].committed == STUDIES["tiny"].committed == COMMITTED_LADDER
    lines = committed_lines(REPO / COMMITTED_LADDER)
    assert len(lines) == 2
    assert "block_attnres: m = 0.879x (95% CI 0.799-1.013)" in lines[0]
    assert "6 seeds per size" in lines[0]
    assert committed_lines(REPO / "docs" / "no_such_fit.json") == []
