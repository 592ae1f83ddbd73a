"""Every way a run that started training can end is recorded: :func:`recorded_outcome` wraps the training of a run
(experiments.train) and, when it raises, writes the record with its status before the exception goes on.

    completed     the body returned after the completed record was written (RecordBuilder.completed)
    interrupted   SIGINT / SIGTERM / SIGUSR1 (experiments.callbacks.GracefulInterrupt), raised as RunInterrupted
    diverged      experiments.module.DivergedError
    failed        any other exception
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from .errors import RunInterrupted
from .record_builder import RecordBuilder
from .wandb_setup import finish_wandb


def _status(e: BaseException) -> tuple[str, str]:
    from .module import DivergedError

    if isinstance(e, RunInterrupted):
        return "interrupted", f"interrupted by {e.signame} at step {e.step}"
    status = "diverged" if isinstance(e, DivergedError) else "failed"
    return status, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


@contextlib.contextmanager
def recorded_outcome(run: RecordBuilder, interrupt: Any, rank_zero: bool) -> Iterator[None]:
    """Run the block with ``interrupt``'s signal handlers installed; record how it ended.

    On an exception (unless the completed record was already written: that record stands) rank zero writes the
    record with the status above, the W&B run ends with exit code 1, and the exception is re-raised (a divergence
    after one line saying at which step). A second
    Ctrl-C (KeyboardInterrupt after a first signal) becomes RunInterrupted without a checkpoint at this step; a
    RunInterrupted is re-raised after a message saying how to resume. On success the W&B run ends with the
    completed record in its summary.
    """
    try:
        with interrupt.installed():
            yield
    except BaseException as e:
        if run.completed:  # e.g. a closed stdout after the completed record was written: keep that record
            finish_wandb(exit_code=0)
            raise
        if isinstance(e, (KeyboardInterrupt, SystemExit)) and interrupt.received and not isinstance(e, RunInterrupted):
            # a second Ctrl-C: stopped at once, without a checkpoint at this step (the last periodic one stands)
            e = RunInterrupted(interrupt.received, run.step, None)
        status, message = _status(e)
        if rank_zero:
            try:
                run.write(run.record(status, error=message))
            except Exception as write_error:  # noqa: BLE001 - never mask the original error
                print(
                    f"[attnres] {run.run_id}: could not write its {status} record ({type(write_error).__name__}: "
                    f"{write_error}); the study's earlier records are untouched",
                    file=sys.stderr,
                    flush=True,
                )
        finish_wandb(exit_code=1)
        if status == "diverged" and rank_zero:
            print(
                f"[attnres] {run.run_id}: diverged at step {run.step + 1} ({e}); recorded as diverged: a relaunch "
                "skips it (force=true re-runs it)",
                flush=True,
            )
        if isinstance(e, RunInterrupted):
            if rank_zero:
                saved = (
                    f"checkpoint {e.checkpoint} saved at that step" if e.checkpoint else "no checkpoint at that step"
                )
                print(
                    f"[attnres] {run.run_id}: {message}; {saved}; recorded as interrupted. Relaunch the same "
                    "command to resume.",
                    flush=True,
                )
            elif (
                getattr(run, "trainer", None) is not None
            ):  # the other ranks of a multi-process run: where each stopped
                print(f"[attnres] {run.run_id}: rank {run.trainer.global_rank} {message}", flush=True)
            raise e from None
        raise
    finish_wandb(exit_code=0, record=run.completed)
