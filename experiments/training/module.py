"""LightningModule: next-token training of an attnres.Transformer, evaluation on the fixed held-out windows,
and the paper's training-dynamics diagnostics (Fig. 5b/c, Fig. 8).

What is measured where:
  * ``on_before_optimizer_step`` (after backward, before clipping): the lr of this step, the global gradient
    norm and each transformer block's gradient norm, on the steps that will be logged or evaluated;
  * ``validation_step``: mean next-token loss over every held-out token, and (``record_diagnostics``) the RMS of
    each block's output, each sublayer's output, and the depth weights alpha of every read, averaged over the
    validation batches.
Writing them (metrics.csv, diagnostics.json, loggers) is the job of experiments.training.callbacks.RunRecorder.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn as nn

from attnres import ModelConfig, Transformer
from attnres.moe import router_statistics

from .compiler import configure_compiler
from .optim import amp_clipping
from .train_step import train_forward, training_loss

__all__ = [
    "COMPILE_ENV",
    "DeadGradientError",
    "LMModule",
    "compile_mode",
    "dead_gradients",
    "group_sizes",
]

COMPILE_ENV = "ATTNRES_COMPILE"  # how compile=true compiles: "whole" or "regional" (default: compile_mode)


def compile_mode(device_type: str) -> str:
    """How ``compile=true`` compiles the model: "whole" (torch.compile of the Transformer: one graph, the residual
    scheme included) or "regional" (Transformer.compile_regions: the attention and MLP sublayers, compiled once and
    shared by every block; the residual scheme eager, on CUDA its Triton kernels). $ATTNRES_COMPILE picks one;
    the default is regional on CUDA and whole elsewhere (why: docs/performance.md)."""
    mode = os.environ.get(COMPILE_ENV, "").strip().lower() or ("regional" if device_type == "cuda" else "whole")
    if mode not in ("whole", "regional"):
        raise ValueError(f"{COMPILE_ENV}={mode!r}; allowed values: whole, regional")
    return mode


class DeadGradientError(RuntimeError):
    """A parameter received no gradient at the first optimizer step (a broken graph: nothing would train it)."""


def dead_gradients(model: nn.Module) -> list[str]:
    """Trainable parameters outside the residual scheme whose gradient is missing or exactly zero.

    At the first step of a randomly initialised model every sublayer weight, norm gain, the embedding and the LM
    head get a gradient; the residual scheme's own parameters may legitimately not (a zero-initialised query
    makes its key-norm gain's gradient zero), so they are not checked. A compiler that drops a gradient while the
    loss stays right is caught here (docs/performance.md)."""
    return [
        name
        for name, p in model.named_parameters()
        if p.requires_grad and not name.startswith("residual.") and (p.grad is None or not bool(p.grad.any()))
    ]


def group_sizes(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Parameters (elements) per optimizer group, ``<optimizer>/<group name>``:
    experiments.training.optim.MuonWithAdamW's own ``group_sizes``, else ``adamw/decay`` etc. from the groups' names."""
    sizes = getattr(optimizer, "group_sizes", None)
    if sizes is not None:
        return dict(sizes)
    kind = type(optimizer).__name__.lower()
    return {
        f"{kind}/{g.get('name', i)}": sum(p.numel() for p in g["params"]) for i, g in enumerate(optimizer.param_groups)
    }


