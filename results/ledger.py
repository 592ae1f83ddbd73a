"""The ledger of a study: how result records are stored, written, read and checked (docs/results_schema.md §1).

Standard library only (``filelock`` while a table is rebuilt): the writer (experiments) and the readers
(analysis.io.runs, sweeps.study) share this module, so all agree on where records live, how a table is read and
which record of a run is its last. What a record holds and when it is malformed: results.record.

Storage (one study = one directory ``<runs_root>/<study>/``):
  * ``records/<record_id>.json`` — the truth: one immutable file per record, written once under a unique name and
    published by an atomic rename, never modified. ``record_id`` = ``<UTC timestamp>_<run_id>_<writer>``, so
    file-name order is the order the records were written, and two writers (processes, nodes) never write the same
    file.
  * ``results.csv`` — a table derived from ``records/``: rebuilt (atomically, by rename) after every record, and
    by ``python -m experiments.records rebuild <study_dir>``. Every row carries its ``record_id``.

Records of an older layout (a record file without a current field, a table row without a ``record_id``) are not
read: each file is reported on one line naming the migration command (results.record.outdated, migration_hint), and
a table that still holds such rows is left as it is until it is migrated, so that nothing of it is lost.

Nothing is ever appended to a shared file, so a torn, garbled or concurrent write (two processes, two nodes on a
network file system) cannot hide, merge or corrupt another run's record: the worst a crash leaves is a table that
lags its records until the next rebuild. Reading never stops at a bad byte or a bad row: each one is reported with
its file (and line) and skipped.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import sys
import warnings
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .io import atomic_write_text, exclusive_lock, write_json, writer_id
from .record import COLUMNS, RunRecord, malformed, migration_hint, outdated

RESULTS_TABLE = "results.csv"
RECORDS_DIR = "records"
RESULTS_JSON = "results.json"  # a run directory's copy of its last record
_ID_SAFE = re.compile(r"[^A-Za-z0-9._+=-]")


# ---------------------------------------------------------------------------------------------------------
# Record ids


def record_key(timestamp: str, run_id: str, writer: str) -> str:
    """A record_id: sortable UTC timestamp (``20261129T154000.123456Z``), run id, writer (host-pid-nonce)."""
    return f"{timestamp}_{_ID_SAFE.sub('-', run_id)}_{_ID_SAFE.sub('-', writer)}"


def compact_timestamp(iso: str | None) -> str:
    """An ISO-8601 time (as in started_at / finished_at) in record-id form; unparseable -> the earliest key."""
    try:
        t = datetime.fromisoformat(str(iso))
    except (TypeError, ValueError):
        return "00000000T000000.000000Z"
    if t.tzinfo is not None:
        t = t.astimezone(timezone.utc).replace(tzinfo=None)
    return t.strftime("%Y%m%dT%H%M%S.%fZ")


# ---------------------------------------------------------------------------------------------------------
# Reading the table (tolerant: a bad byte, a torn or glued row is reported and skipped, never fatal)


def read_table(path: str | Path) -> tuple[list[str], list[tuple[int, dict[str, str]]], list[str]]:
    """(header, [(line number, row)], problems) of a results table; ([], [], []) when there is none.

    Physical lines are grouped into CSV records by quote balance. A record that is not valid UTF-8, has another
    number of fields than the header (a torn row, or two rows glued together), or is malformed
    (:func:`results.record.malformed`) is skipped, and a problem naming ``<file>:<line>`` says why. When a
    multi-line record is rejected, reading resumes at its second line, so an unbalanced quote cannot swallow the
    rows after it.
    """
    path = Path(path)
    if not path.is_file():
        return [], [], []
    lines = path.read_bytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    problems: list[str] = []
    if not lines:
        return [], [], []
    try:
        header = next(csv.reader([lines[0].decode("utf-8").rstrip("\r")]))
    except (UnicodeDecodeError, StopIteration, csv.Error) as e:
        return [], [], [f"{path}:1: the header is unreadable ({e}); no row of this table can be read"]
    rows: list[tuple[int, dict[str, str]]] = []
    i = 1
    while i < len(lines):
        start = i
        chunk = lines[i]
        while chunk.count(b'"') % 2 and i + 1 < len(lines):  # inside a quoted field: the record goes on
            i += 1
            chunk += b"\n" + lines[i]
        i += 1
        if not chunk.strip():
            continue
        where = f"{path}:{start + 1}"
        reason = None
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError as e:
            reason = f"not valid UTF-8 (byte 0x{chunk[e.start]:02x} at column {e.start + 1})"
        else:
            try:
                fields = next(csv.reader(io.StringIO(text.rstrip("\r"), newline="")))
            except (csv.Error, StopIteration) as e:
                reason = f"not a CSV row ({e})"
            else:
                if len(fields) != len(header):
                    reason = (
                        f"{len(fields)} fields where the header has {len(header)} (a torn row, or rows run together)"
                    )
                else:
                    row = dict(zip(header, fields))
                    reason = malformed(row)
                    if reason is None:
                        rows.append((start + 1, row))
                        continue
        problems.append(f"{where}: {reason}; row skipped")
        if i - start > 1:  # a rejected multi-line record: resynchronise at its next physical line
            i = start + 1
    return header, rows, problems


# ---------------------------------------------------------------------------------------------------------
# Reading a study: its record files


def read_record_file(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(record, None) or (None, problem) for one ``records/*.json`` file; the problem is one line naming the file
    (for a record of an older layout, also the migration command)."""
    try:
        rec = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"{path}: unreadable record ({type(e).__name__}: {e}); skipped"
    if not isinstance(rec, dict):
        return None, f"{path}: not a JSON object; skipped"
    old = outdated(rec)
    if old is not None:
        return None, f"{path}: {old}; {migration_hint(path.parent.parent)}; record skipped"
    reason = malformed(rec)
    if reason is not None:
        return None, f"{path}: {reason}; record skipped"
    rec["record_id"] = path.stem
    return rec, None


