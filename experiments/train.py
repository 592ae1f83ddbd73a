"""Train one model: ``python -m experiments.train [overrides]`` (console script ``attnres-train``).

    python -m experiments.train experiment=cpu_ladder size=cpu_xs                 # the README's main command
    python -m experiments.train experiment=smoke model=full_attnres               # seconds
    python -m experiments.train -m experiment=cpu_ladder model=baseline,full_attnres,block_attnres seed=0,1

A run is identified by its config_hash (results/config_hash.py, experiments/run/identity.py) and lives in
``<paths.runs_root>/<study>/<variant>_<size>_s<seed>_<hash8>``: relaunching the same config resumes from
``checkpoints/last.ckpt``, or skips a run the study already holds as completed or diverged (``force=true`` re-runs
it, moving the old directory aside). Every run that started training writes ``results.json`` and one record to the
study's ledger (experiments/run/record_builder.py, results/ledger.py), however it ended
(experiments/run/record_builder.py); a config or data error found before training writes nothing. One process trains a
run at a time (experiments/run/locks.py).

Run directory: results.json, config.yaml (resolved), environment.json (exact dataset, versions), metrics.csv,
diagnostics.json(+l) (experiments/training/callbacks.py), checkpoints/last.ckpt and the one before it, last.prev.ckpt
(written atomically, checked before a resume: experiments/run/checkpoint_io.py), and the loggers' files (wandb/,
csv_logs/).

Lightning is imported only inside :func:`train`, so ``--help`` and config composition stay fast.
"""

from __future__ import annotations

import copy
import shutil
import sys
import time
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from results import ledger
from results.io import atomic_write_text, remove_dead_writers_files, write_json

from .config import config_schema, resolvers
from .config.compose import cli_problem, conf_dir
from .config.validation import check_config, check_writable, min_free_mb
from .run import interrupts
from .run.errors import SetupError, StopRequested
from .run.identity import resolved_container, run_identity
from .run.job import run_job
from .run.locks import acquire_run_lock, clear_dead_lock
from .run.record_builder import RecordBuilder, find_finished, warn_other_data
from .run.run_env import environment, is_rank_zero, quiet_lightning
from .run.run_plan import plan_run

# At import, not in main(): a launcher's worker process (joblib, submitit) unpickles hydra_main and resolves its
# job's config (hydra.sweep.dir uses ${attnres_pid:}) without running main(); conf/ names the structured configs.
resolvers.register()
config_schema.register()


def _setup_error(e: BaseException) -> SetupError:
    return SetupError(str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}")


def train(cfg: DictConfig) -> dict[str, Any]:
    """Run (or resume, or skip) one training run; returns its result record. With ``train.budgets`` set, the trunk
    and the decay branches of several budgets, each a run of its own (experiments.run.budgets.train_budgets); returns
    the largest budget's record, every budget's under ``budgets``."""
    cfg = copy.deepcopy(cfg)
    interrupts.reset()  # a new run (experiments.run.job.run_job starts none after an interrupt of its launch)
    if OmegaConf.select(cfg, "train.budgets", throw_on_resolution_failure=False) is not None:
        from .run.budgets import train_budgets

        return train_budgets(cfg, _train_run)
    return _train_run(cfg)


