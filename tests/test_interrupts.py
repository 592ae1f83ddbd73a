"""Issue 23, interrupts: SIGINT, SIGTERM and SIGUSR1 in every phase of a run (training: tests/test_run_safety.py;
here an evaluation, the final evaluation, a checkpoint being written, the completed record being written) stop it at
a consistent point with a checkpoint of that step and an `interrupted` record, and stop the whole sweep (Hydra's
basic launcher, the joblib launcher, sweeps.study); a sweep whose parent is killed outright stops cleanly, and its
relaunch runs exactly the unfinished runs (experiments/run/interrupts.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, TEST_MAX_BYTES, cli_overrides, compose

from experiments.run.job import run_job
from experiments.train import train
from experiments.training.callbacks import read_metrics
from results import ledger
from sweeps.chaos import child_pids

torch.set_num_threads(1)

SIGNALS = ("SIGINT", "SIGTERM", "SIGUSR1")
# 12 steps, evaluations at 6 and 12 (two batches each), a checkpoint every 5 steps
COMMON = ("train.log_every=1", "train.val_batch_size=8", "callbacks.model_checkpoint.every_n_train_steps=5")
# phase -> (its fault injection, the step the run stops at: the consistent point)
PHASES = {
    "evaluation": (("fault.signal_phase=eval", "fault.signal_at_step=6"), 6),
    "final-evaluation": (("fault.signal_phase=eval", "fault.signal_at_step=12"), 12),
    "checkpoint": (("fault.signal_phase=checkpoint", "fault.signal_at_step=5"), 5),
}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_cache):
    """The same run, never interrupted: what every resumed run must equal."""
    root = tmp_path_factory.mktemp("reference")
    rec = train(
        compose(
            [
                "experiment=smoke",
                f"paths.runs_root={root}",
                f"data.cache_dir={data_cache}",
                f"data.max_bytes={TEST_MAX_BYTES}",
                "threads=1",
                "trainer.enable_progress_bar=false",
                *COMMON,
            ]
        )
    )
    return [r["train_loss"] for r in read_metrics(Path(rec["run_dir"]) / "metrics.csv")], rec["val_loss"]


@pytest.mark.parametrize("phase", sorted(PHASES))
@pytest.mark.parametrize("signame", SIGNALS)
def test_an_interrupt_in_any_phase_checkpoints_a_consistent_step_and_resumes(
    train_cfg, capsys, reference, signame, phase
):
    faults, step = PHASES[phase]
    cfg = train_cfg(*COMMON, *faults, f"fault.signal={signame}")
    with pytest.raises(SystemExit) as exit_:
        run_job(train, cfg)  # as the command line runs it: a single run
    assert exit_.value.code == 128 + getattr(signal, signame)
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if f"interrupted by {signame}" in ln]
    assert f"interrupted by {signame} at step {step}; checkpoint " in line
    assert "last.ckpt saved at that step; recorded as interrupted" in line
    (rec,) = ledger.read_records(Path(cfg.paths.runs_root) / "smoke")
    assert (rec["status"], rec["steps"]) == ("interrupted", step)
    run_dir = Path(rec["run_dir"])
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == step
    if phase.endswith("evaluation"):  # the evaluation was finished and recorded before the stop
        assert json.loads((run_dir / "diagnostics.json").read_text())["step"] == step

    if signame != "SIGTERM":
        return  # the step and the checkpoint are what a resume needs; one signal per phase resumes below
    resumed = train(train_cfg(*COMMON))
    assert resumed["status"] == "completed"
    losses, val_loss = reference
    assert [r["train_loss"] for r in read_metrics(run_dir / "metrics.csv")] == losses  # bit-identical
    assert resumed["val_loss"] == val_loss
    diags = [json.loads(ln) for ln in (run_dir / "diagnostics.jsonl").read_text().splitlines()]
    assert [d["step"] for d in diags] == [6, 12]  # each step evaluated once: none lost, none repeated


@pytest.mark.parametrize("signame", SIGNALS)
def test_an_interrupt_while_the_completed_record_is_written_keeps_it_and_stops(train_cfg, capsys, monkeypatch, signame):
    """The last phase: the run is complete and its record is being written. The record is written whole and stands
    (nothing is lost, nothing needs a relaunch), and the launch stops with the signal's exit status."""
    real = ledger.add_record

    def signalled(study_dir, record):
        if record["status"] == "completed":
            os.kill(os.getpid(), getattr(signal, signame))
        return real(study_dir, record)

    monkeypatch.setattr(ledger, "add_record", signalled)
    cfg = train_cfg(*COMMON)
    with pytest.raises(SystemExit) as exit_:
        run_job(train, cfg)
    assert exit_.value.code == 128 + getattr(signal, signame)
    assert f"{signame} while its completed record was written: the record stands; stopping" in capsys.readouterr().out
    (rec,) = ledger.read_records(Path(cfg.paths.runs_root) / "smoke")
    assert rec["status"] == "completed"


