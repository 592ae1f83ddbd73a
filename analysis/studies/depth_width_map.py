"""Where does Block AttnRes start to beat the baseline? The depth-by-width map (``python -m analysis map``): per cell
(L_b blocks of width d_model, both arms on the same tokens and seeds) the same-seed difference
``delta = val_loss(arm) - val_loss(baseline)`` with a 95% Student-t interval over the pairs (honest at few pairs;
its coverage: tests/test_depth_width_map.py), per width where the mean delta crosses zero along depth with a
resampled interval, the table and the Fig. 7-style heat map (cells without pairs drawn as missing)."""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..io.runs import AnalysisWarning, completed_runs, load_one_dataset
from ..laws.bootstrap import CI_LEVEL
from ..laws.paired import paired_comparison
from ..render.figures import save
from .study_registry import add_arms, add_bootstrap, add_results_out, options_from, register

ARM = "block_attnres"
BASELINE = "baseline"


@dataclass(frozen=True)
class MapOptions:
    """``arm`` against ``baseline`` at ``level``; ``B`` resamples (from ``seed``) for the boundary's interval."""

    arm: str = ARM
    baseline: str = BASELINE
    level: float = CI_LEVEL
    B: int = 2000
    seed: int = 0


def pairs(df: pd.DataFrame, opts: MapOptions = MapOptions()) -> pd.DataFrame:
    """Same-seed pairs of completed runs, one row per (n_layers, d_model, seed) holding both arms: ``baseline_loss``,
    ``arm_loss``, ``delta``, ``params`` and ``tokens``. Two runs of one arm, cell and seed: ValueError."""
    done = completed_runs(df)
    keys = ["n_layers", "d_model", "seed"]
    cols = [*keys, "val_loss", "params_non_embedding", "tokens"]
    base = done[done["variant"] == opts.baseline][cols].rename(columns={"val_loss": "baseline_loss"})
    arm = done[done["variant"] == opts.arm][[*keys, "val_loss"]].rename(columns={"val_loss": "arm_loss"})
    for name, d in ((opts.baseline, base), (opts.arm, arm)):
        dup = d.duplicated(keys, keep=False)
        if dup.any():
            raise ValueError(
                f"{int(dup.sum())} completed {name} runs share a (n_layers, d_model, seed): one run per arm, cell and "
                "seed (two studies in one table?)"
            )
    out = base.merge(arm, on=keys, how="inner")
    out["delta"] = out["arm_loss"] - out["baseline_loss"]
    out = out.rename(columns={"params_non_embedding": "params"}).astype(dict.fromkeys(keys, int))
    return out.sort_values(keys).reset_index(drop=True)


def cell_table(
    df: pd.DataFrame, opts: MapOptions = MapOptions(), cells: list[tuple[int, int]] | None = None
) -> pd.DataFrame:
    """One row per cell (laws.paired.paired_comparison): ``n_pairs``, ``seeds``, ``delta``, ``sd``, ``ci_lo``/``ci_hi``,
    ``half_width``, ``verdict``, ``baseline_loss``, ``params``, ``tokens_per_param``; ``cells`` adds design cells
    without a pair (missing)."""
    p = pairs(df, opts)  # the map's duplicate check, and each cell's size and tokens
    done = completed_runs(df)
    keys = ["n_layers", "d_model"]
    table = paired_comparison(done, opts.baseline, [opts.arm], keys, level=opts.level)
    by_cell = {(int(r.n_layers), int(r.d_model)): r for r in table.itertuples()} if not table.empty else {}
    grid = sorted(set(map(tuple, p[keys].to_numpy().tolist())) | set(cells or []))
    rows: list[dict[str, Any]] = []
    for n_layers, d_model in grid:
        c = p[(p["n_layers"] == n_layers) & (p["d_model"] == d_model)]
        r = by_cell.get((n_layers, d_model))
        n = r.n_pairs if r is not None else 0
        lo, hi = r.delta_ci95 if n > 1 and r.delta_ci95 else (math.nan, math.nan)
        params = int(c["params"].iloc[0]) if len(c) else None
        row = {"n_layers": n_layers, "d_model": d_model, "n_pairs": n, "seeds": list(r.seeds) if n else []}
        row |= {"delta": float(r.delta) if n else math.nan, "sd": float(r.delta_sd) if n > 1 else math.nan}
        row |= {"ci_lo": lo, "ci_hi": hi, "half_width": (hi - lo) / 2 if np.isfinite(lo) else math.nan}
        row |= {"verdict": r.verdict if n else "missing", "baseline_loss": float(r.ref_loss) if n else math.nan}
        tpp = float(c["tokens"].iloc[0]) / params if params else math.nan
        rows.append(row | {"params": params, "tokens_per_param": tpp})
    return pd.DataFrame(rows)


