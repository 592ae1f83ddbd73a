"""``python -m experiments.bench``: the sections in order (per size, options, MoE, harness), their
printout, and the one JSON file (--out). The flags: experiments.bench.settings."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .memory import attnres_root, memory_child
from .option_section import bench_options
from .printout import print_options, print_size
from .settings import BenchSettings, parse_args
from .shapes import BenchSize, resolve_size
from .size_section import bench_size

SCHEMA_VERSION = 1


def environment(settings: BenchSettings, device: Any) -> dict[str, Any]:
    """The JSON's ``meta``: versions, machine, and the settings every figure depends on."""
    import torch

    from attnres import cpu_kernels, gpu_kernels
    from results.io import git_commit, utc_now

    env = {
        "created": utc_now(),
        "argv": sys.argv,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "git_commit": git_commit(),
        "quick": bool(settings.quick),
        "bf16": bool(settings.bf16),
        "compile": settings.compile or False,
        "checkpointing": bool(settings.checkpointing),
        "optimizer": settings.optimizer,
        "decode_tokens": settings.decode_tokens,
        "gpu_kernels": gpu_kernels.status(),
        "sdpa": settings.sdpa,
        "repeats": settings.repeats,
        "warmup": settings.warmup,
        "seed": settings.seed,
        "quiet_wait_s": settings.quiet_wait,
        "attnres_path": str(attnres_root() / "attnres"),
        "host": platform.node(),
        "processor": platform.processor() or platform.machine(),
        "cpu_kernels": cpu_kernels.status(),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    try:
        import lightning

        env["lightning"] = lightning.__version__
    except ImportError:  # pragma: no cover - lightning is a dependency
        env["lightning"] = None
    return env


def _device(settings: BenchSettings) -> Any:
    """The torch device of --device, with the process-wide settings of the run (threads, compile mode)."""
    import torch

    if settings.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (use --device cpu)")
    device = torch.device(settings.device)
    if device.type == "cpu":
        torch.set_num_threads(settings.threads)
    if settings.compile:  # the harness section's runs compile the same way (experiments.training.module.compile_mode)
        from ..training.module import COMPILE_ENV

        os.environ[COMPILE_ENV] = settings.compile
    return device


def run(settings: BenchSettings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every section the settings ask for; writes and returns the JSON document."""
    device = _device(settings)
    t_start = time.perf_counter()
    sizes = [resolve_size(n, settings.batch_size, settings.seq_len) for n in settings.sizes]
    out: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "meta": environment(settings, device),
        "sizes": [],
        "harness": None,
        "options": None,
        "moe": None,
    }
    for size in sizes:
        res = bench_size(size, settings.schemes, settings, device, log=log)
        print_size(res, log=log)
        if device.type == "cuda":  # the depth kernels' time and achieved GB/s beside the steps (depth_roofline)
            from ..depth_roofline import measure

            res["depth_roofline"] = measure(size, device, "bf16-mixed" if settings.bf16 else "fp32", log=log)
        out["sizes"].append(res)
    if settings.options and sizes:
        res = bench_options(sizes[0], settings.schemes, settings.option_variants, settings, device, log=log)
        print_options(res, log=log)
        out["options"] = res
    if settings.moe_pairs:
        from .moe_section import bench_moe

        out["moe"] = bench_moe(settings, device, log=log)
    if settings.harness:
        out["harness"] = _run_harness(settings, sizes, out["sizes"], device, log)
    out["meta"]["wall_time_s"] = time.perf_counter() - t_start
    path = Path(settings.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    log(f"\nwrote {path} ({out['meta']['wall_time_s']:.0f} s)")
    return out


def _run_harness(
    settings: BenchSettings,
    sizes: Sequence[BenchSize],
    size_results: Sequence[dict[str, Any]],
    device: Any,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """The harness section at --harness-sizes (default: the sizes), each run long enough for ~6 s of timed steps
    by the baseline step time of the per-size section (6 to 40 steps) unless --harness-steps says."""
    from .harness import compare_harness, print_harness

    hsizes = (
        [resolve_size(n, settings.batch_size, settings.seq_len) for n in settings.harness_sizes]
        if settings.harness_sizes
        else sizes
    )
    step_s = {
        r["size"]["name"]: r["schemes"].get("baseline", {}).get("train_step_s", {}).get("median") for r in size_results
    }
    results = []
    for size in hsizes:
        steps = settings.harness_steps
        if steps is None:  # ~6 s of timed steps per run, at least 6 steps, at most 40
            est = step_s.get(size.name)
            steps = min(40, max(6, math.ceil(6.0 / est))) if est else 6
        res = compare_harness(size, settings, device, steps=steps, log=log)
        print_harness(res, log=log)
        results.append(res)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """The command line (``python -m experiments.bench --help``)."""
    from . import __doc__ as package_doc

    settings = parse_args(argv, description=(package_doc or "").split("\n\n")[0])
    if settings.memory_child is not None:
        print(json.dumps(memory_child(json.loads(settings.memory_child))))
        return
    run(settings)
