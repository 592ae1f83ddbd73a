"""Issue 15, runs: one process per run (the run lock), interrupts that checkpoint and resume, the thread count in
the record, and rank zero under SLURM before a Trainer exists."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, TEST_MAX_BYTES, cli_overrides, compose, run_cli

from experiments.run.errors import RunBusy
from experiments.run.identity import run_identity
from experiments.run.run_env import is_rank_zero
from experiments.train import train
from experiments.training.callbacks import read_metrics
from results import ledger

torch.set_num_threads(1)


# ---- 5. the run lock -----------------------------------------------------------------------------------------
_HOLDER = """
import sys, time, filelock
lock = filelock.SoftFileLease(
    sys.argv[1], lease_duration=float(sys.argv[2]), heartbeat_interval=float(sys.argv[2]) / 10, thread_local=False
)
lock.acquire(timeout=0)
print("held", flush=True)
time.sleep(120)
"""


def _hold_lock(path: Path) -> subprocess.Popen:
    from experiments.run.locks import LOCK_LEASE_S

    path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path), str(LOCK_LEASE_S)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_run_held_by_a_live_process_is_not_trained_twice(train_cfg):
    cfg = train_cfg()
    _, run_id, run_dir, study_dir = run_identity(cfg)
    holder = _hold_lock(study_dir / ".locks" / f"{run_id}.lock")
    try:
        with pytest.raises(RunBusy, match=rf"{run_id} is being trained right now by \S+ pid {holder.pid}"):
            train(cfg)
        assert not run_dir.exists()
        assert not (study_dir / "records").exists()
    finally:
        holder.kill()
        holder.wait()
    # the holder died (kill -9): its marker is stale on this host and taken over at once
    assert train(cfg)["status"] == "completed"


def _foreign_holder(path: Path, lease: float) -> subprocess.Popen:
    """A lock holder that looks like a process on another node (its own UTS namespace, hostname 'othernode')."""
    path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname othernode && exec "$0" -c "$1" "$2" "$3"',
            sys.executable,
            _HOLDER,
            str(path),
            str(lease),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    if proc.stdout.readline().strip() != "held":
        proc.kill()
        pytest.skip("cannot start a process with another hostname here (unshare --uts)")
    return proc


def test_a_lock_from_another_node_is_taken_over_only_when_its_heartbeat_stops(tmp_path, monkeypatch):
    from experiments.run import locks

    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    monkeypatch.setattr(locks, "LOCK_LEASE_S", 2.0)
    monkeypatch.setattr(locks, "LOCK_HEARTBEAT_S", 0.2)
    study = tmp_path / "study"
    holder = _foreign_holder(study / ".locks" / "r.lock", 2.0)
    try:
        t0 = time.monotonic()
        with pytest.raises(RunBusy, match=r"r is being trained right now by othernode pid \d+"):
            locks.acquire_run_lock(study, "r")  # a live heartbeat on another node: it keeps the run
        assert time.monotonic() - t0 >= 2.0  # it was watched for a whole lease first
        holder.send_signal(signal.SIGSTOP)  # the node hangs: its heartbeat stops, its pid means nothing here
        lock = locks.acquire_run_lock(study, "r")
        assert lock.is_locked
        lock.release()
    finally:
        holder.kill()
        holder.wait()


def test_two_launches_of_one_config_at_once_train_it_once(tmp_path, data_cache):
    common = [*cli_overrides(tmp_path, data_cache), f"paths.runs_root={tmp_path / 'runs'}", "size.tokens=98304"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "experiments.train", *common]
    procs = [
        subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    codes = sorted(p.returncode for p in procs)
    (study,) = (tmp_path / "runs").iterdir()
    recs = ledger.read_records(study)
    assert [r["status"] for r in recs] == ["completed"], outs
    assert codes in ([0, 0], [0, 3]), outs  # the second one skipped it (done) or stopped (busy), with a message
    if codes == [0, 3]:
        assert any("busy:" in o and "is being trained right now by" in o for o in outs), outs
    (run_dir,) = [p for p in study.iterdir() if p.is_dir() and not p.name.startswith((".", "records"))]
    # the last two checkpoints (experiments/run/checkpoint_io.py), and no last-v1.ckpt
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.ckpt", "last.prev.ckpt"]


# ---- 6. interrupts -------------------------------------------------------------------------------------------
def test_sigterm_checkpoints_the_step_records_interrupted_and_resumes_bit_identically(tmp_path, data_cache):
    common = cli_overrides(tmp_path, data_cache)
    proc = run_cli([*common, f"paths.runs_root={tmp_path / 'a'}", "fault.signal_at_step=7", "fault.signal=SIGTERM"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "Traceback" not in out
    (line,) = [ln for ln in out.splitlines() if "interrupted by SIGTERM" in ln]
    assert "at step 8" in line
    assert "last.ckpt saved at that step" in line
    assert "Relaunch" in line
    (run_dir,) = (tmp_path / "a" / "smoke").glob("baseline_*")
    (rec,) = ledger.read_records(run_dir.parent)
    assert rec["status"] == "interrupted"
    assert rec["steps"] == 8
    assert "SIGTERM" in rec["error"]
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 8  # the step of the interrupt, not the last periodic checkpoint (5)

    resumed = train(compose([*common, f"paths.runs_root={tmp_path / 'a'}"]))
    reference = train(compose([*common, f"paths.runs_root={tmp_path / 'b'}"]))
    assert resumed["status"] == "completed"
    assert resumed["config_hash"] == reference["config_hash"]
    got = read_metrics(run_dir / "metrics.csv")
    want = read_metrics(Path(reference["run_dir"]) / "metrics.csv")
    assert [r["step"] for r in got] == list(range(1, 13))
    assert [r["train_loss"] for r in got] == [r["train_loss"] for r in want]  # bit-identical
    assert resumed["val_loss"] == reference["val_loss"]
    assert [r["status"] for r in ledger.read_records(run_dir.parent)] == ["interrupted", "completed"]


@pytest.mark.parametrize("signame", ["SIGINT", "SIGUSR1"])
def test_ctrl_c_and_sigusr1_are_interrupts_too(tmp_path, data_cache, signame):
    common = cli_overrides(tmp_path, data_cache)
    proc = run_cli([*common, f"paths.runs_root={tmp_path / 'r'}", "fault.signal_at_step=3", f"fault.signal={signame}"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 128 + getattr(signal, signame), out[-3000:]
    assert "Traceback" not in out
    assert "KeyboardInterrupt" not in out
    assert f"interrupted by {signame} at step 4" in out
    (rec,) = ledger.read_records(tmp_path / "r" / "smoke")
    assert rec["status"] == "interrupted"
    assert rec["steps"] == 4


def test_ctrl_c_of_a_study_stops_with_one_line_and_the_run_resumes(tmp_path, data_cache):
    """Ctrl-C reaches the whole process group (the study, Hydra, the run): one line, the run in flight recorded
    interrupted with a checkpoint, and the same command finishes the study."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
        "PYTHONUNBUFFERED": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "sweeps.study",
        "quick",
        f"data.cache_dir={data_cache}",
        f"data.max_bytes={TEST_MAX_BYTES}",
        "model=baseline",
        "size=cpu_xs",
        "size.tokens=400000",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "--jobs",
        "1",
        "--seeds",
        "0",
        "--runs-root",
        str(tmp_path / "runs"),
        "--reports-root",
        str(tmp_path / "reports"),
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if ": starting;" in line:
            break
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)
    rest = proc.communicate(timeout=300)[0]
    out = "".join(seen) + rest
    assert proc.returncode == 130, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert "KeyboardInterrupt" not in out, out[-3000:]
    assert "re-run the same command to resume" in out
    (study,) = (tmp_path / "runs").iterdir()
    (rec,) = ledger.read_records(study)
    assert rec["status"] == "interrupted"
    assert rec["steps"] > 0
    ckpt = torch.load(Path(rec["run_dir"]) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == rec["steps"]


def test_wall_clock_checkpoints_are_configured():
    """Besides every N steps, last.ckpt is written on a wall-clock cadence (Lightning's train_time_interval)."""
    from datetime import timedelta

    from hydra.utils import instantiate

    cfg = compose(["experiment=cpu_ladder", "paths.run_dir=/tmp/x"])
    cb = instantiate(cfg.callbacks.time_checkpoint)
    assert cb._train_time_interval == timedelta(minutes=5)
    assert cb.save_last
    assert cb.dirpath == "/tmp/x/checkpoints"


# ---- 8. thread count -----------------------------------------------------------------------------------------
def test_thread_count_is_recorded_and_a_completed_run_is_skipped_across_thread_counts(train_cfg):
    try:
        first = train(train_cfg("threads=1", "size.tokens=8192", "train.eval_count=1"))
        assert first["threads"] == 1
        (row,) = ledger.read_rows(Path(first["run_dir"]).parent / "results.csv")
        assert row["threads"] == "1"
        second = train(train_cfg("threads=2", "size.tokens=8192", "train.eval_count=1"))
        assert second.get("skipped")
        assert second["config_hash"] == first["config_hash"]
    finally:
        torch.set_num_threads(1)


# ---- 14. rank zero before the Trainer exists -------------------------------------------------------------------
def test_rank_zero_under_srun_follows_lightnings_slurm_environment(monkeypatch):
    for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    assert is_rank_zero()
    slurm = {
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_JOB_NAME": "attnres",
        "SLURM_JOB_ID": "7",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "node1",
        "SLURM_LOCALID": "1",
        "SLURM_PROCID": "1",
    }
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    assert not is_rank_zero()  # task 1 of an srun step: not rank zero, whatever RANK/LOCAL_RANK say
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    assert is_rank_zero()
    for key in slurm:
        monkeypatch.delenv(key)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("NODE_RANK", "1")  # local rank 0 of the second node
    assert not is_rank_zero()


def test_a_non_zero_rank_writes_no_record(train_cfg, monkeypatch):
    """Under srun every task runs train(); only rank zero may write the record and take the lock."""
    import experiments.run.single_run as t

    monkeypatch.setattr(t, "is_rank_zero", lambda: False)
    cfg = train_cfg("size.tokens=8192", "train.eval_count=1")
    rec = train(cfg)
    assert rec["status"] == "completed"
    study = Path(cfg.paths.runs_root) / "smoke"
    assert not (study / "records").exists()
    assert not (study / ".locks").exists()
