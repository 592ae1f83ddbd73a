"""Regenerate the committed reports under docs/results from their committed records, into a temporary directory,
and compare them with the committed files: byte for byte, numbers in JSON and Markdown within a tolerance.

    python scripts/regenerate_reports.py               # every report below; exit status 1 if any file differs
    python scripts/regenerate_reports.py --only cpu_deep/pooled,cpu_map --keep /tmp/regen

The reports are the study files' (sweeps/studies/<name>.yaml, ``reports``: each report's directory, the records it
is made from, the options of its own) and two of no study (the paper's refit, the gallery page). Each report is
rebuilt by the analysis command that wrote it (the study's own, ``sweeps.study.analysis_argv``), run in a scratch
directory laid out as the study's was (``runs/<study>/records/``), so that the ``source`` a document records is the
same relative path. What a regeneration cannot reproduce is pinned or masked, and said per file:

- the creation time of ``fit.json`` and ``lr.json`` is pinned to the committed document's own (``created``);
- a PDF's ``/CreationDate`` is the time it was drawn: compared with that one field masked (same length, so the
  cross-reference offsets still compare); a PNG carries no time (its ``Software`` key names the matplotlib
  version, which is compared like every other byte);
- a ``source`` the committed document recorded as an absolute or scratch path (``/tmp/...``) is masked;
- a report's files drawn from run directories, which are not committed (its study file's ``from_run_dirs``:
  cpu_deep/design's dynamics, depth-weight and loss-curve figures), are listed as not regenerable, and left out of
  the ``files`` list of the committed JSON documents they are compared with.

A JSON or Markdown file that is not byte-identical is compared token by token (:func:`compare_text`): every byte
outside its numbers as it is, its numbers as numbers, within 1e-6 relative in JSON (``JSON_RTOL``: full floats,
whose last digits depend on the machine's BLAS and a fit's on its solver's tolerance) and within one unit of the
last printed digit in Markdown (``0.000`` equals ``-0.000`` and ``1.0799`` equals ``1.0798``, as two values any
distance apart can round; ``1.234`` and ``1.236`` differ). A digit inside a JSON string is text. A figure drawn from
numbers that moved in their last digits moves by a fraction of a pixel: a PDF is compared by its decompressed drawing
commands, each coordinate within 1e-2 pt (``PDF_POINTS``), a PNG pixel by pixel (equal within one intensity level on
at most 0.1% of its pixels: anti-aliasing), or, where it moved more, through the PDF it is the raster of.

Per file it prints ``identical`` (every byte), ``identical, <what> masked``, ``equal within ...`` (numbers within the
tolerance, how many differ) or ``DIFFERENT: line <n>: ...`` with the first differing value, committed and
regenerated. Files of a report directory that no command writes (design notes) are not compared. Reports whose
records were never committed (a study file's ``not_regenerable``: docs/results/cpu_ladder's top level,
cpu_arch_grid, the MoE router figures, whose run directories are not kept) are listed as not regenerable.
"""

from __future__ import annotations

import argparse
import json
import math
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
    from_run_dirs: tuple[str, ...] = ()  # its files drawn from run directories (not committed): not rebuilt


# The reports of no study: the refit of the paper's own numbers, and the gallery page over every report.
STANDALONE = (
    Report("paper_refit", ("-m", "analysis", "paper", "--out", "{out}"), (), "fit.json"),
    Report("", ("-m", "analysis", "gallery", "--results", "docs/results"), in_place="README.md"),
)


def study_reports(only: set[str] | None = None) -> tuple[list[Report], dict[str, str]]:
    """The reports the study files name (sweeps/studies/<name>.yaml, ``reports``; ``only``: those directories),
    each rebuilt by its study's own analysis command (sweeps.study.analysis_argv, the study's name and kind as its
    sweep composes them) or by a command of its own, and the ones that cannot be rebuilt, with why."""
    from sweeps.study import STUDIES, analysis_argv, study_runs

    reports, not_regenerable = [], {}
    for study in STUDIES.values():
        runs: tuple[str, str] | None = None
        for spec in study.reports:
            if only is not None and spec.out not in only:
                continue
            if spec.not_regenerable is not None:
                not_regenerable[spec.out] = spec.not_regenerable
                continue
            if spec.records or spec.command is None:
                runs = runs or study_runs(study)  # composes the sweep once per study
            if spec.command is not None:
                command = spec.command
            else:
                assert runs is not None
                argv = analysis_argv(study, runs[1], f"runs/{runs[0]}/results.csv", "{out}", args=study.analysis_args)
                command = ("-m", "analysis", *argv, *spec.args)
            sources = ((runs[0], spec.records),) if spec.records and runs is not None else ()
            reports.append(Report(spec.out, command, sources, spec.pinned, from_run_dirs=spec.from_run_dirs))
    return reports, not_regenerable


