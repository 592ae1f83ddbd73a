"""Interrupts of a whole launch: SIGINT (Ctrl-C), SIGTERM, SIGUSR1 and SIGUSR2 (what SLURM sends before a preemption
or a time limit: SIGUSR2 through the submitit launcher, conf/launcher/slurm.yaml), and the death of the process that
started this one.

Where a signal lands decides what it does:

* **during a run** (experiments.training.callbacks.GracefulInterrupt installs :func:`on_signal` around training): the
  signal is only remembered. The run stops at its next consistent point (the end of the optimizer step, of the
  evaluation or of the checkpoint in progress, or before its completed record), saves a checkpoint at that step,
  is recorded ``interrupted`` and the launch stops. A second SIGINT stops at once.
* **in the process that launches** (:func:`install_launcher`, from experiments.train.main): outside a run there is
  nothing to save, so a signal stops at once (KeyboardInterrupt for SIGINT, experiments.run.errors.StopRequested for
  the others); while the launcher's worker processes train (Hydra's joblib launcher), it is passed on to each of
  them as SIGTERM and the launcher waits for them to stop.
* **in a launcher's worker process** (:func:`install_worker`): remembered for good; the run in progress stops as
  above and the worker starts no further run.
* **in a SLURM job that submitit started** (:func:`install_job`, from experiments.run.job.run_job; one run per job):
  outside training a signal stops at once (StopRequested: nothing to save), in training the run stops as above;
  then, for a preemption signal (SIGUSR1, SIGUSR2 or the one ``SUBMITIT_PREEMPT_SIGNAL`` names), :func:`requeue`
  hands over to submitit's own checkpoint-and-requeue, which resubmits the same job (``scontrol requeue``): the
  requeued job has the same config, hence the same run directory, and resumes from the checkpoint of that step.
  SIGTERM requeues too when SLURM is preempting the job (PreemptMode=REQUEUE: :func:`preempted_by_slurm`); after
  ``scancel`` (SIGTERM) and SIGINT the job only stops.

The process remembers the first signal (:func:`received`): experiments.run.job.run_job starts no run after it, and the
launch exits with 128 + its number (:func:`exit_code`), so a sweep stops instead of going on to its next run.

**Parent death.** A process whose parent put the parent's pid in ``ATTNRES_PARENT_PID`` (sweeps.study for its
sweep, every launcher for its workers: :func:`watch_parent`) polls its parent once a second; when the parent is
gone (kill -9), the process sends itself SIGTERM, so its run stops as above and is recorded ``interrupted``. Output
to a pipe whose reader is gone goes to /dev/null from then on instead of raising BrokenPipeError in whatever wrote
(:func:`tolerate_closed_pipes`).

**A worker killed while it sends its result** wedges Hydra's joblib launcher (loky waits for the rest of the
message forever): experiments.run.worker_watch, started by :func:`install_launcher`, ends such a launch.

Decisions (the consistent points, why a poll and not PR_SET_PDEATHSIG): docs/runs.md. Standard library only: the
entry point installs these before anything heavy is imported.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .errors import StopRequested

SIGNALS = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2")
PREEMPT_SIGNALS = ("SIGUSR1", "SIGUSR2")  # a job requeues itself after these (plus SUBMITIT_PREEMPT_SIGNAL's)
PARENT_ENV = "ATTNRES_PARENT_PID"
PARENT_POLL_S = 1.0

_received: str | None = None
_watching = False
_requeue: tuple[Callable[[int, Any], None], int] | None = None  # submitit's handler and its signal (install_job)


def received() -> str | None:
    """The name of the first interrupt signal this process received (None: none)."""
    return _received


def reset() -> None:
    """Forget a received signal (the Python API between two runs in one process, and tests)."""
    global _received
    _received = None


def exit_code(signame: str) -> int:
    """128 + the signal's number: the exit status of a launch stopped by it."""
    return 128 + int(getattr(signal, signame, signal.SIGINT))


def on_signal(signum: int, frame: Any = None) -> None:
    """The handler while a run trains: remember the signal; a second SIGINT raises KeyboardInterrupt (stop now)."""
    global _received
    if _received is not None and signum == signal.SIGINT:
        raise KeyboardInterrupt
    if _received is None:
        _received = signal.Signals(signum).name


