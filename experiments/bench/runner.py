"""One benchmark variant ready to time (:class:`Runner`: a model, its optimizer, a fixed batch and the variant's
settings), and the interleaved timing of several (:func:`time_round_robin`). No torch at import."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .machine_load import CoreMonitor
from .shapes import BenchSize


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
    _step: Any = field(default=None, repr=False)  # the TrainStep, made at the first train_step

    def context(self) -> contextlib.ExitStack:
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

    def _backward_context(self) -> contextlib.AbstractContextManager[Any]:
        from attnres import cpu_kernels

        return cpu_kernels.use_kernels(self.cpu_kernels)  # backward chooses the kernels per call too (not autocast)

    def train_step(self) -> float:
        """One training step on the fixed batch: experiments.training.train_step.TrainStep (the trainer's step: forward,
        loss and its divergence check, backward, optimizer step, zero_grad; no clipping, no scheduler)."""
        if self._step is None:
            from ..training.train_step import TrainStep

            self._step = TrainStep(
                self.model,
                self.forward,
                self.optimizer,
                forward_context=self.context,
                backward_context=self._backward_context,
            )
        return float(self._step(self.x, self.y))  # also a host sync, so the step is finished when timing stops

    def prefill(self) -> None:
        import torch

        with torch.inference_mode(), self.context():
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
        with torch.inference_mode(), self.context():
            cache = self.model.new_cache()
            token = self.model(prompt, cache=cache)[:, -1:].argmax(-1)  # [1, 1]
            for _ in range(n):
                sync(self.device)
                t0 = time.perf_counter()
                token = self.model(token, cache=cache)[:, -1:].argmax(-1)
                sync(self.device)
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
    optimizer_name: str = "adamw",
) -> Runner:
    """compile_model: None / False (eager), True or "whole" (torch.compile of the model), "regional"
    (Transformer.compile_regions). optimizer_name: "adamw" or "muon" (experiments.training.optim's, at their
    defaults)."""
    import torch

    from attnres import Transformer

    from ..training.optim import adamw, muon
    from ..training.train_step import train_forward

    torch.manual_seed(seed)
    model = Transformer(size.model_config(scheme)).to(device)
    if checkpointing:
        model.set_activation_checkpointing(True)
    optimizer = {"adamw": adamw, "muon": muon}[optimizer_name](model, lr=1e-4)
    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, size.vocab_size, (size.batch_size, size.seq_len + 1), generator=g)
    x, y = tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)
    mode = "whole" if compile_model is True else (compile_model or None)
    forward = train_forward(model, mode)  # as LMModule.setup builds its training forward
    return Runner(
        name or scheme, model, optimizer, x, y, torch.bfloat16 if bf16 else None, forward, device, sdpa, cpu_kernels
    )


def sync(device: Any) -> None:
    """Wait for the device's queued work (CUDA); a no-op on CPU."""
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
            sync(device)
            c0, t0 = time.process_time(), time.perf_counter()
            r.train_step()
            sync(device)
            step_wall[r.name] = time.perf_counter() - t0
            if rnd >= warmup:
                cpu[r.name].append(time.process_time() - c0)
        step_pre: dict[str, float] = {}
        if prefill:
            for r in order:
                sync(device)
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
