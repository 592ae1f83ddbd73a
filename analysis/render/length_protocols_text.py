"""The text of the training-length study under two lr protocols side by side (analysis.laws.length_protocols,
length.json ``lr_protocols``) and of its best-against-best comparison (length.json ``best_against_best``): their
sections of length_summary.md and their headline sentences (analysis.studies.training_length).
"""

from __future__ import annotations

from typing import Any

from ..laws.length_protocols import OWN, SHARED
from .tables import interval_text, markdown_table


def _signed(x: float | None, ci: list[float] | None) -> str:
    return "n/a" if x is None else f"{x:+.4f} {interval_text(ci)}"


def protocols_markdown(doc: dict[str, Any]) -> list[str]:
    """The side-by-side section of length_summary.md."""
    arm, ref = doc["arm"], doc["reference"]
    lines = [
        f"## {arm} - {ref} at one shared lr against each budget at its own lr (same seeds, 95% t intervals)",
        "",
        (
            f"Δ = {arm} - {ref} (negative: {arm} wins); shift = Δ(own lr) - Δ(shared lr); an arm's gain = its loss "
            "at the budget's own lr - at the shared lr (negative: the budget's own lr trains it better)."
        ),
        "",
    ]
    header = ["rung", "tokens / param", f"lr shared → own ({ref})", "Δ shared lr", "Δ own lr", "shift", f"{ref} gain"]
    rows = []
    for c in doc["cells"]:
        lrs = f"{c[f'lr_{ref}_{SHARED}']:.3g} → {c[f'lr_{ref}_{OWN}']:.3g}" if c[f"lr_{ref}_{OWN}"] else "n/a"
        numbers = [
            _signed(c[f"delta_{SHARED}"], c[f"delta_{SHARED}_ci95"]),
            _signed(c[f"delta_{OWN}"], c[f"delta_{OWN}_ci95"]),
            _signed(c["shift"], c["shift_ci95"]),
            _signed(c[f"gain_{ref}"], c[f"gain_{ref}_ci95"]),
            _signed(c[f"gain_{arm}"], c[f"gain_{arm}_ci95"]),
        ]
        rows.append([f"{c['size']}", f"{c['tokens_per_param']:g}", lrs, *numbers, f"{c['n_pairs']}"])
    lines += markdown_table([*header, f"{arm} gain", "pairs"], rows)
    lines += ["", f"Δ(largest budget) - Δ(smallest) per rung (negative: {arm}'s gain grows with training length):", ""]
    by_rung: dict[str, dict[str, dict[str, Any]]] = {}
    for g in doc["growth"]:
        by_rung.setdefault(g["size"], {})[g["protocol"]] = g
    rows = []
    for size, g in by_rung.items():
        span = next(iter(g.values()))
        cols = [_signed(g[p]["growth"], g[p]["growth_ci95"]) if p in g else "n/a" for p in (SHARED, OWN)]
        rows.append([f"{size}", f"{span['from']:g} → {span['to']:g}", *cols])
    lines += markdown_table(["rung", "budgets", "shared lr", "own lr"], rows)
    return [*lines, "", *(f"- {line}" for line in growth_lines(doc)), ""]


def growth_lines(doc: dict[str, Any]) -> list[str]:
    """One plain sentence per protocol: at how many rungs the gain grows (interval below zero), shrinks, or neither."""
    growth, arm = doc["growth"], doc["arm"]
    out = []
    for p, name in ((SHARED, "at the shared lr"), (OWN, "at each budget's own lr")):
        rows = [g for g in growth if g["protocol"] == p and g["growth_ci95"]]
        if not rows:
            continue
        grows = [g["size"] for g in rows if g["growth_ci95"][1] < 0]
        shrinks = [g["size"] for g in rows if g["growth_ci95"][0] > 0]
        out.append(
            f"{name}: {arm}'s gain grows with training length at {len(grows)} of {len(rows)} rungs"
            f"{' (' + ', '.join(grows) + ')' if grows else ''}, shrinks at {len(shrinks)}"
            f"{' (' + ', '.join(shrinks) + ')' if shrinks else ''}, undecided at the rest."
        )
    return out


def best_markdown(rows: list[dict[str, Any]], arm: str, ref: str) -> list[str]:
    """The best-against-best section of length_summary.md: each arm at its own optimum lr."""
    if not rows:
        return []
    lines = [
        f"## Best against best: {arm} at its own optimum lr against {ref} at its own (same seeds, 95% t intervals)",
        "",
        (
            f"Δ best = {arm} at its own lr - {ref}; Δ at {ref}'s lr = the study's protocol; {arm}'s gain = Δ best - "
            f"Δ at {ref}'s lr (negative: its own lr trains it better)."
        ),
        "",
    ]
    cells = []
    for c in rows:
        lrs = f"{c['lr_arm_best']:.3g}, {c['lr_arm_own']:.3g}"
        numbers = [_signed(c[k], c[f"{k}_ci95"]) for k in ("delta_best", "delta_own", "arm_gain")]
        cells.append([f"{c['size']}", f"{c['tokens_per_param']:g}", lrs, *numbers, f"{c['n_pairs']}"])
    header = ["rung", "tokens / param", f"lr {arm} (own, {ref}'s)", "Δ best", f"Δ at {ref}'s lr", f"{arm} gain"]
    lines += markdown_table([*header, "pairs"], cells)
    return [*lines, "", *(f"- {line}" for line in best_lines(rows, arm)), ""]


def best_lines(rows: list[dict[str, Any]], arm: str) -> list[str]:
    """One sentence per cell: Δ with each arm at its own optimum, and its verdict."""
    out = []
    for c in rows:
        ci = c["delta_best_ci95"]
        said = "no verdict" if not ci else ("wins" if ci[1] < 0 else "loses" if ci[0] > 0 else "undecided")
        seeds = f"{c['n_pairs']} seed" + ("s" if c["n_pairs"] != 1 else "")
        out.append(
            f"best against best at {c['size']} @ {c['tokens_per_param']:g} tokens/param: {arm} "
            f"{_signed(c['delta_best'], ci)} ({said}, {seeds})"
        )
    return out