def record_names(study_dir: str | Path) -> list[str]:
    """The record files of a study, in record order (their names)."""
    d = Path(study_dir) / RECORDS_DIR
    if not d.is_dir():
        return []
    return sorted(p.name for p in os.scandir(d) if p.name.endswith(".json") and not p.name.startswith("."))


def _unmigrated(table: Path, rows: list[tuple[int, dict[str, str]]]) -> tuple[list[int], str | None]:
    """The lines of a study's table that carry no ``record_id`` (rows of a table written before ``records/``
    existed), and the one-line problem that reports them (None when there are none)."""
    lines = [line for line, row in rows if not row.get("record_id")]
    if not lines:
        return [], None
    where = f"line {lines[0]}" if len(lines) == 1 else f"lines {lines[0]}-{lines[-1]}"
    return lines, (
        f"{table}: {len(lines)} row(s) without a record_id ({where}), a table from before records/ existed; "
        f"{migration_hint(table.parent)}; rows not read, table left unchanged"
    )


def _read_study(study_dir: Path) -> tuple[list[dict[str, Any]], list[str], bool]:
    """read_study's records and problems, and whether the table holds rows of an older layout."""
    problems: list[str] = []
    keyed: list[tuple[str, dict[str, Any]]] = []
    for name in record_names(study_dir):
        rec, problem = read_record_file(study_dir / RECORDS_DIR / name)
        if problem:
            problems.append(problem)
        elif rec is not None:
            keyed.append((rec["record_id"], rec))
    table = study_dir / RESULTS_TABLE
    _, rows, table_problems = read_table(table)
    problems += table_problems
    lines, legacy = _unmigrated(table, rows)
    if legacy:
        problems.append(legacy)
    return [r for _, r in keyed], problems, bool(lines)


