"""The depth-by-width map's cells and the deep ladder's rungs compose to the shapes their configs state.

conf/size/cpu_map.yaml and conf/size/cpu_deep.yaml derive every field from (L_b, d_model) through
experiments.sizes.map_cell; these tests build each swept shape on the meta device and check the stated rules
against the model itself (no training, no Lightning).
"""

from __future__ import annotations

import pytest
import torch
from conftest import compose

from attnres import Transformer
from experiments.config.config_schema import build_model_config
from experiments.run.identity import resolved_container
from experiments.sizes import map_cell

DEEP_RUNGS = (8, 10, 12, 16)
MAP_CELLS = [(L, d) for d in (32, 64, 128) for L in (4, 8, 16)]


def _built(overrides: list[str]):
    cfg = compose([*overrides, "size.lr=1e-2", "data.vocab_size=256"])
    container = resolved_container(cfg)
    with torch.device("meta"):
        model = Transformer(build_model_config(cfg))
    return cfg, container, model


@pytest.mark.parametrize("n_layers", DEEP_RUNGS)
def test_deep_rungs_grow_depth_and_width_together(n_layers):
    """d_model = 2 L_b, 2 heads of width L_b, d_ff = 2.5 d_model (multiple of 8), 8 tokens per non-embedding
    parameter of the built baseline, Block AttnRes with min(8, L_b) blocks."""
    for variant in ("baseline", "block_attnres"):
        cfg, c, model = _built(["+sweep=cpu_deep", f"size.n_layers={n_layers}", f"model={variant}"])
        size = c["size"]
        assert size["name"] == f"deep_L{n_layers}"
        assert size["d_model"] == 2 * n_layers
        assert (size["n_heads"], size["head_dim"]) == (2, n_layers)
        assert size["d_ff"] == 8 * round(2.5 * size["d_model"] / 8)
        assert size["tokens"] == 8 * size["target_params"]
        assert cfg.compile is True  # the ladder trains through the compiled step (conf/train_path/compiled.yaml)
        if variant == "baseline":
            assert model.num_params(non_embedding=True) == size["target_params"]
        else:
            assert c["model"]["n_blocks"] == min(8, n_layers)


def test_the_deep_ladders_top_rung_is_the_maps_winning_cell():
    """The ladder passes through the map's decided cell (L_b 16 x d 32, where Block AttnRes won): same shape."""
    _, deep, _ = _built(["+sweep=cpu_deep", "size.n_layers=16"])
    _, cell, _ = _built(["+sweep=cpu_map", "size.n_layers=16", "size.d_model=32"])
    keys = ("n_layers", "d_model", "n_heads", "head_dim", "d_ff", "target_params", "tokens", "seq_len", "batch_size")
    assert {k: deep["size"][k] for k in keys} == {k: cell["size"][k] for k in keys}
    assert deep["model"]["n_blocks"] == cell["model"]["n_blocks"] == 8


@pytest.mark.parametrize(("n_layers", "d_model"), MAP_CELLS)
def test_map_cells_have_heads_of_16_and_their_stated_n(n_layers, d_model):
    _, c, model = _built(["+sweep=cpu_map", f"size.n_layers={n_layers}", f"size.d_model={d_model}", "model=baseline"])
    size = c["size"]
    assert size["name"] == f"map_L{n_layers}_d{d_model}"
    assert (size["n_heads"], size["head_dim"]) == (d_model // 16, 16)
    assert model.num_params(non_embedding=True) == size["target_params"] == map_cell(n_layers, d_model).params


def test_a_width_that_the_heads_do_not_divide_fails_naming_both():
    with pytest.raises(ValueError, match=r"d_model=40, head_dim=16"):
        map_cell(4, 40)
    with pytest.raises(ValueError, match=r"L_b must be >= 1"):
        map_cell(0, 32, 8)
