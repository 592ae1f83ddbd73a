"""Does an arm's gain over the reference survive mixture-of-experts MLPs? Per rung (the same shape, tokens, lr and
seeds with only the MLP changed), the same-seed difference ``arm - reference`` with MoE, the same without (dense),
and their difference (the interaction, per seed: delta_moe - delta_dense), each with its t interval.

    python -m analysis moe docs/results/cpu_deep_moe docs/results/cpu_deep --out reports/cpu_deep_moe

(:func:`report`) writes ``moe_vs_dense.csv``, ``moe_vs_dense.md`` and ``fig_moe_vs_dense.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..io.runs import load_results, select_completed
from ..laws.paired import rung_interaction
from ..render.figures import delta_errorbar, save
from ..render.tables import interval_text
from .study_registry import register


@dataclass(frozen=True)
class InteractionOptions:
    arm: str = "block_attnres"
    reference: str = "baseline"
    lr_protocol: str = "baseline"  # both arms at the reference's tuned lr


def interaction_table(
    moe: pd.DataFrame, dense: pd.DataFrame, opts: InteractionOptions = InteractionOptions()
) -> pd.DataFrame:
    """One row per rung (``n_layers`` = L_b) that both tables hold: d_model, the activated N of each arm with MoE and
    dense, ``delta_moe`` / ``delta_dense`` (arm - reference, same seeds, with ``*_ci95`` and verdict) and
    ``interaction`` (delta_moe - delta_dense on the seeds all four runs share). Rungs whose shapes differ
    (d_model) are an error: then the MLP is not the only change (analysis.laws.paired.rung_interaction)."""
    keep = {opts.arm, opts.reference}
    frames = []
    for df in (moe, dense):
        df = df[df["variant"].isin(keep)]
        if "lr_protocol" in df:
            df = df[df["lr_protocol"].fillna("baseline") == opts.lr_protocol]
        frames.append(df)
    return rung_interaction({"moe": frames[0], "dense": frames[1]}, opts.arm, opts.reference)


def interaction_markdown(table: pd.DataFrame, opts: InteractionOptions = InteractionOptions()) -> str:
    head = (
        f"| L_b | d_model | seeds | {opts.reference} loss MoE / dense | "
        f"Δ MoE ({opts.arm} − {opts.reference}) | Δ dense | Δ MoE − Δ dense |\n|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in table.itertuples(index=False):
        lines.append(
            f"| {r.n_layers} | {r.d_model} | {','.join(map(str, r.seeds))} | "
            f"{r.ref_loss_moe:.3f} / {r.ref_loss_dense:.3f} | {r.delta_moe:+.4f} {interval_text(r.delta_moe_ci95)} "
            f"{r.verdict_moe} | {r.delta_dense:+.4f} {interval_text(r.delta_dense_ci95)} {r.verdict_dense} | "
            f"{r.interaction:+.4f} {interval_text(r.interaction_ci95)} |"
        )
    return head + "\n".join(lines) + "\n"


def plot_interaction(table: pd.DataFrame, path: str | Path, opts: InteractionOptions = InteractionOptions()) -> Path:
    """The same-seed difference per rung with its 95% interval, MoE beside dense; 0 = no effect."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    x = np.arange(len(table))
    for offset, kind, color in ((-0.08, "dense", "0.35"), (0.08, "moe", "tab:red")):
        y = table[f"delta_{kind}"].to_numpy(float)
        delta_errorbar(
            ax, x + offset, y, list(table[f"delta_{kind}_ci95"]), fmt="o", color=color, capsize=3, label=f"{kind} MLP"
        )
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_xticks(x, [f"L_b {n}\nd {d}" for n, d in zip(table["n_layers"], table["d_model"])])
    ax.set_ylabel(f"val loss: {opts.arm} − {opts.reference}")
    ax.set_title("same-seed difference per rung, 95% t interval", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, path, (".png",), dpi=140, tight=False)[0]


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("moe", type=Path, help="the MoE study's records (a study directory or results.csv)")
    p.add_argument("dense", type=Path, help="the dense study's records")
    p.add_argument("--out", type=Path, required=True, help="output directory (moe_vs_dense.csv, .md and figure)")
    p.add_argument("--arm", default=InteractionOptions.arm, help="the arm (default: block_attnres)")
    p.add_argument("--reference", default=InteractionOptions.reference, help="its reference (default: baseline)")


@register("moe", help="an arm's gain with MoE MLPs beside the same rungs dense, per rung", arguments=_arguments)
def report(args: argparse.Namespace, argv: Sequence[str]) -> pd.DataFrame:
    """``python -m analysis moe``: moe_vs_dense.csv, moe_vs_dense.md and fig_moe_vs_dense.png under ``--out``;
    returns the table. No rung in both studies: ValueError."""
    opts = InteractionOptions(arm=args.arm, reference=args.reference)
    moe, _ = select_completed(load_results(args.moe))
    dense, _ = select_completed(load_results(args.dense))
    table = interaction_table(moe, dense, opts)
    if table.empty:
        raise ValueError("no rung is in both studies")
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "moe_vs_dense.csv", index=False)
    md = interaction_markdown(table, opts)
    (args.out / "moe_vs_dense.md").write_text(md)
    print(md)
    print(f"-> {plot_interaction(table, args.out / 'fig_moe_vs_dense.png', opts)}")
    return table
