"""The paired multiplier: same-seed differences read through the baseline's local slope, pooled over sizes by
random effects. It recovers a known multiplier more tightly than the joint fit when the arms share their seed noise,
and widens (and says so) when the sizes disagree."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from synthetic_records import synthetic_ladder

from analysis.laws.fit_options import FitOptions
from analysis.laws.multipliers import pooled_pair_sd
from analysis.laws.scaling_ladder import analyse_scaling


def _fit(df):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        doc = analyse_scaling(df, FitOptions(B=400)).parts
    return doc


def test_paired_multiplier_recovers_a_known_multiplier_and_beats_the_joint_fit_when_noise_is_shared():
    # 1.25x, seed noise 0.02 nats of which 98% is shared by the two arms of a seed (same init and data order)
    df = synthetic_ladder(
        {"block_attnres": 1.25}, n_sizes=4, seeds=(0, 1, 2), sigma=0.02, rho=0.98, flops_overhead=0.0, E=0.0, rng=5
    )
    m = _fit(df)["multipliers"]["block_attnres"]
    p = m["paired"]
    lo, hi = p["m_ci95"]
    assert lo < 1.25 < hi
    assert p["m"] == pytest.approx(1.25, rel=0.05)
    assert (hi - lo) < 0.8 * (m["m_ci95"][1] - m["m_ci95"][0])  # pairing removes the shared noise
    assert p["p_m_le_1"] < 0.01
    assert p["heterogeneity"]["p"] > 0.05
    assert sum(r["weight"] for r in p["per_size"].values()) == pytest.approx(1.0)


def test_sizes_that_disagree_are_reported_and_widen_the_interval():
    df = synthetic_ladder(
        {"block_attnres": 1.25}, n_sizes=4, seeds=(0, 1, 2), sigma=0.02, rho=0.98, flops_overhead=0.0, E=0.0, rng=5
    )
    agree = _fit(df)["multipliers"]["block_attnres"]["paired"]
    # the two largest sizes: Block worse than the baseline by 0.03 nats instead of better
    sizes = list(dict.fromkeys(df["size"]))
    big = df["variant"].eq("block_attnres") & df["size"].isin(sizes[2:])
    base = df[df["variant"] == "baseline"].set_index(["size", "seed"])["val_loss"]
    df.loc[big, "val_loss"] = [base[(s, k)] + 0.03 for s, k in zip(df.loc[big, "size"], df.loc[big, "seed"])]
    split = _fit(df)["multipliers"]["block_attnres"]["paired"]
    h = split["heterogeneity"]
    assert h["p"] < 0.05
    assert h["tau"] > 0
    assert h["I2"] > 0.5
    width = lambda p: math.log(p["m_ci95"][1] / p["m_ci95"][0])  # noqa: E731
    assert width(split) > 3 * width(agree)


def test_pooled_pair_sd_pools_the_arms_of_a_size():
    rows = [
        {"size": "a", "n_pairs": 3, "sd": 0.01},
        {"size": "a", "n_pairs": 3, "sd": 0.03},
        {"size": "b", "n_pairs": 1, "sd": None},
    ]
    sd = pooled_pair_sd(rows)
    assert sd == {"a": pytest.approx(np.sqrt((2 * 0.01**2 + 2 * 0.03**2) / 4))}
