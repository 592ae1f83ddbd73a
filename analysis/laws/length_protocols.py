"""The training-length study under two lr protocols, side by side: every budget at one shared peak lr (one WSD trunk
per run, the lr tuned at the smallest budget) against every budget at its own tuned lr (conf/tuned_lr/*.yaml
``lr_per_budget``). Per (rung, budget) cell: the arm's same-seed Δ under each protocol, how much the Δ moved
(per seed, Δ_own - Δ_shared), and how much each arm's own loss gained from its budget's lr (per seed, L_own -
L_shared; negative: the budget's own lr trains better); per rung: Δ at the largest budget minus Δ at the smallest,
under each protocol, which says whether "the arm's gain grows with training length" survives the fair lrs. And
best against best (:func:`best_against_best`): where the arm also ran at its own optimum for a budget (the study's
``lr_protocol`` per_arm runs, :func:`split_best`), its Δ there against the reference at the reference's own optimum.

Everything is a same-seed comparison on the seeds both tables hold (analysis.laws.paired, 95% t intervals), so
the two studies must share seeds. ``python -m analysis length --compare-to <the other protocol's results>``
(analysis.studies.training_length); its text: analysis.render.length_protocols_text.

Numbers only: plain functions on tidy DataFrames; no torch.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ..io.token_budget import tokens_per_param
from .paired import paired_comparison

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


BEST = "best"  # the arm at its own optimum (the condition value of best_against_best)


def split_best(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """A study's runs under the paper's protocol, and those under ``lr_protocol`` per_arm (an arm at its own tuned
    lr) where the study holds both (else None): the per-arm runs are the best-against-best cells, never pooled with
    the study proper."""
    if "lr_protocol" not in df.columns:
        return df, None
    per_arm = (df["lr_protocol"] == "per_arm").to_numpy()
    if not per_arm.any() or per_arm.all():
        return df, None
    return df[~per_arm], df[per_arm]


def best_against_best(
    own: pd.DataFrame, best: pd.DataFrame, arm: str = "block_attnres", reference: str = "baseline"
) -> list[dict[str, Any]]:
    """Each arm at its own optimum, per (rung, budget) cell that ``best`` holds: ``best`` has the ``arm``'s runs at
    its own optimum lr for that budget (e.g. ``lr_protocol=per_arm`` with a per-budget tuned-lr file), ``own`` the
    per-budget study (the ``reference`` at its own optimum, the ``arm`` at the reference's lr). One dict per cell,
    on the seeds all three runs share: ``delta_best`` = arm at its optimum - reference at its optimum and
    ``delta_own`` = arm at the reference's lr - reference, each with its 95% t interval (``_ci95``), ``arm_gain`` =
    Δ_best - Δ_own (the arm's loss at its own lr - at the reference's, per seed; negative: its own lr trains it
    better) with ``arm_gain_ci95``, the two lrs of the arm and the reference's, and ``n_pairs``."""
    mine = _completed(best, BEST)
    mine = mine[mine["variant"] == arm]
    if mine.empty:
        return []
    cells = set(zip(mine["size"], mine["tokens_per_param"]))
    o = _completed(own, OWN)
    in_cells = pd.Series([k in cells for k in zip(o["size"], o["tokens_per_param"])], index=o.index)
    o = o[in_cells & o["variant"].isin([arm, reference])]
    ref = o[o["variant"] == reference]
    both = pd.concat([o, mine, ref.assign(protocol=BEST)], ignore_index=True)
    table = paired_comparison(both, reference, [arm], CELLS, "protocol")
    out = []
    for r in table.itertuples():
        out.append(
            {
                "size": str(r.size),
                "tokens_per_param": float(r.tokens_per_param),
                "seeds": r.seeds,
                "delta_best": _num(getattr(r, f"delta_{BEST}")),
                "delta_best_ci95": getattr(r, f"delta_{BEST}_ci95"),
                "delta_own": _num(getattr(r, f"delta_{OWN}")),
                "delta_own_ci95": getattr(r, f"delta_{OWN}_ci95"),
                # the interaction is Δ_first - Δ_second = Δ_own - Δ_best: the arm's gain is its negative
                "arm_gain": -float(r.interaction),
                "arm_gain_ci95": [-r.interaction_ci95[1], -r.interaction_ci95[0]] if r.interaction_ci95 else None,
                "lr_arm_best": _lr_of(mine, r.size, r.tokens_per_param, arm),
                "lr_arm_own": _lr_of(o, r.size, r.tokens_per_param, arm),
                "lr_reference": _lr_of(o, r.size, r.tokens_per_param, reference),
                "n_pairs": int(r.n_pairs),
            }
        )
    return out
