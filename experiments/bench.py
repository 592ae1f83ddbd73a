"""Speed and memory of the residual schemes, each as a ratio to the baseline measured in the same run.

    python -m experiments.bench                       # CPU, ~4 min: the 16 x 256 target size and cpu_xl
    python -m experiments.bench --quick               # <= 30 s smoke of every section (tests/test_bench.py)
    python -m experiments.bench --options             # also eager vs torch.compile / bf16 / checkpointing
    python -m experiments.bench --device cuda --sizes paper_194m --bf16 --sdpa flash   # scripts/gpu_bench.sh
    python -m experiments.bench ... --compile regional --decode-tokens 32             # scripts/gpu_suite.sh
    python -m experiments.bench --ladder              # CPU ladder: eager vs compiled real runs (bench_ladder.py)

Per size, for each residual scheme (baseline, full, block by default):
  * training step time (forward + backward + AdamW step + zero_grad), tokens/s, achieved FLOP/s
    (attnres.flops_per_token x tokens / time) and MFU where the peak is known (--peak-flops, or a known GPU);
  * inference (prefill) time: one forward of the whole context under torch.inference_mode, logits only;
  * with --decode-tokens n: decode latency, the median time per token of n single-token forwards with a KV cache
    (batch 1) after a prefill of the rest of the context;
  * with --compile: the first training step of each model (compilation included) before the timed rounds;
  * memory: (a) bytes saved for backward, counted with torch.autograd.graph.saved_tensors_hooks as the unique
    storages that are not parameters - deterministic, and directly comparable with the (N+1)*B*T*d*bytes of
    Block AttnRes' block sums; (b) peak memory of a training step: on CPU the peak of the bytes of live tensors
    allocated in the step (the profiler's allocation events; deterministic) and the peak RSS of a fresh
    subprocess per scheme minus its RSS before the step (what the OS sees; moves with the C allocator), on CUDA
    torch.cuda.max_memory_allocated minus the memory allocated before the step.
Timing is interleaved: every round runs one step of every scheme (the order rotates by one each round), so
all schemes see the same machine; each scheme's ratio is computed per round against that round's baseline
step and summarised by the median and the interquartile range over rounds. On CPU every round also records
``other_cores_busy``: cores used by *other* processes during the round (from /proc/stat minus this process),
because on a shared 2-core machine a busy neighbour slows a 2-thread step several times over.

The harness section (experiments.bench_harness) times optimizer steps of ``experiments.train`` (Lightning)
against a plain PyTorch loop doing the same work on the same model and data, so Lightning's overhead is a
number. Results go to one JSON file (--out); the printout shows every ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .bench_common import BUILTIN, REPO, TARGET, TINY, BenchSize, CoreMonitor, resolve_size, summarize

SCHEMA_VERSION = 1
DEFAULT_OUT = Path("reports") / "bench" / "bench.json"

# Dense bf16 tensor-core peaks (FLOP/s) by GPU name fragment; MFU is reported against these when on CUDA.
GPU_PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}

SCHEMES = ("baseline", "full", "block")


# ---------------------------------------------------------------------------------------------------------
# Running one scheme


@dataclass
class Runner:
    """One model + optimizer + fixed batch, with the settings of a benchmark variant."""

    name: str
    model: Any
    optimizer: Any
    x: Any
    y: Any
    amp_dtype: Any
    forward: Callable
    device: Any
    sdpa: str = "auto"
    cpu_kernels: bool | None = None  # False: the depth mixing's torch path where the CPU kernels apply; None: as
    # ATTNRES_CPU_KERNELS says (attnres/cpu_kernels.py)
    times: dict[str, list[float]] = field(default_factory=dict)

    def _context(self):
        import torch

        from attnres import cpu_kernels

        stack = contextlib.ExitStack()
        stack.enter_context(cpu_kernels.use_kernels(self.cpu_kernels))
        if self.amp_dtype is not None:
            stack.enter_context(torch.autocast(self.device.type, dtype=self.amp_dtype))
        if self.sdpa != "auto":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            backend = {
                "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "math": SDPBackend.MATH,
            }[self.sdpa]
            stack.enter_context(sdpa_kernel(backend))
        return stack

    def train_step(self) -> float:
        from attnres import cpu_kernels

        with self._context():
            _, loss = self.forward(self.x, self.y)
        with cpu_kernels.use_kernels(self.cpu_kernels):  # backward chooses the kernels per call too (not autocast)
            loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())  # also a host sync, so the step is finished when timing stops

    def prefill(self) -> None:
        import torch

        with torch.inference_mode(), self._context():
            logits = self.model(self.x)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        del logits

    def decode(self, n: int) -> float:
        """Median seconds per token of n greedy single-token forwards with a KV cache, batch 1, after a prefill of
        the first seq_len - n tokens (untimed). The model runs eagerly (regional compilation is not used with a
        cache; a whole-model compile is not called)."""
        import torch

        prompt = self.x[:1, : self.x.shape[1] - n]
        times = []
        with torch.inference_mode(), self._context():
            cache = self.model.new_cache()
            token = self.model(prompt, cache=cache)[:, -1:].argmax(-1)  # [1, 1]
            for _ in range(n):
                _sync(self.device)
                t0 = time.perf_counter()
                token = self.model(token, cache=cache)[:, -1:].argmax(-1)
                _sync(self.device)
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


def build_runner(
    size: BenchSize,
    scheme: str,
    device: Any,
    seed: int,
    bf16: bool,
    compile_model: bool | str | None,
    checkpointing: bool,
    sdpa: str,
    name: str | None = None,
    cpu_kernels: bool | None = None,
) -> Runner:
    """compile_model: None / False (eager), True or "whole" (torch.compile of the model), "regional"
    (Transformer.compile_regions)."""
    import torch

    from attnres import Transformer

    from .optim import adamw

    torch.manual_seed(seed)
    model = Transformer(size.model_config(scheme)).to(device)
    if checkpointing:
        model.set_activation_checkpointing(True)
    optimizer = adamw(model, lr=1e-4)
    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, size.vocab_size, (size.batch_size, size.seq_len + 1), generator=g)
    x, y = tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)
    forward = model
    if compile_model == "regional":
        model.compile_regions()
    elif compile_model:
        forward = torch.compile(model)
    return Runner(
        name or scheme, model, optimizer, x, y, torch.bfloat16 if bf16 else None, forward, device, sdpa, cpu_kernels
    )


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def time_round_robin(
    runners: Sequence[Runner],
    warmup: int,
    repeats: int,
    device: Any,
    prefill: bool = True,
    log: Callable[[str], None] = print,
    quiet_wait_s: float = 0.0,
    decode_tokens: int = 0,
) -> dict[str, Any]:
    """Round r runs one training step of every runner (order rotated by r), then one prefill of every runner,
    then (decode_tokens > 0) one decode measurement of every runner. The first `warmup` rounds are not recorded.
    With `quiet_wait_s` > 0 each round first waits (up to that long) for the other processes on the machine to go
    quiet. Returns per-runner samples and per-round load."""
    monitor = CoreMonitor()
    wall: dict[str, list[float]] = {r.name: [] for r in runners}
    cpu: dict[str, list[float]] = {r.name: [] for r in runners}
    pre: dict[str, list[float]] = {r.name: [] for r in runners}
    dec: dict[str, list[float]] = {r.name: [] for r in runners}
    busy: list[float | None] = []
    for rnd in range(warmup + repeats):
        k = rnd % len(runners)
        order = list(runners[k:]) + list(runners[:k])
        monitor.wait_quiet(quiet_wait_s)
        monitor.start()
        step_wall: dict[str, float] = {}
        for r in order:
            _sync(device)
            c0, t0 = time.process_time(), time.perf_counter()
            r.train_step()
            _sync(device)
            step_wall[r.name] = time.perf_counter() - t0
            if rnd >= warmup:
                cpu[r.name].append(time.process_time() - c0)
        step_pre: dict[str, float] = {}
        if prefill:
            for r in order:
                _sync(device)
                t0 = time.perf_counter()
                r.prefill()
                step_pre[r.name] = time.perf_counter() - t0
        step_dec = {r.name: r.decode(decode_tokens) for r in order} if decode_tokens else {}
        load = monitor.stop()
        tag = "warm-up" if rnd < warmup else f"round {rnd - warmup + 1}/{repeats}"
        log(
            f"  {tag}: "
            + "  ".join(f"{n} {t:.3f}s" for n, t in step_wall.items())
            + (f"  (other cores busy {load:.2f})" if load is not None else "")
        )
        if rnd >= warmup:
            for n in step_wall:
                wall[n].append(step_wall[n])
                if prefill:
                    pre[n].append(step_pre[n])
                if decode_tokens:
                    dec[n].append(step_dec[n])
            busy.append(load)
    return {"train_s": wall, "train_cpu_s": cpu, "prefill_s": pre, "decode_token_s": dec, "other_cores_busy": busy}


def paired_ratios(samples: dict[str, list[float]], reference: str) -> dict[str, dict[str, Any]]:
    """Per round: sample / reference's sample of the same round; summarised over rounds."""
    ref = samples[reference]
    return {n: summarize([a / b for a, b in zip(v, ref)]) for n, v in samples.items() if v and ref}