def read_study(study_dir: str | Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Every valid record of a study (its ``records/`` files) in record order, and the problems met on the way,
    one line each: unreadable, malformed or outdated record files, unreadable table rows, and table rows of an
    older layout (no ``record_id``), which are not read."""
    recs, problems, _ = _read_study(Path(study_dir))
    return recs, problems


# ---------------------------------------------------------------------------------------------------------
# Writing: one record file per record, the table re-derived from them


class LedgerWarning(UserWarning):
    """A record or table row that could not be read (skipped); the message names the file and line."""


def make_record(**fields: Any) -> dict[str, Any]:
    """A record (results.record.RunRecord) as a dict with exactly COLUMNS, missing ones empty.

    Unknown keys are a programming error (KeyError); a status or study_kind outside the schema's values is a
    ValueError."""
    unknown = set(fields) - set(COLUMNS)
    if unknown:
        raise KeyError(f"not result-record columns: {sorted(unknown)} (see docs/results_schema.md)")
    return RunRecord(**fields).to_dict()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return repr(value)  # shortest round-tripping form
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _row_line(header: list[str], record: Mapping[str, Any]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([_cell(record.get(c)) for c in header])
    return buf.getvalue()


def _warn(problems: list[str]) -> None:
    for p in problems:
        warnings.warn(p, LedgerWarning, stacklevel=3)


def add_record(study_dir: str | Path, record: Mapping[str, Any]) -> str:
    """Publish one record of the study (``records/<record_id>.json``), then rebuild ``results.csv``; returns the
    record_id. Safe with any number of concurrent writers, local or on NFS: every record has its own file."""
    study_dir = Path(study_dir)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    rid = record_key(stamp, str(record.get("run_id", "")), writer_id())
    rec = {**record, "record_id": rid}
    write_json(study_dir / RECORDS_DIR / f"{rid}.json", rec)
    rebuild_table(study_dir)
    return rid


def read_records(study_dir: str | Path) -> list[dict[str, Any]]:
    """Every valid record of a study in record order (bad ones are warned about, with file and line, and skipped)."""
    recs, problems = read_study(study_dir)
    _warn(problems)
    return recs


def rebuild_table(study_dir: str | Path) -> Path:
    """Write ``results.csv`` from the study's records (atomically) and return its path.

    Rows that cannot be read are reported and their raw lines kept in ``results.csv.rejected``. A table that
    still holds rows of an older layout (no record_id) is not rewritten: it is reported,
    with the migration command, and left for the migration to import (the records/ files stay the truth, so no
    run is hidden meanwhile). With concurrent writers the last rename wins, so the table is re-derived until the
    listing it was made from is still current. An exclusive lock on ``results.csv.lock`` only saves concurrent
    writers duplicate work: where the file system has no working ``flock`` the rebuild runs unlocked, which is
    still correct.
    """
    study_dir = Path(study_dir)
    table = study_dir / RESULTS_TABLE
    with exclusive_lock(table.with_name(table.name + ".lock")):
        for _ in range(5):
            recs, problems, unmigrated = _read_study(study_dir)
            if unmigrated:  # the migration imports these rows from the table: keep it as it is
                _warn(problems)
                break
            _keep_rejected(table, problems)
            _warn(problems)
            names = record_names(study_dir)
            header = list(COLUMNS) + sorted({k for r in recs for k in r} - set(COLUMNS))
            atomic_write_text(
                table, _row_line(header, dict(zip(header, header))) + "".join(_row_line(header, r) for r in recs)
            )
            if record_names(study_dir) == names:
                break
    return table


def _keep_rejected(table: Path, problems: list[str]) -> None:
    """Append the raw lines of rejected table rows to results.csv.rejected before the table is rewritten."""
    prefix = f"{table}:"
    lines = sorted(
        {
            int(p[len(prefix) :].split(":", 1)[0])
            for p in problems
            if p.startswith(prefix) and p[len(prefix) :].split(":", 1)[0].isdigit()
        }
    )
    if not lines:
        return
    raw = table.read_bytes().split(b"\n")
    with open(table.with_name(table.name + ".rejected"), "ab") as f:
        for n in lines:
            if n - 1 < len(raw):
                f.write(b"# %s:%d\n" % (table.name.encode(), n) + raw[n - 1] + b"\n")


def read_rows(table: str | Path) -> list[dict[str, str]]:
    """The readable rows of a results table as dicts of strings ([] when there is none)."""
    _, rows, problems = read_table(table)
    _warn(problems)
    return [r for _, r in rows]


FINISHED = (
    "completed",
    "diverged",
)  # a relaunch skips a run whose last record has one of these (docs/results_schema.md)


def find_completed(
    study_dir: str | Path, config_hash_: str, statuses: tuple[str, ...] = ("completed",)
) -> dict[str, Any] | None:
    """The last record with this config_hash if its status is one of ``statuses`` (FINISHED: completed or
    diverged, the skip rule), else None.

    The last record decides, as in the analysis (a run re-run with force=true that then failed is not
    "completed" any more, and is retried). Unreadable records are reported and skipped: they never stop a launch."""
    hits = [r for r in read_records(study_dir) if r.get("config_hash") == config_hash_]
    return hits[-1] if hits and hits[-1].get("status") in statuses else None


def main(argv: list[str] | None = None, prog: str = "python -m experiments.records") -> int:
    """The ledger's command line, ``python -m experiments.records rebuild <study_dir>`` (experiments/records.py):
    re-derive results.csv from the study's records."""
    ap = argparse.ArgumentParser(
        prog=prog, description=f"``{prog} rebuild <study_dir>``: re-derive results.csv from the study's records."
    )
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("rebuild", help="rewrite <study_dir>/results.csv from <study_dir>/records/")
    r.add_argument("study_dir", type=Path)
    args = ap.parse_args(argv)
    if not args.study_dir.is_dir():
        print(f"error: {args.study_dir} is not a directory", file=sys.stderr)
        return 2
    warnings.showwarning = lambda message, *_a, **_k: print(f"warning: {message}", file=sys.stderr)
    table = rebuild_table(args.study_dir)
    print(f"{table}: {len(read_rows(table))} records")
    return 0
