"""The block-size study (study kind ``block_size``, paper Fig. 6): Block AttnRes' loss per block size S (sublayers
per block) at one shape, from S = 1 (one sublayer per block: Full AttnRes' maths) to S = 2 L_b (a single block),
against the baseline and Full AttnRes of the same shape, lr protocol and seeds.

* :func:`block_size_sweep` -- the sweep: per S the mean loss over seeds with its 95% t interval, and its same-seed
  differences from the baseline and from Full AttnRes with theirs (analysis.laws.paired). The reference arms and any
  S the sweep skipped because another study had trained it (the ladder's own Block run) are taken from every study
  in the table at the same shape, lr protocol and seeds.
* :func:`block_size_markdown`, :func:`block_size_figure`, :func:`block_size_verdict` -- the table (with the
  paper's Fig. 6 beside it), the figure (ours beside the paper's) and one sentence comparing them.
* :func:`analyse_block_size` -- ``python -m analysis block-size``: all of it written to one directory.

Plain functions on tidy DataFrames (analysis.io.runs.load_results); no torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..io.fit_document import BlockSizeSweep
from ..io.paper_data import paper_sweep
from ..io.runs import keep_most_common, load_one_dataset, runs_of_kind
from ..laws.paired import arm_rows, by_seed, comparison_entry, loss_summary, paired_comparison, same_shape, study_shape
from ..render.figures import block_size_figure
from ..render.tables import block_size_markdown, interval_text
from .study_registry import add_results_out, register

FULL = "full_attnres"
BASELINE = "baseline"


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


# ---- the table, the sentence and the figure -------------------------------------------------------------------


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


def analyse_block_size(df: pd.DataFrame, out: Path, baseline: str = BASELINE, full: str = FULL) -> dict[str, Any]:
    """``python -m analysis block-size``: block_size.json, block_size_summary.md and fig6_block_size.png/pdf under
    ``out``; returns the document (with ``files`` and ``verdict``). No block-size study in ``df``: ValueError."""
    from ..io.report import write_json

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


# ---- python -m analysis <command> -----------------------------------------------------------------------------------


def _arguments(p: argparse.ArgumentParser) -> None:
    add_results_out(p, "the study's results.csv (or a study directory)", "output directory (JSON, Markdown, figure)")
    p.add_argument("--baseline", default="baseline", help="variant name of the baseline arm (default: baseline)")


@register(
    "block_size",
    help="block size (Fig. 6): same-seed differences with 95%% t intervals, beside the paper's",
    arguments=_arguments,
    aliases=("block-size",),
    files="block_size_summary.md, block_size.json, fig6_block_size.png",
    study_kind="block_size",
)
def report(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """``python -m analysis block_size``: the study's JSON, Markdown table and figure, then its verdict."""
    df = load_one_dataset(args.results)
    doc = analyse_block_size(df, Path(args.out), args.baseline)
    print(doc["verdict"])
    print(f"wrote {', '.join(doc['files'])} to {args.out}")
    return doc
