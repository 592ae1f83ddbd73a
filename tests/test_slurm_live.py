"""Issue 45: the SLURM launcher against a live one-node SLURM 22.05 cluster (scripts/slurm_cluster.sh, started once per
session by the ``slurm_cluster`` fixture in tests/conftest.py, or by .ci/run; skipped where its packages cannot be
installed).

Every launch is the command docs/cluster.md gives, ``python -m experiments.train -m ... +launcher=slurm`` with the
CPU overrides below (smoke shapes, one CPU per task): a small sweep completes with its records while a run that
crashes in it is recorded failed; a job preempted in training (``scancel --signal=USR2``, what SLURM sends before a
time limit) saves a checkpoint at that step, is requeued by submitit and ends bit-identical to an uninterrupted run,
as does one signalled before its training started; a job killed outright is seen as FAILED through accounting (no
endless wait) while the other job completes; a request the node can never satisfy fails at once with SLURM's
reason; a 2-task DDP job (gloo, one srun task per rank) trains and, preempted, resumes bit-identically.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import REPO, cli_overrides, compose

from experiments.training.callbacks import read_metrics
from results import ledger

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the live SLURM cluster runs on Linux only")

# One task per job on one CPU, no GPU: what the tests (and a CPU-only cluster) add to +launcher=slurm.
CPU = (
    "+launcher=slurm",
    "trainer=cpu",
    "trainer.accelerator=cpu",
    "trainer.devices=1",
    "hydra.launcher.gpus_per_node=0",
    "hydra.launcher.cpus_per_task=1",
)
DDP = ("trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true")
LONGER = ("size.tokens=98304",)  # 24 steps of 32 x 128: room for a signal in training


@pytest.fixture(autouse=True)
def _no_slurm_output_in_the_repository():
    """Every job runs in its test's tmp_path: no ``slurm-<job>.out`` (sbatch's default output, in the submitting
    directory) appears at the repository's root."""
    before = set(REPO.glob("slurm-*.out"))
    yield
    assert set(REPO.glob("slurm-*.out")) <= before


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def _launch(tmp_path: Path, data_cache: Path, base: str, *overrides: str) -> tuple[subprocess.Popen, Path, str]:
    """Start a multirun through the SLURM launcher from ``tmp_path`` (sbatch's working directory is its jobs', where
    anything they write without a path goes, never the repository); (the process, its log file, its jobs' name:
    ``base`` and a suffix of its own, so that accounting tells it from earlier sessions' jobs)."""
    log = tmp_path / f"{base}.log"
    name = f"{base}-{uuid.uuid4().hex[:8]}"
    args = [*cli_overrides(tmp_path, data_cache), *CPU, f"hydra.launcher.name={name}", *overrides]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "experiments.train", "-m", *args],
            cwd=tmp_path,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return proc, log, name


def _finish(proc: subprocess.Popen, log: Path, timeout: float = 240) -> tuple[int, str]:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the launch did not end in {timeout} s:\n{log.read_text()[-4000:]}") from None
    return rc, log.read_text()


def _slurm(*args: str) -> str:
    return subprocess.run(list(args), env=_env(), capture_output=True, text=True, timeout=30, check=True).stdout


def _job_id(name: str, timeout: float = 60) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ids := _slurm("squeue", "-h", "-n", name, "-o", "%i").split():
            return ids[0]
        time.sleep(0.2)
    raise AssertionError(f"no job named {name} in squeue after {timeout} s")


def _job_states(name: str, timeout: float = 60) -> list[str]:
    """Every state the jobs named ``name`` went through (-D: requeued attempts too) once they all ended (a job's
    result reaches the launcher a moment before accounting says the job ended)."""

    def ended() -> list[str] | None:
        out = _slurm("sacct", "-D", "-X", "-n", "-P", "--name", name, "-o", "State")
        states = [line.split()[0] for line in out.splitlines() if line.strip()]
        return None if any(s in ("PENDING", "RUNNING", "COMPLETING") for s in states) else states

    return _wait_for(f"the jobs named {name} ended", ended, timeout=timeout, poll=0.5)


def _wait_for(what: str, check, timeout: float = 120, poll: float = 0.1):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if found := check():
            return found
        time.sleep(poll)
    raise AssertionError(f"{what}: not within {timeout} s")


def _trained_to(runs: Path, step: int) -> bool:
    for metrics in runs.glob("smoke/*/metrics.csv"):
        rows = [r for r in read_metrics(metrics) if r.get("train_loss") is not None]
        if rows and rows[-1]["step"] >= step:
            return True
    return False


