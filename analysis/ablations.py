"""The ablation study (study kind ``ablations``, paper Table 4): the paper's AttnRes ablations and the peer residual
schemes against the baseline at one shape, every arm at the same lr protocol and seeds.

* :func:`ablation_table` -- one row per arm: the mean loss over seeds with its 95% t interval, its same-seed
  difference from the baseline with its interval (analysis.seed_stats) and the paper's loss and difference beside
  it; rows in the paper's Table 4 order, with the arms the paper does not report after its peers. The baseline and
  any arm the study skipped because another study had trained it (the ladder's Full and Block runs) are taken from
  every study in the table at the same shape, lr protocol and seeds.
* :func:`ablation_markdown`, :func:`ablation_figure`, :func:`ablation_verdict` -- the table, a dot plot of the
  differences (ours beside the paper's) and one sentence comparing them.
* :func:`analyse_ablations` -- ``python -m analysis ablations``: all of it written to one directory.

Plain functions on tidy DataFrames (analysis.runs.load_results); no torch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .figures import COLORS, save
from .paper_data import load_paper
from .runs import runs_of_kind
from .seed_stats import arm_rows, by_seed, interval_text, loss_summary, paired_delta, same_shape, study_shape, verdict
from .table_format import loss_ci_cell, paper_cell

BASELINE = "baseline"
# Peer residual schemes the paper's Table 4 does not report; their rows follow the paper's peers (DenseFormer, mHC).
UNREPORTED_PEERS = ("hyper_static", "hyper_dynamic", "laurel")


def paper_rows() -> list[dict[str, Any]]:
    """The paper's Table 4 (analysis/data/paper.json): variant, label, loss, in the paper's order."""
    rows: list[dict[str, Any]] = load_paper()["table4"]["rows"]
    return rows


def row_order(variants: list[str]) -> list[str]:
    """``variants`` in the paper's Table 4 order: the baseline, the paper's peers, the peers it does not report,
    Full AttnRes and its ablations, Block AttnRes and its ablations; any other arm last, in the given order."""
    paper = [r["variant"] for r in paper_rows()]
    last_peer = paper.index("full_attnres")
    order = paper[:last_peer] + list(UNREPORTED_PEERS) + paper[last_peer:]
    known = [v for v in order if v in variants]
    return known + [v for v in variants if v not in known]


def ablation_table(df_all: pd.DataFrame, baseline: str = BASELINE) -> list[dict[str, Any]] | None:
    """Table 4 data for the study of kind ``ablations`` in ``df_all`` (None without one). Fields: docs/analysis.md
    ("ablations")."""
    if "study" not in df_all.columns:
        return None
    rows = runs_of_kind(df_all, "ablations")
    if rows.empty:
        return None
    size, protocol, seeds = study_shape(rows, "ablation study")
    pool = same_shape(df_all, size, protocol, seeds)
    study = str(rows["study"].iloc[0])
    paper = {r["variant"]: r for r in paper_rows()}
    wanted = set(rows["variant"]) | {baseline} | (set(paper) & set(pool["variant"]))
    base_rows = arm_rows(pool, study, baseline)
    base = by_seed(base_rows, f"{baseline} at {size}") if not base_rows.empty else None
    table = []
    for v in row_order([v for v in pd.unique(pool["variant"]) if v in wanted]):
        g = arm_rows(pool, study, v)
        losses = by_seed(g, f"{v} at {size}")
        entry: dict[str, Any] = {"variant": v, "label": paper.get(v, {}).get("label", v), "size": size}
        entry |= loss_summary(losses)
        entry |= _vs_baseline(losses, base) if v != baseline else {"delta_vs_baseline": None}
        entry |= _paper_cells(paper, v, baseline)
        others = sorted(set(g["study"]) - {study})
        if others:
            entry["note"] = f"runs of study {', '.join(others)} (same shape, lr and seeds)"
        table.append(entry)
    return table


def _vs_baseline(losses: pd.Series, base: pd.Series | None) -> dict[str, Any]:
    if base is None:
        return {"delta_vs_baseline": None}
    d = paired_delta(losses, base)
    return {
        "delta_vs_baseline": d["delta"],
        "delta_ci95": d["delta_ci95"],
        "n_pairs": d["n_pairs"],
        "verdict": verdict(d["delta_ci95"], d["n_pairs"]),
    }


def _paper_cells(paper: dict[str, dict[str, Any]], variant: str, baseline: str) -> dict[str, Any]:
    row, base = paper.get(variant), paper.get(baseline)
    if row is None:
        return {"paper_loss": None, "paper_delta": None}
    delta = None if base is None or variant == baseline else row["loss"] - base["loss"]
    return {"paper_loss": row["loss"], "paper_delta": delta}


def ablation_markdown(table: list[dict[str, Any]]) -> list[str]:
    """The Table 4 rows (:func:`ablation_table`, or the paper's own rows): loss [95% CI], Δ vs the baseline [95% CI]
    on same-seed pairs, and the paper's loss and Δ where the rows carry them."""
    with_paper = any("paper_loss" in r for r in table)
    head = "| variant | runs | val loss [95% CI] | Δ vs baseline [95% CI] (pairs) | verdict |"
    out = [
        head + (" paper loss | paper Δ |" if with_paper else ""),
        "|---|---|---|---|---|" + ("---|---|" if with_paper else ""),
    ]
    for r in table:
        loss = loss_ci_cell(r)
        d = r.get("delta_vs_baseline")
        delta = (
            "–"
            if d is None
            else f"{d:+.4f}" + (f" {interval_text(r.get('delta_ci95'))} ({r['n_pairs']})" if "n_pairs" in r else "")
        )
        cells = [str(r.get("label", r["variant"])), str(r["n_runs"]), loss, delta, r.get("verdict", "–")]
        if with_paper:
            cells += [paper_cell(r.get("paper_loss")), paper_cell(r.get("paper_delta"), "+")]
        out.append("| " + " | ".join(cells) + " |")
    return out


def ablation_verdict(table: list[dict[str, Any]]) -> str:
    """One sentence on where ours agrees with the paper's Table 4 and where not: which arms beat or lose to the
    baseline at 95%, and whether the arms' order agrees with the paper's (Spearman's rank correlation of the Δs
    over the arms both report)."""
    from scipy import stats

    arms = [r for r in table if r.get("delta_vs_baseline") is not None]
    if not arms:
        return "No arm has a same-seed difference from the baseline."
    wins = [r["variant"] for r in arms if r.get("verdict") == "wins"]
    loses = [r["variant"] for r in arms if r.get("verdict") == "loses"]
    both = [r for r in arms if r.get("paper_delta") is not None]
    rank = ""
    if len(both) >= 3:
        rho = stats.spearmanr([r["paper_delta"] for r in both], [r["delta_vs_baseline"] for r in both]).statistic
        rank = f"; over the {len(both)} arms both report, the rank correlation of our Δ with the paper's is {rho:+.2f}"
    gains = sorted(-r["paper_delta"] for r in both if r["paper_delta"] < 0)
    paper_text = f"{len(gains)} of its {len(both)} arms beat the baseline" + (
        f" (by {gains[0]:.3f}-{gains[-1]:.3f})" if gains else ""
    )
    seeds = min(r["n_runs"] for r in arms)
    return (
        f"Paper: {paper_text}; ours ({seeds} seeds, {len(arms)} arms, each at 95% without a multiplicity "
        f"correction): {len(wins)} beat it ({', '.join(wins) or 'none'}), {len(loses)} lose to it "
        f"({', '.join(loses) or 'none'}) and {len(arms) - len(wins) - len(loses)} are undecided{rank}."
    )


def ablation_figure(table: list[dict[str, Any]], stem: Path, title: str | None = None) -> list[Path]:
    """Table 4 as a dot plot: each arm's same-seed Δ vs the baseline with its 95% interval (ours) and the paper's Δ
    (hollow diamonds), arms top to bottom in the table's order; zero = the baseline."""
    arms = [r for r in table if r.get("delta_vs_baseline") is not None]
    y = np.arange(len(arms))[::-1]
    fig, ax = plt.subplots(figsize=(6.4, 0.32 * len(arms) + 1.4))
    d = np.array([r["delta_vs_baseline"] for r in arms], float)
    ci95 = [r.get("delta_ci95") for r in arms]
    err = np.array([[v - c[0], c[1] - v] if c else [0.0, 0.0] for v, c in zip(d, ci95)]).T
    ax.errorbar(d, y, xerr=err, fmt="o", color=COLORS["block_attnres"], ms=4.5, capsize=2.5, lw=1.2, label="ours")
    paper = [(yy, r["paper_delta"]) for yy, r in zip(y, arms) if r.get("paper_delta") is not None]
    if paper:
        ax.scatter(
            [p for _, p in paper],
            [yy for yy, _ in paper],
            marker="D",
            facecolors="none",
            edgecolors=COLORS["full_attnres"],
            s=28,
            label="paper (436M)",
            zorder=3,
        )
    ax.axvline(0.0, color=COLORS[BASELINE], ls="--", lw=1.1)
    _clip_outliers(ax, d, y, [p for _, p in paper])
    ax.set_yticks(y)
    ax.set_yticklabels([r.get("label", r["variant"]) for r in arms], fontsize=8)
    ax.set_xlabel("Δ val loss vs baseline (negative: better); ours: same-seed pairs, 95% t interval")
    ax.set_title(title or "Ablations and peers (Table 4)")
    ax.legend(frameon=True, framealpha=0.9, fontsize=7.5, loc="best")
    fig.tight_layout()
    return save(fig, stem)


OFF_SCALE = 0.25  # |Δ| above this (an arm that failed to train) is drawn at the axis edge with its value


def _clip_outliers(ax: plt.Axes, d: np.ndarray, y: np.ndarray, paper: list[float]) -> None:
    """Keep the axis on the arms that trained: a difference beyond OFF_SCALE is marked at the edge, with its value
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
            ax.annotate(
                f"{v:+.2f}",
                (edge, yy),
                textcoords="offset points",
                xytext=(-8 if v > 0 else 8, 6),
                ha="right" if v > 0 else "left",
                fontsize=7.5,
            )


def analyse_ablations(df: pd.DataFrame, out: Path, baseline: str = BASELINE) -> dict[str, Any]:
    """``python -m analysis ablations``: ablations.json, table4_ablations.md and fig_table4_ablations.png/pdf under
    ``out``; returns the document (rows, ``verdict``, ``files``). No ablation study in ``df``: ValueError."""
    from .report import write_json

    table = ablation_table(df, baseline)
    if not table:
        raise ValueError("no ablation study in these results (study_kind ablations)")
    out.mkdir(parents=True, exist_ok=True)
    first = df[df["size"] == table[0]["size"]].iloc[0]
    shape = f"{table[0]['size']}: L_b {int(first['n_layers'])}, d_model {int(first['d_model'])}"
    doc: dict[str, Any] = {"size": table[0]["size"], "rows": table, "verdict": ablation_verdict(table)}
    md = ["# Ablations and peers (Table 4)", "", f"Shape {shape}; Δ: same-seed pairs, arm minus baseline.", ""]
    (out / "table4_ablations.md").write_text("\n".join([*md, *ablation_markdown(table), "", doc["verdict"], ""]))
    files = ablation_figure(table, out / "fig_table4_ablations", f"Ablations and peers, ours at {shape}")
    doc["files"] = [p.name for p in files] + ["ablations.json", "table4_ablations.md"]
    write_json(doc, out / "ablations.json")
    return doc
