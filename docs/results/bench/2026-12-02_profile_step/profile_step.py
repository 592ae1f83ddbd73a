"""Where a CPU ladder run's time goes, per training path: ``python scripts/profile_step.py`` (~4 min on one core).

Trains real ``experiments.train.train`` runs of the ladder (``experiment=cpu_ladder``, one thread, no logger, no
progress bar; evaluation and checkpoints as the ladder does them) at one size, for each arm on ``train_path=eager``
and ``train_path=compiled`` (the compiled one in a fresh, empty inductor cache, so its first step holds a cold
compile), with a Lightning profiler (:class:`PhaseProfiler`) that charges every profiled action's *exclusive* CPU
seconds (this process's, plus the finished child processes' such as the C++ compiler) to one part of the step:

    forward      [Strategy].training_step (the model's forward and the loss; compiled: the compiled forward graph)
    backward     [Strategy].backward (compiled: the compiled backward graph)
    grad stats   LMModule.on_before_optimizer_step (dead-gradient check at step 1, grad norms on the logged steps)
    clip         LMModule.configure_gradient_clipping (clip_grad_norm_)
    optimizer    LMModule.optimizer_step minus what it calls: the AdamW update, the scheduler-free closure glue
    lr schedule  LMModule.lr_scheduler_step
    zero_grad    LMModule.optimizer_zero_grad
    data         train_dataloader_next, batch transfer hooks (sampling a batch of TrainBatches)
    recorder     the RunRecorder callback's per-step hooks (metrics rows, loss read-back)
    other hooks  every other callback / module / strategy hook of a training step
    loop         run_training_batch / run_training_epoch minus what they call: Lightning's own loop
    eval         every action of a validation (in-loop evaluations and the final one)
    checkpoint   save_checkpoint and the ModelCheckpoint callbacks' hooks

and per run: ``setup`` (train() up to the first training batch: config checks, data, model, trainer, Lightning's
setup hooks, the first batch), ``first step`` (step 1's parts: on the compiled path the compilation), ``steps
2..n``, ``eval``, ``checkpoint`` and ``rest`` (what no profiled action holds: the end of fit, the final records).

Step 1 is reported apart (``first step``: on the compiled path it holds the compilation). The per-step table divides
the parts of steps 2 .. n by n - 1. Writes JSON (``--out``) and prints the Markdown tables of docs/performance.md,
"The compiled CPU step".

    python scripts/profile_step.py                               # cpu_s, baseline and block_attnres, both paths
    python scripts/profile_step.py --size cpu_xs --schemes baseline --fraction 0.1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import lightning.pytorch as pl  # noqa: E402 - after the thread setting
from lightning.pytorch.profilers import Profiler  # noqa: E402

PARTS = (
    "forward",
    "backward",
    "grad stats",
    "clip",
    "optimizer",
    "lr schedule",
    "zero_grad",
    "data",
    "recorder",
    "other hooks",
    "loop",
)
OPS_WINDOW = (31, 50)  # --ops: torch.profiler over these steps (1-based), left out of the phase figures
RUN_PARTS = ("setup", "first step", "steps 2..n", "eval", "checkpoint", "torch.profiler window", "rest")


def cpu_clock() -> float:
    """This process's CPU seconds (ns resolution) plus its finished children's (os.times: 10 ms ticks)."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def part_of(name: str) -> str:
    """The step part an action's exclusive time is charged to (module docstring); eval and checkpoint by name."""
    if "validation" in name or "val_next" in name or "_EvaluationLoop" in name:
        return "eval"
    if "save_checkpoint" in name or "ModelCheckpoint" in name or "on_save_checkpoint" in name:
        return "checkpoint"
    table = {
        "[Strategy]SingleDeviceStrategy.training_step": "forward",
        "[Strategy]SingleDeviceStrategy.backward": "backward",
        "[LightningModule]LMModule.on_before_optimizer_step": "grad stats",
        "[LightningModule]LMModule.configure_gradient_clipping": "clip",
        "[LightningModule]LMModule.optimizer_step": "optimizer",
        "[LightningModule]LMModule.lr_scheduler_step": "lr schedule",
        "[LightningModule]LMModule.optimizer_zero_grad": "zero_grad",
        "run_training_batch": "loop",
        "run_training_epoch": "loop",
    }
    if name in table:
        return table[name]
    if "train_dataloader_next" in name or "batch_transfer" in name or "batch_to_device" in name:
        return "data"
    if name.startswith("[Callback]RunRecorder"):
        return "recorder"
    return "other hooks"