def _train_run(
    cfg: DictConfig,
    lineage: dict[str, Any] | None = None,
    branch_points: dict[int, Any] | None = None,
    seed: Any = None,
    resync: bool = False,
) -> dict[str, Any]:
    """Run (or resume, or skip) one training run; returns its result record.

    A multi-budget launch (experiments.run.budgets) passes what its runs need beyond an ordinary one: ``lineage``
    (the record's ``budget`` and ``trunk_id``), ``branch_points`` (the trunk: step -> file to save its state at),
    ``seed`` (a branch: called in the run directory, under the lock, before the resume, to start it from its
    branch point) and ``resync`` (a branch: the lr of the step it resumes at comes from its own schedule).

    Before training (nothing written, Lightning not imported): the config checks, the run's identity (inside
    ``paths.runs_root``), that the runs root is writable and the skip check, then the data and model checks. Any
    problem there raises SetupError and leaves no trace. Then the run's lock (RunBusy when another process is
    training it), the run directory, and training: from here every way the run ends is recorded (completed, failed,
    diverged; interrupted by a signal, after a checkpoint at that step: RunInterrupted).
    """
    cfg = copy.deepcopy(cfg)
    try:
        check_config(cfg)
        chash, run_id, run_dir, study_dir = run_identity(cfg)
        check_writable(study_dir, min_free_mb=min_free_mb(cfg))
    except ValueError as e:
        raise _setup_error(e) from e
    if not cfg.force and (done := find_finished(study_dir, chash, run_id)) is not None:
        if is_rank_zero():
            clear_dead_lock(study_dir, run_id)
        return done  # every rank checks, so all of a multi-device run skip together
    if cfg.get("threads"):
        import torch

        torch.set_num_threads(int(cfg.threads))
    try:
        plan = plan_run(cfg)
    except (ValueError, FileNotFoundError, ImportError) as e:
        raise _setup_error(e) from e
    rank_zero = is_rank_zero()
    if rank_zero:
        warn_other_data(study_dir, plan)
    lock = acquire_run_lock(study_dir, run_id) if rank_zero else None
    try:
        if not cfg.force and (done := find_finished(study_dir, chash, run_id)) is not None:
            return done  # completed by another process while this one was getting ready
        replacing = cfg.force and (run_dir / ledger.RESULTS_JSON).is_file()
        if rank_zero and replacing and (old := ledger.find_completed(study_dir, chash, ledger.FINISHED)):
            aside = run_dir.with_name(f"{run_dir.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
            shutil.move(str(run_dir), str(aside))
            print(f"[attnres] force=true: moved the {old['status']} run's directory to {aside}")
        if (signame := interrupts.received()) is not None:  # while the data and the model were prepared
            raise StopRequested(signame)
        run_dir.mkdir(parents=True, exist_ok=True)
        if rank_zero and (run_dir / "checkpoints").is_dir():  # a save killed before its rename, by an earlier launch
            remove_dead_writers_files(run_dir / "checkpoints" / "last.ckpt")
        if seed is not None and rank_zero:
            seed()
        with open_dict(cfg):
            cfg.run_id = run_id
            cfg.paths.run_dir = str(run_dir)
        run = RecordBuilder(cfg, chash, run_id, run_dir, study_dir, plan, lineage)
        return _fit(cfg, run, rank_zero, branch_points or {}, resync)
    finally:
        if lock is not None:
            lock.release()


def _fit(
    cfg: DictConfig, run: RecordBuilder, rank_zero: bool, branch_points: dict[int, Any], resync: bool
) -> dict[str, Any]:
    """Train ``run`` to its planned step, evaluate the last step and write the completed record."""
    from hydra.utils import instantiate

    from .run.checkpoint_io import resume_checkpoint
    from .run.record_builder import recorded_outcome
    from .run.wandb_setup import log_hyperparameters, wandb_run_id
    from .training.callbacks import BranchPoints, GracefulInterrupt, RunRecorder, ScheduleResync, fault_callbacks
    from .training.instantiators import instantiate_callbacks, instantiate_loggers, instantiate_trainer
    from .training.module import LMModule

    plan, ckpt = run.plan, run.run_dir / "checkpoints" / "last.ckpt"
    interrupt = GracefulInterrupt(ckpt)
    with recorded_outcome(run, interrupt, rank_zero):
        container = resolved_container(cfg)
        if rank_zero:
            atomic_write_text(run.run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(container)))
            write_json(run.run_dir / "environment.json", environment(plan.datamodule))

        import lightning.pytorch as pl

        quiet_lightning()
        pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
        module = LMModule(
            plan.model_config,
            optimizer=instantiate(cfg.optimizer),
            scheduler=instantiate(cfg.scheduler),
            total_steps=plan.steps,
            log_every=int(cfg.train.log_every),
            eval_every=plan.eval_every,
            compile=bool(cfg.compile),
            activation_checkpointing=bool(cfg.activation_checkpointing),
        )
        run.module = module
        run.recorder = recorder = RunRecorder(
            run.run_dir, run.tokens_per_step, plan.flops_per_token, str(cfg.model.variant), plan.model_config.residual
        )
        recorder.session_start, recorder.session_cpu_start = run.t0, run.cpu0  # this launch's setup included
        callbacks = [recorder, *instantiate_callbacks(cfg), interrupt, *fault_callbacks(cfg)]
        if branch_points:  # the trunk of a multi-budget launch (experiments.run.budgets)
            callbacks.append(BranchPoints(branch_points))
        if resync:  # a decay branch
            callbacks.append(ScheduleResync())
        resume_from = resume_checkpoint(ckpt, run.run_id, rank_zero)  # a damaged one is reported and set aside
        resuming = resume_from is not None
        loggers = instantiate_loggers(cfg, wandb_run_id(run.run_dir, resuming) if rank_zero else "")
        run.trainer = trainer = instantiate_trainer(cfg, plan, callbacks, loggers, run.run_dir)

        derived = run.derived()
        log_hyperparameters(loggers, {**container, **derived}, rank_zero)
        if rank_zero:
            state = f"resuming from {resume_from}" if resuming else "starting"
            print(
                f"[attnres] {run.run_id}: {state}; {plan.steps} steps x {run.tokens_per_step} tokens, "
                f"N={derived['derived/params_non_embedding']:,}, C={derived['derived/flops']:.3g} FLOPs -> "
                f"{run.run_dir}"
            )

        trainer.fit(module, datamodule=plan.datamodule, ckpt_path=str(resume_from) if resuming else None)
        interrupt.stop_if_received(trainer)  # each phase after training is a point an interrupt stops at
        recorder.ensure_loaded(trainer)  # fit returns at once when the checkpoint was already at the last step
        if trainer.global_step < plan.steps:
            raise RuntimeError(f"training stopped at step {trainer.global_step} of {plan.steps}")
        evaluate = recorder.last_eval is None or recorder.last_eval["step"] != plan.steps
        if trainer.world_size > 1:  # rank zero records the evaluations: its answer holds for every rank
            evaluate = bool(trainer.strategy.broadcast(evaluate, src=0))
        if evaluate:
            trainer.validate(module, datamodule=plan.datamodule, verbose=False)  # the last step is always evaluated
        if trainer.is_global_zero:
            recorder.flush()
            from analysis.router import write_run_figure  # matplotlib: imported only when a run completes

            write_run_figure(run.run_dir)  # MoE runs: fig_router.png from router.csv (nothing for dense)
        interrupt.stop_if_received(trainer)  # after this, a signal lets the completed record be written first
        record = run.record("completed")
        if rank_zero:
            run.write(record)
        run.completed = record
        if rank_zero:
            print(
                f"[attnres] {run.run_id}: completed, val_loss {record['val_loss']:.4f} after {record['steps']} "
                f"steps ({record['wall_time_s']:.0f} s) -> {run.table}"
            )
    return record


