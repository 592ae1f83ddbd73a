"""Optimizer and learning-rate schedule factories (targets of conf/optimizer/*.yaml, conf/scheduler/*.yaml).

Both are instantiated with ``_partial_: true`` and completed inside ``LMModule.configure_optimizers``.
Pure torch (no Lightning).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn


def param_groups(model: nn.Module, weight_decay: float, connection_weight_decay: float = 0.0) -> list[dict[str, Any]]:
    """Split parameters into weight-decay groups.

    * ``decay`` (weight_decay): matrices of the sublayers and the LM head;
    * ``no_decay`` (0): every parameter with dim < 2 (RMSNorm gains) and the token embedding;
    * ``connection`` (connection_weight_decay, default 0): everything under ``residual.`` — the residual
      scheme's own parameters (AttnRes pseudo-queries and key-norm gains, DenseFormer/HC weights), whatever
      their shape. Zero-initialised queries decayed towards zero would fight the very thing being tested, so
      the default is no decay; the value is a recorded setting.
    Empty groups are dropped. Each group carries a ``name`` for logging.
    """
    groups: dict[str, list[nn.Parameter]] = {"decay": [], "no_decay": [], "connection": []}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:  # tied weights appear once
            continue
        seen.add(id(p))
        if name.startswith("residual.") or ".residual." in name:
            groups["connection"].append(p)
        elif p.dim() < 2 or name.endswith("tok_emb.weight"):
            groups["no_decay"].append(p)
        else:
            groups["decay"].append(p)
    wd = {"decay": weight_decay, "no_decay": 0.0, "connection": connection_weight_decay}
    return [{"params": ps, "weight_decay": wd[g], "name": g} for g, ps in groups.items() if ps]


def amp_clipping(precision: Any, gradient_clip_val: Any) -> bool:
    """True when Lightning's mixed-precision plugin (precision '*-mixed') will clip gradients: then a fused
    optimizer is refused (see :func:`adamw`)."""
    return str(precision).endswith("-mixed") and bool(gradient_clip_val)


def adamw(
    model: nn.Module,
    lr: float,
    betas: Sequence[float] = (0.9, 0.95),
    eps: float = 1e-8,
    weight_decay: float = 0.1,
    connection_weight_decay: float = 0.0,
    fused: bool | None = None,
    amp_clipping: bool = False,
) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`.

    ``fused=None`` picks the fused CUDA kernel on a GPU, except with ``amp_clipping`` (Lightning's mixed-precision
    plugin, ``trainer.precision=*-mixed``, with gradient clipping), which refuses to clip the gradients of an
    optimizer that unscales them itself (a fused one); torch's multi-tensor (foreach) kernel is used then."""
    if fused is None:
        fused = next(model.parameters()).is_cuda and not amp_clipping
    elif fused and amp_clipping:
        raise ValueError(
            "optimizer.fused=true cannot be combined with mixed precision (trainer.precision=*-mixed) and "
            "gradient clipping (trainer.gradient_clip_val > 0): Lightning cannot clip a fused optimizer's "
            "gradients. Allowed: optimizer.fused=null (auto) or false, or trainer.gradient_clip_val=0"
        )
    return torch.optim.AdamW(
        param_groups(model, weight_decay, connection_weight_decay),
        lr=lr,
        betas=tuple(betas),
        eps=eps,
        fused=fused or None,
    )


def warmup_cosine_lambda(total_steps: int, warmup_steps: int, min_lr_ratio: float):
    """lr multiplier at optimizer step s (0-based): linear warm-up from 1/warmup to 1 over `warmup_steps`,
    then cosine from 1 to `min_lr_ratio` at s = total_steps - 1 (held there afterwards)."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        decay_steps = max(total_steps - 1 - warmup_steps, 1)
        progress = min((step - warmup_steps) / decay_steps, 1.0)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def warmup_cosine(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    warmup_fraction: float = 0.05,
    min_lr_ratio: float = 0.1,
    warmup_steps: int | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then cosine decay to ``min_lr_ratio`` x peak at the last step (stepped every optimizer step).

    The warm-up length is ``warmup_steps`` when given, else ``round(warmup_fraction * total_steps)`` (>= 1).
    """
    if warmup_steps is None:
        warmup_steps = max(1, round(warmup_fraction * total_steps))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine_lambda(total_steps, warmup_steps, min_lr_ratio))
