"""The Lightning objects of a run, built from its config: the callbacks (:func:`instantiate_callbacks`; the fault
injectors: experiments.training.callbacks.fault_callbacks), the loggers (:func:`instantiate_loggers`) and the trainer
(:func:`instantiate_trainer`), and the factories Hydra ``_target_``s point at when a Lightning object needs more than
its constructor: the W&B logger (:func:`wandb_logger`: offline unless a key is configured; never a prompt) and the
FSDP strategy (:func:`fsdp_strategy`: wrapping each ``attnres.model.TransformerBlock``, given as import paths in
YAML).

``cfg.trainer`` gives every trainer setting but the four derived from the run's plan (:func:`planned_trainer_kwargs`).
experiments.train and the harness benchmark's plain loop (experiments.bench.harness) build their trainers here, so
the two cannot run with different settings. Lightning is imported inside the functions, so importing this module
stays cheap.
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from omegaconf import DictConfig

from ..run.run_plan import RunPlan


def instantiate_callbacks(cfg: DictConfig) -> list[Any]:
    """Every ``cfg.callbacks`` node with a ``_target_`` (a progress bar only while the trainer shows one:
    Lightning rejects the callback otherwise)."""
    from hydra.utils import instantiate

    bar = cfg.trainer.get("enable_progress_bar", True)
    return [
        instantiate(node)
        for node in (cfg.get("callbacks") or {}).values()
        if isinstance(node, DictConfig) and "_target_" in node and (bar or "ProgressBar" not in node._target_)
    ]


def instantiate_loggers(cfg: DictConfig, wandb_id: str) -> list[Any]:
    """Every logger node of ``cfg.logger`` with a ``_target_``; the W&B one gets ``id=wandb_id``."""
    from hydra.utils import instantiate

    loggers = []
    for node in (cfg.get("logger") or {}).values():
        if isinstance(node, DictConfig) and "_target_" in node:
            extra = {"id": wandb_id} if node._target_.endswith("wandb_logger") else {}
            loggers.append(instantiate(node, **extra))
    return loggers


def planned_trainer_kwargs(cfg: DictConfig, plan: RunPlan) -> dict[str, Any]:
    """The trainer settings that come from the plan, not from ``cfg.trainer``: the step count and when to
    evaluate (every ``plan.eval_every`` optimizer steps) and log."""
    return {
        "max_steps": plan.steps,
        "val_check_interval": plan.eval_every,
        "check_val_every_n_epoch": None,
        "log_every_n_steps": int(cfg.train.log_every),
    }


def instantiate_trainer(
    cfg: DictConfig, plan: RunPlan, callbacks: list[Any], loggers: list[Any], root_dir: Path
) -> Any:
    """The lightning.pytorch.Trainer of ``cfg.trainer`` with the plan's settings, ``callbacks`` and ``loggers``
    (none: no logger), writing under ``root_dir``; its checkpoints are saved atomically
    (experiments.run.checkpoint_io.AtomicCheckpointIO, added to ``cfg.trainer.plugins`` unless they name a
    CheckpointIO)."""
    from hydra.utils import instantiate
    from lightning.fabric.plugins import CheckpointIO
    from omegaconf import ListConfig

    from ..run.checkpoint_io import AtomicCheckpointIO

    nodes = cfg.trainer.get("plugins") or []
    plugins = [instantiate(node) for node in (nodes if isinstance(nodes, (list, ListConfig)) else [nodes])]
    if not any(isinstance(p, CheckpointIO) for p in plugins):
        plugins.append(AtomicCheckpointIO())
    return instantiate(
        cfg.trainer,
        **planned_trainer_kwargs(cfg, plan),
        callbacks=callbacks,
        logger=loggers or False,
        default_root_dir=str(root_dir),
        plugins=plugins,
    )


# ---- the factories conf/ names as _target_s ------------------------------------------------------------------------
WANDB_MODES = ("auto", "online", "offline", "disabled")


def wandb_api_key_configured() -> bool:
    """True when W&B could authenticate without asking: WANDB_API_KEY, or a netrc entry for the W&B host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return path.is_file() and netrc.netrc(path).authenticators(host) is not None
    except (netrc.NetrcParseError, OSError):
        return False


def resolve_wandb_mode(mode: str = "auto") -> str:
    """The W&B mode a run will use.

    ``WANDB_MODE`` in the environment wins (tests set ``disabled``/``offline``). ``auto`` is ``online`` when an
    API key is configured, else ``offline`` (files under the run directory, `wandb sync` later). ``online``
    without a key degrades to ``offline`` with a warning instead of prompting or crashing.
    """
    if mode not in WANDB_MODES:
        raise ValueError(f"logger.wandb.mode={mode!r}; allowed values: {', '.join(WANDB_MODES)}")
    env = os.environ.get("WANDB_MODE")
    if env in ("online", "offline", "disabled", "dryrun", "run"):
        mode = {"dryrun": "offline", "run": "online"}.get(env, env)
    elif mode == "auto":
        mode = "online" if wandb_api_key_configured() else "offline"
    if mode == "online" and not wandb_api_key_configured():
        import warnings

        warnings.warn(
            "W&B mode 'online' but no API key is configured (WANDB_API_KEY or `wandb login`): "
            "logging offline instead; upload later with `wandb sync <run_dir>/wandb/offline-run-*`",
            stacklevel=2,
        )
        mode = "offline"
    return mode


def wandb_logger(
    project: str,
    save_dir: str,
    name: str | None = None,
    group: str | None = None,
    job_type: str | None = None,
    tags: Sequence[str] | None = None,
    mode: str = "auto",
    id: str | None = None,
    system_stats: bool | None = None,
    **kwargs: Any,
):
    """Lightning's WandbLogger, offline unless a key is configured. ``id`` lets a resumed run continue its
    W&B run (``resume="allow"``). ``system_stats`` (W&B's CPU/GPU sampling process): None = on when a GPU is
    visible, off on CPU-only machines (where the sampler takes its CPU time from training)."""
    import torch
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    mode = resolve_wandb_mode(mode)
    if system_stats is None:
        system_stats = torch.cuda.is_available()
    if not system_stats:
        kwargs.setdefault("settings", wandb.Settings(x_disable_stats=True, x_disable_machine_info=True))
    os.environ.setdefault("WANDB_SILENT", "true")
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    logger = WandbLogger(
        project=project,
        save_dir=save_dir,
        name=name,
        group=group,
        job_type=job_type,
        tags=list(tags) if tags else None,
        offline=(mode == "offline"),
        mode=mode,
        id=id,
        resume="allow",
        log_model=False,
        **kwargs,
    )
    # Lightning 2.6 always passes anonymous=None, which wandb 0.31 answers with a deprecation warning per run.
    if logger._wandb_init.get("anonymous") is None:
        logger._wandb_init.pop("anonymous", None)
    return logger


def fsdp_strategy(
    auto_wrap: Sequence[str] = ("attnres.model.TransformerBlock",),
    sharding_strategy: str = "FULL_SHARD",
    state_dict_type: str = "full",
    **kwargs: Any,
):
    """FSDPStrategy that wraps every module of the given classes (import paths) as its own FSDP unit."""
    from hydra.utils import get_class
    from lightning.pytorch.strategies import FSDPStrategy

    policy = {get_class(path) for path in auto_wrap}
    return FSDPStrategy(
        auto_wrap_policy=policy, sharding_strategy=sharding_strategy, state_dict_type=state_dict_type, **kwargs
    )
