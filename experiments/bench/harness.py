"""Lightning's overhead as a number: optimizer steps of ``experiments.train`` against a plain PyTorch loop.

Both sides train the same model (attnres.Transformer of the size, baseline residual) on the same data
(TrainBatches of the same TokenDataModule, experiments.run.run_plan) with the same trainer settings
(experiments.training.instantiators) and the same work per step: forward, cross-entropy, backward (of each micro-batch
under gradient accumulation), global-norm gradient clipping (trainer.gradient_clip_val), AdamW with the harness'
parameter groups, the warm-up/cosine schedule, zero_grad, and reading the loss back to the host (the harness
checks it is finite and records it every step).

The harness side is the real ``experiments.train.train`` with its run recorder, checkpoint callback and the
chosen logger; a StepTimer callback (added through ``+callbacks.bench_timer``) stamps the start of every
training batch. A step's time is the gap between consecutive batch starts, so it includes fetching the
next batch and every per-step callback, exactly as in the plain loop, whose stamps are taken at the same
point. A run of K steps gives K - 1 gaps; the first two are warm-up, so K - 3 steps are timed. Validation runs
only after the last step (eval_count=1) and is not inside any gap. Harness and plain runs alternate (the order
flips every round); the ratio is taken per round between the medians of the two runs, and summarised by median
and IQR over rounds.

Lightning is imported here only, so ``python -m experiments.bench --harness off`` never
imports it. The plain loop's step is experiments.training.train_step.TrainStep, the trainer's own step definition.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig

from ..config.compose import compose
from ..run.run_plan import RunPlan
from ..training.train_step import TrainStep, train_forward
from .machine_load import CoreMonitor
from .sample_stats import summarize
from .settings import BenchSettings
from .shapes import BenchSize

WARMUP_STEPS = 2


class StepTimer(pl.Callback):
    """Stamps the start of every training batch (after its fetch, like the plain loop) and writes the stamps
    to ``path`` as JSON at the end of training."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.stamps: list[float] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if torch.cuda.is_available() and pl_module.device.type == "cuda":
            torch.cuda.synchronize()
        self.stamps.append(time.perf_counter())

    def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if trainer.is_global_zero:
            self.path.write_text(json.dumps({"stamps": self.stamps}))


def _overrides(
    size: BenchSize,
    settings: BenchSettings,
    device: torch.device,
    runs_root: Path,
    seed: int,
    timer_path: Path,
    steps: int,
) -> list[str]:
    tokens = steps * size.batch_size * size.seq_len

    def val(v: Any) -> str:
        return "null" if v is None else str(v)

    o = [
        "model=baseline",
        f"model.n_blocks={size.n_blocks}",
        f"size.name={size.name}",
        f"size.n_layers={size.n_layers}",
        f"size.d_model={size.d_model}",
        f"size.n_heads={size.n_heads}",
        f"size.head_dim={val(size.head_dim)}",
        f"size.d_ff={val(size.d_ff)}",
        f"size.seq_len={size.seq_len}",
        f"size.batch_size={size.batch_size}",
        f"size.tokens={tokens}",
        "size.lr=1e-3",
        f"logger={settings.harness_logger}",
        "study=bench",
        f"seed={seed}",
        "force=true",
        f"paths.runs_root={runs_root}",
        f"paths.hydra_root={runs_root / 'outputs'}",
        "train.eval_count=1",
        "train.val_sequences=2",
        "train.val_batch_size=2",
        "trainer.enable_progress_bar=false",
        "+callbacks.bench_timer._target_=experiments.bench.harness.StepTimer",
        f"+callbacks.bench_timer.path={timer_path}",
    ]
    if device.type == "cuda":
        o += ["trainer=gpu", f"trainer.precision={'bf16-mixed' if settings.bf16 else '32-true'}"]
    else:
        o += [
            "trainer=cpu",
            f"threads={torch.get_num_threads()}",
            f"trainer.precision={'bf16-mixed' if settings.bf16 else '32-true'}",
        ]
    if settings.compile:
        o.append("compile=true")
    if settings.checkpointing:
        o.append("activation_checkpointing=true")
    if settings.data_cache:
        o.append(f"data.cache_dir={settings.data_cache}")
    if settings.data_max_bytes:
        o.append(f"data.max_bytes={settings.data_max_bytes}")
    return o


