"""The training step, defined once: what ``experiments.train`` (LMModule under Lightning) runs per micro-batch, and
what every loop outside Lightning runs for it (the benchmark's timed steps, experiments.bench.runner, and the
harness comparison's plain loop, experiments.bench.harness).

* :func:`train_forward` - the forward a run trains through: the model itself (eager), the model with its sublayers
  compiled (``"regional"``, Transformer.compile_regions) or ``torch.compile`` of the whole model (``"whole"``).
  LMModule.setup builds its training forward with it.
* :func:`training_loss` - forward of (x, y) to the mean next-token loss, and the divergence check (a NaN or
  infinite loss raises :class:`DivergedError`). LMModule.training_step is this call.
* :class:`TrainStep` - the rest of the step as Lightning's automatic optimization runs it for LMModule: backward
  of the loss (divided by the accumulation count under gradient accumulation), then after every ``accumulate``
  micro-batches global-norm gradient clipping (trainer.gradient_clip_val), optimizer.step, the per-step scheduler
  step and zero_grad. The loops outside Lightning call it; tests/test_bench.py checks the plain loop against the
  trainer's settings.

No Lightning here: ``python -m experiments.bench --harness off`` never imports it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..run.errors import DivergedError


def train_forward(model: Any, compile_mode: str | None) -> Callable[..., Any]:
    """The forward to train ``model`` through. ``compile_mode``: None (eager: the model), "regional" (compiles the
    model's sublayers in place, Transformer.compile_regions, and returns the model) or "whole" (torch.compile of
    the model; the model itself stays eager, for validation and state dicts)."""
    if compile_mode is None:
        return model
    if compile_mode == "regional":
        model.compile_regions()
        return model
    if compile_mode == "whole":
        return torch.compile(model)
    raise ValueError(f"compile_mode={compile_mode!r}; allowed values: None, whole, regional")


def training_loss(
    forward: Callable[..., Any],
    x: torch.Tensor,
    y: torch.Tensor,
    describe: Callable[[float], str] | None = None,
) -> torch.Tensor:
    """The mean next-token loss of one micro-batch through ``forward``; raises DivergedError when it is not finite
    (its message from ``describe(loss value)`` when given)."""
    _, loss = forward(x, y)
    if not torch.isfinite(loss.detach()):
        value = loss.item()
        raise DivergedError(describe(value) if describe else f"training loss is {value}; the run diverged")
    return loss


def _no_context() -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext()


@dataclass
class TrainStep:
    """One micro-batch of training, as Lightning runs it for LMModule (see the module docstring).

    ``forward_context`` / ``backward_context`` make a fresh context manager per call for the forward (e.g. autocast,
    an SDPA backend) and for the backward; ``scheduler`` is stepped once per optimizer step when given; ``clip`` is
    the global gradient-norm limit (None or 0: no clipping). Once per optimizer step an MoE model's balancing bias
    is updated (``Transformer.update_moe_bias``, as LMModule.on_before_optimizer_step does; nothing for a dense
    model). Calling it returns the micro-batch's loss, detached."""

    model: Any  # an attnres.Transformer
    forward: Callable[..., Any]
    optimizer: torch.optim.Optimizer
    scheduler: Any = None
    clip: float | None = None
    accumulate: int = 1
    forward_context: Callable[[], contextlib.AbstractContextManager[Any]] = _no_context
    backward_context: Callable[[], contextlib.AbstractContextManager[Any]] = _no_context
    micro_batches: int = 0  # done so far

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self.forward_context():
            loss = training_loss(self.forward, x, y)
        with self.backward_context():  # Lightning scales micro-batch losses under accumulation the same way
            (loss / self.accumulate if self.accumulate > 1 else loss).backward()
        self.micro_batches += 1
        if self.micro_batches % self.accumulate == 0:
            if self.clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), float(self.clip))
            self.model.update_moe_bias()
            self.optimizer.step()
            if self.scheduler is not None:
                self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()
