"""Composing the Hydra configs outside a Hydra app: :func:`compose` gives ``conf/train.yaml`` with overrides as
``python -m experiments.train`` would see it, :func:`sweep_cells` every point of a sweep, :func:`conf_dir` where
the configs are. Every caller composes through here (the tests, the bench, ``python -m experiments.sizes``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from . import config_schema, resolvers

VERSION_BASE = "1.3"


def conf_dir() -> str:
    """Where the Hydra configs are: the repository's ``conf/`` when this module runs from a checkout (also an
    editable install: edits to conf/ take effect), else the copy a built wheel ships as the package
    ``attnres_conf`` (pyproject.toml). An absolute path either way, so the working directory never matters."""
    import importlib.util

    repo_conf = Path(__file__).resolve().parents[1] / "conf"
    if (repo_conf / "train.yaml").is_file():
        return str(repo_conf)
    spec = importlib.util.find_spec("attnres_conf")  # a directory of YAML files, no __init__.py: a namespace package
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(location) / "train.yaml").is_file():
            return str(Path(location))
    raise RuntimeError(
        f"no Hydra configs: neither {repo_conf} nor an installed attnres_conf package has train.yaml "
        "(reinstall attnres)"
    )


def initialize() -> None:
    """Initialise Hydra at :func:`conf_dir` and keep it initialised (until ``GlobalHydra.instance().clear()``), for
    a caller that composes many times; any Hydra initialised before is cleared first."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    initialize_config_dir(config_dir=conf_dir(), version_base=VERSION_BASE)


def compose(overrides: Sequence[str] = (), config_name: str = "train", return_hydra_config: bool = False) -> DictConfig:
    """``conf/<config_name>.yaml`` composed with ``overrides``, the attnres resolvers registered (with
    ``return_hydra_config``: also the ``hydra`` node, e.g. a sweep's ``hydra.sweeper.params``). Uses the Hydra
    already initialised when there is one, else initialises one at :func:`conf_dir` for this call only."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    resolvers.register()
    config_schema.register()
    args = {"config_name": config_name, "overrides": list(overrides), "return_hydra_config": return_hydra_config}
    if GlobalHydra.instance().is_initialized():
        return hydra_compose(**args)
    with initialize_config_dir(config_dir=conf_dir(), version_base=VERSION_BASE):
        return hydra_compose(**args)


def sweep_cells(sweep: str) -> list[dict[str, str]]:
    """Every point of conf/sweep/<sweep>.yaml's hydra.sweeper.params, as {key: value} overrides (Hydra's own
    override parser expands the values, so ranges and choice() work as they do in a real multirun)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    cfg = compose([f"+sweep={sweep}"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params or {}
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    axes = [
        [(o.key_or_group, str(v)) for v in (o.sweep_string_iterator() if o.is_sweep_override() else [o.value()])]
        for o in parsed
    ]
    return [dict(point) for point in itertools.product(*axes)]
