"""The process a run trains in: whether it is global rank zero (:func:`is_rank_zero`), what a result depends on
beyond its config (:func:`environment`, written to ``environment.json``), the commit of the code it trains with
(:func:`launch_commit`, taken once per launch by :func:`mark_launch_commit`), its CPU time (:func:`cpu_seconds`, the
``cpu_time_s`` every record carries) and Lightning's console output (:func:`quiet_lightning`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

# The launch's commit, for the processes it starts: set by mark_launch_commit in the launching process, inherited by
# a launcher's workers (joblib/loky) and SLURM jobs (submitit's sbatch exports the environment: --export=ALL).
LAUNCH_COMMIT_ENV = "ATTNRES_LAUNCH_COMMIT"


def mark_launch_commit() -> str:
    """In the process that launches (experiments.train.main, before Hydra runs a job): take the code's commit now
    (results.io.git_commit: ``+dirty`` when tracked files changed, "" outside a repository) and set it in
    ``ATTNRES_LAUNCH_COMMIT`` for this process and every process it starts, replacing an inherited one (a new
    launch is new code). Returns it."""
    from results.io import git_commit

    commit = git_commit()
    os.environ[LAUNCH_COMMIT_ENV] = commit
    return commit


def launch_commit() -> str:
    """The commit of the code a run trains with: its launch's (``ATTNRES_LAUNCH_COMMIT``, :func:`mark_launch_commit`),
    so every record of a launch carries one commit however long it runs and whatever HEAD does meanwhile; without
    it (a run started from the Python API) results.io.git_commit now. Called when a run opens
    (experiments.run.record_builder.RecordBuilder)."""
    named = os.environ.get(LAUNCH_COMMIT_ENV)
    if named is not None:
        return named
    from results.io import git_commit

    return git_commit()


@contextlib.contextmanager
def launch_commit_pinned() -> Iterator[str]:
    """Inside: ``ATTNRES_LAUNCH_COMMIT`` is set, to the launch's commit or, without one (a launch of several runs
    from the Python API: experiments.run.budgets), to :func:`launch_commit` now, removed again on leaving; so every
    run opened inside records one commit. Yields it."""
    named = os.environ.get(LAUNCH_COMMIT_ENV)
    if named is not None:
        yield named
        return
    commit = launch_commit()
    os.environ[LAUNCH_COMMIT_ENV] = commit
    try:
        yield commit
    finally:
        os.environ.pop(LAUNCH_COMMIT_ENV, None)


def is_rank_zero() -> bool:
    """Whether this process is global rank zero, decided before a Trainer exists the way the Trainer will decide
    it: the cluster environment Lightning detects (SLURM: SLURM_PROCID under srun; torchelastic: RANK) gives the
    global rank; otherwise Lightning's own launcher's LOCAL_RANK and NODE_RANK (both 0 for rank zero)."""
    from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment, TorchElasticEnvironment

    for env_type in (SLURMEnvironment, TorchElasticEnvironment):  # the order of Lightning's accelerator connector
        if env_type.detect():
            return env_type().global_rank() == 0
    env = LightningEnvironment()
    return env.local_rank() == 0 and env.node_rank() == 0


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def cpu_seconds() -> float:
    """CPU seconds of this process and of its finished child processes (the C++ compiler inductor runs)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def environment(datamodule: Any, commit: str | None = None) -> dict[str, Any]:
    """What else a result depends on beyond config.yaml: the exact data and the software. ``git_commit`` is
    ``commit`` (the run's record's, RecordBuilder.git_commit) or else :func:`launch_commit`: the same value whenever
    the launch set ``ATTNRES_LAUNCH_COMMIT``."""
    import platform

    import lightning
    import torch

    from attnres import cpu_kernels
    from results.config_hash import data_fingerprint

    shards = datamodule.load()
    header = shards.header
    return {
        "dataset": {
            "path": str(shards.path),
            "tokenizer": header.tokenizer,
            "vocab_size": header.vocab_size,
            "n_tokens": header.n_tokens,
            "checksum": header.checksum,
            "source": header.source,
            "fingerprint": data_fingerprint(header.checksum),
            "verified": datamodule.verified,
        },  # the files hashed against the checksums, or a valid stamp
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "git_commit": commit if commit is not None else launch_commit(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "host": platform.node(),
        "cpu_kernels": cpu_kernels.status(),  # CPU fp32 depth mixing: compiled kernels or the torch path
        "argv": sys.argv,
    }


class _NoTips(logging.Filter):
    """Drops Lightning's "Tip:" advertisements."""

    attnres = True

    def filter(self, record: logging.LogRecord) -> bool:
        return "Tip:" not in record.getMessage()


def quiet_lightning() -> None:
    """One copy of each Lightning message (under Hydra the root logger already prints them) and no ads."""
    if logging.getLogger().handlers:
        lightning_logger = logging.getLogger("lightning")
        for handler in list(lightning_logger.handlers):
            lightning_logger.removeHandler(handler)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(getattr(f, "attnres", False) for f in rank_zero.filters):
        rank_zero.addFilter(_NoTips())
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
