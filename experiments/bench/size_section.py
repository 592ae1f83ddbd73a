"""The per-size section: every residual scheme's training step, prefill and decode timed interleaved, the memory
measures, ratios to the baseline and the issue's checks (:func:`bench_size`). No torch at import."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from .memory import (
    block_memory_bound,
    cpu_peak_memory,
    cuda_peak_step_bytes,
    peak_tensor_step_bytes,
    saved_activation_bytes,
)
from .runner import Runner, build_runner, sync, time_round_robin
from .sample_stats import paired_ratios, summarize
from .settings import BenchSettings
from .shapes import TARGET, BenchSize

# Dense bf16 tensor-core peaks (FLOP/s) by GPU name fragment; MFU is reported against these when on CUDA.
GPU_PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}
MEMORY_KEYS = ("saved_activation_bytes", "peak_tensor_step_bytes", "peak_bytes", "peak_step_bytes")


def bench_size(
    size: BenchSize,
    schemes: Sequence[str],
    settings: BenchSettings,
    device: Any,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The section's result for one size (the JSON's ``sizes[i]``; docs/performance.md)."""
    import torch

    log(
        f"\n== {size.name}: L_b={size.n_layers} ({2 * size.n_layers} sublayers) d={size.d_model} "
        f"T={size.seq_len} B={size.batch_size} ({size.batch_size * size.seq_len} tokens/step), device {device}, "
        f"{torch.get_num_threads()} threads, {'bf16 autocast' if settings.bf16 else 'fp32'}"
        f"{f', compiled ({settings.compile})' if settings.compile else ''}"
        f"{', checkpointing' if settings.checkpointing else ''}"
        f"{f', optimizer {settings.optimizer}' if settings.optimizer != 'adamw' else ''}"
    )
    s = settings
    runners = [
        build_runner(size, n, device, s.seed, s.bf16, s.compile, s.checkpointing, s.sdpa, optimizer_name=s.optimizer)
        for n in schemes
    ]
    first_step = _first_steps(runners, device, log) if s.compile else {}
    timing = time_round_robin(
        runners,
        s.warmup,
        s.repeats,
        device,
        prefill=not s.no_prefill,
        log=log,
        quiet_wait_s=s.quiet_wait,
        decode_tokens=s.decode_tokens,
    )
    peak = _peak_flops(s, device)
    per_scheme = {r.name: _scheme_entry(r, size, timing, peak, s.decode_tokens, first_step) for r in runners}
    if not s.no_memory:
        _measure_memory(runners, per_scheme, size, s, device, log)
    del runners
    ratios = _ratios(per_scheme, timing, s)
    busy = [b for b in timing["other_cores_busy"] if b is not None]
    return {
        "size": size.to_dict(),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "tokens_per_step": size.batch_size * size.seq_len,
        "peak_flops": peak,
        "schemes": per_scheme,
        "ratios": ratios,
        "other_cores_busy": summarize(busy) if busy else None,
        "checks": size_checks(size, per_scheme, ratios, 2 if s.bf16 else 4, device.type),
    }


def _first_steps(runners: Sequence[Runner], device: Any, log: Callable[[str], None]) -> dict[str, float]:
    """--compile: each runner's first training step (compilation), outside the timed rounds (regional: later models
    reuse the compiled sublayers)."""
    first_step: dict[str, float] = {}
    for r in runners:
        sync(device)
        t0 = time.perf_counter()
        r.train_step()
        sync(device)
        first_step[r.name] = time.perf_counter() - t0
        log(f"  first step (compiling) {r.name}: {first_step[r.name]:.1f} s")
    return first_step


def _peak_flops(settings: BenchSettings, device: Any) -> float | None:
    """--peak-flops, else the known dense bf16 peak of this GPU under --bf16, else None."""
    if settings.peak_flops is not None or device.type != "cuda" or not settings.bf16:
        return settings.peak_flops
    import torch

    name = torch.cuda.get_device_name(device)
    return next((v for k, v in GPU_PEAK_BF16.items() if k in name), None)


def _scheme_entry(
    r: Runner,
    size: BenchSize,
    timing: dict[str, Any],
    peak: float | None,
    decode_tokens: int,
    first_step: dict[str, float],
) -> dict[str, Any]:
    """One scheme's timing entry: step, CPU time, throughput, FLOP/s, MFU, prefill (decode, first step)."""
    from attnres import flops_per_token

    tokens = size.batch_size * size.seq_len
    cfg = size.model_config(r.name)
    fpt = flops_per_token(cfg, size.seq_len).total
    step = summarize(timing["train_s"][r.name])
    med = step["median"]
    prefill = timing["prefill_s"][r.name]
    entry: dict[str, Any] = {
        "params": r.model.num_params(),
        "params_non_embedding": r.model.num_params(non_embedding=True),
        "flops_per_token": fpt,
        "train_step_s": step,
        "train_step_cpu_s": summarize(timing["train_cpu_s"][r.name]),
        "tokens_per_s": tokens / med if med else None,
        "flop_per_s": fpt * tokens / med if med else None,
        "mfu": fpt * tokens / med / peak if (med and peak) else None,
        "prefill_s": summarize(prefill),
        "prefill_tokens_per_s": tokens / statistics.median(prefill) if prefill else None,
    }
    if decode_tokens:
        entry["decode_token_s"] = summarize(timing["decode_token_s"][r.name])
        entry["decode"] = {"tokens": decode_tokens, "batch": 1, "context": size.seq_len}
    if r.name in first_step:
        entry["first_step_s"] = first_step[r.name]
    if cfg.reads_block_geometry:
        entry["n_blocks"] = cfg.effective_n_blocks
        entry["sublayers_per_block"] = cfg.sublayers_per_block
    return entry


