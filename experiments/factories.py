"""Small factories that Hydra ``_target_``s point at when a Lightning object needs more than its constructor:
the W&B logger (offline unless a key is configured; never a prompt) and the FSDP strategy (wrapping each
``attnres.model.TransformerBlock``, given as import paths in YAML).

Lightning is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

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
