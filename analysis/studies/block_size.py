"""The block-size study (``python -m analysis block_size``, paper Fig. 6): Block AttnRes' loss per block size S at one
shape, from S = 1 (Full AttnRes' maths) to a single block, against the baseline and Full AttnRes
(analysis.laws.fixed_shape.block_size_sweep: same-seed differences, references drawn from other studies at the same
shape, lr protocol and seeds), the table and figure beside the paper's, and one sentence comparing them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ..io.fit_document import BlockSizeSweep
from ..io.paper_data import paper_sweep
from ..laws.fixed_shape import BASELINE, FULL, block_size_sweep
from ..render.figures import block_size_figure
from ..render.tables import block_size_markdown, interval_text
from .study_registry import register_fixed_shape


def block_size_verdict(sw: dict[str, Any]) -> str:
    """One sentence on where ours agrees with the paper's Fig. 6 and where not."""
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


def analyse_block_size(df: pd.DataFrame, out: Path, baseline: str = BASELINE, full: str = FULL) -> dict[str, Any]:
    """block_size.json, block_size_summary.md and fig6_block_size.png/pdf under ``out``; the document."""
    from ..io.report import write_report

    sw = block_size_sweep(df, baseline, full)
    if sw is None:
        raise ValueError("no block-size study in these results (study_kind block_size, runs with a block_size)")
    out.mkdir(parents=True, exist_ok=True)
    doc = sw | {"verdict": block_size_verdict(sw)}
    md = "\n".join(["# Block size (Fig. 6)", "", *block_size_markdown(sw), doc["verdict"], ""])
    title = f"Ours: {sw['size']} ({sw.get('n_sublayers')} sublayers, d_model {sw.get('d_model')})"
    figures = block_size_figure(BlockSizeSweep.from_dict(sw), out / "fig6_block_size", title, paper=paper_sweep())
    return write_report(out, doc, "block_size.json", {"block_size_summary.md": md}, figures)


register_fixed_shape("block_size", analyse_block_size, "block_size_summary.md, block_size.json, fig6_block_size.png")
