"""The Lightning objects of a run, built from its config: the callbacks (:func:`instantiate_callbacks`,
:func:`fault_callbacks`), the loggers (:func:`instantiate_loggers`) and the trainer (:func:`instantiate_trainer`).

``cfg.trainer`` gives every trainer setting but the four derived from the run's plan (:func:`planned_trainer_kwargs`).
experiments.train and the harness benchmark's plain loop (experiments.bench.harness) build their trainers here, so
the two cannot run with different settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from .run_plan import RunPlan


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


def fault_callbacks(cfg: DictConfig) -> list[Any]:
    """The fault injectors that ``cfg.fault`` asks for (tests only: a kill, NaN, signal or exception at a step)."""
    from .callbacks import KillAtStep, NaNAtStep, RaiseAtStep, SignalAtStep

    fault, callbacks = cfg.fault, []
    if fault.get("kill_at_step") is not None:
        callbacks.append(KillAtStep(int(fault.kill_at_step)))
    if fault.get("nan_at_step") is not None:
        callbacks.append(NaNAtStep(int(fault.nan_at_step)))
    if fault.get("signal_at_step") is not None:
        callbacks.append(
            SignalAtStep(
                int(fault.signal_at_step),
                str(fault.get("signal", "SIGTERM")),
                str(fault.get("signal_phase", "train")),
                None if fault.get("signal_rank") is None else int(fault.signal_rank),
            )
        )
    if fault.get("raise_at_step") is not None:
        callbacks.append(RaiseAtStep(int(fault.raise_at_step)))
    return callbacks


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
    (experiments.checkpoint_io.AtomicCheckpointIO, added to ``cfg.trainer.plugins`` unless they name a CheckpointIO)."""
    from hydra.utils import instantiate
    from lightning.fabric.plugins import CheckpointIO
    from omegaconf import ListConfig

    from .checkpoint_io import AtomicCheckpointIO

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