def harness_run(cfg) -> list[float]:
    """Step times of one experiments.train run (gaps between batch starts, warm-up dropped)."""
    from ..train import train

    timer_path = Path(cfg.callbacks.bench_timer.path)
    train(cfg)
    stamps = json.loads(timer_path.read_text())["stamps"]
    gaps = [b - a for a, b in pairwise(stamps)]
    return gaps[WARMUP_STEPS:]


def plain_trainer(cfg: DictConfig, plan: RunPlan) -> pl.Trainer:
    """The trainer ``experiments.train`` builds for ``cfg`` (experiments.training.instantiators), never fitted: the
    plain loop reads its settings (steps, accumulation, clipping, precision) from it."""
    from ..training.instantiators import instantiate_trainer

    return instantiate_trainer(cfg, plan, callbacks=[], loggers=[], root_dir=Path(cfg.paths.runs_root))


def plain_run(cfg: DictConfig, device: torch.device) -> list[float]:
    """The same steps as the harness, written as a plain loop (no Lightning in the loop): the data and schedule of
    experiments.run.run_plan.plan_run, the settings of :func:`plain_trainer`, and the trainer's step
    (experiments.training.train_step.TrainStep: LMModule's forward and loss, then what Lightning does with them)."""
    plan, trainer, step = _plain_step(cfg, device)
    total, accumulate = trainer.max_steps, trainer.accumulate_grad_batches
    stamps: list[float] = []
    step.model.train()
    for micro_step, (x, y) in enumerate(plan.datamodule.train_dataloader()):  # micro-batches, as Lightning's
        if micro_step == total * accumulate:
            break
        if device.type == "cuda":
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())  # as StepTimer: after the fetch of this micro-batch
        step(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
    gaps = [b - a for a, b in pairwise(stamps)]
    return gaps[WARMUP_STEPS:]


def _plain_step(cfg: DictConfig, device: torch.device) -> tuple[RunPlan, pl.Trainer, TrainStep]:
    """The run plan, the (unfitted) trainer and the TrainStep the plain loop runs: the model, its compiled forward
    (as LMModule.setup), the optimizer LMModule.configure_optimizers builds (foreach instead of fused under mixed
    precision with clipping, so both sides run the same optimizer kernel), the schedule, the trainer's clipping,
    accumulation and autocast (bf16-mixed: autocast, as Lightning's mixed-precision plugin)."""
    from hydra.utils import instantiate

    from attnres import Transformer

    from ..run.run_plan import plan_run
    from ..training.optim import amp_clipping

    plan = plan_run(cfg, progress=False)
    trainer = plain_trainer(cfg, plan)
    if trainer.precision not in ("32-true", "bf16-mixed"):
        raise ValueError(f"the plain loop runs trainer.precision 32-true or bf16-mixed, not {trainer.precision!r}")
    bf16 = trainer.precision == "bf16-mixed"
    clip = trainer.gradient_clip_val
    torch.manual_seed(int(cfg.seed))
    model = Transformer(plan.model_config).to(device)
    if cfg.activation_checkpointing:
        model.set_activation_checkpointing(True)
    from ..training.module import compile_mode  # as LMModule.setup compiles

    forward = train_forward(model, compile_mode(device.type) if cfg.compile else None)
    optimizer = instantiate(cfg.optimizer)(model=model, amp_clipping=amp_clipping(trainer.precision, clip))
    step = TrainStep(
        model,
        forward,
        optimizer,
        scheduler=instantiate(cfg.scheduler)(optimizer, total_steps=trainer.max_steps),
        clip=clip,
        accumulate=trainer.accumulate_grad_batches,
        forward_context=lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16),
    )
    return plan, trainer, step


