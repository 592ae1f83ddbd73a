"""The options section: eager vs torch.compile / bf16 autocast / activation checkpointing / the torch depth path,
per scheme, at one size (:func:`bench_options`; the variants: settings.OPTION_VARIANTS). No torch at import."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from .memory import saved_activation_bytes
from .runner import Runner, build_runner, time_round_robin
from .sample_stats import summarize
from .settings import OPTION_VARIANTS, BenchSettings
from .shapes import BenchSize


def option_runners(
    size: BenchSize, schemes: Sequence[str], variants: Sequence[str], settings: BenchSettings, device: Any
) -> list[Runner]:
    """One runner per (scheme, variant), named "scheme/variant", scheme-major."""
    runners = []
    for s in schemes:
        for v in variants:
            kw = {
                "bf16": False,
                "compile_model": False,
                "checkpointing": False,
                "cpu_kernels": None,
                **OPTION_VARIANTS[v],
            }
            runners.append(
                build_runner(
                    size,
                    s,
                    device,
                    settings.seed,
                    kw["bf16"],
                    kw["compile_model"],
                    kw["checkpointing"],
                    settings.sdpa,
                    name=f"{s}/{v}",
                    cpu_kernels=kw["cpu_kernels"],
                )
            )
    return runners


def bench_options(
    size: BenchSize,
    schemes: Sequence[str],
    variants: Sequence[str],
    settings: BenchSettings,
    device: Any,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Step time of every (scheme, option) pair, interleaved; ratios to the same scheme's eager fp32 step and
    to the baseline under the same option."""
    import torch

    log(f"\n== options at {size.name}: {', '.join(variants)} x {', '.join(schemes)}")
    runners = option_runners(size, schemes, variants, settings, device)
    compile_s: dict[str, float] = {}
    for r in runners:  # first step (compilation) outside the timed rounds
        t0 = time.perf_counter()
        r.train_step()
        compile_s[r.name] = time.perf_counter() - t0
    timing = time_round_robin(
        runners, settings.warmup, settings.repeats, device, prefill=False, log=log, quiet_wait_s=settings.quiet_wait
    )
    saved = {r.name: saved_activation_bytes(r) for r in runners if "compile" not in r.name}
    train = timing["train_s"]
    results: dict[str, Any] = {}
    for s in schemes:
        for v in variants:
            n = f"{s}/{v}"
            results[n] = {
                "train_step_s": summarize(train[n]),
                "first_step_s": compile_s[n],
                "vs_eager_same_scheme": summarize([a / b for a, b in zip(train[n], train[f"{s}/eager"])]),
                "vs_baseline_same_option": (
                    summarize([a / b for a, b in zip(train[n], train[f"baseline/{v}"])])
                    if "baseline" in schemes
                    else None
                ),
                "saved_activation_bytes": saved.get(n),
            }
    busy = [b for b in timing["other_cores_busy"] if b is not None]
    return {
        "size": size.to_dict(),
        "threads": torch.get_num_threads(),
        "variants": list(variants),
        "results": results,
        "other_cores_busy": summarize(busy) if busy else None,
    }
