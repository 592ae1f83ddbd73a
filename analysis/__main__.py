"""Command line: ``python -m analysis <command> ...`` (also ``attnres-analysis``), one command per study registered
in analysis.studies.study_registry, plus ``gallery``. Neither importing this module nor ``--help`` imports a study
(pandas, scipy, matplotlib): the top-level help reads the registry's plain table ``COMMANDS``."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from .studies.study_registry import COMMANDS, STUDIES, command_of, load, register


def _gallery_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--results", default="docs/results", help="the committed results to draw from (default: docs/results)"
    )
    p.add_argument("--out", default=None, help="the page (default: <results>/README.md)")


@register("gallery", arguments=_gallery_arguments, printed=lambda doc: doc["entries"])
def _gallery(args: argparse.Namespace, argv: Sequence[str]) -> Any:
    from pathlib import Path

    from .render.gallery import GallerySources, gallery_entries, write_gallery

    results = Path(args.results)
    if not results.is_dir():
        raise FileNotFoundError(f"--results {results} is not a directory")
    entries = gallery_entries(GallerySources.committed(results))
    page = write_gallery(entries, Path(args.out) if args.out else results / "README.md")
    return {"entries": [f"{e.item}: {e.verdict}" for e in entries], "files": [page]}


def _parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """One subcommand per study, with its arguments (every study loaded) where ``argv`` names a command; else from
    the plain table without arguments, so that the top-level help and its errors import no study."""
    p = argparse.ArgumentParser(
        prog="python -m analysis",
        description="Scaling-law fits, compute multipliers with intervals, and figures from attnres result records "
        "(docs/results_schema.md). Output schema: docs/analysis.md.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    if command_of(argv) is None:
        for name, (help, aliases) in sorted(COMMANDS.items()):
            sub.add_parser(name, help=help, aliases=list(aliases))
        return p
    for study in sorted(load().values(), key=lambda s: s.name):
        study.arguments(sub.add_parser(study.name, help=study.help, aliases=list(study.aliases)))
    return p


def _format_warning(message, category, filename, lineno, line=None) -> str:
    return f"warning: {message}\n"  # no file:line noise for a CLI user


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m analysis <command> ...``: the exit status (0, or 2 after one ``error:`` line)."""
    return run(argv)[0]


def run(argv: Sequence[str] | None = None) -> tuple[int, Any]:
    """One command in this process, as ``python -m analysis <argv>`` runs it: (its exit status, the document its
    report built; None after an error). ``sweeps.study`` reports a study through it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser(argv).parse_args(argv)
    study = next(s for s in STUDIES.values() if args.command in (s.name, *s.aliases))
    saved = warnings.formatwarning
    warnings.formatwarning = _format_warning
    try:
        document = study.report(args, argv)
        print(*study.printout(document, getattr(args, "out", None)), sep="\n")
    except (ValueError, FileNotFoundError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2, None
    finally:
        warnings.formatwarning = saved
    return 0, document


if __name__ == "__main__":
    sys.exit(main())
