"""The block-size study (study kind ``block_size``, paper Fig. 6): Block AttnRes' loss per block size S (sublayers
per block) at one shape, from S = 1 (one sublayer per block: Full AttnRes' maths) to S = 2 L_b (a single block),
against the baseline and Full AttnRes of the same shape, lr protocol and seeds.

* :func:`block_size_sweep` -- the sweep: per S the mean loss over seeds with its 95% t interval, and its same-seed
  differences from the baseline and from Full AttnRes with theirs (analysis.seed_stats). The reference arms and any
  S the sweep skipped because another study had trained it (the ladder's own Block run) are taken from every study
  in the table at the same shape, lr protocol and seeds.
* :func:`block_size_markdown`, :func:`block_size_figure`, :func:`block_size_verdict` -- the table (with the
  paper's Fig. 6 beside it), the figure (ours beside the paper's) and one sentence comparing them.
* :func:`analyse_block_size` -- ``python -m analysis block-size``: all of it written to one directory.

Plain functions on tidy DataFrames (analysis.runs.load_results); no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

from .figures import COLORS, LABELS, save
from .fit_document import BlockSizeSweep
from .paper_data import load_paper
from .runs import keep_most_common, runs_of_kind
from .seed_stats import arm_rows, by_seed, interval_text, loss_summary, paired_delta, same_shape, study_shape, verdict
from .table_format import loss_ci_cell, paper_cell

FULL = "full_attnres"
BASELINE = "baseline"


def _against(arm: pd.Series, reference: pd.Series | None) -> dict[str, Any] | None:
    if reference is None or reference.empty:
        return None
    d = paired_delta(arm, reference)
    return d | {"verdict": verdict(d["delta_ci95"], d["n_pairs"])}


def _reference(pool: pd.DataFrame, study: str, variant: str) -> tuple[pd.Series | None, dict[str, Any] | None]:
    rows = arm_rows(pool, study, variant)
    if rows.empty:
        return None, None
    losses = by_seed(rows, f"reference arm {variant}")
    return losses, loss_summary(losses) | {"size": str(rows["size"].iloc[0])}


def block_size_sweep(df_all: pd.DataFrame, baseline: str = BASELINE, full: str = FULL) -> dict[str, Any] | None:
    """Fig. 6 data for the study of kind ``block_size`` in ``df_all`` (None without one): its swept runs are those
    with a ``block_size`` (the record leaves it empty for other residual schemes); ``baseline`` and ``full`` name
    the reference arms. Fields: docs/analysis.md ("block_size_sweep")."""
    if "study" not in df_all.columns or "block_size" not in df_all.columns:
        return None
    rows = runs_of_kind(df_all, "block_size")
    swept = rows[rows["block_size"].notna()]
    if swept.empty:
        return None
    swept = keep_most_common(swept, "variant", "block-size study sweeps several variants", stacklevel=2)
    size, protocol, seeds = study_shape(swept, "block-size study")
    pool = same_shape(df_all, size, protocol, seeds)
    study = str(swept["study"].iloc[0])
    base_losses, base = _reference(pool, study, baseline)
    full_losses, full_ref = _reference(pool, study, full)
    if full_ref is not None:
        full_ref["vs_baseline"] = _against(full_losses, base_losses)
    variant = str(swept["variant"].iloc[0])
    blocks = pool[(pool["variant"] == variant) & pool["block_size"].notna()]
    points = []
    for S, g in blocks.groupby("block_size", sort=True):
        g = g[g["study"] == study] if (g["study"] == study).any() else g
        losses = by_seed(g, f"{variant} at S = {int(S)}")
        point = {"block_size": int(S)} | loss_summary(losses)
        points.append(point | {"vs_baseline": _against(losses, base_losses), "vs_full": _against(losses, full_losses)})
    first = swept.iloc[0]
    return {
        "size": size,
        "variant": variant,
        "lr_protocol": protocol,
        "n_sublayers": 2 * int(first["n_layers"]) if "n_layers" in swept.columns else None,
        "d_model": int(first["d_model"]) if "d_model" in swept.columns else None,
        "tokens_per_param": _tokens_per_param(swept),
        "points": points,
        "baseline": base,
        "full": full_ref,
    }


def _tokens_per_param(rows: pd.DataFrame) -> float | None:
    if "tokens" not in rows.columns or "params_non_embedding" not in rows.columns:
        return None
    return float((rows["tokens"] / rows["params_non_embedding"]).median())


def paper_sweep() -> BlockSizeSweep:
    """The paper's Fig. 6 (analysis/data/paper.json: one model, no seeds), as a sweep."""
    f6 = load_paper()["fig6"]
    return BlockSizeSweep.from_dict(
        {
            "size": f6["size"],
            "n_sublayers": 32,
            "points": [
                {"block_size": s, "val_loss": loss, "n_runs": 1} for s, loss in zip(f6["block_size"], f6["loss"])
            ],
            "baseline": {"val_loss": f6["baseline"], "n_runs": 1},
        }
    )


