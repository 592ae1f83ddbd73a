"""Figures in the style of the AttnRes paper, each written as PNG and PDF.

Every function takes tidy data (the results DataFrame, the fit.json document, or per-run files located through
``run_dir``) and an output stem; it returns the written paths, or an empty list with an AnalysisWarning when the
inputs it needs are missing.
"""

from __future__ import annotations

import functools
import json
import math
import re
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ..io.fit_document import ArchGrid, BlockSizeSweep, FitDocument, Multiplier, VariantLaw
from ..io.runs import OWN_LR, AnalysisWarning, resolve_run_dir, size_order  # OWN_LR: an arm at its own tuned lr
from ..laws.fit import PowerLaw

COLORS = {
    "baseline": "#4d4d4d",
    "block_attnres": "#1f77b4",
    "full_attnres": "#d62728",
    "mhc_lite": "#2ca02c",
    "mhc": "#2ca02c",
    "denseformer": "#9467bd",
}
LABELS = {"baseline": "Baseline", "block_attnres": "Block AttnRes", "full_attnres": "Full AttnRes"}
BASELINE, FULL = "baseline", "full_attnres"  # the reference arms the block-size and ablation figures draw
FLAG_COLOR = "#e600e6"  # runs the outlier rule flagged: a ring in fig4, a dashed curve in loss_curves
MAX_ARROW = 4.0  # fig4: multiplier arrows longer than this are cut (and say so), so the axis stays near the data
CI_TEXT_BOUND = 20.0  # interval ends beyond [1/20, 20] print as "<0.05" / ">20"
_FALLBACK = ["#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]
Labels = dict[str, str] | None  # display names by variant (None: LABELS, else the variant's own name)

# The paper style, set only while one of these figures is drawn (:func:`styled`), so that importing this module
# leaves other figures in matplotlib's defaults.
STYLE = {
    "figure.dpi": 110,
    "savefig.dpi": 160,
    "font.size": 9.5,
    "axes.titlesize": 10,
    "axes.labelsize": 9.5,
    "legend.fontsize": 8.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
    "grid.linewidth": 0.6,
}


def styled(draw: Callable[..., Any]) -> Callable[..., Any]:
    """Draw (and save) the decorated figure in the paper style (STYLE)."""

    @functools.wraps(draw)
    def in_style(*args: Any, **kwargs: Any) -> Any:
        with plt.rc_context(STYLE):
            return draw(*args, **kwargs)

    return in_style


def color_of(variant: str, order: list[str] | None = None) -> str:
    if variant.endswith(OWN_LR) and variant[: -len(OWN_LR)] in COLORS:  # the same hue, darker
        r, g, b = matplotlib.colors.to_rgb(COLORS[variant[: -len(OWN_LR)]])
        return matplotlib.colors.to_hex((0.55 * r, 0.55 * g, 0.55 * b))
    if variant in COLORS:
        return COLORS[variant]
    i = (order.index(variant) if order and variant in order else zlib.crc32(variant.encode())) % len(_FALLBACK)
    return _FALLBACK[i]


def label_of(variant: str, labels: Labels = None) -> str:
    if variant.endswith(OWN_LR) and not (labels or {}).get(variant):
        return label_of(variant[: -len(OWN_LR)], labels) + " (own lr)"
    return (labels or {}).get(variant) or LABELS.get(variant, variant)


def save(
    fig: plt.Figure, stem: str | Path, formats: tuple[str, ...] = (".png", ".pdf"), dpi: float | None = None, tight=True
) -> list[Path]:
    """Save ``fig`` as ``stem`` with each suffix of ``formats`` (its directory made), cropped to its contents
    (``tight``) at ``dpi`` (None: rcParams' savefig.dpi), then close it; returns the written paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(f) for f in formats]
    options: dict[str, Any] = {"bbox_inches": "tight"} if tight else {}
    if dpi is not None:
        options["dpi"] = dpi
    for p in paths:
        fig.savefig(p, **options)
    plt.close(fig)
    return paths


def interval_errors(y: Any, ci95: list[list[float] | None]) -> np.ndarray:
    """Error-bar lengths (2, n) below and above each value ``y`` of its 95% interval; 0 where there is none."""
    return np.array([[v - c[0], c[1] - v] if c else [0.0, 0.0] for v, c in zip(y, ci95)], dtype=float).reshape(-1, 2).T


def delta_errorbar(ax: plt.Axes, x: Any, y: Any, ci95: list[list[float] | None], horizontal: bool = False, **style):
    """Each Δ (arm - reference) at ``x`` with its 95% interval as an error bar (none: a bare point), vertical, or
    along x when ``horizontal`` (then ``x`` is the row position); ``style`` goes to matplotlib's errorbar."""
    err = interval_errors(y, ci95)
    if horizontal:
        return ax.errorbar(y, x, xerr=err, **style)
    return ax.errorbar(x, y, yerr=err, **style)


def _compute_formatter(x: float, _pos: Any = None) -> str:
    """Plain numbers for paper-scale compute (0.5, 1, 2, 5), powers of ten for CPU-scale (1e-6)."""
    if x <= 0:
        return ""
    if 0.01 <= x < 1e4:
        return f"{x:g}"
    e = math.floor(math.log10(x))
    mant = x / 10**e
    return f"$10^{{{e}}}$" if abs(mant - 1) < 1e-6 else f"${mant:g}\\times10^{{{e}}}$"


def _log_compute_axis(ax: plt.Axes, lo: float, hi: float) -> None:
    ax.set(xscale="log", xlim=(lo, hi))
    if hi / lo < 30:  # less than ~1.5 decades: label 1-2-5 steps, else only decades would be visible
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(_compute_formatter))


# ---- Fig. 4: scaling law with the multiplier arrow ---------------------------------------------------------------


@styled
def scaling_figure(
    df: pd.DataFrame,
    doc: FitDocument,
    stem: Path,
    *,
    compute: str = "pflops_days",
    labels: Labels = None,
    variants: list[str] | None = None,
    title: str | None = None,
    per_size_panel: bool = True,
) -> list[Path]:
    """Val loss vs compute (log x): runs, per-size means, the paper-form law per variant, and for each variant a
    horizontal arrow from its curve at the largest compute to the baseline curve at the same loss (length M),
    labelled with M and its 95% interval; the joint-fit m with its interval is printed below."""
    fits = doc.variants
    variants = [v for v in (variants or list(fits)) if v in fits]
    if not variants:
        warnings.warn("scaling figure skipped: no fitted variants", AnalysisWarning, stacklevel=2)
        return []
    base = doc.baseline
    mults = {v: doc.multipliers[v] for v in variants if v in doc.multipliers}
    C_all = df.loc[df["variant"].isin(variants), compute].to_numpy(float)
    reach = max(
        [min(mm.paper_M, MAX_ARROW) * mm.paper_M_at_C for mm in mults.values() if np.isfinite(mm.paper_M or np.nan)]
        + [C_all.max()]
    )
    lo, hi = C_all.min() / 1.25, max(reach, C_all.max()) * 1.3

    if per_size_panel and mults:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13.4, 4.5), gridspec_kw={"width_ratios": [1.45, 1]})
    else:
        fig, ax = plt.subplots(figsize=(8.8 if mults else 6.6, 4.5))
        ax2 = None
    grid = np.geomspace(lo, hi, 200)
    _runs_and_laws(ax, df, fits, variants, grid, compute, labels)
    y_lo, y_hi = _loss_limits(df, variants, grid, fits)
    y_bottom = y_lo - (0.06 + 0.045 * len(mults)) * (y_hi - y_lo) if mults else y_lo
    _multiplier_arrows(ax, fits, mults, variants, labels, (y_bottom, y_hi))
    _joint_fit_box(ax, mults, labels)
    _log_compute_axis(ax, lo, hi)
    xlabel = "Compute (PFLOP/s-days)" + ("" if compute == "pflops_days" else f"  [{compute}]")
    title = title or f"Scaling laws; arrows: multiplier M vs {label_of(base, labels)} at the largest C"
    ax.set(ylim=(y_bottom, y_hi), xlabel=xlabel, ylabel="Validation loss", title=title)
    ax.legend(loc="upper right", frameon=True, framealpha=0.9)
    if ax2 is not None:
        _multiplier_panel(ax2, mults, variants, labels, base)
        _log_compute_axis(ax2, lo, hi)
        ax2.set_xlabel(xlabel)
    fig.tight_layout()
    return save(fig, stem)


