#!/usr/bin/env bash
# Line counts of the project's Python files, for the before/after of a refactor:
#   bash scripts/line_counts.sh [N]   the N largest files (default 25), then the lines and files per folder
# Files: what git tracks plus new files it does not ignore.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-25}"
counts=$(git ls-files -z --cached --others --exclude-standard -- '*.py' | while IFS= read -r -d '' f; do
    [[ -f "$f" ]] && printf '%d %s\n' "$(wc -l < "$f")" "$f"
done | sort -k1,1nr -k2)
echo "$counts" | head -n "$n" | awk '{printf "%7d  %s\n", $1, $2}'
echo
echo "$counts" | awk '{split($2, p, "/"); d = (2 in p) ? p[1] "/" : "."; lines[d] += $1; files[d]++}
    END {for (d in lines) printf "%7d  %3d files  %s\n", lines[d], files[d], d}' | sort -k1,1nr
echo "$counts" | awk '{t += $1; n++} END {printf "%7d  %3d files  total\n", t, n}'