def _job_logs(tmp_path: Path, job: str = "*") -> str:
    """The logs of job ``job`` (submitit's, every task and attempt; default: every job) under tmp_path."""
    paths = sorted(tmp_path.glob(f"outputs/multiruns/*/*/.submitit/{job}/*_log.*"))
    return "\n".join(p.read_text(errors="replace") for p in paths)


def _reference(tmp_path: Path, data_cache: Path, *overrides: str) -> Path:
    """The same run trained in this process, never interrupted; its run directory."""
    from experiments.train import train

    cfg = compose([*cli_overrides(tmp_path, data_cache), f"paths.runs_root={tmp_path / 'reference'}", *overrides])
    return Path(train(cfg)["run_dir"])


def _assert_bit_identical(run_dir: Path, ref_dir: Path, steps: int) -> None:
    want, got = read_metrics(ref_dir / "metrics.csv"), read_metrics(run_dir / "metrics.csv")
    assert [r["step"] for r in got] == list(range(1, steps + 1))  # every step once: nothing lost, nothing repeated
    assert [r["train_loss"] for r in got] == [r["train_loss"] for r in want]
    assert [r["val_loss"] for r in got] == [r["val_loss"] for r in want]
    final, ref = (json.loads((d / "results.json").read_text()) for d in (run_dir, ref_dir))
    assert (final["status"], final["val_loss"], final["config_hash"]) == (
        "completed",
        ref["val_loss"],
        ref["config_hash"],
    )


def test_a_small_study_completes_with_its_records_and_a_run_that_crashes_is_recorded_failed(
    tmp_path, data_cache, slurm_cluster
):
    """Three jobs, seed=100,101,3 with fault.raise_at_step=${seed}: the seed-3 run raises before step 4 (12 steps
    in all; the others never reach their fault step); it is recorded failed, the others complete, and the sweep's
    summary says so and fails the launch."""
    t0 = time.monotonic()
    runs = tmp_path / "runs"
    proc, log, name = _launch(
        tmp_path, data_cache, "study", f"paths.runs_root={runs}", "seed=100,101,3", "fault.raise_at_step=${seed}"
    )
    rc, out = _finish(proc, log)
    assert rc == 1, out[-4000:]  # the sweep's summary fails the launch: one run failed
    assert "sweep finished: 3 runs: 2 completed, 0 skipped, 1 failed" in out, out[-3000:]
    assert "fault.raise_at_step=3: injected failure" in out, out[-3000:]
    recs = ledger.read_records(runs / "smoke")
    want = [(3, "failed", 3), (100, "completed", 12), (101, "completed", 12)]
    assert sorted((r["seed"], r["status"], r["steps"]) for r in recs) == want
    assert _job_states(name) == ["COMPLETED"] * 3  # every job itself ended well: the failure is the run's
    print(f"[slurm] study of 3 jobs: {time.monotonic() - t0:.0f} s")


def test_a_job_preempted_in_or_before_training_is_requeued_and_resumes_bit_identically(
    tmp_path, data_cache, slurm_cluster
):
    """Two single-job sweeps side by side: ``scancel --signal=USR2`` to one once it trained 3 steps (it saves a
    checkpoint at the step it is in and submitit requeues it), to the other as soon as its job said it handles the
    signal, before training started (nothing to save: it is requeued and starts afresh)."""
    t0 = time.monotonic()
    runs = {"in": tmp_path / "runs_in", "before": tmp_path / "runs_before"}
    launches = {
        k: _launch(tmp_path, data_cache, f"preempt_{k}", f"paths.runs_root={r}", *LONGER) for k, r in runs.items()
    }
    job_in, job_before = _job_id(launches["in"][2]), _job_id(launches["before"][2])
    _wait_for("the job before training says it requeues", lambda: "requeue the job" in _job_logs(tmp_path, job_before))
    _slurm("scancel", "--signal=USR2", job_before)
    _wait_for("3 steps trained", lambda: _trained_to(runs["in"], 3), timeout=180)
    _slurm("scancel", "--signal=USR2", job_in)
    ref_dir = _reference(tmp_path, data_cache, *LONGER)

    for key, (proc, log, name) in launches.items():
        rc, out = _finish(proc, log)
        assert rc == 0, out[-4000:]
        assert "sweep finished: 1 runs: 1 completed" in out, out[-3000:]
        assert _job_states(name) == ["REQUEUED", "COMPLETED"], _job_logs(tmp_path)[-4000:]
        recs = ledger.read_records(runs[key] / "smoke")
        (run_dir,) = {Path(r["run_dir"]) for r in recs}
        _assert_bit_identical(run_dir, ref_dir, steps=24)
        if key == "in":  # a checkpoint at the step the signal found, then the requeued job resumed from it
            assert [r["status"] for r in recs] == ["interrupted", "completed"]
            assert recs[0]["error"].startswith("interrupted by SIGUSR2 at step ")
            assert 3 <= recs[0]["steps"] < 24
        else:  # nothing had started: no record before the completed one
            assert [r["status"] for r in recs] == ["completed"]
    logs = _job_logs(tmp_path)
    assert logs.count("requeueing this SLURM job") == 2, logs[-4000:]
    print(f"[slurm] two preempted jobs and the reference: {time.monotonic() - t0:.0f} s")


