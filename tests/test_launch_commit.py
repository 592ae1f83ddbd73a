"""Issue 49 item 6, provenance: a record's ``git_commit`` is the code its run trained with, taken once per launch
(experiments.train.main -> experiments.run.run_env.mark_launch_commit, passed to the launcher's workers in
``ATTNRES_LAUNCH_COMMIT``), not HEAD when the record is written; without a launch's commit (the Python API) the run
takes HEAD once, when it opens."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from conftest import cli_overrides, compose, run_cli, smoke_overrides

import results.io
from experiments.run import run_env
from experiments.train import train
from results import ledger

torch.set_num_threads(1)


def _smoke(root: Path, data_cache: Path) -> list[str]:
    return [*smoke_overrides(root, data_cache), "train.eval_count=1"]


class _MovingHead:
    """results.io.git_commit as HEAD moving on: each call another commit."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, cwd=None) -> str:
        self.calls += 1
        return f"head{self.calls}"


def test_a_record_carries_the_launch_commit_not_head_when_it_is_written(monkeypatch, tmp_path, data_cache):
    head = _MovingHead()
    monkeypatch.setattr(results.io, "git_commit", head)
    monkeypatch.setenv(run_env.LAUNCH_COMMIT_ENV, "1a2b3c4+dirty")
    rec = train(compose(_smoke(tmp_path, data_cache)))
    assert rec["status"] == "completed"
    assert rec["git_commit"] == "1a2b3c4+dirty"
    assert head.calls == 0  # HEAD is never read: the launch's commit is the code
    (stored,) = ledger.read_records(tmp_path / "smoke")
    assert stored["git_commit"] == "1a2b3c4+dirty"
    env = json.loads((Path(rec["run_dir"]) / "environment.json").read_text())
    assert env["git_commit"] == "1a2b3c4+dirty"


def test_without_a_launch_commit_a_run_takes_head_once_when_it_opens(monkeypatch, tmp_path, data_cache):
    head = _MovingHead()
    monkeypatch.setattr(results.io, "git_commit", head)
    monkeypatch.delenv(run_env.LAUNCH_COMMIT_ENV, raising=False)
    rec = train(compose(_smoke(tmp_path, data_cache)))
    assert rec["git_commit"] == "head1"  # HEAD when the run opened (environment.json's read moved it on)


def test_a_multi_budget_launch_from_the_python_api_records_one_commit(monkeypatch, tmp_path, data_cache):
    """Each budget's run opens after the previous one trained; without a launch's commit the launch pins the one
    HEAD was at when it began, for every budget, and lets go of it after."""
    head = _MovingHead()
    monkeypatch.setattr(results.io, "git_commit", head)
    monkeypatch.delenv(run_env.LAUNCH_COMMIT_ENV, raising=False)
    wsd = ["scheduler=wsd", "scheduler.warmup_fraction=0.1", "train.budgets=[0.5,1]"]
    result = train(compose([*_smoke(tmp_path, data_cache), *wsd]))
    assert [r["status"] for r in result["budgets"]] == ["completed", "completed"]
    assert [r["git_commit"] for r in result["budgets"]] == ["head1", "head1"]
    envs = [json.loads((Path(r["run_dir"]) / "environment.json").read_text()) for r in result["budgets"]]
    assert [e["git_commit"] for e in envs] == ["head1", "head1"]
    assert run_env.LAUNCH_COMMIT_ENV not in os.environ


def test_the_launching_process_sets_the_commit_for_what_it_starts(monkeypatch):
    monkeypatch.setattr(results.io, "git_commit", lambda cwd=None: "feed123")
    monkeypatch.setenv(run_env.LAUNCH_COMMIT_ENV, "inherited")  # an outer launch's: this launch's code is its own
    assert run_env.mark_launch_commit() == "feed123"
    assert run_env.launch_commit() == "feed123"
    assert os.environ[run_env.LAUNCH_COMMIT_ENV] == "feed123"


def test_the_command_line_takes_the_commit_at_launch(tmp_path, data_cache):
    """experiments.train's main() replaces an inherited ATTNRES_LAUNCH_COMMIT with the commit of its own code."""
    before = results.io.git_commit()
    proc = run_cli(
        [*cli_overrides(tmp_path, data_cache), f"paths.runs_root={tmp_path / 'runs'}", "train.eval_count=1"],
        env_extra={run_env.LAUNCH_COMMIT_ENV: "stale0+dirty"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (stored,) = ledger.read_records(tmp_path / "runs" / "smoke")
    assert stored["git_commit"] in {before, results.io.git_commit()}  # (the tree may be committed meanwhile)
    assert stored["git_commit"] != "stale0+dirty"
