"""The Markdown of a multi-budget LR study (``python -m analysis lr`` on records with several budgets per arm and
size, analysis.studies.lr): the optimum per (arm, size, budget), the runs that extend a grid whose optimum is on its
edge, each arm's lr rule ``ln lr* = a + b ln N + c ln D`` (analysis.laws.lr_rule) with its leave-one-cell-out check,
and what each lr protocol costs. Plain functions from the study's table and documents to lines."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from ..io.runs import lr_text
from .tables import markdown_table

PROTOCOL_TOLERANCE = 0.01  # nats above an arm's own optimum that a protocol's lr may cost it (issue 49's target)


def _num(x: Any, spec: str = ".3g") -> str:
    return "n/a" if x is None or not np.isfinite(x) else format(x, spec)


def _optimum(lr: float, ci: Any) -> str:
    return f"{_num(lr)} [{_num(ci[0])}, {_num(ci[1])}]"


def cell_name(size: str, tokens_per_param: float) -> str:
    """One cell in words: ``deep_L12 @ 8 tokens/param``."""
    return f"{size} @ {tokens_per_param:g} tokens/param"


def flag_text(r: Any, on_edge: str) -> str:
    """An lr curve's flags (a row of analysis.studies.lr.lr_optima_with_draws): on a grid edge (then ``on_edge``
    says what to do), the divergence edge, no curvature, diverged runs; comma-separated."""
    flags = []
    if r.on_edge:
        flags.append(f"**on the {r.edge} edge: {on_edge}**")
    elif r.edge == "divergence":
        flags.append("highest lr that did not diverge")
    if not r.curvature > 0:
        flags.append("no curvature")
    if r.n_diverged:
        flags.append(f"{r.n_diverged} diverged")
    return ", ".join(flags)


def next_run_lines(runs: list[dict[str, Any]]) -> list[str]:
    """One line per launch that extends a grid: the arm, size and lr, the budgets whose optimum is on that edge, and
    the command (or just the lr where the study's sweep is not known)."""
    lines = []
    for n in runs:
        budgets = ", ".join(f"{b:g}" for b in n["budgets"])
        what = f"{n['variant']} {n['size']}, lr {lr_text(n['lr'])} (on the {n['edge']} edge at {budgets} tokens/param)"
        lines.append(f"{what}: `{n['command']}`" if n["command"] else what)
    return lines


def _coef(rule: dict[str, Any], name: str) -> str:
    if rule.get("error"):
        return "not fitted"
    if name not in rule.get("terms", []) or rule.get(name) is None:
        return "not identified"
    ci = rule.get(f"{name}_ci95")
    return f"{rule[name]:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")


def _excluded(rule: dict[str, Any]) -> str:
    return ", ".join(f"{cell_name(e['size'], e['tokens_per_param'])} ({e['reason']})" for e in rule["excluded"])


def rule_sentence(variant: str, rule: dict[str, Any]) -> str:
    """The arm's rule in one line: its coefficients with intervals, the leave-one-cell-out count, the excluded cells."""
    excluded = f"; excluded: {_excluded(rule)}" if rule["excluded"] else ""
    if rule.get("error"):
        return f"lr rule {variant}: not fitted ({rule['error']}){excluded}"
    coefs = ", ".join(f"{t} = {_coef(rule, t)}" for t in ("a", "b", "c"))
    return (
        f"lr rule {variant}: ln lr* = a + b ln N + c ln D over {rule['n_cells']} cells, {coefs}; "
        f"{rule['loo_inside']} of {rule['loo_n']} left-out cells inside{excluded}"
    )