class PhaseProfiler(Profiler):
    """Exclusive CPU seconds per step part (:func:`part_of`), for step 1 and for steps 2 .. n apart, and per run
    part; written as JSON to ``path`` at every teardown."""

    def __init__(self, path: str, skip_from: int = 0, skip_to: int = -1) -> None:
        super().__init__()
        self.path = Path(path)
        self.skip = (skip_from, skip_to)  # steps charged to ``window`` instead (the torch.profiler window of --ops)
        self.window: dict[str, float] = defaultdict(float)
        self.stack: list[list[Any]] = []  # [name, start, children's seconds]
        self.step = 0  # training batches started
        self.first: dict[str, float] = defaultdict(float)
        self.rest: dict[str, float] = defaultdict(float)
        self.before_first: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.t_step1: float | None = None

    def start(self, action_name: str) -> None:
        now = cpu_clock()
        if action_name == "run_training_batch":
            self.step += 1
            if self.step == 1:
                self.t_step1 = now
        self.stack.append([action_name, now, 0.0])

    def stop(self, action_name: str) -> None:
        now = cpu_clock()
        name, t0, children = self.stack.pop()
        assert name == action_name, (name, action_name)
        total = now - t0
        if self.stack:
            self.stack[-1][2] += total
        part = part_of(name)
        own = total - children
        self.counts[name] += 1
        if self.skip[0] <= self.step <= self.skip[1] or "OpWindow" in name:
            self.window[part] += own
        elif part in ("eval", "checkpoint"):
            self.rest[part] += own
        elif self.step == 0:
            self.before_first[part] += own
        elif self.step == 1:
            self.first[part] += own
        else:
            self.rest[part] += own

    def summary(self) -> str:
        return ""

    def teardown(self, stage: str | None = None) -> None:
        if not self.path.parent.is_dir():  # called again at garbage collection, after the run's directory went
            return super().teardown(stage)
        self.path.write_text(
            json.dumps(
                {
                    "steps": self.step,
                    "first": self.first,
                    "rest": self.rest,
                    "before_first": self.before_first,
                    "window": self.window,
                    "window_steps": max(0, self.skip[1] - self.skip[0] + 1),
                    "t_step1": self.t_step1,
                    "counts": self.counts,
                }
            )
        )
        super().teardown(stage)


class OpWindow(pl.Callback):
    """torch.profiler over training steps ``start`` .. ``stop`` - 1 (CPU activity); writes every op's self CPU
    time (us) and call count, summed over the window, to ``path``."""

    def __init__(self, path: str, start: int, stop: int) -> None:
        self.path, self.start, self.stop = Path(path), start, stop
        self.prof: Any = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        if batch_idx == self.start:
            self.prof = profile(activities=[ProfilerActivity.CPU])
            self.prof.__enter__()
        elif batch_idx == self.stop and self.prof is not None:
            self.prof.__exit__(None, None, None)
            ops = {e.key: [e.self_cpu_time_total, e.count] for e in self.prof.key_averages()}
            self.path.write_text(json.dumps({"steps": self.stop - self.start, "ops": ops}))
            self.prof = None


def op_share(ops: dict[str, list[float]], steps: int) -> dict[str, float]:
    """Self CPU ms per step of a torch.profiler window, in groups: GEMM (mm/addmm/bmm/baddbmm), attention (SDPA's
    fused CPU kernels), the rest of aten, and the compiled graphs' own code (the self time of the compiled regions:
    inductor's C++ kernels and their Python wrapper)."""
    out = {"GEMM": 0.0, "attention": 0.0, "other aten": 0.0, "compiled code": 0.0, "other": 0.0}
    for name, (self_us, _count) in ops.items():
        ms = self_us / 1e3 / steps
        if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"):
            out["GEMM"] += ms
        elif "scaled_dot_product" in name or "flash_attention" in name:
            out["attention"] += ms
        elif name.startswith("aten::"):
            out["other aten"] += ms
        elif "Compiled" in name or "compiled" in name or name.startswith(("Torch-Compiled", "##", "cpp_fused")):
            out["compiled code"] += ms
        else:
            out["other"] += ms
    return out


