"""The block-size study (study kind ``block_size``, paper Fig. 6): Block AttnRes' loss per block size S at one model
size, against the baseline and Full AttnRes; fit.json's ``block_size_sweep``, its summary.md section (the figure:
analysis.figures.block_size_figure)."""

from __future__ import annotations

import warnings
from typing import Any

import pandas as pd

from .runs import AnalysisWarning, keep_most_common, mean_sd, reference_loss, runs_of_kind
from .table_format import loss_cell


def block_size_sweep(
    df_all: pd.DataFrame, baseline: str = "baseline", full: str = "full_attnres"
) -> dict[str, Any] | None:
    """Fig. 6 data: Block AttnRes loss per block size S at one model size (the study of kind ``block_size``).

    The swept runs are those with a ``block_size`` (the record leaves it empty for every other residual scheme);
    ``baseline`` and ``full`` name the reference arms."""
    if "study" not in df_all.columns or "block_size" not in df_all.columns:
        return None
    rows = runs_of_kind(df_all, "block_size")
    blocks = rows[rows["block_size"].notna()]
    if blocks.empty:
        return None
    blocks = keep_most_common(blocks, "variant", "block-size study sweeps several variants", stacklevel=2)
    sizes = sorted(set(blocks["size"]))
    if len(sizes) > 1:
        warnings.warn(
            f"block-size study spans several sizes ({', '.join(sizes)}); using the most common",
            AnalysisWarning,
            stacklevel=2,
        )
        blocks = blocks[blocks["size"] == blocks["size"].mode().iloc[0]]
    points = [{"block_size": int(S)} | mean_sd(g) for S, g in blocks.groupby("block_size", sort=True)]
    return {
        "size": str(blocks["size"].iloc[0]),
        "points": points,
        "baseline": reference_loss(df_all, rows, baseline),
        "full": reference_loss(df_all, rows, full),
    }


def block_size_markdown(sw: dict[str, Any]) -> list[str]:
    """summary.md's block-size section: loss per block size S (S = 1 is Full AttnRes), then the reference arms."""
    lines = [
        f"## Block size sweep (Block AttnRes, size {sw['size']})",
        "",
        "| block size S | val loss |",
        "|---|---|",
    ]
    lines += [
        f"| {p['block_size']}{' (Full)' if p['block_size'] == 1 else ''} | {loss_cell(p)} |" for p in sw["points"]
    ]
    for key, label in (("full", "Full AttnRes"), ("baseline", "Baseline")):
        if sw.get(key):
            lines.append(f"| {label} | {loss_cell(sw[key])} |")
    lines.append("")
    return lines
