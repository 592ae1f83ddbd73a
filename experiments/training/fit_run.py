"""Training one run to its planned step (:func:`fit_run`): the LightningModule, callbacks, loggers and trainer from
the config, the resume from the run's checkpoint, the fit, the last step's evaluation and the completed record.
Lightning and torch are imported only when it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from results.io import atomic_write_text, write_json

from ..run.identity import resolved_container
from ..run.run_env import environment, quiet_lightning

if TYPE_CHECKING:
    from ..run.record_builder import RecordBuilder


def fit_run(
    cfg: DictConfig, run: RecordBuilder, rank_zero: bool, branch_points: dict[int, Any], resync: bool
) -> dict[str, Any]:
    """Train ``run`` to its planned step, evaluate the last step and write the completed record (returned). Every
    other way it ends is recorded by experiments.run.record_builder.recorded_outcome. ``branch_points``: the trunk of
    a multi-budget launch saves its state at these steps; ``resync``: a decay branch takes the lr of the step it
    resumes at from its own schedule (experiments.run.budgets)."""
    from hydra.utils import instantiate

    from ..run.checkpoint_io import resume_checkpoint
    from ..run.record_builder import recorded_outcome
    from ..run.wandb_setup import log_hyperparameters, wandb_run_id
    from .callbacks import BranchPoints, GracefulInterrupt, RunRecorder, ScheduleResync, fault_callbacks
    from .instantiators import instantiate_callbacks, instantiate_loggers, instantiate_trainer
    from .module import LMModule

    plan, ckpt = run.plan, run.run_dir / "checkpoints" / "last.ckpt"
    interrupt = GracefulInterrupt(ckpt)
    with recorded_outcome(run, interrupt, rank_zero):
        container = resolved_container(cfg)
        if rank_zero:
            atomic_write_text(run.run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(container)))
            write_json(run.run_dir / "environment.json", environment(plan.datamodule, commit=run.git_commit))

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
