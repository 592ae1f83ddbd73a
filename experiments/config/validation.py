"""Config checks before anything heavy runs: :func:`check_config` (every setting the harness reads, failing with
a message naming the key and what is allowed), :func:`check_name` (the names that become directories) and
:func:`check_writable` (the runs root).

Each concern is checked in one place: the ``train`` node and the ``optimizer`` and ``scheduler`` groups by their
structured configs (experiments/config/config_schema.py: types when composed, ranges when check_config builds them),
the model by ``attnres.ModelConfig`` (and each residual scheme's options dataclass; built from ``cfg.model`` by
config_schema.build_model_config), the run-level keys, the trainer and the data here; a run's step count (tokens or
FLOP budget) by experiments.run.run_plan.planned_steps.

Light on purpose: omegaconf, Hydra's ConfigStore (experiments.config.config_schema) and experiments.sizes at import,
torch only where a check needs it (a CUDA device, the model config), so ``experiments.train`` runs these before
Lightning or torch is imported.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib.util
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from results.record import STUDY_KINDS

from ..data.options import check_data_config
from .config_schema import number as _number
from .config_schema import positive_int as _positive_int

ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "auto")
PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true", "64")
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_find_unused_parameters_true", "fsdp", "single_device")

# The names that become paths: <runs_root>/<study>/<variant>_<size>_s<seed>_<hash8> (and the record files named
# after the run id). A bounded, plain file name each: no separator, no leading dot, nothing a shell or a file
# system treats specially; 48 characters keep the longest record file name (timestamp, run id, host, pid) under
# the usual 255-byte limit.
NAME_KEYS = ("study", "size.name", "model.variant")
NAME_MAX_LEN = 48
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
NAME_RULE = f"letters, digits, '-', '_' and '.', starting with a letter or a digit, at most {NAME_MAX_LEN} characters"

# The top-level keys of conf/train.yaml (tests/test_configs.py keeps this equal to the composed config's). Anything
# else at the top (``+trainr.max_steps=3``) is read by no code: refused, so that a typo neither passes silently nor
# becomes part of a run's identity.
TOP_LEVEL_KEYS = (
    "study",
    "study_kind",
    "project",
    "tags",
    "seed",
    "threads",
    "run_id",
    "lr_protocol",
    "force",
    "activation_checkpointing",
    "model",
    "train",
    "fault",
    "size",
    "data",
    "optimizer",
    "scheduler",
    "trainer",
    "logger",
    "callbacks",
    "paths",
    "tuned_lr",
    "compile",  # set by the train_path group, composed after train.yaml's own keys
)


# The Trainer classes whose arguments are checked by name (the trainer node's ``_target_``): the package and, inside
# it, the file defining ``Trainer``. Its ``__init__`` is read with ``ast`` from the installed source, so the names are
# those of the installed version and Lightning is not imported before training (another ``_target_``: not checked).
TRAINER_SOURCES = {
    "lightning.pytorch.Trainer": ("lightning", "pytorch/trainer/trainer.py"),
    "lightning.Trainer": ("lightning", "pytorch/trainer/trainer.py"),
    "pytorch_lightning.Trainer": ("pytorch_lightning", "trainer/trainer.py"),
}
# Trainer arguments the harness passes itself (experiments.training.instantiators.instantiate_trainer): the step
# count and evaluation and logging cadence from train.*, its callbacks, loggers and run directory. A value under
# trainer. would be overridden without a word, so it is refused.
TRAINER_SET_BY_HARNESS = (
    "max_steps",
    "val_check_interval",
    "check_val_every_n_epoch",
    "log_every_n_steps",
    "callbacks",
    "logger",
    "default_root_dir",
)


def closest(word: str, choices: list[str] | tuple[str, ...], n: int = 3) -> str:
    """``"; closest: a, b"`` (difflib) or "" when nothing is close: the tail of an unknown-name message."""
    close = difflib.get_close_matches(word, list(choices), n=n, cutoff=0.5)
    return f"; closest: {', '.join(close)}" if close else ""


def check_name(key: str, value: Any) -> str:
    """``value`` when it is a safe name for a directory (NAME_RULE), else a ValueError naming ``key`` and the rule."""
    if isinstance(value, str) and len(value) <= NAME_MAX_LEN and NAME_PATTERN.fullmatch(value):
        return value
    shown = (
        repr(value)
        if not isinstance(value, str) or len(value) <= 60
        else f"{value[:40]!r}... ({len(value)} characters)"
    )
    raise ValueError(f"{key}={shown} is not a valid name ({key} names a directory under paths.runs_root): {NAME_RULE}")


def check_writable(directory: Path, key: str = "paths.runs_root", min_free_mb: float = 0.0) -> None:
    """Fail with one line unless a file can be created in ``directory`` (or, while it does not exist yet, in its
    nearest existing parent, where it will be created) and its file system has at least ``min_free_mb`` MiB free
    (``paths.min_free_mb``: a disk that is full at launch is refused here, before the run's lock or any file of the
    run is written). Leaves nothing behind."""
    probe_dir = Path(directory)
    while not probe_dir.exists() and probe_dir != probe_dir.parent:
        probe_dir = probe_dir.parent
    try:
        free = shutil.disk_usage(probe_dir).free
    except OSError:
        free = None  # not measurable here: the probe below still finds a file system that refuses a file
    if free is not None and free < min_free_mb * 2**20:
        raise ValueError(
            f"{key}: only {free:,} bytes free on the file system of {probe_dir}, where {directory} would be; a run "
            f"needs at least paths.min_free_mb={min_free_mb:g} MiB (its lock, record and checkpoints): free some "
            "space or choose another directory"
        )
    try:
        fd, name = tempfile.mkstemp(dir=probe_dir, prefix=".attnres-write-test-")
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        raise ValueError(
            f"{key}: cannot write to {probe_dir} ({e.strerror or e}), where {directory} would be; choose a writable "
            f"directory ({key}=<dir>) or fix its permissions"
        ) from None


def _check_structured(node: DictConfig, group: str) -> None:
    """Build a node typed by a structured config, which runs its checks (its ``__post_init__``); a node without
    one (a user's own optimizer file) must at least name a ``_target_``."""
    if dataclasses.is_dataclass(OmegaConf.get_type(node)):
        OmegaConf.to_object(node)
    elif group == "train":
        raise ValueError("the train node has no schema: conf/train.yaml's defaults must list /schema/train@train")
    elif "_target_" not in node:
        raise ValueError(f"{group} needs a _target_ (e.g. {group}={'adamw' if group == 'optimizer' else 'cosine'})")


def check_config(cfg: DictConfig) -> None:
    """Fail before training with a message naming the key and what is allowed (the model's own fields are
    checked by attnres.ModelConfig when experiments.config.config_schema.build_model_config builds it)."""
    extra = [key for key in cfg if key not in TOP_LEVEL_KEYS and key != "hydra"]
    if extra:
        raise ValueError(
            f"{extra[0]} is not a setting: no code reads a top-level key {extra[0]!r} (added with +{extra[0]}...?)"
            f"{closest(str(extra[0]), TOP_LEVEL_KEYS)}; the top-level keys are {', '.join(TOP_LEVEL_KEYS)}"
        )
    for key in NAME_KEYS:
        check_name(key, OmegaConf.select(cfg, key, throw_on_missing=False))
    if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool) or cfg.seed < 0:
        raise ValueError(f"seed={cfg.seed!r} must be an integer >= 0")
    if cfg.threads is not None:
        _positive_int(cfg.threads, "threads")
    for key in ("compile", "activation_checkpointing", "force"):
        if not isinstance(cfg[key], bool):
            raise ValueError(f"{key}={cfg[key]!r} must be true or false")
    for group in ("train", "optimizer", "scheduler"):
        _check_structured(cfg[group], group)
    # trainer
    tr = cfg.trainer
    if tr.get("accelerator") not in ACCELERATORS:
        raise ValueError(f"trainer.accelerator={tr.get('accelerator')!r}; allowed values: {', '.join(ACCELERATORS)}")
    if str(tr.get("precision")) not in PRECISIONS:
        raise ValueError(f"trainer.precision={tr.get('precision')!r}; allowed values: {', '.join(PRECISIONS)}")
    strategy = tr.get("strategy")
    if not (isinstance(strategy, DictConfig) and "_target_" in strategy) and strategy not in STRATEGIES:
        raise ValueError(
            f"trainer.strategy={strategy!r}; allowed values: {', '.join(STRATEGIES)} or a node with "
            "a _target_ (see trainer/fsdp.yaml)"
        )
    strategy_name = str(strategy.get("_target_", "")) if isinstance(strategy, DictConfig) else str(strategy)
    if "fsdp" in strategy_name.lower() and str(cfg.optimizer.get("_target_", "")).endswith(".muon"):
        raise ValueError(
            "optimizer=muon cannot train under FSDP (trainer=fsdp): Muon orthogonalises whole weight matrices and "
            "FSDP hands each rank flat shards of them; allowed: optimizer=adamw with FSDP, or trainer=ddp with muon"
        )
    if tr.get("accelerator") in ("gpu", "cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                f"trainer.accelerator={tr.accelerator!r} but torch sees no CUDA device; use trainer=cpu "
                "(or install a CUDA build of torch on a GPU machine)"
            )
    check_trainer_keys(tr)
    _positive_int(tr.get("accumulate_grad_batches", 1), "trainer.accumulate_grad_batches")
    if tr.get("gradient_clip_val") is not None:
        _number(tr.gradient_clip_val, "trainer.gradient_clip_val", 0, float("inf"))
    check_data_config(cfg.data, prefix="data.")
    min_free_mb(cfg)
    seq_len, context = cfg.train.seq_len, cfg.model.get("max_seq_len")
    if _is_count(seq_len) and _is_count(context) and seq_len > context:
        raise ValueError(
            f"train.seq_len={seq_len} is longer than the model's context, model.max_seq_len={context} (size.seq_len "
            f"sets both): set size.seq_len={seq_len} to train a model of that context, or train.seq_len <= {context}"
        )
    if cfg.get("study_kind", "scaling") not in STUDY_KINDS:
        raise ValueError(f"study_kind={cfg.get('study_kind')!r}; allowed values: {', '.join(STUDY_KINDS)}")


