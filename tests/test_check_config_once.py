"""check_config (experiments/config/validation.py) runs once per launch of experiments.train: a new run, a skipped
one, an interrupted one and its resume, a multi-budget launch (every branch a run of its own), and never in a
study's planning (the sweep's runs check themselves). Counted by a spy on every module that holds the function."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch
from conftest import compose

from experiments.config import validation
from experiments.run import budgets as budgets_module
from experiments.run.errors import RunInterrupted, SetupError
from experiments.train import train

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]
FAST = ("size.tokens=24576", "train.eval_count=1", "callbacks.model_checkpoint.every_n_train_steps=2")


@pytest.fixture
def checks(monkeypatch) -> list:
    """Each call of check_config, from any module of the project that imported it."""
    import sweeps.study  # noqa: F401 - the study's planning, among the holders
    from experiments.config import compose as _compose  # noqa: F401
    from experiments.run import single_run  # noqa: F401

    calls: list = []
    original = validation.check_config

    def counting(cfg):
        calls.append(cfg)
        return original(cfg)

    holders = [
        m
        for name, m in list(sys.modules.items())
        if name.split(".")[0] in ("experiments", "sweeps") and getattr(m, "check_config", None) is original
    ]
    assert validation in holders
    for module in holders:
        monkeypatch.setattr(module, "check_config", counting)
    return calls


def test_only_the_train_entry_calls_check_config():
    """Every call site in experiments/ and sweeps/ (the definition aside): experiments/train.py's train()."""
    sites = []
    for path in [*(REPO / "experiments").rglob("*.py"), *(REPO / "sweeps").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if name == "check_config":
                    sites.append(str(path.relative_to(REPO)))
    assert sites == ["experiments/train.py"]


def test_a_run_its_skip_its_interruption_and_its_resume_each_check_once(train_cfg, checks):
    assert train(train_cfg(*FAST))["status"] == "completed"
    assert len(checks) == 1
    assert train(train_cfg(*FAST)).get("skipped")
    assert len(checks) == 2
    with pytest.raises(RunInterrupted):
        train(train_cfg(*FAST, "seed=1", "fault.signal_at_step=3"))
    assert len(checks) == 3
    resumed = train(train_cfg(*FAST, "seed=1"))
    assert resumed["status"] == "completed"
    assert len(checks) == 4
    with pytest.raises(SetupError, match=r"seed=-1 must be an integer >= 0"):  # the one check still refuses
        train(train_cfg(*FAST, "seed=-1"))
    assert len(checks) == 5


def test_a_multi_budget_launch_checks_its_config_once_for_all_its_runs(tmp_path, data_cache, checks):
    from conftest import TEST_MAX_BYTES

    cfg = compose(
        [
            "experiment=smoke",
            f"paths.runs_root={tmp_path}",
            f"data.cache_dir={data_cache}",
            f"data.max_bytes={TEST_MAX_BYTES}",
            "threads=1",
            "trainer.enable_progress_bar=false",
            "scheduler=wsd",
            "scheduler.warmup_fraction=0.1",
            "train.eval_count=1",
            "train.budgets=[0.5,1]",
        ]
    )
    result = train(cfg)
    assert [r["status"] for r in result["budgets"]] == ["completed", "completed"]
    assert len(checks) == 1
    plan = budgets_module.plan_budgets(cfg)
    assert len(checks) == 1  # planning the branches checks nothing
    # what is not checked again, each branch's config, is one check_config accepts, as it accepted the launch's
    for branch in plan.branches:
        validation.check_config(branch.cfg)
    assert len(checks) == 1 + len(plan.branches) == 3


def test_a_studys_planning_checks_no_config(tmp_path, checks):
    from sweeps import study

    ap = study._parser()
    args = ap.parse_intermixed_args(["deep", "--runs-root", str(tmp_path / "r"), "--reports-root", str(tmp_path)])
    assert study.plan_study(study.STUDIES["deep"], args, ap) is not None
    assert checks == []
