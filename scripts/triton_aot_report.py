"""Compile every Triton depth-kernel configuration the paper sizes dispatch for Hopper (sm_90a), without a GPU,
and print ptxas's registers, spills and the resulting occupancy (experiments/bench/triton_aot.py; docs/performance.md).

    python scripts/triton_aot_report.py                          # the five paper sizes, Block (N = 8) and Full
    python scripts/triton_aot_report.py --sizes paper_528m --markdown
    python scripts/triton_aot_report.py --json report.json       # what tests/test_triton_aot.py reads
    python scripts/triton_aot_report.py --select                 # rewrite attnres/triton_launch.json (~6 min)

Sizes come from conf/size/<name>.yaml (n_layers, d_model); the calls from running the model's residual schemes
(conf/model/block_attnres.yaml: n_blocks 8; full_attnres.yaml: read_group 4, the default) under bf16-mixed and
bf16-true. TRITON_INTERPRET is removed before triton is imported (the interpreter's kernels cannot be compiled).
Exits 2 with the reason when triton or its CUDA compiler (ptxas) is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = ("paper_194m", "paper_241m", "paper_296m", "paper_436m", "paper_528m")
SCHEMES = {"block": {"residual": "block", "n_blocks": 8}, "full": {"residual": "full"}}
PRECISIONS = ("bf16-mixed", "bf16-true")


def size_shape(name: str) -> tuple[int, int]:
    """(n_layers, d_model) of conf/size/<name>.yaml (plain keys only: no resolver is needed for them)."""
    import yaml

    spec = yaml.safe_load((ROOT / "conf" / "size" / f"{name}.yaml").read_text())
    return int(spec["n_layers"]), int(spec["d_model"])


def missing() -> str | None:
    """Why nothing can be compiled here, or None."""
    try:
        import triton
        from triton.backends.nvidia.compiler import get_ptxas
    except Exception as err:  # noqa: BLE001 - no triton, or one without its CUDA backend
        return f"triton's CUDA backend does not import: {type(err).__name__}: {err}"
    try:
        get_ptxas(90)
    except Exception as err:  # noqa: BLE001 - the wheel's ptxas is missing or does not run
        return f"triton {triton.__version__} has no usable ptxas: {type(err).__name__}: {err}"
    return None


def report(sizes: list[str]) -> list[dict]:
    """One row per (size, scheme, kernel call): the call, its launch, ptxas's numbers and the occupancy."""
    from attnres import ModelConfig
    from experiments.bench.triton_aot import compile_report, kernel_calls

    rows = []
    for size in sizes:
        n_layers, d_model = size_shape(size)
        for scheme, kw in SCHEMES.items():
            config = ModelConfig(n_layers=n_layers, d_model=d_model, n_heads=1, **kw)  # type: ignore[arg-type]
            calls = set().union(*(kernel_calls(config, p) for p in PRECISIONS))
            for c in compile_report(calls, d_model):
                rows.append(
                    {"size": size, "D": d_model, "scheme": scheme}
                    | asdict(c.call)
                    | {"launch": asdict(c.launch), "padded": c.launch.padded}
                    | {k: getattr(c, k) for k in ("registers", "spill_stores", "spill_loads", "stack", "shared")}
                    | {"blocks_per_sm": c.blocks_per_sm, "warps_per_sm": c.warps_per_sm}
                )
    return rows


def print_table(rows: list[dict], markdown: bool) -> None:
    head = [
        "size", "D", "scheme", "kernel", "n", "q", "out", "BT", "CH x NC", "warps",
        "regs", "spill B", "blocks/SM", "warps/SM", "idle D",
    ]  # fmt: skip
    seen = set()
    lines = []
    for r in rows:
        cfg = r["launch"]
        cells = [
            r["size"], str(r["D"]), r["scheme"], r["kernel"], str(r["n"]), "y" if r["has_q"] else "-", r["out"],
            str(cfg["block_t"]), f"{cfg['chunk']} x {cfg['n_chunks']}", str(cfg["warps"]), str(r["registers"]),
            str(r["spill_stores"]), str(r["blocks_per_sm"]), str(r["warps_per_sm"]),
            f"{(r['padded'] - r['D']) / r['padded']:.1%}",
        ]  # fmt: skip
        if tuple(cells) not in seen:
            seen.add(tuple(cells))
            lines.append(cells)
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for cells in lines:
            print("| " + " | ".join(cells) + " |")
        return
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
    for cells in [head, *lines]:
        print("  ".join(c.rjust(w) for c, w in zip(cells, widths)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated conf/size names (default: {SIZES})")
    p.add_argument("--json", help="also write the rows to this JSON file")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument(
        "--select", action="store_true", help="choose the packaged launch table by compiling every candidate"
    )
    args = p.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)  # before triton is imported
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    why = missing()
    if why is not None:
        print(f"triton_aot_report: cannot compile: {why}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    if args.select:
        import triton

        from attnres import triton_launch
        from experiments.bench.triton_aot import SELECT_WIDTH, select_tiles

        tiles = select_tiles(log=lambda line: print(line, file=sys.stderr, flush=True))
        meta = {
            "how": "scripts/triton_aot_report.py --select: every candidate compiled for sm_90a, triton_launch.select",
            "width": SELECT_WIDTH,
            "triton": triton.__version__,
        }
        triton_launch.write_table(triton_launch.PACKAGED, tiles, meta)
        print(f"# wrote {triton_launch.PACKAGED} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        return 0
    rows = report([s for s in args.sizes.split(",") if s])
    print_table(rows, args.markdown)
    print(f"# {len(rows)} calls, compiled in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
