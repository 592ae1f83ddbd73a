"""studies.lr (and laws.lr_optimum, the parabola's vertex): known optima are recovered from synthetic LR curves,
edges are warned about, and the CLI writes the config the size files read."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from synthetic_records import synthetic_lr_study

from analysis.__main__ import main
from analysis.io.runs import AnalysisWarning
from analysis.laws.lr_optimum import quadratic_vertex, reference_optimum
from analysis.studies.lr import lr_optima_with_draws

SQRT2_GRID = tuple(1e-3 * 2 ** (k / 2) for k in range(9))  # 1e-3 .. 1.6e-2
OPTIMA = {
    ("cpu_xs", "baseline"): 6e-3,
    ("cpu_s", "baseline"): 4e-3,
    ("cpu_m", "baseline"): 2.5e-3,
    ("cpu_xs", "block_attnres"): 7e-3,
    ("cpu_s", "block_attnres"): 3e-3,
}


def _optima(df, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table, info, _ = lr_optima_with_draws(df, B=400, **kw)
    return table, info, [str(w.message) for w in caught if issubclass(w.category, AnalysisWarning)]


def test_vertex_matches_the_scipy_reference() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        x = np.sort(rng.uniform(-8, -3, 7))
        y = 2.0 + rng.uniform(0.02, 0.2) * (x - rng.uniform(-7, -4)) ** 2 + 0.002 * rng.standard_normal(7)
        x_opt, *_ = quadratic_vertex(x, y)
        assert x_opt == pytest.approx(reference_optimum(x, y), abs=1e-6)


def test_recovers_known_optima_from_exact_parabolas() -> None:
    table, _, warned = _optima(synthetic_lr_study(OPTIMA, grid=SQRT2_GRID, skew=0.0, sigma=0.0))
    assert not warned
    for r in table.itertuples():
        assert r.lr == pytest.approx(OPTIMA[(r.size, r.variant)], rel=1e-6)
        assert not r.on_edge
        assert r.edge is None


@pytest.mark.parametrize("seeds", [(0,), (0, 1, 2)])
def test_recovers_known_optima_from_noisy_skewed_curves_with_covering_intervals(seeds: tuple[int, ...]) -> None:
    df = synthetic_lr_study(OPTIMA, grid=SQRT2_GRID, skew=0.02, sigma=0.002, seeds=seeds, rng=11)
    table, info, _ = _optima(df, seed_sigma=0.002 if len(seeds) == 1 else None)
    assert info["sigma"] == pytest.approx(0.002, rel=0.5 if len(seeds) > 1 else 1e-9)
    for r in table.itertuples():
        truth = OPTIMA[(r.size, r.variant)]
        assert r.lr == pytest.approx(truth, rel=0.12)
        lo, hi = r.ci95
        assert lo < r.lr < hi
        assert lo < truth * 1.1
        assert hi > truth / 1.1
        assert ("cluster" in r.interval_method) == (len(seeds) > 1)
    assert list(table["size"][table["variant"] == "baseline"]) == ["cpu_xs", "cpu_s", "cpu_m"]  # by parameters


def test_optimum_on_a_grid_edge_is_flagged_and_warned() -> None:
    grid = (2e-3, 4e-3, 8e-3, 1.6e-2)
    df = synthetic_lr_study(
        {("cpu_xs", "baseline"): 1e-3, ("cpu_s", "baseline"): 4e-2, ("cpu_m", "baseline"): 5e-3}, grid=grid, skew=0.0
    )
    table, _, warned = _optima(df, seed_sigma=0.003)
    by = {r.size: r for r in table.itertuples()}
    assert by["cpu_xs"].on_edge
    assert by["cpu_xs"].edge == "low"
    assert by["cpu_xs"].grid_best_lr == 2e-3
    assert by["cpu_s"].on_edge
    assert by["cpu_s"].edge == "high"
    assert not by["cpu_m"].on_edge
    assert any("cpu_xs" in w and "low edge" in w for w in warned)
    assert any("cpu_s" in w and "high edge" in w for w in warned)
    assert not any("cpu_m" in w for w in warned)


def test_diverged_runs_bound_the_curve_and_are_reported() -> None:
    df = synthetic_lr_study({("cpu_xs", "baseline"): 4e-2}, grid=(2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2), diverge_above=2e-2)
    table, _, warned = _optima(df, seed_sigma=0.003)
    r = table.iloc[0]
    assert r["edge"] == "divergence"
    assert not r["on_edge"]
    assert r["n_diverged"] == 1
    assert r["lr"] == pytest.approx(1.6e-2)
    assert r["mean_loss"][-1] is None
    assert any("did not diverge" in w for w in warned)


def test_cli_writes_report_figure_and_the_generated_config(tmp_path: Path) -> None:
    df = synthetic_lr_study(OPTIMA, grid=SQRT2_GRID, sigma=0.002, rng=5)
    results = tmp_path / "results.csv"
    df.to_csv(results, index=False)
    cfg = tmp_path / "conf" / "tuned_lr" / "mine.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnalysisWarning)
        rc = main(
            [
                "lr",
                "--results",
                str(results),
                "--out",
                str(tmp_path / "rep"),
                "--bootstrap",
                "200",
                "--write-config",
                str(cfg),
                "--seed-sigma",
                "0.002",
            ]
        )
    assert rc == 0
    doc = json.loads((tmp_path / "rep" / "lr.json").read_text())
    assert {(o["size"], o["variant"]) for o in doc["optima"]} == set(OPTIMA)
    assert (tmp_path / "rep" / "fig_lr.png").stat().st_size > 10_000
    text = cfg.read_text()
    assert text.startswith("# GENERATED by `python -m analysis lr --results")
    tuned = yaml.safe_load(text)
    assert set(tuned["lr"]) == {"baseline", "block_attnres"}
    assert tuned["lr"]["baseline"]["cpu_s"] == pytest.approx(4e-3, rel=0.12)
    assert tuned["provenance"]["n_runs"] == len(df)
    assert tuned["provenance"]["source"] == str(results)
    assert "cpu_m" in (tmp_path / "rep" / "lr_summary.md").read_text()


def test_trend_rule_writes_the_power_law_in_n(tmp_path: Path) -> None:
    from synthetic_records import SIZES

    n = {name: 12 * L * d * d for name, L, d, _ in SIZES}  # synthetic._record's params_non_embedding
    truth = {s: 0.5 * n[s] ** -0.3 for s in ("cpu_xs", "cpu_s", "cpu_m", "cpu_l")}
    grid = tuple(1e-3 * 2 ** (k / 2) for k in range(11))
    df = synthetic_lr_study({(s, "baseline"): v for s, v in truth.items()}, grid=grid, sigma=0.004, rng=2)
    df.to_csv(tmp_path / "r.csv", index=False)
    cfg = tmp_path / "t.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnalysisWarning)
        assert (
            main(
                [
                    "lr",
                    "--results",
                    str(tmp_path / "r.csv"),
                    "--out",
                    str(tmp_path / "o"),
                    "--bootstrap",
                    "50",
                    "--seed-sigma",
                    "0.004",
                    "--rule",
                    "trend",
                    "--write-config",
                    str(cfg),
                    "--no-figures",
                ]
            )
            == 0
        )
    doc = yaml.safe_load(cfg.read_text())
    assert doc["provenance"]["rule"] == "trend"
    for s, v in truth.items():
        assert doc["lr"]["baseline"][s] == doc["lr_trend"]["baseline"][s] == pytest.approx(v, rel=0.1)
        assert doc["lr_per_size"]["baseline"][s] == pytest.approx(v, rel=0.2)
    trend = json.loads((tmp_path / "o" / "lr.json").read_text())["trend"]["baseline"]
    assert trend["b"] == pytest.approx(-0.3, abs=0.1)
    assert trend["n_sizes"] == 4


# ---- several budgets per (size, arm): the optimum per budget, the next lr on an edge, the lr rule ------------------

BUDGETS = (8.0, 32.0, 128.0)
WIDE_GRID = tuple(6e-5 * 2 ** (k / 2) for k in range(18))  # 6e-5 .. 1.6e-2
RULE = {"baseline": (4.0, -0.3, -0.45), "block_attnres": (4.3, -0.3, -0.5)}  # (a, b, c): ln lr* = a + b ln N + c ln D


def _n_of(size: str) -> int:
    from synthetic_records import SIZES

    _, L, d, _ = next(s for s in SIZES if s[0] == size)
    return 12 * L * d * d  # synthetic_records._record's params_non_embedding


def _planted(variant: str, size: str, budget: float) -> float:
    a, b, c = RULE[variant]
    n = _n_of(size)
    return math.exp(a + b * math.log(n) + c * math.log(budget * n))


def budget_lr_study(
    optima: dict[tuple[str, str, float], float],
    grid: tuple[float, ...] = WIDE_GRID,
    *,
    seeds: tuple[int, ...] = (0,),
    sigma: float = 0.0,
    study: str = "synthetic_budgets_lr",
    rng: int = 0,
) -> pd.DataFrame:
    """A multi-budget LR study: ``optima[(size, variant, tokens per param)] = lr*``; each budget's runs are
    synthetic_lr_study's curves with that budget's ``budget``, ``tokens`` and ``trunk_id`` (one launch per lr)."""
    parts = []
    for k, ((size, variant, budget), lr_star) in enumerate(optima.items()):
        part = synthetic_lr_study(
            {(size, variant): lr_star}, grid=grid, seeds=seeds, sigma=sigma, skew=0.0, study=study, rng=rng + k
        )
        part["budget"] = budget
        part["tokens"] = (budget * part["params_non_embedding"]).astype(int)
        part["trunk_id"] = part["run_id"] + f"-b{max(BUDGETS):g}"
        part["run_id"] = part["run_id"] + f"-b{budget:g}"
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def _rule_optima(sizes=("cpu_xs", "cpu_s", "cpu_m")) -> dict[tuple[str, str, float], float]:
    return {(s, v, b): _planted(v, s, b) for v in RULE for s in sizes for b in BUDGETS}


def test_per_budget_optima_are_recovered_inside_their_intervals() -> None:
    optima = _rule_optima(("cpu_xs", "cpu_s"))
    df = budget_lr_study(optima, sigma=0.002, rng=7)  # one tuning seed, as the grids are run
    table, _, warned = _optima(df, seed_sigma=0.002)
    assert not warned
    assert len(table) == len(optima)
    assert list(table.columns[-5:]) == ["tokens_per_param", "tokens", "ci_ratio", "ci_end_rise", "next_lr"]
    covered = 0
    for r in table.itertuples():
        truth = optima[(r.size, r.variant, r.tokens_per_param)]
        lo, hi = r.ci95
        assert lo < r.lr < hi
        assert lo < truth * 1.1
        assert hi > truth / 1.1
        covered += lo < truth < hi
        assert r.lr == pytest.approx(truth, rel=0.12)
        assert r.ci_ratio == pytest.approx(hi / lo)
        assert not r.on_edge
        assert pd.isna(r.next_lr)
        assert "parametric" in r.interval_method
    assert covered >= len(table) - 1
    base = table[table["variant"] == "baseline"]
    assert list(zip(base["size"], base["tokens_per_param"])) == [(s, b) for s in ("cpu_xs", "cpu_s") for b in BUDGETS]


def test_the_loss_rise_at_an_interval_end_is_read_off_the_grid_curve() -> None:
    """On an exact parabola y = y0 + c (x - x0)^2 the rise to the worse end of [x0 - 0.5, x0 + 0.3] is c 0.25; an end
    off the grid gives nan, so a flat valley is never claimed where the grid does not reach."""
    from analysis.studies.lr import _interval_end_rise

    x = np.log(5e-3) + np.log(2) * np.arange(-2, 3)
    x0, c = float(x[2]) + 0.1, 0.04
    y = 1.3 + c * (x - x0) ** 2
    rise = _interval_end_rise(x, y, [math.exp(x0 - 0.5), math.exp(x0 + 0.3)], 1.3, 2)
    assert rise == pytest.approx(c * 0.25, rel=1e-9)
    assert np.isnan(_interval_end_rise(x, y, [math.exp(x[0] - 0.1), math.exp(x0)], 1.3, 2))
    assert np.isnan(_interval_end_rise(x, y, [float("nan"), math.exp(x0)], 1.3, 2))


def test_a_single_budget_study_keeps_its_columns() -> None:
    table, _, _ = _optima(synthetic_lr_study(OPTIMA, grid=SQRT2_GRID, skew=0.0, sigma=0.0))
    assert "tokens_per_param" not in table.columns
    assert "next_lr" not in table.columns


def test_an_edge_cell_is_flagged_with_the_lr_to_run_next(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    grid = (2e-3, 4e-3, 8e-3, 1.6e-2)
    optima = {("cpu_s", "baseline", 8.0): 2.4e-2, ("cpu_s", "baseline", 32.0): 5e-3, ("cpu_s", "baseline", 128.0): 1e-3}
    df = budget_lr_study(optima, grid)
    table, _, warned = _optima(df, seed_sigma=0.002)
    by = {r.tokens_per_param: r for r in table.itertuples()}
    assert (by[8.0].edge, by[8.0].next_lr) == ("high", 3.2e-2)
    assert (by[128.0].edge, by[128.0].next_lr) == ("low", 1e-3)
    assert not by[32.0].on_edge
    assert pd.isna(by[32.0].next_lr)
    assert any("cpu_s @ 128 tokens/param lies at the low edge" in w for w in warned)
    df.to_csv(tmp_path / "results.csv", index=False)
    args = ["lr", "--results", str(tmp_path / "results.csv"), "--out", str(tmp_path / "o"), "--bootstrap", "100"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnalysisWarning)
        assert main([*args, "--seed-sigma", "0.002", "--no-figures"]) == 0
        out = capsys.readouterr().out
        assert "baseline cpu_s @ 128 tokens/param: lr = 0.002 [" in out
        assert "ON THE LOW EDGE OF THE GRID: next lr 1e-3" in out
        # the study's sweep is not known: just the lr
        assert "next run: baseline cpu_s, lr 1e-3 (on the low edge at 128 tokens/param)\n" in out
        assert main([*args, "--seed-sigma", "0.002", "--no-figures", "--sweep", "cpu_budgets_lr"]) == 0
    out = capsys.readouterr().out
    assert (
        "next run: baseline cpu_s, lr 3.2e-2 (on the high edge at 8 tokens/param): `python -m experiments.train -m "
        "+sweep=cpu_budgets_lr seed=0 size.n_layers=3 model=baseline size.lr=3.2e-2`"
    ) in out
    summary = (tmp_path / "o" / "lr_summary.md").read_text()
    assert "**on the low edge: next lr 1e-3**" in summary
    assert "size.lr=1e-3`" in summary


def test_the_rule_recovers_known_coefficients_and_counts_the_left_out_cells() -> None:
    from analysis.laws.lr_rule import lr_rule

    rng = np.random.default_rng(0)
    a, b, c = 3.0, -0.3, -0.45
    ln_n = np.repeat(np.log([1e5, 3e5, 1e6]), 3)
    ln_d = ln_n + np.tile(np.log(BUDGETS), 3)
    ln_lr = a + b * ln_n + c * ln_d
    ci = np.column_stack([ln_lr - 0.1, ln_lr + 0.1])
    draws = ln_lr[None, :] + 0.05 * rng.standard_normal((400, 9))
    rule = lr_rule(ln_lr, ln_n, ln_d, ci, draws)
    assert rule["terms"] == ["a", "b", "c"]
    assert rule["weighted"]
    assert (rule["a"], rule["b"], rule["c"]) == pytest.approx((a, b, c), abs=1e-9)
    for name, truth in (("a", a), ("b", b), ("c", c)):
        lo, hi = rule[f"{name}_ci95"]
        assert lo < truth < hi
    assert (rule["loo_inside"], rule["loo_n"]) == (9, 9)
    # one cell off the plane by 1 in ln lr, with a wide interval (a small weight): it alone lies outside
    off = ln_lr.copy()
    off[4] += 1.0
    wide = ci.copy()
    wide[4] = [off[4] - 0.3, off[4] + 0.3]
    rule = lr_rule(off, ln_n, ln_d, wide, None)
    assert [o["inside"] for o in rule["loo"]] == [True] * 4 + [False] + [True] * 4
    assert (rule["loo_inside"], rule["loo_n"]) == (8, 9)
    assert rule["a_ci95"] is None
    assert rule["n_boot"] == 0
    # one size: b is not identified; two cells determine a and c exactly, and each left out has no refit
    one = lr_rule(ln_lr[:2], ln_n[:2], ln_d[:2], ci[:2], draws[:, :2])
    assert one["terms"] == ["a", "c"]
    assert one["b"] is None
    assert one["c"] == pytest.approx(c)
    assert one["a"] == pytest.approx(a + b * ln_n[0])
    assert (one["loo_inside"], one["loo_n"]) == (0, 0)
    assert "error" in lr_rule(ln_lr[:1], ln_n[:1], ln_d[:1], ci[:1], None)


def test_lr_rule_on_a_study_excludes_edge_cells_and_predicts_the_planted_optima(tmp_path: Path) -> None:
    optima = _rule_optima()
    optima[("cpu_m", "baseline", 128.0)] = 4e-5  # below the grid: excluded from the fit, listed
    df = budget_lr_study(optima, sigma=0.002, rng=4)
    df.to_csv(tmp_path / "results.csv", index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnalysisWarning)
        args = ["lr", "--results", str(tmp_path / "results.csv"), "--out", str(tmp_path / "o")]
        rc = main([*args, "--bootstrap", "300", "--seed-sigma", "0.002"])
    assert rc == 0
    doc = json.loads((tmp_path / "o" / "lr.json").read_text())
    base, block = doc["rules"]["baseline"], doc["rules"]["block_attnres"]
    assert base["excluded"] == [{"size": "cpu_m", "tokens_per_param": 128.0, "reason": "on the low edge"}]
    assert (base["n_cells"], block["n_cells"]) == (8, 9)
    for v, rule in doc["rules"].items():
        _a, b, c = RULE[v]
        assert rule["b"] == pytest.approx(b, abs=0.1)
        assert rule["c"] == pytest.approx(c, abs=0.1)
        assert rule["c_ci95"][0] < c < rule["c_ci95"][1]
        assert rule["loo_n"] == rule["n_cells"]
        assert rule["loo_inside"] >= rule["loo_n"] - 2
    summary = (tmp_path / "o" / "lr_summary.md").read_text()
    assert "## The lr rule per arm: ln lr* = a + b ln N + c ln D" in summary
    assert "cpu_m @ 128 tokens/param (on the low edge)" in summary
    assert (tmp_path / "o" / "fig_lr.png").stat().st_size > 10_000


def test_the_rule_without_the_smallest_size_is_refitted_beside_it(tmp_path: Path) -> None:
    """Block's smallest size planted at 2.5x its rule's lr at every budget: the rule over all sizes misses cells, the
    refit without that size (the other sizes on the rule) predicts its left-out cells; with two sizes there is none."""
    optima = _rule_optima()
    for b in BUDGETS:
        optima[("cpu_xs", "block_attnres", b)] *= 2.5
    df = budget_lr_study(optima, sigma=0.002, rng=4)
    df.to_csv(tmp_path / "results.csv", index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnalysisWarning)
        args = ["lr", "--results", str(tmp_path / "results.csv"), "--out", str(tmp_path / "o")]
        assert main([*args, "--bootstrap", "300", "--seed-sigma", "0.002"]) == 0
    doc = json.loads((tmp_path / "o" / "lr.json").read_text())
    refit = doc["rules_without_smallest"]
    assert refit["size"] == "cpu_xs"
    full, rest = doc["rules"]["block_attnres"], refit["rules"]["block_attnres"]
    assert full["loo_inside"] < full["loo_n"] - 2
    assert rest["n_cells"] == full["n_cells"] - len(BUDGETS)
    assert {c["size"] for c in rest["cells"]} == {"cpu_s", "cpu_m"}
    assert rest["loo_inside"] >= rest["loo_n"] - 1
    assert rest["c"] == pytest.approx(RULE["block_attnres"][2], abs=0.1)
    assert "Without the smallest size (cpu_xs)" in (tmp_path / "o" / "lr_summary.md").read_text()
    two = budget_lr_study(_rule_optima(("cpu_xs", "cpu_s")), sigma=0.002, rng=4)
    table, _, _ = _optima(two, seed_sigma=0.002)
    from analysis.studies.lr import rules_without_smallest

    assert rules_without_smallest(table, np.zeros((3, len(table)))) is None


def test_write_config_of_a_multi_budget_study_writes_lr_per_budget(tmp_path: Path) -> None:
    optima = _rule_optima(("cpu_xs", "cpu_s"))
    optima[("cpu_s", "block_attnres", 128.0)] = 4e-5  # on the edge
    budget_lr_study(optima, sigma=0.002, rng=5).to_csv(tmp_path / "r.csv", index=False)
    cfg = tmp_path / "tuned.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnalysisWarning)
        args = ["lr", "--results", str(tmp_path / "r.csv"), "--out", str(tmp_path / "o"), "--bootstrap", "100"]
        assert main([*args, "--seed-sigma", "0.002", "--no-figures", "--write-config", str(cfg)]) == 0
    doc = yaml.safe_load(cfg.read_text())
    assert set(doc["lr_per_budget"]) == {"baseline", "block_attnres"}
    assert set(doc["lr_per_budget"]["baseline"]) == {"cpu_xs", "cpu_s"}
    assert set(doc["lr_per_budget"]["baseline"]["cpu_s"]) == {8, 32, 128}  # integer keys, as the launcher reads them
    for (s, v, b), truth in optima.items():
        if (s, v, b) == ("cpu_s", "block_attnres", 128.0):
            continue
        assert doc["lr_per_budget"][v][s][int(b)] == pytest.approx(truth, rel=0.15)
        lo, hi = doc["ci95_per_budget"][v][s][int(b)]
        assert lo < doc["lr_per_budget"][v][s][int(b)] < hi
        assert doc["on_edge_per_budget"][v][s][int(b)] is False
    assert doc["on_edge_per_budget"]["block_attnres"]["cpu_s"][128] is True
    for v in RULE:  # the usual section: the optimum at the smallest budget
        for s in ("cpu_xs", "cpu_s"):
            assert doc["lr"][v][s] == doc["lr_per_budget"][v][s][8]
            assert doc["ci95"][v][s] == doc["ci95_per_budget"][v][s][8]
    assert "smallest budget" in doc["provenance"]["method"]


def test_protocol_costs_read_each_arms_excess_off_its_own_curve(tmp_path: Path) -> None:
    """Exact parabolas L = L0 + 0.05 u^2, u = ln(lr / lr*): an arm run at another lr loses exactly 0.05 u^2."""
    from analysis.laws.lr_check import protocol_costs
    from analysis.laws.lr_optimum import loss_at

    x = np.log(np.array(WIDE_GRID))
    y = 2.0 + 0.05 * (x - math.log(1e-3)) ** 2
    assert loss_at(x, y, math.log(3e-4)) == pytest.approx(2.0 + 0.05 * math.log(0.3) ** 2)
    assert math.isnan(loss_at(x, y, math.log(1.0)))  # off the grid: not extrapolated
    optima = _rule_optima(("cpu_xs", "cpu_s"))
    df = budget_lr_study(optima)
    table, _, _ = _optima(df, seed_sigma=0.002)
    costs = protocol_costs(table)
    assert len(costs) == len(optima)
    for c in costs.itertuples():
        own = optima[(c.size, c.variant, c.tokens_per_param)]
        ref = optima[(c.size, "baseline", c.tokens_per_param)]
        trunk = optima[(c.size, "baseline", 8.0)]
        assert c.reference_lr == pytest.approx(ref, rel=1e-3)
        assert c.trunk_lr == pytest.approx(trunk, rel=1e-3)
        for got, at in ((c.excess_reference, ref), (c.excess_trunk, trunk)):
            u = math.log(at / own)
            assert got == pytest.approx(0.05 * u * u, abs=1e-6)
    # at its own optimum the baseline's excess is 0, not the rounding of two equal losses (whose sign is the BLAS's)
    at_own = costs.loc[costs["variant"] == "baseline", "excess_reference"]
    assert all(v == 0.0 and math.copysign(1.0, v) == 1.0 for v in at_own)
    df.to_csv(tmp_path / "r.csv", index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnalysisWarning)
        args = ["lr", "--results", str(tmp_path / "r.csv"), "--out", str(tmp_path / "o"), "--bootstrap", "100"]
        assert main([*args, "--seed-sigma", "0.002", "--no-figures"]) == 0
    summary = (tmp_path / "o" / "lr_summary.md").read_text()
    assert "## What each protocol's lr costs each arm" in summary
    assert "- per budget: " in summary
    assert "- one trunk: " in summary
