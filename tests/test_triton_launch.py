"""The Triton depth kernels' launch choice (attnres/triton_launch.py): a pure function of the call's key, read from
the tables in a fixed order, and the rule the packaged table was selected by. No triton needed."""

from __future__ import annotations

import json

import pytest

from attnres import triton_launch as tl_
from experiments.bench.triton_aot import TABLE_KEYS


def test_the_packaged_table_covers_its_keys_and_launches_are_deterministic():
    """Every key the table is selected for has an entry; the same key gives the same launch (a resume launches
    the same programs); D sets only the chunk count; the Q of a call is looked up padded to a power of two."""
    table = tl_._table(str(tl_.PACKAGED))
    assert {tl_.key(k, n, q) for k, n, q in TABLE_KEYS} <= set(table)
    a = tl_.launch("attend_fwd", 1264, 5)
    assert a == tl_.launch("attend_fwd", 1264, 5)
    assert a == tl_.launch("attend_fwd", 1264, 7)  # both compiled for Q_PAD = 8
    assert tl_.launch("attend_fwd", 896, 5).block_t == a.block_t
    assert (a.chunk, a.n_chunks, a.padded) == (32, 40, 1280)
    assert tl_.launch("merge_bwd", 1264, 9) == tl_.launch("merge_bwd", 1264, 9, has_q=True)  # fallback: K = 9
    assert tl_.tile("merge_bwd", 9) == tl_.fallback("merge_bwd", 9)


def test_a_tuned_table_comes_first_by_key_with_d_then_without(tmp_path, monkeypatch):
    fast, general = tl_.Tile(16, 8, 2, 1, 3), tl_.Tile(8, 4, 4, 1, 5)
    path = tmp_path / "tuned.json"
    tl_.write_table(path, {tl_.key("attend_bwd", 4, D=1264): fast, tl_.key("attend_bwd", 4): general}, {"how": "x"})
    assert json.loads(path.read_text())["meta"] == {"how": "x"}
    monkeypatch.setenv(tl_.ENV_TABLE, str(path))
    got = tl_.launch("attend_bwd", 1264, 3)  # Q 3 -> 4
    assert (got.block_t, got.warps, got.unroll, got.per_sm) == (16, 8, 2, 3)
    got = tl_.launch("attend_bwd", 896, 4)
    assert (got.block_t, got.warps, got.unroll, got.per_sm) == (8, 4, 4, 5)
    with tl_.forced(tl_.Tile(4, 4, 1)):
        assert tl_.launch("attend_bwd", 1264, 4).block_t == 4
    assert tl_.launch("merge_fwd", 1264, 1) == tl_.launch("merge_fwd", 1264, 1)  # not in it: the packaged table
    monkeypatch.delenv(tl_.ENV_TABLE)
    assert tl_.launch("attend_bwd", 1264, 4) == tl_.launch("attend_bwd", 1264, 4)


def test_select_takes_no_spills_then_occupancy_then_bytes_in_flight_then_less_unrolling():
    a, b, c, d = tl_.Tile(4, 4, 1), tl_.Tile(8, 4, 8), tl_.Tile(16, 4, 8), tl_.Tile(16, 8, 8)
    # (tile, registers, spill bytes, blocks per SM); attend rows are 64 bytes: b has 5 x 8 x 8 x 64 = 20 KB in flight
    compiled = [(a, 40, 0, 12), (b, 96, 0, 5), (c, 128, 4, 4), (d, 160, 0, 1)]
    assert tl_.select(compiled, "attend_fwd", 4) == tl_.Tile(8, 4, 8, 1, 5)  # c spills, d leaves 8 warps
    assert tl_.select([(d, 160, 0, 1), (c, 128, 4, 4)], "attend_fwd", 4) == tl_.Tile(16, 8, 8, 1, 1)  # no spill first
    # merge_bwd with 3 extras: 448-byte rows; both reach 32 KB in flight, the less unrolled one is taken
    e, f = tl_.Tile(16, 4, 2), tl_.Tile(16, 4, 8)
    assert tl_.select([(f, 100, 0, 4), (e, 90, 0, 4)], "merge_bwd", 3) == tl_.Tile(16, 4, 2, 1, 4)
    assert tl_.select([(a, 40, 0, 4), (tl_.Tile(4, 4, 1, 2), 40, 0, 4)], "attend_bwd", 4) == tl_.Tile(4, 4, 1, 1, 4)


def test_candidates_and_keys():
    cands = tl_.candidates("attend_bwd")
    assert tl_.Tile(4, 4, 1) in cands
    assert all(t.block_t >= t.warps for t in cands)
    assert len(cands) == len(set(cands))
    assert tl_.key("merge_fwd", 2, False) == "merge_fwd/n2/noq"
    assert tl_.key("attend_fwd", 5, D=896) == "attend_fwd/D896/n8"
    with pytest.raises(ValueError, match="unknown kernel"):
        tl_.key("attend", 1)