# ---------------------------------------------------------------------------------------------------------
# Memory


def saved_activation_bytes(runner: Runner) -> int:
    """Bytes held for backward by one training forward: unique storages packed by autograd, parameters excluded.
    Views of one storage count once, at the storage's full size (that is what stays alive)."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in runner.model.parameters()}
    seen: dict[tuple[str, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # e.g. sparse/nested: count the tensor itself
            seen[(str(t.device), id(t))] = t.numel() * t.element_size()
            return t
        if s.data_ptr() not in params:
            seen[(str(t.device), s.data_ptr())] = max(s.nbytes(), seen.get((str(t.device), s.data_ptr()), 0))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), runner._context():
        _, loss = runner.model(runner.x, runner.y)  # eager model: compiled graphs save through their own path
    loss.backward()
    runner.optimizer.zero_grad(set_to_none=True)
    return int(sum(seen.values()))


def peak_tensor_step_bytes(runner: Runner) -> int | None:
    """Peak, during one training step, of the bytes held by the tensors allocated in that step: the profiler's
    allocation and free events (``profile_memory``) summed in time order. Deterministic, unlike peak RSS, which
    depends on when the C allocator returns freed memory to the OS and takes it back (it moved by +-10 x B*T*d
    between identical runs at 16 x 256). CPU tensors only; None if this PyTorch's profiler exposes no events.
    Like cuda_peak_step_bytes, it measures the next step of a warmed-up runner (optimizer state already made)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        runner.train_step()
    try:
        events = [
            e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and "CPU" in str(e.device_type())
        ]
    except AttributeError:
        return None
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()  # negative for a free
        peak = max(peak, live)
    return peak if events else None


