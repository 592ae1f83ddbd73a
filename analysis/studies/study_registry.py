"""The study registry: ``python -m analysis <name>`` -> the study that reports it. A study registers itself once, in
its module (analysis/studies/<module>.py), with :func:`register` on its report function (args, argv -> the document
it wrote); the registered names are the analysis commands a study file names (sweeps/study.py). :func:`load`
imports every study module. This module imports nothing heavy: :data:`COMMANDS` repeats each command's ``--help``
line and aliases as plain data for ``python -m analysis --help`` (tests/test_analysis_cli.py checks it)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Arguments = Callable[[argparse.ArgumentParser], None]
Report = Callable[[argparse.Namespace, Sequence[str]], Any]
Headline = Callable[[Any], list[str]]  # a report's document -> lines


@dataclass(frozen=True)
class Study:
    """One registered analysis command: ``headline`` (the document's lines for sweeps.study; None: none), ``files``
    (what its report writes, in words), ``study_kind`` (the kind of sweep it reports whatever its study file says)
    and ``printed`` (the lines the CLI prints before the files; None: the headline)."""

    name: str
    help: str
    arguments: Arguments
    report: Report
    headline: Headline | None = None
    aliases: tuple[str, ...] = ()
    files: str = ""
    study_kind: str | None = None
    printed: Headline | None = None

    def printout(self, document: Any, out: str | None) -> list[str]:
        """What ``python -m analysis <name>`` prints: ``printed`` (or the headline), then ``wrote <files> to <out>``."""
        say = self.printed or self.headline
        lines = list(say(document)) if say is not None else []
        files = document.get("files") if isinstance(document, dict) else getattr(document, "files", None)
        if files:
            lines.append(f"wrote {', '.join(map(str, files))}" + (f" to {out}" if out else ""))
        return lines


STUDIES: dict[str, Study] = {}  # name -> study, in registration order

# name -> (its --help line, its aliases), as the loaded registry holds them: the top-level --help's plain table
COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ablations": (
        "ablations and peers (Table 4): same-seed differences with 95%% t intervals, beside the paper's",
        (),
    ),
    "block_size": (
        "block size (Fig. 6): same-seed differences with 95%% t intervals, beside the paper's",
        ("block-size",),
    ),
    # the architecture grid is reported by the fit (fit.json arch_grid, its table and figure)
    "fit": ("fit a results table and write fit.json, summary.md and figures", ("arch_grid",)),
    "gallery": ("the paper's figures and tables beside ours, one Markdown page", ()),
    "length": (
        "arm - baseline per rung at each training length (tokens per parameter): 95%% t intervals",
        (),
    ),
    "lr": ("tune the learning rate per (size, arm) from an LR study; write the config the sizes read", ()),
    "map": ("the depth-by-width map: per-cell same-seed deltas, intervals, boundary, heat map", ()),
    "paired": ("a condition study: arm - reference per cell and condition, their interaction", ()),
    "paper": ("refit the paper's published numbers and draw its figures", ()),
    "recipe": ("a recipe study: two training recipes x arms x rungs; multipliers, wall clock, interaction", ()),
}


def command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first word that is not an option) if :data:`COMMANDS` knows it, else None."""
    word = next((a for a in argv if not a.startswith("-")), None)
    known = {n for name, (_, aliases) in COMMANDS.items() for n in (name, *aliases)}
    return word if word in known else None


def register(
    name: str,
    *,
    arguments: Arguments,
    help: str | None = None,
    headline: Headline | None = None,
    aliases: tuple[str, ...] | None = None,
    files: str = "",
    study_kind: str | None = None,
    printed: Headline | None = None,
) -> Callable[[Report], Report]:
    """Register the decorated report function as ``python -m analysis <name>`` (its help and aliases by default
    :data:`COMMANDS`'); a name, alias or study kind taken twice is a ValueError naming both."""
    plain_help, plain_aliases = COMMANDS.get(name, ("", ()))
    help = plain_help if help is None else help
    aliases = plain_aliases if aliases is None else aliases

    def add(report: Report) -> Report:
        taken = {n: s.name for s in STUDIES.values() for n in (s.name, *s.aliases)}
        for n in (name, *aliases):
            if n in taken and taken[n] != name:
                raise ValueError(f"analysis command {n!r} of {name!r} is already registered by {taken[n]!r}")
        kinds = {s.study_kind: s.name for s in STUDIES.values() if s.study_kind is not None}
        if study_kind is not None and kinds.get(study_kind, name) != name:
            raise ValueError(f"study kind {study_kind!r} of {name!r} is already reported by {kinds[study_kind]!r}")
        files_ = files or f"{name} report"
        STUDIES[name] = Study(name, help, arguments, report, headline, aliases, files_, study_kind, printed)
        return report

    return add


def load() -> dict[str, Study]:
    """Every study of analysis.studies, registered by importing its module (and pandas, scipy, matplotlib)."""
    package = importlib.import_module(__package__ or "analysis.studies")
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")
    return STUDIES


def get(name: str) -> Study:
    """The study registered as ``name`` or with it as an alias; else a ValueError naming the registered ones."""
    studies = load()
    for study in studies.values():
        if name == study.name or name in study.aliases:
            return study
    raise ValueError(f"analysis command {name!r} is not registered; registered: {', '.join(sorted(studies))}")


def for_kind(study_kind: str) -> Study | None:
    """The study registered as the reporter of ``study_kind`` (e.g. ``map``, ``lr``), if any."""
    return next((s for s in load().values() if s.study_kind == study_kind), None)


def headline_lines(name: str, document: Any) -> list[str]:
    """The headline lines of study ``name`` from the document its report returned ([] for a study without one)."""
    study = get(name)
    return list(study.headline(document)) if study.headline is not None else []


# ---- argument types the studies share ----------------------------------------------------------------------------
def seed_list(text: str) -> list[int]:
    """``--seeds 20,21,22``: comma-separated integers."""
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 20,21,22") from None


def fractions(text: str) -> tuple[float, ...]:
    """``--e-sensitivity 0.5,0.9``: comma-separated fractions, each in (0, 1)."""
    try:
        out = tuple(float(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated fractions, e.g. 0.5,0.9") from None
    if not out or not all(0 < f < 1 for f in out):
        raise argparse.ArgumentTypeError(f"{text!r}: every fraction must lie in (0, 1)")
    return out


def add_results_out(p: argparse.ArgumentParser, results: str, out: str) -> None:
    """The two arguments every study's report takes: ``--results`` (what it reads) and ``--out`` (where it writes)."""
    p.add_argument("--results", required=True, help=results)
    p.add_argument("--out", required=True, help=out)


def add_arms(p: argparse.ArgumentParser, arm: str | None = None) -> None:
    """``--baseline`` (the reference arm's variant name) and, given its default, ``--arm`` (the arm compared)."""
    if arm is not None:
        p.add_argument("--arm", default=arm, help=f"the arm compared with the baseline (default: {arm})")
    p.add_argument("--baseline", default="baseline", help="variant name of the baseline arm (default: baseline)")


def fixed_shape_arguments(p: argparse.ArgumentParser) -> None:
    add_results_out(p, "the study's results.csv (or a study directory)", "output directory (JSON, Markdown, figure)")
    add_arms(p)


def register_fixed_shape(name: str, analyse: Callable[..., Any], files: str) -> None:
    """Register ``analyse(records, out, baseline)``, a study at one shape (ablations, block size), as the reporter
    of study kind ``name``; the CLI prints its document's ``verdict``."""

    def report(args: argparse.Namespace, argv: Sequence[str]) -> Any:
        from pathlib import Path

        from ..io.runs import load_one_dataset

        return analyse(load_one_dataset(args.results), Path(args.out), args.baseline)

    kind = {"study_kind": name, "printed": _verdict}
    register(name, arguments=fixed_shape_arguments, files=files, **kind)(report)


def _verdict(doc: Any) -> list[str]:
    return [doc["verdict"]]


def add_bootstrap(p: argparse.ArgumentParser, what: str = "bootstrap replicates") -> None:
    """``--bootstrap B`` and ``--seed``: the resampling of a study's intervals."""
    p.add_argument("--bootstrap", type=int, default=2000, metavar="B", help=f"{what} (default: 2000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap random seed (default: 0)")


def add_choice(p: argparse.ArgumentParser, flag: str, choices: Sequence[str], help: str) -> None:
    """An option with a fixed set of values, the first its default."""
    p.add_argument(flag, default=choices[0], choices=list(choices), help=help)


def options_from(cls: Any, args: argparse.Namespace, **given: Any) -> Any:
    """The options dataclass ``cls`` from the parsed arguments named as its fields, ``given`` taking precedence."""
    named = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return cls(**(named | given))


def number(x: float | None, spec: str = ".3f") -> str:
    """A headline number: ``spec`` formatted, "n/a" for a missing or NaN one."""
    return "n/a" if x is None or x != x else format(x, spec)
