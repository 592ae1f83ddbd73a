"""experiments.run.worker_watch: a joblib worker killed while it sends its result back wedges loky for good (shown
here: without the watch the pool never returns); with the watch the launch ends with exit status 1 and one line,
its other workers stopped, so that a relaunch resumes (the chaos sweep met this: tests/test_chaos.py)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.run import worker_watch

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "data" / "wedged_pool.py"

if not hasattr(os, "waitid") or not Path("/proc/self/stat").exists():
    pytest.skip("the watch needs os.waitid and /proc (Linux)", allow_module_level=True)


def test_killed_by_names_the_signal_and_leaves_the_child_to_be_reaped():
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=time.sleep, args=(60,))
    child.start()
    assert worker_watch.killed_by(child.pid) is None  # alive
    assert worker_watch.cpu_ticks(child.pid) is not None
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while worker_watch.killed_by(child.pid) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert worker_watch.killed_by(child.pid) == signal.SIGKILL
    child.join(5)
    assert child.exitcode == -signal.SIGKILL  # not reaped by the watch: the owner still sees how it ended
    done = ctx.Process(target=int)
    done.start()
    time.sleep(0.5)
    assert worker_watch.killed_by(done.pid) is None  # exited by itself
    done.join(5)


def _run(mode: str, timeout: float) -> tuple[int, str] | None:
    """(exit status, stderr) of the wedged pool, or None when it ran past ``timeout`` (its process group killed)."""
    env = {**os.environ, "ATTNRES_WEDGE_GRACE_S": "3", "ATTNRES_WEDGE_IDLE_S": "2", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(REPO), "2", mode],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what is left of the pool
    return proc.returncode, err


def test_a_worker_killed_mid_result_wedges_the_pool_and_the_watch_ends_the_launch():
    t0 = time.monotonic()
    watched = _run("watch", timeout=120)
    seconds = time.monotonic() - t0
    assert watched is not None, "the watched launch hung"
    status, err = watched
    assert status == 1, err
    assert "was killed by SIGKILL and the joblib pool has not noticed in 3 s" in err
    assert "relaunch the same command to resume" in err
    assert seconds < 60
    # the same pool without the watch never returns: the wedge is real, the watch is what ends it
    assert _run("nowatch", timeout=20) is None
