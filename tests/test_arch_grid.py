"""The arch_grid study (paper Fig. 7): derived shapes, fixed-compute budgets, the two sweeps, one real run, and
the analysis table/figure.

Fast: the derivation is pure arithmetic; the sweeps are composed cell by cell (Hydra, meta-device FLOP counts);
the real run is a few steps of the smoke preset.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import CONF, compose
from omegaconf import OmegaConf

from experiments.config import resolvers
from experiments.config.compose import sweep_cells
from experiments.config.config_schema import build_model_config
from experiments.config.validation import check_config
from experiments.run.identity import experiment_config, resolved_container, run_identity
from experiments.run.run_plan import planned_steps
from experiments.sizes import ArchShape, baseline_non_embedding, derive_arch_shape, steps_for, steps_for_budget
from experiments.train import train

PAPER_GRID = {"d_over_lb": (15, 30, 45, 60, 75), "heads_over_lb": (0.3, 0.4, 0.5, 0.6, 0.7)}  # Fig. 7
CPU_GRID = {"d_over_lb": (2, 4, 6), "heads_over_lb": (0.3, 0.5, 0.7)}


def _size(name: str):
    return OmegaConf.load(CONF / "size" / f"{name}.yaml")


def _shape(size, r: float, h: float) -> ArchShape:
    return derive_arch_shape(size.target_params, r, h, size.head_dim, size.ff_ratio, size.d_multiple, size.ff_multiple)


def _cost(shape: ArchShape) -> float:  # the documented objective of derive_arch_shape
    return (
        (3 * math.log(shape.params / shape.target_params)) ** 2
        + math.log(shape.achieved_d_over_lb / shape.d_over_lb) ** 2
        + math.log(shape.achieved_heads_over_lb / shape.heads_over_lb) ** 2
        + math.log(shape.achieved_ff_ratio / shape.ff_ratio) ** 2
    )


# ---- derived shapes ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("size_name", "grid", "n_tol", "r_tol", "h_tol", "f_tol"),
    [
        ("paper_arch", PAPER_GRID, 0.01, 0.06, 0.08, 0.04),
        ("cpu_arch", CPU_GRID, 0.025, 0.2, 0.15, 0.08),
    ],
)
def test_derived_shapes_hit_their_targets_in_every_cell(size_name, grid, n_tol, r_tol, h_tol, f_tol):
    size = _size(size_name)
    shapes = {}
    for r, h in itertools.product(grid["d_over_lb"], grid["heads_over_lb"]):
        s = _shape(size, r, h)
        shapes[(r, h)] = s
        assert s.params == baseline_non_embedding(s.n_layers, s.d_model, s.n_heads * s.head_dim, s.d_ff)
        assert abs(s.params_error) < n_tol, (r, h, s)
        assert abs(s.achieved_d_over_lb / r - 1) < r_tol, (r, h, s)
        assert abs(s.achieved_heads_over_lb / h - 1) < h_tol, (r, h, s)
        assert abs(s.achieved_ff_ratio / size.ff_ratio - 1) < f_tol, (r, h, s)
        # integer heads are h L_b rounded down or up; widths sit on their multiples
        assert s.n_heads in (max(1, math.floor(h * s.n_layers)), math.ceil(h * s.n_layers))
        assert s.d_model % size.d_multiple == 0
        assert s.d_ff % size.ff_multiple == 0
        assert s.head_dim == size.head_dim
    # every cell is its own model, and the grid's axes are ordered: wider ratio -> shallower, more heads -> more H
    assert len({(s.n_layers, s.d_model, s.n_heads, s.d_ff) for s in shapes.values()}) == len(shapes)
    for h in grid["heads_over_lb"]:
        depths = [shapes[(r, h)].n_layers for r in grid["d_over_lb"]]
        assert depths == sorted(depths, reverse=True), (h, depths)


@pytest.mark.parametrize(("size_name", "grid"), [("paper_arch", PAPER_GRID), ("cpu_arch", CPU_GRID)])
def test_derived_shape_is_the_best_integer_shape_in_a_wide_box(size_name, grid):
    """derive_arch_shape's search is the documented objective's optimum over a much wider box of integer shapes:
    L_b +-5, H from floor(h L_b) - 1 to ceil(h L_b) + 1, d +-6 multiples, d_ff within +-15% of f d (brute force)."""
    size = _size(size_name)
    md, mf, hd, f = size.d_multiple, size.ff_multiple, size.head_dim, size.ff_ratio
    for r, h in itertools.product(grid["d_over_lb"], grid["heads_over_lb"]):
        s = _shape(size, r, h)
        lb = np.arange(max(1, s.n_layers - 5), s.n_layers + 6)[:, None, None, None]
        heads = np.floor(h * lb) + np.arange(-1, 3)[None, :, None, None]
        d = s.d_model + md * np.arange(-6, 7)[None, None, :, None]
        k_max = math.ceil(0.15 * f * (s.d_model + 6 * md) / mf)
        d_ff = mf * (np.round(f * d / mf) + np.arange(-k_max, k_max + 1)[None, None, None, :])
        lb, heads, d, d_ff = np.broadcast_arrays(lb, heads, d, d_ff)
        ok = (heads >= 1) & (heads <= np.ceil(h * lb) + 1) & (d >= md) & (d_ff >= mf)
        lb, heads, d, d_ff = (x[ok].astype(float) for x in (lb, heads, d, d_ff))
        n = lb * (4 * heads * hd * d + 3 * d * d_ff + 2 * d) + d
        cost = (
            (3 * np.log(n / s.target_params)) ** 2
            + np.log(d / lb / r) ** 2
            + np.log(heads / lb / h) ** 2
            + np.log(d_ff / d / f) ** 2
        )
        i = int(np.argmin(cost))
        assert _cost(s) <= cost[i] + 1e-12, (r, h, s, (lb[i], d[i], heads[i], d_ff[i], n[i], cost[i]))


def test_derivation_rejects_bad_targets():
    with pytest.raises(ValueError, match=r"size\.d_over_lb=-1 must be a positive number"):
        derive_arch_shape(1e6, -1, 0.5, 16, 4.0)
    with pytest.raises(ValueError, match=r"size\.head_dim=0 must be a positive integer"):
        derive_arch_shape(1e6, 4, 0.5, 0, 4.0)
    with pytest.raises(ValueError, match=r"attnres_arch: unknown field 'width'; allowed values: n_layers"):
        resolvers._arch_field("width", 1e6, 4, 0.5, 16, 4.0, 2, 4)


def test_paper_arch_constants_follow_their_stated_rules():
    """ff_ratio = mean d_ff/d_model of the dense paper sizes; lr and batch on Table 2's log-log trends at N."""
    ratios = [_size(f"paper_{n}").d_ff / _size(f"paper_{n}").d_model for n in ("194m", "241m", "296m", "436m", "528m")]
    size = _size("paper_arch")
    assert size.ff_ratio == pytest.approx(np.mean(ratios), abs=0.01)
    # cpu_arch keeps the N of the ladder's old cpu_l (105,456) so that its committed demonstration reproduces
    assert _size("cpu_arch").ff_ratio == size.ff_ratio
    assert _size("cpu_arch").target_params == 105456
    t2 = json.loads((CONF.parent / "analysis" / "data" / "paper.json").read_text())["table2"]
    col = {
        name: [row[t2["columns"].index(name)] for row in t2["rows"]] for name in ("act_params_M", "lr", "batch_size")
    }
    n = np.log(np.array(col["act_params_M"]) * 1e6)
    lr_fit = np.polyfit(n, np.log(col["lr"]), 1)
    batch_fit = np.polyfit(n, np.log(col["batch_size"]), 1)
    target = math.log(size.target_params)
    assert size.lr == pytest.approx(math.exp(np.polyval(lr_fit, target)), rel=0.01)
    assert abs(size.batch_size - math.exp(np.polyval(batch_fit, target))) <= 8
    assert size.batch_size % 8 == 0