def profile_run(
    size: str, scheme: str, path: str, fraction: float, tmp: Path, data_cache: str | None, ops: bool
) -> dict:
    """One ladder run under :class:`PhaseProfiler` (and with ``ops`` a torch.profiler window over 20 steps); the
    compiled path compiles into a fresh inductor cache."""
    from experiments.bench import ladder as bl

    tag = f"{scheme}_{path}"
    prof, op_path = tmp / f"profile_{tag}.json", tmp / f"ops_{tag}.json"
    overrides = bl.ladder_overrides(
        size, scheme, path, 0, tmp / f"runs_{tag}", tmp / f"timer_{tag}.json", fraction, data_cache
    )
    overrides += ["+trainer.profiler._target_=__main__.PhaseProfiler", f"+trainer.profiler.path={prof}"]
    if ops:  # batches 30..49 (steps 31..50) under torch.profiler, kept out of the phase figures
        overrides += [
            "+callbacks.op_window._target_=__main__.OpWindow",
            f"+callbacks.op_window.path={op_path}",
            f"+callbacks.op_window.start={OPS_WINDOW[0] - 1}",
            f"+callbacks.op_window.stop={OPS_WINDOW[1]}",
            f"+trainer.profiler.skip_from={OPS_WINDOW[0]}",
            f"+trainer.profiler.skip_to={OPS_WINDOW[1]}",
        ]
    with bl.inductor_cache(tmp / f"inductor_{tag}", fresh=True):
        c0 = cpu_clock()
        run = bl.train_once(overrides, tmp / f"timer_{tag}.json")
    p = json.loads(prof.read_text())
    steps = int(p["steps"])
    timed = steps - 1 - int(p["window_steps"])  # steps 2..n outside the torch.profiler window
    rest = dict(p["rest"])
    eval_s, ckpt_s = rest.pop("eval", 0.0), rest.pop("checkpoint", 0.0)
    run_parts = {
        "setup": p["t_step1"] - c0,
        "first step": sum(p["first"].values()),
        "steps 2..n": sum(rest.values()),
        "eval": eval_s,
        "checkpoint": ckpt_s,
        "torch.profiler window": sum(p["window"].values()),
    }
    run_parts["rest"] = run["cpu_s"] - sum(run_parts.values())
    op_ms = None
    if ops and op_path.is_file():
        window = json.loads(op_path.read_text())
        op_ms = op_share(window["ops"], int(window["steps"]))
    return {
        "size": size,
        "scheme": scheme,
        "path": path,
        "steps": steps,
        "op_ms_per_step": op_ms,
        "run": {k: v for k, v in run.items() if not isinstance(v, dict)},
        "per_step_ms": {k: 1e3 * rest.get(k, 0.0) / max(1, timed) for k in PARTS},
        "timed_steps": timed,
        "first_step_ms": {k: 1e3 * p["first"].get(k, 0.0) for k in PARTS},
        "run_parts_s": run_parts,
        "action_counts": p["counts"],
    }