def _crossing(depths: np.ndarray, means: np.ndarray) -> float:
    """The first depth (log2-linear between cells) where the mean delta turns negative; inf when it never does."""
    if means[0] < 0:
        return float(depths[0])
    for (d0, m0), (d1, m1) in zip(zip(depths, means), zip(depths[1:], means[1:])):
        if m0 >= 0 > m1:
            x0, x1 = math.log2(d0), math.log2(d1)
            return float(2 ** (x0 + (x1 - x0) * m0 / (m0 - m1)))
    return math.inf


def boundaries(df: pd.DataFrame, opts: MapOptions = MapOptions()) -> pd.DataFrame:
    """Per width with pairs at two depths or more: the ``crossing`` depth (:func:`_crossing`) and its interval from
    ``opts.B`` resamples of each cell's pairs."""
    p = pairs(df, opts)
    rng = np.random.default_rng(opts.seed)
    rows = []
    for d_model, w in p.groupby("d_model"):
        groups = [g["delta"].to_numpy(float) for _, g in sorted(w.groupby("n_layers"), key=lambda kv: kv[0])]
        depths = np.array(sorted(w["n_layers"].unique()), float)
        if len(depths) < 2:
            continue
        point = _crossing(depths, np.array([g.mean() for g in groups]))
        boot = np.array(
            [_crossing(depths, np.array([rng.choice(g, len(g)).mean() for g in groups])) for _ in range(opts.B)]
        )
        lo, hi = np.quantile(boot, [(1 - opts.level) / 2, (1 + opts.level) / 2])
        row = {"d_model": int(d_model), "depths": [int(x) for x in depths], "crossing": point}
        rows.append(row | {"ci_lo": float(lo), "ci_hi": float(hi), "p_no_crossing": float(np.mean(np.isinf(boot)))})
    return pd.DataFrame(rows)


def _fmt_depth(x: float) -> str:
    return "beyond the map" if math.isinf(x) else f"{x:.1f}"


