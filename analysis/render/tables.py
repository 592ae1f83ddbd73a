"""The cell formats every Markdown table of the reports shares (summary.md and each study kind's section)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from ..io.paper_data import paper_sweep

AT_BOUND = "(at bound)"  # marks an interval end set by a search bound (fit.json's ``*_ci95_at_bound``)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table as lines: the header row, the rule (``|---|`` per header cell), one line per row. Cells are
    text already formatted, written as they are (an empty cell is ``|  |``); row lengths are not checked."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def fmt(x: Any, digits: int = 4) -> str:
    """A number to ``digits`` significant digits; "–" for a missing or non-finite one."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def ci(interval: list[float] | None, digits: int = 3, at_bound: list[bool] | None = None) -> str:
    """An interval as "[lo, hi]"; "–" when either end is missing or not finite. An end that ``at_bound`` flags (set
    by a search bound: unbounded) prints as "≤lo (at bound)" / "≥hi (at bound)": at least that far out."""
    if not interval or interval[0] is None or not all(isinstance(c, float) and math.isfinite(c) for c in interval):
        return "–"
    lo_b, hi_b = (bool(at_bound[0]), bool(at_bound[1])) if at_bound else (False, False)
    lo = f"≤{interval[0]:.{digits}g} {AT_BOUND}" if lo_b else f"{interval[0]:.{digits}g}"
    hi = f"≥{interval[1]:.{digits}g} {AT_BOUND}" if hi_b else f"{interval[1]:.{digits}g}"
    return f"[{lo}, {hi}]"


def interval_text(interval: list[float] | None) -> str:
    """A difference's interval as "[-0.0123, +0.0456]"; "(no interval)" without one."""
    return f"[{interval[0]:+.4f}, {interval[1]:+.4f}]" if interval else "(no interval)"


def loss_cell(r: dict[str, Any]) -> str:
    """A group's mean val loss, ± its sd over seeds when there is one."""
    return f"{r['val_loss']:.4f}" + (f" ± {r['val_loss_sd']:.4f}" if r.get("val_loss_sd") is not None else "")


def _loss_ci_cell(r: dict[str, Any]) -> str:
    """A group's mean val loss with its 95% interval over seeds, the mean alone without one."""
    lo_hi = r.get("val_loss_ci95")
    return f"{r['val_loss']:.4f} [{lo_hi[0]:.4f}, {lo_hi[1]:.4f}]" if lo_hi else f"{r['val_loss']:.4f}"


def _paper_cell(x: float | None, sign: str = "") -> str:
    """A transcribed paper number (3 decimals, as printed there; ``sign`` "+" for a difference); "–" when absent."""
    return "–" if x is None else f"{x:{sign}.3f}"


def _delta_cell(vs: dict[str, Any] | None) -> str:
    if not vs or vs.get("delta") is None:
        return "–"
    return f"{vs['delta']:+.4f} {interval_text(vs.get('delta_ci95'))} ({vs['n_pairs']})"


def ablation_markdown(table: list[dict[str, Any]]) -> list[str]:
    """The Table 4 rows (analysis.laws.fixed_shape.ablation_table, or the paper's own rows): loss [95% CI], Δ vs the
    baseline [95% CI] on same-seed pairs, and the paper's loss and Δ where the rows carry them."""
    with_paper = any("paper_loss" in r for r in table)
    header = ["variant", "runs", "val loss [95% CI]", "Δ vs baseline [95% CI] (pairs)", "verdict"]
    rows = []
    for r in table:
        d = r.get("delta_vs_baseline")
        pairs = f" {interval_text(r.get('delta_ci95'))} ({r['n_pairs']})" if "n_pairs" in r else ""
        delta = "–" if d is None else f"{d:+.4f}{pairs}"
        cells = [str(r.get("label", r["variant"])), str(r["n_runs"]), _loss_ci_cell(r), delta, r.get("verdict", "–")]
        if with_paper:
            cells += [_paper_cell(r.get("paper_loss")), _paper_cell(r.get("paper_delta"), "+")]
        rows.append(cells)
    return markdown_table(header + (["paper loss", "paper Δ"] if with_paper else []), rows)


