"""`python -m analysis fit`'s optional sections (issue 36): a plain table read as one scaling study, the wall-clock
multiplier (fit.json and sweeps.study's headline), the rollout to a held-out rung and the multiplier's sensitivity
to the asymptote E, each on records drawn from a planted law (tests/synthetic_records.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from synthetic_records import synthetic_ladder

from analysis.__main__ import main
from analysis.io.fit_document import FitDocument
from analysis.io.runs import AnalysisWarning, load_results
from analysis.laws.asymptote import e_sensitivity
from analysis.laws.fit import fit_joint, fit_joint_pinned
from analysis.laws.fit_options import FitOptions
from analysis.laws.rollout import rollout
from analysis.render.fit_report import Sections, run_fit
from analysis.render.study_headline import fit_headline as headline

# Written by hand: L = 2 + 1.5 (m C / 1e-5 PFLOP/s-days)^-0.25 with block's m = 1.3 (1% more FLOPs per token),
# C = flops; seed noise sd 0.002. No study_kind, study, pflops_days: a table from another harness.
PLAIN_CSV = """run_id,variant,size,seed,params,tokens,flops,val_loss,status
baseline-s-0,baseline,s,0,200000,1600000,1.92e+12,8.91275,completed
baseline-s-1,baseline,s,1,200000,1600000,1.92e+12,8.90356,completed
baseline-m-0,baseline,m,0,600000,4800000,1.728e+13,5.98956,completed
baseline-m-1,baseline,m,1,600000,4800000,1.728e+13,5.98759,completed
baseline-l-0,baseline,l,0,1800000,14400000,1.5552e+14,4.30198,completed
baseline-l-1,baseline,l,1,1800000,14400000,1.5552e+14,4.30246,completed
baseline-xl-0,baseline,xl,0,5400000,43200000,1.39968e+15,3.32553,completed
baseline-xl-1,baseline,xl,1,5400000,43200000,1.39968e+15,3.32911,completed
block-s-0,block,s,0,200000,1600000,1.9392e+12,8.45226,completed
block-s-1,block,s,1,200000,1600000,1.9392e+12,8.46063,completed
block-m-0,block,m,0,600000,4800000,1.74528e+13,5.72666,completed
block-m-1,block,m,1,600000,4800000,1.74528e+13,5.72551,completed
block-l-0,block,l,0,1800000,14400000,1.5552e+14,4.15077,completed
block-l-1,block,l,1,1800000,14400000,1.5552e+14,4.14999,completed
block-xl-0,block,xl,0,5400000,43200000,1.41368e+15,3.23996,completed
block-xl-1,block,xl,1,5400000,43200000,1.41368e+15,3.24129,completed
block-xl-2,block,xl,2,5400000,43200000,,,failed
"""


def test_a_plain_table_is_fitted_as_one_scaling_study(tmp_path):
    table = tmp_path / "theirs.csv"
    table.write_text(PLAIN_CSV)
    with pytest.warns(AnalysisWarning) as caught:
        rc = main(["fit", "--results", str(table), "--out", str(tmp_path / "o"), "--bootstrap", "200", "--no-figures"])
    assert rc == 0
    said = [str(w.message) for w in caught if "no study_kind column" in str(w.message)]
    assert len(said) == 1
    assert "read as one scaling study" in said[0]
    assert "compute = flops" in said[0]
    doc = json.loads((tmp_path / "o" / "fit.json").read_text())
    assert doc["study"] == "table"
    assert doc["n_runs"] == 16
    assert [e["run_id"] for e in doc["excluded_runs"]] == ["block-xl-2"]
    assert doc["multipliers"]["block"]["m"] == pytest.approx(1.3, rel=0.03)
    # without compute columns at all, 6 x params x tokens stands in, and the line says so
    no_flops = tmp_path / "no_flops.csv"
    no_flops.write_text(
        "\n".join(",".join(c for i, c in enumerate(r.split(",")) if i != 6) for r in PLAIN_CSV.splitlines())
    )
    with pytest.warns(AnalysisWarning, match=r"compute = 6 x params x tokens"):
        rc = main(
            ["fit", "--results", str(no_flops), "--out", str(tmp_path / "p"), "--bootstrap", "50", "--no-figures"]
        )
    assert rc == 0


def _timed_ladder(slowdown: float = 1.25, m: float = 1.2):
    """A 3-seed ladder whose runs carry CPU times: block's seconds per FLOP are ``slowdown`` x the baseline's."""
    df = synthetic_ladder({"block_attnres": m}, seeds=(0, 1, 2), sigma=0.004, rng=3)
    noise = np.exp(0.02 * np.random.default_rng(4).standard_normal(len(df)))
    per_flop = np.where(df["variant"] == "block_attnres", slowdown, 1.0) * 1e-11
    df["cpu_time_s"] = df["flops"] * per_flop * noise
    df.attrs["source"] = "synthetic"
    return df


def test_the_wallclock_multiplier_is_m_times_the_time_ratio_in_fit_json_summary_and_headline(tmp_path):
    df = _timed_ladder()
    doc = run_fit(df, tmp_path / "w", FitOptions(B=200), make_figures=False, sections=Sections(wallclock=True))
    w = doc.wallclock["block_attnres"]
    m = doc.multipliers["block_attnres"].m
    assert w["s_ref_over_s_arm"] == pytest.approx(1 / 1.25, rel=0.02)
    assert w["m_wall"] == pytest.approx(m / 1.25, rel=0.02)
    assert w["m"] == m
    lo, hi = w["m_wall_ci95"]
    assert lo < w["m_wall"] < hi
    assert "wall-clock multiplier m_wall" in (tmp_path / "w" / "summary.md").read_text()
    # the study's headline from the document the fit built, as from its fit.json read back
    assert headline(doc) == headline(FitDocument.from_json(tmp_path / "w" / "fit.json"))
    assert any("block_attnres: wall-clock multiplier m_wall = " in line for line in headline(doc))
    # without the flag fit.json has no such key; the study's headline reads the times from the document's source
    table = tmp_path / "t" / "results.csv"
    table.parent.mkdir()
    df.to_csv(table, index=False)
    plain = run_fit(load_results(table), tmp_path / "n", FitOptions(B=50), make_figures=False)
    assert "wallclock" not in json.loads((tmp_path / "n" / "fit.json").read_text())
    assert plain.wallclock is None
    assert headline(plain) == headline(FitDocument.from_json(tmp_path / "n" / "fit.json"))
    lines = [line for line in headline(plain) if "wall-clock" in line]
    assert len(lines) == 1
    assert f"compute m {plain.multipliers['block_attnres'].m:.3f}x" in lines[0]


def test_the_rollout_covers_a_planted_held_out_rung(tmp_path):
    E, A, alpha, C0, m = 2.0, 1.5, 0.25, 1e-5, 1.2
    df = synthetic_ladder({"block_attnres": m}, n_sizes=6, seeds=(0, 1, 2), sigma=0.004, rng=5)
    ro = rollout(df, FitOptions(B=300), held_out=1)
    assert ro["held_out"] == ["cpu_xxl"]
    assert len(ro["fitted_sizes"]) == 5
    e = ro["variants"]["block_attnres"]
    assert {p["arm"] for p in e["points"]} == {"baseline", "block_attnres"}
    for p in e["points"]:
        lo, hi = p["prediction_interval95"]
        truth = E + A * ((m if p["arm"] == "block_attnres" else 1.0) * p["C"] / C0) ** (-alpha)
        assert lo < truth < hi
        assert p["inside"]
        assert lo <= p["fit_ci95"][0]
        assert p["fit_ci95"][1] <= hi
    lo, hi = e["m_ci95"]
    assert lo < m < hi
    d = e["delta"][0]
    at = {p["arm"]: p["C"] for p in e["points"]}
    truth = A * ((m * at["block_attnres"] / C0) ** (-alpha) - (at["baseline"] / C0) ** (-alpha))
    assert d["n_pairs"] == 3
    assert d["predicted_ci95"][0] < truth < d["predicted_ci95"][1]
    with pytest.raises(ValueError, match="fits at least 3"):
        rollout(df, FitOptions(B=10), held_out=4)
    # through the pipeline: the section, its table and its figure, none of them without the flag
    doc = run_fit(df, tmp_path / "r", FitOptions(B=100), sections=Sections(rollout=1))
    assert doc.rollout["held_out"] == ["cpu_xxl"]
    assert "fig_rollout.png" in doc.files
    assert "## Rollout" in (tmp_path / "r" / "summary.md").read_text()


def test_the_e_sensitivity_table_finds_a_planted_asymptote():
    m = 1.25
    df = synthetic_ladder({"block_attnres": m}, n_sizes=6, seeds=(0, 1), sigma=0.0005, rng=7, C_range=(1e-7, 1e-2))
    es = e_sensitivity(df, FitOptions(), fractions=(0.5, 0.9))
    rows = {r["E_mode"]: r for r in es["variants"]["block_attnres"]["rows"]}
    assert list(rows) == ["fitted", "auto", "0", "0.5 x min L", "0.9 x min L"]
    assert rows["fitted"]["E"] == pytest.approx(2.0, abs=0.03)
    assert not rows["fitted"]["at_bound"]
    assert rows["fitted"]["m"] == pytest.approx(m, rel=0.02)
    assert rows["fitted"]["objective_excess"] == 0.0
    # a wrong asymptote fits worse and moves m away from the truth
    assert rows["0"]["objective_excess"] > 1e-5
    assert abs(math.log(rows["0"]["m"] / m)) > 0.03
    assert rows["0.9 x min L"]["E"] == pytest.approx(0.9 * es["variants"]["block_attnres"]["L_min"])


def test_pinning_e_at_zero_is_the_power_law_form():
    df = synthetic_ladder({"block_attnres": 1.2}, rng=1)
    C, L, isv = df["pflops_days"].to_numpy(), df["val_loss"].to_numpy(), (df["variant"] == "block_attnres").to_numpy()
    keep = df["variant"].isin(["baseline", "block_attnres"]).to_numpy()
    a = fit_joint(C[keep], L[keep], isv[keep], form="power_law")
    b = fit_joint_pinned(C[keep], L[keep], isv[keep], 0.0)
    assert (a.m, a.alpha, a.objective, a.form) == (b.m, b.alpha, b.objective, b.form)
    with pytest.raises(ValueError, match="pinned E"):
        fit_joint_pinned(C[keep], L[keep], isv[keep], float(L.max()))