def planned_reports(only: set[str] | None = None) -> tuple[list[Report], dict[str, str]]:
    """Every report this script regenerates (``only``: those directories; ``README.md``: the gallery page) and the
    committed ones it cannot, with why."""
    reports, not_regenerable = study_reports(only)
    reports += [r for r in STANDALONE if only is None or (r.out or "README.md") in only]
    return reports, not_regenerable


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
    """The committed document's ``created``; None for a report not committed yet (its first regeneration)."""
    if not path.is_file():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))
    return doc.get("created") or (doc.get("provenance") or {}).get("created")


def _mask_source(data: bytes) -> bytes:
    return re.sub(rb'"source": "(/[^"]*)"', b'"source": "<masked>"', data)


# JSON holds full floats, whose last digits depend on the BLAS and the CPU's vector width; an iterative fit carries
# that up to its solver's tolerance: under OpenBLAS's Haswell kernels against its SkylakeX ones the frontier's
# bootstrap half-width moves by 5e-8 (docs/DEVELOPING.md, "Another BLAS"), hence 1e-6. A fit whose optimum is a flat
# valley (a set, not a point) moves further; that is a difference, and said so.
JSON_RTOL = 1e-6
_NUMBER = rb"[-+]?(?:\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|Infinity|NaN)"
# A JSON string (text, digits included) or a number; in Markdown every number is one.
_JSON_TOKEN = re.compile(rb'(?P<text>"(?:[^"\\]|\\.)*")|(?P<number>' + _NUMBER + rb")")
_MD_TOKEN = re.compile(rb"(?P<number>[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
_PRINTED = re.compile(rb"[-+]?\d+(?:\.(\d+))?(?:[eE]([-+]?\d+))?")


def _pieces(data: bytes, token: re.Pattern[bytes]) -> list[tuple[int, bytes, bool]]:
    """``data`` cut into (offset, bytes, is a number): each number ``token`` finds and the text between them."""
    out: list[tuple[int, bytes, bool]] = []
    at = 0
    for m in token.finditer(data):
        if m.group("number") is None:
            continue  # a JSON string: part of the text around it
        if m.start() > at:
            out.append((at, data[at : m.start()], False))
        out.append((m.start(), m.group(), True))
        at = m.end()
    if at < len(data):
        out.append((at, data[at:], False))
    return out


def _json_equal(a: bytes, b: bytes) -> bool:
    x, y = float(a), float(b)
    return (x != x and y != y) or math.isclose(x, y, rel_tol=JSON_RTOL, abs_tol=0.0)


def _printed_equal(a: bytes, b: bytes) -> bool:
    """Two printed numbers within one unit of the coarser one's last digit (``1.5`` = ``1.50``, ``-0.0`` = ``0.0``,
    ``1.0799`` = ``1.0798``: two values any distance apart can round to neighbouring digits; ``1.234`` != ``1.236``)."""

    def unit(text: bytes) -> float:
        m = _PRINTED.fullmatch(text)
        assert m is not None, text
        return 10.0 ** (int(m[2] or 0) - len(m[1] or b""))

    return abs(float(a) - float(b)) <= max(unit(a), unit(b)) * (1 + 1e-9)


def compare_text(new: bytes, old: bytes, kind: str) -> str:
    """The regenerated text ``new`` against the committed ``old``, ``kind`` ``json``, ``md`` or ``pdf`` (its drawing
    commands, :func:`_pdf_commands`): every byte outside the numbers equal and each number equal within the kind's
    tolerance (JSON: ``JSON_RTOL``; Markdown: one unit of the last printed digit; PDF: ``PDF_POINTS``).
    ``equal within <tolerance>: <n> number(s) differ below it`` or ``DIFFERENT: line
    <n>: <the first differing value or text, committed then regenerated>``."""
    token, equal, tolerance = {
        "json": (_JSON_TOKEN, _json_equal, f"{JSON_RTOL:g} relative"),
        "md": (_MD_TOKEN, _printed_equal, "the printed digits"),
        "pdf": (_MD_TOKEN, _drawn_equal, f"{PDF_POINTS:g} pt"),
    }[kind]
    a, b = _pieces(new, token), _pieces(old, token)
    close = 0
    for (got_at, got, got_number), (at, want, want_number) in zip(a, b):
        if got == want:
            continue
        if got_number and want_number and equal(got, want):
            close += 1
            continue
        if got_number and want_number:
            line = old.count(b"\n", 0, at) + 1
            return f"DIFFERENT: line {line}: committed {want.decode()}, regenerated {got.decode()}"
        same = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
        return _lines_differ(new, got_at + same, old, at + same)
    if len(a) != len(b):
        return _lines_differ(
            new, len(new) if len(a) < len(b) else a[len(b)][0], old, b[len(a)][0] if len(a) < len(b) else len(old)
        )
    return f"equal within {tolerance}: {close} number(s) differ below it"


def _lines_differ(new: bytes, new_at: int, old: bytes, old_at: int, width: int = 80) -> str:
    """``DIFFERENT: line <n>: committed <its line>, regenerated <its line>``: the lines holding the first difference
    (at ``old_at`` in the committed text, ``new_at`` in the regenerated one)."""

    def line_at(text: bytes, at: int) -> str:
        start = text.rfind(b"\n", 0, at) + 1
        end = text.find(b"\n", at)
        s = text[start : end if end >= 0 else len(text)].decode(errors="replace")
        return repr(s if len(s) <= width else s[:width] + "...")

    line = old.count(b"\n", 0, old_at) + 1
    return f"DIFFERENT: line {line}: committed {line_at(old, old_at)}, regenerated {line_at(new, new_at)}"


PNG_LEVELS = 1  # intensity levels (of 255) a pixel may move by: anti-aliasing of a curve moved by a fraction of a pixel
PNG_SHARE = 1e-3  # the share of pixels that may
_PDF_STREAM = re.compile(rb"stream\r?\n(.*?)\r?\nendstream", re.S)
_PDF_XREF = re.compile(rb"\nxref\n.*", re.S)  # the byte offsets: they move with any stream's compressed length


def compare_png(new: bytes, old: bytes) -> str:
    """Two PNGs pixel by pixel: ``equal within 1 level: <n> pixel(s) differ below it`` where they have one shape and
    at most ``PNG_SHARE`` of the pixels differ, each by at most ``PNG_LEVELS`` of 255 in every channel; else
    ``DIFFERENT: <how>``."""
    import io

    from matplotlib.image import imread

    a, b = imread(io.BytesIO(new), format="png"), imread(io.BytesIO(old), format="png")
    if a.shape != b.shape:
        return f"DIFFERENT: {b.shape[1]}x{b.shape[0]} committed, {a.shape[1]}x{a.shape[0]} regenerated"
    moved = abs(a.astype(float) - b.astype(float)).max(axis=-1) if a.ndim == 3 else abs(a - b)
    n = int((moved > 0).sum())
    if moved.max() * 255 > PNG_LEVELS + 1e-6 or n > PNG_SHARE * moved.size:
        return f"DIFFERENT: {n} pixel(s) differ, by up to {moved.max() * 255:.0f} levels"
    return f"equal within {PNG_LEVELS} level: {n} pixel(s) differ below it"


def _pdf_commands(data: bytes) -> bytes:
    """A PDF with each compressed stream inflated and the cross-reference table dropped (what a number that moved
    changes besides the number: compressed lengths and byte offsets)."""
    import zlib

    def inflate(m: re.Match[bytes]) -> bytes:
        try:
            return b"stream\n" + zlib.decompress(m[1]) + b"\nendstream"
        except zlib.error:
            return m[0]

    text = PDF_DATE.sub(b"/CreationDate (D:00000000000000Z)", _PDF_STREAM.sub(inflate, data))
    text = re.sub(rb"(\d+ 0 obj\n)\d+(\nendobj)", rb"\1_\2", text)  # a stream's length as an object of its own
    return re.sub(rb"/Length \d+", b"/Length _", _PDF_XREF.sub(b"", text))


PDF_POINTS = 1e-2  # how far a PDF coordinate may move, in points (1/7200 inch: nothing a reader can see)


def _drawn_equal(a: bytes, b: bytes) -> bool:
    """Two printed PDF numbers within ``PDF_POINTS`` or one unit of the coarser one's last digit."""
    return abs(float(a) - float(b)) <= PDF_POINTS or _printed_equal(a, b)


def _drop_listed(data: bytes, names: tuple[str, ...]) -> tuple[bytes, int]:
    """The JSON document ``data`` with ``names`` taken out of its ``files`` list, in the layout json.dumps(indent=2)
    writes, and how many it took out (``data`` unchanged and 0 where it lists none of them)."""
    m = re.search(rb'"files": \[(\n(\s*)[^\]]*)\]', data)
    if m is None:
        return data, 0
    inner, indent = m.group(1), m.group(2)
    items = json.loads(b"[" + inner + b"]")
    kept = [x for x in items if x not in names]
    if len(kept) == len(items):
        return data, 0
    listed = b",".join(b"\n" + indent + json.dumps(x).encode() for x in kept)
    return data[: m.start(1)] + listed + inner[len(inner.rstrip()) :] + data[m.end(1) :], len(items) - len(kept)


def _png_or_its_pdf(new: Path, old: Path, status: str) -> str:
    """A PNG whose pixels moved beyond ``PNG_LEVELS`` but which is the raster of a PDF beside it (the same drawing)
    is equal when that PDF's drawing commands are (a filled band whose edge moved by 1e-3 pt changes its anti-aliased
    edge pixels by several levels); its size must be the same (:func:`compare_png` says so first)."""
    pdf_new, pdf_old = new.with_suffix(".pdf"), old.with_suffix(".pdf")
    if not status.startswith("DIFFERENT: ") or "pixel(s) differ" not in status:
        return status
    if not (pdf_new.is_file() and pdf_old.is_file()):
        return status
    drawn = compare_text(_pdf_commands(pdf_new.read_bytes()), _pdf_commands(pdf_old.read_bytes()), "pdf")
    if drawn.startswith("DIFFERENT"):
        return status
    return f"equal through its PDF ({drawn.split(':')[0]}): {status.removeprefix('DIFFERENT: ')}"


def compare(new: Path, old: Path, from_run_dirs: tuple[str, ...] = ()) -> str:
    """The regenerated file against the committed: ``identical``, ``identical, <what> masked``, for JSON and
    Markdown ``equal within ...`` (:func:`compare_text`), else ``DIFFERENT`` (``: line <n>: ...`` for those two).
    ``from_run_dirs``: files a regeneration cannot draw, left out of the committed JSON's ``files`` list."""
    a, b = new.read_bytes(), old.read_bytes()
    if a == b:
        return "identical"
    undated = b"/CreationDate (D:00000000000000Z)"
    if new.suffix == ".pdf" and PDF_DATE.sub(undated, a) == PDF_DATE.sub(undated, b):
        return "identical, PDF CreationDate masked"
    if new.suffix == ".png":
        return _png_or_its_pdf(new, old, compare_png(a, b))
    if new.suffix == ".pdf":
        return compare_text(_pdf_commands(a), _pdf_commands(b), "pdf")
    if new.suffix not in (".json", ".md"):
        return "DIFFERENT"
    masked: list[str] = []
    if new.suffix == ".json":
        b, dropped = _drop_listed(b, from_run_dirs)
        if dropped:
            masked.append(f"{dropped} file(s) drawn from run directories left out of its files list")
    unsourced = _mask_source(a), _mask_source(b)
    if unsourced != (a, b):
        a, b = unsourced
        masked.append("absolute source path masked")
    if a == b:
        return ", ".join(["identical", *masked])
    return compare_text(a, b, new.suffix[1:]) + "".join(f"; {m}" for m in masked)


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
    only = {d.strip().strip("/") for d in args.only.split(",") if d.strip()} if args.only else None
    reports, not_regenerable = planned_reports(only)
    unknown = sorted((only or set()) - {r.out or "README.md" for r in reports} - set(not_regenerable))
    if unknown:
        known = sorted({r.out or "README.md" for r in planned_reports()[0]})
        ap.error(f"--only {','.join(unknown)}: no report there; the reports: {', '.join(known)}")
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
            beside = tuple(Path(n).name for n in report.from_run_dirs if Path(n).parent == rel.parent)  # beside it
            status = compare(new, old, beside) if old.is_file() else "not committed"
            what = status.split(":")[0]  # DIFFERENT, equal within <tolerance>, identical...
            counts[what] = counts.get(what, 0) + 1
            print(f"{(Path(report.out) / rel).as_posix()}: {status}", flush=True)
        for undrawn in (name for name in report.from_run_dirs if not (out / name).is_file()):
            counts["not regenerable"] = counts.get("not regenerable", 0) + 1
            print(f"{report.out}/{undrawn}: not regenerable (drawn from run directories, which are not committed)")
    for what, why in not_regenerable.items():
        print(f"{what}: not regenerable ({why})")
    print("; ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if counts.get("DIFFERENT") or counts.get("failed") else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main())