# ---- fixed-compute budgets -----------------------------------------------------------------------------
def test_budget_steps_round_to_whole_batches():
    assert steps_for_budget(1e12, 1e6, 32, 128) == round(1e6 / 4096) == 244
    assert steps_for_budget(1.0, 1e6, 32, 128) == 1  # at least one step
    with pytest.raises(ValueError, match="must be > 0"):
        steps_for_budget(0, 1e6, 32, 128)


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        (
            ["train.flops_budget=-1.0"],
            r"train\.flops_budget \(size\.flops_budget\)=-1\.0 must be a number in \(0, inf\]",
        ),
        (["train.flops_budget=lots"], r"train\.flops_budget \(size\.flops_budget\)='lots' must be a number"),
        (["train.flops_budget=true"], r"train\.flops_budget \(size\.flops_budget\)=True must be a number"),
        (["train.tokens=null"], r"train\.tokens \(size\.tokens\) and train\.flops_budget are both null"),
        (
            ["size=cpu_arch", "train.flops_budget=null"],
            r"train\.tokens \(size\.tokens\) and train\.flops_budget are both null",
        ),
    ],
)
def test_bad_budget_is_named(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        check_config(compose(["experiment=cpu_ladder", *overrides]))


def test_tokens_and_budget_must_agree():
    fpt = 1.0e6
    cfg = compose(["experiment=cpu_ladder", "size=cpu_xs", "train.flops_budget=1.0e12"])  # size.tokens = 432,000 too
    check_config(cfg)  # each setting alone is fine ...
    with pytest.raises(
        ValueError,
        match=r"train\.tokens \(size\.tokens\)=432000 gives 844 steps but "
        r"train\.flops_budget=1000000000000\.0 gives 1953 steps.*train\.tokens=null",
    ):
        planned_steps(cfg.train, fpt)  # ... together they conflict
    agree = compose(["experiment=cpu_ladder", "size=cpu_xs", f"train.flops_budget={844 * 512 * fpt}"])
    assert planned_steps(agree.train, fpt) == 844  # both given and consistent: accepted
    only_budget = compose(["experiment=cpu_ladder", "size=cpu_xs", "train.tokens=null", "train.flops_budget=1.0e12"])
    assert planned_steps(only_budget.train, fpt) == 1953
    assert planned_steps(compose(["experiment=cpu_ladder", "size=cpu_xs"]).train, fpt) == steps_for(432000, 4, 128)


def test_budget_enters_the_hash_only_when_set():
    def ident(*o):
        return experiment_config(resolved_container(compose(["experiment=cpu_ladder", *o])))

    assert "flops_budget" not in ident()["train"]  # runs recorded before budgets existed keep their config_hash
    chash = lambda *o: run_identity(compose(["experiment=cpu_ladder", *o]))[0]  # noqa: E731
    a = chash("train.tokens=null", "train.flops_budget=1.0e12")
    assert a != chash("train.tokens=null", "train.flops_budget=2.0e12")
    assert a != chash()
    assert chash("size=cpu_arch") != chash("size=cpu_arch", "size.d_over_lb=6")  # the grid cell is identity


# ---- the sweeps: every cell composes into the intended run ---------------------------------------------
@pytest.mark.parametrize(
    ("sweep", "size_name", "grid", "vocab"),
    [
        ("arch_grid", "paper_arch", PAPER_GRID, 163_840),
        ("cpu_arch_grid", "cpu_arch", CPU_GRID, 256),
    ],
)
def test_every_arch_grid_cell_composes(sweep, size_name, grid, vocab):
    """Every grid cell composes (Hydra, from the sweep's own sweeper params) into its derived shape, trains for
    tokens x FLOPs/token = the budget (to within half a batch), and Block AttnRes gets its blocks at every depth.
    The CPU sweep is composed run by run; the paper sweep cell by cell with the baseline (the variant axis is
    independent of the cell), plus Block AttnRes at its shallowest and deepest cells."""
    from attnres import ModelConfig, flops_per_token

    sweep_cfg = compose([f"+sweep={sweep}"], return_hydra_config=True)
    params = sweep_cfg.hydra.sweeper.params
    assert [float(x) for x in str(params["size.d_over_lb"]).split(",")] == list(grid["d_over_lb"])
    assert [float(x) for x in str(params["size.heads_over_lb"]).split(",")] == list(grid["heads_over_lb"])
    cells = sweep_cells(sweep)  # Hydra's own expansion of the sweeper params
    assert len(cells) == 2 * len(grid["d_over_lb"]) * len(grid["heads_over_lb"])
    assert {c["model"] for c in cells} == {"baseline", "block_attnres"}
    assert {c["seed"] for c in cells} == {"0"}
    size = _size(size_name)
    if sweep == "arch_grid":
        extremes = {
            (str(grid["d_over_lb"][0]), str(grid["heads_over_lb"][-1])),
            (str(grid["d_over_lb"][-1]), str(grid["heads_over_lb"][0])),
        }
        points = [
            c for c in cells if c["model"] == "baseline" or (c["size.d_over_lb"], c["size.heads_over_lb"]) in extremes
        ]
    else:
        points = cells
    names, n_blocks = set(), None
    for cell in points:
        cfg = compose([f"+sweep={sweep}", *(f"{k}={v}" for k, v in cell.items()), f"data.vocab_size={vocab}"])
        assert cfg.study == "arch_grid"
        assert cfg.train.tokens is None
        assert cfg.model.variant == cell["model"]
        r, h = float(cell["size.d_over_lb"]), float(cell["size.heads_over_lb"])
        shape = _shape(size, r, h)
        mc = build_model_config(cfg)
        assert (mc.n_layers, mc.d_model, mc.n_heads, mc.d_ff, mc.head_dim) == (
            shape.n_layers,
            shape.d_model,
            shape.n_heads,
            shape.d_ff,
            shape.head_dim,
        )
        assert cfg.size.name == f"{size_name}_d{cell['size.d_over_lb']}_h{cell['size.heads_over_lb']}"
        names.add((cfg.size.name, cfg.model.variant))
        if sweep == "arch_grid":
            assert cfg.train.flops_budget == 6.5e19
            assert cfg.size.target_params == 2.3e8
            assert cfg.train.seq_len == 8192
            assert OmegaConf.is_missing(cfg.data, "name")  # bring your own prepared shards
        else:
            assert cfg.train.seq_len == 128
            assert cfg.data.name == "stdlib"
            assert cfg.trainer.accelerator == "cpu"
            check_config(cfg)  # (the GPU preset of the paper sweep fails the CUDA check here, by design)
        if mc.residual == "block":
            n_blocks = mc.n_blocks
        fpt = flops_per_token(mc, int(cfg.train.seq_len)).total
        steps = planned_steps(cfg.train, fpt)
        tokens_per_step = cfg.train.batch_size * cfg.train.seq_len
        # tokens x FLOPs/token = the budget, up to rounding to whole batches
        assert abs(steps * tokens_per_step * fpt - cfg.train.flops_budget) <= 0.5 * tokens_per_step * fpt
    assert len(names) == len(points)  # distinct run ids
    # "~8 blocks" at every paper depth (L_b = 13..35), the CPU ladder's 4 on the CPU
    assert n_blocks == (8 if sweep == "arch_grid" else 4)
    for r, h in itertools.product(grid["d_over_lb"], grid["heads_over_lb"]):
        s = _shape(size, r, h)
        mc = ModelConfig(
            n_layers=s.n_layers,
            d_model=s.d_model,
            n_heads=s.n_heads,
            head_dim=s.head_dim,
            d_ff=s.d_ff,
            residual="block",
            n_blocks=n_blocks,
        )
        assert mc.effective_n_blocks in ((7, 8) if sweep == "arch_grid" else (4,)), (r, h, mc.sublayers_per_block)


# ---- one real run at a fixed budget ----------------------------------------------------------------------
def test_real_run_trains_for_its_flop_budget(train_cfg):
    from attnres import flops_per_token
    from results import ledger

    budget = 1.5e10
    cfg = train_cfg(
        "size=cpu_arch",
        "train.tokens=null",
        f"size.flops_budget={budget}",
        "train.eval_count=1",
        "train.val_sequences=16",
    )
    fpt = flops_per_token(build_model_config(OmegaConf.merge(cfg, {"data": {"vocab_size": 256}})), 128).total
    expected = round(budget / (fpt * 4096))
    assert 2 <= expected <= 6
    rec = train(cfg)
    assert rec["status"] == "completed"
    assert rec["steps"] == expected
    assert rec["tokens"] == expected * 4096
    assert rec["flops_budget"] == budget
    assert rec["flops_per_token"] == fpt
    assert abs(rec["flops"] - budget) <= 0.5 * 4096 * fpt
    assert rec["size"] == "cpu_arch_d4_h0.5"
    assert (rec["d_over_lb"], rec["heads_over_lb"]) == (4.0, 0.5)
    table = Path(cfg.paths.runs_root) / "smoke" / ledger.RESULTS_TABLE
    row = ledger.read_rows(table)[-1]
    assert float(row["flops_budget"]) == budget
    assert int(row["steps"]) == expected

    # conflicting settings fail before training with a message naming both keys, and leave no record
    bad = train_cfg("size=cpu_arch", f"size.flops_budget={budget}", "size.tokens=409600")
    with pytest.raises(
        ValueError, match=r"train\.tokens \(size\.tokens\)=409600 gives 100 steps but train\.flops_budget"
    ):
        train(bad)
    assert len(ledger.read_rows(table)) == 1


# ---- analysis: the Fig. 7 table and heat map from records -----------------------------------------------
def _grid_records(study: str = "arch_grid") -> pd.DataFrame:
    rows = []
    for v, (r, h), seed in itertools.product(
        ("baseline", "block_attnres"), itertools.product((2, 4, 6), (0.3, 0.5, 0.7)), (0, 1)
    ):
        loss = 2.0 + 0.01 * (r - 4) ** 2 + 0.1 * h - (0.03 if v == "block_attnres" else 0.0) + 0.001 * seed
        rows.append(
            {
                "run_id": f"{v}_cpu_arch_d{r}_h{h}_s{seed}",
                "study": study,
                "study_kind": "arch_grid",
                "variant": v,
                "size": f"cpu_arch_d{r}_h{h}",
                "seed": seed,
                "status": "completed",
                "val_loss": loss,
                "pflops_days": 1e-9,
                "flops_budget": 3e11,
                "d_over_lb": float(r),
                "heads_over_lb": h,
                "n_layers": 6,
                "d_model": 6 * r,
                "n_heads": 3,
                "d_ff": 100,
                "params_non_embedding": 1e5,
                "tokens": 3e5,
            }
        )
    return pd.DataFrame(rows)


def test_arch_grid_table_pivots_records(tmp_path):
    from analysis.io.runs import AnalysisWarning
    from analysis.laws.arch_grid import arch_grid_table
    from analysis.laws.fit_options import FitOptions
    from analysis.render.fit_report import run_fit
    from analysis.render.tables import arch_grid_markdown

    df = _grid_records()
    table = arch_grid_table(df)
    assert table["d_over_lb"] == [2.0, 4.0, 6.0]
    assert table["heads_over_lb"] == [0.7, 0.5, 0.3]
    assert table["variants"] == ["baseline", "block_attnres"]
    assert table["flops_budget"] == 3e11
    base = np.array(table["val_loss"]["baseline"])
    assert base[2, 1] == pytest.approx(2.0 + 0.03 + 0.0005)  # H/L_b 0.3 row, d/L_b 4 column, mean of 2 seeds
    assert table["n_runs"]["baseline"][0][0] == 2
    assert table["best"]["block_attnres"] == {
        "val_loss": pytest.approx(2.0 + 0.03 - 0.03 + 0.0005),
        "d_over_lb": 4.0,
        "heads_over_lb": 0.3,
    }
    assert np.allclose(np.array(table["delta_vs_baseline"]["block_attnres"]), -0.03)
    md = "\n".join(arch_grid_markdown(table))
    assert "| baseline | 0.7 | 2.1105 | 2.0705 | 2.1105 |" in md
    assert "**2.0005**" in md
    assert "| block_attnres | 0.7 | -0.0300 | -0.0300 | -0.0300 |" in md.split("Δ vs baseline")[1]

    # `python -m analysis fit` on an arch_grid-only table: no scaling fit, the grid table and figure instead
    with pytest.warns(AnalysisWarning, match="no scaling-ladder runs"):
        doc = run_fit(df, tmp_path / "report", FitOptions(B=10))
    assert doc.arch_grid.best["baseline"].d_over_lb == 4.0
    assert not doc.multipliers
    assert {"fig7_arch_grid.png", "fig7_arch_grid.pdf", "fig7_arch_grid.md"} <= set(doc.files)
    assert (tmp_path / "report" / "fig7_arch_grid.png").stat().st_size > 10_000
    assert "## Architecture grid (Fig. 7)" in (tmp_path / "report" / "summary.md").read_text()

    # a missing cell stays empty (not a crash), and records without grid coordinates are left out with a warning
    partial = df[~((df["variant"] == "baseline") & (df["d_over_lb"] == 6.0) & (df["heads_over_lb"] == 0.7))]
    extra = pd.DataFrame([{**df.iloc[0].to_dict(), "run_id": "x", "d_over_lb": np.nan}])
    with pytest.warns(Warning, match="no grid coordinates"):
        t2 = arch_grid_table(pd.concat([partial, extra], ignore_index=True))
    assert t2["val_loss"]["baseline"][0][2] is None
    assert t2["delta_vs_baseline"]["block_attnres"][0][2] is None
    assert arch_grid_table(df.assign(study="cpu_ladder", study_kind="scaling")) is None
