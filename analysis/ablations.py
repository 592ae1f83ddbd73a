"""The ablation study (study kind ``ablations``, paper Table 4): one row per variant at one size, mean loss over
seeds and its difference from the baseline; fit.json's ``ablations`` and its Markdown table."""

from __future__ import annotations

from typing import Any

import pandas as pd

from .runs import mean_sd, reference_loss, runs_of_kind
from .table_format import loss_cell


def ablation_table(df_all: pd.DataFrame, baseline: str = "baseline") -> list[dict[str, Any]] | None:
    """Table 4 data: one row per variant of the study of kind ``ablations`` (mean over seeds), with Δ vs the
    baseline."""
    if "study" not in df_all.columns:
        return None
    rows = runs_of_kind(df_all, "ablations")
    if rows.empty:
        return None
    ref = reference_loss(df_all, rows, baseline)
    order = list(pd.unique(rows["variant"]))
    if baseline in order:
        order.remove(baseline)
        order.insert(0, baseline)
    table = []
    for v in order:
        d = rows[rows["variant"] == v]
        entry = {"variant": v} | mean_sd(d)
        entry["delta_vs_baseline"] = entry["val_loss"] - ref["val_loss"] if ref is not None and v != baseline else None
        table.append(entry)
    if ref is not None and baseline not in order:
        table.insert(
            0,
            {
                "variant": baseline,
                "val_loss": ref["val_loss"],
                "val_loss_sd": ref["val_loss_sd"],
                "n_runs": ref["n_runs"],
                "delta_vs_baseline": None,
                "note": "from another study at the same size",
            },
        )
    return table


def ablation_markdown(table: list[dict[str, Any]]) -> list[str]:
    """The Table 4 rows of an ablation table (:func:`ablation_table`): loss ± sd, Δ vs baseline, runs."""
    out = ["| variant | val loss | Δ vs baseline | runs |", "|---|---|---|---|"]
    for r in table:
        d = "–" if r.get("delta_vs_baseline") is None else f"{r['delta_vs_baseline']:+.4f}"
        out.append(f"| {r['variant']} | {loss_cell(r)} | {d} | {r['n_runs']} |")
    return out
