"""The run lock, on the ``filelock`` package: :func:`acquire_run_lock`, one process trains a run at a time (a lease
file under ``<study>/.locks/``), on this host or any other that shares the runs directory; a dead holder's lease is
taken over. The advisory ``flock`` around work that stays correct without it (preparing a corpus, rebuilding a
results table) is results.io.exclusive_lock.

Light on purpose: the stdlib at import, ``filelock`` when a lock is taken.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import RunBusy

if TYPE_CHECKING:
    import filelock

# Run lock (issue 15 #5). filelock's SoftFileLease: a marker file created exclusively (safe on NFS), holding host,
# pid, process start time and a token, refreshed by a heartbeat thread. A marker whose owner is a dead process on
# this host is taken over at once; one from another host only after it stayed unchanged for LOCK_LEASE_S on the
# contender's own monotonic clock (no clock sync needed). LOCK_LEASE_S is far above NFS attribute caching
# (acregmax, 60 s by default), so a live holder's heartbeat is never missed. Every contender must agree on it.
LOCK_LEASE_S = float(os.environ.get("ATTNRES_LOCK_LEASE_S", 300))
LOCK_HEARTBEAT_S = LOCK_LEASE_S / 10


def acquire_run_lock(study_dir: Path, run_id: str) -> filelock.SoftFileLease:
    """The run's lock, acquired; RunBusy (with the holder's host and pid) when a live process holds it."""
    import filelock

    path = study_dir / ".locks" / f"{run_id}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.SoftFileLease(
        str(path), lease_duration=LOCK_LEASE_S, heartbeat_interval=LOCK_HEARTBEAT_S, thread_local=False
    )
    try:
        lock.acquire(timeout=0)
        return lock
    except filelock.Timeout:
        pass
    owner = lock.owner
    import socket

    here = socket.gethostname()  # filelock writes it, plus "?pidns-<n>" inside a PID namespace
    if owner is not None and owner.hostname != here and not owner.hostname.startswith(here + "?"):
        # Another node: alive only if its heartbeat moves. Watch it for one lease (a crashed node's marker is then
        # taken over); a live holder keeps it.
        print(
            f"[attnres] {run_id}: locked by {owner.hostname} pid {owner.pid}; waiting up to {LOCK_LEASE_S:.0f} s "
            f"for its heartbeat ({path})",
            flush=True,
        )
        try:
            lock.acquire(timeout=LOCK_LEASE_S + 2 * LOCK_HEARTBEAT_S, poll_interval=min(5.0, LOCK_HEARTBEAT_S))
            return lock
        except filelock.Timeout:
            owner = lock.owner or owner
    who = f"{owner.hostname} pid {owner.pid}" if owner is not None else "another process"
    raise RunBusy(
        f"{run_id} is being trained right now by {who} (lock {path}, heartbeat every "
        f"{LOCK_HEARTBEAT_S:.0f} s); not starting a second copy. It is released when that run ends; a "
        f"holder that died is taken over at once on its own host, after {LOCK_LEASE_S:.0f} s elsewhere"
    )


def clear_dead_lock(study_dir: Path, run_id: str) -> None:
    """Remove the run's lease file when its holder is a dead process on this host (killed after its run was
    recorded finished, before it let go); a live holder's, or another host's, is left alone."""
    path = study_dir / ".locks" / f"{run_id}.lock"
    if not path.is_file():
        return
    import filelock

    lock = filelock.SoftFileLease(
        str(path), lease_duration=LOCK_LEASE_S, heartbeat_interval=LOCK_HEARTBEAT_S, thread_local=False
    )
    try:
        lock.acquire(timeout=0)  # takes a dead local holder's marker over at once
    except filelock.Timeout:
        return
    lock.release()
