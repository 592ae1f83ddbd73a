"""Retrain committed runs and compare them with what was recorded: the check behind "behaviour stays identical".

    python scripts/reproduce.py                                   # baseline, Block, Full at cpu_xs, seed 0
    python scripts/reproduce.py --variants baseline --sizes cpu_xs,cpu_s --seeds 0,1
    python scripts/reproduce.py --runs docs/results/cpu_ladder/heldout/runs.csv --seeds 20

Each cell (variant, size, seed, lr protocol) of the runs table (docs/results/cpu_ladder/runs.csv, written from the
study's records) is trained again with experiment=cpu_ladder on one thread into a temporary runs root. A cell
reproduces when its config_hash is the recorded one and its final validation loss equals the recorded value
(``--tolerance`` 0: bit for bit) or differs by at most ``--tolerance`` nats. Prints one line per cell and exits 1
when any cell does not reproduce. Stdlib only; each run takes about a minute at cpu_xs.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cells(table: Path, variants: set[str], sizes: set[str], seeds: set[int], protocol: str) -> list[dict[str, str]]:
    with table.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return [
        r
        for r in rows
        if r["variant"] in variants and r["size"] in sizes and int(r["seed"]) in seeds and r["lr_protocol"] == protocol
    ]


def _train(row: dict[str, str], runs_root: Path) -> dict[str, str]:
    overrides = [
        "experiment=cpu_ladder",
        f"model={row['variant']}",
        f"size={row['size']}",
        f"seed={row['seed']}",
        f"lr_protocol={row['lr_protocol']}",
        "threads=1",
        "logger=csv",
        f"paths.runs_root={runs_root}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "experiments.train", *overrides], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"training {row['run_id']} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    with (runs_root / "cpu_ladder" / "results.csv").open(newline="") as f:
        got = [r for r in csv.DictReader(f) if r["run_id"] == row["run_id"] and r["status"] == "completed"]
    if not got:
        raise RuntimeError(f"{row['run_id']}: no completed record (the config_hash moved?)")
    return got[-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, default=ROOT / "docs/results/cpu_ladder/runs.csv")
    p.add_argument("--variants", default="baseline,block_attnres,full_attnres")
    p.add_argument("--sizes", default="cpu_xs")
    p.add_argument("--seeds", default="0")
    p.add_argument("--lr-protocol", default="baseline", choices=["baseline", "per_arm"])
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="nats allowed for AttnRes arms (default 0: bit for bit); the baseline is always bit for bit",
    )
    args = p.parse_args(argv)
    cells = _cells(
        args.runs,
        set(args.variants.split(",")),
        set(args.sizes.split(",")),
        {int(s) for s in args.seeds.split(",")},
        args.lr_protocol,
    )
    if not cells:
        print(f"no recorded cell in {args.runs} matches", file=sys.stderr)
        return 2
    failures = 0
    with tempfile.TemporaryDirectory(prefix="attnres-reproduce-") as tmp:
        for row in cells:
            got = _train(row, Path(tmp))
            recorded, now = float(row["val_loss"]), float(got["val_loss"])
            tol = 0.0 if row["variant"] == "baseline" or args.tolerance is None else args.tolerance
            same_id = got["config_hash"] == row["config_hash"]
            ok = same_id and abs(now - recorded) <= tol
            failures += not ok
            print(
                f"{'ok  ' if ok else 'FAIL'} {row['run_id']}: val_loss {now!r} vs recorded {recorded!r} "
                f"(diff {now - recorded:+.3g}, allowed {tol:g}); config_hash {'same' if same_id else 'MOVED'}"
            )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
