"""The training-length study under two lr protocols, side by side: every budget at one shared peak lr (one WSD trunk
per run, the lr tuned at the smallest budget) against every budget at its own tuned lr (conf/tuned_lr/*.yaml
``lr_per_budget``). Per (rung, budget) cell: the arm's same-seed Δ under each protocol, how much the Δ moved
(per seed, Δ_own - Δ_shared), and how much each arm's own loss gained from its budget's lr (per seed, L_own -
L_shared; negative: the budget's own lr trains better); per rung: Δ at the largest budget minus Δ at the smallest,
under each protocol, which says whether "the arm's gain grows with training length" survives the fair lrs.

Everything is a same-seed comparison on the seeds both tables hold (analysis.laws.paired, 95% t intervals), so
the two studies must share seeds. ``python -m analysis length --compare-to <the other protocol's results>``.

Plain functions on tidy DataFrames; no torch.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ..io.token_budget import tokens_per_param
from ..laws.paired import paired_comparison
from ..render.tables import interval_text

SHARED, OWN = "shared_lr", "own_lr"  # the two protocols, as the condition column names them
CELLS = ("size", "tokens_per_param")


def _completed(df: pd.DataFrame, protocol: str) -> pd.DataFrame:
    done = df[df["status"] == "completed"] if "status" in df.columns else df
    return done.assign(tokens_per_param=tokens_per_param(done), protocol=protocol)


def _lr_of(runs: pd.DataFrame, size: str, tpp: float, variant: str) -> float | None:
    lrs = runs[(runs["size"] == size) & (runs["tokens_per_param"] == tpp) & (runs["variant"] == variant)]["lr"]
    return float(lrs.iloc[0]) if len(lrs) else None


def _num(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def compare_protocols(
    shared: pd.DataFrame, own: pd.DataFrame, arm: str = "block_attnres", reference: str = "baseline"
) -> dict[str, Any]:
    """Side by side per cell and per rung (module docstring). ``shared``, ``own``: the two studies' records
    (columns variant, size, seed, val_loss, lr, status, params_non_embedding and what tokens per parameter is
    computed from). Returns
    ``cells`` (one dict per (rung, budget) both hold for both arms: ``delta_shared``, ``delta_own`` with their
    ``_ci95``, ``shift`` = Δ_own - Δ_shared with ``shift_ci95``, ``gain_<arm>``/``gain_<reference>`` = L_own -
    L_shared with ``_ci95``, each arm's lr under each protocol, ``n_pairs``) and ``growth`` (per rung: Δ(largest
    budget) - Δ(smallest) under each protocol with its interval). One arm's runs of one cell at two lrs within one
    protocol are a ValueError (analysis.laws.paired.paired_comparison)."""
    a, b = _completed(shared, SHARED), _completed(own, OWN)
    both = pd.concat([a, b], ignore_index=True)
    both = both[both["variant"].isin([arm, reference])]
    table = paired_comparison(both, reference, [arm], CELLS, "protocol")
    gains = {
        v: paired_comparison(both[both["variant"] == v], SHARED, [OWN], CELLS, arm_column="protocol")
        for v in (arm, reference)
    }
    cells = []
    for r in table.itertuples():
        key = (r.size, r.tokens_per_param)
        row: dict[str, Any] = {"size": str(r.size), "tokens_per_param": float(r.tokens_per_param), "seeds": r.seeds}
        for p in (SHARED, OWN):
            row[f"delta_{p}"] = _num(getattr(r, f"delta_{p}"))
            row[f"delta_{p}_ci95"] = getattr(r, f"delta_{p}_ci95")
        # paired_comparison's interaction is Δ_first - Δ_second = Δ_shared - Δ_own: the shift is its negative
        row["shift"] = -float(r.interaction)
        row["shift_ci95"] = [-r.interaction_ci95[1], -r.interaction_ci95[0]] if r.interaction_ci95 else None
        row["n_pairs"] = int(r.n_pairs)
        for v, g in gains.items():
            hit = g[(g["size"] == key[0]) & (g["tokens_per_param"] == key[1])]
            row[f"gain_{v}"] = _num(float(hit["delta"].iloc[0])) if len(hit) else None
            row[f"gain_{v}_ci95"] = hit["delta_ci95"].iloc[0] if len(hit) else None
            for p, runs in ((SHARED, a), (OWN, b)):
                row[f"lr_{v}_{p}"] = _lr_of(runs, key[0], key[1], v)
        cells.append(row)
    order = both.groupby("size")["params_non_embedding"].median().to_dict()  # rungs by N, not by name
    cells.sort(key=lambda c: (order.get(c["size"], 0.0), c["tokens_per_param"]))
    growth = sorted(_growth(a, b, arm, reference), key=lambda g: order.get(g["size"], 0.0))
    return {"arm": arm, "reference": reference, "cells": cells, "growth": growth}


def _growth(a: pd.DataFrame, b: pd.DataFrame, arm: str, reference: str) -> list[dict[str, Any]]:
    """Per rung and protocol: Δ at the largest budget minus Δ at the smallest (same seeds; negative: the arm's gain
    grows with training length)."""
    out = []
    for p, runs in ((SHARED, a), (OWN, b)):
        runs = runs[runs["variant"].isin([arm, reference])]
        for size, rung in runs.groupby("size", sort=True):
            budgets = sorted(rung["tokens_per_param"].unique())
            if len(budgets) < 2:
                continue
            lo, hi = budgets[0], budgets[-1]
            ends = rung[rung["tokens_per_param"].isin([hi, lo])].assign(budget_end=lambda d: d["tokens_per_param"])
            ends = ends.sort_values("tokens_per_param", ascending=False, kind="stable")  # first: the largest budget
            t = paired_comparison(ends, reference, [arm], (), "budget_end")
            if t.empty:
                continue
            r = t.iloc[0]
            out.append(
                {
                    "size": str(size),
                    "protocol": p,
                    "from": float(lo),
                    "to": float(hi),
                    "growth": float(r["interaction"]),
                    "growth_ci95": r["interaction_ci95"],
                    "n_pairs": int(r["n_pairs"]),
                }
            )
    return out


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
        "| rung | tokens / param | "
        + " | ".join([f"lr shared → own ({ref})", "Δ shared lr", "Δ own lr", "shift", f"{ref} gain", f"{arm} gain"])
        + " | pairs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in doc["cells"]:
        lrs = f"{c[f'lr_{ref}_{SHARED}']:.3g} → {c[f'lr_{ref}_{OWN}']:.3g}" if c[f"lr_{ref}_{OWN}"] else "n/a"
        numbers = [
            _signed(c[f"delta_{SHARED}"], c[f"delta_{SHARED}_ci95"]),
            _signed(c[f"delta_{OWN}"], c[f"delta_{OWN}_ci95"]),
            _signed(c["shift"], c["shift_ci95"]),
            _signed(c[f"gain_{ref}"], c[f"gain_{ref}_ci95"]),
            _signed(c[f"gain_{arm}"], c[f"gain_{arm}_ci95"]),
        ]
        lines.append(f"| {c['size']} | {c['tokens_per_param']:g} | {lrs} | {' | '.join(numbers)} | {c['n_pairs']} |")
    lines += ["", f"Δ(largest budget) - Δ(smallest) per rung (negative: {arm}'s gain grows with training length):", ""]
    lines += ["| rung | budgets | shared lr | own lr |", "|---|---|---|---|"]
    by_rung: dict[str, dict[str, dict[str, Any]]] = {}
    for g in doc["growth"]:
        by_rung.setdefault(g["size"], {})[g["protocol"]] = g
    for size, g in by_rung.items():
        span = next(iter(g.values()))
        cols = [_signed(g[p]["growth"], g[p]["growth_ci95"]) if p in g else "n/a" for p in (SHARED, OWN)]
        lines.append(f"| {size} | {span['from']:g} → {span['to']:g} | {cols[0]} | {cols[1]} |")
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
