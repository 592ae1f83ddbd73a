"""Callbacks: the run recorder (the run's own files, the source of truth), the graceful interrupt (SIGINT, SIGTERM,
SIGUSR1: a checkpoint at the current step, then a clean stop) and test-only fault injection (the injectors that
``cfg.fault`` asks for: :func:`fault_callbacks`).

RunRecorder owns, in the run directory:
  * ``metrics.csv`` — one row per logged step: step, tokens, flops, train_loss, val_loss, lr, grad_norm,
    tokens_per_s (val_loss empty where there was no evaluation);
  * ``router.csv`` — MoE runs only (ffn="moe"): one row per logged step, MoE layer and expert: the tokens the
    expert got in that optimizer step (summed over ranks), ``expected`` (tokens per expert under perfect
    balance, N k / E) and the balancing bias after that step's update (analysis.router reads it and draws
    ``fig_router.png`` at the end of the run);
  * ``diagnostics.json`` — the diagnostics of the latest evaluation (docs/results_schema.md §2), and
    ``diagnostics.jsonl`` — one such object per evaluation;
and mirrors the same numbers to the Lightning loggers (W&B, CSV) and the progress bar.

Rows live in memory and the files are rewritten atomically at every evaluation and checkpoint (and every
few log steps). On resume, rows after the restored step are dropped, so a resumed metrics.csv continues
exactly where the checkpoint was taken: no duplicated steps, no gap.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import signal
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig

from results.io import atomic_write_text, utc_now

from ..run import interrupts
from ..run.errors import RunInterrupted
from ..run.run_env import cpu_seconds

METRIC_COLUMNS = ("step", "tokens", "flops", "train_loss", "val_loss", "lr", "grad_norm", "tokens_per_s")
ROUTER_COLUMNS = ("step", "layer", "expert", "tokens", "expected", "bias")  # router.csv (analysis.router)


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    return str(v)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """metrics.csv back as a list of dicts (numbers parsed; empty cells None). A row that does not parse (a torn
    tail, a garbled byte) is dropped with a warning naming the file and line, like a ledger row."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.DictReader(f)
        for raw in reader:
            try:
                row: dict[str, Any] = {}
                for k, v in raw.items():
                    if k is None or v is None:  # more fields than the header, or fewer (restval)
                        raise ValueError("the row has the wrong number of fields")
                    if v in ("", None):
                        row[k] = None
                    elif k == "step" or k == "tokens":
                        row[k] = int(float(v))
                    else:
                        row[k] = float(v)
                if row.get("step") is None:
                    raise ValueError("no step")
            except ValueError as e:
                warnings.warn(f"{path}:{reader.line_num}: unreadable metrics row dropped ({e})", stacklevel=2)
                continue
            rows.append(row)
    return rows


