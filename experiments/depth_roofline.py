"""The depth kernels against the memory roofline: bytes per call, and on a GPU achieved GB/s against the peak.

    python -m experiments.depth_roofline                                   # bytes per call at the paper sizes
    python -m experiments.depth_roofline --device cuda --sizes paper_528m  # + measured time, GB/s, % of peak
    python -m experiments.depth_roofline --device cuda --tune table.json   # time the launch candidates
    ATTNRES_TRITON_LAUNCH=table.json python -m experiments.train ...       # then train with the fastest

``call_bytes`` is the analytic model (a pure function, tests/test_depth_roofline.py): for one kernel call, the
``minimum`` bytes (every input read once and every output written once: the op's contract) and the bytes the
kernel's passes move (``passes``: each walk over a [tokens, D] tensor counted, the small per-token tensors
once), which is what DRAM sees if no re-read hits in cache. The calls of a training step come from the model's
residual scheme itself (experiments.bench.triton_aot.op_calls). On CUDA, ``measure`` times each distinct call's
forward and backward kernel with CUDA events and reports achieved bandwidth as minimum bytes / time, against the
GPU's peak HBM bandwidth. experiments.bench (size_section) prints it beside the step times when it runs on CUDA, and
scripts/gpu_suite.sh runs it. Reading the numbers: docs/performance.md, "Triton kernels on CUDA".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# peak HBM bandwidth (bytes/s) by GPU name fragment
GPU_PEAK_BANDWIDTH = {"H200": 4.8e12, "H100 SXM": 3.35e12, "H100 PCIe": 2.0e12, "H100": 3.35e12, "A100": 2.0e12}
_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
SCHEMES = {"block": {"residual": "block", "n_blocks": 8}, "full": {"residual": "full"}}


@dataclass(frozen=True)
class Traffic:
    """Bytes of one kernel call: ``minimum`` (each input read and each output written once) and ``passes`` (every
    walk the kernel makes over a [tokens, D] tensor; small per-token tensors once)."""

    minimum: int
    passes: int


def call_bytes(kernel: str, tokens: int, D: int, sources: Sequence[str], n: int, **kw: Any) -> Traffic:
    """Bytes of one call of ``kernel`` over ``tokens`` tokens of width D. ``sources``: the dtypes ("fp32", "bf16",
    "fp16") of attend's sources or of merge's extras; n = Q (attend) or K (merge, = len(sources)). Keywords: merge
    ``has_q`` (True), ``out`` (y's dtype, "fp32"), ``base`` ("fp32"); backward ``sinks`` (True: every source's
    gradient is added into an fp32 sink, read and written; False: written once in its own dtype).

    attend_fwd reads the sources twice (scores, then the mix by chunks of D), writes Q fp32 outputs, lse and every
    source's logits and rstd. attend_bwd reads the sources and dL/dout twice (dot products, then the gradients) and
    writes each source's gradient. merge_fwd reads base twice and the extras twice (three times with queries: their
    key logits), writes y (and y32 when y is low precision). merge_bwd reads dL/dy and y32 three times and the
    extras once (twice with queries), writes base's and the extras' gradients."""
    N, f32 = tokens, 4
    src = sum(_BYTES[s] for s in sources) * N * D  # every source (or extra) once
    sinks = kw.get("sinks", True)
    grads = sum(2 * f32 if sinks else _BYTES[s] for s in sources) * N * D
    S = len(sources)
    if kernel == "attend_fwd":
        small = N * n * f32 + S * N * (n + 1) * f32  # lse; logits and rstd, kept for backward
        out = n * N * D * f32
        return Traffic(src + out + N * n * f32 + n * D * f32, 2 * src + out + small + n * D * f32)
    if kernel == "attend_bwd":
        g = n * N * D * f32
        small = (3 * N * n + 2 * S * N * (n + 1)) * f32  # lse, glse, dL/dlse; logits, rstd; the softmax scratch
        return Traffic(src + g + grads + small, 2 * src + 2 * g + grads + small + n * D * f32)
    has_q, out, base = kw.get("has_q", True), kw.get("out", "fp32"), kw.get("base", "fp32")
    y = _BYTES[out] * N * D + (f32 * N * D if out != "fp32" else 0)  # y, and y32 when y is low precision
    b = _BYTES[base] * N * D
    small = (2 * n + 2) * N * f32  # z, a, rstd, and with queries the logits and key rstd
    if kernel == "merge_fwd":
        return Traffic(b + src + y + small, 2 * b + (3 if has_q else 2) * src + y + small)
    if kernel == "merge_bwd":
        g, y32 = _BYTES[out] * N * D, f32 * N * D  # dL/dy in y's dtype; y in fp32
        return Traffic(g + y32 + src + b + grads + small, 3 * (g + y32) + (2 if has_q else 1) * src + b + grads + small)
    raise ValueError(f"unknown kernel {kernel!r}")


def kernel_calls_of(call) -> list[tuple[str, dict[str, Any]]]:
    """The two kernels (forward, backward) of an experiments.bench.triton_aot.OpCall, with call_bytes' keywords."""
    if call.op == "attend":
        return [("attend_fwd", {}), ("attend_bwd", {})]
    kw = {"has_q": call.has_q, "out": call.out, "base": call.base}
    return [("merge_fwd", kw), ("merge_bwd", kw)]


