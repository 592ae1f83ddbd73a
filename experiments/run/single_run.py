"""One training run up to its training (:func:`open_run`): its identity, the skip check, the setup checks, the lock,
the run directory and its record builder. The training itself is experiments.training.fit_run's, which
experiments.train calls inside the ``with``, so that this stage imports nothing from training.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
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


def setup_error(e: BaseException) -> SetupError:
    """A problem found before training, as the one-line SetupError a launch reports."""
    return SetupError(str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}")


@dataclass(frozen=True)
class OpenedRun:
    """A run ready to train (``run``: its record builder, ``cfg``: its config with ``run_id`` and
    ``paths.run_dir`` set) or one the study already holds finished (``done``: its record; nothing else set)."""

    done: dict[str, Any] | None = None
    cfg: DictConfig | None = None
    run: RecordBuilder | None = None
    rank_zero: bool = True


@contextlib.contextmanager
def open_run(cfg: DictConfig, lineage: dict[str, Any] | None = None, seed: Any = None) -> Iterator[OpenedRun]:
    """Everything of one training run of ``cfg`` (a config check_config passed: experiments.train checks each
    launch's once) up to its training, which the caller does inside the ``with`` (experiments.train: by
    experiments.training.fit_run); the run's lock is held until the ``with`` ends.

    Before training (nothing written, Lightning not imported): the run's identity (inside ``paths.runs_root``), that
    the runs root is writable and the skip check (a finished run: ``OpenedRun(done=record)``; every rank checks, so
    all of a multi-device run skip together), then the data and model checks. Any problem there raises SetupError
    and leaves no trace. Then the run's lock (RunBusy when another process is training it), the skip check again,
    the run directory and the record builder: from here every way the run ends is recorded (completed, failed,
    diverged; interrupted by a signal, after a checkpoint at that step: RunInterrupted).

    A multi-budget launch (experiments.run.budgets) passes what its runs need beyond an ordinary one: ``lineage``
    (the record's ``budget`` and ``trunk_id``) and ``seed`` (a branch: called in the run directory, under the lock,
    before the resume, to start it from its branch point).
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
        yield OpenedRun(done=done)
        return
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
            yield OpenedRun(done=done)  # completed by another process while this one was getting ready
            return
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
        yield OpenedRun(
            cfg=cfg, run=RecordBuilder(cfg, chash, run_id, run_dir, study_dir, plan, lineage), rank_zero=rank_zero
        )
    finally:
        if lock is not None:
            lock.release()
