"""Small file and provenance helpers every writer of the harness shares: an atomic text write, a JSON write, an
advisory file lock, the UTC time and the git commit.

Standard library at import (``filelock`` only when a lock is taken). attnres/ keeps its own rename-into-place for
its compiled kernel cache (attnres/cpu_kernels.py): the model library imports nothing from the harness.
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def utc_now() -> str:
    """ISO-8601 UTC timestamp with seconds, e.g. 2026-11-29T15:40:00+00:00."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def git_commit(cwd: str | Path | None = None) -> str:
    """`git rev-parse HEAD` (+ "+dirty" when tracked files changed); "" outside a repository or without git.

    Without ``cwd``: the repository this package lies in."""
    cwd = Path(cwd) if cwd is not None else Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return ""
        commit = head.stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return commit + ("+dirty" if status.returncode == 0 and status.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def writer_id() -> str:
    """A name no other writer uses at the same time: host, pid and a random nonce."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def remove_dead_writers_files(path: Path) -> None:
    """Delete the temporary files in ``path``'s directory (:func:`atomic_write_text`'s, of any target) whose writer
    was a process on this host that is gone: killed between writing and renaming. Another host's, or a live
    writer's, are left alone."""
    marker = f".tmp-{socket.gethostname()}-"
    for tmp in path.parent.glob(f".*{glob.escape(marker)}*"):
        pid = tmp.name.rsplit(marker, 1)[1].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                tmp.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a file so that readers see either the old or the whole new content, never a part: a temporary file
    with a name no other writer uses (:func:`writer_id`), fsync, rename over the target, fsync the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_writers_files(path)
    tmp = path.with_name(f".{path.name}.tmp-{writer_id()}")
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # the rename itself durable (not every file system allows this)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json(path: str | Path, record: Mapping[str, Any]) -> None:
    """Atomically write a flat mapping (a record) as JSON, indented; NaN and inf become null."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
    atomic_write_text(path, json.dumps(clean, indent=2) + "\n")


@contextlib.contextmanager
def exclusive_lock(path: str | Path) -> Iterator[bool]:
    """Hold an exclusive advisory lock on the file ``path`` for the block, waiting as long as another holder keeps
    it (process or thread; the file and its parent are created when missing and stay after release).

    Yields True while the lock is held, False when this file system has no working ``flock`` (some network file
    systems): the block then runs unlocked, so callers must be correct without it, and may use the flag to tell
    whether what they find beside the lock (a half-written temporary directory) can belong to a live writer."""
    import filelock

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # No soft fallback: a marker file left by a killed holder would block every later caller forever.
    lock = filelock.FileLock(str(path), fallback_to_soft=False)
    try:
        lock.acquire()
        held = True
    except OSError:  # flock refused (ENOSYS, ENOLCK, ...); filelock.Timeout cannot occur without a timeout
        held = False
    if not held:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()