def _runs_and_laws(
    ax: plt.Axes,
    df: pd.DataFrame,
    fits: dict[str, Any],
    variants: list[str],
    grid: np.ndarray,
    compute: str,
    labels: Labels,
) -> None:
    """Each variant's runs (flagged ones ringed), per-size means and fitted law."""
    flag_label: str | None = "flagged run (outlier rule)"
    for v in variants:
        f = fits[v]
        col = color_of(v, variants)
        d = df[df["variant"] == v]
        ax.scatter(d[compute], d["val_loss"], s=12, color=col, alpha=0.45, lw=0, zorder=3)
        if "flags" in d.columns and (d["flags"] != "").any():
            odd = d[d["flags"] != ""]
            style = {"s": 70, "facecolors": "none", "edgecolors": FLAG_COLOR, "lw": 1.2, "zorder": 6}
            ax.scatter(odd[compute], odd["val_loss"], **style, label=flag_label)
            flag_label = None
        means = d.groupby("size")[[compute, "val_loss"]].mean()
        ax.scatter(means[compute], means["val_loss"], s=34, color=col, edgecolor="white", lw=0.7, zorder=4)
        law = f"{label_of(v, labels)}: $L = {f.A:.3f}\\,C^{{-{f.alpha:.4f}}}$"
        ax.plot(grid, PowerLaw(f.A, f.alpha).loss(grid), color=col, lw=1.5, zorder=2, label=law)


def _multiplier_arrows(
    ax: plt.Axes, fits: dict[str, Any], mults: dict[str, Any], variants: list[str], labels: Labels, ylim: tuple
) -> None:
    """The arrows (variant curve at C* -> baseline curve at the same loss, M x further right), each labelled in
    the right margin at its height (``ylim``: the axis' loss range), pushed apart where arrows end close together."""
    y_bottom, y_hi = ylim
    arrows = sorted(
        ((v, mm) for v, mm in mults.items() if mm.paper_M and np.isfinite(mm.paper_M)),
        key=lambda t: PowerLaw(fits[t[0]].A, fits[t[0]].alpha).loss(t[1].paper_M_at_C),
    )
    ends = []  # (arrow's loss in axes fraction, label, colour)
    for v, mm in arrows:
        C_star = mm.paper_M_at_C
        y = float(PowerLaw(fits[v].A, fits[v].alpha).loss(C_star))
        col = color_of(v, variants)
        M_drawn = min(mm.paper_M, MAX_ARROW)  # a longer arrow would stretch the axis past the data: cut it
        whole = M_drawn == mm.paper_M
        ls = "-" if whole else "--"
        arrow = {"arrowstyle": "-|>" if whole else "-", "color": col, "lw": 1.6, "shrinkA": 0, "shrinkB": 0, "ls": ls}
        ax.annotate("", xy=(C_star * M_drawn, y), xytext=(C_star, y), arrowprops=arrow, zorder=5)
        txt = f"{label_of(v, labels)}: M = {mm.paper_M:.2f}×" + ci_text(mm.paper_M_ci95)
        if M_drawn < mm.paper_M:
            txt += f" (arrow cut at {MAX_ARROW:g}×)"
        ends.append(((y - y_bottom) / (y_hi - y_bottom), txt, col))
    for frac, (_, txt, col) in zip(_spread(sorted(e[0] for e in ends), gap=0.075), sorted(ends, key=lambda e: e[0])):
        style = {"color": col, "ha": "left", "va": "center", "fontsize": 8.5, "clip_on": False, "zorder": 6}
        ax.text(1.015, frac, txt, transform=ax.transAxes, **style)


def _joint_fit_box(ax: plt.Axes, mults: dict[str, Any], labels: Labels) -> None:
    """The box of joint-fit multipliers m with their intervals, lower left."""
    lines = []
    for v, mm in mults.items():
        s = f"{label_of(v, labels)}: m = {mm.m:.2f}×" + ci_text(mm.m_ci95, at_bound=mm.m_ci95_at_bound)
        if mm.p_m_le_1 is not None:
            s += f", P(m≤1) = {mm.p_m_le_1:.3f}"
        if mm.headline == "curve":
            s += " (exponents differ: read M(C))"
        lines.append(s)
    if lines:
        form = {m.joint.form if m.joint else None for m in mults.values()}
        head = "joint fit, shared " + ("E, α" if form == {"saturating"} else "α") + " (95% CI):"
        box = {"boxstyle": "round,pad=0.35", "fc": "white", "ec": "0.8", "alpha": 0.9}
        text = "\n".join([head, *lines])
        ax.text(0.02, 0.03, text, transform=ax.transAxes, fontsize=7.8, va="bottom", ha="left", bbox=box, zorder=6)


def _spread(fracs: list[float], gap: float, lo: float = 0.02, hi: float = 0.98) -> list[float]:
    """Positions (axes fractions) for labels wanted at the sorted heights ``fracs``: each at least ``gap`` above
    the one below, all within [lo, hi] where they fit, as near their wanted heights as that allows."""
    out: list[float] = []
    for f in fracs:
        out.append(max(min(max(f, lo), hi), out[-1] + gap) if out else min(max(f, lo), hi))
    over = out[-1] - hi if out else 0.0
    if over > 0:  # the stack runs off the top: move it down, then keep the gaps from the bottom up
        out = [o - over for o in out]
        for k in range(len(out) - 2, -1, -1):
            out[k] = min(out[k], out[k + 1] - gap)
    return out


