"""Cost of each multi-budget launch of the deep_budgets study against independent runs of its three budgets.

    python docs/results/cpu_deep_budgets/cost.py docs/results/cpu_deep_budgets/records

From the records' CPU seconds. A branch record's cpu_time_s counts the trunk's CPU up to its branch point
(docs/runs.md, "Several budgets from one run"): it is what an independent run of that budget costs. The launch pays
the trunk (the largest budget's record) plus each branch's own part: its cpu_time_s minus the trunk's share, taken as
the branch point's steps x the trunk's steady-state step time (step_cpu_s). A frozen note of this study, not a tool.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

DECAY_FRACTION = 0.2  # conf/scheduler/wsd.yaml


def main(records: Path) -> None:
    trunks: dict[str, dict[int, dict]] = defaultdict(dict)
    for path in sorted(records.glob("*.json")):
        r = json.loads(path.read_text())
        if r["status"] == "completed" and r.get("trunk_id"):
            trunks[r["trunk_id"]][int(r["budget"])] = r
    ratios: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
    for budgets in trunks.values():
        if len(budgets) < 3:
            continue
        top = budgets[max(budgets)]
        launch = top["cpu_time_s"]
        for b, r in budgets.items():
            if b != max(budgets):
                branch_point = r["steps"] - round(DECAY_FRACTION * r["steps"])
                launch += r["cpu_time_s"] - branch_point * top["step_cpu_s"]
        independent = sum(r["cpu_time_s"] for r in budgets.values())
        ratios[(top["variant"], top["size"])].append((launch / independent, launch, independent))
    every = []
    for (variant, size), rows in sorted(ratios.items()):
        r = [x[0] for x in rows]
        every += r
        print(
            f"{variant} {size}: launch / independent CPU {statistics.median(r):.3f} (range {min(r):.3f}-{max(r):.3f},"
            f" {len(r)} launches; median launch {statistics.median(x[1] for x in rows):.0f} s, independent "
            f"{statistics.median(x[2] for x in rows):.0f} s)"
        )
    if every:
        print(f"all: median {statistics.median(every):.3f} over {len(every)} launches")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
