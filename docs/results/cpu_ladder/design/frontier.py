r"""Precision against minutes for the CPU ladder: the study's analysis on subsets of its seeds.

    PYTHONPATH=. python docs/results/cpu_ladder/design/frontier.py \
        runs/cpu_ladder/results.csv [runs_heldout/cpu_ladder/results.csv]

For every seed subset of size k (k = 2 .. all seeds of the tables given, pooled), the fit is run as the study runs
it, and the table prints, per k: the study's minutes (k / 3 x the measured 3-seed wall time), the largest baseline
seed sd, the baseline law's rmse(log L) over size means, and each arm's joint-fit and paired multiplier with the
95% half-width / m, averaged over up to 5 subsets of that size (B = 1000 bootstrap replicates each). Needs no torch.
"""

from __future__ import annotations

import itertools
import sys
import warnings

import pandas as pd

from analysis.io.runs import load_results, scaling_runs
from analysis.laws.fit_options import FitOptions
from analysis.studies.scaling import analyse_scaling

MINUTES_3_SEEDS = 29.2  # measured: `python -m sweeps.study` in a fresh clone, data preparation and analysis included


def main(paths: list[str]) -> None:
    df = pd.concat(
        [scaling_runs(load_results(p)[lambda d: d["status"] == "completed"], "cpu_ladder") for p in paths],
        ignore_index=True,
    )
    df = df[df["lr_protocol"].fillna("baseline") == "baseline"] if "lr_protocol" in df.columns else df
    seeds = sorted(df["seed"].unique())
    rows = []
    for k in range(2, len(seeds) + 1):
        subsets = list(itertools.combinations(seeds, k))
        if len(subsets) > 5:
            subsets = subsets[:: len(subsets) // 5][:5]  # at most 5 subsets per k
        for sub in subsets:
            d = df[df["seed"].isin(sub)].reset_index(drop=True)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                doc = analyse_scaling(d, FitOptions(B=1000)).parts
            pr = doc["precision"]
            row = {
                "k": k,
                "seeds": ",".join(map(str, sub)),
                "minutes": MINUTES_3_SEEDS * k / 3,
                "max_base_sd": max(v for v in pr["baseline_seed_sd"].values() if v is not None),
                "rmse_means": pr["baseline_rmse_log_means"],
                "decreasing": pr["baseline_decreasing"],
            }
            for v, m in doc["multipliers"].items():
                row[f"{v}_m"] = m["m"]
                row[f"{v}_hw"] = pr["m_half_width_over_m"][v]
                row[f"{v}_paired_m"] = m["paired"]["m"]
                row[f"{v}_paired_hw"] = pr["paired_m_half_width_over_m"][v]
            rows.append(row)
    t = pd.DataFrame(rows)
    pd.set_option("display.width", 200)
    print(t.round(4).to_string(index=False))
    num = t.drop(columns=["seeds"]).groupby("k")
    print("\nmeans over subsets:")
    print(num.mean(numeric_only=True).round(4).to_string())


if __name__ == "__main__":
    main(sys.argv[1:] or ["runs/cpu_ladder/results.csv"])
