"""Figures stay readable on degenerate studies (one seed, three small sizes, huge bootstrap intervals): bounded
axes, multiplier arrows cut at a stated length, unbounded interval ends printed as bounds, not as 1e9."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from synthetic_records import synthetic_ladder

from analysis.io.fit_document import FitDocument
from analysis.laws.fit_options import FitOptions
from analysis.laws.scaling_ladder import analyse_scaling
from analysis.render import figures


def test_interval_text_bounds_its_ends():
    assert figures.ci_text([0.95, 249.44]) == " [0.95, >20]"
    assert figures.ci_text([0.0, 1.3]) == " [<0.05, 1.30]"
    assert figures.ci_text([1.01, 1.38]) == " [1.01, 1.38]"
    assert figures.ci_text(None) == ""
    assert figures.ci_text([None, None]) == ""
    assert figures.ci_text([0.84, 6.65], at_bound=[True, False]) == " [≤0.84, 6.65]"  # set by a search bound
    assert figures.ci_text([0.84, 6.65], at_bound=[False, False]) == " [0.84, 6.65]"


@pytest.mark.parametrize("multipliers", [{"block_attnres": 1.3, "full_attnres": 1.1}, {"block_attnres": 12.0}])
def test_fig4_axes_stay_near_the_data_on_a_one_seed_study(tmp_path, monkeypatch, multipliers):
    df = synthetic_ladder(multipliers, n_sizes=3, seeds=(0,), sigma=0.08, C_range=(2e-6, 6e-6), rng=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = analyse_scaling(df, FitOptions(B=200, bootstrap_mode="parametric"))
    doc, frame = fit.parts, fit.runs
    widest = max(
        hi
        for m in doc["multipliers"].values()
        for p in m["per_size"].values()
        for hi in [(p.get("m_ci95") or [0, 0])[1] or 0]
    )
    if "full_attnres" in multipliers:
        assert widest > figures.MAX_ARROW**2  # the case under test: 1-seed intervals far beyond any sane axis
    seen = {}

    def keep(fig, stem):
        seen["axes"] = fig.axes
        return []

    monkeypatch.setattr(figures, "save", keep)
    figures.scaling_figure(frame, FitDocument.from_dict(doc), tmp_path / "fig4")
    main, panel = seen["axes"][:2]
    c_max = float(df["pflops_days"].max())
    assert main.get_xlim()[1] <= c_max * figures.MAX_ARROW * 1.3 * 1.01  # never 30x past the largest point
    lo, hi = panel.get_ylim()
    assert panel.get_yscale() == "log"
    assert hi <= figures.MAX_ARROW**2 * 1.1
    assert lo >= 1 / (figures.MAX_ARROW**2 * 1.1)
    texts = [t.get_text() for t in main.texts]
    assert not any("e+" in t or any(len(w) > 8 and w.replace(".", "").isdigit() for w in t.split()) for t in texts)
    if doc["multipliers"]["block_attnres"]["paper_M"] > figures.MAX_ARROW:
        assert any("arrow cut" in t for t in texts)
    assert np.isfinite(lo)
    assert np.isfinite(hi)