def rule_lines(rules: dict[str, dict[str, Any]]) -> list[str]:
    """The rule section: method, one table row per arm, then per arm its cells with the left-out prediction."""
    if not rules:
        return []
    rows, cells = [], []
    for v, rule in rules.items():
        coefs = [_coef(rule, t) for t in ("a", "b", "c")]
        inside = f"{rule['loo_inside']} of {rule['loo_n']}"
        rows.append([v, f"{rule['n_cells']}", *coefs, inside, _excluded(rule) or "none"])
        for c in rule["cells"]:
            verdict = "n/a" if c["inside"] is None else ("yes" if c["inside"] else "**no**")
            name = cell_name(c["size"], c["tokens_per_param"])
            cells.append([v, name, _optimum(c["lr"], c["ci95"]), _num(c["loo_lr"]), verdict])
    return [
        "## The lr rule per arm: ln lr* = a + b ln N + c ln D",
        "",
        (
            "N = non-embedding parameters, D = training tokens; fitted over the cells whose optimum was located "
            f"({next(iter(rules.values()))['method']}); a term the cells do not vary is not identified. Intervals: "
            "95% percentile bootstrap, each replicate refitted on every cell's bootstrap draw of its optimum. "
            "Leave-one-cell-out: the rule refitted without a cell predicts it; inside = within that cell's own 95% "
            "interval."
        ),
        "",
        *markdown_table(["arm", "cells", "a", "b", "c", "left-out cells inside", "excluded"], rows),
        "",
        *markdown_table(["arm", "cell", "optimum [95% CI]", "rule without the cell", "inside"], cells),
    ]


def rules_without_smallest_lines(refit: dict[str, Any] | None) -> list[str]:
    """The rule refitted without the smallest size (analysis.studies.lr.rules_without_smallest): one row per arm."""
    if not refit:
        return []
    rows = []
    for v, rule in refit["rules"].items():
        inside = "n/a" if rule.get("error") else f"{rule['loo_inside']} of {rule['loo_n']}"
        misses = ", ".join(cell_name(c["size"], c["tokens_per_param"]) for c in rule["cells"] if c["inside"] is False)
        rows.append([v, f"{rule['n_cells']}", *(_coef(rule, t) for t in ("a", "b", "c")), inside, misses or "none"])
    return [
        (
            f"Without the smallest size ({refit['size']}): the same rule over the other sizes, a check that one rung "
            "off the power law in N does not set it."
        ),
        "",
        *markdown_table(["arm", "cells", "a", "b", "c", "left-out cells inside", "left-out cells outside"], rows),
    ]


def protocol_cost_lines(costs: list[dict[str, Any]], reference: str = "baseline") -> list[str]:
    """The protocol-cost section (analysis.laws.lr_check.protocol_costs, as records): per arm, rung and budget the
    loss above the arm's own optimum at the reference's optimum for the budget and at one trunk's lr, then one line
    per protocol counting the cells within PROTOCOL_TOLERANCE."""
    if not costs:
        return []

    def excess(v: float, on_edge: bool) -> str:
        text = "off the grid" if v is None or not np.isfinite(v) else f"{round(v, 4) or 0.0:+.4f}"  # no -0.0000
        return text + (" (edge: at least)" if on_edge and text != "off the grid" else "")

    header = ["arm", "rung", "tokens / param", "own optimum", "per budget: lr", "excess", "one trunk: lr", "excess"]
    rows = []
    for c in costs:
        cells = [f"{c['variant']}", f"{c['size']}", f"{c['tokens_per_param']:g}", _num(c["lr"])]
        cells += [_num(c["reference_lr"]), excess(c["excess_reference"], c["on_edge"]), _num(c["trunk_lr"])]
        rows.append([*cells, excess(c["excess_trunk"], c["on_edge"])])
    return [
        "## What each protocol's lr costs each arm",
        "",
        (
            f"Loss above the arm's own optimum, read off its grid curve (the parabola of its optimum where the lr lies "
            f"in that window). Per budget: every arm at {reference}'s optimum for that budget (the paper's protocol, "
            f"what the per-budget rerun trains at). One trunk: every budget at {reference}'s optimum for the rung's "
            "smallest budget (decay branches off one trunk share its peak lr)."
        ),
        "",
        *markdown_table(header, rows),
        "",
        *(f"- {line}" for line in protocol_verdicts(costs)),
    ]


