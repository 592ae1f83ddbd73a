"""A condition study (``python -m analysis paired``): per cell (e.g. ``n_layers, d_model``) and per value of a
condition column (MoE vs dense, one optimizer against another, the study a run belongs to), the same-seed
difference arm - reference with its t interval; between the first value and each other, the difference of
differences (the interaction); per value, whether the effect is the same in every cell. Every number comes from
analysis.laws.paired. A new condition study needs no module, only its axes::

    python -m analysis paired --results docs/results/cpu_deep_moe docs/results/cpu_deep \\
        --cells n_layers,d_model --condition study --out reports/cpu_deep_moe
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..io.report import write_report
from ..io.runs import AnalysisWarning, load_results, select_completed
from ..laws.bootstrap import CI_LEVEL
from ..laws.paired import cell_heterogeneity, paired_comparison, verdict
from ..render.figures import delta_errorbar, save
from ..render.tables import interval_text
from .study_registry import number, options_from, register

FILES = ("paired.csv", "paired.json", "paired.md", "fig_paired.png")


@dataclass(frozen=True)
class PairedOptions:
    """The axes of a condition study: ``arms`` (empty: every other variant), ``condition`` (None: one condition) and
    the lr protocol the runs must share (None: any)."""

    reference: str = "baseline"
    arms: tuple[str, ...] = ()
    cells: tuple[str, ...] = ("n_layers", "d_model")
    condition: str | None = None
    lr_protocol: str | None = "baseline"
    level: float = CI_LEVEL


def condition_runs(frames: Sequence[pd.DataFrame], opts: PairedOptions) -> pd.DataFrame:
    """The record sets ``frames`` as one table at ``opts.lr_protocol``; a missing axis column is a ValueError."""
    runs = pd.concat(frames, ignore_index=True)
    for column in (*opts.cells, *([opts.condition] if opts.condition else [])):
        if column not in runs.columns:
            raise ValueError(
                f"column {column!r} (--cells / --condition) is not in the records; they have: "
                f"{', '.join(sorted(map(str, runs.columns)))}"
            )
    if opts.lr_protocol is not None and "lr_protocol" in runs.columns:
        runs = runs[runs["lr_protocol"].fillna("baseline") == opts.lr_protocol]
    return runs.reset_index(drop=True)


def analyse_paired(runs: pd.DataFrame, opts: PairedOptions = PairedOptions()) -> dict[str, Any]:
    """The condition study of completed ``runs``: ``levels`` (ascending when numeric, else in order of appearance),
    ``arms`` (default: every variant but the reference that ran under every level), ``effects`` (per level),
    ``interactions`` (the first level against each other) and ``heterogeneity``. No cell with a pair: ValueError."""
    levels: list[Any] = [None]
    if opts.condition:
        levels = list(pd.unique(runs[opts.condition]))
        if pd.api.types.is_numeric_dtype(runs[opts.condition]):
            levels = sorted(levels)
    at = {lv: runs if lv is None else runs[runs[opts.condition] == lv] for lv in levels}
    at_every = set.intersection(*(set(part["variant"]) for part in at.values()))
    arms = list(opts.arms) or sorted(at_every - {opts.reference})
    effects = [
        paired_comparison(part, opts.reference, arms, opts.cells, level=opts.level).assign(condition=lv)
        for lv, part in at.items()
    ]
    effects = [e for e in effects if not e.empty]
    effects_table = pd.concat(effects, ignore_index=True) if effects else pd.DataFrame()
    if effects_table.empty:
        raise ValueError(f"no cell holds both {opts.reference} and one of {', '.join(arms) or '(no arm)'} on one seed")
    interactions = []
    for other in levels[1:]:
        pair = pd.concat([at[levels[0]], at[other]])  # in this order: paired_comparison's first and second
        _warn_unmatched(pair, opts, levels[0], other)
        table = paired_comparison(pair, opts.reference, arms, opts.cells, opts.condition, level=opts.level)
        if not table.empty:
            interactions.append(table.assign(first=levels[0], second=other))
    heterogeneity = [
        {"condition": lv, "arm": arm} | cell_heterogeneity(part, opts.reference, arm, opts.cells)
        for lv, part in at.items()
        for arm in arms
    ]
    return {
        "reference": opts.reference,
        "arms": arms,
        "cells": list(opts.cells),
        "condition": opts.condition,
        "levels": levels,
        "lr_protocol": opts.lr_protocol,
        "effects": effects_table,
        "interactions": pd.concat(interactions, ignore_index=True) if interactions else pd.DataFrame(),
        "heterogeneity": heterogeneity,
    }


def _warn_unmatched(pair: pd.DataFrame, opts: PairedOptions, first: Any, second: Any) -> None:
    cells = {
        lv: set(map(tuple, g[list(opts.cells)].drop_duplicates().to_numpy()))
        for lv, g in pair.groupby(opts.condition, sort=False)
    }
    lonely = sorted(cells.get(first, set()) ^ cells.get(second, set()), key=str)
    if lonely:
        names = "; ".join(" ".join(f"{c}={v}" for c, v in zip(opts.cells, cell)) for cell in lonely)
        warnings.warn(f"cells under only one of {first} / {second} (no interaction): {names}", AnalysisWarning, 3)


def _plain(x: Any) -> Any:
    return int(x) if isinstance(x, (float, np.floating)) and float(x).is_integer() else x


def paired_markdown(doc: dict[str, Any]) -> str:
    """paired.md: per arm, the interaction tables, each condition value's own table, the heterogeneity tests."""
    ref, cells = doc["reference"], doc["cells"]
    lines = [f"# Same-seed differences, arm − {ref}, per cell ({', '.join(cells)}), 95% t intervals", ""]
    for arm in doc["arms"]:
        if doc["condition"] is not None:
            lines += _interaction_table(doc, arm)
        for lv in doc["levels"]:
            under = "" if lv is None else f" under {lv} alone (every seed it holds)"
            rows = doc["effects"][_is(doc["effects"]["condition"], lv)]
            lines += _effect_table(rows, arm, f"{ref}{under}", cells)
        for h in (h for h in doc["heterogeneity"] if h["arm"] == arm):
            under = "" if h["condition"] is None else f" under {h['condition']}"
            p = "n/a (fewer than two cells with two pairs)" if h["p"] is None else f"{h['p']:.3g}"
            lines.append(f"- {arm}{under}: one effect in every cell? Alexander-Govern p = {p} ({h['n_cells']} cells)")
        lines.append("")
    return "\n".join(lines)


