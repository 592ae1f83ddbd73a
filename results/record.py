"""The run record (docs/results_schema.md §1): :class:`RunRecord`, one row of a study's ledger, whose fields are
the ledger's columns in order, with their types; the statuses and study kinds a record may hold; and
:func:`malformed`, which says when a stored record breaks the schema.

Standard library only: the writer (experiments), the readers (analysis, sweeps.study) and the ledger
(results.ledger) import the one definition.

* :data:`STUDY_KINDS` and :func:`study_kind` — what kind of study a record belongs to (a scaling ladder, an LR
  grid, a block-size sweep, ablations, an architecture grid, a depth-width map); the analysis chooses what to fit
  by it.
* :func:`outdated` — when a stored record has an older layout (a field of :data:`COLUMNS` missing, no study kind):
  it is not read, and the message names the migration command (:func:`migration_hint`).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# ---------------------------------------------------------------------------------------------------------
# Study kinds

STUDY_KINDS = ("scaling", "lr", "block_size", "ablations", "arch_grid", "map")


def study_kind(record: Mapping[str, Any]) -> str:
    """The record's study kind, its ``study_kind`` field; a ValueError when it has none (a record of an older
    layout: the ledger does not read those, :func:`outdated`)."""
    kind = record.get("study_kind")
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"record {record.get('run_id')!r} has no study_kind ({migration_hint('<study_dir>')})")
    return kind


# ---------------------------------------------------------------------------------------------------------
# The run record

STATUSES = ("completed", "failed", "diverged", "interrupted")


@dataclass
class RunRecord:
    """One record of a study's ledger (docs/results_schema.md §1 has each field's meaning).

    A stored record holds every field (:data:`COLUMNS`; :func:`outdated` says when one is missing). Any may be
    empty (None) except ``run_id`` and ``status`` (:data:`REQUIRED`) and ``study_kind`` (``scaling`` unless given);
    a ``completed`` record also needs a positive ``val_loss`` and ``pflops_days`` (:data:`REQUIRED_IF_COMPLETED`).
    A field added to the schema is added to every committed record by a migration (docs/DEVELOPING.md, "Changing
    the record schema")."""

    run_id: str | None = None
    study: str | None = None
    variant: str | None = None
    residual: str | None = None
    size: str | None = None
    seed: int | None = None
    status: str | None = None
    n_layers: int | None = None
    d_model: int | None = None
    n_heads: int | None = None
    d_ff: int | None = None
    block_size: int | None = None
    n_blocks: int | None = None
    seq_len: int | None = None
    batch_size: int | None = None
    params: int | None = None
    params_non_embedding: int | None = None
    tokens: int | None = None
    flops_per_token: float | None = None
    flops: float | None = None
    pflops_days: float | None = None
    flops_6nd: float | None = None
    pflops_days_6nd: float | None = None
    val_loss: float | None = None
    train_loss: float | None = None
    steps: int | None = None
    lr: float | None = None
    wall_time_s: float | None = None
    git_commit: str | None = None
    config_hash: str | None = None
    run_dir: str | None = None
    error: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    flops_budget: float | None = None
    d_over_lb: float | None = None
    heads_over_lb: float | None = None
    lr_protocol: str | None = None
    health: str | None = None
    dataset: str | None = None
    data_fingerprint: str | None = None
    threads: int | None = None
    record_id: str | None = None
    study_kind: str = "scaling"  # as conf/train.yaml's study_kind (the sweeps set theirs)
    train_path: str | None = None
    cpu_time_s: float | None = None
    optimizer: str | None = None
    lr_schedule: str | None = None
    step_cpu_s: float | None = None
    budget: float | None = None
    trunk_id: str | None = None

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise ValueError(f"status={self.status!r}; allowed values: {', '.join(STATUSES)}")
        if self.study_kind not in STUDY_KINDS:
            raise ValueError(f"study_kind={self.study_kind!r}; allowed values: {', '.join(STUDY_KINDS)}")

    def to_dict(self) -> dict[str, Any]:
        """The record as a dict with exactly COLUMNS, in order."""
        return {c: getattr(self, c) for c in COLUMNS}


def _base_type(hint: Any) -> type:
    """``int`` for ``int | None`` (the one non-None member of a field's type)."""
    (t,) = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return t


COLUMN_TYPES: dict[str, type] = {f: _base_type(t) for f, t in typing.get_type_hints(RunRecord).items()}
COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RunRecord))
# Cells that must parse as numbers when they are not empty (a torn or garbled number makes the record malformed).
NUMERIC_COLUMNS: tuple[str, ...] = tuple(c for c in COLUMNS if COLUMN_TYPES[c] in (int, float))
STR_COLUMNS: tuple[str, ...] = tuple(c for c in COLUMNS if COLUMN_TYPES[c] is str)
REQUIRED = ("run_id", "status")
REQUIRED_IF_COMPLETED = ("val_loss", "pflops_days")


