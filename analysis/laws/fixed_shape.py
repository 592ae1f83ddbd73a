"""The numbers of the two fixed-shape studies, every arm at one shape, lr protocol and seed set (same-seed
differences with 95% t intervals, analysis.laws.paired; reference arms, and arms a study skipped, taken from any
study in the table at that shape): :func:`ablation_table` (paper Table 4) and :func:`block_size_sweep` (paper
Fig. 6). Numbers only.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..io.paper_data import load_paper
from ..io.runs import keep_most_common, runs_of_kind
from .paired import arm_rows, by_seed, comparison_entry, loss_summary, paired_comparison, same_shape, study_shape

BASELINE = "baseline"
FULL = "full_attnres"
# Peer residual schemes the paper's Table 4 does not report; their rows follow the paper's peers (DenseFormer, mHC).
UNREPORTED_PEERS = ("hyper_static", "hyper_dynamic", "laurel")


def paper_rows() -> list[dict[str, Any]]:
    """The paper's Table 4 (analysis/data/paper.json): variant, label, loss, in the paper's order."""
    rows: list[dict[str, Any]] = load_paper()["table4"]["rows"]
    return rows


def row_order(variants: list[str]) -> list[str]:
    """``variants`` in the paper's Table 4 order, UNREPORTED_PEERS after its peers, any other arm last."""
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
    variants = row_order([v for v in pd.unique(pool["variant"]) if v in wanted])
    runs = {v: arm_rows(pool, study, v) for v in variants}
    vs = paired_comparison(pd.concat(runs.values()), baseline, [v for v in variants if v != baseline])
    vs = vs.set_index("arm") if not vs.empty else vs
    table = []
    for v, g in runs.items():
        entry: dict[str, Any] = {"variant": v, "label": paper.get(v, {}).get("label", v), "size": size}
        entry |= loss_summary(by_seed(g, f"{v} at {size}"))
        entry |= _vs_baseline(vs.loc[v]) if v in vs.index else {"delta_vs_baseline": None}
        entry |= _paper_cells(paper, v, baseline)
        others = sorted(set(g["study"]) - {study})
        if others:
            entry["note"] = f"runs of study {', '.join(others)} (same shape, lr and seeds)"
        table.append(entry)
    return table


def _vs_baseline(r: pd.Series) -> dict[str, Any]:
    """A row of the paired comparison in the ablation table's fields."""
    return {
        "delta_vs_baseline": None if pd.isna(r["delta"]) else float(r["delta"]),
        "delta_ci95": r["delta_ci95"],
        "n_pairs": int(r["n_pairs"]),
        "verdict": r["verdict"],
    }


def _paper_cells(paper: dict[str, dict[str, Any]], variant: str, baseline: str) -> dict[str, Any]:
    row, base = paper.get(variant), paper.get(baseline)
    if row is None:
        return {"paper_loss": None, "paper_delta": None}
    delta = None if base is None or variant == baseline else row["loss"] - base["loss"]
    return {"paper_loss": row["loss"], "paper_delta": delta}


def _reference(pool: pd.DataFrame, study: str, variant: str) -> tuple[pd.DataFrame, dict[str, Any] | None]:
    rows = arm_rows(pool, study, variant)
    if rows.empty:
        return rows, None
    return rows, loss_summary(by_seed(rows, f"reference arm {variant}")) | {"size": str(rows["size"].iloc[0])}


def _against(table: pd.DataFrame, arm: str) -> dict[str, Any] | None:
    """The arm's row of a paired comparison (None: the reference did not run)."""
    rows = table[table["arm"] == arm] if not table.empty else table
    return comparison_entry(rows.iloc[0]) if not rows.empty else None


def block_size_sweep(df_all: pd.DataFrame, baseline: str = BASELINE, full: str = FULL) -> dict[str, Any] | None:
    """Fig. 6 data for the study of kind ``block_size`` in ``df_all`` (None without one): its runs with a
    ``block_size`` against the reference arms ``baseline`` and ``full``. Fields: docs/analysis.md."""
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
    base_rows, base = _reference(pool, study, baseline)
    full_rows, full_ref = _reference(pool, study, full)
    variant = str(swept["variant"].iloc[0])
    blocks = pool[(pool["variant"] == variant) & pool["block_size"].notna()]
    sweep = {}  # "S=<S>" -> the runs of block size S: the study's own where it has them
    for S, g in blocks.groupby("block_size", sort=True):
        sweep[f"S={int(S)}"] = g[g["study"] == study] if (g["study"] == study).any() else g
    runs = pd.concat(
        [base_rows.assign(arm=baseline), full_rows.assign(arm=full)] + [g.assign(arm=a) for a, g in sweep.items()]
    )
    vs_base = paired_comparison(runs, baseline, [full, *sweep], arm_column="arm")
    vs_full = paired_comparison(runs, full, list(sweep), arm_column="arm")
    if full_ref is not None:
        full_ref["vs_baseline"] = _against(vs_base, full)
    points = []
    for a, g in sweep.items():
        point = {"block_size": int(a[2:])} | loss_summary(by_seed(g, f"{variant} at S = {a[2:]}"))
        points.append(point | {"vs_baseline": _against(vs_base, a), "vs_full": _against(vs_full, a)})
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
