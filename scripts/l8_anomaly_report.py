"""Report of the L_b 8 anomaly runs (scripts/l8_anomaly.py; docs/results/cpu_deep_l8_anomaly/README.md).

``--collect RUNS_ROOT`` first copies every completed run's JSON record and its ``diagnostics.jsonl`` (depth weights
at each evaluation) from ``RUNS_ROOT/l8a_<arm>/`` into the results folder. Then, from the folder alone: the arms'
val losses per seed, each arm minus the baseline over same-seed pairs (mean, 95% t interval), the depth-weight
summary at the last evaluation, and a figure of the depth weights of the arms named by ``--figure-arms``.

    python scripts/l8_anomaly_report.py --collect /work/runs_anomaly --out docs/results/cpu_deep_l8_anomaly
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from analysis.laws.paired import t_interval


def collect(runs_root: Path, out: Path) -> int:
    """Copy completed records (``records/*.json``) and their runs' ``diagnostics.jsonl`` of every ``l8a_*`` study
    under ``runs_root`` into ``out/records`` and ``out/diagnostics`` (named ``<study>__<run_id>.jsonl``)."""
    (out / "records").mkdir(parents=True, exist_ok=True)
    (out / "diagnostics").mkdir(parents=True, exist_ok=True)
    n = 0
    for rec in sorted(runs_root.glob("l8a_*/records/*.json")):
        r = json.loads(rec.read_text())
        if r.get("status") != "completed":
            continue
        shutil.copy2(rec, out / "records" / rec.name)
        diag = rec.parent.parent / r["run_id"] / "diagnostics.jsonl"
        if diag.is_file():
            shutil.copy2(diag, out / "diagnostics" / f"{r['study']}__{r['run_id']}.jsonl")
        n += 1
    return n


def load_records(folder: Path) -> pd.DataFrame:
    """One row per completed record: arm (the study without ``l8a_``, ``@<budget>`` appended for a record of a
    multi-budget launch), seed, val loss, lr, variant, n_blocks."""
    rows = [json.loads(p.read_text()) for p in sorted((folder / "records").glob("*.json"))]
    df = pd.DataFrame(rows)
    df = df[df["status"] == "completed"].copy()
    df["arm"] = df["study"].str.removeprefix("l8a_")
    budget = df["budget"] if "budget" in df else pd.Series(None, index=df.index)
    has = budget.notna()
    df.loc[has, "arm"] = df.loc[has, "arm"] + "@" + budget[has].astype(int).astype(str)
    cols = ["arm", "seed", "val_loss", "lr", "variant", "n_blocks", "optimizer", "config_hash", "run_id"]
    return (
        df[cols]
        .drop_duplicates(["arm", "config_hash"], keep="last")
        .sort_values(["arm", "seed"])
        .reset_index(drop=True)
    )


def load_committed(folder: Path) -> pd.DataFrame:
    """The L_b 8 Muon + WSD records of docs/results/cpu_deep_recipe (another machine, same configs): arms
    ``recipe_baseline``, ``recipe_block`` (the baseline's lr, connection_lr_scale 1) and ``recipe_block_own_lr``."""
    rows = []
    for p in sorted((folder / "records").glob("*deep_L8_*.json")):
        r = json.loads(p.read_text())
        if r.get("status") != "completed" or r.get("optimizer") != "muon":
            continue
        own = "_own_lr" if r["lr_protocol"] == "per_arm" else ""
        r["arm"] = "recipe_" + ("block" if r["variant"] == "block_attnres" else r["variant"]) + own
        rows.append(r)
    cols = ["arm", "seed", "val_loss", "lr", "variant", "n_blocks", "optimizer", "config_hash", "run_id"]
    return pd.DataFrame(rows)[cols].drop_duplicates(["arm", "seed"], keep="last")


def paired(df: pd.DataFrame, reference: str, seeds: list[int] | None = None) -> pd.DataFrame:
    """Each arm minus ``reference`` over the seeds both ran (restricted to ``seeds`` when given): n, mean and 95% t
    interval of the same-seed differences (no interval for n < 2)."""
    loss = df.pivot_table(index="seed", columns="arm", values="val_loss")
    if seeds is not None:
        loss = loss.loc[loss.index.intersection(seeds)]
    rows = []
    for arm in loss.columns:
        if arm == reference:
            continue
        d = (loss[arm] - loss[reference]).dropna()
        lo, hi = t_interval(d.to_numpy())
        rows.append({"arm": arm, "n": len(d), "seeds": ",".join(str(s) for s in d.index),
                     "delta": float(d.mean()) if len(d) else math.nan, "lo": lo, "hi": hi})  # fmt: skip
    return pd.DataFrame(rows)


def last_diagnostics(folder: Path) -> dict[str, dict]:
    """run_id -> the diagnostics of its last evaluation (for schemes with depth weights)."""
    out = {}
    for p in sorted((folder / "diagnostics").glob("*.jsonl")):
        lines = [json.loads(s) for s in p.read_text().splitlines() if s.strip()]
        if lines and "depth_weights" in lines[-1]:
            out[p.stem.split("__", 1)[1]] = lines[-1]
    return out


def weight_summary(diag: dict) -> dict[str, float]:
    """At one evaluation: mean embedding weight over the reads that see more than the embedding, the final read's
    embedding weight, and the mean normalised entropy of those reads (1 = uniform over the visible sources)."""
    emb, ent = [], []
    for row in diag["depth_weights"]:
        w = np.array([v for v in row if v is not None], dtype=float)
        if len(w) < 2:
            continue
        emb.append(w[0])
        p = w[w > 0]
        ent.append(float(-(p * np.log(p)).sum() / math.log(len(w))))
    return {"emb_weight_mean": float(np.mean(emb)), "emb_weight_final": float(diag["depth_weights"][-1][0]),
            "entropy_mean": float(np.mean(ent))}  # fmt: skip


def trajectories(folder: Path) -> pd.DataFrame:
    """Depth-weight summary (:func:`weight_summary`) at every evaluation of the multi-budget launches' runs (their
    names hold ``budgets``; ``diagnostics/l12_reference`` holds L_b 12 runs of cpu_deep_budgets for comparison)."""
    rows = []
    for p in sorted((folder / "diagnostics").rglob("*budgets*.jsonl")):
        for line in p.read_text().splitlines():
            d = json.loads(line)
            if "depth_weights" in d:
                rows.append({"run": p.stem.split("__", 1)[1], "step": d["step"], "val_loss": d["val_loss"],
                             **weight_summary(d)})  # fmt: skip
    return pd.DataFrame(rows)


LABELS = {
    "block": "Block, Muon + WSD",
    "block_c0.1": "Block, Muon + WSD,\nresidual lr x 0.1",
    "adamw_block": "Block, AdamW + cosine",
    "full": "Full AttnRes, Muon + WSD",
}


def figure(df: pd.DataFrame, diags: dict[str, dict], arms: list[str], seed: int, path: Path) -> None:
    """Depth weights (reads x sources, Fig. 8 of the paper) at the last evaluation of each arm's run at ``seed``."""
    picked = [(a, df[(df.arm == a) & (df.seed == seed)]) for a in arms]
    picked = [(a, r.iloc[0]) for a, r in picked if len(r) and r.iloc[0]["run_id"] in diags]
    fig, axes = plt.subplots(1, len(picked), figsize=(3.3 * len(picked), 4.2), squeeze=False)
    for ax, (arm, rec) in zip(axes[0], picked):
        d = diags[rec["run_id"]]
        w = np.array([[np.nan if v is None else v for v in row] for row in d["depth_weights"]], dtype=float)
        im = ax.imshow(w, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ent = weight_summary(d)["entropy_mean"]
        ax.set_title(f"{LABELS.get(arm, arm)}\nval {rec['val_loss']:.3f}, entropy {ent:.2f}", fontsize=8)
        ax.set_xticks(range(w.shape[1]), d["source_labels"], rotation=90, fontsize=6)
        ax.set_yticks(range(w.shape[0]), d["read_kinds"], fontsize=6)
        ax.set_xlabel("source")
    axes[0][0].set_ylabel("read (sublayer input)")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="depth weight α (mean over tokens)")
    fig.suptitle(f"L_b 8, d 16, 8 tokens/param, seed {seed}: depth weights at the last evaluation", fontsize=10, y=1.07)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results folder (records/, diagnostics/)")
    parser.add_argument("--collect", type=Path, help="runs root to copy records and diagnostics from first")
    parser.add_argument("--confirm-seeds", default="0,1,2,20,21,22")
    parser.add_argument("--committed", type=Path, default=Path("docs/results/cpu_deep_recipe"))
    parser.add_argument("--figure-arms", default="block,block_c0.1,adamw_block")
    parser.add_argument("--figure-seed", type=int, default=11)
    args = parser.parse_args(argv)
    if args.collect is not None:
        print(f"collected {collect(args.collect, args.out)} records")
    df = load_records(args.out)
    diags = last_diagnostics(args.out)
    summ = pd.DataFrame([{"run_id": k, **weight_summary(v)} for k, v in diags.items()])
    table = df.merge(summ, on="run_id", how="left") if len(summ) else df
    pd.set_option("display.width", 200)
    print(table.drop(columns=["run_id", "config_hash"]).to_string(index=False, float_format="%.4f"))
    for ref in ("baseline", "adamw_baseline"):
        if ref in set(df.arm):
            print(f"\nminus {ref}, seed 11:")
            print(paired(df, ref, [11]).to_string(index=False, float_format="%+.4f"))
    seeds = [int(s) for s in args.confirm_seeds.split(",")]
    both = pd.concat([df, load_committed(args.committed)], ignore_index=True)
    for ref in ("baseline", "recipe_block"):
        for part in (seeds, seeds[: len(seeds) // 2], seeds[len(seeds) // 2 :]):
            print(f"\nminus {ref}, seeds {part}:")
            print(paired(both, ref, part).query("n > 1").to_string(index=False, float_format="%+.4f"))
    traj = trajectories(args.out)
    if len(traj):
        print("\ndepth weights at each evaluation of the multi-budget runs:")
        print(traj.to_string(index=False, float_format="%.3f"))
    figure(df, diags, args.figure_arms.split(","), args.figure_seed, args.out / "fig_depth_weights.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
