"""Issue 36 item 1, several budgets from one run (experiments/run/budgets.py): WSD decay branches from one constant-lr
trunk equal independent WSD runs to their budgets bit for bit and share their config_hash; an interrupted trunk or
branch resumes bit-identically; a relaunch trains only what is missing; bad budgets fail in one line before
anything is written.

Smoke size (cpu_xs, 4096 tokens a step; size.target_params 48,000): budgets 0.5, 1 and 2 tokens per parameter are
6, 12 and 23 steps, whose decays (0.2) start at steps 5, 10 and 18. warmup_fraction 0.1 of the smallest budget's 6
steps is 1 step; the largest budget's own fraction would give 2, so its config carries warmup_steps=1.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from conftest import TEST_MAX_BYTES, cli_overrides, compose, run_cli

from experiments.run import budgets as budgets_module
from experiments.run.errors import RunInterrupted, SetupError
from experiments.train import _train_run, train
from experiments.training.callbacks import ScheduleResync, read_metrics
from results import ledger

torch.set_num_threads(1)

BUDGETS = "train.budgets=[0.5,1,2]"
WSD = ("scheduler=wsd", "scheduler.warmup_fraction=0.1", "train.log_every=1")
STEPS = {0.5: 6, 1: 12, 2: 23}
STARTS = {0.5: 5, 1: 10, 2: 18}


def _base(root: Path, data_cache: Path) -> list[str]:
    return [
        "experiment=smoke",
        f"paths.runs_root={root}",
        f"data.cache_dir={data_cache}",
        f"data.max_bytes={TEST_MAX_BYTES}",
        "threads=1",
        "trainer.enable_progress_bar=false",
        *WSD,
    ]


def _curve(run_dir: str | Path) -> list[tuple[int, float, float]]:
    return [(r["step"], r["train_loss"], r["lr"]) for r in read_metrics(Path(run_dir) / "metrics.csv")]


def _by_budget(result: dict) -> dict[float, dict]:
    return {float(r["budget"]): r for r in result["budgets"]}


@pytest.fixture(scope="module")
def multi(tmp_path_factory, data_cache):
    """One uninterrupted 3-budget launch: what every other launch must equal."""
    root = tmp_path_factory.mktemp("multi")
    return root, train(compose([*_base(root, data_cache), BUDGETS]))


def test_each_branch_is_the_independent_wsd_run_to_its_budget(multi, tmp_path, data_cache):
    root, result = multi
    got = _by_budget(result)
    trunk = got[2.0]
    assert [r["status"] for r in result["budgets"]] == ["completed"] * 3
    assert {b: r["steps"] for b, r in got.items()} == {0.5: 6, 1.0: 12, 2.0: 23}
    assert {r["trunk_id"] for r in got.values()} == {trunk["run_id"]}
    assert result["run_id"] == trunk["run_id"]
    assert all(r["tokens"] == r["steps"] * 4096 for r in got.values())
    assert all(r["lr_schedule"] == "wsd" for r in got.values())
    # the branch points were deleted once their branches completed; the trunk saved none for itself
    assert not list((root / "smoke").glob("*/checkpoints/branch_point.ckpt"))
    for budget, rec in got.items():
        warmup = ["scheduler.warmup_steps=1"] if budget == 2.0 else []  # the shared warm-up, where it differs
        alone = train(compose([*_base(tmp_path, data_cache), f"size.tokens={round(48000 * budget)}", *warmup]))
        assert alone["budget"] is None
        assert alone["trunk_id"] is None
        assert alone["config_hash"] == rec["config_hash"], budget  # the same experiment: one identity
        assert alone["val_loss"] == rec["val_loss"], budget  # bit for bit, on one thread
        assert _curve(rec["run_dir"]) == _curve(alone["run_dir"]), budget
    # the branch's CPU time counts the trunk's up to its branch point: what its model cost, as the independent run's
    assert got[0.5]["cpu_time_s"] < got[1.0]["cpu_time_s"] < trunk["cpu_time_s"]


def test_without_the_lr_resync_a_branch_would_not_match(monkeypatch, multi, tmp_path, data_cache):
    """The check above can fail: the trunk's state is saved after its scheduler stepped at the peak lr, and a
    branch that kept that lr for its first decay step trains another model."""
    _, result = multi
    monkeypatch.setattr(ScheduleResync, "on_train_start", lambda self, trainer, pl_module: None)
    broken = _by_budget(train(compose([*_base(tmp_path, data_cache), "train.budgets=[0.5,2]"])))
    assert broken[0.5]["config_hash"] == _by_budget(result)[0.5]["config_hash"]
    assert broken[0.5]["val_loss"] != _by_budget(result)[0.5]["val_loss"]
    assert broken[2.0]["val_loss"] == _by_budget(result)[2.0]["val_loss"]  # the trunk is untouched


def test_an_interrupted_branch_resumes_bit_identically_and_relaunches_train_only_what_is_missing(
    multi, tmp_path, data_cache
):
    _, result = multi
    want = _by_budget(result)
    cfg = compose([*_base(tmp_path, data_cache), BUDGETS])
    study = tmp_path / "smoke"

    def interrupt_budget_1(run_cfg, **kwargs):
        if kwargs["lineage"]["budget"] == 1:  # SIGTERM at its first step (10): it stops after step 11
            run_cfg.fault.signal_at_step = 10
        return _train_run(run_cfg, **kwargs)

    with pytest.raises(RunInterrupted, match="SIGTERM at step 11"):
        budgets_module.train_budgets(cfg, interrupt_budget_1)
    last = {r["run_id"]: r for r in ledger.read_records(study)}
    assert sorted(r["status"] for r in last.values()) == ["completed", "completed", "interrupted"]
    branch_1 = Path(want[1.0]["run_dir"].replace(str(multi[0]), str(tmp_path)))
    assert (branch_1 / "checkpoints" / "branch_point.ckpt").is_file()  # kept until the branch completes
    ckpt = torch.load(branch_1 / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 11

    n_records = len(ledger.record_names(study))
    again = _by_budget(train(cfg))  # the same command: only budget 1, from its own checkpoint at step 11
    assert [again[b].get("skipped", False) for b in (0.5, 1.0, 2.0)] == [True, False, True]
    assert len(ledger.record_names(study)) == n_records + 1
    assert again[1.0]["val_loss"] == want[1.0]["val_loss"]
    assert _curve(branch_1) == _curve(want[1.0]["run_dir"])
    assert not (branch_1 / "checkpoints" / "branch_point.ckpt").exists()

    done = train(cfg)  # after completion: nothing
    assert done["skipped"]
    assert all(r["skipped"] for r in done["budgets"])
    assert len(ledger.record_names(study)) == n_records + 1


def test_a_killed_trunk_resumes_and_a_new_budget_trains_alone(multi, tmp_path, data_cache):
    """SIGKILL of the trunk at step 16 (its last checkpoint: 15; both branch points saved before), a relaunch of
    the same command finishes everything bit-identically; a budget added later trains only itself (its branch
    point never existed: from step 0, the independent run it is)."""
    _, result = multi
    want = _by_budget(result)
    common = [*cli_overrides(tmp_path, data_cache), *WSD, f"paths.runs_root={tmp_path}"]
    killed = run_cli([*common, BUDGETS, "fault.kill_at_step=16"])
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    study = tmp_path / "smoke"
    assert not ledger.read_records(study)
    assert len(list(study.glob("*/checkpoints/branch_point.ckpt"))) == 2

    again = _by_budget(train(compose([*common, BUDGETS])))
    for b in (0.5, 1.0, 2.0):
        assert again[b]["status"] == "completed"
        assert again[b]["val_loss"] == want[b]["val_loss"], b
        assert _curve(again[b]["run_dir"]) == _curve(want[b]["run_dir"]), b

    n_records = len(ledger.record_names(study))
    more = _by_budget(train(compose([*common, "train.budgets=[0.5,0.75,1,2]"])))
    assert [more[b].get("skipped", False) for b in (0.5, 0.75, 1.0, 2.0)] == [True, False, True, True]
    assert len(ledger.record_names(study)) == n_records + 1
    assert more[0.75]["steps"] == 9
    assert more[0.75]["trunk_id"] == want[2.0]["run_id"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.budgets=[2,1]"], r"train.budgets=\[2, 1\] is not sorted"),
        (["train.budgets=[1,1]"], r"train.budgets=\[1, 1\] holds 1 twice"),
        (["train.budgets=[0,1]"], r"train.budgets\[0\]=0 must be a number in \(0, inf\]"),
        (["train.budgets=[-1,1]"], r"train.budgets\[0\]=-1 must be a number"),
        (["train.budgets=[]"], r"train.budgets=\[\] must be a non-empty list"),
        (["train.budgets=[1,1.01]"], r"budgets 1 and 1.01 both train 12 steps"),
        (
            ["train.budgets=[0.5,2]", "scheduler.warmup_steps=8"],
            r"budget 0.5 \(6 steps\) would start its decay at step 5, before the shared warm-up ends at step 8",
        ),
        (["train.budgets=[1,2]", "scheduler=cosine"], r"needs scheduler=wsd"),
        (["train.budgets=[1,2]", "train.tokens=4096"], r"train.tokens must stay \$\{size.tokens\}"),
        (
            ["train.budgets=[1,2]", "train.flops_budget=1e9"],
            r"train.budgets and train.flops_budget=1000000000.0 are both set",
        ),
    ],
)
def test_bad_budgets_fail_in_one_line_before_anything_is_written(tmp_path, data_cache, overrides, message):
    with pytest.raises(SetupError, match=message) as e:
        train(compose([*_base(tmp_path / "runs", data_cache), *overrides]))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "runs").exists()


def test_bad_budgets_on_the_command_line(tmp_path, data_cache):
    proc = run_cli(
        [*cli_overrides(tmp_path, data_cache), *WSD, f"paths.runs_root={tmp_path / 'runs'}", "train.budgets=[4,2]"]
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if "train.budgets" in ln]
    assert "is not sorted" in line
    assert not (tmp_path / "runs").exists()


def test_a_single_budget_run_keeps_its_identity():
    """train.budgets null is left out of the identity (results.config_hash.HASH_DROP_IF_NULL): the key's existence
    moves no run's config_hash (tests/test_identity_stable.py holds the committed runs' hashes)."""
    from experiments.run.identity import experiment_config, resolved_container

    ident = experiment_config(resolved_container(compose(["experiment=smoke", "scheduler=wsd"])))
    assert "budgets" not in ident["train"]