def step_calls(n_layers: int, scheme: str, precision: str = "bf16-mixed", n_blocks: int = 8) -> Counter:
    """The depth-op calls of one training step of a model of ``n_layers`` with ``scheme`` ("block" with
    ``n_blocks`` blocks, or "full"), as a Counter of experiments.bench.triton_aot.OpCall."""
    from attnres import ModelConfig
    from experiments.bench.triton_aot import op_calls

    kw = SCHEMES[scheme] | ({"n_blocks": n_blocks} if scheme == "block" else {})
    config = ModelConfig(n_layers=n_layers, d_model=16, n_heads=1, **kw)  # type: ignore[arg-type]
    return Counter(op_calls(config, precision))


def step_bytes(calls: Counter, tokens: int, D: int) -> Traffic:
    """call_bytes summed over a step's calls, forward and backward."""
    minimum = passes = 0
    for call, count in calls.items():
        for kernel, kw in kernel_calls_of(call):
            t = call_bytes(kernel, tokens, D, call.sources, call.n, **kw)
            minimum += count * t.minimum
            passes += count * t.passes
    return Traffic(minimum, passes)


def peak_bandwidth(device) -> float | None:
    """The peak HBM bandwidth of a CUDA device by name (GPU_PEAK_BANDWIDTH), or None."""
    import torch

    name = torch.cuda.get_device_name(device)
    return next((v for k, v in GPU_PEAK_BANDWIDTH.items() if k in name), None)


def _inputs(call, tokens: int, D: int, device):
    import torch

    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    g = torch.Generator(device=device).manual_seed(0)

    def rows(dtype):
        return torch.randn(tokens, D, device=device, generator=g).to(dt[dtype])

    vs = [rows(s) for s in call.sources]
    q = torch.randn(max(call.n, 1), D, device=device, generator=g) * 0.1
    if call.op == "attend":
        return vs, q
    return rows(call.base), vs, q, dt[call.out]