def map_markdown(cells: pd.DataFrame, bounds: pd.DataFrame, opts: MapOptions = MapOptions()) -> list[str]:
    intro = (
        f"Δ = {opts.arm} − {opts.baseline} final validation loss (nats/token), same-seed pairs; 95% Student-t "
        "interval over the pairs. Negative: Block AttnRes wins."
    )
    header = "| L_b | d_model | N | tokens/param | pairs | baseline loss | Δ | 95% interval | half-width | verdict |"
    lines = [intro, "", header, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in cells.itertuples():
        if r.n_pairs == 0:
            lines.append(f"| {r.n_layers} | {r.d_model} | | | 0 | | | | | not run |")
            continue
        ci = f"[{r.ci_lo:+.4f}, {r.ci_hi:+.4f}]" if np.isfinite(r.ci_lo) else "(one pair)"
        hw = f"{r.half_width:.4f}" if np.isfinite(r.half_width) else ""
        lines.append(
            f"| {r.n_layers} | {r.d_model} | {r.params:,} | {r.tokens_per_param:.1f} | {r.n_pairs} | "
            f"{r.baseline_loss:.4f} | {r.delta:+.4f} | {ci} | {hw} | {r.verdict} |"
        )
    crossing = "**Where Δ crosses zero along depth** (log2-linear between cells; 95% interval from resampled pairs):"
    lines += ["", crossing, ""]
    if bounds.empty:
        lines.append("No width has pairs at two depths yet.")
    for r in bounds.itertuples():
        where = f"crossing at L_b = {_fmt_depth(r.crossing)}"
        if r.crossing == r.depths[0]:
            where = f"Δ is already below zero at the shallowest depth, L_b = {r.depths[0]} (no crossing inside the map)"
        lines.append(
            f"- d_model {r.d_model} (depths {', '.join(map(str, r.depths))}): {where}; resampled 95% interval of the "
            f"crossing [{_fmt_depth(r.ci_lo)}, {_fmt_depth(r.ci_hi)}], no crossing in {100 * r.p_no_crossing:.0f}% "
            "of resamples"
        )
    return lines


def map_figure(cells: pd.DataFrame, stem: Path, opts: MapOptions = MapOptions()) -> list[Path]:
    """Heat map of Δ over depth x width (diverging at 0), each cell with Δ, half-width and pairs; missing: hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    if cells.empty:
        warnings.warn("map figure skipped: no cells", AnalysisWarning, stacklevel=2)
        return []
    depths = sorted(cells["n_layers"].unique())
    widths = sorted(cells["d_model"].unique())
    grid = np.full((len(depths), len(widths)), np.nan)
    for r in cells.itertuples():
        grid[depths.index(r.n_layers), widths.index(r.d_model)] = r.delta
    finite = grid[np.isfinite(grid)]
    span = max(float(np.abs(finite).max()) if finite.size else 0.0, 1e-3)
    fig, ax = plt.subplots(figsize=(1.9 * len(widths) + 2.2, 1.25 * len(depths) + 1.6))
    im = ax.imshow(grid, cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -span, span), origin="lower", aspect="auto")
    by_cell = {(r.n_layers, r.d_model): r for r in cells.itertuples()}
    for i, j in np.ndindex(grid.shape):
        r = by_cell.get((depths[i], widths[j]))
        if r is None or r.n_pairs == 0:  # a cell of the design without pairs, or a gap in the grid's product
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", color="#999999", lw=0))
            ax.text(j, i, "not run", ha="center", va="center", fontsize=8, color="#555555")
            continue
        hw = f"±{r.half_width:.3f}" if np.isfinite(r.half_width) else "1 pair"
        mark = {"wins": " ✓", "loses": " ✗"}.get(r.verdict, "")
        ax.text(j, i, f"{r.delta:+.3f}{mark}\n{hw}\nn={r.n_pairs}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(widths)), [str(w) for w in widths])
    ax.set_yticks(range(len(depths)), [str(d) for d in depths])
    ax.set_xlabel("width d_model")
    ax.set_ylabel("depth L_b (transformer blocks)")
    ax.set_title(f"{opts.arm} − {opts.baseline}: Δ val loss, 95% half-width\n(✓ wins, ✗ loses at 95%)", fontsize=10)
    fig.colorbar(im, ax=ax, label="Δ loss (nats/token)")
    fig.tight_layout()
    return save(fig, stem, dpi=150, tight=False)


def analyse_map(
    df: pd.DataFrame, out: Path, opts: MapOptions = MapOptions(), cells: list[tuple[int, int]] | None = None
) -> dict[str, Any]:
    """map.json (a crossing beyond the map is "inf"), map_summary.md and fig7_map.png/pdf under ``out``."""
    from ..io.report import write_report

    out.mkdir(parents=True, exist_ok=True)
    table = cell_table(df, opts, cells)
    bounds = boundaries(df, opts)
    doc = {
        "arm": opts.arm,
        "baseline": opts.baseline,
        "level": opts.level,
        "cells": table.to_dict(orient="records"),
        "boundaries": bounds.astype(object).replace([math.inf], "inf").to_dict(orient="records"),
    }
    md = "\n".join(["# Depth-by-width map", "", *map_markdown(table, bounds, opts)]) + "\n"
    return write_report(out, doc, "map.json", {"map_summary.md": md}, map_figure(table, out / "fig7_map", opts))


# ---- python -m analysis <command> -----------------------------------------------------------------------------------


def _arguments(p: argparse.ArgumentParser) -> None:
    add_results_out(
        p,
        "the map study's results.csv (or a study directory)",
        "output directory (map.json, map_summary.md, fig7_map.png)",
    )
    add_arms(p, "block_attnres")
    add_bootstrap(p, "resamples for the boundary")


@register(
    "map",
    arguments=_arguments,
    files="map_summary.md, map.json, fig7_map.png",
    study_kind="map",
    printed=lambda doc: [cell_line(c) for c in doc["cells"]],
)
def report(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    opts = options_from(MapOptions, args, B=args.bootstrap)
    return analyse_map(load_one_dataset(args.results), Path(args.out), opts)


def cell_line(c: dict[str, Any]) -> str:
    lo, hi = c["ci_lo"], c["ci_hi"]
    ci = f"[{lo:+.4f}, {hi:+.4f}]" if lo is not None else "(one pair)"
    return f"L_b {c['n_layers']} x d {c['d_model']}: delta {c['delta']:+.4f} {ci}, {c['n_pairs']} pairs, {c['verdict']}"
