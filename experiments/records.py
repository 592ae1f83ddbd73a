"""Result records (docs/results_schema.md): the study's ledger, the run's identity (config hash) and provenance.

Pure stdlib (plus analysis.ledger and analysis.schema, themselves stdlib): importing this costs nothing (no torch,
no Lightning), so sweep tooling can use it too. The record's fields and types: analysis.schema.RunRecord.

The ledger (analysis.ledger has the format): each record is one immutable file ``<study>/records/<record_id>.json``,
written under a unique name and published by an atomic rename, and ``<study>/results.csv`` is rebuilt from those
files after each one (also atomically). Nothing is ever appended to a shared file, so a torn, garbled or
concurrent write (two processes, two nodes on a network file system) cannot hide, merge or corrupt another run's
record: the worst a crash leaves is a table that lags its records until the next rebuild
(``python -m experiments.records rebuild <study_dir>``).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import io
import json
import math
import os
import socket
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from analysis import ledger
from analysis.ledger import RECORDS_DIR, RESULTS_TABLE
from analysis.schema import COLUMNS, STATUSES, RunRecord  # noqa: F401 - re-exported

RESULTS_JSON = "results.json"


class LedgerWarning(UserWarning):
    """A record or table row that could not be read (skipped); the message names the file and line."""


def utc_now() -> str:
    """ISO-8601 UTC timestamp with seconds, e.g. 2026-11-29T15:40:00+00:00."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------------------------
# Identity and provenance


def config_hash(resolved: Mapping[str, Any]) -> str:
    """sha256 (first 16 hex) of a resolved, plain config (the caller drops the keys that don't change results).

    Canonical JSON: sorted keys, no whitespace, so the hash does not depend on key order or YAML formatting.
    """
    blob = json.dumps(resolved, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def git_commit(cwd: str | Path | None = None) -> str:
    """`git rev-parse HEAD` (+ "+dirty" when tracked files changed); "" outside a repository or without git."""
    cwd = Path(cwd) if cwd is not None else Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return ""
        commit = head.stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return commit + ("+dirty" if status.returncode == 0 and status.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return ""


# ---------------------------------------------------------------------------------------------------------
# Records


def make_record(**fields: Any) -> dict[str, Any]:
    """A record (analysis.schema.RunRecord) as a dict with exactly COLUMNS, missing ones empty.

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


def write_json(path: str | Path, record: Mapping[str, Any]) -> None:
    """Atomically write a record as JSON (NaN/inf become null)."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
    atomic_write_text(path, json.dumps(clean, indent=2) + "\n")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a file so that readers see either the old or the whole new content, never a part: a temporary file
    with a name no other writer uses (host, pid, nonce), fsync, rename over the target, fsync the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{_writer_id()}")
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # the rename itself durable (not every file system allows this)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def locked(table: str | Path) -> Iterator[None]:
    """Exclusive advisory lock on ``<table>.lock`` while the table is rebuilt: it only saves concurrent writers
    duplicate work. Where the file system has no working ``flock`` (some network file systems) the block runs
    unlocked, which is still correct (see rebuild_table)."""
    # Imported here: filelock loads only when a table is rebuilt, so importing records stays free.
    from .locks import exclusive_lock

    table = Path(table)
    with exclusive_lock(table.with_name(table.name + ".lock")):
        yield


def _row_line(header: list[str], record: Mapping[str, Any]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([_cell(record.get(c)) for c in header])
    return buf.getvalue()


def _writer_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _warn(problems: list[str]) -> None:
    for p in problems:
        warnings.warn(p, LedgerWarning, stacklevel=3)


def add_record(study_dir: str | Path, record: Mapping[str, Any]) -> str:
    """Publish one record of the study (``records/<record_id>.json``), then rebuild ``results.csv``; returns the
    record_id. Safe with any number of concurrent writers, local or on NFS: every record has its own file."""
    study_dir = Path(study_dir)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    rid = ledger.record_key(stamp, str(record.get("run_id", "")), _writer_id())
    rec = {**record, "record_id": rid}
    write_json(study_dir / RECORDS_DIR / f"{rid}.json", rec)
    rebuild_table(study_dir)
    return rid


def read_records(study_dir: str | Path) -> list[dict[str, Any]]:
    """Every valid record of a study in record order (bad ones are warned about, with file and line, and skipped)."""
    recs, problems = ledger.read_study(study_dir)
    _warn(problems)
    return recs


def rebuild_table(study_dir: str | Path) -> Path:
    """Write ``results.csv`` from the study's records (atomically) and return its path.

    Table rows that predate ``records/`` (no record_id) are first imported as record files; rows that cannot be
    read are reported and their raw lines kept in ``results.csv.rejected``. With concurrent writers the last
    rename wins, so the table is re-derived until the listing it was made from is still current.
    """
    study_dir = Path(study_dir)
    table = study_dir / RESULTS_TABLE
    with locked(table):
        for _ in range(5):
            recs, problems = ledger.read_study(study_dir)
            _keep_rejected(table, problems)
            _warn(problems)
            for rec in recs:  # import legacy rows: afterwards records/ alone holds every record
                path = study_dir / RECORDS_DIR / f"{rec['record_id']}.json"
                if not path.is_file():
                    write_json(path, rec)
            names = ledger.record_names(study_dir)
            header = list(COLUMNS) + sorted({k for r in recs for k in r} - set(COLUMNS))
            atomic_write_text(
                table, _row_line(header, dict(zip(header, header))) + "".join(_row_line(header, r) for r in recs)
            )
            if ledger.record_names(study_dir) == names:
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
    _, rows, problems = ledger.read_table(table)
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


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.records rebuild <study_dir>``: re-derive results.csv from the study's records."""
    ap = argparse.ArgumentParser(prog="python -m experiments.records", description=main.__doc__)
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


if __name__ == "__main__":
    raise SystemExit(main())
