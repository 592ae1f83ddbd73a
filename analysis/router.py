"""Router statistics of one MoE run (load balance, balancing bias) from its ``router.csv`` (written by
experiments.training.callbacks.RunRecorder: one row per logged step, MoE layer and expert).
``python -m analysis.router runs/<study>/<run>`` prints the summary and writes ``<run>/fig_router.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .render.figures import save

ROUTER_FILE = "router.csv"
FIGURE_FILE = "fig_router.png"
COLUMNS = ("step", "layer", "expert", "tokens", "expected", "bias")


def read_router(path: str | Path) -> pd.DataFrame:
    """router.csv with COLUMNS, rows that do not parse (a torn tail line) dropped; ValueError for another file."""
    df = pd.read_csv(path, on_bad_lines="skip")
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: not a router.csv (missing columns {', '.join(missing)})")
    df = df[list(COLUMNS)].apply(pd.to_numeric, errors="coerce").dropna()
    return df.astype({"step": int, "layer": int, "expert": int}).reset_index(drop=True)


def load_balance(router: pd.DataFrame) -> pd.DataFrame:
    """One row per (step, layer): ``load_max_over_mean`` and ``load_min_over_mean`` (tokens of the most and least
    loaded expert over the mean; 1 under perfect balance), ``dropped`` (N k minus the (token, expert) pairs
    routed; 0 for a dropless router), ``bias_min`` and ``bias_max``."""
    g = router.groupby(["step", "layer"])
    tokens, bias = g["tokens"], g["bias"]
    return pd.DataFrame(
        {
            "load_max_over_mean": tokens.max() / tokens.mean(),
            "load_min_over_mean": tokens.min() / tokens.mean(),
            "dropped": g["expected"].sum() - tokens.sum(),
            "bias_min": bias.min(),
            "bias_max": bias.max(),
        }
    ).reset_index()


def summary(router: pd.DataFrame) -> dict[str, float | int]:
    """The run's router in a few numbers: at the last logged step, the worst layer's load max / mean and min / mean
    and the bias range; over all logged steps, the largest dropped count and the median load max / mean."""
    bal = load_balance(router)
    last = bal[bal["step"] == bal["step"].max()]
    return {
        "steps_logged": int(bal["step"].nunique()),
        "layers": int(bal["layer"].nunique()),
        "experts": int(router["expert"].nunique()),
        "last_step": int(bal["step"].max()),
        "last_load_max_over_mean": float(last["load_max_over_mean"].max()),
        "last_load_min_over_mean": float(last["load_min_over_mean"].min()),
        "median_load_max_over_mean": float(bal.groupby("step")["load_max_over_mean"].max().median()),
        "max_dropped": float(bal["dropped"].abs().max()),
        "last_bias_min": float(last["bias_min"].min()),
        "last_bias_max": float(last["bias_max"].max()),
    }


def plot_router(router: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """Left: every MoE layer's load max / mean (solid) and min / mean (dashed) over training, 1 = perfect balance.
    Right: the balancing bias at the last logged step, layer x expert. Writes ``path`` (PNG) and returns it."""
    bal = load_balance(router)
    last_step = int(router["step"].max())
    layers = sorted(bal["layer"].unique())
    fig, (ax, axb) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [1.4, 1]})
    colors = plt.cm.viridis(np.linspace(0, 0.9, max(len(layers), 1)))
    for color, layer in zip(colors, layers):
        d = bal[bal["layer"] == layer]
        marker = "o" if len(d) == 1 else None  # a single logged step is still visible
        ax.plot(d["step"], d["load_max_over_mean"], color=color, marker=marker, lw=1.2, label=f"layer {layer}")
        ax.plot(d["step"], d["load_min_over_mean"], color=color, marker=marker, lw=1.2, ls="--")
    ax.axhline(1.0, color="0.4", lw=0.8)
    ax.set(xlabel="optimizer step", ylabel="tokens per expert / mean (max solid, min dashed)", ylim=(0, None))
    if len(layers) <= 12:
        ax.legend(fontsize=7, ncol=2, loc="upper right")
    dropped = bal["dropped"].abs().max()
    ax.set_title(f"load balance per MoE layer (dropped pairs, max over steps: {dropped:g})", fontsize=9)
    bias = router[router["step"] == last_step].pivot(index="layer", columns="expert", values="bias").to_numpy()
    lim = float(np.nanmax(np.abs(bias))) or 1e-3  # all-zero bias: a symmetric, non-empty scale
    im = axb.imshow(bias, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
    axb.set(xlabel="expert", ylabel="MoE layer", xticks=range(bias.shape[1]), yticks=range(bias.shape[0]))
    axb.set_title(f"balancing bias at step {last_step}", fontsize=9)
    fig.colorbar(im, ax=axb, fraction=0.05)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save(fig, path, (".png",), dpi=130, tight=False)[0]


def write_run_figure(run_dir: str | Path) -> Path | None:
    """``<run_dir>/fig_router.png`` from ``<run_dir>/router.csv``; None when the run has no router statistics (a
    dense run) or none that parse."""
    run_dir = Path(run_dir)
    router = read_router(run_dir / ROUTER_FILE) if (run_dir / ROUTER_FILE).is_file() else None
    if router is None or router.empty:
        return None
    return plot_router(router, run_dir / FIGURE_FILE, title=run_dir.name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Router statistics of one MoE run (its router.csv).")
    parser.add_argument("run_dir", type=Path)
    run_dir = parser.parse_args(argv).run_dir
    if not (run_dir / ROUTER_FILE).is_file():
        raise SystemExit(f"[attnres] {run_dir / ROUTER_FILE}: no router.csv (not an MoE run, or it logged no step yet)")
    for key, value in summary(read_router(run_dir / ROUTER_FILE)).items():
        print(f"{key}: {value:g}")
    print(f"-> {write_run_figure(run_dir)}")


if __name__ == "__main__":
    main()