def compare_harness(
    size: BenchSize,
    settings: BenchSettings,
    device: torch.device,
    steps: int,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Alternating harness and plain runs of ``steps`` steps at ``size`` (module docstring); the JSON entry."""
    log(
        f"\n== harness (experiments.train, Lightning) vs plain loop at {size.name}: {settings.harness_rounds} rounds "
        f"x {steps} steps each ({steps - 1 - WARMUP_STEPS} timed per run), logger={settings.harness_logger}"
    )
    harness_med, plain_med, ratios, busy = [], [], [], []
    harness_all: list[float] = []
    plain_all: list[float] = []
    monitor = CoreMonitor()
    with tempfile.TemporaryDirectory(prefix="attnres_bench_") as tmp:
        for rnd in range(settings.harness_rounds):
            timer_path = Path(tmp) / f"timer_{rnd}.json"
            runs_root = Path(tmp) / f"round{rnd}"
            cfg = compose(_overrides(size, settings, device, runs_root, settings.seed + rnd, timer_path, steps))
            monitor.start()
            sides = ("harness", "plain") if rnd % 2 == 0 else ("plain", "harness")
            got: dict[str, list[float]] = {}
            for side in sides:
                got[side] = harness_run(cfg) if side == "harness" else plain_run(cfg, device)
            load = monitor.stop()
            h, p = statistics.median(got["harness"]), statistics.median(got["plain"])
            harness_med.append(h)
            plain_med.append(p)
            ratios.append(h / p)
            harness_all += got["harness"]
            plain_all += got["plain"]
            busy.append(load)
            log(
                f"  round {rnd + 1}: harness {h:.4f} s/step, plain {p:.4f} s/step, ratio {h / p:.3f}"
                + (f" (other cores busy {load:.2f})" if load is not None else "")
            )
    samples = {"harness": harness_all, "plain": plain_all, "harness_med": harness_med, "plain_med": plain_med}
    return _harness_result(size, settings, device, steps, samples, ratios, busy)


def _harness_result(
    size: BenchSize,
    settings: BenchSettings,
    device: torch.device,
    steps: int,
    samples: dict[str, list[float]],
    ratios: list[float],
    busy: list[float | None],
) -> dict[str, Any]:
    """The section's JSON entry for one size, with its check (harness step <= 1.03 x plain)."""
    harness_all, plain_all = samples["harness"], samples["plain"]
    harness_med, plain_med = samples["harness_med"], samples["plain_med"]
    busy_known = [b for b in busy if b is not None]
    return {
        "size": size.to_dict(),
        "steps_per_run": steps,
        "warmup_steps": WARMUP_STEPS,
        "rounds": settings.harness_rounds,
        "logger": settings.harness_logger,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "harness_step_s": summarize(harness_all),
        "plain_step_s": summarize(plain_all),
        "harness_run_median_s": harness_med,
        "plain_run_median_s": plain_med,
        "ratio": summarize(ratios),
        "other_cores_busy": summarize(busy_known) if busy_known else None,
        "check": {
            "name": "harness step <= 1.03x plain loop",
            "value": statistics.median(ratios),
            "limit": 1.03,
            "pass": statistics.median(ratios) <= 1.03,
        },
    }


def print_harness(res: dict[str, Any], log: Callable[[str], None] = print) -> None:
    r = res["ratio"]
    c = res["check"]
    log(
        f"-- harness vs plain at {res['size']['name']}: harness {res['harness_step_s']['median']:.4f} s/step, plain "
        f"{res['plain_step_s']['median']:.4f} s/step; ratio {r['median']:.3f} [{r['q1']:.3f}, {r['q3']:.3f}]"
    )
    log(f"  [{'PASS' if c['pass'] else 'FAIL'}] {c['name']}: {c['value']:.3f}")
