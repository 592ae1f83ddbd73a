"""Issue 49 item 1, per-budget learning rates: a tuned-lr file's ``lr_per_budget[arm][size][tokens per parameter]``
gives each run the lr of its own budget (experiments/config/resolvers.py), and a multi-budget launch groups its budgets
by their peak lr, one trunk per group (experiments/run/budgets.py); a file without the section resolves as before.

The tuned-lr files here are written under tmp_path and composed through Hydra's search path (``tuned_lr=t``), as a
generated conf/tuned_lr/*.yaml is. Smoke size as tests/test_budgets.py: cpu_xs, 4096 tokens a step, size.target_params
48,000, so budgets 0.5, 1 and 2 are 6, 12 and 23 steps, decays starting at 5, 10 and 18, shared warm-up 1 step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import compose, smoke_overrides

from experiments.config import resolvers
from experiments.run import budgets as budgets_module
from experiments.run.errors import RunInterrupted, SetupError
from experiments.run.identity import resolved_container, run_identity
from experiments.train import _train_run, train
from experiments.training.callbacks import read_metrics
from results import ledger

torch.set_num_threads(1)

DEEP = ("experiment=cpu_ladder", "size=cpu_deep", "scheduler=wsd")  # size deep_L8, tokens_per_param 8
A, B, C = 4.0e-3, 2.0e-3, 1.0e-3


def _tuned(tmp_path: Path, text: str) -> list[str]:
    """The overrides that compose ``text`` as a tuned-lr file (conf/tuned_lr/<name>.yaml, a name per text)."""
    root = tmp_path / "extra_conf"
    (root / "tuned_lr").mkdir(parents=True, exist_ok=True)
    name = f"t{len(list((root / 'tuned_lr').iterdir()))}"
    (root / "tuned_lr" / f"{name}.yaml").write_text(text)
    return [f"hydra.searchpath=[file://{root}]", f"tuned_lr={name}"]


def _deep_table(tmp_path: Path, baseline: str, block: str = "{2: 0.003, 4: 0.0015, 8: 0.0008}") -> list[str]:
    return _tuned(
        tmp_path,
        "provenance: {source: test}\n"
        "lr:\n  baseline: {deep_L8: 0.005}\n  block_attnres: {deep_L8: 0.006}\n"
        "lr_per_budget:          # arm -> size name -> tokens per parameter -> peak lr\n"
        f"  baseline:\n    deep_L8: {baseline}\n"
        f"  block_attnres:\n    deep_L8: {block}\n",
    )


# --- the resolver -----------------------------------------------------------------------------------------------


def test_each_budget_resolves_its_own_lr_by_arm_and_protocol(tmp_path):
    table = _deep_table(tmp_path, "{2: 0.004, 4: 0.002, 8: 0.001}")
    for budget, lr in ((2, A), (4, B), (8, C)):
        cfg = compose([*DEEP, *table, f"size.tokens_per_param={budget}"])
        assert cfg.optimizer.lr == lr, budget
        # the baseline protocol gives every arm the baseline's lr at that budget, per_arm each arm its own
        assert compose([*DEEP, *table, "model=block_attnres", f"size.tokens_per_param={budget}"]).optimizer.lr == lr
        own = {2: 3e-3, 4: 1.5e-3, 8: 8e-4}[budget]
        per_arm = compose(
            [*DEEP, *table, "model=block_attnres", "lr_protocol=per_arm", f"size.tokens_per_param={budget}"]
        )
        assert per_arm.optimizer.lr == own, budget
    assert compose([*DEEP, *table]).optimizer.lr == C  # the size's own 8 tokens per parameter


def test_a_size_without_tokens_per_param_reads_train_tokens_over_target_params(tmp_path):
    table = _tuned(
        tmp_path,
        "provenance: {source: test}\nlr:\n  baseline: {cpu_xs: 0.003}\n"
        "lr_per_budget:\n  baseline:\n    cpu_xs: {0.5: 0.004, 1: 0.002, 9: 0.001}\n",
    )
    assert compose(["experiment=cpu_ladder", *table]).optimizer.lr == C  # 432,000 tokens = 9 x 48,000
    assert compose(["experiment=smoke", *table, "size.tokens=24000"]).optimizer.lr == A
    assert compose(["experiment=smoke", *table, "size.tokens=48000"]).optimizer.lr == B
    # the length experiments.run.budgets gives budget 0.5 of a size whose N is not a multiple: round(0.5 * N)
    odd = compose(["experiment=smoke", *table, "size.target_params=48001", "size.tokens=24000"])
    assert odd.optimizer.lr == A


def test_a_budget_the_entry_lacks_is_one_line_naming_arm_size_budget_and_the_tuned_budgets(tmp_path):
    table = _deep_table(tmp_path, "{2: 0.004, 4: 0.002, 8: 0.001}")
    want = (
        r"no tuned lr for budget 16 tokens/parameter of arm 'baseline' at size 'deep_L8' \(tuned_lr from test\) "
        r"\(lr_per_budget\); tuned budgets: 2, 4, 8; tune it .* or set size.lr=\.\.\."
    )
    with pytest.raises(ValueError, match=want):
        resolved_container(compose([*DEEP, *table, "size.tokens_per_param=16"]))
    entry = {"baseline": {"deep_L8": {2: A, 4: B}}}
    with pytest.raises(ValueError, match=r"budget 0.5 tokens/parameter .* tuned budgets: 2, 4;") as e:
        resolvers.tuned_lr({"lr_per_budget": entry}, "deep_L8", "block_attnres", "baseline", 0.5)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"this run's tokens per parameter are unknown") as e:
        resolvers.tuned_lr({"lr_per_budget": entry}, "deep_L8", "baseline", "baseline")
    assert "\n" not in str(e.value)
    # a launch names the budget before anything is written (its own config checks every budget of train.budgets)
    with pytest.raises(SetupError, match=r"no tuned lr for budget 16 tokens/parameter"):
        train(compose([*DEEP, *table, f"paths.runs_root={tmp_path / 'runs'}", "train.budgets=[2,16]"]))
    assert not (tmp_path / "runs").exists()
    # planning names it on one line too
    with pytest.raises(ValueError, match=r"budget 16's optimizer.lr does not resolve: no tuned lr for budget 16") as e:
        budgets_module.plan_budgets(_launch(tmp_path, [2, 16], table))
    assert "\n" not in str(e.value)


def test_a_budget_whose_optimum_lies_on_the_grid_edge_is_refused_in_one_line():
    """A tuned file may carry edge optima (flagged, for the record); a run must not train at one as if tuned."""
    table = {
        "lr_per_budget": {"baseline": {"deep_L12": {8: A, 128: B}}},
        "on_edge_per_budget": {"baseline": {"deep_L12": {8: False, 128: True}}},
    }
    assert resolvers.tuned_lr(table, "deep_L12", "block_attnres", "baseline", 8.0) == A
    with pytest.raises(
        ValueError, match=r"arm 'baseline' at size 'deep_L12', budget 128 .* lies on its lr grid's edge"
    ):
        resolvers.tuned_lr(table, "deep_L12", "block_attnres", "baseline", 128.0)
    # the single-budget section keeps its own edge flags as information only (committed studies run at them)
    assert (
        resolvers.tuned_lr(
            {"lr": {"baseline": {"deep_L12": A}}, "on_edge": {"baseline": {"deep_L12": True}}},
            "deep_L12",
            "baseline",
            "baseline",
        )
        == A
    )


def _launch(tmp_path: Path, budgets: list[float], table: list[str], *extra: str):
    """A launch config with ``train.budgets`` set after composing (bypassing the launch's own lr check)."""
    from omegaconf import open_dict

    cfg = compose([*DEEP, *table, f"paths.runs_root={tmp_path / 'runs'}", *extra])
    with open_dict(cfg):
        cfg.train.budgets = budgets
    return cfg


def test_a_file_without_lr_per_budget_resolves_as_before(tmp_path):
    old = _tuned(tmp_path, "provenance: {source: test}\nlr:\n  baseline: {deep_L8: 0.005}\n")
    for budget in (2, 8, 16):
        assert compose([*DEEP, *old, f"size.tokens_per_param={budget}"]).optimizer.lr == 5e-3
    # an entry for another size or arm leaves this one on lr[arm][size]
    other = _tuned(
        tmp_path,
        "provenance: {source: test}\nlr:\n  baseline: {deep_L8: 0.005}\n  block_attnres: {deep_L8: 0.006}\n"
        "lr_per_budget:\n  baseline: {deep_L16: {8: 0.001}}\n  block_attnres: {deep_L8: {8: 0.001}}\n",
    )
    assert compose([*DEEP, *other]).optimizer.lr == 5e-3
    assert compose([*DEEP, *other, "model=block_attnres", "lr_protocol=per_arm"]).optimizer.lr == 1e-3
    assert compose([*DEEP, *other, "model=full_attnres"]).optimizer.lr == 5e-3  # baseline protocol: baseline's


# --- the plan ---------------------------------------------------------------------------------------------------


def _groups(plan) -> list[tuple[float, ...]]:
    return [tuple(float(b.budget) for b in g) for g in plan.groups]


def test_budgets_that_share_one_lr_plan_one_trunk_exactly_as_before(tmp_path):
    old = budgets_module.plan_budgets(
        compose([*DEEP, *_tuned(tmp_path, "lr:\n  baseline: {deep_L8: 0.002}\n"), "train.budgets=[2,4,8]"])
    )
    shared = budgets_module.plan_budgets(
        compose([*DEEP, *_deep_table(tmp_path, "{2: 0.002, 4: 0.002, 8: 0.002}"), "train.budgets=[2,4,8]"])
    )
    explicit = budgets_module.plan_budgets(
        compose(
            [*DEEP, *_deep_table(tmp_path, "{2: 0.004, 4: 0.002, 8: 0.001}"), "size.lr=2e-3", "train.budgets=[2,4,8]"]
        )
    )
    for plan in (old, shared, explicit):
        assert _groups(plan) == [(2.0, 4.0, 8.0)]
        assert [b.lr for b in plan.branches] == [B] * 3
        assert plan.warmup_steps == old.warmup_steps
        assert [b.config_hash for b in plan.branches] == [b.config_hash for b in old.branches]
        assert [(b.steps, b.start) for b in plan.branches] == [(b.steps, b.start) for b in old.branches]
    line = budgets_module.launch_line(old)
    assert line.startswith("[attnres] budgets 2, 4, 8 tokens/parameter at 1 lr: trunk ")
    assert "(8: lr 2.00e-3, " in line
    assert "; branch 2 at step " in line
    assert "; branch 4 at step " in line


def test_budgets_of_different_lrs_plan_separate_trunks_and_a_shared_pair_one(tmp_path):
    each = budgets_module.plan_budgets(
        compose([*DEEP, *_deep_table(tmp_path, "{2: 0.004, 4: 0.002, 8: 0.001}"), "train.budgets=[2,4,8]"])
    )
    assert _groups(each) == [(2.0,), (4.0,), (8.0,)]
    assert [b.lr for b in each.branches] == [A, B, C]
    assert [each.trunk_of(b) is b for b in each.branches] == [True] * 3
    line = budgets_module.launch_line(each)
    assert " at 3 lrs: " in line
    assert "(2: lr 4.00e-3, " in line
    assert "(8: lr 1.00e-3, " in line
    assert "branch " not in line

    pair = budgets_module.plan_budgets(
        compose([*DEEP, *_deep_table(tmp_path, "{2: 0.004, 4: 0.002, 8: 0.002}"), "train.budgets=[2,4,8]"])
    )
    assert _groups(pair) == [(2.0,), (4.0, 8.0)]
    lone, branch, trunk = pair.branches
    assert pair.trunk_of(branch) is trunk
    assert pair.trunk_of(lone) is lone
    # one warm-up for the whole launch, from its smallest budget, as before: each budget's run is still the
    # independent WSD run at its own lr (the lone smallest one needs no warmup_steps; the rest carry it)
    assert pair.warmup_steps == each.warmup_steps
    assert [b.config_hash for b in pair.branches[:1]] == [b.config_hash for b in each.branches[:1]]
    alone = compose([*DEEP, *_deep_table(tmp_path, "{2: 0.004, 4: 0.002, 8: 0.002}"), "size.tokens_per_param=2"])
    assert run_identity(alone)[0] == lone.config_hash
    assert trunk.cfg.scheduler.warmup_steps == pair.warmup_steps
    assert " at 2 lrs: " in budgets_module.launch_line(pair)


# --- end to end ---------------------------------------------------------------------------------------------------


def _smoke(root: Path, data_cache: Path, tmp_path: Path) -> list[str]:
    table = _tuned(
        tmp_path,
        "provenance: {source: test}\nlr:\n  baseline: {cpu_xs: 0.003}\n"
        "lr_per_budget:\n  baseline:\n    cpu_xs: {0.5: 0.004, 1: 0.002, 2: 0.002}\n",
    )
    return [
        *smoke_overrides(root, data_cache),
        *table,
        "scheduler=wsd",
        "scheduler.warmup_fraction=0.1",
        "train.log_every=1",
    ]


def _by_budget(result: dict) -> dict[float, dict]:
    return {float(r["budget"]): r for r in result["budgets"]}


def test_a_launch_trains_each_lr_group_as_planned_resumes_per_group_and_a_relaunch_trains_nothing(
    tmp_path, data_cache, capsys
):
    """Budgets 0.5 (lr 4e-3) alone, 1 and 2 (lr 2e-3) one trunk with a branch: the records carry their lr and their
    group's trunk_id; a launch whose second group's trunk is interrupted resumes on relaunch to the uninterrupted
    launch's results bit for bit; then a relaunch trains nothing."""
    clean_root, root = tmp_path / "clean", tmp_path / "runs"
    clean = _by_budget(train(compose([*_smoke(clean_root, data_cache, tmp_path), "train.budgets=[0.5,1,2]"])))
    first = capsys.readouterr().out
    assert "[attnres] budgets 0.5, 1, 2 tokens/parameter at 2 lrs: trunk " in first
    assert [clean[b]["status"] for b in (0.5, 1.0, 2.0)] == ["completed"] * 3
    assert {b: r["lr"] for b, r in clean.items()} == {0.5: A, 1.0: B, 2.0: B}
    assert {b: r["steps"] for b, r in clean.items()} == {0.5: 6, 1.0: 12, 2.0: 23}
    assert clean[0.5]["trunk_id"] == clean[0.5]["run_id"]  # its own trunk
    assert clean[1.0]["trunk_id"] == clean[2.0]["trunk_id"] == clean[2.0]["run_id"]
    # budget 1 branched from the trunk: its first rows are the trunk's, at the trunk's lr
    trunk_rows = read_metrics(Path(clean[2.0]["run_dir"]) / "metrics.csv")
    branch_rows = read_metrics(Path(clean[1.0]["run_dir"]) / "metrics.csv")
    assert branch_rows[:5] == trunk_rows[:5]
    # the lone budget is the independent WSD run to 0.5 at its own lr: one identity, bit for bit
    alone = train(compose([*_smoke(tmp_path / "alone", data_cache, tmp_path), "size.tokens=24000"]))
    assert alone["config_hash"] == clean[0.5]["config_hash"]
    assert alone["val_loss"] == clean[0.5]["val_loss"]
    assert alone["lr"] == A

    cfg = compose([*_smoke(root, data_cache, tmp_path), "train.budgets=[0.5,1,2]"])

    def interrupt_trunk(run_cfg, **kwargs):
        if kwargs["lineage"]["budget"] == 2:  # SIGTERM at step 12: after budget 1's branch point (10)
            run_cfg.fault.signal_at_step = 12
        return _train_run(run_cfg, **kwargs)

    with pytest.raises(RunInterrupted, match="SIGTERM at step 13"):
        budgets_module.train_budgets(cfg, interrupt_trunk)
    study = root / "smoke"
    last = {r["run_id"]: r["status"] for r in ledger.read_records(study)}
    assert sorted(last.values()) == ["completed", "interrupted"]
    assert len(list(study.glob("*/checkpoints/branch_point.ckpt"))) == 1  # budget 1's, saved before the interrupt

    again = _by_budget(train(cfg))
    assert [again[b].get("skipped", False) for b in (0.5, 1.0, 2.0)] == [True, False, False]
    for b in (0.5, 1.0, 2.0):
        assert again[b]["val_loss"] == clean[b]["val_loss"], b
        assert again[b]["lr"] == clean[b]["lr"], b
        assert again[b]["config_hash"] == clean[b]["config_hash"], b
    assert not list(study.glob("*/checkpoints/branch_point.ckpt"))

    n_records = len(ledger.record_names(study))
    done = train(cfg)
    assert done["skipped"]
    assert all(r["skipped"] for r in done["budgets"])
    assert len(ledger.record_names(study)) == n_records
