"""The launching process's watch over its worker processes (Hydra's joblib launcher runs them on loky).

**Why.** A loky worker killed by a signal (SIGKILL, the kernel's OOM killer) while it sends its result back leaves
part of a message in the result pipe; loky's result thread then waits in ``recv`` for the rest, forever (the other
workers and the launcher keep the pipe's write end open, so no end of file comes), and never sees that the worker
died. The launch hangs with no run in it. When the kill lands anywhere else, loky notices at once, kills the other
workers and raises TerminatedWorkerError, and the launch ends. Measured: docs/runs.md, "A worker killed while it
sends its result".

**What the watch does** (:func:`watch_workers`, from experiments.run.interrupts.install_launcher). A daemon thread
looks at this process's worker processes once a second without reaping them (``waitid`` with ``WNOWAIT``, so loky
still sees what it would). When a worker has died by a signal, another worker is still alive and the launch has
not ended ``WEDGE_GRACE_S`` later, the launch is wedged: the watch prints one line, sends SIGTERM to the workers
left (each stops its run at its next consistent point with a checkpoint, recorded ``interrupted``:
experiments.run.interrupts), waits until each has exited or has used no CPU for ``IDLE_S`` (its run stopped, it is
stuck behind the dead pipe), at most ``STOP_WAIT_S``, sends SIGKILL to what is left and ends the launch with exit
status 1. The relaunch of the same command resumes every run from its checkpoint.

POSIX with ``os.waitid`` (Linux; elsewhere the watch does not start); the CPU time comes from /proc (elsewhere a
worker counts as busy until ``STOP_WAIT_S``). Standard library only.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import signal
import sys
import threading
import time

WEDGE_GRACE_S = float(os.environ.get("ATTNRES_WEDGE_GRACE_S", 60))  # loky notices a death within milliseconds
IDLE_S = float(os.environ.get("ATTNRES_WEDGE_IDLE_S", 10))  # no CPU for this long after SIGTERM: stopped, stuck
STOP_WAIT_S = 600.0  # the longest a run may take to stop after SIGTERM before it is killed
POLL_S = 1.0

_started = False


def _peek(pid: int) -> os.waitid_result | bool | None:
    """Child ``pid``'s exit status without reaping it (``waitid`` with WNOWAIT): its siginfo once it has ended, None
    while it runs, True when it is reaped already (or not a child of this process), False when it cannot be told."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    except OSError:
        return False
    return info if info is not None and info.si_pid != 0 else None


def killed_by(pid: int) -> int | None:
    """The number of the signal that killed child process ``pid`` if it died by one and is not reaped yet, else None
    (alive, exited by itself, reaped, or not a child of this process). Reaps nothing."""
    info = _peek(pid)
    if not isinstance(info, os.waitid_result):
        return None
    return info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else None


def _ended(pid: int) -> bool:
    return _peek(pid) is not None


def cpu_ticks(pid: int) -> int | None:
    """User plus system CPU time of process ``pid`` (all its threads) in clock ticks, from /proc; None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def _workers() -> list[int]:
    """The pids of the loky workers this process started (``LokyProcess-<n>``: not, e.g., a DataLoader's workers,
    whose death the DataLoader reports itself), dead or alive."""
    for _ in range(5):
        with contextlib.suppress(RuntimeError):  # the set changed while it was read: read it again
            children = list(multiprocessing.process._children)  # type: ignore[attr-defined]
            return [p.pid for p in children if p.pid is not None and str(p.name).startswith("LokyProcess")]
    return []


def _reaped(pid: int) -> bool:
    return _peek(pid) is True


def find_wedge(dead_since: dict[int, tuple[float, int]], now: float) -> tuple[int, int] | None:
    """(pid, signal) of a worker that died by a signal at least WEDGE_GRACE_S ago while another worker is still
    alive, recording in ``dead_since`` (pid -> (first seen dead, signal)) the deaths first seen now and forgetting
    the ones reaped since (loky noticed: it reaps a dead worker when it ends the pool); else None."""
    workers = _workers()
    for pid in workers:
        if pid not in dead_since and (sig := killed_by(pid)) is not None:
            dead_since[pid] = (now, sig)
    for pid in [pid for pid in dead_since if _reaped(pid)]:
        del dead_since[pid]
    alive = [pid for pid in workers if pid not in dead_since and not _ended(pid)]
    for pid, (since, sig) in dead_since.items():
        if alive and now - since >= WEDGE_GRACE_S:
            return pid, sig
    return None


def stop_workers(pids: list[int]) -> None:
    """SIGTERM to each of ``pids``; then wait until each has exited or used no CPU for IDLE_S (at most STOP_WAIT_S)
    and SIGKILL the ones left."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    start = time.monotonic()
    last = {pid: (cpu_ticks(pid), start) for pid in pids}
    left = list(pids)
    while left and time.monotonic() - start < STOP_WAIT_S:
        time.sleep(0.5)
        now = time.monotonic()
        for pid in list(left):
            ticks = cpu_ticks(pid)
            if _ended(pid):
                left.remove(pid)
            elif ticks is None or ticks != last[pid][0]:
                last[pid] = (ticks, now)
            elif now - last[pid][1] >= IDLE_S:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                left.remove(pid)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _watch() -> None:
    dead_since: dict[int, tuple[float, int]] = {}
    while True:
        time.sleep(POLL_S)
        wedge = find_wedge(dead_since, time.monotonic())
        if wedge is None:
            continue
        pid, sig = wedge
        print(
            f"[attnres] worker {pid} was killed by {signal.Signals(sig).name} and the joblib pool has not noticed in "
            f"{WEDGE_GRACE_S:.0f} s (a result cut off mid-send: loky waits for the rest forever); stopping the other "
            "workers' runs (SIGTERM: checkpoint, recorded interrupted) and this launch, exit status 1: relaunch the "
            "same command to resume",
            file=sys.stderr,
            flush=True,
        )
        stop_workers([w for w in _workers() if w not in dead_since and not _ended(w)])
        os._exit(1)


def watch_workers() -> None:
    """Start the watch (once per process; nowhere without ``os.waitid``)."""
    global _started
    if _started or not hasattr(os, "waitid"):
        return
    _started = True
    threading.Thread(target=_watch, name="attnres-worker-watch", daemon=True).start()
