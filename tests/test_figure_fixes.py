"""The figure and report fixes found by trying the harness as a new user would (issue 25, item 5): fig4's M labels
clear of every curve and of each other, fig8 without the source columns a panel's reads cannot see, one numbering
(blocks 1..L, the embedding as source 0) in fig5 and fig8, interval ends set by a search bound flagged as
unbounded, and a generated sentence where the joint-fit m lies outside the per-size m_s."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.transforms import Bbox
from synthetic_records import synthetic_ladder, write_study

from analysis.io.fit_document import FitDocument
from analysis.laws import bootstrap as bs
from analysis.laws.fit import ALPHA_BOUNDS, joint_draws_at_bound
from analysis.laws.fit_options import FitOptions
from analysis.laws.scaling_ladder import analyse_scaling
from analysis.render import figures
from analysis.render.markdown import summary_markdown
from analysis.render.tables import AT_BOUND, markdown_table
from analysis.render.tables import ci as ci_cell


def _fit(df: pd.DataFrame, B: int = 60, **kw) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return analyse_scaling(df, FitOptions(B=B, **kw))


def _capture(monkeypatch) -> dict:
    seen: dict = {}

    def keep(fig, stem):
        seen["fig"] = fig
        return []

    monkeypatch.setattr(figures, "save", keep)
    return seen


# ---- fig4: the M labels ------------------------------------------------------------------------------------------


def _drawn_points(ax, renderer) -> np.ndarray:
    """Display coordinates of every curve (densely interpolated) and marker of ``ax`` that is drawn (inside it)."""
    pts = []
    for line in ax.lines:
        xy = line.get_transform().transform(np.column_stack([line.get_xdata(), line.get_ydata()]))
        t = np.linspace(0, 1, 12)[:, None, None]
        pts.append((xy[:-1][None] * (1 - t) + xy[1:][None] * t).reshape(-1, 2))
    for coll in ax.collections:
        off = coll.get_offsets()
        if len(off):
            pts.append(coll.get_offset_transform().transform(off))
    xy = np.concatenate(pts)
    b = ax.bbox
    return xy[(xy[:, 0] >= b.x0) & (xy[:, 0] <= b.x1) & (xy[:, 1] >= b.y0) & (xy[:, 1] <= b.y1)]


@pytest.mark.parametrize(
    "case",
    [
        {"multipliers": {"block_attnres": 1.15, "full_attnres": 1.25}, "seeds": (0, 1), "sigma": 0.01, "rng": 0},
        # arrows ending at nearly the same loss (the committed deep ladder's case: four arms within 0.05 nats)
        {"multipliers": {"block_attnres": 1.04, "full_attnres": 0.98}, "seeds": (0, 1, 2), "sigma": 0.01, "rng": 1},
        {"multipliers": {"block_attnres": 12.0}, "seeds": (0,), "sigma": 0.08, "rng": 3, "n_sizes": 3},
    ],
)
def test_fig4_labels_overlap_no_curve_and_no_other_label(tmp_path, monkeypatch, case):
    case = dict(case)
    df = synthetic_ladder(case.pop("multipliers"), **case)
    fit = _fit(df, bootstrap_mode="parametric" if len(case["seeds"]) == 1 else "auto")
    seen = _capture(monkeypatch)
    figures.scaling_figure(fit.runs, FitDocument.from_dict(fit.parts), tmp_path / "fig4")
    fig = seen["fig"]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    main, panel = fig.axes[:2]
    labels = [t for t in main.texts if "M = " in t.get_text()]
    assert len(labels) == len(fit.parts["multipliers"])  # one label per arrow
    boxes = [t.get_window_extent(renderer) for t in labels]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), "two M labels overlap"
    pts = _drawn_points(main, renderer)
    arrows = [t.arrow_patch.get_window_extent(renderer) for t in main.texts if getattr(t, "arrow_patch", None)]
    others = [panel.get_window_extent(renderer), main.get_legend().get_window_extent(renderer)]
    others += [t.get_window_extent(renderer) for t in main.texts if t not in labels and t.get_text()]
    for box, t in zip(boxes, labels):
        inside = (pts[:, 0] >= box.x0) & (pts[:, 0] <= box.x1) & (pts[:, 1] >= box.y0) & (pts[:, 1] <= box.y1)
        assert not inside.any(), f"label {t.get_text()!r} covers a curve or a marker"
        assert not any(box.overlaps(o) for o in arrows + others), f"label {t.get_text()!r} covers an arrow or a box"
        assert Bbox.intersection(box, fig.bbox) is not None


def test_labels_are_spread_apart_and_kept_on_the_axes():
    out = figures._spread([0.5, 0.5, 0.51, 0.99], gap=0.1)
    assert np.all(np.diff(out) >= 0.1 - 1e-12)
    assert out[-1] <= 0.98
    assert figures._spread([0.1, 0.6], gap=0.1) == [0.1, 0.6]  # apart already: where they are wanted


# ---- fig5 and fig8: columns and numbering --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("study")
    df = synthetic_ladder({"block_attnres": 1.2, "full_attnres": 1.3}, n_sizes=3, seeds=(0,), rng=4)
    return write_study(root, df, extra_studies=False, failed=False)


def test_fig8_panels_drop_the_columns_their_reads_cannot_see(study, tmp_path, monkeypatch):
    df = pd.read_csv(study)
    seen = _capture(monkeypatch)
    figures.depth_weights_figure(df, tmp_path / "fig8", base_dir=str(study.parent))
    axes = [a for a in seen["fig"].axes if a.images]
    assert len(axes) == 4  # Full and Block, pre-attention and pre-MLP
    L = int(df["n_layers"].max())
    for ax in axes:
        W = np.ma.getdata(ax.images[0].get_array()).astype(float)
        mask = np.ma.getmaskarray(ax.images[0].get_array())
        W[mask] = np.nan
        assert not np.all(np.isnan(W), axis=0).any(), f"{ax.get_title()}: an all-empty column is drawn"
        assert W.shape[0] == L
    full_attn, full_mlp = axes[0], axes[1]
    names = lambda ax: [t.get_text() for t in ax.get_xticklabels()]  # noqa: E731
    ticks = lambda ax: list(ax.get_xticks())  # noqa: E731
    # Full: the last block's pre-attention read sees emb .. mlp_{L-1}; its pre-MLP read emb .. attn_L.
    assert full_attn.images[0].get_array().shape[1] == 1 + 2 * (L - 1)
    assert full_mlp.images[0].get_array().shape[1] == 2 * L
    step = int(np.diff(ticks(full_mlp))[0]) if len(ticks(full_mlp)) > 1 else 1
    expected = (["emb"] + [f"{k}{b}" for b in range(1, L + 1) for k in ("attn", "mlp")])[: 2 * L][::step]
    assert names(full_mlp) == expected


def test_depth_weight_panel_keeps_only_visible_columns():
    nan = np.nan
    W = np.array(
        [
            [1.0, nan, nan, nan, nan],  # block 1, pre-attention: emb
            [0.5, 0.5, nan, nan, nan],  # block 1, pre-MLP: emb, attn0
            [0.2, 0.3, 0.5, nan, nan],  # block 2, pre-attention
            [0.1, 0.2, 0.3, 0.4, nan],  # block 2, pre-MLP
            [0.2, 0.2, 0.2, 0.2, 0.2],  # final
        ]
    )
    kinds = ["attn", "mlp", "attn", "mlp", "final"]
    srcs = ["emb", "attn0", "mlp0", "attn1", "mlp1"]
    M, names = figures.depth_weight_panel(W, kinds, srcs, "attn")
    assert names == ["emb", "attn1", "mlp1"]
    assert M.shape == (2, 3)
    M, names = figures.depth_weight_panel(W, kinds, srcs, "mlp")
    assert names == ["emb", "attn1", "mlp1", "attn2"]
    assert M.shape == (2, 4)


def test_source_labels_follow_the_figures_block_numbering():
    assert figures.source_label("emb") == "emb"
    assert figures.source_label("attn0") == "attn1"
    assert figures.source_label("mlp15") == "mlp16"
    assert figures.source_label("block3") == "block3"  # Block AttnRes numbers its blocks from 1 already


def test_fig5_and_fig8_number_blocks_from_one(study, tmp_path, monkeypatch):
    df = pd.read_csv(study)
    L = int(df["n_layers"].max())
    seen = _capture(monkeypatch)
    figures.dynamics_figure(df, tmp_path / "fig5", base_dir=str(study.parent))
    for ax in seen["fig"].axes:
        for line in ax.lines:
            assert list(line.get_xdata()) == list(range(1, L + 1))
    figures.depth_weights_figure(df, tmp_path / "fig8", base_dir=str(study.parent))
    for ax in (a for a in seen["fig"].axes if a.images):
        rows = [t.get_text() for t in ax.get_yticklabels()]
        assert rows[0] == "1"
        assert rows[-1] == str(L)
        assert ax.get_xticklabels()[0].get_text() == "emb"


# ---- bound flags ----------------------------------------------------------------------------------------------------


def test_ends_at_bound_flags_only_the_end_a_bounded_draw_reaches():
    plan = bs.ResamplePlan(mode="parametric", B=6, seed=0, scale=1.0)
    s = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 3.0])
    ci = bs.interval(0.3, s, plan)
    assert bs.ends_at_bound(0.3, s, s >= 3.0, plan, ci) == [False, True]
    assert bs.ends_at_bound(0.3, s, np.zeros(6, bool), plan, ci) == [False, False]
    assert bs.ends_at_bound(0.3, s, s == 0.3, plan, ci) == [False, False]  # a bounded draw inside the interval
    assert bs.ends_at_bound(0.3, s, s == 0.1, plan, ci) == [True, False]
    d = np.array([-2.5, -0.1, 0.0, 0.1, 0.2, 1.2])  # a difference: its extreme draws came from bounded fits
    dci = bs.interval(0.0, d, plan)
    assert bs.ends_at_bound(0.0, d, np.isin(d, [-2.5, 1.2]), plan, dci) == [True, True]


def test_joint_draws_at_bound():
    L = np.array([[2.0, 1.8, 1.6], [2.0, 1.8, 1.6], [2.0, 1.8, 1.6], [2.0, 1.8, 1.6]])
    W = np.ones_like(L)
    jb = {"alpha": np.array([0.3, ALPHA_BOUNDS[1], ALPHA_BOUNDS[0], 0.3]), "E": np.array([1.0, 1.0, 1.0, 1.6])}
    assert joint_draws_at_bound(jb, L, W, "saturating").tolist() == [False, True, True, True]
    assert not joint_draws_at_bound(jb, L, W, "power_law").any()


def test_interval_cell_marks_a_bounded_end():
    assert ci_cell([0.135, 2.85]) == "[0.135, 2.85]"
    assert ci_cell([0.135, 2.85], at_bound=[False, True]) == f"[0.135, ≥2.85 {AT_BOUND}]"
    assert ci_cell([-2.5, 1.2], 2, at_bound=[True, False]) == f"[≤-2.5 {AT_BOUND}, 1.2]"


def test_markdown_table_writes_the_header_a_plain_rule_and_each_row_as_given():
    rows = ([str(i), c] for i, c in enumerate(["", "x"]))  # any iterable of rows; cells are written as they are
    assert markdown_table(["a", "b c"], rows) == ["| a | b c |", "|---|---|", "| 0 |  |", "| 1 | x |"]
    assert markdown_table(["only"], []) == ["| only |", "|---|"]


def test_bound_flags_in_the_fit_document_and_summary():
    # One seed, three close sizes, large noise: saturating replicates run into alpha = 3 and E = min L.
    df = synthetic_ladder(
        {"block_attnres": 1.3, "full_attnres": 1.1}, n_sizes=3, seeds=(0,), sigma=0.08, C_range=(2e-6, 6e-6), rng=3
    )
    doc = _fit(df, B=300).parts
    flagged = []
    for mm in doc["multipliers"].values():
        j = mm["joint"]
        assert j["form"] == "saturating"
        assert j["draws_at_bound"] > 0
        flagged.append(j["alpha_ci95_at_bound"][1])
        for key, ends in (
            ("alpha", j["alpha_ci95_at_bound"]),
            ("E", j["E_ci95_at_bound"]),
            ("m", mm["m_ci95_at_bound"]),
            ("diff", mm["exponents"]["diff_ci95_at_bound"]),
        ):
            assert len(ends) == 2, key
    assert any(flagged)
    md = summary_markdown(doc)
    assert AT_BOUND in md
    assert "is unbounded" in md
    plain = json.loads(json.dumps(FitDocument.from_dict(doc).to_dict()))  # as fit.json is written
    for v, mm in doc["multipliers"].items():
        assert plain["multipliers"][v]["joint"]["alpha_ci95_at_bound"] == mm["joint"]["alpha_ci95_at_bound"]
    assert FitDocument.from_dict(plain).to_dict() == plain  # the flags load typed and round-trip
    assert all("m_ci95_at_bound" in mm for mm in plain["multipliers"].values())
    # Well-determined (three seeds, small noise): no replicate on a bound, no flag, nothing printed.
    doc = _fit(synthetic_ladder({"block_attnres": 1.1}, n_sizes=3, seeds=(0, 1, 2), sigma=0.03, rng=5), B=300).parts
    mm = doc["multipliers"]["block_attnres"]
    assert mm["joint"]["draws_at_bound"] == 0
    assert mm["joint"]["alpha_ci95_at_bound"] == [False, False]
    assert mm["m_ci95_at_bound"] == [False, False]
    assert mm["exponents"]["diff_ci95_at_bound"] == [False, False]
    assert AT_BOUND not in summary_markdown(doc)


# ---- the headline m outside the per-size m_s ---------------------------------------------------------------------


def test_headline_outside_the_per_size_multipliers_is_explained():
    doc = _fit(synthetic_ladder({"block_attnres": 1.1}, n_sizes=3, seeds=(0, 1, 2), sigma=0.03, rng=0), B=20).parts
    mm = doc["multipliers"]["block_attnres"]
    m_s = [p["m"] for p in mm["per_size"].values()]
    assert mm["m"] < min(m_s)  # the case under test
    g = mm["headline_gap"]
    assert g["side"] == "below"
    assert g["m_s_min"] == pytest.approx(min(m_s))
    # the two factors split the gap exactly: geo(m_s) x curves x off-curve = m
    assert mm["per_size_geomean"] * g["factor_curves"] * g["factor_off_curve"] == pytest.approx(mm["m"], rel=1e-9)
    line = next(x for x in summary_markdown(doc).splitlines() if x.strip().startswith("Why m"))
    assert f"{mm['m']:.3f}" in line
    assert f"{g['factor_curves']:.3f}" in line
    assert f"{g['factor_off_curve']:.3f}" in line
    # m inside the m_s' range: no field, no sentence
    doc = _fit(synthetic_ladder({"block_attnres": 1.1}, n_sizes=3, seeds=(0, 1, 2), sigma=0.03, rng=1), B=20).parts
    mm = doc["multipliers"]["block_attnres"]
    assert min(p["m"] for p in mm["per_size"].values()) <= mm["m"] <= max(p["m"] for p in mm["per_size"].values())
    assert "headline_gap" not in FitDocument.from_dict(doc).multipliers["block_attnres"].to_dict()
    assert "Why m" not in summary_markdown(doc)


@pytest.mark.parametrize("residual", ["full", "block"])
def test_fig8_columns_dropped_are_the_ones_the_model_never_reads(residual):
    """On a real model's recorded weights: the columns a panel drops are exactly those none of its reads can see
    (Full: attn_L and mlp_L before the last pre-attention read, mlp_L before the last pre-MLP read; Block: none)."""
    torch = pytest.importorskip("torch")
    from attnres.model import ModelConfig, Transformer

    torch.manual_seed(0)
    cfg = {"vocab_size": 61, "n_layers": 4, "d_model": 32, "n_heads": 4, "max_seq_len": 16, "residual": residual}
    if residual == "block":
        cfg["n_blocks"] = 2
    model = Transformer(ModelConfig(**cfg))
    model.record_diagnostics = True
    model(torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(3)))
    W = model.diagnostics["depth_weights"].numpy()
    kinds, srcs = model.read_kinds(), model.residual.source_labels()
    L = model.config.n_layers
    _, attn = figures.depth_weight_panel(W, kinds, srcs, "attn")
    _, mlp = figures.depth_weight_panel(W, kinds, srcs, "mlp")
    every = [figures.source_label(s) for s in srcs]
    if residual == "full":
        assert [s for s in every if s not in attn] == [f"attn{L}", f"mlp{L}"]
        assert [s for s in every if s not in mlp] == [f"mlp{L}"]
    else:  # the last reads see the embedding, the completed blocks and the partial last one: nothing to drop
        assert attn == every
        assert mlp == every
