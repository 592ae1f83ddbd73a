"""Does an arm's gain grow, shrink or stay with training length? The same-seed difference arm - reference per
rung at each budget (tokens per parameter), with 95% Student-t intervals (analysis.seed_stats), and its figure.
For any table with several budgets per rung: a multi-budget study's records (``budget``, docs/runs.md "Several
budgets from one run") or independent runs of one rung at several token counts (tokens / params_non_embedding).
``python -m analysis length``.

Plain functions on tidy DataFrames; no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .seed_stats import by_seed, interval_text, paired_delta, verdict


def tokens_per_param(df: pd.DataFrame) -> pd.Series:
    """Each run's budget in tokens per parameter: its ``budget`` where set, else tokens / params_non_embedding
    (rounded to 3 significant digits, so that the runs of one budget share a value)."""
    ratio = pd.to_numeric(df["tokens"], errors="coerce") / pd.to_numeric(df["params_non_embedding"], errors="coerce")
    ratio = ratio.map(lambda x: float(f"{x:.3g}") if np.isfinite(x) else np.nan)
    if "budget" in df.columns:
        budget = pd.to_numeric(df["budget"], errors="coerce")
        return budget.where(budget > 0, ratio)
    return ratio


def gain_by_length(df: pd.DataFrame, arm: str = "block_attnres", reference: str = "baseline") -> pd.DataFrame:
    """One row per (rung, budget) where both arms ran: ``size``, ``n_layers`` (when recorded),
    ``tokens_per_param``, ``ref_loss`` (the reference's mean on the pairs' seeds), ``delta`` (arm - reference,
    negative: the arm wins), ``delta_ci95`` (t interval, None under two pairs), ``n_pairs``, ``pair_seeds``,
    ``verdict`` (analysis.seed_stats.verdict). Completed runs only; several runs of one arm, rung, budget and seed
    are a ValueError (analysis.seed_stats.by_seed)."""
    done = df[df["status"] == "completed"] if "status" in df.columns else df
    done = done.assign(tokens_per_param=tokens_per_param(done))
    rows: list[dict[str, Any]] = []
    for (size, tpp), g in done.groupby(["size", "tokens_per_param"], sort=False):
        a, r = g[g["variant"] == arm], g[g["variant"] == reference]
        if a.empty or r.empty:
            continue
        sa, sr = by_seed(a, f"{arm} {size} at {tpp:g} tokens/param"), by_seed(r, f"{reference} {size} at {tpp:g}")
        d = paired_delta(sa, sr)
        if not d["n_pairs"]:
            continue
        rows.append(
            {
                "size": str(size),
                "n_layers": int(g["n_layers"].iloc[0]) if "n_layers" in g.columns else None,
                "params_non_embedding": float(g["params_non_embedding"].median()),
                "tokens_per_param": float(tpp),
                "ref_loss": float(sr.loc[d["pair_seeds"]].mean()),
                "delta": d["delta"],
                "delta_ci95": d["delta_ci95"],
                "n_pairs": d["n_pairs"],
                "pair_seeds": d["pair_seeds"],
                "verdict": verdict(d["delta_ci95"], d["n_pairs"]),
            }
        )
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    return out.sort_values(["params_non_embedding", "tokens_per_param"], kind="stable").reset_index(drop=True)


def length_markdown(table: pd.DataFrame, arm: str, reference: str) -> list[str]:
    lines = [
        f"## {arm} - {reference} per rung and training length (same-seed pairs, 95% t intervals)",
        "",
        "| rung | tokens / param | reference loss | Δ | 95% interval | pairs | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        lines.append(
            f"| {r.size} | {r.tokens_per_param:g} | {r.ref_loss:.4f} | {r.delta:+.4f} | {interval_text(r.delta_ci95)} "
            f"| {r.n_pairs} | {r.verdict} |"
        )
    return [*lines, ""]


def length_figure(table: pd.DataFrame, stem: Path, arm: str, reference: str) -> list[Path]:
    """Δ against tokens per parameter (log), one line per rung, 95% t intervals as bars."""
    from .figures import plt, save

    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    sizes = list(pd.unique(table["size"]))
    for i, size in enumerate(sizes):
        g = table[table["size"] == size]
        x = g["tokens_per_param"].to_numpy(float) * (1 + 0.03 * (i - (len(sizes) - 1) / 2))  # dodge the bars
        y = g["delta"].to_numpy(float)
        ci = [c if c else [v, v] for c, v in zip(g["delta_ci95"], y)]
        err = np.array([[v - c[0] for c, v in zip(ci, y)], [c[1] - v for c, v in zip(ci, y)]])
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=str(size))
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens per parameter")
    ax.set_ylabel(f"{arm} - {reference} val loss (nats/token)")
    ax.set_title("same-seed difference per rung (95% t intervals); below 0: the arm wins", fontsize=9)
    ax.legend(title="rung", fontsize=8)
    fig.tight_layout()
    return save(fig, stem)


def analyse_length(
    df: pd.DataFrame, out: Path, arm: str = "block_attnres", reference: str = "baseline", make_figures: bool = True
) -> dict[str, Any]:
    """``python -m analysis length``: length.json, length_summary.md and fig_length.png under ``out``."""
    from .report import write_json

    out.mkdir(parents=True, exist_ok=True)
    table = gain_by_length(df, arm, reference)
    if table.empty:
        raise ValueError(f"no rung and budget where both {arm!r} and {reference!r} completed a run of one seed")
    files = ["length.json", "length_summary.md"]
    if make_figures:
        files += [str(p.relative_to(out)) for p in length_figure(table, out / "fig_length", arm, reference)]
    doc = {"arm": arm, "reference": reference, "rows": table.to_dict("records"), "files": sorted(files)}
    write_json(doc, out / "length.json")
    (out / "length_summary.md").write_text("\n".join(length_markdown(table, arm, reference)))
    return doc
