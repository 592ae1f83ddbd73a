"""The MoE section: the training step of an MoE size against a dense size of (about) the same activated parameters,
per residual scheme, interleaved (:func:`bench_moe`; ``--moe-pairs cpu_moe:cpu_xs``). On CUDA under bf16 the MoE
model also runs with ``dispatch: loop``, so the grouped GEMM (``torch._grouped_mm``) is timed against the loop over
experts it replaces. No torch at import."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from .runner import Runner, build_runner, time_round_robin
from .sample_stats import summarize
from .settings import BenchSettings
from .shapes import BenchSize, check_moe_pair, resolve_size


def _loop_dispatch(size: BenchSize) -> BenchSize:
    assert size.moe is not None
    return replace(size, name=f"{size.name}/loop", moe={**size.moe, "dispatch": "loop"})


def pair_runners(
    moe: BenchSize, dense: BenchSize, schemes: Sequence[str], settings: BenchSettings, device: Any
) -> list[Runner]:
    """Runners named "<scheme>/dense", "<scheme>/moe" (and "<scheme>/moe_loop" on CUDA under bf16), scheme-major."""
    s = settings
    variants = [("dense", dense), ("moe", moe)]
    if device.type == "cuda" and s.bf16:
        variants.append(("moe_loop", _loop_dispatch(moe)))
    return [
        build_runner(size, scheme, device, s.seed, s.bf16, s.compile, s.checkpointing, s.sdpa, name=f"{scheme}/{v}")
        for scheme in schemes
        for v, size in variants
    ]


def bench_moe_pair(
    moe: BenchSize,
    dense: BenchSize,
    schemes: Sequence[str],
    settings: BenchSettings,
    device: Any,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """One pair's result (the JSON's ``moe[i]``): per scheme, each variant's step time and activated parameters,
    and per round the MoE step over the dense step of the same scheme (``moe_over_dense``; on CUDA + bf16 also
    ``loop_over_grouped``)."""
    import torch

    check_moe_pair(moe, dense)
    log(
        f"\n== MoE vs dense: {moe.name} vs {dense.name}, T={moe.seq_len} B={moe.batch_size}, device {device}, "
        f"{torch.get_num_threads()} threads, {'bf16 autocast' if settings.bf16 else 'fp32'}"
    )
    runners = pair_runners(moe, dense, schemes, settings, device)
    for r in runners:  # first step (a compile, the grouped GEMM's first call) outside the timed rounds
        r.train_step()
    timing = time_round_robin(
        runners, settings.warmup, settings.repeats, device, prefill=False, log=log, quiet_wait_s=settings.quiet_wait
    )
    train = timing["train_s"]
    results: dict[str, Any] = {}
    for scheme in schemes:
        entry: dict[str, Any] = {}
        for r in (r for r in runners if r.name.startswith(f"{scheme}/")):
            variant = r.name.split("/", 1)[1]
            entry[variant] = {
                "train_step_s": summarize(train[r.name]),
                "params_activated_non_embedding": r.model.num_params(non_embedding=True, activated=True),
                "params_total_non_embedding": r.model.num_params(non_embedding=True),
            }
        entry["moe_over_dense"] = summarize([m / d for m, d in zip(train[f"{scheme}/moe"], train[f"{scheme}/dense"])])
        if f"{scheme}/moe_loop" in train:
            entry["loop_over_grouped"] = summarize(
                [a / b for a, b in zip(train[f"{scheme}/moe_loop"], train[f"{scheme}/moe"])]
            )
        results[scheme] = entry
    busy = [b for b in timing["other_cores_busy"] if b is not None]
    return {
        "moe_size": moe.to_dict(),
        "dense_size": dense.to_dict(),
        "threads": torch.get_num_threads(),
        "schemes": results,
        "other_cores_busy": summarize(busy) if busy else None,
    }


def bench_moe(settings: BenchSettings, device: Any, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every ``--moe-pairs`` pair, in order, each printed as it finishes."""
    out = []
    for moe_name, dense_name in settings.moe_pairs:
        moe, dense = (resolve_size(n, settings.batch_size, settings.seq_len) for n in (moe_name, dense_name))
        res = bench_moe_pair(moe, dense, settings.schemes, settings, device, log=log)
        print_moe(res, log=log)
        out.append(res)
    return out


def print_moe(res: dict[str, Any], log: Callable[[str], None] = print) -> None:
    """The pair's table: per scheme, dense and MoE step medians, activated N, the per-round ratio's median and
    range."""
    log(f"  {'scheme':<10} {'dense ms':>9} {'MoE ms':>8} {'N dense':>9} {'N MoE':>9}  MoE / dense (rounds)")
    for scheme, e in res["schemes"].items():
        d, m, r = e["dense"], e["moe"], e["moe_over_dense"]
        line = (
            f"  {scheme:<10} {1e3 * d['train_step_s']['median']:>9.1f} {1e3 * m['train_step_s']['median']:>8.1f} "
            f"{d['params_activated_non_embedding']:>9,} {m['params_activated_non_embedding']:>9,}  "
            f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})"
        )
        if "loop_over_grouped" in e:
            g = e["loop_over_grouped"]
            line += f"; loop / grouped GEMM {g['median']:.2f} ({g['min']:.2f}-{g['max']:.2f})"
        log(line)
