"""The training-length study under two lr protocols side by side (every budget at one shared lr against every
budget at its own tuned lr): per (rung, budget) the arm's same-seed Δ under each, its shift and each arm's gain from
its budget's lr; per rung Δ(largest budget) - Δ(smallest) under each; and best against best
(:func:`best_against_best`). Same-seed comparisons (analysis.laws.paired, 95% t intervals). Numbers only.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pandas as pd

from ..io.runs import AnalysisWarning, completed_runs
from ..io.token_budget import tokens_per_param
from .paired import paired_comparison

SHARED, OWN = "shared_lr", "own_lr"  # the two protocols, as the condition column names them
CELLS = ("size", "tokens_per_param")


def _completed(df: pd.DataFrame, protocol: str) -> pd.DataFrame:
    done = completed_runs(df)
    return done.assign(tokens_per_param=tokens_per_param(done), protocol=protocol)


def _lr_of(runs: pd.DataFrame, size: str, tpp: float, variant: str) -> float | None:
    lrs = runs[(runs["size"] == size) & (runs["tokens_per_param"] == tpp) & (runs["variant"] == variant)]["lr"]
    return float(lrs.iloc[0]) if len(lrs) else None


def _num(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _negated(ci: list[float] | None) -> list[float] | None:
    return [-ci[1], -ci[0]] if ci else None


def _deltas(r: Any, names: dict[str, str]) -> dict[str, Any]:
    """A paired_comparison row's cell and seeds, and per condition ``p`` its Δ as ``delta_<name>`` (with _ci95)."""
    row = {"size": str(r.size), "tokens_per_param": float(r.tokens_per_param), "seeds": r.seeds}
    for name, p in names.items():
        row |= {f"delta_{name}": _num(getattr(r, f"delta_{p}")), f"delta_{name}_ci95": getattr(r, f"delta_{p}_ci95")}
    return row


def compare_protocols(
    shared: pd.DataFrame, own: pd.DataFrame, arm: str = "block_attnres", reference: str = "baseline"
) -> dict[str, Any]:
    """The two studies' records ``shared`` and ``own`` side by side: ``cells`` (per (rung, budget) both hold:
    ``delta_<protocol>``, ``shift`` = Δ_own - Δ_shared, ``gain_<arm>`` = L_own - L_shared, each with ``_ci95``, the
    lrs, ``n_pairs``) and ``growth`` (:func:`_growth`)."""
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
        row = _deltas(r, {SHARED: SHARED, OWN: OWN})
        # paired_comparison's interaction is Δ_first - Δ_second = Δ_shared - Δ_own: the shift is its negative
        row |= {"shift": -float(r.interaction), "shift_ci95": _negated(r.interaction_ci95), "n_pairs": int(r.n_pairs)}
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
            row = {"size": str(size), "protocol": p, "from": float(lo), "to": float(hi)}
            row |= {"growth": float(r["interaction"]), "growth_ci95": r["interaction_ci95"]}
            out.append(row | {"n_pairs": int(r["n_pairs"])})
    return out


BEST = "best"  # the arm at its own optimum (the condition value of best_against_best)


def split_best(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """A study's runs under the paper's protocol, and its ``lr_protocol`` per_arm runs where it holds both (else
    None)."""
    if "lr_protocol" not in df.columns:
        return df, None
    per_arm = (df["lr_protocol"] == "per_arm").to_numpy()
    if not per_arm.any() or per_arm.all():
        return df, None
    return df[~per_arm], df[per_arm]


def best_against_best(
    own: pd.DataFrame, best: pd.DataFrame, arm: str = "block_attnres", reference: str = "baseline"
) -> list[dict[str, Any]]:
    """Per (rung, budget) cell of ``best`` (the arm at its own optimum lr), against ``own`` (the reference at its
    optimum, the arm at the reference's lr), on the seeds all three share: ``delta_best``, ``delta_own`` and
    ``arm_gain`` = Δ_best - Δ_own, each with ``_ci95``, the lrs and ``n_pairs``."""
    mine = _completed(best, BEST)
    mine = mine[mine["variant"] == arm]
    if mine.empty:
        return []
    cells = set(zip(mine["size"], mine["tokens_per_param"]))
    o = _completed(own, OWN)
    in_cells = pd.Series([k in cells for k in zip(o["size"], o["tokens_per_param"])], index=o.index)
    o = o[in_cells & o["variant"].isin([arm, reference])]
    paired = {k for k, g in o.groupby(["size", "tokens_per_param"]) if {arm, reference} <= set(g["variant"])}
    if missing := sorted(cells - paired):
        where = ", ".join(f"{size} @ {tpp:g} tokens/param" for size, tpp in missing)
        warnings.warn(
            f"best against best: no runs of both {arm} and {reference} under the paper's protocol at {where}; left out",
            AnalysisWarning,
            stacklevel=2,
        )
        mine = mine[[k in paired for k in zip(mine["size"], mine["tokens_per_param"])]]
        if mine.empty:
            return []
    ref = o[o["variant"] == reference]
    both = pd.concat([o, mine, ref.assign(protocol=BEST)], ignore_index=True)
    table = paired_comparison(both, reference, [arm], CELLS, "protocol")
    out = []
    for r in table.itertuples():
        row = _deltas(r, {"best": BEST, "own": OWN})
        # the interaction is Δ_first - Δ_second = Δ_own - Δ_best: the arm's gain is its negative
        row |= {"arm_gain": -float(r.interaction), "arm_gain_ci95": _negated(r.interaction_ci95)}
        lrs = {"lr_arm_best": (mine, arm), "lr_arm_own": (o, arm), "lr_reference": (o, reference)}
        row |= {k: _lr_of(runs, r.size, r.tokens_per_param, v) for k, (runs, v) in lrs.items()}
        out.append(row | {"n_pairs": int(r.n_pairs)})
    return out
