"""The GEMM floor of a training step (:func:`gemm_floor`): every aten mm/addmm/bmm/baddbmm of one eager training
step recorded (:func:`record_matmuls`) and each timed alone (:func:`time_floor`), and the machine's large-matmul
peak (:func:`matmul_peak`). Why and how: experiments/bench/ladder.py's docstring, docs/performance.md.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

_MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm")


@dataclass(frozen=True)
class MatmulCall:
    """One distinct matmul of a training step: the aten op, its tensor arguments' shapes and strides, the dtype,
    how often the step ran it, and its FLOPs per call (2 x the multiply-adds)."""

    op: str
    shapes: tuple[tuple[int, ...], ...]
    strides: tuple[tuple[int, ...], ...]
    dtype: str
    count: int

    @property
    def flops(self) -> int:
        a, b = self.shapes[-2], self.shapes[-1]  # (bias,) a, b
        if self.op in ("mm", "addmm"):
            return 2 * a[0] * a[1] * b[1]
        return 2 * a[0] * a[1] * a[2] * b[2]


def record_matmuls(model_config: Any, batch_size: int, seq_len: int, seed: int = 0) -> list[MatmulCall]:
    """Every matmul of one eager training step (forward, cross-entropy, backward) of ``model_config`` on a random
    ``[batch_size, seq_len]`` batch, SDPA on its math backend; distinct calls with their counts, in first-call
    order."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils._python_dispatch import TorchDispatchMode

    from attnres import Transformer

    aten = torch.ops.aten
    packets = {getattr(aten, n): n for n in _MATMUL_OPS}
    seen: Counter[tuple[str, tuple, tuple, str]] = Counter()

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            name = packets.get(func.overloadpacket)
            if name is not None:
                ts = [a for a in args if isinstance(a, torch.Tensor)]
                key = (
                    name,
                    tuple(tuple(t.shape) for t in ts),
                    tuple(tuple(t.stride()) for t in ts),
                    str(ts[0].dtype).removeprefix("torch."),
                )
                seen[key] += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(seed)
    model = Transformer(model_config)
    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, model_config.vocab_size, (batch_size, seq_len + 1), generator=g)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    with Recorder(), sdpa_kernel(SDPBackend.MATH):
        _, loss = model(x, y)
        loss.backward()
    return [MatmulCall(op, shapes, strides, dtype, n) for (op, shapes, strides, dtype), n in seen.items()]


def _operand(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """A random tensor of ``shape`` with ``stride`` where that is a dense layout (a transposed view), else
    contiguous."""
    t = torch.empty_strided(shape, stride, dtype=dtype)
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():  # broadcast or overlapping: dense instead
        t = torch.empty(shape, dtype=dtype)
    return t.normal_(generator=g)


def time_call(fn: Callable[[], Any], repeats: int = 7, min_batch_s: float = 2e-3) -> float:
    """Median CPU seconds (this process's, ``time.process_time``: what a loaded machine does not inflate) per call of
    ``fn``: calls batched to at least ``min_batch_s``, ``repeats`` batches."""
    clock = time.process_time
    fn()
    n, t = 1, 0.0
    while True:
        t0 = clock()
        for _ in range(n):
            fn()
        t = clock() - t0
        if t >= min_batch_s or n >= 1 << 16:
            break
        n *= 2
    times = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(n):
            fn()
        times.append((clock() - t0) / n)
    return statistics.median(times)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def time_matmul(call: MatmulCall, repeats: int = 7, seed: int = 0) -> float:
    """Seconds per call of ``call``'s matmul alone (torch.mm / addmm / bmm / baddbmm on random operands of its
    shapes and strides), in the calling thread's torch thread count."""
    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, call.dtype)
    ts = [_operand(s, st, dtype, g) for s, st in zip(call.shapes, call.strides)]
    fn = getattr(torch, call.op)
    return time_call(lambda: fn(*ts), repeats=repeats)


def time_floor(calls: Sequence[MatmulCall], repeats: int = 7, threads: int = 1, seed: int = 0) -> dict[str, Any]:
    """``calls`` timed alone (:func:`time_matmul`) on ``threads`` threads and summed with their counts: ``floor_s``,
    the FLOPs and GFLOP/s of them, ``attention_share`` (the bmm's part of the floor) and the per-call table."""
    rows = []
    with torch_threads(threads):
        for c in calls:
            s = time_matmul(c, repeats=repeats, seed=seed)
            rows.append({**asdict(c), "flops": c.flops, "s_per_call": s, "s_total": s * c.count})
    floor = sum(r["s_total"] for r in rows)
    flops = sum(r["flops"] * r["count"] for r in rows)
    attn = sum(r["s_total"] for r in rows if r["op"] in ("bmm", "baddbmm"))
    return {
        "floor_s": floor,
        "flops": flops,
        "gflop_per_s": flops / floor / 1e9 if floor else None,
        "calls": sum(r["count"] for r in rows),
        "attention_share": attn / floor if floor else None,
        "threads": threads,
        "matmuls": rows,
    }


def gemm_floor(
    model_config: Any, batch_size: int, seq_len: int, repeats: int = 7, threads: int = 1, seed: int = 0
) -> dict[str, Any]:
    """The GEMM floor of one training step of ``model_config`` on ``[batch_size, seq_len]`` batches (module
    docstring): :func:`record_matmuls`, then :func:`time_floor`. ``floor_s`` is in CPU seconds."""
    return time_floor(record_matmuls(model_config, batch_size, seq_len, seed), repeats, threads, seed)


def matmul_peak(n: int = 512, repeats: int = 9, threads: int = 1) -> dict[str, Any]:
    """The machine's large-matmul rate: an n^3 fp32 torch.mm on ``threads`` threads (median CPU time of
    ``repeats`` batches)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    with torch_threads(threads):
        s = time_call(lambda: torch.mm(a, b), repeats=repeats, min_batch_s=2e-2)
    return {"n": n, "threads": threads, "s": s, "gflop_per_s": 2 * n**3 / s / 1e9}
