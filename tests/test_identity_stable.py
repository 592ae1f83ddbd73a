"""A run's identity (config_hash) must not move when the code is reorganised: a relaunched study finds its
completed runs and resumes its interrupted ones only while the hash of the same config stays the same.

The first table holds hashes recorded by the committed CPU-ladder study (runs at commits 86f044f and 99235fe, the
records behind docs/results/cpu_ladder); the second freezes every model variant at cpu_xs, seed 0."""

from __future__ import annotations

import pytest
from conftest import compose

from experiments.run.identity import run_identity

RECORDED = [  # (overrides, config_hash recorded in runs/cpu_ladder/results.csv)
    (("model=baseline", "size=cpu_xs", "seed=0"), "1a01d4acfffb449f"),
    (("model=baseline", "size=cpu_xs", "seed=1"), "27f18aa3a1a38e69"),
    (("model=baseline", "size=cpu_s", "seed=0"), "9e10562444ec9bab"),
    (("model=full_attnres", "size=cpu_xs", "seed=0"), "a8830616852480f0"),
    (("model=full_attnres", "size=cpu_s", "seed=1"), "4f111c1016201d63"),
    (("model=block_attnres", "size=cpu_xs", "seed=0"), "989305e55ac79a6b"),
    (("model=block_attnres", "size=cpu_s", "seed=1"), "abdf194559da3b06"),
    (("model=full_attnres", "size=cpu_s", "seed=0", "lr_protocol=per_arm"), "49e7f65ac0a7a5f3"),
    (("model=block_attnres", "size=cpu_s", "seed=0", "lr_protocol=per_arm"), "0be44dad206d1da8"),
]

FROZEN = [  # model variant at experiment=cpu_ladder size=cpu_xs seed=0 (frozen at commit b8ccddc)
    ("baseline", "1a01d4acfffb449f"),
    ("block_attnres", "989305e55ac79a6b"),
    ("block_multihead", "bb70c53fd3722f8e"),
    ("block_no_key_norm", "c6000fb2c4a2d8c9"),
    ("denseformer", "52cdbd83a5b6fbdf"),
    ("full_attnres", "a8830616852480f0"),
    ("full_input_dependent_query", "9ffe7addbd11bfa8"),
    ("full_no_key_norm", "425893819d5c001a"),
    ("full_sigmoid", "0346c13aaec2f1ad"),
    ("full_sliding_window", "c1c7c78c1fe14d1c"),
    ("full_static_mixing", "b7e912309cfe5b52"),
    ("hyper_dynamic", "2ef6238fc302bd69"),
    ("hyper_static", "724bb4733fbc7ef6"),
    ("laurel", "8434e57501b78280"),
    ("mhc", "f73f2a4fa43a2c3b"),
]


@pytest.mark.parametrize(("overrides", "recorded"), RECORDED, ids=lambda x: "-".join(x) if isinstance(x, tuple) else x)
def test_the_committed_studys_runs_keep_their_config_hash(overrides, recorded):
    assert run_identity(compose(["experiment=cpu_ladder", *overrides]))[0] == recorded


@pytest.mark.parametrize(("variant", "frozen"), FROZEN)
def test_every_variant_keeps_its_config_hash(variant, frozen):
    assert run_identity(compose(["experiment=cpu_ladder", f"model={variant}", "size=cpu_xs", "seed=0"]))[0] == frozen