def _multiplier_panel(
    ax: plt.Axes, mults: dict[str, Multiplier], variants: list[str], labels: Labels, base: str
) -> None:
    """Per-size multipliers m_s (baseline curve inverted at each variant's loss) with intervals, the joint-fit m
    as a band, and the paper-form M(C) curve: a trend in m_s means the gain is not a constant multiplier."""
    n = len(mults)
    y_lo, y_hi = _multiplier_limits(mults)
    for k, (v, mm) in enumerate(mults.items()):
        col = color_of(v, variants)
        ps = mm.per_size
        C = np.array([p.C for p in ps.values()])
        shift = 1.0 + 0.04 * (k - (n - 1) / 2)  # dodge the markers of different variants
        y = np.array([p.m for p in ps.values()])
        ci = np.array([[np.nan if b is None else b for b in (p.m_ci95 or [None, None])] for p in ps.values()], float)
        ci_clipped = np.clip(ci, y_lo, y_hi)  # an unbounded interval ends at the panel's edge, marked by a caret
        yc = np.clip(y, y_lo, y_hi)
        yerr = np.abs(np.vstack([yc - ci_clipped[:, 0], ci_clipped[:, 1] - yc]))
        style = {"fmt": "o", "ms": 4.5, "color": col, "capsize": 2.5, "lw": 1.1, "zorder": 4}
        label = f"{label_of(v, labels)}: $m_s$ per size"
        ax.errorbar(C * shift, yc, yerr=None if np.isnan(yerr).all() else yerr, **style, label=label)
        for end, edge, marker in ((ci[:, 1], y_hi, "^"), (ci[:, 0], y_lo, "v")):
            out = np.isfinite(end) & ((end > edge) if marker == "^" else (end < edge))
            if out.any():
                caret = {"marker": marker, "s": 30, "color": col, "zorder": 5, "clip_on": False}
                ax.scatter(C[out] * shift, np.full(out.sum(), edge), **caret)
        lo_, hi_ = mm.m_ci95
        if lo_ is not None:
            ax.axhspan(max(lo_, y_lo), min(hi_, y_hi), color=col, alpha=0.12, lw=0)
        ax.axhline(mm.m, color=col, lw=1.2, alpha=0.9)
        cur = mm.paper_M_curve
        if cur:
            ax.plot(cur.C, cur.M, color=col, ls="--", lw=1.0, alpha=0.9)
    ax.axhline(1.0, color="0.3", lw=0.9, ls=":")
    ax.set(yscale="log", ylim=(y_lo, y_hi))
    if y_hi / y_lo > 12:  # no crowded labels, and at least two on a narrow axis
        subs: tuple[float, ...] = (1.0, 2.0, 5.0)
    elif y_hi / y_lo > 3:
        subs = (1.0, 1.25, 1.5, 2.0, 3.0, 5.0)
    else:
        subs = (1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 6.0, 7.0, 8.0, 9.0)
    ax.yaxis.set_major_locator(mticker.LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda x, _: f"{x:g}×"))
    ax.yaxis.set_minor_formatter(mticker.NullFormatter())
    ax.set_ylabel(f"Compute multiplier vs {label_of(base, labels)}")
    title = "Multiplier: $m_s$ per size (points), joint-fit m (line, 95% band),\npaper-form M(C) (dashed)"
    ax.set_title(title, fontsize=9)
    ax.legend(loc="best", frameon=True, framealpha=0.9)


def _multiplier_limits(mults: dict[str, Multiplier]) -> tuple[float, float]:
    """Log-axis limits that hold every point estimate, 1 and the joint-fit intervals, but never more than
    MAX_ARROW^2 either way: a bootstrap interval that runs to 1e9 must not flatten the points to a line."""
    vals = [1.0]
    for mm in mults.values():
        vals += [p.m for p in mm.per_size.values() if p.m is not None]
        vals += [mm.m] + [b for b in (mm.m_ci95 or []) if b is not None]
        vals += [b for p in mm.per_size.values() for b in (p.m_ci95 or []) if b is not None]
    vals_arr = np.clip(np.array([v for v in vals if np.isfinite(v) and v > 0], float), 1 / MAX_ARROW**2, MAX_ARROW**2)
    return float(vals_arr.min()) / 1.08, float(vals_arr.max()) * 1.08


def ci_text(ci: Any, bound: float = CI_TEXT_BOUND, at_bound: list[bool] | None = None) -> str:
    """' [lo, hi]' for a multiplier interval; ends beyond [1/bound, bound] print as '<x' / '>x' (a bootstrap
    interval of a fit with too few points can run to 1e9). An end that ``at_bound`` flags (fit.json's
    ``*_ci95_at_bound``: set by a search bound, unbounded) prints as '≤x' / '≥x'."""
    if not ci or ci[0] is None or ci[1] is None or not (np.isfinite(ci[0]) and np.isfinite(ci[1])):
        return ""
    lo_b, hi_b = (bool(at_bound[0]), bool(at_bound[1])) if at_bound else (False, False)
    lo = f"<{1 / bound:.2g}" if ci[0] < 1 / bound else ("≤" if lo_b else "") + f"{ci[0]:.2f}"
    hi = f">{bound:g}" if ci[1] > bound else ("≥" if hi_b else "") + f"{ci[1]:.2f}"
    return f" [{lo}, {hi}]"


def _loss_limits(
    df: pd.DataFrame, variants: list[str], grid: np.ndarray, fits: dict[str, VariantLaw]
) -> tuple[float, float]:
    vals = [df.loc[df["variant"].isin(variants), "val_loss"].to_numpy(float)]
    vals += [PowerLaw(fits[v].A, fits[v].alpha).loss(grid[[0, -1]]) for v in variants]
    allv = np.concatenate(vals)
    lo, hi = float(np.nanmin(allv)), float(np.nanmax(allv))
    pad = 0.06 * (hi - lo)
    return lo - pad, hi + 0.25 * (hi - lo)  # headroom for the legend


# ---- per-run files: loss curves (metrics.csv), Fig. 5b/c and Fig. 8 (diagnostics.json) ---------------------------


def _warn_missing(what: str, missing: list[str], stacklevel: int, limit: int = 8) -> None:
    if missing:
        more = f" and {len(missing) - limit} more" if len(missing) > limit else ""
        names = ", ".join(missing[:limit]) + more
        warnings.warn(f"{what} for {len(missing)} run(s): {names}", AnalysisWarning, stacklevel=stacklevel + 1)


def _run_files(df: pd.DataFrame, base_dir: str | None, name: str, missing: list[str]) -> Iterator[tuple[Any, Path]]:
    """Each run's row and its file ``name`` (in its run directory); the runs without one go to ``missing``."""
    for _, row in df.iterrows():
        d = resolve_run_dir(row, base_dir)
        if d is not None and (d / name).is_file():
            yield row, d / name
        else:
            missing.append(str(row["run_id"]))


def _loss_curves(df: pd.DataFrame, base_dir: str | None) -> pd.DataFrame | None:
    """Every run's val-loss curve from its metrics.csv (step, tokens, flops, val_loss, with its variant, size, seed,
    run_id and outlier flag), one table; runs without a usable file are named in one warning; None without any."""
    curves: list[pd.DataFrame] = []
    missing: list[str] = []
    for row, path in _run_files(df, base_dir, "metrics.csv", missing):
        m = pd.read_csv(path)
        if not {"tokens", "flops", "val_loss"} <= set(m.columns):
            missing.append(f"{row['run_id']} (metrics.csv lacks tokens/flops/val_loss)")
            continue
        flagged = bool(str(row.get("flags", "") or ""))  # the outlier rule's flag (analysis.io.report)
        m = m.dropna(subset=["val_loss"])
        if m.empty:  # e.g. a run directory whose training never reached an evaluation
            missing.append(f"{row['run_id']} (metrics.csv has no val_loss)")
            continue
        m = m.assign(variant=row["variant"], size=row["size"], seed=row["seed"], run_id=row["run_id"], flagged=flagged)
        curves.append(m[["step", "tokens", "flops", "val_loss", "variant", "size", "seed", "run_id", "flagged"]])
    _warn_missing("loss curves: no usable metrics.csv", missing, stacklevel=2)
    return pd.concat(curves, ignore_index=True) if curves else None