def block_size_markdown(sw: dict[str, Any]) -> list[str]:
    """The block-size section: per S the loss [95% CI], its same-seed differences from the baseline and from Full
    AttnRes [95% CI] (pairs), and the paper's Fig. 6 loss and difference from its baseline; then the references."""
    paper = {p.block_size: p.val_loss for p in paper_sweep().points}
    paper_base = paper_sweep().baseline
    base_paper = paper_base.val_loss if paper_base is not None else None
    shape = f", {sw['n_sublayers']} sublayers" if sw.get("n_sublayers") else ""
    header = ["block size S", "runs", "val loss [95% CI]", "Δ vs baseline [95% CI] (pairs)"]
    header += ["Δ vs Full [95% CI] (pairs)", "paper loss", "paper Δ vs baseline"]
    rows = []
    for p in sw["points"]:
        S, pl = p["block_size"], paper.get(p["block_size"])
        paper_delta = None if pl is None or base_paper is None else pl - base_paper
        cells = [f"{S}{' (= Full)' if S == 1 else ''}", str(p["n_runs"]), _loss_ci_cell(p)]
        cells += [_delta_cell(p.get("vs_baseline")), _delta_cell(p.get("vs_full"))]
        rows.append([*cells, _paper_cell(pl), _paper_cell(paper_delta, "+")])
    lines = [
        f"## Block size sweep ({sw.get('variant') or 'Block AttnRes'}, size {sw['size']}{shape})",
        "",
        "Differences are same-seed pairs, arm minus reference (negative: the arm is better), with 95% t intervals.",
        "",
        *markdown_table(header, rows),
    ]
    for key, label, pl in (("full", "Full AttnRes", paper.get(1)), ("baseline", "Baseline", base_paper)):
        if sw.get(key):
            lines.append(f"| {label} | {sw[key]['n_runs']} | {_loss_ci_cell(sw[key])} | | | {_paper_cell(pl)} | |")
    return [*lines, ""]


def arch_grid_markdown(table: dict[str, Any]) -> list[str]:
    """The Fig. 7 table: one block of rows per variant (H/L_b, largest first) x d/L_b columns, then Δ vs baseline."""
    xs, ys = table["d_over_lb"], table["heads_over_lb"]
    header = ["variant", "H/L_b ↓ · d/L_b →", *(f"{x:g}" for x in xs)]

    def block(name: str, grid: list[list[float | None]], fmt: str, best: tuple[int, int] | None) -> list[list[str]]:
        out = []
        for i, y in enumerate(ys):
            cells = [name if i == 0 else "", f"{y:g}"]
            for j in range(len(xs)):
                text = "–" if grid[i][j] is None else format(grid[i][j], fmt)
                cells.append(f"**{text}**" if best == (i, j) else text)
            out.append(cells)
        return out

    budget = f" C = {table['flops_budget']:.3g} FLOPs" if table.get("flops_budget") else ""
    rows = []
    for v in table["variants"]:
        b = table["best"].get(v)
        pos = (ys.index(b["heads_over_lb"]), xs.index(b["d_over_lb"])) if b else None
        rows += block(v, table["val_loss"][v], ".4f", pos)
    lines = [
        f"Final validation loss at fixed compute{budget} (mean over seeds; bold: the variant's best cell).",
        "",
        *markdown_table(header, rows),
    ]
    if table.get("delta_vs_baseline"):
        lines += ["", f"Δ vs {table['baseline']} (negative: lower loss than the baseline in that cell).", ""]
        deltas = [cells for v, grid in table["delta_vs_baseline"].items() for cells in block(v, grid, "+.4f", None)]
        lines += markdown_table(header, deltas)
    return lines
