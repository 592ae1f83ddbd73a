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
import sys
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from .config import config_schema, resolvers
from .config.compose import cli_problem, conf_dir
from .config.validation import check_config
from .run import interrupts
from .run.errors import StopRequested
from .run.job import run_job
from .run.run_env import mark_launch_commit
from .run.single_run import open_run, setup_error
from .training.fit_run import fit_run

# At import, not in main(): a launcher's worker process (joblib, submitit) unpickles hydra_main and resolves its
# job's config (hydra.sweep.dir uses ${attnres_pid:}) without running main(); conf/ names the structured configs.
resolvers.register()
config_schema.register()


def train(cfg: DictConfig) -> dict[str, Any]:
    """Run (or resume, or skip) one training run; returns its result record. With ``train.budgets`` set, the trunk
    and the decay branches of several budgets, each a run of its own (experiments.run.budgets.train_budgets); returns
    the largest budget's record, every budget's under ``budgets``.

    The config is checked here, once per launch (check_config: a problem raises SetupError before anything is
    written); a multi-budget launch's branches differ from it only in what experiments.run.budgets.plan_budgets
    derives and checks itself."""
    cfg = copy.deepcopy(cfg)
    interrupts.reset()  # a new run (experiments.run.job.run_job starts none after an interrupt of its launch)
    try:
        check_config(cfg)
    except ValueError as e:
        raise setup_error(e) from e
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
    """Run (or resume, or skip) one training run of a checked config; returns its result record. A multi-budget
    launch (experiments.run.budgets) passes ``lineage`` (the record's ``budget`` and ``trunk_id``),
    ``branch_points`` (the trunk: step -> file to save its state at), ``seed`` (a branch: starts it from its branch
    point) and ``resync`` (a branch: the lr of the step it resumes at comes from its own schedule)."""
    with open_run(cfg, lineage, seed) as opened:
        if opened.run is None or opened.cfg is None:
            assert opened.done is not None
            return opened.done  # finished already: skipped
        return fit_run(opened.cfg, opened.run, opened.rank_zero, branch_points or {}, resync)


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
    traceback, with exit status 128 + the signal number (experiments.run.interrupts.install_launcher). The code's
    commit is taken once, here, for every run of the launch (experiments.run.run_env.mark_launch_commit: the
    launcher's workers and SLURM jobs inherit it), so a record names the code it trained with."""
    problem = cli_problem(sys.argv[1:])
    if problem is not None:
        print(f"[attnres] config error: {problem}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    try:
        interrupts.install_launcher()  # inside: a parent that is gone already stops the launch here
        mark_launch_commit()
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
