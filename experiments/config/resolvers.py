"""The OmegaConf resolvers the configs use, registered explicitly by :func:`register` (idempotent).

Whatever composes or resolves a config calls it first: ``experiments.config.compose.compose`` (the tests, the bench,
``python -m experiments.sizes``), ``experiments.bench.shapes.conf_size`` and ``experiments.train`` (at import,
before ``@hydra.main`` composes, also in a launcher's worker process).

* ``${attnres_pid:}`` -- this process's id (keeps concurrent launches' Hydra directories apart);
* ``${attnres_scale:<value>,<factor>}`` -- an int budget scaled by a factor (the quick study's short runs);
* ``${attnres_arch:<field>,<N>,<d/L_b>,<H/L_b>,<head_dim>,<d_ff/d>,<d multiple>,<d_ff multiple>}`` -- one field of
  a derived shape (experiments.sizes.derive_arch_shape; conf/size/paper_arch.yaml);
* ``${attnres_map:<field>,<L_b>,<d_model>[,<head_dim>]}`` -- one field of a depth-by-width map cell
  (experiments.sizes.map_cell; head_dim 16 unless given; conf/size/cpu_map.yaml, and the deep ladder's rungs,
  conf/size/cpu_deep.yaml);
* ``${attnres_moe_shared:<L_b>,<d_model>,<attn_dim>,<d_ff>,<n_experts>,<top_k>,<n_shared>,<target N>}`` -- the
  shared-expert width whose activated MoE N is closest to a target
  (experiments.sizes.solve_shared_d_ff; conf/size/cpu_deep_moe.yaml);
* ``${attnres_lr:<size name>}`` -- the tuned peak learning rate of this run, from the generated table
  ``tuned_lr`` (conf/tuned_lr/*.yaml, written by ``python -m analysis lr``) under ``lr_protocol``:
  ``baseline`` gives every arm the baseline's tuned lr (the paper's protocol), ``per_arm`` each arm its own. Where
  the table tunes the arm and size per budget (``lr_per_budget[arm][size][tokens per parameter]``), the lr of the
  run's own budget (:func:`run_budget`); else ``lr[arm][size]``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..sizes import ARCH_SHAPE_FIELDS, MAP_CELL_FIELDS, MAP_HEAD_DIM, derive_arch_shape, map_cell, solve_shared_d_ff

LR_PROTOCOLS = ("baseline", "per_arm")
BASELINE_VARIANT = "baseline"


def _arch_field(
    field: str,
    target_params: float,
    d_over_lb: float,
    heads_over_lb: float,
    head_dim: int,
    ff_ratio: float,
    d_multiple: int,
    ff_multiple: int,
) -> int:
    if field not in ARCH_SHAPE_FIELDS:
        raise ValueError(f"attnres_arch: unknown field {field!r}; allowed values: {', '.join(ARCH_SHAPE_FIELDS)}")
    shape = derive_arch_shape(target_params, d_over_lb, heads_over_lb, head_dim, ff_ratio, d_multiple, ff_multiple)
    return int(getattr(shape, field))


def _map_field(field: str, n_layers: int, d_model: int, head_dim: int = MAP_HEAD_DIM) -> int:
    if field not in MAP_CELL_FIELDS:
        raise ValueError(f"attnres_map: unknown field {field!r}; allowed values: {', '.join(MAP_CELL_FIELDS)}")
    return int(getattr(map_cell(int(n_layers), int(d_model), int(head_dim)), field))


def _moe_shared_width(
    n_layers: int, d_model: int, attn_dim: int, d_ff: int, n_experts: int, top_k: int, n_shared: int, target: float
) -> int:
    dims = (int(n_layers), int(d_model), int(attn_dim), int(d_ff), int(n_experts), int(top_k), int(n_shared))
    return solve_shared_d_ff(*dims, target=float(target), multiple=1)


def _arm(variant: str, protocol: str) -> str:
    """The arm whose tuned lr a run of ``variant`` takes under ``protocol``."""
    if protocol not in LR_PROTOCOLS:
        raise ValueError(f"lr_protocol={protocol!r}; allowed values: {', '.join(LR_PROTOCOLS)}")
    return BASELINE_VARIANT if protocol == "baseline" else variant


def _source(table: Any) -> str:
    if not isinstance(table, DictConfig):
        return ""
    prov = table.get("provenance") or {}
    return f" (tuned_lr from {prov.get('source') or prov.get('study') or 'conf/tuned_lr'})"


def budget_lrs(table: Any, size: str, variant: str, protocol: str) -> dict[float, float] | None:
    """``lr_per_budget[arm][size]`` of a generated table as {tokens per parameter: peak lr} (the arm chosen by
    ``protocol`` as in :func:`tuned_lr`); None when the table does not tune that arm and size per budget. A budget
    key that is not a positive number is a ValueError naming it."""
    arm = _arm(variant, protocol)
    per_budget = (table.get("lr_per_budget") if table is not None else None) or {}
    by_size = per_budget.get(arm) or {}
    entry = by_size.get(size) if hasattr(by_size, "get") else None
    if not entry:
        return None
    out = {}
    for key, lr in entry.items():
        if isinstance(key, bool) or not isinstance(key, (int, float)) or not key > 0:
            raise ValueError(
                f"lr_per_budget.{arm}.{size} has the budget key {key!r}{_source(table)}; budgets are tokens per "
                "parameter, numbers > 0"
            )
        out[float(key)] = float(lr)
    return out


def _on_edge(table: Any, arm: str, size: str, budget: float) -> bool:
    """Whether the table flags ``arm``'s per-budget optimum at ``size`` and ``budget`` as on its grid's edge
    (``on_edge_per_budget``, written beside ``lr_per_budget``)."""
    flags = ((table.get("on_edge_per_budget") if table is not None else None) or {}).get(arm) or {}
    entry = flags.get(size) if hasattr(flags, "get") else None
    return any(bool(flag) and math.isclose(float(b), budget, rel_tol=1e-9) for b, flag in (entry or {}).items())


def _fmt_budgets(budgets: Iterable[float]) -> str:
    return ", ".join(f"{b:g}" for b in sorted(budgets))


def tuned_lr(table: Any, size: str, variant: str, protocol: str, budget: float | None = None) -> float:
    """The peak lr of ``variant`` at ``size`` under ``protocol`` from a generated table: ``lr_per_budget[arm][size]
    [budget]`` where the table tunes that arm and size per budget (``budget``: the run's tokens per parameter,
    matched with relative tolerance 1e-9), else ``lr[arm][size]`` (``budget`` is then not read).

    Errors name the key to change and what the table holds, on one line."""
    arm = _arm(variant, protocol)
    source = _source(table)
    per_budget = budget_lrs(table, size, variant, protocol)
    if per_budget is not None:
        tuned = _fmt_budgets(per_budget)
        if budget is None:
            raise ValueError(
                f"tuned_lr tunes arm {arm!r} at size {size!r} per budget{source} (lr_per_budget; tuned budgets: "
                f"{tuned}), but this run's tokens per parameter are unknown: set size.tokens_per_param, or "
                "train.tokens and size.target_params, or size.lr=..."
            )
        hits = [lr for b, lr in per_budget.items() if math.isclose(b, budget, rel_tol=1e-9)]
        if not hits:
            raise ValueError(
                f"no tuned lr for budget {budget:g} tokens/parameter of arm {arm!r} at size {size!r}{source} "
                f"(lr_per_budget); tuned budgets: {tuned}; tune it (python -m analysis lr --write-config) or set "
                "size.lr=..."
            )
        value = hits[0]
        if not value > 0:
            raise ValueError(
                f"tuned lr of {arm!r} at {size!r}, budget {budget:g}, is {value!r}{source}; it must be > 0"
            )
        if _on_edge(table, arm, size, budget):
            raise ValueError(
                f"the tuned lr of arm {arm!r} at size {size!r}, budget {budget:g} tokens/parameter ({value:.4g}) lies "
                f"on its lr grid's edge{source} (on_edge_per_budget: the optimum is not located); extend the grid "
                "(python -m analysis lr prints the launch that does) or set size.lr=..."
            )
        return value
    lrs = (table.get("lr") if table is not None else None) or {}
    if arm not in lrs:
        hint = (
            "run the LR study for every arm (python -m sweeps.study lr --arms all) or use lr_protocol=baseline"
            if protocol == "per_arm"
            else "run the LR study (python -m sweeps.study lr)"
        )
        raise ValueError(
            f"lr_protocol={protocol}: no tuned lr for arm {arm!r}{source}; tuned arms: "
            f"{', '.join(map(str, lrs)) or 'none'}; {hint}, or set size.lr=..."
        )
    by_size = lrs[arm]
    if size not in by_size:
        raise ValueError(
            f"no tuned lr for size {size!r} of arm {arm!r}{source}; tuned sizes: "
            f"{', '.join(map(str, by_size))}; tune it (python -m sweeps.study lr) or set size.lr=..."
        )
    value = float(by_size[size])
    if not value > 0:
        raise ValueError(f"tuned lr of {arm!r} at {size!r} is {value!r}{source}; it must be > 0")
    return value


def run_budget(root: DictConfig, tuned: Iterable[float] = ()) -> float | None:
    """A run's length in tokens per parameter: ``size.tokens_per_param`` when the size has it, else ``train.tokens
    / size.target_params`` (snapped to a ``tuned`` budget B whose ``round(B * target_params)`` is exactly
    ``train.tokens``: the length experiments.run.budgets gives B); None when neither can be read (a FLOP-budget
    run)."""
    size = root.size
    per_param = size.get("tokens_per_param")
    if per_param is not None:
        return float(per_param)
    tokens, target = OmegaConf.select(root, "train.tokens"), size.get("target_params")
    if tokens is None or target is None or not float(target) > 0:
        return None
    for b in tuned:
        if round(b * float(target)) == tokens:
            return b
    return float(tokens) / float(target)


def _lr(size: str, *, _root_: DictConfig) -> float:
    """``${attnres_lr:<size>}``. A multi-budget launch's own config (``train.budgets`` set; each budget runs as its
    own config, experiments.run.budgets) takes the largest budget's lr, once every budget is found tuned."""
    table, size = _root_.get("tuned_lr"), str(size)
    variant, protocol = str(_root_.model.get("variant")), str(_root_.get("lr_protocol", "baseline"))
    per_budget = budget_lrs(table, size, variant, protocol)
    if per_budget is None:
        return tuned_lr(table, size, variant, protocol)
    launch = OmegaConf.select(_root_, "train.budgets")
    if launch:
        lrs = {float(b): tuned_lr(table, size, variant, protocol, float(b)) for b in launch}
        return lrs[max(lrs)]
    return tuned_lr(table, size, variant, protocol, run_budget(_root_, per_budget))


def register() -> None:
    """Register every attnres resolver once (later calls do nothing)."""
    if not OmegaConf.has_resolver("attnres_pid"):
        OmegaConf.register_new_resolver("attnres_pid", lambda: os.getpid(), use_cache=True)
    if not OmegaConf.has_resolver("attnres_scale"):
        OmegaConf.register_new_resolver("attnres_scale", lambda value, factor: round(float(value) * float(factor)))
    if not OmegaConf.has_resolver("attnres_arch"):
        OmegaConf.register_new_resolver("attnres_arch", _arch_field)
    if not OmegaConf.has_resolver("attnres_map"):
        OmegaConf.register_new_resolver("attnres_map", _map_field)
    if not OmegaConf.has_resolver("attnres_moe_shared"):
        OmegaConf.register_new_resolver("attnres_moe_shared", _moe_shared_width)
    if not OmegaConf.has_resolver("attnres_lr"):
        OmegaConf.register_new_resolver("attnres_lr", _lr)
