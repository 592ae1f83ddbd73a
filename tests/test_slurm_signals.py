"""Issue 45, the signal contract without a cluster (the live one: tests/test_slurm_live.py). SLURM sends SIGUSR2
through the submitit launcher (conf/launcher/slurm.yaml), SIGUSR1 when a user or a site asks for it: either one, in
training, saves a checkpoint at the step and stops the run like SIGTERM; in a job that submitit started
(experiments.run.interrupts.install_job) the job then hands over to submitit's own checkpoint-and-requeue, and a
signal before training stops at once (nothing to save) and requeues the same way. SIGTERM and SIGINT only stop."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from experiments.run import interrupts
from experiments.run.errors import StopRequested
from experiments.run.job import run_job
from experiments.train import train
from results import ledger

torch.set_num_threads(1)


class FakeSubmititHandler:
    """What submitit installs in a job it started: its handler's name is how interrupts recognises it."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def checkpoint_and_try_requeue(self, signum: int, frame=None) -> None:
        self.calls.append(signum)
        raise SystemExit(-1)  # as submitit does after `scontrol requeue`


@pytest.fixture
def job_signals(monkeypatch):
    """The interrupt signals' handlers and interrupts' job state restored after the test."""
    nums = [getattr(signal, name) for name in interrupts.SIGNALS]
    saved = {num: signal.getsignal(num) for num in nums}
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    yield
    for num, handler in saved.items():
        signal.signal(num, handler)
    interrupts._requeue = None
    interrupts._preempted = None


@pytest.mark.parametrize(
    ("shown", "preempted"),
    [("PreemptEligibleTime=2026-12-05T09:14:08 PreemptTime=2026-12-05T09:14:36", True), ("PreemptTime=None", False)],
)
def test_slurms_preemption_is_told_from_a_cancel_by_scontrol(job_signals, monkeypatch, shown, preempted):
    calls = []

    def scontrol(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=f"JobId=7 JobName=x\n   {shown} SuspendTime=None\n")

    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setattr(interrupts.subprocess, "run", scontrol)
    assert interrupts.preempted_by_slurm() is preempted
    assert interrupts.preempted_by_slurm() is preempted  # asked once
    assert calls == [["scontrol", "show", "job", "7"]]


def test_outside_a_submitit_job_nothing_changes(job_signals):
    before = signal.getsignal(signal.SIGUSR2)
    assert interrupts.install_job() is False
    assert signal.getsignal(signal.SIGUSR2) is before
    assert not interrupts.requeues("SIGUSR2")
    interrupts.requeue("SIGUSR2")  # returns: nothing to hand over to


@pytest.mark.parametrize("preempt", [None, "USR1"])
def test_in_a_submitit_job_a_signal_stops_at_once_and_preemption_requeues(job_signals, monkeypatch, capsys, preempt):
    fake = FakeSubmititHandler()
    if preempt:
        monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", preempt)
    submitit_signal = signal.SIGUSR1 if preempt else signal.SIGUSR2
    signal.signal(submitit_signal, fake.checkpoint_and_try_requeue)
    monkeypatch.setenv(interrupts.PARENT_ENV, "1")
    monkeypatch.setenv("SLURM_JOB_ID", "42")

    assert interrupts.install_job() is True
    assert (
        "SLURM job 42: SIGUSR1 / SIGUSR2 (and SIGTERM when SLURM preempts it) save a checkpoint and requeue the job"
        in (capsys.readouterr().out)
    )
    assert interrupts.PARENT_ENV not in os.environ  # the launcher's pid means nothing on the job's machine
    for name in interrupts.SIGNALS:  # before training: every interrupt signal stops at once
        assert signal.getsignal(getattr(signal, name)) is interrupts._job_handler
    with pytest.raises(StopRequested) as stopped:
        os.kill(os.getpid(), signal.SIGUSR2)  # the handler runs as os.kill returns
    assert stopped.value.signame == "SIGUSR2" == interrupts.received()

    monkeypatch.setattr(interrupts, "_preempted", False)  # scontrol: PreemptTime=None
    for name in ("SIGTERM", "SIGINT"):  # a cancel or a Ctrl-C: stop, no requeue
        assert not interrupts.requeues(name)
        interrupts.requeue(name)
    assert fake.calls == []
    for name in ("SIGUSR1", "SIGUSR2"):  # a preemption or a time limit: submitit requeues (and exits)
        assert interrupts.requeues(name)
        with pytest.raises(SystemExit):
            interrupts.requeue(name)
    monkeypatch.setattr(interrupts, "_preempted", True)  # SLURM's own preemption: SIGTERM, then requeued by us
    assert interrupts.requeues("SIGTERM")
    with pytest.raises(SystemExit):
        interrupts.requeue("SIGTERM")
    assert not interrupts.requeues("SIGINT")
    assert fake.calls == [submitit_signal] * 3
    assert "SIGUSR2: checkpoint saved; requeueing this SLURM job (submitit)" in capsys.readouterr().out


def test_sigusr2_in_training_saves_a_checkpoint_at_that_step_like_sigusr1(train_cfg, capsys):
    cfg = train_cfg("train.log_every=1", "fault.signal_at_step=6", "fault.signal=SIGUSR2")
    with pytest.raises(SystemExit) as exit_:
        run_job(train, cfg)
    assert exit_.value.code == 128 + signal.SIGUSR2
    assert "interrupted by SIGUSR2 at step 7; checkpoint " in capsys.readouterr().out  # sent just before step 7
    (rec,) = ledger.read_records(Path(cfg.paths.runs_root) / "smoke")
    assert (rec["status"], rec["steps"]) == ("interrupted", 7)
    ckpt = torch.load(Path(rec["run_dir"]) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 7
