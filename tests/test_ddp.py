"""Data parallelism through the real harness: 2-process DDP on CPU (gloo) follows the same loss trajectory as one
process training on the same global batch.

Why the two must agree: TrainBatches gives rank r the slice [r*b, (r+1)*b) of the *global* batch of every step,
DDP all-reduces (averages) the gradients of the two equal halves, which is the gradient of the global-batch mean
loss, and the model is initialised from the same seed on every rank. So the parameters after every step, and
with them the validation loss (computed on the same fixed held-out windows on every rank), match a single
process up to floating-point summation order (measured: within 3e-7). The train loss in metrics.csv is rank 0's
loss on its half of the batch, not the global mean, so the evaluated trajectory is the check.

An interrupt under DDP (issue 39): one signal to one of the two ranks stops both at the same step, with one
checkpoint and one `interrupted` record, and the relaunch resumes bit-identically to the uninterrupted DDP run.

One process per core, one thread each (the machine has 2 cores). About 30-40 s per DDP launch.
"""

from __future__ import annotations

import csv
import json
import signal
from pathlib import Path

import pytest
import torch
from conftest import TEST_MAX_BYTES, run_cli

from experiments.training.callbacks import read_metrics
from results import ledger

DDP = ("trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true")


def _val_trajectory(runs_root: Path) -> tuple[list[tuple[int, float]], dict]:
    (run_dir,) = [p for p in (runs_root / "smoke").iterdir() if p.is_dir() and p.name not in ("records", ".locks")]
    record = json.loads((run_dir / "results.json").read_text())
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["val_loss"]]
    return [(int(r["step"]), float(r["val_loss"])) for r in rows], record


def _common(tmp_path: Path, data_cache: Path) -> list[str]:
    return [
        "experiment=smoke",
        "model=block_attnres",
        f"data.cache_dir={data_cache}",
        f"data.max_bytes={TEST_MAX_BYTES}",
        "threads=1",
        "trainer.enable_progress_bar=false",
        "size.tokens=32768",
        "size.batch_size=16",  # 16 steps of 16 x 128; 8 sequences per rank under DDP
        "train.eval_count=4",
        "train.val_sequences=16",
        "train.log_every=1",
        "callbacks.model_checkpoint.every_n_train_steps=5",
        f"paths.hydra_root={tmp_path / 'outputs'}",
    ]


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory, data_cache):
    """The 2-rank run, never interrupted: (its runs root, the launch's output)."""
    tmp_path = tmp_path_factory.mktemp("ddp_reference")
    ddp = run_cli([*_common(tmp_path, data_cache), f"paths.runs_root={tmp_path / 'ddp'}", *DDP], timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    return tmp_path / "ddp", ddp.stdout + ddp.stderr


def test_two_process_ddp_matches_single_process(tmp_path, data_cache, ddp_reference):
    common = _common(tmp_path, data_cache)
    single = run_cli([*common, f"paths.runs_root={tmp_path / 'single'}"], timeout=240)
    assert single.returncode == 0, single.stderr[-3000:]
    ddp_root, log = ddp_reference
    assert "MEMBER: 2/2" in log, log[-3000:]  # really two processes, ...
    assert "gloo" in log, log[-3000:]  # ... over gloo

    ref, ref_record = _val_trajectory(tmp_path / "single")
    got, got_record = _val_trajectory(ddp_root)
    assert ref_record["status"] == got_record["status"] == "completed"
    assert ref_record["steps"] == got_record["steps"] == 16
    assert ref_record["config_hash"] == got_record["config_hash"]  # devices and strategy do not change results
    assert [s for s, _ in got] == [s for s, _ in ref] == [4, 8, 12, 16]
    for (step, a), (_, b) in zip(ref, got):
        assert b == pytest.approx(a, abs=1e-4), f"val_loss at step {step}: single {a} vs DDP {b}"
    # the run really trained (the trajectory is not flat), so agreement is not trivial
    assert ref[-1][1] < ref[0][1] - 0.05


def test_a_signal_to_one_rank_stops_both_at_one_step_and_resumes_bit_identically(tmp_path, data_cache, ddp_reference):
    """SIGUSR1 to rank 1 only, just before step 7 (as a scheduler might signal one task): the ranks agree at the
    end of step 7 (the signal and its name are gathered from every rank each step), rank 0 saves one last.ckpt at
    step 7 and records the run `interrupted` by SIGUSR1, both ranks say they stopped at step 7, the launch exits
    128 + 10; the relaunch resumes and equals the uninterrupted 2-rank run bit for bit."""
    signame, rank = "SIGUSR1", 1
    runs = tmp_path / "runs"
    common = [*_common(tmp_path, data_cache), f"paths.runs_root={runs}", *DDP]
    faults = ["fault.signal_at_step=6", f"fault.signal={signame}", f"fault.signal_rank={rank}"]
    stopped = run_cli([*common, *faults], timeout=300)
    out = stopped.stdout + stopped.stderr
    assert stopped.returncode == 128 + getattr(signal, signame), out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    assert f"interrupted by {signame} at step 7; checkpoint " in out, out[-3000:]
    assert f"rank 1 interrupted by {signame} at step 7" in out, out[-3000:]  # the other rank, at the same step
    (rec,) = ledger.read_records(runs / "smoke")
    assert (rec["status"], rec["steps"], rec["error"]) == ("interrupted", 7, f"interrupted by {signame} at step 7")
    run_dir = Path(rec["run_dir"])
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.ckpt", "last.prev.ckpt"]
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 7

    resumed = run_cli(common, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert ": resuming from " in resumed.stdout
    (ref_dir,) = [p for p in (ddp_reference[0] / "smoke").iterdir() if p.name.startswith("block_attnres_")]
    want, got = read_metrics(ref_dir / "metrics.csv"), read_metrics(run_dir / "metrics.csv")
    assert [r["step"] for r in got] == list(range(1, 17))
    assert [r["train_loss"] for r in got] == [r["train_loss"] for r in want]  # bit-identical
    assert [r["val_loss"] for r in got] == [r["val_loss"] for r in want]
    final = json.loads((run_dir / "results.json").read_text())
    assert final["status"] == "completed"
    assert final["val_loss"] == json.loads((ref_dir / "results.json").read_text())["val_loss"]
    assert [r["status"] for r in ledger.read_records(runs / "smoke")] == ["interrupted", "completed"]
