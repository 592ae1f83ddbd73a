"""The process a run trains in: whether it is global rank zero (:func:`is_rank_zero`), what a result depends on
beyond its config (:func:`environment`, written to ``environment.json``), its CPU time (:func:`cpu_seconds`, the
``cpu_time_s`` every record carries) and Lightning's console output (:func:`quiet_lightning`).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any


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


def environment(datamodule: Any) -> dict[str, Any]:
    """What else a result depends on beyond config.yaml: the exact data and the software."""
    import platform

    import lightning
    import torch

    from attnres import cpu_kernels
    from results.config_hash import data_fingerprint
    from results.io import git_commit

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
        "git_commit": git_commit(),
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
