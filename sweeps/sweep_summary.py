"""Hydra callback that turns a multirun into a verdict: how many runs completed, were skipped, failed, diverged, were
interrupted or not started (the sweep was interrupted before them).

Each job writes ``attnres_job.json`` into its own Hydra output directory (see experiments.train.main); this works
for every launcher, since the files are read back in the launching process at the end of the sweep, whether the
jobs ran in-process (basic), in worker processes (joblib) or on other machines (submitit/SLURM).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

JOB_FILE = "attnres_job.json"
STATUSES = ("completed", "skipped", "failed", "diverged", "interrupted", "not_started")


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    """The job summaries under a multirun directory, ordered by job number."""
    jobs = []
    for path in sorted(Path(sweep_dir).glob(f"*/{JOB_FILE}")):
        try:
            jobs.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as e:
            jobs.append({"status": "failed", "run_id": path.parent.name, "error": f"unreadable {path}: {e}"})
    return sorted(jobs, key=lambda j: j.get("job_num", 0))


def summarize(jobs: list[dict[str, Any]], diverged_is_failure: bool = True) -> tuple[str, bool]:
    """(printable summary, whether every run ended well; a diverged run counts as a failure unless told not to:
    in an LR study the top of the grid is expected to diverge)."""
    counts = Counter(j.get("status", "failed") for j in jobs)
    lines = [f"[attnres] sweep finished: {len(jobs)} runs: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in STATUSES)]
    for j in jobs:
        if j.get("status") in ("failed", "diverged", "interrupted", "not_started") or j.get("error"):
            lines.append(f"  {j['status']:9s} {j.get('run_id', '?')}: {j.get('error', '')}")
    ok = (
        counts.get("failed", 0) == 0
        and counts.get("interrupted", 0) == 0
        and counts.get("not_started", 0) == 0
        and (counts.get("diverged", 0) == 0 or not diverged_is_failure)
    )
    return "\n".join(lines), ok


def interrupted_by(jobs: list[dict[str, Any]]) -> str | None:
    """The signal that interrupted the sweep: the first this process received (a launcher's workers pass theirs
    on to it), else the first a job reports."""
    from experiments.run import interrupts

    return interrupts.received() or next((str(j["signal"]) for j in jobs if j.get("signal")), None)


class SweepSummary(Callback):
    """Print the sweep's outcome, write ``sweep_summary.json`` and fail the process when any run failed (or
    diverged, unless ``diverged_is_failure`` is false: ``hydra.callbacks.sweep_summary.diverged_is_failure``); an
    interrupted sweep (its runs in flight recorded interrupted, the rest not started) exits with 128 + the signal
    number, like a single interrupted run."""

    def __init__(self, diverged_is_failure: bool = True) -> None:
        self.diverged_is_failure = bool(diverged_is_failure)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = collect(sweep_dir)
        text, ok = summarize(jobs, self.diverged_is_failure)
        print(text, flush=True)
        counts = Counter(j.get("status", "failed") for j in jobs)
        (sweep_dir / "sweep_summary.json").write_text(
            json.dumps({"counts": {s: counts.get(s, 0) for s in STATUSES}, "jobs": jobs}, indent=2) + "\n"
        )
        signame = interrupted_by(jobs)
        if signame is not None:
            from experiments.run import interrupts

            print(f"[attnres] sweep interrupted by {signame}: relaunch the same command to resume it", flush=True)
            raise SystemExit(interrupts.exit_code(signame))
        if not ok:
            raise SystemExit(1)