def attention_backends(batch: int, heads: int, seq: int, head_dim: int) -> dict[str, float]:
    """CPU ms of one causal attention forward + backward at [batch, heads, seq, head_dim] (one thread, median) per
    SDPA backend: the CPU default (``flash``: the fused kernel eager and compiled steps call) and ``math`` (QK^T,
    softmax, PV as bmm: the GEMM floor's attention)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from experiments.bench.gemm_floor import time_call

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq, head_dim, generator=g, requires_grad=True) for _ in range(3))
    out = {}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("math", SDPBackend.MATH)):

        def step(backend=backend) -> None:
            with sdpa_kernel(backend):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y.sum().backward()

        out[name] = 1e3 * time_call(step, repeats=9, min_batch_s=2e-2)
    return out


def markdown(results: list[dict], floor_ms: float) -> str:
    cols = [f"{r['scheme']}, {r['path']}" for r in results]
    lines = ["| part of a step (CPU ms per step, steps 2..n outside --ops' window) | " + " | ".join(cols) + " |"]
    lines.append("|---" * (len(cols) + 1) + "|")
    for part in PARTS:
        lines.append(f"| {part} | " + " | ".join(f"{r['per_step_ms'][part]:.2f}" for r in results) + " |")
    lines.append("| **step** | " + " | ".join(f"**{sum(r['per_step_ms'].values()):.2f}**" for r in results) + " |")
    lines.append("| GEMM floor (baseline) | " + " | ".join(f"{floor_ms:.2f}" for _ in results) + " |")
    lines.append("")
    lines.append("| part of the run (CPU s) | " + " | ".join(cols) + " |")
    lines.append("|---" * (len(cols) + 1) + "|")
    for part in RUN_PARTS:
        lines.append(f"| {part} | " + " | ".join(f"{r['run_parts_s'][part]:.2f}" for r in results) + " |")
    lines.append("| **run** | " + " | ".join(f"**{r['run']['cpu_s']:.2f}**" for r in results) + " |")
    lines.append("| steps | " + " | ".join(str(r["steps"]) for r in results) + " |")
    if all(r.get("op_ms_per_step") for r in results):
        lines.append("")
        lines.append("| torch.profiler, self CPU ms per step (steps 31-50) | " + " | ".join(cols) + " |")
        lines.append("|---" * (len(cols) + 1) + "|")
        for group in results[0]["op_ms_per_step"]:
            lines.append(f"| {group} | " + " | ".join(f"{r['op_ms_per_step'][group]:.2f}" for r in results) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="cpu_s")
    p.add_argument("--schemes", default="baseline,block_attnres")
    p.add_argument("--paths", default="eager,compiled")
    p.add_argument("--fraction", type=float, default=1.0, help="train.tokens x this (1.0: the real run)")
    p.add_argument("--data-cache", default=None)
    p.add_argument("--ops", action="store_true", help="also a torch.profiler window (steps 31-50) per run")
    p.add_argument("--out", default=str(REPO / "reports" / "bench" / "profile_step.json"))
    args = p.parse_args(argv)

    import torch

    from experiments.bench.gemm_floor import gemm_floor
    from experiments.bench.machine_load import CoreMonitor
    from experiments.bench.shapes import conf_size
    from experiments.config.compose import initialize

    torch.set_num_threads(1)
    initialize()
    s = conf_size(args.size)
    floor = gemm_floor(s.model_config("baseline"), s.batch_size, s.seq_len)
    attention = attention_backends(s.batch_size, s.n_heads, s.seq_len, s.head_dim or s.d_model // s.n_heads)
    results, monitor = [], CoreMonitor()
    with tempfile.TemporaryDirectory(prefix="attnres_profile_") as tmp:
        for scheme in args.schemes.split(","):
            for path in args.paths.split(","):
                monitor.start()
                r = profile_run(args.size, scheme, path, args.fraction, Path(tmp), args.data_cache, args.ops)
                r["other_cores_busy"] = monitor.stop()
                results.append(r)
                print(
                    f"{scheme} {path}: {r['steps']} steps, {r['run']['cpu_s']:.1f} CPU s, "
                    f"other cores busy {r['other_cores_busy']}",
                    flush=True,
                )
    out = {
        "size": args.size,
        "fraction": args.fraction,
        "threads": 1,
        "torch": torch.__version__,
        "gemm_floor_s": floor["floor_s"],
        "attention_ms_per_layer": attention,
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(markdown(results, 1e3 * floor["floor_s"]))
    print(
        f"\none layer's causal attention, forward + backward, CPU ms: flash (CPU default) {attention['flash']:.3f}, "
        f"math (bmm) {attention['math']:.3f}"
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
