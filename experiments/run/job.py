"""One run as a Hydra job (:func:`run_job`): how each way a run ends becomes an exit status or, in a multirun, a
line of the sweep's summary (``attnres_job.json`` in the job's Hydra output directory, which
sweeps.sweep_summary.SweepSummary reads back at the end of the multirun: :func:`write_job_summary`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from results.io import atomic_write_text

from . import interrupts
from .errors import DivergedError, RunBusy, RunInterrupted, SetupError, StopRequested
from .identity import run_identity

JOB_FILE = "attnres_job.json"


def run_id_or_guess(cfg: DictConfig) -> str:
    """The run's id, or ``<variant>_<size>_s<seed>`` for a config that does not even resolve."""
    try:
        return run_identity(cfg)[1]
    except Exception:  # noqa: BLE001 - a config that does not even resolve
        return f"{cfg.model.get('variant', '?')}_{cfg.size.get('name', '?')}_s{cfg.get('seed')}"


def write_job_summary(summary: dict[str, Any]) -> None:
    """``summary`` (status, run_id, error or val_loss) with the job's number, pid and threads, written to this
    job's Hydra output directory; nothing outside a Hydra app, nothing on ranks other than zero."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    if "lightning" in sys.modules:  # a run got as far as training: one rank writes
        from .run_env import is_rank_zero

        if not is_rank_zero():
            return
    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
    summary = {"job_num": hc.job.get("num", 0), "pid": os.getpid(), "threads": threads, **summary}
    atomic_write_text(out / JOB_FILE, json.dumps(summary, default=str) + "\n")


def run_job(train: Callable[[DictConfig], dict[str, Any]], cfg: DictConfig) -> float | None:
    """``train(cfg)`` as one job; returns the run's val_loss (None when it has none).

    In a multirun a failed run is recorded and reported, not raised, so the sweep goes on and ends with a summary
    (sweeps.sweep_summary.SweepSummary) whose exit status says whether every run was fine. A config or data error
    (SetupError) prints one line (exit status 2 for a single run); a run another process is training (RunBusy) is
    skipped with a message (exit status 3 for a single run); a diverged run is one line (exit status 1 for a single
    run, no traceback).

    An interrupt (experiments.run.interrupts) stops the run and the sweep: no run starts after it in this process, and
    the launch exits with 128 + the signal number. In the launching process (a single run, Hydra's basic launcher)
    that is a SystemExit at once; in a launcher's worker process (the joblib launcher) the job returns, tells the
    launcher (which passes the signal on to every worker) and starts no further run, so every run in flight stops
    cleanly and the sweep's summary (sweeps.sweep_summary.SweepSummary) exits with that status. A signal while the
    completed record is written lets it be written: the run stands as completed and the sweep stops. In a SLURM job
    that submitit started, a preemption signal (SIGUSR1, SIGUSR2) then requeues the job, which resumes the run
    (experiments.run.interrupts.requeue).
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    worker = multirun and multiprocessing.parent_process() is not None  # a launcher's worker process (joblib)
    if worker:
        interrupts.install_worker()
    elif multirun:
        interrupts.install_job()  # a SLURM job submitit started: a preemption signal requeues it (after the run stops)

    def stop(signame: str, summary: dict[str, Any]) -> None:
        requeued = {"requeued": True} if interrupts.requeues(signame) else {}
        write_job_summary({**summary, "signal": signame, **requeued})
        interrupts.requeue(signame)  # a SLURM job submitit started: requeued (exits) on rank 0 after USR1 / USR2
        if not worker:
            raise SystemExit(interrupts.exit_code(signame))
        interrupts.notify_parent(signame)

    if (signame := interrupts.received()) is not None:  # this launch was interrupted: start nothing
        stop(signame, {"status": "not_started", "run_id": run_id_or_guess(cfg), "error": f"{signame} before it"})
        return None
    try:
        record = train(cfg)
    except RunInterrupted as e:
        stop(e.signame, {"status": "interrupted", "run_id": run_id_or_guess(cfg), "error": str(e)})
        return None
    except StopRequested as e:  # before the run started training: nothing was written for it
        stop(e.signame, {"status": "not_started", "run_id": run_id_or_guess(cfg), "error": f"{e.signame} before it"})
        return None
    except (SetupError, RunBusy) as e:
        kind, status, code = ("config error", "failed", 2) if isinstance(e, SetupError) else ("busy", "skipped", 3)
        print(f"[attnres] {run_id_or_guess(cfg)}: {kind}: {e}", file=sys.stderr, flush=True)
        write_job_summary({"status": status, "run_id": run_id_or_guess(cfg), "error": f"{kind}: {e}"})
        if not multirun:
            raise SystemExit(code) from None
        return None
    except Exception as e:
        diverged = isinstance(e, DivergedError)  # its line is printed already (experiments.run.record_builder)
        if not multirun:
            if diverged:
                raise SystemExit(1) from None
            raise
        status, run_id = "diverged" if diverged else "failed", run_id_or_guess(cfg)
        if not diverged:
            print(f"[attnres] {run_id}: {status}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        write_job_summary({"status": status, "run_id": run_id, "error": f"{type(e).__name__}: {e}"})
        return None
    status = "skipped" if record.get("skipped") else str(record.get("status", "completed"))
    summary = {"status": status, "run_id": record.get("run_id"), "val_loss": record.get("val_loss")}
    if (signame := interrupts.received()) is not None:  # while its completed record was written
        print(
            f"[attnres] {record.get('run_id')}: {signame} while its completed record was written: the record "
            "stands; stopping the sweep",
            flush=True,
        )
        stop(signame, summary)
    else:
        write_job_summary(summary)
    val = record.get("val_loss")
    try:
        return float(val) if val not in (None, "") else None
    except (TypeError, ValueError):
        return None
