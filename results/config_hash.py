"""A run's identity: ``config_hash`` = sha256 of the resolved config minus the keys in HASH_EXCLUDE (where files
go, loggers, callbacks, device/launch settings, fault injection; the seed is included), with the block geometry
of a scheme that does not read it held at fixed values (CANONICAL_BLOCK_GEOMETRY); and the data's identity,
:func:`data_fingerprint`.

Plain dicts in, hex digests out: standard library only. Composing the config and naming the run from the hash:
experiments.identity.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

# Keys that do not change a run's results: where files go, what mirrors them, how/where it runs. Everything
# else (model, size, data, optimizer, scheduler, train, seed, precision, clipping, accumulation, compile)
# is part of the run's identity. conf/train.yaml points here instead of restating the list.
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
HASH_DROP_IF_NULL = ("train.flops_budget", "model.moe")
# Likewise left out while they hold their default: lr_protocol=baseline is what every run did before it existed
# (the resolved lr itself is always in the hash); model.ffn=dense is the MLP of every run before MoE existed.
HASH_DROP_IF_DEFAULT = (("lr_protocol", "baseline"), ("model.ffn", "dense"))
# Block geometry is read only by the schemes listed here (attnres: ResidualScheme.uses_block_geometry, checked by
# tests/test_configs.py). Any other scheme's identity carries these fixed values instead of the configured ones, so
# model.n_blocks / model.block_size never split its runs; they are the values of the committed cpu_ladder runs
# (its preset sets n_blocks 4 for every variant), so those keep their config_hash.
BLOCK_GEOMETRY_SCHEMES = ("block",)
CANONICAL_BLOCK_GEOMETRY = {"n_blocks": 4, "block_size": None}


def config_hash(resolved: Mapping[str, Any]) -> str:
    """sha256 (first 16 hex) of a resolved, plain config (the caller drops the keys that don't change results:
    :func:`identity_config`).

    Canonical JSON: sorted keys, no whitespace, so the hash does not depend on key order or YAML formatting.
    """
    blob = json.dumps(resolved, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def _drop(tree: dict[str, Any], dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    node: Any = tree
    for p in parents:
        node = node.get(p)
        if not isinstance(node, dict):
            return
    node.pop(leaf, None)


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
        parent, _, leaf = key.rpartition(".")
        node = ident.get(parent) if parent else ident
        if isinstance(node, dict) and leaf in node and node[leaf] == default:
            del node[leaf]
    model = ident.get("model")
    if isinstance(model, dict) and model.get("residual") not in BLOCK_GEOMETRY_SCHEMES:
        for key, value in CANONICAL_BLOCK_GEOMETRY.items():
            if key in model:
                model[key] = value
    return ident


def data_fingerprint(checksum: Mapping[str, Any] | None) -> str:
    """16 hex digits identifying a prepared dataset by its shard checksums (header.json ``checksum``: sha256 of
    train.bin, val.bin and, for BPE, tokenizer.json). Two runs with different fingerprints saw different data."""
    if not checksum:
        return ""
    parts = {k: str(v) for k, v in checksum.items() if k != "algorithm"}
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]
