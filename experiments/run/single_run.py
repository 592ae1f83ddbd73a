"""One training run's lifecycle (:func:`train_run`): its identity, the skip check, the setup checks, the lock, the
run directory, then the training itself (a ``fit`` callable: experiments.training.fit_run.fit_run, which
experiments.train passes in, so that this stage imports nothing from training).
"""

from __future__ import annotations

import copy
import shutil
import time
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, open_dict

from results import ledger
from results.io import remove_dead_writers_files

from ..config.validation import check_writable, min_free_mb
from . import interrupts
from .errors import SetupError, StopRequested
from .identity import run_identity
from .locks import acquire_run_lock, clear_dead_lock
from .record_builder import RecordBuilder, find_finished, warn_other_data
from .run_env import is_rank_zero
from .run_plan import plan_run

# (cfg, run, rank_zero, branch_points, resync) -> the completed record: trains ``run`` to its planned step
FitRun = Callable[[DictConfig, RecordBuilder, bool, dict[int, Any], bool], dict[str, Any]]


def setup_error(e: BaseException) -> SetupError:
    """A problem found before training, as the one-line SetupError a launch reports."""
    return SetupError(str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}")


def train_run(
    cfg: DictConfig,
    fit: FitRun,
    lineage: dict[str, Any] | None = None,
    branch_points: dict[int, Any] | None = None,
    seed: Any = None,
    resync: bool = False,
) -> dict[str, Any]:
    """Run (or resume, or skip) one training run of ``cfg``, a config check_config passed (experiments.train
    checks each launch's once); ``fit`` trains it (experiments.training.fit_run.fit_run). Returns its result record.

        A multi-budget launch (experiments.run.budgets) passes what its runs need beyond an ordinary one: ``lineage``
        (the record's ``budget`` and ``trunk_id``), ``branch_points`` (the trunk: step -> file to save its state at),
        ``seed`` (a branch: called in the run directory, under the lock, before the resume, to start it from its
        branch point) and ``resync`` (a branch: the lr of the step it resumes at comes from its own schedule).

        Before training (nothing written, Lightning not imported): the run's identity (inside
        ``paths.runs_root``), that the runs root is writable and the skip check, then the data and model checks. Any
        problem there raises SetupError and leaves no trace. Then the run's lock (RunBusy when another process is
        training it), the run directory, and training: from here every way the run ends is recorded (completed, failed,
        diverged; interrupted by a signal, after a checkpoint at that step: RunInterrupted).
    """
    cfg = copy.deepcopy(cfg)
    try:
        chash, run_id, run_dir, study_dir = run_identity(cfg)
        check_writable(study_dir, min_free_mb=min_free_mb(cfg))
    except ValueError as e:
        raise setup_error(e) from e
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
        raise setup_error(e) from e
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
        return fit(cfg, run, rank_zero, branch_points or {}, resync)
    finally:
        if lock is not None:
            lock.release()