def _cell_rows(title: str, cells: Sequence[str], columns: list[str], part: pd.DataFrame, say: Any) -> list[str]:
    """A Markdown table under ``title``: per row of ``part`` its cells, seeds, then ``say(row)``'s columns."""
    lines = [
        title,
        "",
        f"| {' | '.join([*cells, 'seeds', *columns])} |",
        "|" + "---|" * (len(cells) + 1 + len(columns)),
    ]
    for _, r in part.iterrows():
        keys = [*(str(_plain(r[c])) for c in cells), ",".join(map(str, r["seeds"]))]
        lines.append(f"| {' | '.join([*keys, *say(r)])} |")
    return [*lines, ""]


def _effect_table(effects: pd.DataFrame, arm: str, title: str, cells: Sequence[str]) -> list[str]:
    def say(r: pd.Series) -> list[str]:
        return [f"{r['ref_loss']:.3f}", f"{r['delta']:+.4f}", interval_text(r["delta_ci95"]), f"{r['verdict']}"]

    columns = ["reference loss", "Δ", "95% interval", "verdict"]
    return _cell_rows(f"## {arm} − {title}", cells, columns, effects[effects["arm"] == arm], say)


def _interaction_table(doc: dict[str, Any], arm: str) -> list[str]:
    ref, cells, table = doc["reference"], doc["cells"], doc["interactions"]
    lines = []
    for (first, second), part in table[table["arm"] == arm].groupby(["first", "second"], sort=False):

        def say(r: pd.Series, levels: tuple[Any, Any] = (first, second)) -> list[str]:
            out = [" / ".join(f"{r[f'ref_loss_{c}']:.3f}" for c in levels)]
            out += [f"{r[f'delta_{c}']:+.4f} {interval_text(r[f'delta_{c}_ci95'])} {r[f'verdict_{c}']}" for c in levels]
            return [*out, f"{r['interaction']:+.4f} {interval_text(r['interaction_ci95'])}"]

        columns = [f"{ref} loss {first} / {second}", f"Δ {first}", f"Δ {second}", f"Δ {first} − Δ {second}"]
        title = f"## {arm} − {ref}: {first} against {second} ({doc['condition']})"
        lines += _cell_rows(title, cells, columns, part, say)
    return lines


def headline_lines(doc: dict[str, Any]) -> list[str]:
    """Per arm and condition value the cells won and lost; per condition pair the interactions that exclude 0."""
    lines = []
    effects = doc["effects"]
    for arm in doc["arms"]:
        for lv in doc["levels"]:
            rows = effects[(effects["arm"] == arm) & _is(effects["condition"], lv)]
            counts = rows["verdict"].value_counts()
            under = "" if lv is None else f" under {lv}"
            lines.append(
                f"{arm} − {doc['reference']}{under}: wins {counts.get('wins', 0)}, loses {counts.get('loses', 0)}, "
                f"undecided {counts.get('undecided', 0)} of {len(rows)} cells; Δ from "
                f"{number(rows['delta'].min(), '+.4f')} to {number(rows['delta'].max(), '+.4f')}"
            )
        inter = doc["interactions"]
        for (first, second), part in (
            inter[inter["arm"] == arm].groupby(["first", "second"], sort=False) if not inter.empty else []
        ):
            signs = [verdict(ci, n) for ci, n in zip(part["interaction_ci95"], part["n_pairs"])]
            lines.append(
                f"{arm}: Δ {first} − Δ {second} below 0 in {signs.count('wins')}, above 0 in {signs.count('loses')} "
                f"of {len(part)} cells (95% t intervals)"
            )
    return lines