def test_a_job_that_dies_is_seen_as_failed_and_the_other_jobs_complete(tmp_path, data_cache, slurm_cluster):
    """seed=100,3 with fault.kill_at_step=${seed}: the seed-3 job is killed outright (SIGKILL) before step 4, so it
    leaves no result; accounting says FAILED, so the launcher stops waiting for it (without accounting it would wait
    forever) with submitit's error naming the job, while the other job of the array completes its record."""
    runs = tmp_path / "runs"
    proc, log, name = _launch(
        tmp_path, data_cache, "dies", f"paths.runs_root={runs}", "seed=100,3", "fault.kill_at_step=${seed}"
    )
    rc, out = _finish(proc, log)
    assert rc == 1, out[-4000:]
    assert "has not produced any output (state: FAILED)" in out, out[-3000:]
    assert sorted(_job_states(name)) == ["COMPLETED", "FAILED"]
    (rec,) = ledger.read_records(runs / "smoke")
    assert (rec["seed"], rec["status"], rec["steps"]) == (100, "completed", 12)


def test_an_impossible_request_fails_at_once_with_slurms_reason(tmp_path, data_cache, slurm_cluster):
    t0 = time.monotonic()
    proc, log, name = _launch(
        tmp_path, data_cache, "too_big", f"paths.runs_root={tmp_path / 'runs'}", "hydra.launcher.cpus_per_task=64"
    )
    rc, out = _finish(proc, log, timeout=120)
    assert rc != 0
    assert "More processors requested than permitted" in out, out[-3000:]
    assert not _slurm("squeue", "-h", "-n", name).strip()  # nothing left pending
    assert not (tmp_path / "runs").exists()
    assert time.monotonic() - t0 < 60


def test_ddp_through_srun_trains_and_a_preempted_ddp_job_resumes_bit_identically(tmp_path, data_cache, slurm_cluster):
    """Two 2-task jobs side by side (one srun task per rank, gloo, Lightning's SLURMEnvironment): one never
    interrupted, the other preempted (USR2 to both tasks) after 3 steps: one checkpoint, requeued, resumed, equal to
    the first bit for bit."""
    t0 = time.monotonic()
    shape = ("model=block_attnres", "size.tokens=32768", "size.batch_size=16", "train.eval_count=4")
    runs = tmp_path / "runs"
    ref_launch = _launch(tmp_path, data_cache, "ddp_ref", f"paths.runs_root={tmp_path / 'ref'}", *DDP, *shape)
    proc, log, name = _launch(tmp_path, data_cache, "ddp_preempt", f"paths.runs_root={runs}", *DDP, *shape)
    ref_job, job = _job_id(ref_launch[2]), _job_id(name)
    _wait_for("3 DDP steps trained", lambda: _trained_to(runs, 3), timeout=240)
    _slurm("scancel", "--signal=USR2", job)

    rc, out = _finish(*ref_launch[:2])
    assert rc == 0, out[-4000:] + _job_logs(tmp_path)[-4000:]
    logs = _job_logs(tmp_path, ref_job)
    for line in ("MEMBER: 1/2", "MEMBER: 2/2", "local_rank=1(2)", "gloo"):  # two srun tasks, ranks from SLURM
        assert line in logs, logs[-4000:]
    (ref,) = ledger.read_records(tmp_path / "ref" / "smoke")
    assert ref["status"] == "completed"

    rc, out = _finish(proc, log)
    assert rc == 0, out[-4000:] + _job_logs(tmp_path, job)[-4000:]
    assert _job_states(name) == ["REQUEUED", "COMPLETED"]
    recs = ledger.read_records(runs / "smoke")
    assert [r["status"] for r in recs] == ["interrupted", "completed"]
    assert 3 <= recs[0]["steps"] < 16
    _assert_bit_identical(Path(recs[-1]["run_dir"]), Path(ref["run_dir"]), steps=16)
    print(f"[slurm] a DDP job and a preempted one side by side: {time.monotonic() - t0:.0f} s")
