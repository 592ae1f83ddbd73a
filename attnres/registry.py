"""The residual-scheme registry: residual name -> scheme class, each with its typed options.

A scheme registers itself where it is defined (attnres/residual.py, attnres/peers.py)::

    @register("full")
    class FullAttnRes(ResidualScheme):
        Options = FullAttnResOptions
        ...

so the registered names are the single list of ``ModelConfig.residual`` values, in registration order. This
module imports nothing from the rest of attnres: ``ModelConfig`` looks names and options up here without
importing the schemes (importing the ``attnres`` package registers them all).

Options are frozen dataclasses deriving from :class:`SchemeOptions`. A field's annotation is its type (``bool``,
``int``, ``int | None``, ``Literal[...]`` of strings) and ``option(default, minimum=...)`` gives it a lower
bound; the values are checked when the options are built, so a bad value fails with a ``ValueError`` that names
the key (``model.residual_options.<key>``) and the allowed values. Checks that need the model's shape go in
:meth:`SchemeOptions.check`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, TypeVar

SchemeT = TypeVar("SchemeT", bound=type)
OptionsT = TypeVar("OptionsT", bound="SchemeOptions")

# name -> scheme class, in registration order (baseline, full, block, then the peers)
# (type[Any]: this module cannot name ResidualScheme, whose class attributes Options and uses_block_geometry the
# callers read; attnres.residual.RESIDUAL_SCHEMES is the same dict, typed dict[str, type[ResidualScheme]])
SCHEMES: dict[str, type[Any]] = {}


def option(default: Any, *, minimum: int | None = None) -> Any:
    """A field of a SchemeOptions dataclass: its default and, for integers, the smallest allowed value."""
    return dataclasses.field(default=default, metadata={"minimum": minimum})


def option_key(name: str, value: Any) -> str:
    """How messages spell an option and its value: the YAML key, then the ModelConfig spelling."""
    return f"model.residual_options.{name}={value!r} (ModelConfig.residual_options[{name!r}])"


@dataclasses.dataclass(frozen=True)
class SchemeOptions:
    """Options of one residual scheme (none for the base class). Build from a mapping with :meth:`parse`."""

    scheme: ClassVar[str] = ""  # the residual name, set by @register

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            _check_value(self.scheme, f.name, getattr(self, f.name), hints[f.name], f.metadata.get("minimum"))

    @classmethod
    def parse(cls: type[OptionsT], options: Mapping[str, Any] | None, config: Any = None) -> OptionsT:
        """The options from ``model.residual_options`` (defaults for missing keys); with ``config`` (the
        ModelConfig) also the checks that need the model's shape. ValueError naming the key on bad input."""
        options = dict(options or {})
        allowed = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise ValueError(
                f"model.residual_options (ModelConfig.residual_options) has {unknown} which residual={cls.scheme!r} "
                f"does not accept; allowed options: {', '.join(sorted(allowed)) or 'none'}"
            )
        parsed = cls(**options)
        if config is not None:
            parsed.check(config)
        return parsed

    def check(self, config: Any) -> None:
        """Checks against the model config (e.g. a divisor of d_model); raise ValueError naming the key."""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_value(scheme: str, name: str, value: Any, annotation: Any, minimum: int | None) -> None:
    where = option_key(name, value)
    args = typing.get_args(annotation)
    optional = typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        if value is None:
            return
        (annotation,) = [a for a in args if a is not type(None)]
    if typing.get_origin(annotation) is Literal:
        choices = typing.get_args(annotation)
        if not any(type(value) is type(c) and value == c for c in choices):  # True is not 1
            raise ValueError(
                f"{where} is not allowed for residual={scheme!r}; allowed values: "
                f"{', '.join(map(repr, choices))}{' or None' if optional else ''}"
            )
    elif annotation is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where} is not allowed for residual={scheme!r}; allowed values: True, False")
    elif annotation is int:
        if not isinstance(value, int) or isinstance(value, bool) or (minimum is not None and value < minimum):
            bound = f" >= {minimum}" if minimum is not None else ""
            raise ValueError(f"{where} must be an integer{bound}{' or None' if optional else ''} (residual={scheme!r})")
    else:
        raise TypeError(f"option {name}: annotation {annotation!r} is not supported (bool, int, Literal, | None)")


def register(name: str) -> Callable[[SchemeT], SchemeT]:
    """Class decorator: register a ResidualScheme subclass (with its own ``Options``) under ``name``."""

    def decorate(cls: SchemeT) -> SchemeT:
        if name in SCHEMES:
            raise ValueError(f"residual scheme {name!r} is registered twice ({SCHEMES[name]} and {cls})")
        options = cls.__dict__.get("Options")
        if not (isinstance(options, type) and issubclass(options, SchemeOptions)):
            raise TypeError(f"{cls.__name__} must define its own Options (a SchemeOptions dataclass)")
        if options.__dict__.get("scheme"):
            raise TypeError(f"{options.__name__} already belongs to residual={options.scheme!r}")
        options.scheme = name
        SCHEMES[name] = cls
        return cls

    return decorate


def block_geometry_schemes() -> tuple[str, ...]:
    """The registered schemes that read ``ModelConfig.n_blocks`` / ``block_size`` (their class sets
    ``uses_block_geometry``), in registration order: what a run's identity canonicalises for every other scheme
    (results.config_hash, through experiments.run.identity)."""
    return tuple(name for name, cls in SCHEMES.items() if cls.uses_block_geometry)


def get(name: str) -> type[Any]:
    """The scheme class registered as ``name``; ValueError listing the allowed names otherwise."""
    try:
        return SCHEMES[name]
    except (KeyError, TypeError):
        raise ValueError(f"ModelConfig.residual={name!r} is unknown; allowed values: {', '.join(SCHEMES)}") from None