# ---- the table, the sentence and the figure -------------------------------------------------------------------


def _delta_cell(vs: dict[str, Any] | None) -> str:
    if not vs or vs.get("delta") is None:
        return "–"
    return f"{vs['delta']:+.4f} {interval_text(vs.get('delta_ci95'))} ({vs['n_pairs']})"


def block_size_markdown(sw: dict[str, Any]) -> list[str]:
    """The block-size section: per S the loss [95% CI], its same-seed differences from the baseline and from Full
    AttnRes [95% CI] (pairs), and the paper's Fig. 6 loss and difference from its baseline; then the references."""
    paper = {p.block_size: p.val_loss for p in paper_sweep().points}
    paper_base = paper_sweep().baseline
    shape = f", {sw['n_sublayers']} sublayers" if sw.get("n_sublayers") else ""
    lines = [
        f"## Block size sweep ({sw.get('variant') or 'Block AttnRes'}, size {sw['size']}{shape})",
        "",
        "Differences are same-seed pairs, arm minus reference (negative: the arm is better), with 95% t intervals.",
        "",
        (
            "| block size S | runs | val loss [95% CI] | Δ vs baseline [95% CI] (pairs) | Δ vs Full [95% CI] (pairs) "
            "| paper loss | paper Δ vs baseline |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    base_paper = paper_base.val_loss if paper_base is not None else None
    for p in sw["points"]:
        S, pl = p["block_size"], paper.get(p["block_size"])
        paper_delta = None if pl is None or base_paper is None else pl - base_paper
        cells = [f"{S}{' (= Full)' if S == 1 else ''}", str(p["n_runs"]), loss_ci_cell(p)]
        cells += [
            _delta_cell(p.get("vs_baseline")),
            _delta_cell(p.get("vs_full")),
            paper_cell(pl),
            paper_cell(paper_delta, "+"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    for key, label, pl in (("full", "Full AttnRes", paper.get(1)), ("baseline", "Baseline", base_paper)):
        if sw.get(key):
            lines.append(f"| {label} | {sw[key]['n_runs']} | {loss_ci_cell(sw[key])} | | | {paper_cell(pl)} | |")
    return [*lines, ""]


def block_size_verdict(sw: dict[str, Any]) -> str:
    """One sentence on where ours agrees with the paper's Fig. 6 and where not, computed from the sweep."""
    pts = sw["points"]
    if not pts:
        return "No block size was trained."
    wins = [p["block_size"] for p in pts if (p.get("vs_baseline") or {}).get("verdict") == "wins"]
    loses = [p["block_size"] for p in pts if (p.get("vs_baseline") or {}).get("verdict") == "loses"]
    best = min(pts, key=lambda p: p["val_loss"])["block_size"]
    largest = max(pts, key=lambda p: p["block_size"])
    vs_full = largest.get("vs_full") or {}
    paper = {p.block_size: p.val_loss for p in paper_sweep().points}
    paper_rise = paper[max(paper)] - paper[1]
    trend = (
        f"the single block (S = {largest['block_size']}) is {vs_full['delta']:+.4f} "
        f"{interval_text(vs_full.get('delta_ci95'))} from Full AttnRes (the paper: {paper_rise:+.3f})"
        if vs_full.get("delta") is not None
        else "there is no Full AttnRes reference"
    )
    resolved = "seen" if vs_full.get("verdict") == "loses" else "not resolved"
    return (
        f"Paper: every S beats the baseline and the loss rises from S = 1 (Full) toward S = {max(paper)}; ours "
        f"({min(p['n_runs'] for p in pts)} seeds per S, {len(pts)} block sizes, each at 95% without a multiplicity "
        f"correction): the lowest mean is at S = {best}, S in {{{_list(wins)}}} beat the baseline, S in "
        f"{{{_list(loses)}}} lose to it and the rest are undecided, and {trend}, so the paper's ordering is "
        f"{resolved} at this precision."
    )


def _list(xs: list[int]) -> str:
    return ", ".join(map(str, xs)) if xs else "none"


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
        if delta:
            _delta_panel(ax, sw, name)
        else:
            _block_size_panel(ax, sw, name)
    fig.tight_layout()
    return save(fig, stem)


def _delta_panel(ax: plt.Axes, sw: BlockSizeSweep, title: str) -> None:
    pts = [p for p in sw.points if p.vs_baseline and p.vs_baseline.get("delta") is not None]
    S = np.array([p.block_size for p in pts], float)
    d = np.array([p.vs_baseline["delta"] for p in pts], float)  # type: ignore[index]
    ci95 = [p.vs_baseline.get("delta_ci95") for p in pts]  # type: ignore[union-attr]
    err = np.array([[v - c[0], c[1] - v] if c else [0.0, 0.0] for v, c in zip(d, ci95)]).T
    ax.errorbar(
        S, d, yerr=err, color=COLORS["block_attnres"], marker="o", ms=5, lw=1.5, capsize=3, label="Block AttnRes"
    )
    ax.axhline(0.0, color=COLORS[BASELINE], ls="--", lw=1.3, label=f"{LABELS[BASELINE]} (0)")
    full = (sw.full.vs_baseline or {}) if sw.full is not None else {}
    if full.get("delta") is not None:
        ax.axhline(full["delta"], color=COLORS[FULL], ls=":", lw=1.3, label=f"{LABELS[FULL]} ({full['delta']:+.3f})")
        if full.get("delta_ci95"):
            ax.axhspan(*full["delta_ci95"], color=COLORS[FULL], alpha=0.12, lw=0)
    _block_size_axes(ax, S, title, "Δ val loss vs baseline (same seeds)")


def _block_size_panel(ax: plt.Axes, sw: BlockSizeSweep, title: str) -> None:
    S = np.array([p.block_size for p in sw.points], float)
    y = np.array([p.val_loss for p in sw.points], float)
    ci95 = [p.val_loss_ci95 for p in sw.points]
    if any(c is not None for c in ci95):
        err = np.array([[v - c[0], c[1] - v] if c else [0.0, 0.0] for v, c in zip(y, ci95)]).T
    else:
        err = None
    ax.errorbar(
        S, y, yerr=err, color=COLORS["block_attnres"], marker="o", ms=5, lw=1.5, capsize=3, label="Block AttnRes"
    )
    span = [y.min(), y.max()]
    for ref, name, style in ((sw.baseline, BASELINE, "--"), (sw.full, FULL, ":")):
        if ref is None or ref.val_loss is None:
            continue
        ax.axhline(ref.val_loss, color=COLORS[name], ls=style, lw=1.3, label=f"{LABELS[name]} ({ref.val_loss:.3f})")
        if ref.val_loss_ci95:
            ax.axhspan(*ref.val_loss_ci95, color=COLORS[name], alpha=0.12, lw=0)
            span += list(ref.val_loss_ci95)
        span.append(ref.val_loss)
    if err is not None:
        span += list(y - err[0]) + list(y + err[1])
    lo, hi = min(span), max(span)
    pad = 0.08 * (hi - lo) if hi > lo else 0.01
    ax.set_ylim(lo - pad, hi + pad)
    _block_size_axes(ax, S, title, "Validation loss")


def _block_size_axes(ax: plt.Axes, S: np.ndarray, title: str, ylabel: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(S)
    ax.set_xticklabels([f"{int(s)}" + ("\n(Full)" if s == 1 else "") for s in S])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(S.min() / 1.4, S.max() * 1.4)
    ax.set_xlabel("Block size S (sublayers per block)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(frameon=True, framealpha=0.9, fontsize=7.5, loc="best")


def analyse_block_size(df: pd.DataFrame, out: Path, baseline: str = BASELINE, full: str = FULL) -> dict[str, Any]:
    """``python -m analysis block-size``: block_size.json, block_size_summary.md and fig6_block_size.png/pdf under
    ``out``; returns the document (with ``files`` and ``verdict``). No block-size study in ``df``: ValueError."""
    from .report import write_json

    sw = block_size_sweep(df, baseline, full)
    if sw is None:
        raise ValueError("no block-size study in these results (study_kind block_size, runs with a block_size)")
    out.mkdir(parents=True, exist_ok=True)
    doc = sw | {"verdict": block_size_verdict(sw)}
    (out / "block_size_summary.md").write_text(
        "\n".join(["# Block size (Fig. 6)", "", *block_size_markdown(sw), doc["verdict"], ""])
    )
    title = f"Ours: {sw['size']} ({sw.get('n_sublayers')} sublayers, d_model {sw.get('d_model')})"
    files = block_size_figure(BlockSizeSweep.from_dict(sw), out / "fig6_block_size", title, paper=paper_sweep())
    doc["files"] = [p.name for p in files] + ["block_size.json", "block_size_summary.md"]
    write_json(doc, out / "block_size.json")
    return doc