def loss_curves_figure(
    df: pd.DataFrame, stem: Path, *, base_dir: str | None = None, compute: str = "pflops_days", labels: Labels = None
) -> list[Path]:
    """Val loss vs tokens (top) and vs FLOPs (bottom), one panel per size, one line per variant (mean over
    seeds at each evaluation step). Runs without a metrics.csv are skipped with one warning naming them."""
    c = _loss_curves(df, base_dir)
    if c is None:
        return []
    sizes = [s for s in size_order(df, compute) if s in set(c["size"])]
    variants = list(pd.unique(df["variant"]))
    ncol = len(sizes)
    fig, axes = plt.subplots(2, ncol, figsize=(max(2.6 * ncol + 0.6, 4.6), 5.2), squeeze=False)
    flag_label: str | None = "flagged run (outlier rule)"
    for j, size in enumerate(sizes):
        cs = c[c["size"] == size]
        final = df.loc[df["size"] == size, "val_loss"]
        for i, xcol in enumerate(("tokens", "flops")):
            ax = axes[i, j]
            for v in variants:
                cv = cs[cs["variant"] == v]
                if cv.empty:
                    continue
                mean = cv.groupby("step")[[xcol, "val_loss"]].mean()
                mean = mean[mean[xcol] > 0]
                ax.plot(mean[xcol], mean["val_loss"], color=color_of(v, variants), lw=1.3, label=label_of(v, labels))
                for _, run in cv[cv["flagged"]].groupby("run_id"):  # a flagged run: its own curve, dashed
                    run = run[run[xcol] > 0]
                    style = {"color": FLAG_COLOR, "ls": "--", "lw": 0.9, "alpha": 0.85}
                    ax.plot(run[xcol], run["val_loss"], **style, label=flag_label)
                    flag_label = None
            ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))  # one "1e8" offset instead of long labels
            # Zoom from just under the final losses to the loss reached at ~10% of training (per variant, so the
            # tokens and FLOPs panels of a size zoom alike): the start of training would flatten everything.
            progress = cs[xcol] / cs.groupby("variant")[xcol].transform("max")
            early = cs[progress >= 0.1]["val_loss"]
            top = float(np.nanmax(early)) if len(early) else float(cs["val_loss"].max())
            bottom = float(np.nanmin(np.r_[cs["val_loss"].to_numpy(float), final.to_numpy(float)]))
            ax.set_ylim(bottom - 0.05 * (top - bottom), top)
            if i == 0:
                ax.set_title(size)
            ax.set_xlabel("Tokens" if xcol == "tokens" else "FLOPs")
            if j == 0:
                ax.set_ylabel("Validation loss")
    seen = _legend_entries(axes.ravel())  # a flagged run may sit in any panel
    labs = list(seen)
    anchor, ncols = (0.5, 1.04 + 0.035 * (len(labs) > 2 * ncol + 1)), min(len(labs), 2 * ncol + 1)
    fig.legend(list(seen.values()), labs, loc="upper center", ncol=ncols, frameon=False, bbox_to_anchor=anchor)
    fig.tight_layout()
    return save(fig, stem)


def _legend_entries(axes: Any) -> dict[str, Any]:
    """Each legend label of ``axes`` once, with its first handle."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    return seen


def _diagnostics(df: pd.DataFrame, base_dir: str | None) -> tuple[list[dict[str, Any]], list[str]]:
    out: list[dict[str, Any]] = []
    missing: list[str] = []
    for row, path in _run_files(df, base_dir, "diagnostics.json", missing):
        d = json.loads(path.read_text())
        residual = row.get("residual", d.get("residual"))
        d.update(variant=row["variant"], size=row["size"], seed=row["seed"], residual=residual)
        out.append(d)
    return out, missing


def _largest_size_with(diags: list[dict[str, Any]], df: pd.DataFrame, key: str, compute: str) -> str | None:
    have = {d["size"] for d in diags if d.get(key)}
    return next((s for s in reversed(size_order(df, compute)) if s in have), None)


@styled
def dynamics_figure(
    df: pd.DataFrame, stem: Path, *, base_dir: str | None = None, compute: str = "pflops_days", labels: Labels = None
) -> list[Path]:
    """Fig. 5b/c: output RMS and gradient norm per transformer block at the end of training, baseline vs AttnRes
    (largest size with diagnostics, mean over seeds)."""
    diags, missing = _diagnostics(df, base_dir)
    _warn_missing("training dynamics: no diagnostics.json", missing, stacklevel=2)
    size = _largest_size_with(diags, df, "block_output_rms", compute)
    if size is None:
        return []
    variants = list(pd.unique(df["variant"]))
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.6))
    for ax, key, ylabel in ((axes[0], "block_output_rms", "Output RMS"), (axes[1], "block_grad_norm", "Gradient norm")):
        for v in variants:
            rows = [np.asarray(d[key], float) for d in diags if d["size"] == size and d["variant"] == v and d.get(key)]
            if not rows or len({r.size for r in rows}) != 1:
                continue
            y = np.mean(rows, axis=0)
            style = {"marker": "o", "ms": 3.5, "lw": 1.4, "color": color_of(v, variants), "label": label_of(v, labels)}
            ax.plot(np.arange(1, y.size + 1), y, **style)  # transformer blocks 1..L (the embedding is 0, as in fig8)
        ax.set(xlabel="Transformer block l (1..L)", ylabel=ylabel)
        ax.set_ylim(bottom=0)
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[0].set_title(f"(b) output magnitude per block ({size})")
    axes[1].set_title(f"(c) gradient magnitude per block ({size})")
    axes[0].legend(frameon=False)
    fig.tight_layout()
    return save(fig, stem)


_SUBLAYER_LABEL = re.compile(r"^(attn|mlp)(\d+)$")


def source_label(label: str) -> str:
    """A depth-attention source's tick label in the paper's numbering (the embedding is source 0, transformer blocks
    1..L): Full AttnRes's 0-based sublayer sources (``attn0``, ``mlp0`` = block 1's) are shifted by one; ``emb``
    and Block's ``block1..N`` are kept."""
    m = _SUBLAYER_LABEL.match(label)
    return f"{m.group(1)}{int(m.group(2)) + 1}" if m else label


def depth_weight_panel(W: np.ndarray, kinds: list[str], srcs: list[str], kind: str) -> tuple[np.ndarray, list[str]]:
    """One Fig. 8 panel: the rows of ``W`` (reads x sources, NaN = not visible) whose read kind is ``kind``, without
    the source columns that no such read can see (all-NaN in the panel: e.g. under Full AttnRes the last block's
    pre-attention read does not see attn_L and mlp_L), and those columns' labels (:func:`source_label`)."""
    rows = [r for r, k in enumerate(kinds) if k == kind]
    M = np.asarray(W, float)[rows]
    keep = ~np.all(np.isnan(M), axis=0) if M.shape[0] else np.ones(M.shape[1], bool)
    return M[:, keep], [source_label(srcs[k]) for k in np.flatnonzero(keep)]