@functools.cache
def trainer_arguments(target: str) -> tuple[str, ...] | None:
    """The keyword arguments of the Trainer class ``target`` (TRAINER_SOURCES), read from its installed source
    without importing it; None for another target or a source that cannot be read (then nothing is checked)."""
    if target not in TRAINER_SOURCES:
        return None
    package, relative = TRAINER_SOURCES[target]
    try:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            return None
        tree = ast.parse((Path(next(iter(spec.submodule_search_locations))) / relative).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, ImportError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Trainer":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    a = item.args
                    if a.kwarg is not None:  # takes any keyword: nothing to check against
                        return None
                    return tuple(x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs) if x.arg != "self")
    return None


def check_trainer_keys(trainer: DictConfig) -> None:
    """Every key of the trainer node is an argument of its Trainer (``+trainer.max_stepz=3`` is refused with the
    closest ones, instead of a TypeError from ``Trainer(...)`` after the run started) and none is one the harness
    sets itself (TRAINER_SET_BY_HARNESS)."""
    allowed = trainer_arguments(str(trainer.get("_target_", "")))
    for key in trainer:
        key = str(key)
        if key == "_target_":
            continue
        if key in TRAINER_SET_BY_HARNESS:
            raise ValueError(
                f"trainer.{key} is set by the harness (experiments/instantiators.py: the step count and the "
                "evaluation and logging cadence come from train.*, callbacks and loggers from their groups), so a "
                f"value here would be ignored; set it through train.* (train.tokens, train.eval_count, "
                "train.log_every), callbacks= or logger= instead"
            )
        if allowed is not None and key not in allowed:
            raise ValueError(
                f"trainer.{key} is not an argument of {trainer.get('_target_')}{closest(key, allowed)}; the ones "
                f"a config may set: {', '.join(k for k in allowed if k not in TRAINER_SET_BY_HARNESS)}"
            )


def min_free_mb(cfg: DictConfig) -> float:
    """``paths.min_free_mb``: the free space (MiB) a launch needs on the runs root's file system (0 when unset)."""
    value = OmegaConf.select(cfg, "paths.min_free_mb", default=0.0)
    return _number(value, "paths.min_free_mb", 0, float("inf"))


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0