def cuda_peak_step_bytes(runner: Runner) -> dict[str, int]:
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    runner.train_step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return {"peak_bytes": int(peak), "peak_step_bytes": int(peak - before)}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> bool:
    """Return freed heap memory to the OS (glibc malloc_trim) and reset the peak-RSS mark (VmHWM) of this process
    (Linux >= 4.0: write 5 to /proc/self/clear_refs). False where the reset is unavailable."""
    import ctypes
    import ctypes.util

    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def memory_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run in a fresh process: build one scheme, run one warm-up training step (AdamW state, thread pools and
    allocator caches come to exist), release freed heap memory, reset the peak-RSS mark, then measure the peak
    RSS of `steps` more steps against the RSS just before them."""
    import gc

    import torch

    torch.set_num_threads(int(spec["threads"]))
    size = BenchSize(**spec["size"])
    runner = build_runner(
        size,
        spec["scheme"],
        torch.device("cpu"),
        int(spec["seed"]),
        bool(spec["bf16"]),
        False,
        bool(spec["checkpointing"]),
        "auto",
    )
    runner.train_step()
    gc.collect()
    reset = _reset_peak_rss()
    before = _rss_bytes()
    for _ in range(int(spec["steps"])):
        runner.train_step()
    peak = _peak_rss_bytes()
    return {
        "scheme": spec["scheme"],
        "rss_before_bytes": before,
        "peak_rss_bytes": peak,
        "peak_step_bytes": peak - before,
        "peak_reset": reset,
    }


def cpu_peak_memory(
    size: BenchSize, scheme: str, threads: int, seed: int, bf16: bool, checkpointing: bool, steps: int = 1
) -> dict[str, Any]:
    spec = {
        "size": size.to_dict(),
        "scheme": scheme,
        "threads": threads,
        "seed": seed,
        "bf16": bf16,
        "checkpointing": checkpointing,
        "steps": steps,
    }
    # The child imports the same attnres as this process (e.g. a patched copy put first on PYTHONPATH).
    root = str(_attnres_root())
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "PYTHONPATH": os.pathsep.join([root, str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.bench", "--memory-child", json.dumps(spec)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory subprocess for {scheme} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _attnres_root() -> Path:
    import attnres

    return Path(attnres.__file__).resolve().parents[1]


def block_memory_bound(size: BenchSize, baseline_bytes: float, element_bytes: int) -> dict[str, float]:
    """The issue's allowance for Block AttnRes: (N+1) * B * T * d * bytes (the block sums b_0 .. b_N) plus 5% of
    the baseline's own figure."""
    from attnres import ModelConfig  # noqa: F401 - keeps the import error local to attnres

    n = size.model_config("block").effective_n_blocks
    blocks = (n + 1) * size.batch_size * size.seq_len * size.d_model * element_bytes
    return {"n_blocks": n, "block_sums_bytes": blocks, "limit_extra_bytes": blocks + 0.05 * baseline_bytes}


# ---------------------------------------------------------------------------------------------------------
# One size