def _depth_weight_runs(diags: list[dict[str, Any]], df: pd.DataFrame, residual: str, name: str, compute: str):
    """The (variant, size, mean weights, read kinds, source labels) of one residual scheme's panel row: the runs of
    its canonical variant ``name`` (else any variant with that scheme) at the largest size with weights; None
    without any."""
    cand = [d for d in diags if d.get("depth_weights") and d.get("residual") == residual]
    cand = [d for d in cand if d["variant"] == name] or cand
    if not cand:
        return None
    size = _largest_size_with(cand, df, "depth_weights", compute)
    runs = [d for d in cand if d["size"] == size]
    runs = [d for d in runs if d["variant"] == runs[0]["variant"]]
    mats = [np.array([[np.nan if x is None else x for x in r] for r in d["depth_weights"]], float) for d in runs]
    if len({m.shape for m in mats}) != 1:
        mats = mats[:1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN cells stay NaN (not visible)
        W = np.nanmean(mats, axis=0)
    return runs[0]["variant"], size, W, list(runs[0]["read_kinds"]), list(runs[0]["source_labels"])


@styled
def depth_weights_figure(
    df: pd.DataFrame, stem: Path, *, base_dir: str | None = None, compute: str = "pflops_days", labels: Labels = None
) -> list[Path]:
    """Fig. 8: depth-attention weights (rows: reads, columns: sources) for Full and Block AttnRes, pre-attention
    and pre-MLP reads in separate panels (largest size with weights, mean over seeds; blank = not visible)."""
    diags, _ = _diagnostics(df, base_dir)
    panels = []
    for residual, name in (("full", "full_attnres"), ("block", "block_attnres")):
        found = _depth_weight_runs(diags, df, residual, name, compute)
        if found is not None:
            panels.append((*found, residual))
    if not panels:
        msg = "depth-weight heatmaps skipped: no diagnostics.json with depth_weights (Full/Block AttnRes)"
        warnings.warn(msg, AnalysisWarning, stacklevel=2)
        return []
    vmax = max(float(np.nanmax(p[2])) for p in panels)
    fig, axes = plt.subplots(len(panels), 2, figsize=(9.0, 3.4 * len(panels) + 0.3), squeeze=False)
    cmap = plt.get_cmap("viridis").copy()
    cmap.set_bad("#f2f2f2")
    im = None
    for i, (variant, size, W, kinds, srcs, residual) in enumerate(panels):
        for j, kind in enumerate(("attn", "mlp")):
            ax = axes[i, j]
            M, names = depth_weight_panel(W, kinds, srcs, kind)
            rows = M.shape[0]
            im = ax.imshow(
                np.ma.masked_invalid(M), cmap=cmap, vmin=0, vmax=vmax, aspect="auto", interpolation="nearest"
            )
            ax.grid(False)
            step = max(1, math.ceil(len(names) / 17))
            ax.set_xticks(range(0, len(names), step))
            ticks = [names[k] for k in range(0, len(names), step)]
            ax.set_xticklabels(ticks, rotation=90 if len(names) > 8 else 0, fontsize=7.5)
            rstep = max(1, math.ceil(rows / 16))
            ax.set_yticks(range(0, rows, rstep))
            ax.set_yticklabels([str(k + 1) for k in range(0, rows, rstep)], fontsize=7.5)
            sources = "block n: the n-th block's sum)" if residual == "block" else "attn l, mlp l: block l's sublayers)"
            title = f"{label_of(variant, labels)}: pre-{'attention' if kind == 'attn' else 'MLP'} reads ({size})"
            ax.set(xlabel="Source (emb = 0; " + sources, ylabel="Layer (transformer block)", title=title)
    fig.tight_layout()
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.85, pad=0.02, label="Depth-attention weight α")
    return save(fig, stem)


# ---- Fig. 7 (architecture grid: analysis.laws.arch_grid); Fig. 6 (block size) is block_size_figure, below --------


@styled
def _grid_heatmaps(
    xs: list[Any], ys: list[Any], panels: list[tuple[str, np.ndarray]], stem: Path, suptitle: str | None = None
) -> list[Path]:
    """Side-by-side heat maps of loss over (d_model/L_b columns, H/L_b rows) on one colour scale; each panel's
    best cell outlined in red; missing cells (NaN) left blank."""
    finite = np.concatenate([g[np.isfinite(g)] for _, g in panels])
    vmin, vmax = float(finite.min()), float(finite.max())
    span = vmax - vmin if vmax > vmin else 1.0
    fig, axes = plt.subplots(1, len(panels), figsize=(4.7 * len(panels), 3.9), squeeze=False)
    axes = list(axes[0])
    im = None
    for ax, (name, g) in zip(axes, panels):
        im = ax.imshow(np.ma.masked_invalid(g), cmap="viridis_r", vmin=vmin, vmax=vmax, aspect="auto")
        ax.grid(False)
        title = name
        i = j = -1
        if np.isfinite(g).any():
            i, j = np.unravel_index(np.nanargmin(g), g.shape)
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="red", lw=2))
            title = f"{name} (best {g[i, j]:.3f} at $d/L_b$={xs[j]:g}, $H/L_b$={ys[i]:g})"
        for (r, c), v in np.ndenumerate(g):
            if not np.isfinite(v):
                ax.text(c, r, "–", ha="center", va="center", fontsize=8, color="0.5")
                continue
            ink = "black" if (v - vmin) / span < 0.55 else "white"
            weight = "bold" if (r, c) == (i, j) else None
            ax.text(c, r, f"{v:.3f}", ha="center", va="center", fontsize=8, color=ink, fontweight=weight)
        ax.set(xticks=range(len(xs)), xticklabels=[f"{x:g}" for x in xs], xlabel="$d_{model}/L_b$")
        ax.set(yticks=range(len(ys)), yticklabels=[f"{y:g}" for y in ys], ylabel="$H/L_b$", title=title)
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    fig.colorbar(im, ax=axes, shrink=0.9, pad=0.02, label="Validation loss")
    return save(fig, stem)


def architecture_grid_figure(fig7: dict[str, Any], stem: Path) -> list[Path]:
    """Fig. 7 (the paper's numbers): loss over (d_model/L_b, H/L_b) at fixed compute, Baseline and AttnRes."""
    panels = [("Baseline", np.array(fig7["baseline"], float)), ("AttnRes", np.array(fig7["attnres"], float))]
    return _grid_heatmaps(list(fig7["d_over_Lb"]), list(fig7["H_over_Lb"]), panels, stem)


def arch_grid_figure(table: ArchGrid, stem: Path, labels: Labels = None) -> list[Path]:
    """Fig. 7 from our runs (analysis.laws.arch_grid.arch_grid_table): one heat map per variant, one colour scale."""
    panels = [
        (label_of(v, labels), np.array([[np.nan if c is None else c for c in r] for r in table.val_loss[v]], float))
        for v in table.variants
    ]
    budget = table.flops_budget
    title = "Architecture grid at fixed compute" + (f" C = {budget:.3g} FLOPs" if budget else "")
    return _grid_heatmaps(list(table.d_over_lb), list(table.heads_over_lb), panels, stem, suptitle=title)


# ---- learning-rate tuning (analysis.studies.lr) ------------------------------------------------------------------