def _launcher_handler(signum: int, frame: Any) -> None:
    global _received
    first = _received is None
    if first:
        _received = signal.Signals(signum).name
    import multiprocessing

    workers = multiprocessing.active_children()
    if workers and (first or signum != signal.SIGINT):  # they stop their runs cleanly: wait for them
        for worker in workers:
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(worker.pid, signal.SIGTERM)  # type: ignore[arg-type]
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise StopRequested(signal.Signals(signum).name)


def _install(handler: Callable[[int, Any], None]) -> dict[int, Any]:
    """``handler`` for every interrupt signal (main thread only: elsewhere nothing changes); the previous ones."""
    previous: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        return previous
    for name in SIGNALS:
        if hasattr(signal, name):
            num = getattr(signal, name)
            previous[num] = signal.signal(num, handler)
    return previous


@contextlib.contextmanager
def handling(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """``handler`` for the interrupt signals during the block, the previous handlers restored after it."""
    previous = _install(handler)
    try:
        yield
    finally:
        for num, old in previous.items():
            signal.signal(num, old)


def install_launcher() -> None:
    """The handlers of a launching process (experiments.train.main), for good; also :func:`watch_parent`,
    :func:`tolerate_closed_pipes` and the watch over its workers (experiments.run.worker_watch)."""
    from .worker_watch import watch_workers

    tolerate_closed_pipes()
    _install(_launcher_handler)
    watch_parent()  # after the handler: a parent already gone is a SIGTERM at once
    watch_workers()


def install_worker() -> None:
    """The handlers of a launcher's worker process (once per process): every signal is remembered, none stops at
    once; also :func:`watch_parent` and :func:`tolerate_closed_pipes`."""
    tolerate_closed_pipes()
    if signal.getsignal(signal.SIGTERM) is not on_signal:
        _install(on_signal)
    watch_parent()  # after the handlers: a parent already gone is a SIGTERM at once


def _submitit_requeue_handler() -> tuple[Callable[[int, Any], None], int] | None:
    """(submitit's checkpoint-and-requeue handler, its signal) where submitit installed it in this process (a job it
    started on a cluster: submitit.core.job_environment.SignalHandler), else None."""
    names = [f"SIG{os.environ['SUBMITIT_PREEMPT_SIGNAL']}"] if os.environ.get("SUBMITIT_PREEMPT_SIGNAL") else []
    for name in [*names, *PREEMPT_SIGNALS]:
        num = getattr(signal, name, None)
        handler = signal.getsignal(num) if num is not None else None
        if callable(handler) and getattr(handler, "__name__", "") == "checkpoint_and_try_requeue":
            return handler, int(num)  # type: ignore[arg-type]
    return None


def _job_handler(signum: int, frame: Any) -> None:
    global _received
    if _received is None:
        _received = signal.Signals(signum).name
    raise StopRequested(signal.Signals(signum).name)


def install_job() -> bool:
    """In a job that submitit started (its checkpoint-and-requeue handler is installed): keep that handler for
    :func:`requeue` and install this module's, for good: outside training a signal stops at once (StopRequested),
    in training the run stops at its next consistent point with a checkpoint (experiments.training.callbacks
    .GracefulInterrupt). Returns whether this is such a job (elsewhere nothing changes). Main thread only."""
    global _requeue
    if _requeue is None:
        if threading.current_thread() is not threading.main_thread():
            return False
        _requeue = _submitit_requeue_handler()
        if _requeue is None:
            return False
        os.environ.pop(PARENT_ENV, None)  # the launching process's pid, on another machine: not this job's parent
        job = os.environ.get("SLURM_JOB_ID", "?")
        print(
            f"[attnres] SLURM job {job}: SIGUSR1 / SIGUSR2 (and SIGTERM when SLURM preempts it) save a checkpoint and "
            "requeue the job",
            flush=True,
        )
    if signal.getsignal(signal.SIGTERM) is not _job_handler:
        _install(_job_handler)
    return True


_preempted: bool | None = None


def preempted_by_slurm() -> bool:
    """Whether SLURM selected this job for preemption (``scontrol show job``: PreemptTime is set). SLURM's own
    preemption (PreemptMode=REQUEUE) sends SIGTERM, as ``scancel`` does: this tells the two apart. Asked once."""
    global _preempted
    if _preempted is None:
        _preempted = False
        job = os.environ.get("SLURM_JOB_ID")
        if job:
            try:
                out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30)
            except (OSError, subprocess.SubprocessError):
                return False
            found = re.search(r"\bPreemptTime=(\S+)", out.stdout)
            _preempted = found is not None and found.group(1) not in ("None", "Unknown", "(null)")
    return _preempted


