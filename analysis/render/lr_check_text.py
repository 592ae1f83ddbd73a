"""The text of the lr check of a multi-budget study (analysis.laws.lr_check, length.json ``lr_check``): its
headline lines and its Markdown section in length_summary.md (analysis.studies.training_length).
"""

from __future__ import annotations

from typing import Any

from .tables import markdown_table


def _lr_cell(b: dict[str, Any]) -> str:
    flag = " (grid edge)" if b["on_edge"] else (" (no curvature)" if b["no_curvature"] else "")
    return f"{b['best_lr']:.3g}{flag}"


def _signed(x: float | None, ci: list[float] | None = None) -> str:
    return "n/a" if x is None else f"{x:+.4f}" + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "")


def lr_check_lines(check: dict[str, Any], arm: str, reference: str) -> list[str]:
    """The headline: per rung and budget, each arm's best lr and the two gains; then whether each optimum moves."""
    lines = []
    for r in check["rows"]:
        a, b = r["arms"][arm], r["arms"][reference]
        lines.append(
            f"lr check {r['size']} at {r['tokens_per_param']:g} tokens/param: best lr {reference} {_lr_cell(b)}, "
            f"{arm} {_lr_cell(a)}; {arm} - {reference} at the shared lr {check['shared_lr']:.4g}: "
            f"{_signed(r['delta_shared'], r['delta_shared_ci95'])}, at each arm's best lr: {_signed(r['delta_best'])}"
        )
    for m in check["moves"]:
        verb = "moves" if m["moves"] else "stays"
        edge = "; an optimum on the grid's edge: extend the grid" if m["any_on_edge"] else ""
        per = ", ".join(f"{k}: {v:.3g}" for k, v in m["best_lr"].items())
        lines.append(
            f"lr check {m['arm']} at {m['size']}: the best lr {verb} with the budget ({per}; "
            f"span x{m['span']:.2f}){edge}"
        )
    return lines


def lr_check_markdown(check: dict[str, Any], arm: str, reference: str) -> list[str]:
    lines = [
        f"## The lr check: each arm's best lr per budget, and {arm} - {reference} at the shared and the best lrs",
        "",
        (
            f"Grid: {', '.join(f'{x:.4g}' for x in check['lrs'])}; shared lr {check['shared_lr']:.4g}. Best lr: the "
            "vertex of a parabola in ln lr over the grid (the grid point where it is on the edge); the optimum"
            " moves when the best grid point differs between budgets or the optima span more than "
            f"x{check['move_factor']:.3g}."
        ),
        "",
    ]
    rows = []
    for r in check["rows"]:
        cells = [f"{r['size']}", f"{r['tokens_per_param']:g}", _lr_cell(r["arms"][reference]), _lr_cell(r["arms"][arm])]
        shared = f"{_signed(r['delta_shared'], r['delta_shared_ci95'])} ({r['n_pairs']} pairs)"
        rows.append([*cells, shared, _signed(r["delta_best"])])
    header = ["rung", "tokens / param", f"best lr {reference}", f"best lr {arm}", "Δ at the shared lr"]
    lines += [*markdown_table([*header, "Δ at the best lrs"], rows), ""]
    lines += [f"* {line}" for line in lr_check_lines(check, arm, reference) if " the best lr " in line]
    return [*lines, ""]
