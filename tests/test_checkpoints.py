"""Issue 23, runs that got stuck: a damaged checkpoint (truncated, a flipped bit), a full disk during a checkpoint,
a torn last line of diagnostics.jsonl, and a failure record that cannot be written. A relaunch always goes on, from
the newest readable checkpoint or from the start, saying which (experiments/run/checkpoint_io.py)."""

from __future__ import annotations

import errno
import shlex
from pathlib import Path

import pytest
import torch
from conftest import cli_overrides, mount_namespace, run_cli_mounted

from experiments.run.checkpoint_io import AtomicCheckpointIO, inspect_checkpoint
from experiments.run.errors import RunInterrupted
from experiments.train import train
from experiments.training.callbacks import read_metrics
from results import ledger

torch.set_num_threads(1)

COMMON = ("train.log_every=1", "callbacks.model_checkpoint.every_n_train_steps=5")


def _interrupted(train_cfg, *overrides: str) -> Path:
    """A smoke run stopped by SIGTERM before step 8 (checkpoints at steps 5 and 8); its run directory."""
    with pytest.raises(RunInterrupted):
        train(train_cfg(*COMMON, "fault.signal_at_step=7", *overrides))
    return Path(ledger.read_records(Path(train_cfg().paths.runs_root) / "smoke")[-1]["run_dir"])


def _step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["global_step"]