def bench_size(
    size: BenchSize, schemes: Sequence[str], args: argparse.Namespace, device: Any, log: Callable[[str], None] = print
) -> dict[str, Any]:
    import torch

    from attnres import flops_per_token

    log(
        f"\n== {size.name}: L_b={size.n_layers} ({2 * size.n_layers} sublayers) d={size.d_model} "
        f"T={size.seq_len} B={size.batch_size} ({size.batch_size * size.seq_len} tokens/step), device {device}, "
        f"{torch.get_num_threads()} threads, {'bf16 autocast' if args.bf16 else 'fp32'}"
        f"{f', compiled ({args.compile})' if args.compile else ''}{', checkpointing' if args.checkpointing else ''}"
    )
    runners = [
        build_runner(size, s, device, args.seed, args.bf16, args.compile, args.checkpointing, args.sdpa)
        for s in schemes
    ]
    first_step: dict[str, float] = {}
    if args.compile:  # compilation, outside the timed rounds (regional: later models reuse the compiled sublayers)
        for r in runners:
            _sync(device)
            t0 = time.perf_counter()
            r.train_step()
            _sync(device)
            first_step[r.name] = time.perf_counter() - t0
            log(f"  first step (compiling) {r.name}: {first_step[r.name]:.1f} s")
    timing = time_round_robin(
        runners,
        args.warmup,
        args.repeats,
        device,
        prefill=not args.no_prefill,
        log=log,
        quiet_wait_s=args.quiet_wait,
        decode_tokens=args.decode_tokens,
    )
    tokens = size.batch_size * size.seq_len
    peak = args.peak_flops
    if peak is None and device.type == "cuda" and args.bf16:
        name = torch.cuda.get_device_name(device)
        peak = next((v for k, v in GPU_PEAK_BF16.items() if k in name), None)
    element_bytes = 2 if args.bf16 else 4

    per_scheme: dict[str, dict[str, Any]] = {}
    for r in runners:
        cfg = size.model_config(r.name)
        fpt = flops_per_token(cfg, size.seq_len).total
        step = summarize(timing["train_s"][r.name])
        med = step["median"]
        entry: dict[str, Any] = {
            "params": r.model.num_params(),
            "params_non_embedding": r.model.num_params(non_embedding=True),
            "flops_per_token": fpt,
            "train_step_s": step,
            "train_step_cpu_s": summarize(timing["train_cpu_s"][r.name]),
            "tokens_per_s": tokens / med if med else None,
            "flop_per_s": fpt * tokens / med if med else None,
            "mfu": fpt * tokens / med / peak if (med and peak) else None,
            "prefill_s": summarize(timing["prefill_s"][r.name]),
            "prefill_tokens_per_s": (
                tokens / statistics.median(timing["prefill_s"][r.name]) if timing["prefill_s"][r.name] else None
            ),
        }
        if args.decode_tokens:
            entry["decode_token_s"] = summarize(timing["decode_token_s"][r.name])
            entry["decode"] = {"tokens": args.decode_tokens, "batch": 1, "context": size.seq_len}
        if r.name in first_step:
            entry["first_step_s"] = first_step[r.name]
        if cfg.residual == "block":
            entry["n_blocks"] = cfg.effective_n_blocks
            entry["sublayers_per_block"] = cfg.sublayers_per_block
        per_scheme[r.name] = entry

    # Memory: saved activations in-process (deterministic), peak memory per scheme.
    if not args.no_memory:
        log("  memory: saved activations" + (", peak RSS in fresh subprocesses" if device.type == "cpu" else ""))
        for r in runners:
            if not args.compile:  # (compiled graphs save through their own path; the hooks do not see it)
                per_scheme[r.name]["saved_activation_bytes"] = saved_activation_bytes(r)
            if device.type == "cuda":
                per_scheme[r.name].update(cuda_peak_step_bytes(r))
            elif not args.compile:  # (compiled graphs allocate through their own path)
                per_scheme[r.name]["peak_tensor_step_bytes"] = peak_tensor_step_bytes(r)
        if device.type == "cpu":
            for r in runners:
                m = cpu_peak_memory(size, r.name, torch.get_num_threads(), args.seed, args.bf16, args.checkpointing)
                per_scheme[r.name].update(
                    rss_before_bytes=m["rss_before_bytes"],
                    peak_bytes=m["peak_rss_bytes"],
                    peak_step_bytes=m["peak_step_bytes"],
                )
    del runners

    base = "baseline" if "baseline" in per_scheme else None
    ratios: dict[str, dict[str, Any]] = {}
    if base:
        train_r = paired_ratios(timing["train_s"], base)
        cpu_r = paired_ratios(timing["train_cpu_s"], base)
        pre_r = paired_ratios(timing["prefill_s"], base) if not args.no_prefill else {}
        dec_r = paired_ratios(timing["decode_token_s"], base) if args.decode_tokens else {}
        for n, e in per_scheme.items():
            rr: dict[str, Any] = {
                "train_step": train_r.get(n),
                "train_step_cpu": cpu_r.get(n),
                "prefill": pre_r.get(n),
                "decode": dec_r.get(n),
            }
            for key in ("saved_activation_bytes", "peak_tensor_step_bytes", "peak_bytes", "peak_step_bytes"):
                if key in e and per_scheme[base].get(key):
                    rr[key] = e[key] / per_scheme[base][key]
            ratios[n] = rr

    checks = _checks(size, per_scheme, ratios, element_bytes, args, device.type)
    busy = [b for b in timing["other_cores_busy"] if b is not None]
    return {
        "size": size.to_dict(),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "tokens_per_step": tokens,
        "peak_flops": peak,
        "schemes": per_scheme,
        "ratios": ratios,
        "other_cores_busy": summarize(busy) if busy else None,
        "checks": checks,
    }