def requeues(signame: str) -> bool:
    """Whether :func:`requeue` would requeue this job after ``signame``: in a job that submitit started, after
    SIGUSR1, SIGUSR2 (or the signal ``SUBMITIT_PREEMPT_SIGNAL`` names), and after SIGTERM when SLURM is preempting
    the job (:func:`preempted_by_slurm`: a job that ends by itself within the grace time is not requeued by SLURM)."""
    if _requeue is None:
        return False
    preempt = {*PREEMPT_SIGNALS, f"SIG{os.environ.get('SUBMITIT_PREEMPT_SIGNAL', 'USR2')}"}
    return signame in preempt or (signame == "SIGTERM" and preempted_by_slurm())


def requeue(signame: str) -> None:
    """After a run stopped by ``signame`` (its checkpoint saved): in a job that submitit started
    (:func:`install_job`) and for a preemption signal, submitit's checkpoint-and-requeue: it saves the job's
    resubmission, runs ``scontrol requeue`` on global rank 0 and exits (SystemExit; on other ranks it returns).
    Elsewhere, for SIGINT, and for a SIGTERM that is not SLURM's preemption (``scancel``), nothing: the caller stops
    as usual."""
    if not requeues(signame):
        return
    assert _requeue is not None
    handler, num = _requeue
    print(f"[attnres] {signame}: checkpoint saved; requeueing this SLURM job (submitit)", flush=True)
    handler(num, None)


def notify_parent(signame: str) -> None:
    """Tell the launcher that started this worker that the launch is interrupted by ``signame`` (it passes it on to
    every worker as SIGTERM, and exits with its status): the signal, to the parent named in ``ATTNRES_PARENT_PID``
    (:func:`watch_parent`) while it is still ours. SIGINT goes as SIGTERM: a Ctrl-C reached the launcher already,
    and a second SIGINT there stops at once."""
    parent = _parent_pid
    if parent is not None and parent == os.getppid():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(parent, signal.SIGTERM if signame == "SIGINT" else getattr(signal, signame, signal.SIGTERM))


_parent_pid: int | None = None


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


def watch_parent() -> None:
    """Once per process: when ``ATTNRES_PARENT_PID`` is this process's parent, a daemon thread polls it and, once
    it is gone, sends this process SIGTERM (its output to the dead parent's pipe going to /dev/null). When the
    process it names is gone already (this process was orphaned before it got here: a launcher killed while its
    workers started), that SIGTERM comes at once. Sets the variable to this process's pid for the processes it
    starts."""
    global _watching, _parent_pid
    if _watching:
        return
    _watching = True
    named = os.environ.get(PARENT_ENV)
    os.environ[PARENT_ENV] = str(os.getpid())
    parent = os.getppid()
    if named != str(parent):
        if named is not None and named.isdigit() and _gone(int(named)):
            _silence_pipes()
            os.kill(os.getpid(), signal.SIGTERM)
        return
    _parent_pid = parent

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        _silence_pipes()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="attnres-parent-watch", daemon=True).start()


def _is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def _to_devnull(fd: int) -> None:
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)


def _silence_pipes() -> None:
    for fd in (1, 2):
        if _is_pipe(fd):
            _to_devnull(fd)


class _PipeSafe:
    """A text stream that, once the reader of its pipe is gone (EPIPE), writes to /dev/null instead of raising."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _drop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            _to_devnull(self._stream.fileno())
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()  # what was buffered goes to /dev/null now

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def tolerate_closed_pipes() -> None:
    """Wrap sys.stdout and sys.stderr where they are pipes (a parent reading them) so that a write after the
    reader died goes to /dev/null instead of raising BrokenPipeError; a terminal or a file is left as it is."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _PipeSafe) or stream is None:
            continue
        try:
            fd = stream.fileno()
        except (OSError, ValueError, AttributeError):
            continue
        if _is_pipe(fd):
            setattr(sys, name, _PipeSafe(stream))
