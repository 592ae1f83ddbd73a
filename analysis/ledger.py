"""The ledger of a study: how result records are stored, read and checked (docs/results_schema.md §1).

Pure standard library (no pandas, no torch): the writer (experiments.records) and the reader (analysis.records)
share this module, so both agree on where records live, how a table is read and which record of a run is its
last. What a record holds and when it is malformed: analysis.schema.

Storage (one study = one directory ``<runs_root>/<study>/``):
  * ``records/<record_id>.json`` — the truth: one immutable file per record, written once by an atomic rename
    and never modified. ``record_id`` = ``<UTC timestamp>_<run_id>_<writer>``, so file-name order is the order
    the records were written, and two writers (processes, nodes) never write the same file.
  * ``results.csv`` — a table derived from ``records/``: rebuilt (atomically, by rename) after every record, and
    by ``python -m experiments.records rebuild <study_dir>``. Rows without a ``record_id`` predate ``records/``
    (or were appended by an older attnres); they are read as records too, and imported into ``records/`` by the
    next rebuild.

Reading never stops at a bad byte or a bad row: each one is reported with its file (and line) and skipped.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .schema import malformed

RESULTS_TABLE = "results.csv"
RECORDS_DIR = "records"
_ID_SAFE = re.compile(r"[^A-Za-z0-9._+=-]")


# ---------------------------------------------------------------------------------------------------------
# Identity helpers


def data_fingerprint(checksum: Mapping[str, Any] | None) -> str:
    """16 hex digits identifying a prepared dataset by its shard checksums (header.json ``checksum``: sha256 of
    train.bin, val.bin and, for BPE, tokenizer.json). Two runs with different fingerprints saw different data."""
    if not checksum:
        return ""
    parts = {k: str(v) for k, v in checksum.items() if k != "algorithm"}
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


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
    (:func:`analysis.schema.malformed`) is skipped, and a problem naming ``<file>:<line>`` says why. When a
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
# Reading a study: record files + table rows that predate records/


def read_record_file(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(record, None) or (None, problem) for one ``records/*.json`` file."""
    try:
        rec = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"{path}: unreadable record ({type(e).__name__}: {e}); skipped"
    if not isinstance(rec, dict):
        return None, f"{path}: not a JSON object; skipped"
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


def legacy_key(row: Mapping[str, Any], line: int) -> str:
    """The record_id a table row without one gets (deterministic: importing it twice writes one file)."""
    ts = compact_timestamp(row.get("finished_at") or row.get("started_at"))
    return record_key(ts, str(row.get("run_id", "")), f"import-L{line:07d}")


def read_study(study_dir: str | Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Every valid record of a study in record order, and the problems met on the way.

    The records are the files in ``records/`` plus the table rows that carry no ``record_id`` (written before
    ``records/`` existed, or by an older attnres). A table row whose ``record_id`` has no file is not read (its
    record was deleted on purpose)."""
    study_dir = Path(study_dir)
    problems: list[str] = []
    keyed: list[tuple[str, dict[str, Any]]] = []
    names = record_names(study_dir)
    for name in names:
        rec, problem = read_record_file(study_dir / RECORDS_DIR / name)
        if problem:
            problems.append(problem)
        elif rec is not None:
            keyed.append((rec["record_id"], rec))
    _, rows, table_problems = read_table(study_dir / RESULTS_TABLE)
    problems += table_problems
    known = {n[: -len(".json")] for n in names}
    for line, row in rows:
        rid = row.get("record_id") or ""
        if rid:
            continue  # in records/ (or deleted from it)
        key = legacy_key(row, line)
        if key not in known:
            keyed.append((key, {**row, "record_id": key}))
    keyed.sort(key=lambda kr: kr[0])
    return [r for _, r in keyed], problems


def last_records(records: Iterable[Mapping[str, Any]], key: str = "run_id") -> dict[str, Mapping[str, Any]]:
    """The last valid record per ``key`` (records in record order): the record that decides a run's state."""
    out: dict[str, Mapping[str, Any]] = {}
    for rec in records:
        out[str(rec.get(key, ""))] = rec
    return out