def _is(column: pd.Series, value: Any) -> pd.Series:
    return column.isna() if value is None else column == value


def _plotted(doc: dict[str, Any]) -> tuple[pd.DataFrame, str]:
    """The Δs the figure draws and its title: with two condition values on the seeds both hold, else each value's."""
    inter = doc["interactions"]
    if len(doc["levels"]) != 2 or inter.empty:
        return doc["effects"], "same-seed difference per cell, 95% t interval"
    parts = [
        inter[[*doc["cells"], "arm"]].assign(
            condition=lv, delta=inter[f"delta_{lv}"], delta_ci95=inter[f"delta_{lv}_ci95"]
        )
        for lv in doc["levels"]
    ]
    return pd.concat(parts, ignore_index=True), "same-seed difference per cell on the seeds both hold, 95% t interval"


def plot_paired(doc: dict[str, Any], path: str | Path) -> Path:
    """One panel per arm: Δ per cell with its 95% interval, one series per condition value; 0 = no effect."""
    effects, title = _plotted(doc)
    cells = doc["cells"]
    keys = effects[cells].drop_duplicates().sort_values(cells).to_numpy().tolist()
    fig, axes = plt.subplots(1, len(doc["arms"]), figsize=(max(4.0, 1.1 * len(keys) + 2.5), 3.6), squeeze=False)
    width = 0.3 / max(1, len(doc["levels"]) - 1) if len(doc["levels"]) > 1 else 0.0
    for ax, arm in zip(axes[0], doc["arms"]):
        for i, lv in enumerate(doc["levels"]):
            rows = effects[(effects["arm"] == arm) & _is(effects["condition"], lv)]
            x = [keys.index(list(k)) + (i - (len(doc["levels"]) - 1) / 2) * width for k in rows[cells].to_numpy()]
            style = {"fmt": "o", "capsize": 3, "color": f"C{i}", "label": None if lv is None else str(lv)}
            delta_errorbar(ax, x, rows["delta"].to_numpy(float), list(rows["delta_ci95"]), **style)
        ax.axhline(0, color="0.5", lw=0.8)
        ax.set_xticks(
            range(len(keys)), ["\n".join(f"{c} {_plain(v)}" for c, v in zip(cells, k)) for k in keys], fontsize=8
        )
        ax.set_xlim(-0.6, len(keys) - 0.4)
        ax.set_ylabel(f"val loss: {arm} − {doc['reference']}")
        ax.set_title(title, fontsize=9)
        if doc["condition"] is not None:
            ax.legend(fontsize=8, title=doc["condition"], title_fontsize=8)
    fig.tight_layout()
    return save(fig, path, (".png",), dpi=140, tight=False)[0]


def document(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        k: doc[k] for k in ("reference", "arms", "cells", "condition", "levels", "lr_protocol", "heterogeneity")
    } | {
        "effects": doc["effects"].to_dict("records"),
        "interactions": doc["interactions"].to_dict("records"),
        "headline": headline_lines(doc),
    }


def write_paired(doc: dict[str, Any], out: Path) -> list[Path]:
    """The report's files (:data:`FILES`) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    table = doc["interactions"] if doc["condition"] is not None and not doc["interactions"].empty else doc["effects"]
    table.to_csv(out / FILES[0], index=False)
    written = [out / FILES[0], plot_paired(doc, out / FILES[3])]
    files = write_report(out, document(doc), FILES[1], {FILES[2]: paired_markdown(doc)}, written)["files"]
    return [out / f for f in files]


def _columns(text: str) -> tuple[str, ...]:
    columns = tuple(c.strip() for c in text.split(",") if c.strip())
    if not columns:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated column names, e.g. n_layers,d_model")
    return columns


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--results",
        nargs="+",
        action="extend",
        required=True,
        type=Path,
        help="record sets (study directories or results.csv), read as one table; may be repeated",
    )
    p.add_argument("--out", required=True, type=Path, help="output directory (paired.csv, .json, .md, figure)")
    p.add_argument(
        "--cells",
        type=_columns,
        default=PairedOptions.cells,
        help="the columns whose values make a cell (default: n_layers,d_model)",
    )
    p.add_argument(
        "--condition",
        default=None,
        help="the column whose values are the conditions (e.g. study, seq_len, optimizer; default: none)",
    )
    p.add_argument("--reference", default=PairedOptions.reference, help="the reference arm (default: baseline)")
    p.add_argument("--arms", type=_columns, default=(), help="the arms (default: every other variant)")
    p.add_argument(
        "--lr-protocol",
        default=PairedOptions.lr_protocol,
        help="the runs' lr protocol (default: baseline, every arm at the reference's lr; 'any': no filter)",
    )


@register("paired", arguments=_arguments, headline=lambda doc: doc["headline"], files=", ".join(FILES))
def report(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    opts = options_from(PairedOptions, args, lr_protocol=None if args.lr_protocol == "any" else args.lr_protocol)
    frames = [select_completed(load_results(path))[0] for path in args.results]
    doc = analyse_paired(condition_runs(frames, opts), opts)
    return document(doc) | {"files": [f.name for f in write_paired(doc, args.out)]}