def test_an_interrupt_stops_a_basic_multirun_instead_of_starting_the_next_run(tmp_path, data_cache):
    """Ctrl-C during the final evaluation of the first of two seeds: it was ignored, and the sweep went on."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.train",
            "-m",
            *cli_overrides(tmp_path, data_cache),
            f"paths.runs_root={tmp_path / 'runs'}",
            "seed=0,1",
            "train.val_batch_size=8",
            "fault.signal_phase=eval",
            "fault.signal_at_step=12",
            "fault.signal=SIGINT",
        ],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 130, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    (rec,) = ledger.read_records(tmp_path / "runs" / "smoke")
    assert (rec["seed"], rec["status"], rec["steps"]) == (0, "interrupted", 12)
    assert not list((tmp_path / "runs" / "smoke").glob("baseline_cpu_xs_s1_*"))  # the second run never started


def test_a_signal_to_one_joblib_worker_stops_every_run_in_flight_and_the_sweep(tmp_path, data_cache):
    """SIGUSR1 to one of two workers (as a scheduler might send it): that worker tells the launcher, which passes it
    on, so both runs in flight checkpoint and are recorded interrupted, the queued runs never start, and the sweep
    exits 128 + 10. Before, the first SystemExit made joblib kill the other worker outright."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("needs /proc to find the workers")
    cmd = [
        sys.executable,
        "-m",
        "experiments.train",
        "-m",
        *cli_overrides(tmp_path, data_cache),
        f"paths.runs_root={tmp_path / 'runs'}",
        "+launcher=parallel",
        "hydra.launcher.n_jobs=2",
        "seed=0,1,2,3",
        "size.tokens=1000000",  # ~240 steps: long enough to be caught in flight
        "size.batch_size=32",
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env={**_env(), "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    seen = []
    assert proc.stdout is not None
    for raw in proc.stdout:
        seen.append(raw.decode(errors="replace"))
        if sum(": starting;" in ln for ln in seen) == 2:
            break
    time.sleep(1.0)
    workers = child_pids(proc.pid)
    assert len(workers) == 2, (workers, "".join(seen)[-3000:])
    os.kill(workers[0], signal.SIGUSR1)
    rest = proc.communicate(timeout=300)[0].decode(errors="replace")
    out = "".join(seen) + rest
    assert proc.returncode == 128 + signal.SIGUSR1, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    assert "4 runs: 0 completed, 0 skipped, 0 failed, 0 diverged, 2 interrupted, 2 not_started" in out, out[-3000:]
    recs = ledger.read_records(tmp_path / "runs" / "smoke")
    assert sorted(r["status"] for r in recs) == ["interrupted", "interrupted"]
    assert {r["error"].split(" at ")[0] for r in recs} <= {"interrupted by SIGUSR1", "interrupted by SIGTERM"}
    for rec in recs:
        ckpt = torch.load(Path(rec["run_dir"]) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        assert ckpt["global_step"] == rec["steps"] > 0
    assert len([p for p in (tmp_path / "runs" / "smoke").iterdir() if p.name.startswith("baseline_")]) == 2


def test_killing_the_study_stops_its_sweep_cleanly_and_a_relaunch_runs_exactly_the_rest(tmp_path, data_cache):
    """kill -9 of `python -m sweeps.study`: the sweep notices its parent is gone, records its run in flight as
    interrupted (with a checkpoint) and starts no further run (before: the orphan finished its run, then every
    remaining run failed with BrokenPipeError). The same command then resumes the interrupted run and trains the
    one never started, and nothing else (skipping completed runs: tests/test_train.py)."""
    cmd = [
        sys.executable,
        "-m",
        "sweeps.study",
        "quick",
        f"data.cache_dir={data_cache}",
        f"data.max_bytes={TEST_MAX_BYTES}",
        "model=baseline",
        "size=cpu_xs",
        "size.tokens=200000",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "--jobs",
        "1",
        "--seeds",
        "0,1",
        "--runs-root",
        str(tmp_path / "runs"),
        "--reports-root",
        str(tmp_path / "reports"),
    ]
    env = {**_env(), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if ": starting;" in line:
            break
    time.sleep(0.2)  # its run is in flight (it trains for seconds); the sweep notices within a second
    proc.kill()  # SIGKILL: no handler, no cleanup in the study itself
    proc.wait()
    deadline = time.time() + 120
    while time.time() < deadline:  # the sweep (same session) notices within a second, then stops its run
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the orphaned sweep did not stop: " + "".join(seen)[-2000:])
    (study,) = (tmp_path / "runs").iterdir()
    recs = ledger.read_records(study)
    assert [(r["seed"], r["status"]) for r in recs] == [(0, "interrupted")], "".join(seen)[-2000:]
    assert not list(study.glob("baseline_cpu_xs_s1_*"))  # never started: no failed record, no directory
    ckpt = torch.load(Path(recs[0]["run_dir"]) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == recs[0]["steps"] > 0

    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert "sweep done" in again.stdout, again.stdout[-3000:] + again.stderr[-3000:]
    (resumed,) = [ln for ln in again.stdout.splitlines() if "_s0_" in ln and ": resuming from" in ln]
    assert "checkpoints/last.ckpt" in resumed
    recs = ledger.read_records(study)
    assert [(r["seed"], r["status"]) for r in recs] == [(0, "interrupted"), (0, "completed"), (1, "completed")]


def test_a_process_whose_launcher_died_before_it_watched_stops_at_once(tmp_path):
    """Issue 39 (found by the chaos sweep, tests/test_chaos.py): a launcher killed while its joblib workers were
    starting. A worker reached its first job after its parent was gone, saw that ATTNRES_PARENT_PID was not its
    parent, and did not watch: it trained every job left in its queue, unwatched. Now a parent that is gone already
    is a SIGTERM at once (the run starts nothing, and a launch stops in one line)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    out = tmp_path / "received"
    code = (  # its pipes go to /dev/null once its parent is gone (nobody reads them): the answer goes to a file
        "import sys, time; from pathlib import Path; from experiments.run import interrupts; "
        "interrupts.install_worker(); time.sleep(2); Path(sys.argv[1]).write_text(str(interrupts.received()))"
    )
    try:
        for named, want in ((dead.pid, "SIGTERM"), (alive.pid, "None")):  # gone / alive but not its parent
            env = {**_env(), "ATTNRES_PARENT_PID": str(named)}
            proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=REPO, env=env, capture_output=True)
            assert proc.returncode == 0, proc.stderr[-2000:]
            assert out.read_text() == want
    finally:
        alive.kill()
        alive.wait()
    env = {**_env(), "ATTNRES_PARENT_PID": str(dead.pid)}
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.train", "experiment=smoke", f"paths.runs_root={tmp_path / 'runs'}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]  # its one line went to /dev/null
    assert not (tmp_path / "runs").exists()