@styled
def lr_figure(
    runs: pd.DataFrame,
    table: pd.DataFrame,
    stem: Path,
    labels: Labels = None,
    tuned: dict[str, dict[str, float]] | None = None,
    rule: str = "per_size",
) -> list[Path]:
    """Validation loss vs learning rate (log x), one panel per arm, one curve per size (:func:`_lr_curve`); ``runs``:
    analysis.studies.lr.lr_runs output; ``tuned`` (``lr[variant][size]``): the lrs written under ``rule``."""
    if table.empty:
        warnings.warn("LR figure skipped: no tuned curves", AnalysisWarning, stacklevel=2)
        return []
    variants = list(pd.unique(table["variant"]))
    sizes = list(pd.unique(table["size"]))  # ordered by parameters (lr_optima_with_draws)
    size_col, size_ls = _lr_styles(sizes)
    fig, axes = plt.subplots(1, len(variants), figsize=(4.6 * len(variants) + 0.4, 3.9), squeeze=False, sharey=True)
    finite = runs.loc[np.isfinite(runs["val_loss"]), "val_loss"]
    y_lo, y_hi = float(finite.min()), float(finite.max())
    pad = 0.06 * max(y_hi - y_lo, 1e-3)
    for ax, v in zip(axes[0], variants):
        for s in sizes:
            row = table[(table["variant"] == v) & (table["size"] == s)]
            if row.empty:
                continue
            d = runs[(runs["variant"] == v) & (runs["size"] == s)]
            lr_out = ((tuned or {}).get(str(v)) or {}).get(str(s))
            _lr_curve(ax, row.iloc[0], d, size_col[s], y_hi + pad, lr_out, label=s, ls=size_ls[s])
        grid_all = np.unique(np.concatenate([np.asarray(g, float) for g in table.loc[table["variant"] == v, "grid"]]))
        _lr_axis(ax, grid_all)
        ax.set(title=label_of(v, labels), ylim=(y_lo - pad, y_hi + 2 * pad))
    axes[0][0].set_ylabel("Validation loss")
    shown = _legend_entries(axes[0])  # whichever panel has a size's curve (an arm may lack a size)
    order = [s for s in sizes if s in shown]
    title = "size @ tokens / param" if any("@" in str(s) for s in sizes) else "size"
    axes[0][-1].legend(
        [shown[s] for s in order], order, title=title, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False
    )
    written = "; ◇ lr written (power-law trend over sizes)" if rule == "trend" and tuned else ""
    head = "Learning-rate tuning: mean loss per grid point (dots: runs),\nfitted optimum (★) with 95% interval"
    fig.suptitle(head + written + "; × diverged", fontsize=9)
    fig.tight_layout()
    return save(fig, stem)


def _lr_styles(sizes: list[Any]) -> tuple[dict[Any, Any], dict[Any, str]]:
    """Each curve's colour and line style: one colour per size on a viridis scale; for a multi-budget study's
    ``<size>@<tokens per param>`` curves one colour per size (tab10) and one line style per budget (dotted for the
    smallest, solid for the largest), so that rungs and budgets read apart."""
    budget = {s: str(s).split("@", 1)[1] for s in sizes if "@" in str(s)}
    if not budget:
        cmap = plt.get_cmap("viridis")
        return {s: cmap(0.1 + 0.8 * i / max(len(sizes) - 1, 1)) for i, s in enumerate(sizes)}, dict.fromkeys(sizes, "-")
    bases = list(dict.fromkeys(str(s).split("@", 1)[0] for s in sizes))
    budgets = sorted(set(budget.values()), key=float)
    styles = [*((":", "--", "-.")[i % 3] for i in range(len(budgets) - 1)), "-"]
    palette = plt.get_cmap("tab10")
    col = {s: palette(bases.index(str(s).split("@", 1)[0]) % 10) for s in sizes}
    return col, {s: styles[budgets.index(budget[s])] if s in budget else "-" for s in sizes}


def _lr_curve(
    ax: plt.Axes, r: pd.Series, d: pd.DataFrame, col: Any, y_top: float, lr_out: float | None, label: str, ls: str = "-"
):
    """One size's lr curve: the grid's mean loss, its runs (faint dots; diverged ones as crosses at ``y_top``), the
    fitted optimum ``r`` as a star with its 95% interval, ``lr_out`` (the lr written, where it differs from the
    optimum) as an open diamond, and "edge" under an optimum on the grid's edge."""
    grid = np.asarray(r["grid"], float)
    mean = np.array([np.nan if m is None else m for m in r["mean_loss"]], float)
    ax.plot(grid, mean, marker="o", ls=ls, color=col, ms=3.5, lw=1.3, label=label)
    ok = d[np.isfinite(d["val_loss"])]
    ax.scatter(ok["lr"], ok["val_loss"], s=9, color=col, alpha=0.35, lw=0)
    div = d[~np.isfinite(d["val_loss"])]
    if len(div):
        ax.scatter(div["lr"], np.full(len(div), y_top), marker="x", s=28, color=col, lw=1.2, clip_on=False)
    if not np.isfinite(r["lr"]):
        return
    lo, hi = r["ci95"]
    xerr = None if not (np.isfinite(lo) and np.isfinite(hi)) else [[r["lr"] - lo], [hi - r["lr"]]]
    star = {"fmt": "*", "ms": 11, "color": col, "mec": "black", "mew": 0.6, "capsize": 3, "lw": 1.2, "zorder": 5}
    ax.errorbar([r["lr"]], [r["loss_at_optimum"]], xerr=xerr, **star)
    if lr_out is not None and not np.isclose(lr_out, r["lr"], rtol=1e-3):
        ok_pts = np.isfinite(mean)
        y_out = np.interp(np.log(lr_out), np.log(grid[ok_pts]), mean[ok_pts]) if ok_pts.any() else r["loss_at_optimum"]
        ax.plot([lr_out], [y_out], "D", ms=6.5, mfc="white", mec=col, mew=1.6, zorder=6)
    if r["on_edge"]:
        where = (r["lr"], r["loss_at_optimum"])
        ax.annotate("edge", where, textcoords="offset points", xytext=(0, -13), ha="center", fontsize=7.5, color="red")


def _lr_axis(ax: plt.Axes, grid_all: np.ndarray) -> None:
    """A log lr axis labelled at no more than ~6 of the grid's lrs, evenly spread in log lr (near-equal lrs of two
    grids, e.g. 2.28e-3 and 2.36e-3, once), every grid lr a minor tick."""
    ax.set_xscale("log")
    span = float(grid_all[-1] / grid_all[0]) if len(grid_all) > 1 and grid_all[0] > 0 else 1.0
    ratio = max(1.25, 0.99 * span ** (1 / 5))
    ticks: list[float] = []
    for x in grid_all:  # each kept lr at least ``ratio`` times the one kept before
        if not ticks or x >= ratio * ticks[-1]:
            ticks.append(float(x))
    ax.xaxis.set_major_locator(mticker.FixedLocator(ticks))
    ax.xaxis.set_major_formatter(mticker.FixedFormatter([f"{x:.2g}" for x in ticks]))
    ax.xaxis.set_minor_locator(mticker.FixedLocator(grid_all))
    ax.xaxis.set_minor_formatter(mticker.NullFormatter())
    ax.set_xlabel("Peak learning rate")


@styled
def rollout_figure(ro: dict[str, Any], runs: pd.DataFrame, stem: Path, base: str, compute: str) -> list[Path]:
    """One panel per variant: both arms' runs (fitted rungs filled, held-out hollow), the fit without the held-out
    rungs drawn on to them, and each predicted loss with its prediction interval beside the measured mean."""
    variants = list(ro["variants"])
    if not variants:
        return []
    fig, axes = plt.subplots(1, len(variants), figsize=(5.2 * len(variants), 4.2), squeeze=False)
    held = set(ro["held_out"])
    for ax, v in zip(axes[0], variants):
        e = ro["variants"][v]
        j = e["joint"]
        Cs = runs[runs["variant"].isin([base, v])][compute].to_numpy(float)
        grid = np.geomspace(Cs.min() / 1.3, Cs.max() * 1.3, 100)
        for arm, A, color in ((base, j["A_base"], "tab:gray"), (v, j["A_variant"], "tab:blue")):
            rows = runs[runs["variant"] == arm]
            fitted, later = rows[~rows["size"].isin(held)], rows[rows["size"].isin(held)]
            ax.scatter(fitted[compute], fitted["val_loss"], s=12, color=color, alpha=0.6, label=f"{arm} (fitted)")
            hollow = {"s": 18, "facecolors": "none", "edgecolors": color, "label": f"{arm} (held out)"}
            ax.scatter(later[compute], later["val_loss"], **hollow)
            ax.plot(grid, j["E"] + A * grid ** (-j["alpha"]), color=color, lw=1)
            for p in e["points"]:
                if p["arm"] != arm or not p["prediction_interval95"]:
                    continue
                lo, hi = p["prediction_interval95"]
                yerr = [[p["predicted"] - lo], [hi - p["predicted"]]]
                ax.errorbar([p["C"]], [p["predicted"]], yerr=yerr, fmt="D", color=color, ms=5, capsize=4)
                ax.plot([p["C"]], [p["measured"]], marker="*", ms=11, color=color, mec="black", mew=0.5, ls="none")
        ax.set(xscale="log", xlabel=f"compute C ({compute})", ylabel="final val loss (nats/token)")
        ax.set_title(f"{v} vs {base}: fit on {len(ro['fitted_sizes'])} rungs, m = {e['m']:.3f}", fontsize=9)
        ax.legend(fontsize=7, title="◆ predicted (95% PI)   ★ measured mean", title_fontsize=7)
    fig.tight_layout()
    return save(fig, stem)


