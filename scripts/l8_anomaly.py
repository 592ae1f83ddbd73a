"""Driver of the L_b 8 anomaly runs (docs/results/cpu_deep_l8_anomaly/README.md): named arms of the deep CPU ladder's
L_b 8 rung (d_model 16, 8 tokens per parameter) x seeds, each run one ``python -m experiments.train`` call with one
thread, at most ``--jobs`` at once. Each arm is its own study (``study=l8a_<arm>``), so its runs and records go to
``<runs-root>/l8a_<arm>/``; a run whose config_hash already completed there is skipped by the harness itself.

    python scripts/l8_anomaly.py --arms baseline,block,block_c0.3 --seeds 11 --runs-root /work/runs_anomaly
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

MUON = ("+sweep=cpu_deep", "optimizer=muon", "scheduler=wsd", "tuned_lr=cpu_deep_muon_wsd", "size.n_layers=8")
ADAMW = ("+sweep=cpu_deep", "size.n_layers=8")  # AdamW + cosine at conf/tuned_lr/cpu_deep.yaml

# arm -> overrides (every arm at the baseline's tuned lr of its recipe unless it says otherwise)
ARMS: dict[str, tuple[str, ...]] = {
    "baseline": (*MUON, "model=baseline"),
    "block": (*MUON, "model=block_attnres"),
    "block_c0": (*MUON, "model=block_attnres", "optimizer.connection_lr_scale=0"),
    "block_c0.1": (*MUON, "model=block_attnres", "optimizer.connection_lr_scale=0.1"),
    "block_c0.3": (*MUON, "model=block_attnres", "optimizer.connection_lr_scale=0.3"),
    "block_c3": (*MUON, "model=block_attnres", "optimizer.connection_lr_scale=3"),
    "block_nb4": (*MUON, "model=block_attnres", "model.n_blocks=4"),
    "block_nb2": (*MUON, "model=block_attnres", "model.n_blocks=2"),
    "full": (*MUON, "model=full_attnres"),
    # one WSD trunk to 128 tokens per parameter with decay branches at 8 and 32 (a record per budget)
    "block_budgets": (*MUON, "model=block_attnres", "train.budgets=[8,32,128]"),
    "block_c0.1_budgets": (
        *MUON,
        "model=block_attnres",
        "optimizer.connection_lr_scale=0.1",
        "train.budgets=[8,32,128]",
    ),
    "adamw_baseline": (*ADAMW, "model=baseline"),
    "adamw_block": (*ADAMW, "model=block_attnres"),
    "adamw_block_c0.1": (*ADAMW, "model=block_attnres", "optimizer.connection_lr_scale=0.1"),
    # which half of the recipe: Muon with the cosine schedule; AdamW with WSD at the Muon baseline's lr
    "muon_cosine_block": (*MUON, "scheduler=cosine", "model=block_attnres"),
    "adamw_wsd_block": (*ADAMW, "scheduler=wsd", "size.lr=0.02901", "model=block_attnres"),
}


def command(arm: str, seed: int, runs_root: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "experiments.train",
        *ARMS[arm],
        f"seed={seed}",
        f"study=l8a_{arm}",
        "threads=1",
        "logger=none",
        f"paths.runs_root={runs_root}",
        "trainer.enable_progress_bar=false",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", required=True, help=f"comma-separated, from: {', '.join(ARMS)}")
    parser.add_argument("--seeds", required=True, help="comma-separated seeds")
    parser.add_argument("--runs-root", required=True)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"--arms: unknown {unknown}; allowed: {', '.join(ARMS)}")
    if not 1 <= args.jobs <= 2:
        parser.error("--jobs must be 1 or 2 (the machine has 2 cores)")
    queue = [(a, int(s)) for s in args.seeds.split(",") for a in arms]
    log_dir = Path(args.runs_root) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    running: list[tuple[str, subprocess.Popen[bytes]]] = []
    failed = []
    while queue or running:
        while queue and len(running) < args.jobs:
            arm, seed = queue.pop(0)
            name = f"{arm}_s{seed}"
            with open(log_dir / f"{name}.log", "wb") as log:
                proc = subprocess.Popen(command(arm, seed, args.runs_root), stdout=log, stderr=subprocess.STDOUT)
            running.append((name, proc))
            print(f"started {name}", flush=True)
        time.sleep(2)
        for name, proc in list(running):
            if proc.poll() is not None:
                running.remove((name, proc))
                print(f"finished {name}: rc {proc.returncode}", flush=True)
                if proc.returncode:
                    failed.append(name)
    if failed:
        print(f"failed: {failed} (logs in {log_dir})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
