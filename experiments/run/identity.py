"""A composed run's identity: its config resolved to plain Python (:func:`resolved_container`), the part of it that
defines the experiment (:func:`experiment_config`), and from its ``config_hash`` (results.config_hash: what the hash
covers and what it leaves out) the run's id and directory ``<paths.runs_root>/<study>/<variant>_<size>_s<seed>_<hash8>``
(:func:`run_identity`).

No Lightning: computed before Lightning is imported. Torch is imported with attnres, whose scheme registry says which
residual schemes read the block geometry (attnres.registry.block_geometry_schemes, the one statement of it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from results.config_hash import config_hash, identity_config


def resolved_container(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain Python, every interpolation resolved (a clear error for missing mandatory keys)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]
    except MissingMandatoryValue as e:
        key = getattr(e, "full_key", None) or str(e)
        hint = " (data=shards needs data.name=<dir of prepared shards>)" if "data.name" in str(key) else ""
        raise ValueError(
            f"config key {key} has no value (???); set it on the command line, e.g. {key}=...{hint}"
        ) from None
    except OmegaConfBaseException as e:
        raise ValueError(f"the config does not resolve: {e}") from None


def experiment_config(container: dict[str, Any]) -> dict[str, Any]:
    """results.config_hash.identity_config of a resolved config, with the model library's block-geometry schemes."""
    from attnres.registry import block_geometry_schemes  # importing attnres registers every scheme

    return identity_config(container, block_geometry_schemes())


def run_identity(cfg: DictConfig) -> tuple[str, str, Path, Path]:
    """(config_hash, run_id, run_dir, study directory) of a composed config. A run directory that is not
    ``<paths.runs_root>/<study>/<run_id>`` once normalised (a name holding a separator or ``..``; the names are
    checked by experiments.config.validation.check_name first) is a ValueError: nothing is ever written outside the
    root."""
    container = resolved_container(cfg)
    chash = config_hash(experiment_config(container))
    run_id = f"{cfg.model.variant}_{cfg.size.name}_s{cfg.seed}_{chash[:8]}"
    root = Path(cfg.paths.runs_root).expanduser().resolve()
    study_dir = root / str(cfg.study)
    run_dir = study_dir / run_id
    normal = Path(os.path.normpath(run_dir))
    if normal != run_dir or normal.parent.parent != root or normal.parent.name != str(cfg.study):
        raise ValueError(
            f"the run directory {normal} is not <paths.runs_root>/<study>/<run id> under paths.runs_root={root}: "
            "study, size.name and model.variant must be plain names"
        )
    return chash, run_id, run_dir, study_dir