class RunRecorder(pl.Callback):
    def __init__(
        self,
        run_dir: str | Path,
        tokens_per_step: int,
        flops_per_token: float,
        variant: str,
        residual: str,
        flush_every: int = 10,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.tokens_per_step, self.flops_per_token = tokens_per_step, flops_per_token
        self.variant, self.residual = variant, residual
        self.flush_every = flush_every
        self.rows: dict[int, dict[str, Any]] = {}
        self.diagnostics: list[dict[str, Any]] = []
        self.router_rows: dict[int, list[tuple[Any, ...]]] = {}  # step -> router.csv rows (MoE runs)
        self.started_at = utc_now()
        self.prior_wall_s = 0.0  # wall time of earlier launches, up to their last checkpoint
        self.prior_cpu_s = 0.0  # the same in CPU time
        self.session_start = time.time()
        self.session_cpu_start = cpu_seconds()
        self._tick: tuple[int, float] | None = None
        # steady-state step time: CPU seconds from this launch's second logged step on, evaluations excluded
        self._record_steps_seen = 0
        self._steady_mark: tuple[int, float, float] | None = None  # (step, cpu seconds, eval cpu seconds so far)
        self._eval_cpu_s = 0.0
        self._eval_cpu_start: float | None = None
        self._records_since_flush = 0
        self._ready = False  # set once existing files were read (on_fit_start); never overwrite them before

    # ---- files ------------------------------------------------------------------------------------------------
    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.csv"

    @property
    def router_path(self) -> Path:
        return self.run_dir / "router.csv"

    def flush(self) -> None:
        if not self._ready:
            return
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(METRIC_COLUMNS)
        for step in sorted(self.rows):
            w.writerow([_fmt(self.rows[step].get(c)) for c in METRIC_COLUMNS])
        atomic_write_text(self.metrics_path, buf.getvalue())
        if self.router_rows:
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            w.writerow(ROUTER_COLUMNS)
            for step in sorted(self.router_rows):
                w.writerows([[_fmt(v) for v in row] for row in self.router_rows[step]])
            atomic_write_text(self.router_path, buf.getvalue())
        if self.diagnostics:
            atomic_write_text(
                self.run_dir / "diagnostics.jsonl", "".join(json.dumps(d) + "\n" for d in self.diagnostics)
            )
            atomic_write_text(self.run_dir / "diagnostics.json", json.dumps(self.diagnostics[-1], indent=1) + "\n")
        self._records_since_flush = 0

    def _load_existing(self, upto_step: int) -> None:
        """Keep what an earlier launch wrote up to the restored step (nothing when starting from scratch)."""
        self.rows = {r["step"]: r for r in read_metrics(self.metrics_path) if r["step"] <= upto_step}
        self.router_rows = {}
        if self.router_path.is_file():
            with self.router_path.open(newline="", encoding="utf-8", errors="replace") as f:
                for row in csv.DictReader(f):
                    try:  # a torn tail line (a field missing or garbled) is dropped, like a metrics row
                        step, layer, expert = (int(row[c]) for c in ROUTER_COLUMNS[:3])
                        values = tuple(float(row[c]) for c in ROUTER_COLUMNS[3:])
                    except (TypeError, ValueError):
                        continue
                    if step <= upto_step:
                        self.router_rows.setdefault(step, []).append((step, layer, expert, *values))
        self.diagnostics = []
        path = self.run_dir / "diagnostics.jsonl"
        if path.is_file():
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                    step = int(d["step"])
                except (ValueError, TypeError, KeyError) as e:  # a torn tail line: dropped, like a ledger row
                    warnings.warn(f"{path}:{n}: unreadable diagnostics line dropped ({type(e).__name__})", stacklevel=2)
                    continue
                if step <= upto_step:
                    self.diagnostics.append(d)

    def wall_time_s(self) -> float:
        return self.prior_wall_s + (time.time() - self.session_start)

    def cpu_time_s(self) -> float:
        return self.prior_cpu_s + (cpu_seconds() - self.session_cpu_start)

    def step_cpu_s(self, step: int) -> float | None:
        """CPU seconds per optimizer step in the steady state of this launch, up to ``step``: from its second logged
        step on (the first logged interval holds the compilation and the first steps' costs), evaluations
        excluded; None when this launch logged fewer than two intervals. A record's ``step_cpu_s``."""
        if self._steady_mark is None or step <= self._steady_mark[0]:
            return None
        mark_step, mark_cpu, mark_eval = self._steady_mark
        return (cpu_seconds() - mark_cpu - (self._eval_cpu_s - mark_eval)) / (step - mark_step)

    def health_flags(self, total_steps: int) -> list[str]:
        """The outlier rule's curve flags of this run so far (analysis.health: spike, plateau)."""
        from analysis.health import curve_flags

        rows = [self.rows[s] for s in sorted(self.rows)]
        return curve_flags(
            [r["step"] for r in rows],
            [r.get("train_loss") for r in rows],
            [r["step"] for r in rows if r.get("val_loss") is not None],
            [r["val_loss"] for r in rows if r.get("val_loss") is not None],
            total_steps,
        )

    @property
    def last_train_loss(self) -> float | None:
        for step in sorted(self.rows, reverse=True):
            if self.rows[step].get("train_loss") is not None:
                return self.rows[step]["train_loss"]
        return None

    @property
    def last_eval(self) -> dict[str, Any] | None:
        return self.diagnostics[-1] if self.diagnostics else None

    # ---- Lightning hooks ----------------------------------------------------------------------------------
    def ensure_loaded(self, trainer: pl.Trainer) -> None:
        """Read what earlier launches wrote, up to the restored step (once, after the checkpoint was restored)."""
        if not self._ready and trainer.is_global_zero:
            self._load_existing(trainer.global_step)
            self._ready = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # on_train_start, not on_fit_start: the loops' state (global_step) is restored in between.
        self.ensure_loaded(trainer)
        self._tick = (trainer.global_step, time.time())
        sizes = getattr(pl_module, "optimizer_group_sizes", None)
        if sizes and trainer.is_global_zero:  # how many parameters each optimizer group trains
            atomic_write_text(self.run_dir / "optimizer_groups.json", json.dumps(sizes, indent=1) + "\n")
            for lg in trainer.loggers:
                lg.log_hyperparams({f"optimizer_groups/{k}": v for k, v in sizes.items()})

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.ensure_loaded(trainer)  # a validate() without fit (resumed at the last step)
        self._eval_cpu_start = cpu_seconds()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        bar = trainer.progress_bar_callback is not None  # self.log costs ~1 ms a step: only for a visible bar
        if not (bar or pl_module.is_record_step(step)):
            return
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        loss_f = float(loss.detach())
        if bar:
            pl_module.log("loss", loss_f, prog_bar=True, logger=False, on_step=True, on_epoch=False)
        if not pl_module.is_record_step(step):
            return
        self._record_steps_seen += 1
        if self._record_steps_seen == 2:
            self._steady_mark = (step, cpu_seconds(), self._eval_cpu_s)
        now = time.time()
        last_step, last_t = self._tick or (step - 1, now)
        tok_s = (step - last_step) * self.tokens_per_step / max(now - last_t, 1e-9)
        self._tick = (step, now)
        stats = pl_module.step_stats
        tokens = step * self.tokens_per_step
        row = {
            "step": step,
            "tokens": tokens,
            "flops": tokens * self.flops_per_token,
            "train_loss": loss_f,
            "val_loss": None,
            "lr": stats.get("lr"),
            "grad_norm": stats.get("grad_norm"),
            "tokens_per_s": tok_s,
        }
        if bar:
            pl_module.log("tok/s", tok_s, prog_bar=True, logger=False, on_step=True, on_epoch=False)
        if not trainer.is_global_zero:
            return
        self.rows[step] = row
        metrics = {f"train/{k}": v for k, v in row.items() if k not in ("step", "val_loss") and v is not None}
        router = stats.get("router")
        if router is not None:
            metrics.update(self._record_router(step, router))
        for lg in trainer.loggers:
            lg.log_metrics(metrics, step=step)
        self._records_since_flush += 1
        if self._records_since_flush >= self.flush_every:
            self.flush()

    def _record_router(self, step: int, router: dict[str, Any]) -> dict[str, float]:
        """Keep one optimizer step's router statistics (attnres.moe.router_statistics) as router.csv rows; return
        their summary for the loggers: load max / mean and min / mean over experts (the worst layer), the bias
        range and the dropped (token, expert) pairs, N k minus the pairs routed (0 for a dropless router)."""
        load, bias = router["load"], router["bias"]
        n_experts = len(load[0])
        expected = self.tokens_per_step * router["top_k"] / n_experts
        self.router_rows[step] = [
            (step, layer, e, load[layer][e], expected, bias[layer][e])
            for layer in range(len(load))
            for e in range(n_experts)
        ]
        means = [sum(row) / n_experts for row in load]
        return {
            "router/load_max_over_mean": max((max(row) / m for row, m in zip(load, means) if m > 0), default=math.nan),
            "router/load_min_over_mean": min((min(row) / m for row, m in zip(load, means) if m > 0), default=math.nan),
            "router/bias_min": min(min(row) for row in bias),
            "router/bias_max": max(max(row) for row in bias),
            "router/dropped": sum(self.tokens_per_step * router["top_k"] - sum(row) for row in load),
        }

    def on_validation_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if self._eval_cpu_start is not None:
            self._eval_cpu_s += cpu_seconds() - self._eval_cpu_start
            self._eval_cpu_start = None
        ev = pl_module.last_eval
        if ev is None or trainer.sanity_checking or not trainer.is_global_zero:
            return
        step = ev["step"]
        tokens = step * self.tokens_per_step
        row = self.rows.setdefault(step, {"step": step, "tokens": tokens, "flops": tokens * self.flops_per_token})
        row["val_loss"] = ev["val_loss"]
        diag = {"step": step, "variant": self.variant, "residual": self.residual, "val_loss": ev["val_loss"]}
        diag.update({k: v for k, v in ev.items() if k not in ("step", "val_loss")})
        self.diagnostics = [d for d in self.diagnostics if d["step"] != step] + [diag]
        metrics: dict[str, float] = {
            "val/loss": ev["val_loss"],
            "val/tokens": tokens,
            "val/flops": tokens * self.flops_per_token,
        }
        for name in ("block_output_rms", "block_grad_norm"):
            for i, v in enumerate(ev.get(name) or []):
                metrics[f"diag/{name}/{i}"] = v
        for lg in trainer.loggers:
            lg.log_metrics(metrics, step=step)
            if "depth_weights" in ev and hasattr(lg, "log_table"):  # W&B: the Fig. 8 matrix as a table
                lg.log_table(
                    key="diag/depth_weights",
                    columns=["read", *list(ev["source_labels"])],
                    data=[[k, *row_] for k, row_ in zip(ev["read_kinds"], ev["depth_weights"])],
                    step=step,
                )
        self.flush()

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if trainer.is_global_zero:
            self.flush()

    def on_exception(self, trainer: pl.Trainer, pl_module: Any, exception: BaseException) -> None:
        if trainer.is_global_zero:
            self.flush()

    def state_dict(self) -> dict[str, Any]:
        return {
            "started_at": self.started_at,
            "wall_time_s": self.wall_time_s(),
            "cpu_time_s": self.cpu_time_s(),
            "threads": torch.get_num_threads(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        threads = state_dict.get("threads")
        if threads is not None and threads != torch.get_num_threads():
            warnings.warn(
                f"resuming a run checkpointed at {threads} torch thread(s) with {torch.get_num_threads()}: "
                "the result differs from an uninterrupted run by rounding (docs/results_schema.md, "
                "'Thread count')",
                stacklevel=2,
            )
        self.started_at = state_dict.get("started_at", self.started_at)
        self.prior_wall_s = float(state_dict.get("wall_time_s", 0.0))
        self.prior_cpu_s = float(state_dict.get("cpu_time_s", 0.0))
        self.session_start = time.time()
        self.session_cpu_start = cpu_seconds()


# ---- graceful interrupt ---------------------------------------------------------------------------------------
INTERRUPT_SIGNALS = interrupts.SIGNALS  # Ctrl-C; what SLURM sends before preemption / a time limit


class GracefulInterrupt(pl.Callback):
    """While installed, SIGINT, SIGTERM, SIGUSR1 and SIGUSR2 are only remembered (experiments.run.interrupts
    .on_signal); the run then stops at the next consistent point, saves ``checkpoint`` (the last.ckpt a relaunch
    resumes from) at that step and raises RunInterrupted:

    * in training: at the end of the optimizer step in progress;
    * in an evaluation (the periodic ones and the final one): once it is complete and recorded (it is bounded:
      ``train.val_sequences`` windows), so the checkpoint holds the evaluated step and a relaunch does not
      evaluate it again;
    * while a checkpoint is written: right after it, at its step;
    * after training (the final evaluation by ``trainer.validate``, the completed record): at
      :meth:`stop_if_received`, which experiments.train calls after fit, after validate and before the record.

    Lightning's own SIGTERM handler (which stops the loops between two evaluation batches, without a checkpoint)
    is replaced by this one when training and evaluation start; the signal is passed on to the processes
    Lightning's launcher started, as that handler did. A second SIGINT stops at once (KeyboardInterrupt; the last
    periodic checkpoint stands). Under DDP the ranks agree through the strategy, so all of them stop at the same
    step."""

    def __init__(self, checkpoint: str | Path) -> None:
        self.checkpoint = str(checkpoint)
        self._trainer: pl.Trainer | None = None

    @property
    def received(self) -> str | None:
        return interrupts.received()

    def _handler(self, signum: int, frame: Any) -> None:
        first = interrupts.received() is None
        interrupts.on_signal(signum, frame)
        launcher = getattr(getattr(self._trainer, "strategy", None), "launcher", None)
        if first and launcher is not None:
            launcher.kill(signum)  # the ranks Lightning started (they stop at the same step)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The handlers, for the duration of the block (main thread only; elsewhere the block runs without)."""
        with interrupts.handling(self._handler):
            yield

    def _take_over(self, trainer: pl.Trainer) -> None:
        import threading

        self._trainer = trainer
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._handler)  # Lightning's fit/validate registered its own just before

    def _agreed(self, trainer: pl.Trainer) -> bool:
        """Whether any rank received a signal (one collective per call under DDP); a rank that did not takes the
        signal of the lowest rank that did, so every rank stops, records and exits under the same signal."""
        if trainer.world_size == 1:
            return self.received is not None
        mine = int(getattr(signal, self.received)) if self.received is not None else 0
        gathered = trainer.strategy.all_gather(torch.tensor([mine], device=trainer.strategy.root_device))
        numbers = [int(n) for n in gathered.flatten().tolist() if int(n) > 0]
        if numbers and self.received is None:
            interrupts.on_signal(numbers[0])
        return bool(numbers)

    def _saved(self, trainer: pl.Trainer) -> bool:
        """Whether this process saved ``checkpoint`` at the current step already (rank zero's answer under DDP)."""
        from ..run.checkpoint_io import AtomicCheckpointIO

        io = trainer.strategy.checkpoint_io
        saved = isinstance(io, AtomicCheckpointIO) and io.saved_at(self.checkpoint) == trainer.global_step
        if trainer.world_size > 1:
            saved = bool(trainer.strategy.broadcast(saved, src=0))
        return saved

    def stop(self, trainer: pl.Trainer) -> None:
        """Save the checkpoint at this step (unless this process saved it at this step already) and raise
        RunInterrupted."""
        if not self._saved(trainer):
            trainer.save_checkpoint(self.checkpoint)
        raise RunInterrupted(self.received or "SIGTERM", trainer.global_step, self.checkpoint)

    def stop_if_received(self, trainer: pl.Trainer) -> None:
        """:meth:`stop` when a signal arrived (outside Lightning's loops: after fit, after validate)."""
        if self._agreed(trainer):
            self.stop(trainer)

    def on_train_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self._take_over(trainer)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self._take_over(trainer)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        # a signal while the periodic checkpoint of the step just done was written (the checkpoint callbacks run
        # after this one): stop at that step, with that checkpoint; under DDP the ranks agree at the step's end
        if trainer.world_size == 1 and self.received is not None and self._saved(trainer):
            raise RunInterrupted(self.received, trainer.global_step, self.checkpoint)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._agreed(trainer):
            self.stop(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        # in fit: the evaluation is complete and recorded (RunRecorder.on_validation_end ran first); a validate()
        # after fit returns first and experiments.train stops the run then
        if not trainer.sanity_checking and trainer.state.fn == "fit" and self._agreed(trainer):
            self.stop(trainer)


# ---- several budgets from one run (experiments/run/budgets.py) ----------------------------------------------------
class BranchPoints(pl.Callback):
    """The trunk of a multi-budget launch: after optimizer step s of ``points`` (step -> file), save the run's
    state there, as Lightning's own step checkpoints are saved (atomically, experiments.run.checkpoint_io), unless the
    file is already there (a resumed trunk passing the step again: the same state)."""

    def __init__(self, points: dict[int, str | Path]) -> None:
        self.points = {int(s): Path(p) for s, p in points.items()}

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        path = self.points.get(trainer.global_step)
        if path is not None and not path.is_file():
            trainer.save_checkpoint(path)


class ScheduleResync(pl.Callback):
    """A decay branch of a multi-budget launch: when training starts from a checkpoint, set each optimizer group's
    lr to the run's own schedule at the restored step (``base_lr * lambda(last_epoch)``, LambdaLR's own
    arithmetic). A branch resumes from the trunk's state, saved after its scheduler had stepped on the trunk's
    schedule, which is at the peak where the branch's decay starts; on a run's own checkpoint this sets the value
    already there."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if trainer.global_step == 0:
            return
        for config in trainer.lr_scheduler_configs:
            sched = config.scheduler
            lambdas = getattr(sched, "lr_lambdas", None)
            if lambdas is None:
                continue
            values = [base * lam(sched.last_epoch) for lam, base in zip(lambdas, sched.base_lrs)]
            for group, lr in zip(sched.optimizer.param_groups, values):
                group["lr"] = lr
            sched._last_lr = [group["lr"] for group in sched.optimizer.param_groups]


# ---- test-only fault injection (conf: fault.kill_at_step / fault.nan_at_step; excluded from config_hash) ------
class KillAtStep(pl.Callback):
    """SIGKILL this process right after optimizer step `step` finished (checkpointing and evaluation included):
    a real, unclean death - no exception handler, no finally, no record."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class SignalAtStep(pl.Callback):
    """Send this process `signame`, as a user or SLURM would, in `phase` at optimizer step `step`:

    * ``train``: just before step `step` + 1 starts;
    * ``eval``: during the evaluation of step `step` (at its first batch; fit's periodic or final one, or the
      validate() after fit);
    * ``checkpoint``: while the checkpoint of step `step` is being written.

    With ``rank`` (a multi-process run), only the process of that global rank signals itself; the others learn of
    it from it (GracefulInterrupt)."""

    PHASES = ("train", "eval", "checkpoint")

    def __init__(self, step: int, signame: str, phase: str = "train", rank: int | None = None) -> None:
        if phase not in self.PHASES:
            raise ValueError(f"fault.signal_phase={phase!r}; allowed values: {', '.join(self.PHASES)}")
        self.step, self.signame, self.phase, self.rank = step, signame, phase, rank
        self._sent = False

    def _send(self, trainer: pl.Trainer, phase: str) -> None:
        if self.rank is not None and trainer.global_rank != self.rank:
            return
        if phase == self.phase and trainer.global_step == self.step and not self._sent:
            self._sent = True
            os.kill(os.getpid(), getattr(signal, self.signame))

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._send(trainer, "train")

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not trainer.sanity_checking:
            self._send(trainer, "eval")

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self._send(trainer, "checkpoint")


class RaiseAtStep(pl.Callback):
    """Raise a RuntimeError just before optimizer step `step` + 1: a run that fails during training."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"fault.raise_at_step={self.step}: injected failure")


class NaNAtStep(pl.Callback):
    """Poison the LM head with NaN just before optimizer step `step`, so that step's loss is NaN."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step + 1 == self.step:
            with torch.no_grad():
                pl_module.model.lm_head.weight.fill_(float("nan"))


def fault_callbacks(cfg: DictConfig) -> list[Any]:
    """The fault injectors that ``cfg.fault`` asks for (tests only: a kill, NaN, signal or exception at a step)."""
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