# ---- Table 4 and Fig. 6 ------------------------------------------------------------------------------------------


OFF_SCALE = 0.25  # |Δ| above this (an arm that failed to train) is drawn at the axis edge with its value


@styled
def ablation_figure(table: list[dict[str, Any]], stem: Path, title: str | None = None) -> list[Path]:
    """Table 4 as a dot plot: each arm's same-seed Δ vs the baseline with its 95% interval (ours) and the paper's Δ
    (hollow diamonds), arms top to bottom in the table's order; zero = the baseline."""
    arms = [r for r in table if r.get("delta_vs_baseline") is not None]
    y = np.arange(len(arms))[::-1]
    fig, ax = plt.subplots(figsize=(6.4, 0.32 * len(arms) + 1.4))
    d = np.array([r["delta_vs_baseline"] for r in arms], float)
    ci95 = [r.get("delta_ci95") for r in arms]
    style = {"fmt": "o", "color": COLORS["block_attnres"], "ms": 4.5, "capsize": 2.5, "lw": 1.2, "label": "ours"}
    delta_errorbar(ax, y, d, ci95, horizontal=True, **style)
    paper = [(yy, r["paper_delta"]) for yy, r in zip(y, arms) if r.get("paper_delta") is not None]
    if paper:
        hollow = {"marker": "D", "facecolors": "none", "edgecolors": COLORS["full_attnres"], "s": 28}
        ax.scatter([p for _, p in paper], [yy for yy, _ in paper], **hollow, label="paper (436M)", zorder=3)
    ax.axvline(0.0, color=COLORS[BASELINE], ls="--", lw=1.1)
    _clip_outliers(ax, d, y, [p for _, p in paper])
    ax.set_yticks(y)
    ax.set_yticklabels([r.get("label", r["variant"]) for r in arms], fontsize=8)
    xlabel = "Δ val loss vs baseline (negative: better); ours: same-seed pairs, 95% t interval"
    ax.set(xlabel=xlabel, title=title or "Ablations and peers (Table 4)")
    ax.legend(frameon=True, framealpha=0.9, fontsize=7.5, loc="best")
    fig.tight_layout()
    return save(fig, stem)


def _clip_outliers(ax: plt.Axes, d: np.ndarray, y: np.ndarray, paper: list[float]) -> None:
    """Keep the axis on the arms that trained: a difference beyond OFF_SCALE is marked at the edge, its value
    written beside it, instead of stretching the axis until the others' intervals cannot be read."""
    core = [abs(v) for v in [*d, *paper] if abs(v) <= OFF_SCALE]
    if len(core) == len(d) + len(paper):
        return
    lim = 1.25 * max(core, default=OFF_SCALE)
    ax.set_xlim(-lim, lim)
    for v, yy in zip(d, y):
        if abs(v) > lim:
            edge = math.copysign(lim, v)
            ax.plot([edge], [yy], marker=">" if v > 0 else "<", color=COLORS["block_attnres"], ms=7, clip_on=False)
            side = {"xytext": (-8 if v > 0 else 8, 6), "ha": "right" if v > 0 else "left", "fontsize": 7.5}
            ax.annotate(f"{v:+.2f}", (edge, yy), textcoords="offset points", **side)


@styled
def block_size_figure(
    sweep: BlockSizeSweep, stem: Path, title: str | None = None, paper: BlockSizeSweep | None = None
) -> list[Path]:
    """Fig. 6: loss against block size S (log2 axis), with 95% intervals where the sweep has them and the baseline
    and Full AttnRes as horizontal lines (their intervals as bands); for a measured sweep also its same-seed
    differences from the baseline (the seeds' shared noise cancels there); ``paper`` (its Fig. 6) in a last panel."""
    panels: list[tuple[BlockSizeSweep, str, bool]] = [(sweep, title or f"Ours: {sweep.size}", False)]
    if any(p.vs_baseline for p in sweep.points):
        panels.append((sweep, "Ours: same-seed difference from the baseline", True))
    if paper is not None:
        panels.append((paper, "Paper, Fig. 6 (436M, 32 sublayers)", False))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 3.8), squeeze=False)
    for ax, (sw, name, delta) in zip(axes[0], panels):
        (_delta_panel if delta else _block_size_panel)(ax, sw, name)
    fig.tight_layout()
    return save(fig, stem)


def _reference_line(ax: plt.Axes, name: str, y: float, ci: Any, ls: str, text: str) -> None:
    """A reference arm (BASELINE or FULL) as a horizontal line, its interval ``ci`` (if any) as a band."""
    ax.axhline(y, color=COLORS[name], ls=ls, lw=1.3, label=f"{LABELS[name]} ({text})")
    if ci:
        ax.axhspan(*ci, color=COLORS[name], alpha=0.12, lw=0)


def _delta_panel(ax: plt.Axes, sw: BlockSizeSweep, title: str) -> None:
    pts = [p for p in sw.points if p.vs_baseline and p.vs_baseline.get("delta") is not None]
    S = np.array([p.block_size for p in pts], float)
    d = np.array([p.vs_baseline["delta"] for p in pts], float)  # type: ignore[index]
    ci95 = [p.vs_baseline.get("delta_ci95") for p in pts]  # type: ignore[union-attr]
    style = {"color": COLORS["block_attnres"], "marker": "o", "ms": 5, "lw": 1.5, "capsize": 3}
    delta_errorbar(ax, S, d, ci95, **style, label="Block AttnRes")
    ax.axhline(0.0, color=COLORS[BASELINE], ls="--", lw=1.3, label=f"{LABELS[BASELINE]} (0)")
    full = (sw.full.vs_baseline or {}) if sw.full is not None else {}
    if full.get("delta") is not None:
        _reference_line(ax, FULL, full["delta"], full.get("delta_ci95"), ":", f"{full['delta']:+.3f}")
    _block_size_axes(ax, S, title, "Δ val loss vs baseline (same seeds)")


