"""results/io.py exclusive_lock (the one flock helper) and its two users: the ledger's table rebuild
(results.ledger.rebuild_table), and data.publish.corpus_lock, which also tells whether it holds the lock."""

from __future__ import annotations

import errno
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from results import ledger
from results.io import exclusive_lock

fcntl = pytest.importorskip("fcntl")

# Another process probes the lock file with a plain non-blocking flock: "held" if someone holds it.
_PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("free")
except BlockingIOError:
    print("held")
"""


def _held_elsewhere(path: Path) -> bool:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.strip() == "held"


def _no_flock(fd, operation):
    """fcntl.flock on a file system that has none (some network file systems)."""
    raise OSError(errno.ENOSYS, "Function not implemented")


def test_the_lock_is_a_real_flock_that_other_processes_see(tmp_path):
    path = tmp_path / "deep" / "dir" / "x.lock"  # parents created
    with exclusive_lock(path) as held:
        assert held is True
        assert path.is_file()
        assert _held_elsewhere(path)
    assert not _held_elsewhere(path)
    assert path.is_file()


def test_a_second_holder_waits_until_the_first_releases(tmp_path):
    path = tmp_path / "x.lock"
    first_in, release, second_in = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with exclusive_lock(path):
            first_in.set()
            release.wait(30)

    def second() -> None:
        first_in.wait(30)
        with exclusive_lock(path) as held:
            assert held
            second_in.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    assert first_in.wait(30)
    assert not second_in.wait(0.5)  # blocked while the first holds it
    release.set()
    assert second_in.wait(30)
    for t in threads:
        t.join(30)


def test_an_error_in_the_block_propagates_and_releases_the_lock(tmp_path):
    path = tmp_path / "x.lock"
    with pytest.raises(KeyError, match="boom"), exclusive_lock(path):
        raise KeyError("boom")
    assert not _held_elsewhere(path)


def test_without_flock_the_block_runs_unlocked(tmp_path, monkeypatch):
    monkeypatch.setattr(fcntl, "flock", _no_flock)
    ran = []
    with exclusive_lock(tmp_path / "x.lock") as held:
        ran.append(held)
    assert ran == [False]
    # the body's own errors still propagate
    with pytest.raises(KeyError, match="boom"), exclusive_lock(tmp_path / "x.lock"):
        raise KeyError("boom")


def test_a_table_rebuild_holds_the_table_lock(tmp_path, monkeypatch):
    study = tmp_path / "study"
    lock = study / "results.csv.lock"
    held = []
    read_study = ledger._read_study  # what the rebuild reads the study through

    def probing(study_dir):
        held.append(_held_elsewhere(lock))
        return read_study(study_dir)

    monkeypatch.setattr(ledger, "_read_study", probing)
    ledger.rebuild_table(study)
    assert held == [True]
    assert not _held_elsewhere(lock)


def test_records_are_published_where_flock_does_not_work(tmp_path, monkeypatch):
    monkeypatch.setattr(fcntl, "flock", _no_flock)
    study = tmp_path / "study"
    for i in range(2):
        ledger.add_record(study, ledger.make_record(run_id=f"r{i}", status="completed", val_loss=2.5, pflops_days=1e-9))
    assert [r["run_id"] for r in ledger.read_rows(study / "results.csv")] == ["r0", "r1"]


def test_the_corpus_lock_says_whether_it_is_held(tmp_path, monkeypatch):
    from experiments.data.publish import corpus_lock

    final = tmp_path / "cache" / "stdlib-x"
    with corpus_lock(final) as held:
        assert held is True
        assert _held_elsewhere(final.parent / ".stdlib-x.lock")
    monkeypatch.setattr(fcntl, "flock", _no_flock)
    with corpus_lock(final) as held:
        assert held is False


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_writers_temporary_files_are_removed_by_the_next_write(tmp_path):
    import os
    import socket

    from results.io import atomic_write_text

    host = socket.gethostname()
    dead = tmp_path / f".results.csv.tmp-{host}-{_dead_pid()}-abc123"  # killed between write and rename
    dead_record = tmp_path / f".rec.json.tmp-{host}-{_dead_pid()}-def456"  # another target in the same directory
    live = tmp_path / f".results.csv.tmp-{host}-{os.getpid()}-fff000"  # a live writer's
    remote = tmp_path / f".results.csv.tmp-otherhost-{_dead_pid()}-aaa111"  # another host's: its pids are not ours
    for p in (dead, dead_record, live, remote):
        p.write_text("partial")
    atomic_write_text(tmp_path / "results.csv", "a,b\n")
    assert (tmp_path / "results.csv").read_text() == "a,b\n"
    assert not dead.exists()
    assert not dead_record.exists()
    assert live.exists()
    assert remote.exists()


def test_a_dead_holders_run_lock_is_cleared_and_a_live_one_kept(tmp_path):
    from experiments.run.locks import acquire_run_lock, clear_dead_lock

    code = (
        "import sys, os; from pathlib import Path; from experiments.run.locks import acquire_run_lock; "
        "held = acquire_run_lock(Path(sys.argv[1]), 'r0'); os._exit(0)"  # dies holding it, as after a SIGKILL
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, cwd=Path(__file__).resolve().parents[1])
    marker = tmp_path / ".locks" / "r0.lock"
    assert marker.is_file()
    clear_dead_lock(tmp_path, "r0")
    assert not marker.exists()
    clear_dead_lock(tmp_path, "r0")  # nothing to clear: no error
    held = acquire_run_lock(tmp_path, "r1")
    try:
        clear_dead_lock(tmp_path, "r1")
        assert (tmp_path / ".locks" / "r1.lock").is_file()  # a live holder's is kept
    finally:
        held.release()


def test_a_killed_checkpoint_saves_temporary_file_is_removed_by_the_next_save(tmp_path):
    import socket

    import torch

    from experiments.run.checkpoint_io import AtomicCheckpointIO

    dead = tmp_path / f".last.ckpt.tmp-{socket.gethostname()}-{_dead_pid()}-abc123"
    dead.write_bytes(b"PK")  # a save killed before its rename
    AtomicCheckpointIO().save_checkpoint({"global_step": 3, "w": torch.zeros(2)}, tmp_path / "last.ckpt")
    assert (tmp_path / "last.ckpt").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
