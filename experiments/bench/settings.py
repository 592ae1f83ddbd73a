"""The benchmark's command line, read once into a frozen :class:`BenchSettings` (defaults applied, every value
checked); the sections take the settings, never the argparse namespace. No torch at import: ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .shapes import BUILTIN, TARGET, TINY, check_moe_pair, resolve_size, size_names

DEFAULT_OUT = Path("reports") / "bench" / "bench.json"
SCHEMES = ("baseline", "full", "block")

# The --options variants: build_runner's keyword arguments per variant (the rest eager fp32).
OPTION_VARIANTS: dict[str, dict[str, Any]] = {
    "eager": {},
    "compile": {"compile_model": True},
    "compile-regional": {"compile_model": "regional"},
    "bf16": {"bf16": True},
    "compile+bf16": {"compile_model": True, "bf16": True},
    "checkpointing": {"checkpointing": True},
    "torch-path": {"cpu_kernels": False},  # eager without the compiled CPU depth-mixing kernels (cpu_kernels.py)
}
QUICK_OPTION_VARIANTS = ("eager", "bf16", "checkpointing")
# Sections that answered one question each and were then frozen, with their results, as dated notes: a flag of one
# (or of its ``-<option>`` family) fails with one line naming the note.
RETIRED_FLAGS = {"--ladder": "docs/results/bench/2026-12-02_ladder/"}


@dataclass(frozen=True)
class BenchSettings:
    """Every setting of one benchmark invocation, as the flags of the same names (``python -m experiments.bench
    --help``) with defaults resolved: lists are tuples, ``compile`` is None, "whole" or "regional"."""

    sizes: tuple[str, ...]
    schemes: tuple[str, ...]
    batch_size: int | None
    seq_len: int | None
    device: str
    threads: int
    repeats: int
    warmup: int
    seed: int
    quiet_wait: float
    bf16: bool
    compile: str | None
    decode_tokens: int
    checkpointing: bool
    sdpa: str
    peak_flops: float | None
    no_prefill: bool
    no_memory: bool
    options: bool
    option_variants: tuple[str, ...]
    moe_pairs: tuple[tuple[str, str], ...]  # (MoE size, dense size) names
    harness: bool
    harness_sizes: tuple[str, ...] | None
    harness_steps: int | None
    harness_rounds: int
    harness_logger: str
    data_cache: str | None
    data_max_bytes: int | None
    quick: bool
    out: str
    memory_child: str | None = None
    optimizer: str = "adamw"  # of the per-size section's timed steps (conf/optimizer/ names)


def build_parser(description: str = "") -> argparse.ArgumentParser:
    """The argparse parser of ``python -m experiments.bench`` (``description``: the help's first paragraph)."""
    p = argparse.ArgumentParser(
        prog="python -m experiments.bench",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_run_args(p)
    _add_variant_args(p)
    _add_harness_args(p)
    p.add_argument("--data-cache", default=None, help="dataset cache dir for the harness (default: the project's)")
    p.add_argument("--data-max-bytes", type=int, default=None, help="stdlib slice for the harness (tests)")
    p.add_argument("--quick", action="store_true", help="<= 30 s smoke of every section on the tiny size")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"JSON output (default: {DEFAULT_OUT})")
    p.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    return p


def _add_run_args(p: argparse.ArgumentParser) -> None:
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


def _add_variant_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--optimizer",
        default="adamw",
        choices=("adamw", "muon"),
        help="the optimizer of the per-size section's timed steps: adamw, or muon (Muon for the sublayer matrices, "
        "AdamW for the rest: experiments.training.optim.muon); default adamw",
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
        "--moe-pairs",
        default=None,
        help="comma-separated <moe size>:<dense size> pairs (e.g. cpu_moe:cpu_xs): each scheme's training step with "
        "MoE MLPs against the dense size, interleaved (experiments/bench/moe_section.py); without --sizes, this "
        "section alone (no per-size or harness section)",
    )


