#!/usr/bin/env bash
# Lint, format check and type check: what .ci/run runs before the tests (README and docs/DEVELOPING.md name it).
#   bash scripts/check.sh         check only; runs all three and fails if any fails
#   bash scripts/check.sh --fix   first apply ruff's safe fixes and the formatter, then check
# Settings: [tool.ruff] and [tool.mypy] in pyproject.toml (the type-checked paths are [tool.mypy] files).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--fix" ]]; then
    python -m ruff check --fix --quiet . || true  # what remains is reported by the check below
    python -m ruff format --quiet .
elif [[ $# -gt 0 ]]; then
    echo "usage: bash scripts/check.sh [--fix]" >&2
    exit 2
fi
failed=()
python -m ruff check . || failed+=("ruff check")
python -m ruff format --check . || failed+=("ruff format --check")
python -m mypy || failed+=("mypy")
if [[ ${#failed[@]} -gt 0 ]]; then
    printf -v names '%s; ' "${failed[@]}"
    echo "scripts/check.sh: failed: ${names%; }" >&2
    exit 1
fi