def _block_size_panel(ax: plt.Axes, sw: BlockSizeSweep, title: str) -> None:
    S = np.array([p.block_size for p in sw.points], float)
    y = np.array([p.val_loss for p in sw.points], float)
    ci95 = [p.val_loss_ci95 for p in sw.points]
    err = interval_errors(y, ci95) if any(c is not None for c in ci95) else None
    style = {"color": COLORS["block_attnres"], "marker": "o", "ms": 5, "lw": 1.5, "capsize": 3}
    ax.errorbar(S, y, yerr=err, **style, label="Block AttnRes")
    span = [y.min(), y.max()]
    for ref, name, ls in ((sw.baseline, BASELINE, "--"), (sw.full, FULL, ":")):
        if ref is None or ref.val_loss is None:
            continue
        _reference_line(ax, name, ref.val_loss, ref.val_loss_ci95, ls, f"{ref.val_loss:.3f}")
        span += [*(ref.val_loss_ci95 or []), ref.val_loss]
    if err is not None:
        span += list(y - err[0]) + list(y + err[1])
    lo, hi = min(span), max(span)
    pad = 0.08 * (hi - lo) if hi > lo else 0.01
    ax.set_ylim(lo - pad, hi + pad)
    _block_size_axes(ax, S, title, "Validation loss")


def _block_size_axes(ax: plt.Axes, S: np.ndarray, title: str, ylabel: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set(xticks=S, xticklabels=[f"{int(s)}" + ("\n(Full)" if s == 1 else "") for s in S])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(xlim=(S.min() / 1.4, S.max() * 1.4), xlabel="Block size S (sublayers per block)", ylabel=ylabel, title=title)
    ax.legend(frameon=True, framealpha=0.9, fontsize=7.5, loc="best")


# ---- training length and the compute-optimal frontier (analysis.studies.training_length) -------------------------


@styled
def frontier_figure(
    table: pd.DataFrame,
    fr: dict[str, Any] | None,
    stem: Path,
    arm: str,
    reference: str,
    cells: list[dict[str, Any]] | None = None,
) -> list[Path]:
    """Left: the same-seed Δ per (rung, budget) as a heat map (``table``: studies.training_length.gain_by_length),
    each cell with its multiplier m (``cells``: analysis.laws.cell_multiplier) under it; right: M(C) with its 95%
    band over the measured span of C, with N kept inside the measured rungs and with N free, each labelled with how
    far it reads the reference's law in D, and approach 2's M(C) where it is defined."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11.5, 4.6))
    _delta_heatmap(fig, ax, table, cells, arm, reference)
    if fr and "error" not in fr:
        _frontier_panel(bx, fr, reference, arm)
    else:
        bx.text(0.5, 0.5, f"no frontier: {(fr or {}).get('error', 'not fitted')}", ha="center", wrap=True, fontsize=8)
        bx.set_axis_off()
    fig.tight_layout()
    return save(fig, stem)


def _delta_heatmap(
    fig: plt.Figure, ax: plt.Axes, table: pd.DataFrame, cells: list[dict[str, Any]] | None, arm: str, reference: str
) -> None:
    rungs = list(dict.fromkeys(table["size"]))
    budgets = sorted(set(table["tokens_per_param"]))
    grid = np.full((len(rungs), len(budgets)), np.nan)
    for r in table.itertuples():
        grid[rungs.index(r.size), budgets.index(r.tokens_per_param)] = r.delta
    m_of = {(c["size"], c["tokens_per_param"]): c for c in cells or []}
    lim = float(np.nanmax(np.abs(grid))) or 1.0
    im = ax.imshow(grid, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto", origin="lower")
    ax.grid(False)
    for (i, j), v in np.ndenumerate(grid):
        if not np.isfinite(v):
            continue
        text = f"{v:+.3f}"
        c = m_of.get((rungs[i], budgets[j]))
        if c is not None:
            m = c.get("m")
            text += "\nm " + (f"{m:.2f}x" if m is not None else str(c.get("note") or "n/a").split(":")[0])
            x = c.get("d_star_over_d_max")
            if m is not None and x is not None and x > 1:
                text += f" ({x:.1f} D_max)"
        ink = "white" if abs(v) > 0.6 * lim else "black"
        ax.text(j, i, text, ha="center", va="center", fontsize=7.5, color=ink)
    ax.set_xticks(range(len(budgets)), [f"{b:g}" for b in budgets])
    ax.set_yticks(range(len(rungs)), rungs)
    ax.set_xlabel("tokens per parameter")
    title = f"{arm} - {reference} (nats; blue: the arm wins)"
    if cells:
        title += f"\nm: {reference}'s tokens to match, its own law at the rung"
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046)


def _reach_label(reads: dict[str, Any] | None) -> str:
    """How far a frontier curve reads the laws (analysis.laws.frontier's ``reads``): D / N and N past the rungs."""
    if not reads or reads.get("largest_tokens_per_param_read") is None:
        return ""
    lo, hi = reads["smallest_tokens_per_param_read"], reads["largest_tokens_per_param_read"]
    text = f"; D/N read {lo:.2g}-{hi:.0f} (measured {reads['smallest_tokens_per_param_measured']:g}-"
    text += f"{reads['largest_tokens_per_param_measured']:g})"
    if reads.get("N_reach", 1.0) > 1.01:
        text += f", N to {reads['N_reach']:.1f}x past the rungs"
    return text


def _frontier_panel(bx: plt.Axes, fr: dict[str, Any], reference: str, arm: str) -> None:
    C = np.array(fr["C"])
    within = fr.get("within_rungs") or {}
    curves = [("N inside the rungs", within.get("M"), within.get("reads")), ("N free", fr["M"], fr.get("reads"))]
    for (label, curve, reads), ls in zip([c for c in curves if c[1]], ("-", "--")):
        M, lo, hi = (np.array([np.nan if m is None else m for m in curve[k]]) for k in ("M", "ci95_lo", "ci95_hi"))
        line = bx.plot(C, M, marker=".", ls=ls, label=f"M(C), {label}{_reach_label(reads)}")[0]
        bx.fill_between(C, lo, hi, alpha=0.2, color=line.get_color())
    a2 = [r for r in (fr.get("approach2") or {}).get("levels", []) if r.get("M") is not None]
    if a2:
        y = np.array([r["M"] for r in a2])
        err = interval_errors(y, [r.get("M_ci95") for r in a2])
        label = "M(C), approach 2 (isoFLOP)"
        bx.errorbar(np.array([r["C"] for r in a2]), y, yerr=err, fmt="s", color="black", capsize=3, label=label)
    bx.axhline(1.0, color="black", lw=0.8)
    bx.set(xscale="log", xlabel="compute C (PFLOP/s-days), the measured span")
    bx.set_ylabel(f"M(C) = C_{reference} / C_{arm} at equal frontier loss", fontsize=8)
    bx.legend(fontsize=7.5)
    title = "compute-optimal frontier multiplier (approach 3 per arm; 95% bands)"
    if (fr.get("exponents") or {}).get("differ"):
        title += "\nexponents differ between the arms: M changes with C"
    bx.set_title(title, fontsize=9)


@styled
def length_figure(table: pd.DataFrame, stem: Path, arm: str, reference: str) -> list[Path]:
    """Δ against tokens per parameter (log), one line per rung, 95% t intervals as bars (``table``:
    studies.training_length.gain_by_length)."""
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    sizes = list(pd.unique(table["size"]))
    for i, size in enumerate(sizes):
        g = table[table["size"] == size]
        x = g["tokens_per_param"].to_numpy(float) * (1 + 0.03 * (i - (len(sizes) - 1) / 2))  # dodge the bars
        delta_errorbar(ax, x, g["delta"].to_numpy(float), list(g["delta_ci95"]), marker="o", capsize=3, label=str(size))
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set(xscale="log", xlabel="training tokens per parameter", ylabel=f"{arm} - {reference} val loss (nats/token)")
    ax.set_title("same-seed difference per rung (95% t intervals); below 0: the arm wins", fontsize=9)
    ax.legend(title="rung", fontsize=8)
    fig.tight_layout()
    return save(fig, stem)