def _checks(
    size: BenchSize,
    per_scheme: dict[str, Any],
    ratios: dict[str, Any],
    element_bytes: int,
    args: argparse.Namespace,
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


# ---------------------------------------------------------------------------------------------------------
# Options: eager vs torch.compile / bf16 autocast / activation checkpointing, per scheme


OPTION_VARIANTS = {
    "eager": {},
    "compile": {"compile_model": True},
    "compile-regional": {"compile_model": "regional"},
    "bf16": {"bf16": True},
    "compile+bf16": {"compile_model": True, "bf16": True},
    "checkpointing": {"checkpointing": True},
    "torch-path": {"cpu_kernels": False},  # eager without the compiled CPU depth-mixing kernels (cpu_kernels.py)
}


def bench_options(
    size: BenchSize,
    schemes: Sequence[str],
    variants: Sequence[str],
    args: argparse.Namespace,
    device: Any,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Step time of every (scheme, option) pair, interleaved; ratios to the same scheme's eager fp32 step and
    to the baseline under the same option."""
    import torch

    log(f"\n== options at {size.name}: {', '.join(variants)} x {', '.join(schemes)}")
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
                    args.seed,
                    kw["bf16"],
                    kw["compile_model"],
                    kw["checkpointing"],
                    args.sdpa,
                    name=f"{s}/{v}",
                    cpu_kernels=kw["cpu_kernels"],
                )
            )
    compile_s: dict[str, float] = {}
    for r in runners:  # first step (compilation) outside the timed rounds
        t0 = time.perf_counter()
        r.train_step()
        compile_s[r.name] = time.perf_counter() - t0
    timing = time_round_robin(
        runners, args.warmup, args.repeats, device, prefill=False, log=log, quiet_wait_s=args.quiet_wait
    )
    saved = {r.name: saved_activation_bytes(r) for r in runners if "compile" not in r.name}
    results: dict[str, Any] = {}
    for s in schemes:
        for v in variants:
            n = f"{s}/{v}"
            results[n] = {
                "train_step_s": summarize(timing["train_s"][n]),
                "first_step_s": compile_s[n],
                "vs_eager_same_scheme": summarize(
                    [a / b for a, b in zip(timing["train_s"][n], timing["train_s"][f"{s}/eager"])]
                ),
                "vs_baseline_same_option": (
                    summarize([a / b for a, b in zip(timing["train_s"][n], timing["train_s"][f"baseline/{v}"])])
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


# ---------------------------------------------------------------------------------------------------------
# Report


def _fmt_ratio(r: dict[str, Any] | None) -> str:
    if not r or r.get("median") is None:
        return "   -   "
    return f"{r['median']:.3f} [{r['q1']:.3f}, {r['q3']:.3f}]"


def print_size(res: dict[str, Any], log: Callable[[str], None] = print) -> None:
    name = res["size"]["name"]
    log(f"\n-- {name}: ratios to baseline (median [q1, q3] over rounds)")
    log(
        f"  {'scheme':10s} {'step s':>8s} {'tok/s':>9s} {'GFLOP/s':>8s} {'MFU':>6s}  {'train step':>24s}  "
        f"{'train CPU time':>24s}  {'prefill':>24s}  {'decode/token':>24s}  {'saved act.':>10s}  "
        f"{'peak tensors':>12s}  {'peak step':>9s}"
    )
    for n, e in res["schemes"].items():
        r = res["ratios"].get(n, {})
        mfu = f"{100 * e['mfu']:5.1f}%" if e.get("mfu") is not None else "   -  "
        gf = f"{e['flop_per_s'] / 1e9:8.1f}" if e.get("flop_per_s") else "       -"
        sab = f"{r['saved_activation_bytes']:10.3f}" if r.get("saved_activation_bytes") else "         -"
        psb = f"{r['peak_step_bytes']:9.3f}" if r.get("peak_step_bytes") else "        -"
        ptb = f"{r['peak_tensor_step_bytes']:12.3f}" if r.get("peak_tensor_step_bytes") else "           -"
        log(
            f"  {n:10s} {e['train_step_s']['median']:8.3f} {e['tokens_per_s']:9.0f} {gf} {mfu}  "
            f"{_fmt_ratio(r.get('train_step')):>24s}  {_fmt_ratio(r.get('train_step_cpu')):>24s}  "
            f"{_fmt_ratio(r.get('prefill')):>24s}  {_fmt_ratio(r.get('decode')):>24s}  {sab}  {ptb}  {psb}"
        )
    for n, e in res["schemes"].items():
        if "saved_activation_bytes" in e:
            extra = ""
            if e.get("peak_tensor_step_bytes"):
                extra += f", peak tensors in a step {e['peak_tensor_step_bytes'] / 2**20:.1f} MiB"
            if "peak_step_bytes" in e:
                extra += f", peak step {e['peak_step_bytes'] / 2**20:.1f} MiB (peak {e['peak_bytes'] / 2**20:.1f} MiB)"
            log(f"  {n:10s} saved for backward {e['saved_activation_bytes'] / 2**20:.1f} MiB{extra}")
    for n, e in res["schemes"].items():
        if "decode_token_s" in e or "first_step_s" in e:
            dec = f"decode {1e3 * e['decode_token_s']['median']:.2f} ms/token" if "decode_token_s" in e else ""
            first = f"first step {e['first_step_s']:.1f} s" if "first_step_s" in e else ""
            log(f"  {n:10s} {'  '.join(x for x in (dec, first) if x)}")
    if res.get("other_cores_busy"):
        b = res["other_cores_busy"]
        log(f"  other processes used {b['median']:.2f} cores (median over rounds; max {b['max']:.2f})")
    for c in res["checks"]:
        v, lim = c["value"], c["limit"]
        if "bytes" in c["name"] or "memory" in c["name"] or "activations" in c["name"]:
            vs = f"{v / 2**20:.1f} MiB ({c['extra_in_BTd']:.1f} x B*T*d) vs limit {lim / 2**20:.1f} MiB"
        else:
            vs = f"{v:.3f} vs {lim}"
        log(f"  [{'PASS' if c['pass'] else 'FAIL'}] {c['name']}: {vs}")


def print_options(res: dict[str, Any], log: Callable[[str], None] = print) -> None:
    log(f"\n-- options at {res['size']['name']} (step time; ratios median [q1, q3])")
    log(
        f"  {'scheme/option':24s} {'step s':>8s} {'first step s':>12s}  {'vs eager (same scheme)':>24s}  "
        f"{'vs baseline (same option)':>26s}  {'saved act. MiB':>14s}"
    )
    for n, e in res["results"].items():
        sab = f"{e['saved_activation_bytes'] / 2**20:14.1f}" if e.get("saved_activation_bytes") else "             -"
        log(
            f"  {n:24s} {e['train_step_s']['median']:8.3f} {e['first_step_s']:12.1f}  "
            f"{_fmt_ratio(e['vs_eager_same_scheme']):>24s}  {_fmt_ratio(e['vs_baseline_same_option']):>26s}  {sab}"
        )


# ---------------------------------------------------------------------------------------------------------
# CLI


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m experiments.bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--sizes",
        default=None,
        help=f"comma-separated sizes: {', '.join(BUILTIN)} or any conf/size/<name> "
        "(default: attnres16x256,cpu_xl; --quick: tiny)",
    )
    p.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated residual schemes (first: baseline)")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: per size)")
    p.add_argument("--seq-len", type=int, default=None, help="context (default: per size)")
    p.add_argument("--device", default="cpu", help="cpu | cuda (default: cpu)")
    p.add_argument("--threads", type=int, default=2, help="torch threads on CPU (default: 2, the target's)")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default: 7; --quick: 3)")
    p.add_argument("--warmup", type=int, default=None, help="untimed rounds first (default: 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each timed round, wait up to this long for other processes to use < 0.25 cores "
        "(shared machines; default 0: do not wait). The load of every round is recorded either way",
    )
    p.add_argument("--bf16", action="store_true", help="torch.autocast to bfloat16 (the GPU default)")
    p.add_argument(
        "--compile",
        nargs="?",
        const="whole",
        default=None,
        choices=("whole", "regional"),
        help="torch.compile every model: whole (the default of a bare --compile) or regional "
        "(Transformer.compile_regions); the first step of each is timed apart",
    )
    p.add_argument(
        "--decode-tokens",
        type=int,
        default=None,
        help="decode latency: time this many single-token forwards with a KV cache per round "
        "(default 0: off; --quick: 4)",
    )
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing of every sublayer")
    p.add_argument(
        "--sdpa",
        default="auto",
        choices=("auto", "flash", "efficient", "math"),
        help="force one scaled_dot_product_attention backend (CUDA: flash)",
    )
    p.add_argument(
        "--peak-flops",
        type=float,
        default=None,
        help="peak FLOP/s for MFU (default: known GPUs' dense bf16 peak, e.g. H200 989e12; CPU: none)",
    )
    p.add_argument("--no-prefill", action="store_true", help="skip inference (prefill) timing")
    p.add_argument("--no-memory", action="store_true", help="skip the memory measurements")
    p.add_argument(
        "--options",
        action="store_true",
        help="also time eager vs compile / bf16 / compile+bf16 / checkpointing at the first size",
    )
    p.add_argument("--option-variants", default=",".join(OPTION_VARIANTS), help="which --options variants")
    p.add_argument(
        "--harness",
        choices=("on", "off"),
        default="on",
        help="time experiments.train (Lightning) against a plain loop (default: on, at the first size)",
    )
    p.add_argument("--harness-sizes", default=None, help="sizes for the harness comparison (default: the sizes)")
    p.add_argument(
        "--harness-steps",
        type=int,
        default=None,
        help="optimizer steps per harness/plain run (default: enough for ~6 s per run, 6 to 40)",
    )
    p.add_argument("--harness-rounds", type=int, default=None, help="alternations of harness and plain runs")
    p.add_argument(
        "--harness-logger",
        default="none",
        choices=("none", "csv", "wandb"),
        help="logger of the timed harness runs (default: none; the run's own metrics.csv is always on)",
    )
    p.add_argument(
        "--ladder",
        action="store_true",
        help="the CPU ladder's eager and compiled training paths side by side, real experiments.train runs "
        "(experiments/bench_ladder.py; this section only: the others are skipped)",
    )
    p.add_argument("--ladder-sizes", default="cpu_xs,cpu_s,cpu_m,cpu_l", help="ladder sizes (conf/size/)")
    p.add_argument(
        "--ladder-schemes", default="baseline,block_attnres,full_attnres", help="arms (conf/model/; first: reference)"
    )
    p.add_argument("--ladder-paths", default="eager,compiled", help="training paths (conf/train_path/)")
    p.add_argument(
        "--ladder-fraction", type=float, default=1.0, help="train.tokens x this (default 1.0: the real runs)"
    )
    p.add_argument(
        "--ladder-seeds",
        type=int,
        default=2,
        help="rounds per size, one seed each (round 0 compiles cold, later ones reuse the compiled code; default 2)",
    )
    p.add_argument(
        "--ladder-disk-warm",
        action="store_true",
        help="also one compiled run per (size, arm) in a new process with the warm inductor cache",
    )
    p.add_argument(
        "--ladder-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more Hydra override of every ladder run (repeatable; e.g. train.val_sequences=8 on a small corpus)",
    )
    p.add_argument("--data-cache", default=None, help="dataset cache dir for the harness (default: the project's)")
    p.add_argument("--data-max-bytes", type=int, default=None, help="stdlib slice for the harness (tests)")
    p.add_argument("--quick", action="store_true", help="<= 30 s smoke of every section on the tiny size")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"JSON output (default: {DEFAULT_OUT})")
    p.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes = args.sizes or TINY.name
        args.repeats = args.repeats or 3
        args.warmup = 1 if args.warmup is None else args.warmup
        args.harness_steps = args.harness_steps or 5
        args.harness_rounds = args.harness_rounds or 1
        args.decode_tokens = 4 if args.decode_tokens is None else args.decode_tokens
        if args.options:
            args.option_variants = (
                args.option_variants
                if args.option_variants != ",".join(OPTION_VARIANTS)
                else "eager,bf16,checkpointing"
            )
    args.sizes = args.sizes or f"{TARGET.name},cpu_xl"
    args.repeats = args.repeats or 7
    args.warmup = 1 if args.warmup is None else args.warmup
    args.harness_rounds = args.harness_rounds or 3
    args.decode_tokens = args.decode_tokens or 0
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    from attnres import RESIDUAL_SCHEMES

    bad = [s for s in schemes if s not in RESIDUAL_SCHEMES]
    if bad or not schemes:
        raise SystemExit(f"--schemes: unknown {bad}; allowed values: {', '.join(RESIDUAL_SCHEMES)}")
    args.schemes = schemes
    variants = [v.strip() for v in args.option_variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in OPTION_VARIANTS]
    if bad:
        raise SystemExit(f"--option-variants: unknown {bad}; allowed values: {', '.join(OPTION_VARIANTS)}")
    if "eager" not in variants:
        variants.insert(0, "eager")
    args.option_variants = variants
    for name in ("repeats", "harness_rounds", "threads"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    if args.decode_tokens < 0:
        raise SystemExit("--decode-tokens must be >= 0")
    if args.harness_steps is not None and args.harness_steps < 4:
        raise SystemExit("--harness-steps must be >= 4 (K steps give K - 1 timed gaps, the first two warm-up)")
    if args.device not in ("cpu", "cuda"):
        raise SystemExit(f"--device={args.device!r}; allowed values: cpu, cuda")
    _parse_ladder(args)
    return args


def _parse_ladder(args: argparse.Namespace) -> None:
    """--ladder-* as lists, each value checked against conf/."""
    for name, group in (("sizes", "size"), ("schemes", "model"), ("paths", "train_path")):
        values = [v.strip() for v in getattr(args, f"ladder_{name}").split(",") if v.strip()]
        allowed = sorted(p.stem for p in (REPO / "conf" / group).glob("*.yaml"))
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise SystemExit(f"--ladder-{name}: unknown {bad}; allowed values: {', '.join(allowed)}")
        setattr(args, f"ladder_{name}", values)
    if not args.ladder_fraction > 0:
        raise SystemExit("--ladder-fraction must be > 0")
    if args.ladder_seeds < 1:
        raise SystemExit("--ladder-seeds must be >= 1")


def environment(args: argparse.Namespace, device: Any) -> dict[str, Any]:
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
        "quick": bool(args.quick),
        "bf16": bool(args.bf16),
        "compile": args.compile or False,
        "checkpointing": bool(args.checkpointing),
        "decode_tokens": args.decode_tokens,
        "gpu_kernels": gpu_kernels.status(),
        "sdpa": args.sdpa,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "seed": args.seed,
        "quiet_wait_s": args.quiet_wait,
        "attnres_path": str(_attnres_root() / "attnres"),
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


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (use --device cpu)")
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    if args.compile:  # the harness section's training runs compile the same way (experiments.module.compile_mode)
        from .module import COMPILE_ENV

        os.environ[COMPILE_ENV] = args.compile
    t_start = time.perf_counter()
    sizes = [resolve_size(n.strip(), args.batch_size, args.seq_len) for n in args.sizes.split(",") if n.strip()]
    out: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "meta": environment(args, device),
        "sizes": [],
        "harness": None,
        "options": None,
        "ladder": None,
    }
    if args.ladder:  # this section alone (experiments/bench_ladder.py)
        from .bench_ladder import bench_ladder, print_ladder

        out["ladder"] = bench_ladder(args, log=log)
        print_ladder(out["ladder"], log=log)
        sizes, args.harness = [], "off"
    for size in sizes:
        res = bench_size(size, args.schemes, args, device, log=log)
        print_size(res, log=log)
        if device.type == "cuda":  # the depth kernels' time and achieved GB/s beside the steps (depth_roofline)
            from .depth_roofline import measure

            res["depth_roofline"] = measure(size, device, "bf16-mixed" if args.bf16 else "fp32", log=log)
        out["sizes"].append(res)
    if args.options and sizes:
        res = bench_options(sizes[0], args.schemes, args.option_variants, args, device, log=log)
        print_options(res, log=log)
        out["options"] = res
    if args.harness == "on":
        from .bench_harness import compare_harness, print_harness

        hsizes = (
            [resolve_size(n.strip(), args.batch_size, args.seq_len) for n in args.harness_sizes.split(",")]
            if args.harness_sizes
            else sizes
        )
        out["harness"] = []
        step_s = {
            r["size"]["name"]: r["schemes"].get("baseline", {}).get("train_step_s", {}).get("median")
            for r in out["sizes"]
        }
        for size in hsizes:
            steps = args.harness_steps
            if steps is None:  # ~6 s of timed steps per run, at least 6 steps, at most 40
                est = step_s.get(size.name)
                steps = min(40, max(6, math.ceil(6.0 / est))) if est else 6
            res = compare_harness(size, args, device, steps=steps, log=log)
            print_harness(res, log=log)
            out["harness"].append(res)
    out["meta"]["wall_time_s"] = time.perf_counter() - t_start
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    log(f"\nwrote {path} ({out['meta']['wall_time_s']:.0f} s)")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.memory_child is not None:
        print(json.dumps(memory_child(json.loads(args.memory_child))))
        return
    run(args)


if __name__ == "__main__":
    main()