def protocol_verdicts(costs: list[dict[str, Any]]) -> list[str]:
    """One line per protocol (per budget, one trunk): the cells whose excess is within PROTOCOL_TOLERANCE, and the
    ones over it."""
    lines = []
    for key, name in (("excess_reference", "per budget"), ("excess_trunk", "one trunk")):
        measured = [c for c in costs if c[key] is not None and np.isfinite(c[key])]
        within = sum(c[key] <= PROTOCOL_TOLERANCE for c in measured)
        over = ", ".join(
            f"{c['variant']} {cell_name(c['size'], c['tokens_per_param'])} ({c[key]:+.3f})"
            for c in measured
            if c[key] > PROTOCOL_TOLERANCE
        )
        lines.append(
            f"{name}: {within} of {len(measured)} measured cells within {PROTOCOL_TOLERANCE} nats of the arm's "
            f"optimum" + (f"; over: {over}" if over else "")
        )
    return lines


def budget_markdown(
    table: pd.DataFrame,
    info: dict[str, Any],
    source: str | None,
    next_runs: list[dict[str, Any]],
    rules: dict[str, dict[str, Any]],
    costs: list[dict[str, Any]] | None = None,
    rules_without_smallest: dict[str, Any] | None = None,
) -> str:
    """lr_summary.md of a multi-budget LR study: per (arm, size, budget) the optimum with its 95% interval, its
    width (hi / lo), the best grid lr, the loss there, grid points, seeds and flags; then the next runs, the rules
    and the protocol costs."""
    header = ["arm", "size", "N", "tokens / param", "D", "optimum [95% CI]", "CI width (hi/lo)", "loss rise at CI end"]
    header += ["best grid lr", "loss at optimum", "grid points", "seeds", "flags"]
    rows = []
    for r in table.itertuples():
        n = f"{r.params_non_embedding:,.0f}" if r.params_non_embedding else "n/a"
        cells = [f"{r.variant}", f"{r.size}", n, f"{r.tokens_per_param:g}", f"{r.tokens:,.0f}"]
        rise = _num(r.ci_end_rise, "+.4f")
        cells += [_optimum(r.lr, r.ci95), _num(r.ci_ratio, ".2f"), rise, _num(r.grid_best_lr), _num(r.loss_at_optimum)]
        flags = flag_text(r, f"next lr {lr_text(r.next_lr)}" if r.on_edge else "")
        rows.append([*cells, f"{r.n_grid}", f"{r.n_seeds}", flags])
    lines = ["# Learning-rate tuning per budget", "", f"Source: `{source}`." if source else "", ""]
    lines += [
        *markdown_table(header, rows),
        "",
        (
            "Per (arm, size, budget): the vertex of a least-squares parabola in ln(lr) through the grid points within "
            f"{info['window']} steps of the grid minimum (kept inside that window); a diverged run counts as worse "
            f"than every completed one. Intervals: {int(100 * info['ci_level'])}% percentile bootstrap, "
            f"B = {info['B']}; single-seed curves use a parametric bootstrap with sigma = {_num(info['sigma'])} "
            f"({info['sigma_source']}). On a grid edge the optimum may lie beyond the grid: the next lr is half the "
            "lowest lr of the grid, or twice the highest. Loss rise at CI end: the grid curve's loss at the worse end "
            "of the interval above the optimum; a wide interval whose rise is under sigma is a flat valley (the "
            "optimum's place is not resolved at this noise, and costs little)."
        ),
    ]
    if next_runs:
        lines += ["", "## Next runs: the grids whose optimum is on an edge", ""]
        lines += [f"- {line}" for line in next_run_lines(next_runs)]
    if rules:
        lines += ["", *rule_lines(rules)]
        refit = rules_without_smallest_lines(rules_without_smallest)
        lines += ["", *refit] if refit else []
    if costs:
        lines += ["", *protocol_cost_lines(costs)]
    return "\n".join(lines) + "\n"


def ratio_text(lo: float, hi: float) -> str:
    """An interval's width as hi / lo (``x1.23``), or n/a."""
    return f"x{hi / lo:.2f}" if math.isfinite(lo) and math.isfinite(hi) and lo > 0 else "n/a"
