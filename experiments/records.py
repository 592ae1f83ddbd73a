"""``python -m experiments.records rebuild <study_dir>``: re-derive a study's results.csv from its records.

The command keeps the name the docs and error messages give; the ledger it drives (where records live, how they
are written and read) is results.ledger, which experiments/ writes through.
"""

from __future__ import annotations

from results.ledger import main

if __name__ == "__main__":
    raise SystemExit(main())