class LMModule(pl.LightningModule):
    def __init__(
        self,
        model_config: ModelConfig,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., Any],
        total_steps: int,
        log_every: int,
        eval_every: int,
        compile: bool = False,
        activation_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        self.model = Transformer(model_config)
        self.model_config = model_config
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.total_steps, self.log_every, self.eval_every = total_steps, log_every, eval_every
        self.compile, self.activation_checkpointing = compile, activation_checkpointing
        self.compile_mode: str | None = None  # set in setup() when compile: "whole" or "regional"
        # Recompute each attention/MLP sublayer in backward (attnres: sublayers, not blocks, because a block
        # mutates the residual scheme's running state; memory only, the numbers are the same).
        self.model.set_activation_checkpointing(bool(activation_checkpointing))
        # Set by the hooks below, read by RunRecorder.
        self.step_stats: dict[str, Any] = {}
        self.optimizer_group_sizes: dict[str, int] = {}  # set by configure_optimizers (RunRecorder writes them)
        self.last_eval: dict[str, Any] | None = None
        self._val_sum = self._val_count = 0.0
        self._diag_sums: dict[str, torch.Tensor] = {}
        self._diag_batches = 0

    # ---- setup ---------------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        # Compile the training forward only; kept out of the module tree so state-dict keys stay plain, and
        # validation (which records diagnostics in Python lists) runs the eager model (regional: the probe path,
        # which calls the sublayers eagerly).
        if "_train_forward" in self.__dict__:
            return
        if self.compile:
            trainer = self._trainer
            device = trainer.strategy.root_device if trainer is not None else next(self.model.parameters()).device
            self.compile_mode = compile_mode(device.type)
            configure_compiler(torch.get_num_threads())
        # experiments.training.train_step
        self.__dict__["_train_forward"] = train_forward(self.model, self.compile_mode)

    @property
    def train_path(self) -> str:
        """Which path trains the model (recorded as ``train_path``): ``eager``, or ``compiled:whole`` /
        ``compiled:regional`` (``compiled`` before setup has chosen the mode)."""
        if not self.compile:
            return "eager"
        return f"compiled:{self.compile_mode}" if self.compile_mode else "compiled"

    def configure_optimizers(self) -> dict[str, Any]:
        trainer = self._trainer  # None outside a Trainer (plain loops, tests)
        kwargs = {}
        if trainer is not None and "amp_clipping" in inspect.signature(self.optimizer_factory).parameters:
            kwargs["amp_clipping"] = amp_clipping(trainer.precision, trainer.gradient_clip_val)  # optim.adamw
        optimizer = self.optimizer_factory(model=self.model, **kwargs)
        self.optimizer_group_sizes = group_sizes(optimizer)
        scheduler = self.scheduler_factory(optimizer, total_steps=self.total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}

    def is_record_step(self, step: int) -> bool:
        """Steps (1-based count of optimizer steps done) that get a metrics row: log and eval steps, the last."""
        return step % self.log_every == 0 or step % self.eval_every == 0 or step == self.total_steps

    # ---- training ------------------------------------------------------------------------------------------
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """experiments.training.train_step.training_loss; Lightning then runs the rest of
        experiments.training.train_step.TrainStep (backward, clipping, optimizer and scheduler step, zero_grad)."""
        x, y = batch
        forward = self.__dict__.get("_train_forward", self.model)
        return training_loss(
            forward,
            x,
            y,
            describe=lambda value: (
                f"training loss is {value} at step {self.global_step + 1} (lr "
                f"{self.trainer.optimizers[0].param_groups[0]['lr']:.3g}); the run diverged"
            ),
        )

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        step = self.global_step + 1  # the optimizer step about to happen
        if step == 1 and "FSDP" not in type(self.trainer.strategy).__name__:  # FSDP grads are flat shards
            dead = dead_gradients(self.model)
            if dead:
                raise DeadGradientError(
                    f"no gradient reached {', '.join(dead[:5])}{' ...' if len(dead) > 5 else ''} at step 1 "
                    f"({len(dead)} parameter tensors{'; compile=true: try compile=false' if self.compile else ''})"
                )
        stats: dict[str, Any] = {"lr": optimizer.param_groups[0]["lr"]}
        if self.is_record_step(step):
            block_sq = []
            for block in self.model.blocks:
                sq = [p.grad.detach().float().pow(2).sum() for p in block.parameters() if p.grad is not None]
                block_sq.append(torch.stack(sq).sum() if sq else torch.zeros((), device=self.device))
            rest = [
                p.grad.detach().float().pow(2).sum()
                for n, p in self.model.named_parameters()
                if p.grad is not None and not n.startswith("blocks.")
            ]
            block_sq_t = torch.stack(block_sq)
            total_sq = block_sq_t.sum() + (torch.stack(rest).sum() if rest else 0.0)
            stats["grad_norm"] = float(total_sq.sqrt())  # before clipping
            stats["block_grad_norm"] = block_sq_t.sqrt().cpu().tolist()
        # MoE (ffn="moe"): the auxiliary-loss-free bias update, once per optimizer step, from the load of this
        # step's micro-batches (summed over ranks); only selection reads the bias, so before or after the
        # optimizer's step is the same. Nothing for a dense model.
        self.model.update_moe_bias()
        if self.is_record_step(step):
            stats["router"] = router_statistics(self.model)  # None for a dense model (RunRecorder: router.csv)
        self.step_stats = stats

    # ---- evaluation ----------------------------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._val_sum, self._val_count = 0.0, 0.0
        self._diag_sums, self._diag_batches = {}, 0

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        (windows,) = batch
        x, y = windows[:, :-1], windows[:, 1:]
        self.model.record_diagnostics = True
        try:
            _, loss = self.model(x, y)
            diag = self.model.diagnostics
        finally:
            self.model.record_diagnostics = False
        n = y.numel()
        self._val_sum += float(loss) * n  # every window has seq_len targets: a token-weighted mean
        self._val_count += n
        for key, value in diag.items():
            v = value.detach().float().cpu()
            self._diag_sums[key] = self._diag_sums.get(key, torch.zeros_like(v)) + v  # NaN stays NaN (invisible)
        self._diag_batches += 1

    def on_validation_epoch_end(self) -> None:
        if self._val_count == 0:
            return
        val_loss = self._val_sum / self._val_count
        diag = {k: v / self._diag_batches for k, v in self._diag_sums.items()}
        out: dict[str, Any] = {
            "step": int(self.global_step),
            "val_loss": val_loss,
            "block_output_rms": diag["block_output_rms"].tolist(),
            "block_grad_norm": self.step_stats.get("block_grad_norm"),
            "sublayer_output_rms": diag["sublayer_output_rms"].tolist(),
        }
        if "depth_weights" in diag:
            out["depth_weights"] = [
                [None if math.isnan(a) else a for a in row] for row in diag["depth_weights"].tolist()
            ]
            out["read_kinds"] = self.model.read_kinds()
            out["source_labels"] = self.model.residual.source_labels()
        self.last_eval = out
        self.log("val/loss", val_loss, prog_bar=True, logger=False, sync_dist=True)  # same value on every rank

    # ---- bookkeeping ---------------------------------------------------------------------------------------
    def num_params(self, non_embedding: bool = False, activated: bool = False) -> int:
        """attnres.Transformer.num_params: all, non-embedding, and (``activated``) only a token's experts."""
        return self.model.num_params(non_embedding=non_embedding, activated=activated)

    def block_modules(self) -> nn.ModuleList:
        return self.model.blocks
