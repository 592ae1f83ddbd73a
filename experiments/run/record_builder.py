"""A run's result record in the making: :class:`RecordBuilder` gathers what the record (results.record.RunRecord)
is made of while the run progresses (so a failed run records what it had) and writes it, to the study's ledger
and to the run's ``results.json`` (results.ledger). Before a run starts: :func:`find_finished` (the skip check)
and :func:`warn_other_data`.

Every way a run that started training can end is recorded: :func:`recorded_outcome` wraps the training of a run
(experiments.train) and, when it raises, writes the record with its status before the exception goes on.

    completed     the body returned after the completed record was written (RecordBuilder.completed)
    interrupted   SIGINT / SIGTERM / SIGUSR1 (experiments.training.callbacks.GracefulInterrupt), raised as
    RunInterrupted diverged      experiments.run.errors.DivergedError
    failed        any other exception
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from results import ledger
from results.io import utc_now, write_json

from .errors import DivergedError, RunInterrupted
from .run_env import cpu_seconds, launch_commit, torch_threads
from .run_plan import RunPlan
from .wandb_setup import finish_wandb

# The names a run records for its recipe (results.record: optimizer, lr_schedule), by factory (_target_ in
# conf/optimizer, conf/scheduler: experiments.training.optim's functions; tests/test_configs.py checks each imports).
RECIPE_NAMES = {
    "experiments.training.optim.adamw": "adamw",
    "experiments.training.optim.muon": "muon",
    "experiments.training.optim.warmup_cosine": "cosine",
    "experiments.training.optim.wsd": "wsd",
}


def _float_or_none(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):  # an invalid setting is recorded as missing; check_config names it
        return None


def recipe_name(node: Any) -> str | None:
    """The name a record gives an optimizer or scheduler config node (``adamw``, ``muon``; ``cosine``, ``wsd``:
    RECIPE_NAMES by its ``_target_``), the target itself when unnamed, None without one."""
    target = node.get("_target_") if node is not None else None
    return RECIPE_NAMES.get(str(target), str(target)) if target else None


class RecordBuilder:
    """The record of one run in the making. ``module``, ``trainer`` and ``recorder`` (experiments.training.callbacks.
    RunRecorder) are set by experiments.train as they are built; :meth:`record` uses whichever exist."""

    def __init__(
        self,
        cfg: DictConfig,
        chash: str,
        run_id: str,
        run_dir: Path,
        study_dir: Path,
        plan: RunPlan,
        lineage: dict[str, Any] | None = None,
    ) -> None:
        self.cfg, self.chash, self.run_id, self.run_dir, self.study_dir = cfg, chash, run_id, run_dir, study_dir
        self.plan = plan
        self.lineage = dict(lineage or {})  # a multi-budget launch's run: budget, trunk_id (experiments.run.budgets)
        self.table = study_dir / ledger.RESULTS_TABLE
        self.started_at = utc_now()
        self.t0 = time.time()
        self.cpu0 = cpu_seconds()
        self.git_commit = launch_commit()  # the code it trains with, taken at launch: not HEAD when a record is written
        self.module: Any = None
        self.trainer: Any = None
        self.recorder: Any = None
        self.completed: dict[str, Any] | None = None  # the completed record once written; nothing overwrites it
        self.tokens_per_step = int(cfg.train.batch_size) * int(cfg.train.seq_len)

    @property
    def step(self) -> int:
        """Optimizer steps done so far (0 before a trainer exists)."""
        return int(self.trainer.global_step) if self.trainer is not None else 0

    def derived(self) -> dict[str, Any]:
        """The run's planned size and compute (``derived/<key>``, logged with the config as hyperparameters);
        needs ``module``."""
        plan, tokens = self.plan, self.plan.steps * self.tokens_per_step
        return {
            "derived/params": self.module.num_params(),
            "derived/params_non_embedding": self.module.num_params(non_embedding=True, activated=True),
            "derived/flops_per_token": plan.flops_per_token,
            "derived/steps": plan.steps,
            "derived/tokens": tokens,
            "derived/flops": plan.flops_per_token * tokens,
            "derived/flops_budget": self.cfg.train.get("flops_budget"),
            "derived/config_hash": self.chash,
            "derived/dataset": plan.dataset,
            "derived/data_fingerprint": plan.data_fingerprint,
        }

    def record(self, status: str, error: str = "") -> dict[str, Any]:
        """The result record as of now, with ``status`` (results.record.STATUSES) and ``error`` (empty unless
        failed)."""
        from attnres import flops_per_token

        cfg, mc = self.cfg, self.plan.model_config
        rec: dict[str, Any] = {
            "run_id": self.run_id,
            "study": str(cfg.study),
            "variant": str(cfg.model.variant),
            "residual": str(cfg.model.residual),
            "size": str(cfg.size.name),
            "seed": int(cfg.seed),
            "status": status,
            "seq_len": int(cfg.train.seq_len),
            "batch_size": int(cfg.train.batch_size),
            "lr": float(cfg.optimizer.lr) if "lr" in cfg.optimizer else None,
            "git_commit": self.git_commit,
            "config_hash": self.chash,
            "run_dir": str(self.run_dir),
            "error": error,
            "started_at": self.started_at,
            "finished_at": utc_now(),
            "wall_time_s": round(time.time() - self.t0, 3),
            "flops_budget": _float_or_none(cfg.train.get("flops_budget")),
            "d_over_lb": _float_or_none(cfg.size.get("d_over_lb")),
            "heads_over_lb": _float_or_none(cfg.size.get("heads_over_lb")),
            "lr_protocol": str(cfg.get("lr_protocol") or ""),
            "study_kind": str(cfg.get("study_kind") or "scaling"),
            "dataset": self.plan.dataset,
            "data_fingerprint": self.plan.data_fingerprint,
            "threads": torch_threads(),
            "train_path": self.module.train_path if self.module is not None else None,
            "cpu_time_s": round(cpu_seconds() - self.cpu0, 3),
            "optimizer": recipe_name(cfg.optimizer),
            "lr_schedule": recipe_name(cfg.scheduler),
            "budget": _float_or_none(self.lineage.get("budget")),
            "trunk_id": self.lineage.get("trunk_id"),
        }
        if mc is not None:
            import torch

            from attnres import Transformer

            # non-embedding N is the *activated* count (an MoE model's k of E routed experts: Table 2's N; the
            # same number for a dense model), params counts every parameter
            if self.module is not None:
                params, non_emb = self.module.num_params(), self.module.num_params(non_embedding=True, activated=True)
            else:
                with torch.device("meta"):
                    m = Transformer(mc)
                params, non_emb = m.num_params(), m.num_params(non_embedding=True, activated=True)
            fpt = flops_per_token(mc, int(cfg.train.seq_len)).total
            steps = self.step
            tokens = steps * self.tokens_per_step
            rec.update(
                n_layers=mc.n_layers,
                d_model=mc.d_model,
                n_heads=mc.n_heads,
                d_ff=mc.d_ff,
                block_size=mc.sublayers_per_block if mc.reads_block_geometry else None,
                n_blocks=mc.effective_n_blocks if mc.reads_block_geometry else None,
                params=params,
                params_non_embedding=non_emb,
                tokens=tokens,
                flops_per_token=fpt,
                flops=fpt * tokens,
                pflops_days=fpt * tokens / (1e15 * 86400),
                flops_6nd=6.0 * non_emb * tokens,
                pflops_days_6nd=6.0 * non_emb * tokens / (1e15 * 86400),
                steps=steps,
            )
        if self.recorder is not None:
            rec["started_at"] = self.recorder.started_at  # first launch of a resumed run
            rec["wall_time_s"] = round(self.recorder.wall_time_s(), 3)
            rec["cpu_time_s"] = round(self.recorder.cpu_time_s(), 3)
            step_cpu = self.recorder.step_cpu_s(self.step)
            rec["step_cpu_s"] = round(step_cpu, 6) if step_cpu is not None else None
            rec["train_loss"] = self.recorder.last_train_loss
            ev = self.recorder.last_eval
            if status == "completed" and ev is not None and ev["step"] == rec.get("steps"):
                rec["val_loss"] = ev["val_loss"]
            if status == "completed":
                rec["health"] = ",".join(self.recorder.health_flags(self.plan.steps or rec.get("steps") or 0)) or "ok"
        return ledger.make_record(**rec)

    def write(self, record: dict[str, Any]) -> None:
        """Add ``record`` to the study's ledger and write it as the run's results.json (its record_id set)."""
        record["record_id"] = ledger.add_record(self.study_dir, record)
        write_json(self.run_dir / ledger.RESULTS_JSON, record)


def find_finished(study_dir: Path, chash: str, run_id: str) -> dict[str, Any] | None:
    """The study's last record of this config when it is finished, completed or diverged (``skipped`` set, after a
    message saying so), or None: a relaunch trains neither again unless force=true."""
    done = ledger.find_completed(study_dir, chash, ledger.FINISHED)
    if done is None:
        return None
    what = (
        f"a completed run with config_hash {chash} (val_loss {done.get('val_loss')})"
        if done.get("status") == "completed"
        else f"this config (config_hash {chash}) as diverged after {done.get('steps')} steps ({done.get('error')})"
    )
    print(
        f"[attnres] skipping {run_id}: {study_dir / ledger.RESULTS_TABLE} already holds {what}; pass force=true to "
        "re-run it"
    )
    return {**done, "skipped": True}


def warn_other_data(study_dir: Path, plan: RunPlan) -> None:
    """Say so when the study already holds completed runs of other data: the analysis will not pool them."""
    other: dict[str, str] = {}
    for rec in ledger.read_records(study_dir):
        fp = rec.get("data_fingerprint") or ""
        if rec.get("status") == "completed" and fp and fp != plan.data_fingerprint:
            other[fp] = str(rec.get("dataset") or "?")
    if other:
        print(
            f"[attnres] warning: study {study_dir.name} already holds completed runs of other data "
            f"({', '.join(f'{fp} = {name}' for fp, name in sorted(other.items()))}); this run's data is "
            f"{plan.data_fingerprint} = {plan.dataset}. The analysis never pools data sets: give each its own "
            f"study (study=<name>)",
            file=sys.stderr,
            flush=True,
        )


# ---- how a run ends ------------------------------------------------------------------------------------------------
def _status(e: BaseException) -> tuple[str, str]:
    if isinstance(e, RunInterrupted):
        return "interrupted", f"interrupted by {e.signame} at step {e.step}"
    status = "diverged" if isinstance(e, DivergedError) else "failed"
    return status, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


@contextlib.contextmanager
def recorded_outcome(run: RecordBuilder, interrupt: Any, rank_zero: bool) -> Iterator[None]:
    """Run the block with ``interrupt``'s signal handlers installed; record how it ended.

    On an exception (unless the completed record was already written: that record stands) rank zero writes the
    record with the status above, the W&B run ends with exit code 1, and the exception is re-raised (a divergence
    after one line saying at which step). A second
    Ctrl-C (KeyboardInterrupt after a first signal) becomes RunInterrupted without a checkpoint at this step; a
    RunInterrupted is re-raised after a message saying how to resume. On success the W&B run ends with the
    completed record in its summary.
    """
    try:
        with interrupt.installed():
            yield
    except BaseException as e:
        if run.completed:  # e.g. a closed stdout after the completed record was written: keep that record
            finish_wandb(exit_code=0)
            raise
        if isinstance(e, (KeyboardInterrupt, SystemExit)) and interrupt.received and not isinstance(e, RunInterrupted):
            # a second Ctrl-C: stopped at once, without a checkpoint at this step (the last periodic one stands)
            e = RunInterrupted(interrupt.received, run.step, None)
        status, message = _status(e)
        if rank_zero:
            try:
                run.write(run.record(status, error=message))
            except Exception as write_error:  # noqa: BLE001 - never mask the original error
                print(
                    f"[attnres] {run.run_id}: could not write its {status} record ({type(write_error).__name__}: "
                    f"{write_error}); the study's earlier records are untouched",
                    file=sys.stderr,
                    flush=True,
                )
        finish_wandb(exit_code=1)
        if status == "diverged" and rank_zero:
            print(
                f"[attnres] {run.run_id}: diverged at step {run.step + 1} ({e}); recorded as diverged: a relaunch "
                "skips it (force=true re-runs it)",
                flush=True,
            )
        if isinstance(e, RunInterrupted):
            if rank_zero:
                saved = (
                    f"checkpoint {e.checkpoint} saved at that step" if e.checkpoint else "no checkpoint at that step"
                )
                print(
                    f"[attnres] {run.run_id}: {message}; {saved}; recorded as interrupted. Relaunch the same "
                    "command to resume.",
                    flush=True,
                )
            elif (
                getattr(run, "trainer", None) is not None
            ):  # the other ranks of a multi-process run: where each stopped
                print(f"[attnres] {run.run_id}: rank {run.trainer.global_rank} {message}", flush=True)
            raise e from None
        raise
    finish_wandb(exit_code=0, record=run.completed)
