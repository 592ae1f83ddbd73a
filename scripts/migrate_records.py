"""Bring the result records under the given directories to the current schema, once: every record file
(``records/*.json``) and run ``results.json`` without the fields ``budget`` and ``trunk_id`` gets them empty: every
run before these fields was a single-budget run, neither a multi-budget launch's trunk nor one of its decay
branches (experiments/budgets.py). A record from before the previous migration (commit 2f60ec856823) also gets that
one's fields, ``optimizer`` = ``adamw``, ``lr_schedule`` = ``cosine`` and an empty ``step_cpu_s`` (every run before
them trained with AdamW and the cosine schedule), so one command brings any record with a ``study_kind`` up to date.
Each study's results.csv is then re-derived from its records. A record that already has the fields is left byte for
byte as it is; no other field changes (``config_hash`` included).

    python scripts/migrate_records.py docs/results/cpu_deep ...   # or, after this script was deleted:
    git show <commit>:scripts/migrate_records.py | python - <dir> [<dir> ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from results import ledger
from results.io import write_json

NEW_FIELDS = {"optimizer": "adamw", "lr_schedule": "cosine", "step_cpu_s": None, "budget": None, "trunk_id": None}


def migrate_file(path: Path) -> bool:
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        print(f"{path}: unreadable ({type(e).__name__}: {e}); left as it is", file=sys.stderr)
        return False
    if not isinstance(rec, dict) or all(k in rec for k in NEW_FIELDS):
        return False
    for key, value in NEW_FIELDS.items():
        rec.setdefault(key, value)
    write_json(path, rec)
    return True


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for arg in argv:
        root = Path(arg)
        if not root.is_dir():
            print(f"error: {root} is not a directory", file=sys.stderr)
            return 2
        changed = 0
        studies = sorted({p.parent for p in root.rglob(ledger.RECORDS_DIR) if p.is_dir()})
        for study in studies:
            changed += sum(migrate_file(study / ledger.RECORDS_DIR / n) for n in ledger.record_names(study))
            if (study / ledger.RESULTS_TABLE).is_file():
                ledger.rebuild_table(study)
        changed += sum(migrate_file(p) for p in sorted(root.rglob(ledger.RESULTS_JSON)))
        print(f"{root}: {len(studies)} study director(y/ies), {changed} record(s) migrated")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
