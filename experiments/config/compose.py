"""Composing the Hydra configs outside a Hydra app: :func:`compose` gives ``conf/train.yaml`` with overrides as
``python -m experiments.train`` would see it, :func:`sweep_cells` every point of a sweep, :func:`conf_dir` where
the configs are. Every caller composes through here (the tests, the bench, ``python -m experiments.sizes``).
"""

from __future__ import annotations

import itertools
import re
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

    repo_conf = Path(__file__).resolve().parents[2] / "conf"  # experiments/config/compose.py -> the repository
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


# Hydra's flags that take the usual path through :func:`cli_problem`; any other flag (--help, --info, -cn, ...) is
# left to Hydra itself.
_CHECKED_FLAGS = ("-m", "--multirun", "-c", "--cfg", "--resolve", "-p", "--package", "job", "hydra", "all")


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split("\n", 1)[0].split())


def cli_problem(argv: Sequence[str]) -> str | None:
    """What is wrong with a command line of ``python -m experiments.train`` before Hydra runs it, in one line
    naming the override (a group choice that does not exist, with the closest choices; a key the config does not
    have, with the closest keys; an override that does not parse or whose value its key's type refuses), or None.

    Every value of a sweep (``model=a,b``) is checked against the group's choices; the config is composed once,
    with the first value of each sweep. Hydra's own parser reads ``argv``; a flag other than -m / --cfg /
    --resolve / --package (``--help``, ``--info``, ``-cn``, ...) is left to Hydra. Leaves Hydra uninitialised."""
    from hydra._internal.utils import get_args_parser  # Hydra's own command-line parser (what hydra.main uses)
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    from .validation import closest

    if any(a.startswith("-") and a not in _CHECKED_FLAGS for a in argv):
        return None
    try:
        args = get_args_parser().parse_args(list(argv))
    except SystemExit:  # argparse's own error; Hydra reports it the same way
        return None
    parser = OverridesParser.create()
    parsed = []
    for text in args.overrides:
        try:
            parsed.extend((text, o) for o in parser.parse_overrides([text]))
        except OverrideParseException as e:
            return f"{text}: not a valid override ({_one_line(e)}); grammar: https://hydra.cc/docs/advanced/override_grammar/basic/"
    initialize()
    try:
        loader = GlobalHydra.instance().config_loader()
        first, groups = [], []
        for text, o in parsed:
            if o.is_delete():
                first.append(text)
                continue
            options = loader.get_group_options(o.key_or_group)
            if o.value_type == ValueType.GLOB_CHOICE_SWEEP:
                values = o.value().filter(options)
            elif o.is_sweep_override():
                values = list(o.sweep_string_iterator())
            else:
                values = [text.split("=", 1)[1]]
            if options:  # a config group: every value must be one of its configs
                for v in values:
                    if v not in options and v != "null":
                        return (
                            f"{o.key_or_group}={v}: no such config in group {o.key_or_group}{closest(v, options)}; "
                            f"choices: {', '.join(options)}"
                        )
            one = f"{o.get_key_element()}={values[0]}" if values and values != [text.split("=", 1)[1]] else text
            first.append(one)
            if options:
                groups.append(one)
        try:
            compose(first, return_hydra_config=True)
        except MissingConfigException as e:
            missing = str(e.missing_cfg_file or "?")
            group, _, name = missing.rpartition("/")
            options = list(e.options or [])
            choices = ", ".join(options)
            return f"{group}={name}: no such config in group {group}{closest(name, options)}; choices: {choices}"
        except HydraException as e:
            m = re.match(r"Could not override '([^']+)'", str(e))
            if m:
                return _unknown_key(m.group(1), first, groups)
            cause = f": {_one_line(e.__cause__)}" if e.__cause__ is not None else ""
            return _one_line(e) + cause
        except OmegaConfBaseException as e:
            return _one_line(e)
        return None
    finally:
        GlobalHydra.instance().clear()


def _unknown_key(key: str, overrides: list[str], groups: list[str]) -> str:
    """The message for an override of a key the config does not have: the deepest node that exists, the closest
    keys there and, for a top-level key, that adding one (``+key=``) is refused too."""
    from omegaconf import DictConfig

    from .validation import closest

    text = next((t for t in overrides if t.split("=", 1)[0].lstrip("~+") == key), key)
    node: object = compose(groups, return_hydra_config=True)
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, DictConfig) or part not in node:
            where = ".".join(parts[:i])
            keys = [str(k) for k in node] if isinstance(node, DictConfig) else []
            if not where:
                return f"{text}: the config has no key {part!r}{closest(part, keys)} (a new top-level key is refused)"
            return f"{text}: {where} has no key {part!r}{closest(part, keys)}; its keys: {', '.join(keys)}"
        node = node[part]
    return f"{text}: cannot override {key}"