def _add_harness_args(p: argparse.ArgumentParser) -> None:
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


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def parse_args(argv: Sequence[str] | None = None, description: str = "") -> BenchSettings:
    """The settings of ``argv`` (default: sys.argv[1:]); exits with a message on a bad value or a retired flag."""
    _refuse_retired(sys.argv[1:] if argv is None else argv)
    args = build_parser(description).parse_args(argv)
    if args.quick:  # --quick: seconds, every section on the tiny size (explicit flags still win)
        args.sizes = args.sizes or TINY.name
        args.repeats = args.repeats or 3
        args.harness_steps = args.harness_steps or 5
        args.harness_rounds = args.harness_rounds or 1
        args.decode_tokens = 4 if args.decode_tokens is None else args.decode_tokens
        if args.options and args.option_variants == ",".join(OPTION_VARIANTS):
            args.option_variants = ",".join(QUICK_OPTION_VARIANTS)
    _check_counts(args)
    moe_alone = bool(args.moe_pairs) and args.sizes is None  # --moe-pairs without --sizes: that section alone
    return BenchSettings(
        sizes=() if moe_alone else tuple(_split(args.sizes or f"{TARGET.name},cpu_xl")),
        schemes=_schemes(args.schemes),
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        device=args.device,
        threads=args.threads,
        repeats=args.repeats or 7,
        warmup=1 if args.warmup is None else args.warmup,
        seed=args.seed,
        quiet_wait=args.quiet_wait,
        bf16=args.bf16,
        compile=args.compile,
        decode_tokens=args.decode_tokens or 0,
        checkpointing=args.checkpointing,
        sdpa=args.sdpa,
        peak_flops=args.peak_flops,
        no_prefill=args.no_prefill,
        no_memory=args.no_memory,
        options=args.options,
        option_variants=_option_variants(args.option_variants),
        moe_pairs=_moe_pairs(args.moe_pairs),
        harness=args.harness == "on" and not moe_alone,
        harness_sizes=tuple(n.strip() for n in args.harness_sizes.split(",")) if args.harness_sizes else None,
        harness_steps=args.harness_steps,
        harness_rounds=args.harness_rounds or 3,
        harness_logger=args.harness_logger,
        data_cache=args.data_cache,
        data_max_bytes=args.data_max_bytes,
        quick=args.quick,
        out=args.out,
        memory_child=args.memory_child,
        optimizer=args.optimizer,
    )


def _refuse_retired(argv: Sequence[str]) -> None:
    """Exit with one line if ``argv`` holds a flag of a retired section (:data:`RETIRED_FLAGS`)."""
    for arg in argv:
        flag = arg.split("=", 1)[0]
        for retired, note in RETIRED_FLAGS.items():
            if flag == retired or flag.startswith(retired + "-"):
                raise SystemExit(
                    f"python -m experiments.bench: {flag} is retired; the tool and its result are frozen in {note} "
                    "(README.md: what it decided, and the commit to run it at)"
                )


def _schemes(value: str) -> tuple[str, ...]:
    from attnres import RESIDUAL_SCHEMES

    schemes = _split(value)
    bad = [s for s in schemes if s not in RESIDUAL_SCHEMES]
    if bad or not schemes:
        raise SystemExit(f"--schemes: unknown {bad}; allowed values: {', '.join(RESIDUAL_SCHEMES)}")
    return tuple(schemes)


def _moe_pairs(value: str | None) -> tuple[tuple[str, str], ...]:
    """--moe-pairs ("<moe size>:<dense size>", comma-separated) as (MoE, dense) name pairs, each a known MoE size
    then a known dense one (checked before any section runs)."""
    pairs = []
    allowed = size_names()
    for text in _split(value or ""):
        parts = [p.strip() for p in text.split(":")]
        if len(parts) != 2 or not all(parts):
            raise SystemExit(f"--moe-pairs: {text!r} is not <moe size>:<dense size> (e.g. cpu_moe:cpu_xs)")
        bad = [n for n in parts if n not in allowed]
        if bad:
            raise SystemExit(f"--moe-pairs: unknown size {bad[0]!r}; allowed values: {', '.join(allowed)}")
        try:
            check_moe_pair(resolve_size(parts[0]), resolve_size(parts[1]))
        except ValueError as e:
            raise SystemExit(str(e)) from None
        pairs.append((parts[0], parts[1]))
    return tuple(pairs)


def _option_variants(value: str) -> tuple[str, ...]:
    variants = _split(value)
    bad = [v for v in variants if v not in OPTION_VARIANTS]
    if bad:
        raise SystemExit(f"--option-variants: unknown {bad}; allowed values: {', '.join(OPTION_VARIANTS)}")
    if "eager" not in variants:
        variants.insert(0, "eager")
    return tuple(variants)


def _check_counts(args: argparse.Namespace) -> None:
    """The numeric flags' ranges, with the defaults the settings will take."""
    for name, value in (
        ("repeats", args.repeats or 7),
        ("harness_rounds", args.harness_rounds or 3),
        ("threads", args.threads),
    ):
        if value < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    if (args.decode_tokens or 0) < 0:
        raise SystemExit("--decode-tokens must be >= 0")
    if args.harness_steps is not None and args.harness_steps < 4:
        raise SystemExit("--harness-steps must be >= 4 (K steps give K - 1 timed gaps, the first two warm-up)")
    if args.device not in ("cpu", "cuda"):
        raise SystemExit(f"--device={args.device!r}; allowed values: cpu, cuda")
