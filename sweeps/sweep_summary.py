"""Hydra callback that turns a multirun into a verdict: how many runs completed, were skipped, failed, diverged, were
interrupted or not started (the sweep was interrupted before them).

Each job writes ``attnres_job.json`` into its own Hydra output directory (see experiments.run.job); this works
for every launcher, since the files are read back in the launching process at the end of the sweep, whether the
jobs ran in-process (basic), in worker processes (joblib) or on other machines (submitit/SLURM).

A launch that never reaches the end of its sweep (its process killed outright, or, under SLURM, a job that died, which
makes submitit's launcher raise before Hydra's end of multirun) leaves no ``sweep_summary.json``. The next launch of
the same study (same ``study`` and ``paths.runs_root``, the command run again) rebuilds it at its start from the files
its jobs left, a planned job without one counted failed (its directory exists: it died) or not started, and prints it.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

JOB_FILE = "attnres_job.json"
SUMMARY_FILE = "sweep_summary.json"
STATUSES = ("completed", "skipped", "failed", "diverged", "interrupted", "not_started")
DIED = "left no job summary: the job died (killed outright, out of memory, a node lost)"
NOT_STARTED = "no job directory: not started when the summary was rebuilt"


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    """The job summaries under a multirun directory, ordered by job number."""
    jobs = []
    for path in sorted(Path(sweep_dir).glob(f"*/{JOB_FILE}")):
        try:
            jobs.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as e:
            num = int(path.parent.name) if path.parent.name.isdigit() else 0
            jobs.append(
                {"job_num": num, "status": "failed", "run_id": path.parent.name, "error": f"unreadable {path}: {e}"}
            )
    return sorted(jobs, key=lambda j: j.get("job_num", 0))


def summarize(
    jobs: list[dict[str, Any]], diverged_is_failure: bool = True, head: str = "sweep finished"
) -> tuple[str, bool]:
    """(printable summary, its first line starting with ``head``; whether every run ended well: a diverged run counts
    as a failure unless told not to, in an LR study the top of the grid is expected to diverge)."""
    counts = Counter(j.get("status", "failed") for j in jobs)
    lines = [f"[attnres] {head}: {len(jobs)} runs: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in STATUSES)]
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


def write_summary(sweep_dir: Path, jobs: list[dict[str, Any]], **extra: Any) -> None:
    """``sweep_summary.json`` in ``sweep_dir``: the count per status, every job's summary (and ``extra`` keys)."""
    counts = Counter(j.get("status", "failed") for j in jobs)
    doc = {"counts": {s: counts.get(s, 0) for s in STATUSES}, "jobs": jobs, **extra}
    (sweep_dir / SUMMARY_FILE).write_text(json.dumps(doc, indent=2) + "\n")


def planned_jobs(sweep_dir: Path) -> int | None:
    """How many jobs the multirun of ``sweep_dir`` planned, from the ``multirun.yaml`` Hydra saved there at its start
    (its basic sweeper's params, then the command's overrides, expanded as that sweeper does); None without it."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    path = Path(sweep_dir) / "multirun.yaml"
    if not path.is_file():
        return None
    hydra = OmegaConf.to_container(OmegaConf.load(path).hydra, resolve=False)
    assert isinstance(hydra, dict)
    if not str(hydra["sweeper"].get("_target_", "")).endswith("BasicSweeper"):
        return None
    params = [f"{k}={v}" for k, v in (hydra["sweeper"].get("params") or {}).items()]
    overrides = OverridesParser.create().parse_overrides([*params, *hydra["overrides"]["task"]])
    return sum(len(batch) for batch in BasicSweeper.split_arguments(overrides, None))


def rebuilt_jobs(sweep_dir: Path) -> list[dict[str, Any]]:
    """The job summaries of a multirun that did not reach its end: those its jobs wrote, and one for each planned job
    (:func:`planned_jobs`; else each job directory) that wrote none: ``failed`` where its directory exists (the job
    started and died), ``not_started`` where it does not."""
    jobs = collect(sweep_dir)
    written = {j.get("job_num") for j in jobs}
    planned = planned_jobs(sweep_dir)
    nums = range(planned) if planned is not None else sorted(int(p.name) for p in sweep_dir.glob("[0-9]*"))
    for num in nums:
        if num not in written:
            started = (sweep_dir / str(num)).is_dir()
            status, error = ("failed", DIED) if started else ("not_started", NOT_STARTED)
            jobs.append({"job_num": num, "status": status, "run_id": f"job {num}", "error": error})
    return sorted(jobs, key=lambda j: j.get("job_num", 0))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def unfinished_launches(config: DictConfig) -> list[Path]:
    """The earlier multiruns of this launch's study (same ``study`` and ``paths.runs_root``, as written) that left no
    summary and whose launching process is gone: the sweep directories beside this one in conf/hydra/default.yaml's
    layout, ``multiruns/<day>/<time>_pid<pid>`` (another layout: none)."""
    from omegaconf import OmegaConf

    here = Path(config.hydra.sweep.dir)
    if here.parent.parent.name != "multiruns":
        return []
    raw = OmegaConf.to_container(config, resolve=False)
    assert isinstance(raw, dict)
    mine = (raw.get("study"), (raw.get("paths") or {}).get("runs_root"))
    found = []
    for path in sorted(here.parent.parent.glob("*/*/multirun.yaml")):
        sweep_dir = path.parent
        pid = re.search(r"_pid(\d+)$", sweep_dir.name)
        if sweep_dir == here or (sweep_dir / SUMMARY_FILE).exists() or pid is None or _alive(int(pid.group(1))):
            continue
        other = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        assert isinstance(other, dict)
        if (other.get("study"), (other.get("paths") or {}).get("runs_root")) == mine:
            found.append(sweep_dir)
    return found


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

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """The summaries the study's earlier launches could not write (:func:`unfinished_launches`), rebuilt from
        their jobs' files, written and printed; never a reason for this launch to fail."""
        try:
            for sweep_dir in unfinished_launches(config):
                jobs = rebuilt_jobs(sweep_dir)
                head = f"earlier sweep {sweep_dir} (its launch ended before its summary; rebuilt from its jobs' files)"
                print(summarize(jobs, self.diverged_is_failure, head=head)[0], flush=True)
                write_summary(sweep_dir, jobs, rebuilt=True)
        except Exception as e:  # noqa: BLE001 - a damaged earlier sweep directory must not stop this launch
            print(f"[attnres] warning: the summary of an earlier launch could not be rebuilt: {e}", flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = collect(sweep_dir)
        text, ok = summarize(jobs, self.diverged_is_failure)
        print(text, flush=True)
        write_summary(sweep_dir, jobs)
        signame = interrupted_by(jobs)
        if signame is not None:
            from experiments.run import interrupts

            print(f"[attnres] sweep interrupted by {signame}: relaunch the same command to resume it", flush=True)
            raise SystemExit(interrupts.exit_code(signame))
        if not ok:
            raise SystemExit(1)
