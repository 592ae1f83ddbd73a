"""Bring the result records under the given directories to the current schema (results.record.COLUMNS), once.

    python scripts/migrate_records.py docs/results           # or, after this script was deleted:
    git show <commit>:scripts/migrate_records.py | python - <dir> [<dir> ...]

Every study directory below each argument (a directory holding ``records/`` or a ``results.csv``) is migrated:

* a ``records/*.json`` file, or a run's ``results.json``, that lacks fields of the current schema gets them, with
  the values the loader used to give them while they were missing: ``study_kind`` from the study's name (the rule
  the analysis applied before the field existed: ``block_size``, ``ablations`` and ``arch_grid`` were the only
  non-ladder studies, every other study a ``scaling`` ladder); ``data_fingerprint`` (and an empty ``dataset``)
  from the run directory's environment.json when it is at hand, else empty; every other missing field empty
  (None). The file keeps its name (its record_id) and every field it had, in the order results.ledger writes them.
* ``results.csv`` rows without a ``record_id`` (a table from before ``records/`` existed) become record files,
  named as the ledger used to name them when it imported such rows (``<finished_at or started_at>_<run_id>_
  import-L<line>``, so a second run writes nothing twice), and the table is re-derived from the records.

A record that is already current is left byte for byte as it is. Prints what it changed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from results import ledger
from results.config_hash import data_fingerprint
from results.io import write_json
from results.record import COLUMNS

KIND_OF_STUDY_BEFORE_THE_FIELD = {"block_size": "block_size", "ablations": "ablations", "arch_grid": "arch_grid"}


def _fingerprint(run_dir: Path | None) -> tuple[str, str] | None:
    """(data_fingerprint, dataset path) from a run directory's environment.json, None when there is none."""
    env = run_dir / "environment.json" if run_dir is not None else None
    if env is None or not env.is_file():
        return None
    try:
        data = json.loads(env.read_text(encoding="utf-8")).get("dataset") or {}
    except (OSError, ValueError, AttributeError):
        return None
    return data_fingerprint(data.get("checksum")), str(data.get("path", ""))


def _run_dir(rec: Mapping[str, Any], study_dir: Path) -> Path | None:
    raw = str(rec.get("run_dir") or "")
    for c in ([Path(raw), study_dir / raw] if raw else []) + [study_dir / str(rec.get("run_id") or "")]:
        if c.is_dir():
            return c
    return None


def migrated(rec: Mapping[str, Any], study_dir: Path) -> dict[str, Any]:
    """The record in the current schema: every column, the missing ones as the loader used to default them."""
    out: dict[str, Any] = {c: rec.get(c) for c in COLUMNS}
    if not out.get("study_kind"):
        out["study_kind"] = KIND_OF_STUDY_BEFORE_THE_FIELD.get(str(rec.get("study") or ""), "scaling")
    if not out.get("data_fingerprint"):
        found = _fingerprint(_run_dir(rec, study_dir))
        out["data_fingerprint"] = found[0] if found else ""
        if found and not out.get("dataset"):
            out["dataset"] = found[1]
    out.update({k: v for k, v in rec.items() if k not in COLUMNS})  # fields of a newer writer are kept
    return out


def _current(rec: Mapping[str, Any]) -> bool:
    return all(c in rec for c in COLUMNS) and bool(rec.get("study_kind"))


def migrate_file(path: Path, study_dir: Path) -> bool:
    """Rewrite one record file in the current schema when it is not; True when it was rewritten."""
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        print(f"{path}: unreadable ({type(e).__name__}: {e}); left as it is", file=sys.stderr)
        return False
    if not isinstance(rec, dict) or _current(rec):
        return False
    new = migrated(rec, study_dir)
    if path.parent.name == ledger.RECORDS_DIR:
        new["record_id"] = path.stem
    write_json(path, new)
    return True


def migrate_study(study_dir: Path) -> list[str]:
    """Migrate one study directory; the changes made, one line each."""
    changes = []
    for name in ledger.record_names(study_dir):
        path = study_dir / ledger.RECORDS_DIR / name
        if migrate_file(path, study_dir):
            changes.append(f"{path}: rewritten in the current schema")
    _, rows, problems = ledger.read_table(study_dir / ledger.RESULTS_TABLE)
    for p in problems:
        print(f"warning: {p}", file=sys.stderr)
    legacy = [(line, row) for line, row in rows if not row.get("record_id")]
    for line, row in legacy:
        stamp = ledger.compact_timestamp(row.get("finished_at") or row.get("started_at"))
        rid = ledger.record_key(stamp, str(row.get("run_id", "")), f"import-L{line:07d}")
        path = study_dir / ledger.RECORDS_DIR / f"{rid}.json"
        if not path.is_file():
            write_json(path, {**migrated(row, study_dir), "record_id": rid})
            changes.append(f"{study_dir / ledger.RESULTS_TABLE}:{line}: imported as {path}")
    if legacy:
        # the table's rows are all in records/ now: re-derive it (a copy of the old table is kept beside it)
        table = study_dir / ledger.RESULTS_TABLE
        table.with_name(table.name + ".premigration").write_bytes(table.read_bytes())
        table.unlink()
        ledger.rebuild_table(study_dir)
        changes.append(f"{table}: re-derived from records/ (the old table: {table.name}.premigration)")
    return changes


def run_dirs_results(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob(ledger.RESULTS_JSON) if p.is_file())


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    n_changes = 0
    for arg in argv:
        root = Path(arg)
        if not root.is_dir():
            print(f"error: {root} is not a directory", file=sys.stderr)
            return 2
        studies = sorted(
            {p.parent for p in root.rglob(ledger.RECORDS_DIR) if p.is_dir()}
            | {p.parent for p in root.rglob(ledger.RESULTS_TABLE) if p.is_file()}
        )
        for study in studies:
            for line in migrate_study(study):
                print(line)
                n_changes += 1
        for path in run_dirs_results(root):
            if migrate_file(path, path.parent.parent):
                print(f"{path}: rewritten in the current schema")
                n_changes += 1
        print(f"{root}: {len(studies)} study director(y/ies) checked, {n_changes} change(s) so far")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
