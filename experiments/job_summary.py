"""One line of a sweep's summary per job: ``attnres_job.json`` in the job's Hydra output directory, which
sweeps.callbacks.SweepSummary reads back at the end of a multirun (:func:`write_job_summary`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from . import records
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
    records.atomic_write_text(out / JOB_FILE, json.dumps(summary, default=str) + "\n")
