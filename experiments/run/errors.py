"""The ways a run can stop short of completing that the command line reports in one line (no traceback).

Light on purpose (no torch, no Lightning): the entry point catches these before anything heavy is imported.
"""

from __future__ import annotations

import signal


class DivergedError(RuntimeError):
    """The training loss became NaN or infinite (experiments.training.train_step.training_loss); the run is recorded
    with status `diverged`."""


class SetupError(ValueError):
    """The run could not start: a config or data problem found before training. Nothing was written for it (no
    run directory, no record): a config that never trained is not a failed run."""


class RunBusy(RuntimeError):
    """Another process (this host or another node) holds the run's lock: it is training this very run now."""


class RunInterrupted(BaseException):
    """A run stopped by a signal (SIGINT, SIGTERM, SIGUSR1) after saving its checkpoint at the step in progress.

    A BaseException, like KeyboardInterrupt: no ``except Exception`` on the way (Hydra's job runner included)
    swallows it and goes on to the next run of a sweep. ``exit_code`` = 128 + the signal number."""

    def __init__(self, signame: str, step: int, checkpoint: str | None) -> None:
        super().__init__(f"{signame} at step {step}")
        self.signame, self.step, self.checkpoint = signame, step, checkpoint
        self.exit_code = 128 + int(getattr(signal, signame, signal.SIGINT))


class StopRequested(BaseException):
    """An interrupt signal outside a run's training (composing, preparing data, between the runs of a sweep), or
    before a run started: there is nothing to save, so nothing is written for the run; the launch stops with
    ``exit_code`` = 128 + the signal number. A BaseException, so that no ``except Exception`` swallows it."""

    def __init__(self, signame: str) -> None:
        super().__init__(f"interrupted by {signame}")
        self.signame = signame
        self.exit_code = 128 + int(getattr(signal, signame, signal.SIGINT))
