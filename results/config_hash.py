"""A run's identity: ``config_hash`` = sha256 of the resolved config minus the keys in HASH_EXCLUDE (where files
go, loggers, callbacks, device/launch settings, fault injection; the seed is included), canonicalised by four
identity rules: a null HASH_DROP_IF_NULL setting and a HASH_DROP_IF_DEFAULT setting at its default are left out,
the block geometry of a scheme that does not read it is held at fixed values (CANONICAL_BLOCK_GEOMETRY), and a
``_target_`` whose code moved is named as the committed runs recorded it (HASH_TARGET_NAMES); and the data's
identity, :func:`data_fingerprint`.

Plain dicts in, hex digests out: standard library only. Composing the config and naming the run from the hash:
experiments.run.identity.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Collection, Mapping
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
# The identity rules below say which configs are one experiment. Each is part of the definition of config_hash,
# not a convenience for old runs: without it the committed runs' hashes would move (measured when issue 24 asked
# whether they were compatibility code; docs/results_schema.md, "Run identity"), and a relaunch would train them
# again.
#
# Unset means absent: a setting listed here that is null is left out of the identity, so a config that leaves it
# unset is the same experiment as one that does not have the key. ``train.flops_budget`` null = the steps come from
# the size's own length. Without the rule every committed run without a budget (all of docs/results) gets another
# hash: all 24 cases of tests/test_identity_stable.py move. ``model.moe`` null = a dense feed-forward (attnres.moe):
# every dense run's identity stays what it was before MoE existed. ``train.budgets`` null = one run: every run
# (and every branch of a multi-budget launch, whose own config has it null) keeps the identity it had before the key.
HASH_DROP_IF_NULL = ("train.flops_budget", "model.moe", "train.budgets")
# The default protocol is no protocol: ``lr_protocol`` at ``baseline`` (every arm at the baseline's lr, the resolved
# lr itself always in the hash) is left out, so a config that names the default is the config that does not. Without
# it 22 of the 24 cases of tests/test_identity_stable.py move (every run at the shared lr). ``model.ffn`` at
# ``dense`` likewise: the dense MLP is no feed-forward option. ``optimizer.connection_lr_scale`` at 1.0 (the residual
# scheme's own parameters at the optimizer's lr) likewise: without it every committed run's hash moves.
HASH_DROP_IF_DEFAULT = (("lr_protocol", "baseline"), ("model.ffn", "dense"), ("optimizer.connection_lr_scale", 1.0))
# Geometry a scheme does not read is not its identity: block geometry is read only by the schemes the caller names
# (``block_geometry_schemes``: the model library's own statement, attnres.registry.block_geometry_schemes, passed on
# by experiments.run.identity), so any other scheme is hashed with these fixed values in place of the configured
# ones, and model.n_blocks / model.block_size never split its runs.
# The values are those of the first committed ladder (cpu_ladder, n_blocks 4 for every arm): other values would move
# every non-block run's hash. Without the rule the deep ladder's baseline and Full runs (n_blocks = min(8, L_b)) move,
# e.g. docs/results/cpu_deep's baseline_deep_L16_s0 from 4169851232f70b25 to 937217d1758236ca.
CANONICAL_BLOCK_GEOMETRY = {"n_blocks": 4, "block_size": None}
# A ``_target_`` says where the code that builds a node lives, not what the run does: moving that code must not move
# a run's identity. The identity names each moved target (by its current import path) as the committed runs
# recorded it. Issue 38 moved the data module, the optimizers and the schedules from experiments/ into
# experiments/training/; without the rule every committed run's hash moves (all 24 cases of
# tests/test_identity_stable.py). A later move of a hashed target adds its new path here, mapped to the recorded
# name (tests/test_configs.py checks that every key here is a target that imports).
HASH_TARGET_NAMES = {
    "experiments.training.datamodule.TokenDataModule": "experiments.datamodule.TokenDataModule",
    "experiments.training.optim.adamw": "experiments.optim.adamw",
    "experiments.training.optim.muon": "experiments.optim.muon",
    "experiments.training.optim.warmup_cosine": "experiments.optim.warmup_cosine",
    "experiments.training.optim.wsd": "experiments.optim.wsd",
}


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


def _recorded_targets(node: Any) -> None:
    """Rename, in place, every ``_target_`` of the tree that HASH_TARGET_NAMES lists to its recorded name."""
    if isinstance(node, dict):
        target = node.get("_target_")
        if isinstance(target, str) and target in HASH_TARGET_NAMES:
            node["_target_"] = HASH_TARGET_NAMES[target]
        for value in node.values():
            _recorded_targets(value)
    elif isinstance(node, list):
        for value in node:
            _recorded_targets(value)


def identity_config(container: dict[str, Any], block_geometry_schemes: Collection[str]) -> dict[str, Any]:
    """The part of the resolved config that defines the experiment (what config_hash covers): the config minus
    HASH_EXCLUDE, canonicalised by the identity rules (HASH_DROP_IF_NULL, HASH_DROP_IF_DEFAULT,
    CANONICAL_BLOCK_GEOMETRY for a ``model.residual`` not in ``block_geometry_schemes``, HASH_TARGET_NAMES), so that
    two configs of one experiment give one identity."""
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
    if isinstance(model, dict) and model.get("residual") not in block_geometry_schemes:
        for key, value in CANONICAL_BLOCK_GEOMETRY.items():
            if key in model:
                model[key] = value
    _recorded_targets(ident)
    return ident


def data_fingerprint(checksum: Mapping[str, Any] | None) -> str:
    """16 hex digits identifying a prepared dataset by its shard checksums (header.json ``checksum``: sha256 of
    train.bin, val.bin and, for BPE, tokenizer.json). Two runs with different fingerprints saw different data."""
    if not checksum:
        return ""
    parts = {k: str(v) for k, v in checksum.items() if k != "algorithm"}
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]
