"""The ablation study (study kind ``ablations``, paper Table 4): the paper's AttnRes ablations and the peer residual
schemes against the baseline at one shape, every arm at the same lr protocol and seeds.

* :func:`ablation_table` (analysis.laws.fixed_shape) -- one row per arm: the mean loss over seeds with its 95% t
  interval, its same-seed difference from the baseline with its interval (analysis.laws.paired) and the paper's loss
  and difference beside it; rows in the paper's Table 4 order, with the arms the paper does not report after its
  peers. The baseline and any arm the study skipped because another study had trained it (the ladder's Full and Block
  runs) are taken from every study in the table at the same shape, lr protocol and seeds.
* :func:`ablation_markdown`, :func:`ablation_figure`, :func:`ablation_verdict` -- the table, a dot plot of the
  differences (ours beside the paper's) and one sentence comparing them.
* :func:`analyse_ablations` -- ``python -m analysis ablations``: all of it written to one directory.

Plain functions on tidy DataFrames (analysis.io.runs.load_results); no torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..io.runs import load_one_dataset
from ..laws.fixed_shape import BASELINE, ablation_table
from ..render.figures import ablation_figure
from ..render.tables import ablation_markdown
from .study_registry import fixed_shape_arguments, register


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


def analyse_ablations(df: pd.DataFrame, out: Path, baseline: str = BASELINE) -> dict[str, Any]:
    """``python -m analysis ablations``: ablations.json, table4_ablations.md and fig_table4_ablations.png/pdf under
    ``out``; returns the document (rows, ``verdict``, ``files``). No ablation study in ``df``: ValueError."""
    from ..io.report import write_report

    table = ablation_table(df, baseline)
    if not table:
        raise ValueError("no ablation study in these results (study_kind ablations)")
    out.mkdir(parents=True, exist_ok=True)
    first = df[df["size"] == table[0]["size"]].iloc[0]
    shape = f"{table[0]['size']}: L_b {int(first['n_layers'])}, d_model {int(first['d_model'])}"
    doc: dict[str, Any] = {"size": table[0]["size"], "rows": table, "verdict": ablation_verdict(table)}
    md = ["# Ablations and peers (Table 4)", "", f"Shape {shape}; Δ: same-seed pairs, arm minus baseline.", ""]
    md += [*ablation_markdown(table), "", doc["verdict"], ""]
    figures = ablation_figure(table, out / "fig_table4_ablations", f"Ablations and peers, ours at {shape}")
    return write_report(out, doc, "ablations.json", {"table4_ablations.md": "\n".join(md)}, figures)


# ---- python -m analysis <command> -----------------------------------------------------------------------------------


@register(
    "ablations",
    help="ablations and peers (Table 4): same-seed differences with 95%% t intervals, beside the paper's",
    arguments=fixed_shape_arguments,
    files="table4_ablations.md, ablations.json, fig_table4_ablations.png",
    study_kind="ablations",
    printed=lambda doc: [doc["verdict"]],
)
def report(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """``python -m analysis ablations``: the study's JSON, Markdown table and figure; the document."""
    return analyse_ablations(load_one_dataset(args.results), Path(args.out), args.baseline)
