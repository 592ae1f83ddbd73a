"""Result records (docs/results_schema.md): one row per run in a study's shared ``results.csv``, the same
record as ``<run_dir>/results.json``, plus the run's identity (config hash) and provenance (git commit).

Pure stdlib: importing this costs nothing (no torch, no Lightning), so sweep tooling can use it too.

Concurrency: every read-check-append of ``results.csv`` happens under an exclusive ``fcntl.flock`` on
``results.csv.lock``, and a row is written with one ``write`` of one line, so two processes appending at once
never interleave or lose a row.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import math
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping

# Exactly the columns of docs/results_schema.md §1, in that order.
COLUMNS: tuple[str, ...] = (
    "run_id", "study", "variant", "residual", "size", "seed", "status", "n_layers", "d_model", "n_heads", "d_ff",
    "block_size", "n_blocks", "seq_len", "batch_size", "params", "params_non_embedding", "tokens",
    "flops_per_token", "flops", "pflops_days", "flops_6nd", "pflops_days_6nd", "val_loss", "train_loss", "steps",
    "lr", "wall_time_s", "git_commit", "config_hash", "run_dir", "error", "started_at", "finished_at",
    "flops_budget", "d_over_lb", "heads_over_lb", "lr_protocol", "health",
)  # fmt: skip
STATUSES = ("completed", "failed", "diverged")
RESULTS_TABLE = "results.csv"
RESULTS_JSON = "results.json"


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
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, timeout=10)
        return commit + ("+dirty" if status.returncode == 0 and status.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return ""


# ---------------------------------------------------------------------------------------------------------
# Records


def make_record(**fields: Any) -> dict[str, Any]:
    """A record with exactly COLUMNS (missing ones empty); unknown keys are a programming error."""
    unknown = set(fields) - set(COLUMNS)
    if unknown:
        raise KeyError(f"not result-record columns: {sorted(unknown)} (see docs/results_schema.md)")
    if fields.get("status", "completed") not in STATUSES:
        raise ValueError(f"status={fields.get('status')!r}; allowed values: {', '.join(STATUSES)}")
    return {c: fields.get(c) for c in COLUMNS}


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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def locked(table: str | Path) -> Iterator[None]:
    """Exclusive advisory lock on ``<table>.lock`` (released when the block ends or the process dies)."""
    import fcntl  # POSIX only; imported here so the module still imports elsewhere

    table = Path(table)
    table.parent.mkdir(parents=True, exist_ok=True)
    with open(table.with_name(table.name + ".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_header(table: Path) -> list[str] | None:
    if not table.is_file() or table.stat().st_size == 0:
        return None
    with open(table, newline="", encoding="utf-8") as f:
        return next(csv.reader(f), None)


def _row_line(header: list[str], record: Mapping[str, Any]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([_cell(record.get(c)) for c in header])
    return buf.getvalue()


def append_row(table: str | Path, record: Mapping[str, Any]) -> None:
    """Append one record to a results table, atomically with respect to other appenders.

    A new table gets the header COLUMNS. An existing table keeps its column order; if the record has columns
    the table lacks (the schema only ever adds columns), the table is rewritten with them appended.
    """
    table = Path(table)
    with locked(table):
        header = _read_header(table)
        if header is None:
            header = list(COLUMNS) + [k for k in record if k not in COLUMNS]
            atomic_write_text(table, _row_line(header, dict(zip(header, header))))
        missing = [k for k in record if k not in header]
        if missing:  # widen the table: rewrite every row under the new header, then append
            rows = read_rows(table, lock=False)
            header = header + missing
            atomic_write_text(table, "".join([_row_line(header, dict(zip(header, header)))]
                                             + [_row_line(header, r) for r in rows]))
        with open(table, "a", encoding="utf-8", newline="") as f:
            f.write(_row_line(header, record))  # one write of one line
            f.flush()
            os.fsync(f.fileno())


def read_rows(table: str | Path, lock: bool = True) -> list[dict[str, str]]:
    """All rows of a results table as dicts of strings ([] when the table does not exist)."""
    table = Path(table)
    if not table.is_file():
        return []

    def _read() -> list[dict[str, str]]:
        with open(table, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))

    if not lock:
        return _read()
    with locked(table):
        return _read()


def find_completed(table: str | Path, config_hash_: str) -> dict[str, str] | None:
    """The last row with this config_hash if it is `completed`, else None.

    The last record decides, as in the analysis (a run re-run with force=true that then failed is not
    "completed" any more, and is retried)."""
    hits = [r for r in read_rows(table) if r.get("config_hash") == config_hash_]
    return hits[-1] if hits and hits[-1].get("status") == "completed" else None