def test_a_damaged_checkpoint_falls_back_to_the_previous_one_or_starts_over(train_cfg, capsys):
    """#1: the last two checkpoints are kept; a truncated last.ckpt (and a torn last line of diagnostics.jsonl, #3)
    is reported in one line and the run resumes from the previous one; with both damaged (one truncated, one with a
    flipped bit) it starts over, also with force=true. Each relaunch completes and matches an uninterrupted run."""
    run_dir = _interrupted(train_cfg)
    ckpts = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["last.ckpt", "last.prev.ckpt"]  # no temporary file left
    assert (_step(ckpts / "last.ckpt"), _step(ckpts / "last.prev.ckpt")) == (8, 5)
    data = (ckpts / "last.ckpt").read_bytes()
    (ckpts / "last.ckpt").write_bytes(data[: len(data) // 2])
    diag = run_dir / "diagnostics.jsonl"
    lines = diag.read_text().splitlines(keepends=True)
    diag.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # the evaluation at step 6, torn
    capsys.readouterr()

    with pytest.warns(UserWarning, match=r"diagnostics\.jsonl:1: unreadable diagnostics line dropped"):
        resumed = train(train_cfg(*COMMON))
    assert resumed["status"] == "completed"
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"checkpoint {ckpts / 'last.ckpt'} is damaged (not a whole checkpoint (File is not a zip file" in line
    assert "moved aside to last.ckpt.corrupt-" in line
    assert line.endswith("; resuming from last.prev.ckpt (step 5)")
    assert len(list(ckpts.glob("last.ckpt.corrupt-*"))) == 1  # kept for inspection, never resumed from again
    reference = train(train_cfg(*COMMON, runs_root=run_dir.parents[2] / "reference"))
    got, want = read_metrics(run_dir / "metrics.csv"), read_metrics(Path(reference["run_dir"]) / "metrics.csv")
    assert [r["step"] for r in got] == list(range(1, 13))
    assert [r["train_loss"] for r in got] == [r["train_loss"] for r in want]  # steps 6-8 trained again, the same
    assert resumed["val_loss"] == reference["val_loss"]

    run_dir = _interrupted(train_cfg, "seed=1")
    ckpts = run_dir / "checkpoints"
    data = (ckpts / "last.ckpt").read_bytes()
    (ckpts / "last.ckpt").write_bytes(data[: len(data) // 3])
    flipped = bytearray((ckpts / "last.prev.ckpt").read_bytes())
    flipped[len(flipped) // 2] ^= 0x10
    (ckpts / "last.prev.ckpt").write_bytes(bytes(flipped))
    capsys.readouterr()
    again = train(train_cfg(*COMMON, "seed=1", "force=true"))
    assert again["status"] == "completed"
    first, second = capsys.readouterr().err.strip().splitlines()
    assert "last.ckpt is damaged (not a whole checkpoint" in first
    assert "last.prev.ckpt is damaged (member archive/data/" in second
    assert "fails its CRC-32 check" in second
    assert second.endswith("; no readable checkpoint is left: the run starts over from step 0")
    assert [r["step"] for r in read_metrics(run_dir / "metrics.csv")] == list(range(1, 13))
    assert [r["status"] for r in ledger.read_records(run_dir.parent) if r["run_id"] == run_dir.name] == [
        "interrupted",
        "completed",
    ]


def test_a_failed_save_keeps_the_checkpoints_before_it(tmp_path, monkeypatch):
    """#2, the plugin: a save that fails half-way leaves no partial file and both earlier checkpoints intact."""
    io = AtomicCheckpointIO()
    path = tmp_path / "checkpoints" / "last.ckpt"
    state = {"global_step": 0, "state_dict": {"w": torch.zeros(64)}, "loops": {}}
    for step in (5, 10):
        io.save_checkpoint({**state, "global_step": step}, path)
    io.save_checkpoint({**state, "global_step": 10}, path)  # the same step again (two callbacks): no rotation
    assert (inspect_checkpoint(path), inspect_checkpoint(path.with_name("last.prev.ckpt"))) == ((10, None), (5, None))

    def half_then_full(obj, f):
        f.write(b"PK\x03\x04" + b"\0" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", half_then_full)
    with pytest.raises(OSError, match=r"could not write the checkpoint .*last\.ckpt \(OSError: \[Errno 28\]"):
        io.save_checkpoint({**state, "global_step": 15}, path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt", "last.prev.ckpt"]
    assert inspect_checkpoint(path) == (10, None)


def test_a_full_disk_during_a_checkpoint_leaves_no_half_written_file(tmp_path, data_cache, train_cfg, capsys):
    """#2, for real: a 600 KB tmpfs as the runs root, where the first checkpoint (~800 KB) cannot fit. The run fails
    with a record naming the full disk, nothing half-written is left at last.ckpt, and a relaunch starts over."""
    if mount_namespace() is None:
        pytest.skip("no private mount namespace here (unshare) for a small tmpfs")
    disk, out = tmp_path / "disk", tmp_path / "copied"
    disk.mkdir()
    out.mkdir()
    q = shlex.quote
    proc = run_cli_mounted(
        f"mount -t tmpfs -o size=600k tmpfs {q(str(disk))}",
        [*cli_overrides(tmp_path, data_cache), f"paths.runs_root={disk}", "logger=none"],
        after=f"cp -a {q(str(disk))}/. {q(str(out))}/",  # the tmpfs goes with the namespace: keep what it holds
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    (run_dir,) = (out / "smoke").glob("baseline_*")
    assert list((run_dir / "checkpoints").iterdir()) == []  # neither a partial last.ckpt nor a temporary file
    (rec,) = ledger.read_records(out / "smoke")
    assert rec["status"] == "failed"
    assert "could not write the checkpoint" in rec["error"]
    assert "No space left on device" in rec["error"]
    resumed = train(train_cfg(*COMMON, runs_root=out))  # a relaunch on a disk with room
    assert resumed["status"] == "completed"
    assert "damaged" not in capsys.readouterr().err
    assert [r["step"] for r in read_metrics(run_dir / "metrics.csv")] == list(range(1, 13))


def test_a_failure_record_that_cannot_be_written_is_one_line_and_the_earlier_records_stay(
    train_cfg, capsys, monkeypatch
):
    """#2: when even the failure record cannot be written (the disk is full), that is one line on stderr; the
    study's earlier records and table stay as they were, and the failure itself goes on."""
    run_dir = _interrupted(train_cfg)
    study = run_dir.parent
    before = [(p.name, p.read_bytes()) for p in sorted((study / "records").iterdir())]
    table = (study / "results.csv").read_bytes()

    def disk_full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ledger, "add_record", disk_full)
    capsys.readouterr()
    with pytest.raises(RuntimeError, match="injected failure"):
        train(train_cfg(*COMMON, "fault.raise_at_step=9"))
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    assert err[0].endswith(
        f"{run_dir.name}: could not write its failed record (OSError: [Errno 28] No space left on device); the "
        "study's earlier records are untouched"
    )
    assert [(p.name, p.read_bytes()) for p in sorted((study / "records").iterdir())] == before
    assert (study / "results.csv").read_bytes() == table
    monkeypatch.undo()
    assert train(train_cfg(*COMMON))["status"] == "completed"  # and the run still resumes
    assert [r["status"] for r in ledger.read_records(study)] == ["interrupted", "completed"]
