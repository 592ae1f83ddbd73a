"""A run's identity: ``config_hash`` = sha256 of the resolved config minus the keys in HASH_EXCLUDE (where files
go, loggers, callbacks, device/launch settings, fault injection; the seed is included), with the block geometry
of a scheme that does not read it held at fixed values (CANONICAL_BLOCK_GEOMETRY), and from it the run's id and
directory ``<paths.runs_root>/<study>/<variant>_<size>_s<seed>_<hash8>`` (:func:`run_identity`).

No torch, no Lightning: computed before anything heavy is imported.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from . import records

# Keys that do not change a run's results: where files go, what mirrors them, how/where it runs. Everything
# else (model, size, data, optimizer, scheduler, train, seed, precision, clipping, accumulation, compile)
# is part of the run's identity.
HASH_EXCLUDE = (
    "paths",
    "logger",
    "callbacks",
    "hydra",
    "run_id",
    "study",
    "project",
    "tags",
    "threads",
    "force",
    "fault",
    "tuned_lr",
    "study_kind",
    "activation_checkpointing",
    "train.log_every",
    "data.num_workers",
    "data.cache_dir",
    "trainer.accelerator",
    "trainer.devices",
    "trainer.num_nodes",
    "trainer.strategy",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "trainer.num_sanity_val_steps",
    "trainer.use_distributed_sampler",
    "trainer.deterministic",
    "trainer.plugins",
)
# Settings added after runs were recorded: left out of the hash while unset (null), so that every run recorded
# before they existed keeps its config_hash (and is still found completed on relaunch).
HASH_DROP_IF_NULL = ("train.flops_budget",)
# Likewise left out while they hold their default: lr_protocol=baseline is what every run did before it existed
# (the resolved lr itself is always in the hash).
HASH_DROP_IF_DEFAULT = (("lr_protocol", "baseline"),)
# Block geometry is read only by the schemes listed here (attnres: ResidualScheme.uses_block_geometry, checked by
# tests/test_configs.py). Any other scheme's identity carries these fixed values instead of the configured ones, so
# model.n_blocks / model.block_size never split its runs; they are the values of the committed cpu_ladder runs
# (its preset sets n_blocks 4 for every variant), so those keep their config_hash.
BLOCK_GEOMETRY_SCHEMES = ("block",)
CANONICAL_BLOCK_GEOMETRY = {"n_blocks": 4, "block_size": None}


def _drop(tree: dict[str, Any], dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        tree = tree.get(p)
        if not isinstance(tree, dict):
            return
    tree.pop(leaf, None)


def resolved_container(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain Python, every interpolation resolved (a clear error for missing mandatory keys)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]
    except MissingMandatoryValue as e:
        key = getattr(e, "full_key", None) or str(e)
        hint = " (data=shards needs data.name=<dir of prepared shards>)" if "data.name" in str(key) else ""
        raise ValueError(
            f"config key {key} has no value (???); set it on the command line, e.g. {key}=...{hint}"
        ) from None
    except OmegaConfBaseException as e:
        raise ValueError(f"the config does not resolve: {e}") from None


def identity_config(container: dict[str, Any]) -> dict[str, Any]:
    """The part of the resolved config that defines the experiment (what config_hash covers)."""
    ident = copy.deepcopy(container)
    for key in HASH_EXCLUDE:
        _drop(ident, key)
    for key in HASH_DROP_IF_NULL:
        parent, _, leaf = key.rpartition(".")
        node = ident.get(parent) if parent else ident
        if isinstance(node, dict) and leaf in node and node[leaf] is None:
            del node[leaf]
    for key, default in HASH_DROP_IF_DEFAULT:
        if ident.get(key) == default:
            del ident[key]
    model = ident.get("model")
    if isinstance(model, dict) and model.get("residual") not in BLOCK_GEOMETRY_SCHEMES:
        for key, value in CANONICAL_BLOCK_GEOMETRY.items():
            if key in model:
                model[key] = value
    return ident


def run_identity(cfg: DictConfig) -> tuple[str, str, Path, Path]:
    """(config_hash, run_id, run_dir, study directory) of a composed config. A run directory that is not
    ``<paths.runs_root>/<study>/<run_id>`` once normalised (a name holding a separator or ``..``; the names are
    checked by experiments.validation.check_name first) is a ValueError: nothing is ever written outside the root."""
    container = resolved_container(cfg)
    chash = records.config_hash(identity_config(container))
    run_id = f"{cfg.model.variant}_{cfg.size.name}_s{cfg.seed}_{chash[:8]}"
    root = Path(cfg.paths.runs_root).expanduser().resolve()
    study_dir = root / str(cfg.study)
    run_dir = study_dir / run_id
    normal = Path(os.path.normpath(run_dir))
    if normal != run_dir or normal.parent.parent != root or normal.parent.name != str(cfg.study):
        raise ValueError(
            f"the run directory {normal} is not <paths.runs_root>/<study>/<run id> under paths.runs_root={root}: "
            "study, size.name and model.variant must be plain names"
        )
    return chash, run_id, run_dir, study_dir