def _measure_memory(
    runners: Sequence[Runner],
    per_scheme: dict[str, dict[str, Any]],
    size: BenchSize,
    settings: BenchSettings,
    device: Any,
    log: Callable[[str], None],
) -> None:
    """Saved activations in-process (deterministic) and the peak memory per scheme, into ``per_scheme``."""
    import torch

    log("  memory: saved activations" + (", peak RSS in fresh subprocesses" if device.type == "cpu" else ""))
    for r in runners:
        if not settings.compile:  # (compiled graphs save through their own path; the hooks do not see it)
            per_scheme[r.name]["saved_activation_bytes"] = saved_activation_bytes(r)
        if device.type == "cuda":
            per_scheme[r.name].update(cuda_peak_step_bytes(r))
        elif not settings.compile:  # (compiled graphs allocate through their own path)
            per_scheme[r.name]["peak_tensor_step_bytes"] = peak_tensor_step_bytes(r)
    if device.type == "cpu":
        for r in runners:
            m = cpu_peak_memory(
                size, r.name, torch.get_num_threads(), settings.seed, settings.bf16, settings.checkpointing
            )
            per_scheme[r.name].update(
                rss_before_bytes=m["rss_before_bytes"],
                peak_bytes=m["peak_rss_bytes"],
                peak_step_bytes=m["peak_step_bytes"],
            )


def _ratios(
    per_scheme: dict[str, dict[str, Any]], timing: dict[str, Any], settings: BenchSettings
) -> dict[str, dict[str, Any]]:
    """Per scheme: the paired time ratios to the baseline and the memory ratios (empty without a baseline)."""
    if "baseline" not in per_scheme:
        return {}
    base = per_scheme["baseline"]
    train_r = paired_ratios(timing["train_s"], "baseline")
    cpu_r = paired_ratios(timing["train_cpu_s"], "baseline")
    pre_r = paired_ratios(timing["prefill_s"], "baseline") if not settings.no_prefill else {}
    dec_r = paired_ratios(timing["decode_token_s"], "baseline") if settings.decode_tokens else {}
    ratios: dict[str, dict[str, Any]] = {}
    for n, e in per_scheme.items():
        rr: dict[str, Any] = {
            "train_step": train_r.get(n),
            "train_step_cpu": cpu_r.get(n),
            "prefill": pre_r.get(n),
            "decode": dec_r.get(n),
        }
        for key in MEMORY_KEYS:
            if key in e and base.get(key):
                rr[key] = e[key] / base[key]
        ratios[n] = rr
    return ratios


def size_checks(
    size: BenchSize,
    per_scheme: dict[str, Any],
    ratios: dict[str, Any],
    element_bytes: int,
    device_type: str = "cpu",
) -> list[dict[str, Any]]:
    """The issue's targets, evaluated where they apply (the time targets at the 16 x 256 size only). Memory is
    checked on deterministic measures: saved activations, and the peak of live tensors (CPU: from the profiler;
    CUDA: max_memory_allocated). CPU peak RSS is reported, not checked: it moves with the C allocator."""
    out: list[dict[str, Any]] = []
    if "baseline" not in per_scheme:
        return out
    if size.name == TARGET.name:
        for scheme, limit in (("block", 1.05), ("full", 1.15)):
            r = (ratios.get(scheme) or {}).get("train_step")
            if r and r["median"] is not None:
                out.append(
                    {
                        "name": f"{scheme} train step <= {limit}x baseline",
                        "value": r["median"],
                        "limit": limit,
                        "pass": r["median"] <= limit,
                    }
                )
    if "block" in per_scheme:
        out += _memory_checks(size, per_scheme, element_bytes, device_type)
    return out


def _memory_checks(
    size: BenchSize, per_scheme: dict[str, Any], element_bytes: int, device_type: str
) -> list[dict[str, Any]]:
    """Block's extra memory over the baseline against block_memory_bound, per deterministic measure."""
    out: list[dict[str, Any]] = []
    peak = (
        ("peak_step_bytes", "peak step memory")
        if device_type == "cuda"
        else ("peak_tensor_step_bytes", "peak step tensor memory")
    )
    for key, what in (("saved_activation_bytes", "saved activations"), peak):
        b, k = per_scheme["baseline"].get(key), per_scheme["block"].get(key)
        if b is None or k is None:
            continue
        bound = block_memory_bound(size, b, element_bytes)
        extra = k - b
        out.append(
            {
                "name": f"block {what} - baseline <= (N+1)*B*T*d*{element_bytes} B + 5% of baseline",
                "value": extra,
                "limit": bound["limit_extra_bytes"],
                "pass": extra <= bound["limit_extra_bytes"],
                "baseline": b,
                "block": k,
                "block_sums_bytes": bound["block_sums_bytes"],
                "extra_in_BTd": extra / (size.batch_size * size.seq_len * size.d_model * element_bytes),
            }
        )
    return out
