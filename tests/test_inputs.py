"""Issue 23, inputs refused before anything is written: names that would become paths, a sequence longer than the
model's context, Hydra's own errors, top-level keys no code reads, a read-only runs root. Each ends in one line
naming the key and what is allowed, exit status 2, and no run directory or record."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from conftest import TEST_MAX_BYTES, compose, mount_namespace, run_cli_mounted

from experiments.config.validation import TOP_LEVEL_KEYS, check_config
from experiments.run.identity import run_identity
from experiments.run.job import run_job
from experiments.train import main, train


def _refused(cfg, capsys) -> str:
    """Run ``cfg`` as a single Hydra job would: exit status 2 and one line on stderr, which is returned."""
    with pytest.raises(SystemExit) as exit_:
        run_job(train, cfg)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.out + captured.err
    return lines[0]


def _nothing_under(*paths: Path) -> None:
    for path in paths:
        assert not path.exists(), sorted(path.rglob("*"))[:5] if path.is_dir() else path


# ---- 6. names that become paths --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("study=../../escape", "study"),
        ("study={tmp}/abs", "study"),
        ("study=a/b", "study"),
        ("study=", "study"),
        ("study=.hidden", "study"),
        ("study=" + "x" * 300, "study"),
        ("size.name=/../../../zzesc", "size.name"),
        ("model.variant=../v", "model.variant"),
    ],
    ids=["dotdot", "absolute", "nested", "empty", "leading-dot", "300-chars", "size-escape", "variant-escape"],
)
def test_names_that_would_become_paths_are_refused_before_anything_is_written(
    train_cfg, tmp_path, capsys, override, key
):
    runs = tmp_path / "deep" / "runs"
    cache = tmp_path / "empty_cache"  # the data is prepared into it first thing after the checks
    line = _refused(train_cfg(override.format(tmp=tmp_path), f"data.cache_dir={cache}", runs_root=runs), capsys)
    _nothing_under(cache)  # checked first, before the data and the model
    assert f"config error: {key}=" in line
    assert "letters, digits, '-', '_' and '.', starting with a letter or a digit, at most 48 characters" in line
    _nothing_under(runs, tmp_path / "escape", tmp_path / "abs", tmp_path / "deep" / "escape", Path("/zzesc"))


def test_a_run_directory_outside_the_runs_root_is_refused_even_without_the_name_check(tmp_path):
    cfg = compose(["experiment=smoke", f"paths.runs_root={tmp_path / 'runs'}", "study=../outside"])
    with pytest.raises(ValueError, match=r"is not <paths.runs_root>/<study>/<run id> under paths.runs_root="):
        run_identity(cfg)  # the second line of defence: the normalised directory itself


def test_the_study_command_refuses_a_bad_study_name_before_writing_a_log(tmp_path, monkeypatch, capsys):
    from sweeps import study

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(study, "run_streaming", lambda *a, **k: pytest.fail("the sweep was launched"))
    rc = study.main(["quick", "study=../../escape", "--runs-root", "runs", "--reports-root", "reports"])
    assert rc == 2
    assert "study='../../escape' is not a valid name" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no reports/<study>/sweep.log, no runs/


# ---- 7. a sequence longer than the model's context ---------------------------------------------------------
def test_a_sequence_longer_than_the_models_context_is_a_config_error(train_cfg, tmp_path, capsys):
    line = _refused(train_cfg("train.seq_len=4096"), capsys)
    assert "config error: train.seq_len=4096 is longer than the model's context, model.max_seq_len=128" in line
    assert "size.seq_len=4096" in line
    _nothing_under(tmp_path / "runs")


# ---- 8. Hydra's own errors, 9. added top-level keys ---------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["model=nosuchmodel"], "model=nosuchmodel: no such config in group model; choices: baseline, block_attnres"),
        (["model=blok_attnres"], "model=blok_attnres: no such config in group model; closest: block_attnres"),
        (["-m", "model=baseline,nosuch"], "model=nosuch: no such config in group model"),
        (["+sweep=ladder"], "sweep=ladder: no such config in group sweep; closest: cpu_ladder"),
        (["trainr.max_steps=3"], "trainr.max_steps=3: the config has no key 'trainr'; closest: trainer, train"),
        (["train.max_stepz=3"], "train.max_stepz=3: train has no key 'max_stepz'; its keys: tokens"),
        (["train.batch_size=abc"], "train.batch_size=abc: Value 'abc' of type 'str' could not be converted to Integer"),
        (["seed=[1"], "seed=[1: not a valid override"),
    ],
)
def test_hydras_own_errors_are_one_line_with_the_closest_choices(tmp_path, monkeypatch, capsys, argv, expected):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["attnres-train", *argv, f"paths.runs_root={tmp_path / 'runs'}"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("[attnres] config error: ")
    assert expected in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # not even Hydra's outputs/


def test_an_added_top_level_key_no_code_reads_is_refused(train_cfg, tmp_path, capsys):
    line = _refused(train_cfg("+trainr.max_steps=3"), capsys)
    assert "config error: trainr is not a setting: no code reads a top-level key 'trainr'" in line
    assert "closest: trainer, train" in line
    _nothing_under(tmp_path / "runs")
    check_config(train_cfg("+trainer.max_time=null"))  # a new key inside a node that takes any (Lightning's) is fine


def test_the_top_level_keys_are_those_of_conf_train_yaml():
    assert tuple(compose([])) == TOP_LEVEL_KEYS
    assert tuple(compose(["+sweep=cpu_ladder", "+launcher=parallel", "experiment=paper_scaling"])) == TOP_LEVEL_KEYS


# ---- 10. a read-only runs root ----------------------------------------------------------------------------------
def test_a_read_only_runs_root_is_one_line_before_the_model_is_built(tmp_path):
    if mount_namespace() is None:
        pytest.skip("no private mount namespace here (unshare) for a read-only bind mount")
    root = tmp_path / "ro"
    root.mkdir()
    ro = shlex.quote(str(root))
    cache = tmp_path / "empty_cache"  # the data is prepared into it first thing after the checks
    proc = run_cli_mounted(
        f"mount --bind {ro} {ro} && mount -o remount,bind,ro {ro}",
        [
            "experiment=smoke",
            f"paths.runs_root={root}",
            f"paths.hydra_root={tmp_path / 'outputs'}",
            f"data.cache_dir={cache}",
            f"data.max_bytes={TEST_MAX_BYTES}",
        ],
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert f"config error: paths.runs_root: cannot write to {root} (Read-only file system)" in line
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "starting;" not in proc.stdout
    _nothing_under(cache)  # before the data (and so the model): it once failed only in locks.py, after both


# ---- issue 39: a typo under +trainer., a disk full at launch ----------------------------------------------------
def test_a_typo_under_trainer_is_one_line_with_the_closest_arguments(train_cfg, tmp_path, capsys):
    """Before: the trainer node took any key, and ``+trainer.max_stepz=3`` failed at ``Trainer(...)`` with a
    TypeError traceback, after the run directory and its record were written."""
    line = _refused(train_cfg("+trainer.max_stepz=3"), capsys)
    assert "config error: trainer.max_stepz is not an argument of lightning.pytorch.Trainer; closest: max_steps" in line
    assert "the ones a config may set: accelerator, strategy, devices" in line
    _nothing_under(tmp_path / "runs", tmp_path / "outputs")
    line = _refused(train_cfg("+trainer.max_steps=3"), capsys)  # a real argument, but one the harness sets
    assert "trainer.max_steps is set by the harness" in line
    assert "set it through train.*" in line
    _nothing_under(tmp_path / "runs")


def test_the_trainer_arguments_are_read_from_the_installed_lightning():
    import inspect

    import lightning.pytorch as pl

    from experiments.config.validation import TRAINER_SET_BY_HARNESS, trainer_arguments
    from experiments.training.instantiators import planned_trainer_kwargs

    assert trainer_arguments("lightning.pytorch.Trainer") == tuple(inspect.signature(pl.Trainer).parameters)
    assert trainer_arguments("my.own.Trainer") is None  # another target: not checked
    cfg = compose(["experiment=smoke"])
    plan = type("Plan", (), {"steps": 12, "eval_every": 6})()
    harness = {*planned_trainer_kwargs(cfg, plan), "callbacks", "logger", "default_root_dir"}  # instantiate_trainer's
    assert set(TRAINER_SET_BY_HARNESS) == harness
    for key in compose(["experiment=smoke"]).trainer:  # every key the trainer configs set is an argument
        assert key == "_target_" or key in trainer_arguments("lightning.pytorch.Trainer")


def test_a_disk_full_at_launch_is_one_line_naming_the_free_space(train_cfg, tmp_path, capsys, monkeypatch):
    import shutil

    import experiments.config.validation as validation

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(validation.shutil, "disk_usage", lambda p: usage._replace(free=4096))
    line = _refused(train_cfg(), capsys)
    assert "config error: paths.runs_root: only 4,096 bytes free on the file system of" in line
    assert "a run needs at least paths.min_free_mb=0.25 MiB" in line
    _nothing_under(tmp_path / "runs")  # no lock (.locks/), no run directory, no record
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"paths.min_free_mb=-1 must be a number in \[0, inf\]"):
        check_config(train_cfg("paths.min_free_mb=-1"))


def test_a_really_full_disk_at_launch_is_refused_before_the_lock(tmp_path, data_cache):
    """A 600 KB tmpfs filled to the last block as the runs root. Before: the launch got as far as the run's lock,
    whose marker could not be written (a traceback, exit status 1, no record)."""
    if mount_namespace() is None:
        pytest.skip("no private mount namespace here (unshare) for a small tmpfs")
    disk, out = tmp_path / "disk", tmp_path / "copied"
    disk.mkdir()
    out.mkdir()
    d, o = shlex.quote(str(disk)), shlex.quote(str(out))
    proc = run_cli_mounted(
        f"mount -t tmpfs -o size=600k tmpfs {d} && (dd if=/dev/zero of={d}/fill bs=4k 2>/dev/null; df -B1 {d} >&2;"
        f" true)",
        [
            "experiment=smoke",
            f"paths.runs_root={disk}",
            f"paths.hydra_root={tmp_path / 'outputs'}",
            f"data.cache_dir={data_cache}",
            f"data.max_bytes={TEST_MAX_BYTES}",
        ],
        after=f"rm {d}/fill; cp -a {d}/. {o}/",
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert f"config error: paths.runs_root: only 0 bytes free on the file system of {disk}" in line, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert sorted(out.iterdir()) == []  # no lock, no run directory, no record