@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="train")
def hydra_main(cfg: DictConfig) -> float | None:
    """One run as a Hydra job (exit statuses and the sweep's per-job summary: experiments/run/job.py); returns its
    val_loss, the metric a Hydra sweeper optimizes."""
    return run_job(train, cfg)


def main() -> None:
    """``python -m experiments.train`` and the console script ``attnres-train`` (any working directory): the
    Hydra app. A command line Hydra would refuse (a group choice or key that does not exist, an override that does
    not parse) ends in one line and exit status 2 before anything runs (experiments.config.compose.cli_problem). An
    interrupt outside training (composing, preparing data, between the runs of a sweep) ends in one line, not a
    traceback, with exit status 128 + the signal number (experiments.run.interrupts.install_launcher)."""
    problem = cli_problem(sys.argv[1:])
    if problem is not None:
        print(f"[attnres] config error: {problem}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    try:
        interrupts.install_launcher()  # inside: a parent that is gone already stops the launch here
        hydra_main()
    except (KeyboardInterrupt, StopRequested) as e:
        signame = e.signame if isinstance(e, StopRequested) else "SIGINT"
        print(
            f"[attnres] interrupted by {signame}: a run in training saves a checkpoint and is recorded as "
            "interrupted (relaunch to resume); one that had not started training leaves nothing",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(interrupts.exit_code(signame)) from None


if __name__ == "__main__":
    main()
