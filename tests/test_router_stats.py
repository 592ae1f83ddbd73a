"""analysis.router (router.csv -> load balance, summary, figure) and RunRecorder's router.csv across a resume."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis.router import load_balance, plot_router, read_router, summary, write_run_figure
from experiments.training.callbacks import ROUTER_COLUMNS, RunRecorder


def _router(steps=(10, 20), layers=2, experts=4, skew=True) -> pd.DataFrame:
    rows = []
    for s in steps:
        for layer in range(layers):
            for e in range(experts):
                tokens = 10.0 + (e if skew else 0)  # experts 0..3 get 10, 11, 12, 13 tokens
                rows.append((s, layer, e, tokens, 11.5 if skew else 10.0, 0.001 * (e - 1.5) if skew else 0.0))
    return pd.DataFrame(rows, columns=list(ROUTER_COLUMNS))


def test_load_balance_and_summary_follow_their_definitions():
    bal = load_balance(_router())
    assert len(bal) == 4  # 2 steps x 2 layers
    assert bal["load_max_over_mean"].tolist() == pytest.approx([13 / 11.5] * 4)
    assert bal["load_min_over_mean"].tolist() == pytest.approx([10 / 11.5] * 4)
    assert (bal["dropped"] == 0).all()
    s = summary(_router())
    assert s["steps_logged"] == 2
    assert s["layers"] == 2
    assert s["experts"] == 4
    assert s["last_step"] == 20
    assert s["last_bias_min"] == pytest.approx(-0.0015)
    assert s["last_bias_max"] == pytest.approx(0.0015)
    dropped = _router()
    dropped.loc[0, "tokens"] -= 3  # three (token, expert) pairs missing at step 10, layer 0
    assert summary(dropped)["max_dropped"] == 3


@pytest.mark.parametrize("kw", [{}, {"steps": (5,), "layers": 1}, {"skew": False}])
def test_the_router_figure_renders_on_ordinary_and_degenerate_input(tmp_path, kw):
    """Several steps; one logged step of one layer; perfectly balanced load with an all-zero bias."""
    path = plot_router(_router(**kw), tmp_path / "fig_router.png", title="t")
    assert path.stat().st_size > 5000


def test_read_router_drops_a_torn_line_and_refuses_another_file(tmp_path):
    path = tmp_path / "router.csv"
    _router().to_csv(path, index=False)
    with path.open("a") as f:
        f.write("30,0,1,1")  # torn tail: too few fields
    assert len(read_router(path)) == len(_router())
    other = tmp_path / "metrics.csv"
    other.write_text("step,tokens\n1,2\n")
    with pytest.raises(ValueError, match=r"not a router\.csv"):
        read_router(other)
    assert write_run_figure(tmp_path / "nowhere") is None


def test_the_recorder_keeps_router_rows_up_to_the_restored_step(tmp_path):
    """A resumed run's router.csv continues at the checkpoint: rows logged after it are dropped, earlier kept."""
    rec = RunRecorder(tmp_path, tokens_per_step=8, flops_per_token=1.0, variant="v", residual="block")
    rec._ready = True
    router = {"load": [[3.0, 5.0], [4.0, 4.0]], "bias": [[0.001, -0.001], [0.0, 0.0]], "top_k": 1}
    m10 = rec._record_router(10, router)
    rec._record_router(20, router)
    rec.flush()
    assert m10["router/dropped"] == 0
    assert m10["router/load_max_over_mean"] == pytest.approx(5 / 4)
    assert m10["router/load_min_over_mean"] == pytest.approx(3 / 4)
    assert m10["router/bias_max"] == 0.001
    again = RunRecorder(tmp_path, tokens_per_step=8, flops_per_token=1.0, variant="v", residual="block")
    again._load_existing(upto_step=15)
    assert sorted(again.router_rows) == [10]
    assert again.router_rows[10] == rec.router_rows[10]
    again._ready = True
    again.flush()
    assert set(read_router(tmp_path / "router.csv")["step"]) == {10}
    empty = {"load": [[0.0, 0.0]], "bias": [[0.0, 0.0]], "top_k": 1}
    assert math.isnan(rec._record_router(30, empty)["router/load_max_over_mean"])
