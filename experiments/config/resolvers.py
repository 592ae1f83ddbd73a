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
  ``baseline`` gives every arm the baseline's tuned lr (the paper's protocol), ``per_arm`` each arm its own.
"""

from __future__ import annotations

import os
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


def tuned_lr(table: Any, size: str, variant: str, protocol: str) -> float:
    """The peak lr of ``variant`` at ``size`` under ``protocol`` from a generated table (``lr[variant][size]``).

    Errors name the key to change and what the table holds."""
    if protocol not in LR_PROTOCOLS:
        raise ValueError(f"lr_protocol={protocol!r}; allowed values: {', '.join(LR_PROTOCOLS)}")
    source = ""
    if isinstance(table, DictConfig):
        prov = table.get("provenance") or {}
        source = f" (tuned_lr from {prov.get('source') or prov.get('study') or 'conf/tuned_lr'})"
    lrs = (table.get("lr") if table is not None else None) or {}
    arm = BASELINE_VARIANT if protocol == "baseline" else variant
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


def _lr(size: str, *, _root_: DictConfig) -> float:
    variant = _root_.model.get("variant")
    return tuned_lr(_root_.get("tuned_lr"), str(size), str(variant), str(_root_.get("lr_protocol", "baseline")))


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
