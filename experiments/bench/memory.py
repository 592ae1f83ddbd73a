"""Memory of a training step: bytes saved for backward (autograd's saved-tensor hooks), the peak of live tensors
(the profiler's allocation events; CUDA: max_memory_allocated), the peak RSS of a fresh process per scheme, and
the issue's allowance for Block AttnRes (:func:`block_memory_bound`). No torch at import."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

from .runner import Runner, build_runner
from .shapes import REPO, BenchSize


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

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), runner.context():
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
    """Peak CUDA memory of one training step (max_memory_allocated), absolute and over the memory before it."""
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
    """:func:`memory_child` of one scheme in a fresh process (``python -m experiments.bench --memory-child``)."""
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
    root = str(attnres_root())
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


def attnres_root() -> Path:
    import attnres

    return Path(attnres.__file__).resolve().parents[1]


def block_memory_bound(size: BenchSize, baseline_bytes: float, element_bytes: int) -> dict[str, float]:
    """The issue's allowance for Block AttnRes: (N+1) * B * T * d * bytes (the block sums b_0 .. b_N) plus 5% of
    the baseline's own figure."""
    from attnres import ModelConfig  # noqa: F401 - keeps the import error local to attnres

    n = size.model_config("block").effective_n_blocks
    blocks = (n + 1) * size.batch_size * size.seq_len * size.d_model * element_bytes
    return {"n_blocks": n, "block_sums_bytes": blocks, "limit_extra_bytes": blocks + 0.05 * baseline_bytes}