def _number(value: Any) -> float | None:
    """The value as a float, None when empty; raises ValueError when it is not a number."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError(repr(value))
    v = float(value)
    return None if math.isnan(v) else v  # NaN: how a DataFrame holds an empty cell


def malformed(record: Mapping[str, Any]) -> str | None:
    """Why a stored record breaks the schema (None when it does not): no run_id, an unknown status or study_kind, a
    cell that should be a number and is not, a seed that is not an integer, or a ``completed`` record without a
    positive val_loss and compute (the schema leaves those empty only for runs that did not complete)."""
    if not str(record.get("run_id") or "").strip():
        return "no run_id"
    status = record.get("status")
    if status not in STATUSES:
        return f"status={status!r} is not one of {', '.join(STATUSES)}"
    kind = record.get("study_kind")
    if isinstance(kind, str) and kind and kind not in STUDY_KINDS:
        return f"study_kind={kind!r} is not one of {', '.join(STUDY_KINDS)}"
    for col in NUMERIC_COLUMNS:
        try:
            v = _number(record.get(col))
        except (TypeError, ValueError):
            return f"{col}={record.get(col)!r} is not a number"
        if col == "seed" and v is not None and v != int(v):
            return f"seed={record.get(col)!r} is not an integer"
    if status == "completed":
        for col in REQUIRED_IF_COMPLETED:
            if col in record:  # a table without the column is another error (analysis.io.runs.require_columns)
                v = _number(record.get(col))
                if v is None or not math.isfinite(v) or v <= 0:
                    return f"status='completed' but {col}={record.get(col)!r} (must be a positive number)"
    return None


# The commit whose scripts/migrate_records.py brings records of an older layout to the current schema (the script
# was run on the committed records there, then deleted: docs/results_schema.md, "Records of an older layout").
MIGRATION_COMMIT = "b6f4940d6c36"  # budget, trunk_id (and 2f60ec856823's optimizer, lr_schedule, step_cpu_s)
EARLIER_MIGRATION_COMMIT = "4c12b9900a71"  # study_kind, data_fingerprint, records/ from results.csv rows


def migration_hint(study_dir: object) -> str:
    """The sentence that names the migration command for the records of ``study_dir``."""
    return (
        f"records from before commit {MIGRATION_COMMIT} are migrated by "
        f"`git show {MIGRATION_COMMIT}:scripts/migrate_records.py | python - {study_dir}` (records without a "
        f"study_kind first by the same command at commit {EARLIER_MIGRATION_COMMIT})"
    )


def outdated(record: Mapping[str, Any]) -> str | None:
    """Why a stored record has an older layout than the current schema (None when it has the current one): a field
    of :data:`COLUMNS` is missing, or ``study_kind`` is empty. Such a record is not read (results.ledger reports it
    on one line, with :func:`migration_hint`)."""
    missing = [c for c in COLUMNS if c not in record]
    if missing:
        return f"an older record layout without the field(s) {', '.join(missing)}"
    if not record.get("study_kind"):
        return "an older record layout without a study_kind"
    return None