def _time(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of fn() over ``repeats`` runs, CUDA events, after two warm-up runs."""
    import torch

    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def time_call(call, tokens: int, D: int, device, repeats: int = 10) -> dict[str, float]:
    """Seconds of the forward and the backward kernel of ``call`` (synthetic inputs; gradients written into fresh
    tensors), each with the table's launch (or the one attnres.triton_launch.forced sets)."""
    import torch

    from attnres import gpu_kernels as gk

    if call.op == "attend":
        vs, q = _inputs(call, tokens, D, device)
        outs, lse, logits, rstd = gk.attend(vs, q, 1e-6)
        grads = [torch.randn_like(o) for o in outs]
        targets = [torch.empty_like(v) for v in vs]
        fwd = lambda: gk.attend(vs, q, 1e-6)  # noqa: E731
        bwd = lambda: gk.attend_backward(vs, q, lse, logits, rstd, grads, lse, targets, [1] * len(vs))  # noqa: E731
    else:
        base, vs, q, out_dtype = _inputs(call, tokens, D, device)
        K = len(vs)
        z = torch.zeros(K, tokens, device=device) if K else None
        queries = q[:K] if call.has_q and K else None
        y, y32, a, rstd, logits, key_rstd = gk.merge(base, z, vs, queries, 1e-6, 1e-6, out_dtype)
        gy = torch.randn_like(y)
        y_saved = y32 if out_dtype != torch.float32 else y
        targets = [torch.empty_like(v) for v in vs]
        fwd = lambda: gk.merge(base, z, vs, queries, 1e-6, 1e-6, out_dtype)  # noqa: E731
        bwd = lambda: gk.merge_backward(  # noqa: E731
            gy, y_saved, a, rstd, vs, queries, logits, key_rstd, base.dtype, targets, [1] * K
        )
    return {"fwd_s": _time(fwd, repeats), "bwd_s": _time(bwd, repeats)}


def measure(size, device, precision: str = "bf16-mixed", log: Callable[[str], None] = print) -> dict[str, Any]:
    """Per scheme: every distinct depth-op call of a training step of ``size`` (a bench.shapes.BenchSize) timed
    (forward and backward kernel), its minimum bytes and achieved GB/s, and the step's depth ops in total."""
    peak = peak_bandwidth(device)
    tokens, D = size.batch_size * size.seq_len, size.d_model
    out: dict[str, Any] = {"peak_bandwidth": peak, "tokens": tokens, "D": D, "precision": precision, "schemes": {}}
    for scheme in SCHEMES:
        calls = step_calls(size.n_layers, scheme, precision, size.n_blocks)
        rows, total_s = [], 0.0
        for call, count in sorted(calls.items(), key=lambda kv: (kv[0].op, len(kv[0].sources), kv[0].n)):
            t = time_call(call, tokens, D, device)
            for (kernel, kw), seconds in zip(kernel_calls_of(call), (t["fwd_s"], t["bwd_s"])):
                b = call_bytes(kernel, tokens, D, call.sources, call.n, **kw)
                rows.append(
                    {"kernel": kernel, "S": len(call.sources), "n": call.n, "count": count, "seconds": seconds}
                    | asdict(b)
                    | {"gbps": b.minimum / seconds / 1e9, "of_peak": b.minimum / seconds / peak if peak else None}
                )
                total_s += count * seconds
        step = step_bytes(calls, tokens, D)
        out["schemes"][scheme] = {
            "calls": rows,
            "step_seconds": total_s,
            "step_minimum_bytes": step.minimum,
            "step_gbps": step.minimum / total_s / 1e9 if total_s else None,
            "roofline_seconds": step.minimum / peak if peak else None,
        }
    print_measure(size.name, out, log)
    return out


def print_measure(name: str, res: dict[str, Any], log: Callable[[str], None] = print) -> None:
    peak = res["peak_bandwidth"]
    peak_tb = f"{peak / 1e12:.2f} TB/s" if peak else "unknown"
    log(f"  depth kernels at {name} ({res['tokens']} tokens, D {res['D']}, {res['precision']}; peak {peak_tb}):")
    log("    time, minimum bytes, achieved GB/s (% of peak)")
    for scheme, r in res["schemes"].items():
        for c in r["calls"]:
            pct = f"{100 * c['of_peak']:5.1f}%" if c["of_peak"] is not None else "    -"
            log(
                f"    {scheme:5s} {c['kernel']:10s} S {c['S']:2d} n {c['n']:2d} x{c['count']:<2d} "
                f"{1e3 * c['seconds']:8.3f} ms {c['minimum'] / 1e6:9.1f} MB {c['gbps']:7.0f} GB/s {pct}"
            )
        roof = r["roofline_seconds"]
        log(
            f"    {scheme:5s} one step's depth ops: {1e3 * r['step_seconds']:.1f} ms, "
            f"{r['step_minimum_bytes'] / 1e9:.2f} GB minimum, {r['step_gbps'] or 0:.0f} GB/s"
            + (f" (roofline {1e3 * roof:.1f} ms)" if roof else "")
        )


def tune(sizes, device, path: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Time every attnres.triton_launch candidate for each kernel key the sizes' steps use (at each size's D, the
    largest S of the key) and write the fastest per key (with D) to ``path``: a table for ATTNRES_TRITON_LAUNCH.
    Deterministic in use: a run reads the same file, so it launches the same tiles."""
    import torch
    import triton

    from attnres import triton_launch as tl_

    best: dict[str, tl_.Tile] = {}
    for size in sizes:
        tokens, D = size.batch_size * size.seq_len, size.d_model
        calls: dict[tuple, Any] = {}
        for scheme in SCHEMES:
            for call in step_calls(size.n_layers, scheme, n_blocks=size.n_blocks):
                k = (call.op, call.n, call.has_q)
                if k not in calls or len(call.sources) > len(calls[k].sources):
                    calls[k] = call
        for call in calls.values():
            for i, (kernel, _kw) in enumerate(kernel_calls_of(call)):
                timed = []
                for cand in tl_.candidates(kernel):
                    with tl_.forced(cand):
                        seconds = time_call(call, tokens, D, device, repeats=5)["bwd_s" if i else "fwd_s"]
                    timed.append((seconds, cand))
                seconds, cand = min(timed, key=lambda t: t[0])
                k = tl_.key(kernel, call.n, call.has_q, D)
                best[k] = cand
                log(f"  {k}: {cand} {1e3 * seconds:.3f} ms (of {len(timed)})")
    meta = {"how": "experiments/depth_roofline.py --tune", "gpu": torch.cuda.get_device_name(device)}
    tl_.write_table(path, best, meta | {"triton": triton.__version__, "date": time.strftime("%Y-%m-%d")})
    log(f"wrote {path}")
    return {k: asdict(v) for k, v in best.items()}


def print_bytes(sizes, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """The analytic model alone (no GPU): a step's depth-op bytes per size and scheme, and the time at 4.8 TB/s."""
    out = []
    for size in sizes:
        tokens, D = size.batch_size * size.seq_len, size.d_model
        for scheme in SCHEMES:
            b = step_bytes(step_calls(size.n_layers, scheme, n_blocks=size.n_blocks), tokens, D)
            out.append({"size": size.name, "scheme": scheme, "tokens": tokens} | asdict(b))
            log(
                f"{size.name:11s} {scheme:5s} {tokens} tokens: {b.minimum / 1e9:6.2f} GB minimum, "
                f"{b.passes / 1e9:6.2f} GB with every pass from DRAM; {1e3 * b.minimum / 4.8e12:6.2f} ms at 4.8 TB/s"
            )
    return out


def main(argv: Sequence[str] | None = None) -> None:
    from .bench.shapes import resolve_size

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="paper_194m,paper_296m,paper_528m", help="comma-separated conf/size names")
    p.add_argument("--device", default="cpu", help="cpu (bytes only) | cuda (also time every kernel)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step (default 8: 8 x 8192 tokens)")
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "bf16-true", "fp32"])
    p.add_argument("--tune", help="CUDA: time the launch candidates and write the fastest to this JSON table")
    p.add_argument("--out", help="write the results to this JSON file")
    args = p.parse_args(argv)
    sizes = [resolve_size(n.strip(), args.batch_size, args.seq_len) for n in args.sizes.split(",") if n.strip()]
    res: dict[str, Any] = {"bytes": print_bytes(sizes)}
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no CUDA device")
        device = torch.device("cuda")
        if args.tune:
            res["tune"] = tune(sizes, device, args.tune)
        res["measured"] = [measure(s, device, args.precision) for s in sizes]
    elif args.tune:
        raise SystemExit("--tune times kernels: it needs --device cuda")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
