"""The ablation study (``python -m analysis ablations``, paper Table 4): the AttnRes ablations and peer residual
schemes against the baseline at one shape (analysis.laws.fixed_shape.ablation_table: same-seed differences with t
intervals, references drawn from other studies at the same shape, lr protocol and seeds), the table, a dot plot
beside the paper's and one sentence comparing them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ..laws.fixed_shape import BASELINE, ablation_table
from ..render.figures import ablation_figure
from ..render.tables import ablation_markdown
from .study_registry import register_fixed_shape


def ablation_verdict(table: list[dict[str, Any]]) -> str:
    """One sentence against the paper's Table 4: the arms that beat or lose to the baseline at 95%, and Spearman's
    rank correlation of our Δs with the paper's."""
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
    """ablations.json, table4_ablations.md and fig_table4_ablations.png/pdf under ``out``; the document."""
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


register_fixed_shape("ablations", analyse_ablations, "table4_ablations.md, ablations.json, fig_table4_ablations.png")
