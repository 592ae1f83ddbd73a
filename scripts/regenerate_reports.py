"""Regenerate the committed reports under docs/results from their committed records, into a temporary directory,
and compare them byte for byte with the committed files.

    python scripts/regenerate_reports.py               # every report below; exit status 1 if any file differs
    python scripts/regenerate_reports.py --only cpu_deep/pooled,cpu_map --keep /tmp/regen

Each report is rebuilt by the analysis command that wrote it (the study's own, ``sweeps/study.py``; the seeds,
options and study directory from the report's own ``fit.json`` / ``lr.json`` / ``recipe.json``), run in a scratch
directory laid out as the study's was (``runs/<study>/records/``), so that the ``source`` a document records is the
same relative path. What a regeneration cannot reproduce is pinned or masked, and said per file:

- the creation time of ``fit.json`` and ``lr.json`` is pinned to the committed document's own (``created``);
- a PDF's ``/CreationDate`` is the time it was drawn: compared with that one field masked (same length, so the
  cross-reference offsets still compare); a PNG carries no time (its ``Software`` key names the matplotlib
  version, which is compared like every other byte);
- a ``source`` the committed document recorded as an absolute or scratch path (``/tmp/...``) is masked.

Per file it prints ``identical`` (every byte), ``identical, <what> masked`` or ``DIFFERENT``. Files of a report
directory that no command writes (design notes) are not compared. Reports whose records were never committed
(docs/results/cpu_ladder's top level, cpu_arch_grid, the MoE router figures: their run directories are not kept)
are listed as not regenerable.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results"
PACKAGES = ("analysis", "results", "docs/results")  # copied into the scratch tree, which the commands import from


@dataclass(frozen=True)
class Report:
    """One committed report: where it is (relative to docs/results), the command that writes it (``{out}`` is the
    scratch output directory) and the study directories it reads (``runs/<study>`` <- committed record dirs)."""

    out: str
    command: tuple[str, ...]
    studies: tuple[tuple[str, tuple[str, ...]], ...] = ()
    pinned: str | None = None  # the JSON document whose ``created`` pins the regeneration's clock
    in_place: str | None = None  # a file the command writes inside the scratch copy of docs/results (the gallery)


def _fit(study: str, seeds: str | None = None) -> tuple[str, ...]:
    return ("-m", "analysis", "fit", "--results", f"runs/{study}/results.csv", "--out", "{out}") + (
        ("--seeds", seeds) if seeds else ()
    )


DEEP = (("cpu_deep", ("cpu_deep",)),)
REPORTS = (
    Report("cpu_deep/design", _fit("cpu_deep", "0,1,2"), DEEP, "fit.json"),
    Report("cpu_deep/heldout", _fit("cpu_deep", "20,21,22"), DEEP, "fit.json"),
    Report("cpu_deep/pooled", _fit("cpu_deep"), DEEP, "fit.json"),
    Report("cpu_deep_moe/report", _fit("cpu_deep_moe"), (("cpu_deep_moe", ("cpu_deep_moe",)),), "fit.json"),
    Report(
        "cpu_deep_moe",
        ("-m", "analysis", "moe", "docs/results/cpu_deep_moe", "docs/results/cpu_deep", "--out", "{out}"),
    ),
    *(
        Report(
            name,
            ("-m", "analysis", "lr", "--results", f"runs/{name}/results.csv", "--out", "{out}", "--rule", "per_size"),
            ((name, (name,)),),
            "lr.json",
        )
        for name in ("cpu_deep_lr", "cpu_map_lr", "cpu_deep_recipe_lr")
    ),
    Report(
        "cpu_map",
        ("-m", "analysis", "map", "--results", "runs/cpu_map/results.csv", "--out", "{out}"),
        (("cpu_map", ("cpu_map",)),),
    ),
    Report(
        "deep_block_size",
        ("-m", "analysis", "block-size", "--results", "runs/cpu_deep_block_size/results.csv", "--out", "{out}"),
        (("cpu_deep_block_size", ("deep_block_size", "cpu_deep")),),
    ),
    Report(
        "deep_ablations",
        ("-m", "analysis", "ablations", "--results", "runs/cpu_deep_ablations/results.csv", "--out", "{out}"),
        (("cpu_deep_ablations", ("deep_ablations", "cpu_deep")),),
    ),
    *(
        Report(
            out,
            (
                *("-m", "analysis", "recipe", "--results", "runs/cpu_deep_recipe/results.csv", "--out", "{out}"),
                *("--timing", "docs/results/cpu_deep_recipe_timing", "--lr-protocol", protocol),
            ),
            (("cpu_deep_recipe", ("cpu_deep", "cpu_deep_recipe")),),
        )
        for out, protocol in (("cpu_deep_recipe/report", "baseline"), ("cpu_deep_recipe/report_per_arm", "per_arm"))
    ),
    Report("paper_refit", ("-m", "analysis", "paper", "--out", "{out}"), (), "fit.json"),
    Report("", ("-m", "analysis", "gallery", "--results", "docs/results"), in_place="README.md"),
)
NOT_REGENERABLE = {
    "cpu_ladder (top level, heldout/, pooled/)": "its runs predate records/ (runs.csv only): no records committed",
    "cpu_arch_grid": "its 18 runs' records were not committed",
    "cpu_deep_moe/router_*": "drawn from run directories (diagnostics), which are not committed",
}

# Runs `python -m <module> ...` with datetime.now() pinned (PIN_CREATED, an ISO time), after pandas and matplotlib
# are loaded and before the analysis is, so that both `from datetime import datetime` (module level and in a
# function) see the pinned clock.
WRAPPER = """
import datetime as _dt, os, runpy, sys
import pandas, matplotlib
matplotlib.use("Agg")
_pinned = os.environ.get("PIN_CREATED")
if _pinned:
    _at = _dt.datetime.fromisoformat(_pinned)

    class _Pinned(_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return _at.astimezone(tz) if tz is not None else _at.replace(tzinfo=None)

    _dt.datetime = _Pinned
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""

PDF_DATE = re.compile(rb"/CreationDate \(D:[0-9]{14}Z?\)")


def _created(path: Path) -> str | None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    return doc.get("created") or (doc.get("provenance") or {}).get("created")


def _mask_source(data: bytes) -> bytes:
    return re.sub(rb'"source": "(/[^"]*)"', b'"source": "<masked>"', data)


def compare(new: Path, old: Path) -> str:
    """``identical``, ``identical, <what> masked`` or ``DIFFERENT``: the regenerated file against the committed."""
    a, b = new.read_bytes(), old.read_bytes()
    if a == b:
        return "identical"
    undated = b"/CreationDate (D:00000000000000Z)"
    if new.suffix == ".pdf" and PDF_DATE.sub(undated, a) == PDF_DATE.sub(undated, b):
        return "identical, PDF CreationDate masked"
    if new.suffix in (".json", ".md") and _mask_source(a) == _mask_source(b):
        return "identical, absolute source path masked"
    return "DIFFERENT"


def _lay_out(scratch: Path, report: Report) -> None:
    """The scratch tree: a copy of the analysis' packages and of docs/results (the gallery finds the committed
    figures beside its own code, and links them relative to its page), runs/<study>/records from the committed
    records and its results.csv."""
    from results.ledger import rebuild_table

    for part in PACKAGES:
        if not (scratch / part).exists():
            shutil.copytree(REPO / part, scratch / part, ignore=shutil.ignore_patterns("__pycache__"))
    for study, sources in report.studies:
        target = scratch / "runs" / study
        if target.exists():
            shutil.rmtree(target)
        (target / "records").mkdir(parents=True)
        for src in sources:
            for path in sorted((RESULTS / src / "records").glob("*.json")):
                shutil.copy2(path, target / "records" / path.name)
        rebuild_table(target)


def regenerate(report: Report, scratch: Path) -> tuple[Path, int, str]:
    """Run the report's command in ``scratch``; returns (its output directory, exit status, its output)."""
    _lay_out(scratch, report)
    # each report in a directory of its own (cpu_deep_moe/ holds one report and cpu_deep_moe/report/ another)
    out = scratch / "docs" / "results" if report.in_place else scratch / "out" / report.out.replace("/", "__")
    if not report.in_place:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
    argv = [a.replace("{out}", str(out.relative_to(scratch))) for a in report.command]
    env = {**os.environ, "PYTHONPATH": str(scratch), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    env.pop("SOURCE_DATE_EPOCH", None)
    if report.pinned:
        env["PIN_CREATED"] = _created(RESULTS / report.out / report.pinned) or ""
    proc = subprocess.run(
        [sys.executable, "-c", WRAPPER, *argv[1:]], cwd=scratch, env=env, capture_output=True, text=True
    )
    return out, proc.returncode, proc.stdout + proc.stderr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/regenerate_reports.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated report directories (relative to docs/results), e.g. cpu_map")
    ap.add_argument("--keep", metavar="DIR", help="regenerate into DIR (kept) instead of a temporary directory")
    args = ap.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    reports = [r for r in REPORTS if only is None or (r.out or "README.md") in only]
    scratch = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="attnres_regen_"))
    for stale in (*PACKAGES, "runs", "out"):  # a kept directory of an earlier run: start afresh
        shutil.rmtree(scratch / stale, ignore_errors=True)
    scratch.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for report in reports:
        out, rc, log = regenerate(report, scratch)
        name = report.out or "."
        if rc != 0:
            print(f"{name}: the command failed (exit {rc}): {log.strip().splitlines()[-1:] or ''}")
            counts["failed"] = counts.get("failed", 0) + 1
            continue
        written = [out / report.in_place] if report.in_place else sorted(p for p in out.rglob("*") if p.is_file())
        for new in written:
            rel = new.relative_to(out)
            old = RESULTS / report.out / rel
            status = compare(new, old) if old.is_file() else "not committed"
            counts[status] = counts.get(status, 0) + 1
            print(f"{(Path(report.out) / rel).as_posix()}: {status}", flush=True)
    for what, why in NOT_REGENERABLE.items():
        print(f"{what}: not regenerable ({why})")
    print("; ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if counts.get("DIFFERENT") or counts.get("failed") else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main())
