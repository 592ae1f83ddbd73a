"""The compiled training step (``train_path=compiled``: torch.compile of the whole model + AdamW's fused kernel) is the
same training as the eager one: per-step losses agree to rounding over 50 steps for every ladder arm, a resumed
compiled run equals an uninterrupted one bit for bit, every record says which path trained it, and the compiler's
process-wide settings (experiments.training.compiler) are what the runs rely on.

The model is shrunk (2 transformer blocks, context 32) so that compiling it costs seconds, not minutes; the
ladder's shapes compile the same graphs, only larger (docs/performance.md, "The compiled CPU step")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import cli_overrides, compose, run_cli

from experiments.train import train
from experiments.training.callbacks import read_metrics
from results import ledger

STEPS = 50
SMALL = [
    "size.n_layers=2",
    "size.seq_len=32",
    "size.batch_size=8",
    f"size.tokens={STEPS * 8 * 32}",
    "size.lr=3e-3",
    "model.n_blocks=2",
    "train.log_every=1",
    "train.eval_count=2",
    "train.val_sequences=16",
]
# Measured on 2026-12-01 (torch 2.13.0, 1 thread): the largest |compiled - eager| per-step train loss over the 50 steps
# was 9.5e-7 for each of baseline, block_attnres and full_attnres (losses 3.1-5.6; the final val losses were equal
# to every digit). A different data order, lr or initialisation moves the losses by 1e-2 or more.
TOLERANCE = 2e-5


def _losses(run_dir: str) -> list[float]:
    rows = read_metrics(Path(run_dir) / "metrics.csv")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    return [r["train_loss"] for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant", ["baseline", "block_attnres", "full_attnres", "full_input_dependent_query", "full_sliding_window"]
)
def test_compiled_and_eager_paths_give_the_same_loss_curve(train_cfg, variant):
    eager = train(train_cfg(f"model={variant}", *SMALL, "train_path=eager"))
    compiled = train(train_cfg(f"model={variant}", *SMALL, "train_path=compiled"))
    assert (eager["train_path"], compiled["train_path"]) == ("eager", "compiled:whole")
    assert eager["config_hash"] != compiled["config_hash"]  # compile and optimizer.fused are part of the identity
    a, b = _losses(eager["run_dir"]), _losses(compiled["run_dir"])
    worst = max(abs(x - y) for x, y in zip(a, b))
    assert worst <= TOLERANCE, (variant, worst)
    assert a[-1] < a[0] - 0.5  # it trained: the comparison is not between two flat lines
    assert compiled["val_loss"] == pytest.approx(eager["val_loss"], abs=TOLERANCE)
    for rec in (eager, compiled):
        assert rec["cpu_time_s"] > 0
        assert {r["train_path"] for r in ledger.read_records(Path(rec["run_dir"]).parent)} >= {rec["train_path"]}


@pytest.mark.slow
def test_a_resumed_compiled_run_equals_an_uninterrupted_one_bit_for_bit(tmp_path, data_cache):
    """SIGKILL after a checkpoint, a relaunch in a new process (the compiled code comes back from inductor's cache or
    is compiled again), and the per-step losses equal those of an uninterrupted compiled run exactly."""
    common = [*cli_overrides(tmp_path, data_cache), *SMALL, "model=block_attnres", "train_path=compiled"]
    killed = run_cli([*common, f"paths.runs_root={tmp_path / 'a'}", "fault.kill_at_step=23"])
    assert killed.returncode == -9, killed.stderr[-2000:]  # last checkpoint: step 20
    resumed = run_cli([*common, f"paths.runs_root={tmp_path / 'a'}"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from" in resumed.stdout
    reference = train(compose([*common, f"paths.runs_root={tmp_path / 'b'}"]))
    (run_dir,) = (tmp_path / "a" / "smoke").glob("block_attnres_*")
    assert _losses(str(run_dir)) == _losses(reference["run_dir"])  # bit-identical
    (rec,) = [r for r in ledger.read_records(run_dir.parent) if r["status"] == "completed"]
    assert rec["val_loss"] == reference["val_loss"]
    assert rec["train_path"] == reference["train_path"] == "compiled:whole"
    assert rec["cpu_time_s"] > 0


def test_train_path_sets_the_step_and_keeps_the_eager_identity():
    eager, compiled = (compose(["experiment=cpu_ladder", f"train_path={p}"]) for p in ("eager", "compiled"))
    assert (eager.compile, eager.optimizer.fused) == (False, None)
    assert (compiled.compile, compiled.optimizer.fused) == (True, True)
    default = compose(["experiment=cpu_ladder"])
    assert (default.compile, default.optimizer.fused) == (False, None)  # train_path=eager unless a study says so


def test_configure_compiler_uses_one_cache_and_fails_loudly_at_the_recompile_limit(monkeypatch, tmp_path):
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir as torch_default

    from experiments.training import compiler

    monkeypatch.setattr(dynamo_config, "recompile_limit", 8)
    monkeypatch.setattr(dynamo_config, "fail_on_recompile_limit_hit", False)
    monkeypatch.setattr(inductor_config, "compile_threads", 2)
    monkeypatch.setenv("ATTNRES_CACHE_DIR", str(tmp_path / "attnres"))
    monkeypatch.setenv(compiler.CACHE_ENV, torch_default())  # what torch sets once it has looked
    assert compiler.configure_compiler(threads=1) == tmp_path / "attnres" / "inductor"
    assert os.environ[compiler.CACHE_ENV] == str(tmp_path / "attnres" / "inductor")
    assert dynamo_config.recompile_limit == compiler.RECOMPILE_LIMIT
    assert dynamo_config.fail_on_recompile_limit_hit is True
    assert inductor_config.compile_threads == 1

    monkeypatch.setenv(compiler.CACHE_ENV, str(tmp_path / "mine"))  # a user's own choice is kept
    assert compiler.configure_compiler(threads=2) == tmp_path / "mine"
    assert inductor_config.compile_threads == 2
