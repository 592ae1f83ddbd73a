"""The Triton depth kernels compiled ahead of time for Hopper, without a GPU: registers, spills, occupancy.

``kernel_calls(config)`` lists what a model's depth reads ask the kernels for (each attend / merge call's Q or K,
queries, dtypes), found by running the residual scheme itself at a tiny width with the dispatch intercepted, so
the list is the schemes' own and not a transcription of them. ``compile_report(calls, D)`` compiles, for each
call, the kernel configuration gpu_kernels.py would launch (triton_launch.launch) at width D with Triton's
ahead-of-time compiler for sm_90a, and reads ptxas's resource report: registers, spill stores and loads, the
stack frame, shared memory, and the blocks of one launch that fit on an SM (triton_launch.blocks_per_sm).

It must run in a process whose triton was imported without TRITON_INTERPRET=1 (the interpreter replaces every
kernel by a Python function that cannot be compiled): scripts/triton_aot_report.py is its command line, and
tests/test_triton_aot.py runs it in a subprocess. Results: docs/performance.md, "Triton kernels on CUDA". It is
performance tooling over the model library, not part of it (it reaches into attnres' kernel modules), so it lives
with the benchmarks.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from attnres import gpu_kernels
from attnres.config import ModelConfig
from attnres.triton_launch import CHUNK, Launch, Tile, blocks_per_sm, candidates, key, launch, select

ARCH = 90  # sm_90a: H100 / H200
_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class Call:
    """One kernel's call shape: kernel name, n = Q (attend) or K (merge), whether the merge scores its extras
    (has_q), the low-precision dtype ("bf16" / "fp16"), the merge's output dtype and its base's dtype."""

    kernel: str
    n: int
    has_q: bool = True
    low: str = "bf16"
    out: str = "fp32"
    base: str = "fp32"


@dataclass(frozen=True)
class Compiled:
    """ptxas's report of one compiled configuration (per thread: registers, spill bytes, stack frame)."""

    call: Call
    launch: Launch
    registers: int
    spill_stores: int
    spill_loads: int
    stack: int
    shared: int
    blocks_per_sm: int

    @property
    def warps_per_sm(self) -> int:
        return self.blocks_per_sm * self.launch.warps


@dataclass(frozen=True)
class OpCall:
    """One depth-op call a model makes on CUDA: "attend" (sources: their dtypes, n = Q queries) or "merge"
    (sources: the extras' dtypes, n = K; has_q: it scores them; out and base: y's and base's dtypes)."""

    op: str
    sources: tuple[str, ...]
    n: int
    has_q: bool = True
    out: str = "fp32"
    base: str = "fp32"


@contextlib.contextmanager
def _intercepted(calls: list[OpCall]) -> Iterator[None]:
    """The CUDA dispatch taken on CPU tensors, each kernel call recorded and run by the torch reference."""
    from attnres import depth

    saved = gpu_kernels.applies, gpu_kernels.attend_batched, gpu_kernels.merge_read

    def attend_batched(sources, queries, eps):
        calls.append(OpCall("attend", tuple(_DTYPES[v.dtype] for v in sources), queries.shape[0]))
        return depth.attend_batched_reference(sources, queries, eps)

    def merge_read(base, z, extras, normalize_eps, out_dtype, queries, key_eps):
        has_q = queries is not None and len(extras) > 0
        names = tuple(_DTYPES[e.dtype] for e in extras)
        calls.append(OpCall("merge", names, len(extras), has_q, _DTYPES[out_dtype], _DTYPES[base.dtype]))
        return depth.merge_read_reference(base, z, extras, normalize_eps, out_dtype, queries, key_eps)

    gpu_kernels.applies = lambda *tensors: bool(tensors)
    gpu_kernels.attend_batched = attend_batched
    gpu_kernels.merge_read = merge_read
    try:
        yield
    finally:
        gpu_kernels.applies, gpu_kernels.attend_batched, gpu_kernels.merge_read = saved


def op_calls(config: ModelConfig, precision: str = "bf16-mixed") -> list[OpCall]:
    """The depth-op calls of one training forward of ``config``'s model on CUDA, in order, found at width 16 (the
    calls do not depend on the width): ``precision`` "bf16-mixed" (fp32 weights, bf16 autocast: an fp32 embedding,
    bf16 sublayer outputs), "bf16-true" (everything bf16) or "fp32". Each call's backward follows from it."""
    from attnres.model import Transformer

    tiny = replace(config, d_model=16, n_heads=1, head_dim=16, d_ff=32, vocab_size=32, max_seq_len=4)
    torch.manual_seed(0)
    model = Transformer(tiny)
    if precision == "bf16-true":
        model = model.to(torch.bfloat16)
    calls: list[OpCall] = []
    idx = torch.zeros(1, 2, dtype=torch.long)
    with _intercepted(calls), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        model(idx, idx)
    return calls


def _low(names: tuple[str, ...]) -> str:
    return "fp16" if "fp16" in names else "bf16"


def kernel_calls(config: ModelConfig, precision: str = "bf16-mixed") -> set[Call]:
    """The distinct kernel calls (forward and backward) of op_calls."""
    out: set[Call] = set()
    for c in op_calls(config, precision):
        if c.op == "attend":
            out |= {Call(k, c.n, True, _low(c.sources)) for k in ("attend_fwd", "attend_bwd")}
        else:
            low = _low((*c.sources, c.base))
            out |= {Call(k, c.n, c.has_q, low, c.out, c.base) for k in ("merge_fwd", "merge_bwd")}
    return out


def _signature(kernel: str, call: Call) -> dict[str, str]:
    """Triton signature of ``kernel`` for ``call``: the pointer dtypes; every other argument an int32 or fp32."""
    from attnres import depth_mix_triton as k

    pointers = {"tab": "*i64"}
    if kernel == "merge_fwd":
        pointers |= {"base_ptr": f"*{call.base}", "y_ptr": f"*{call.out}"}
    elif kernel == "merge_bwd":
        pointers |= {"g_ptr": f"*{call.out}", "gbase_ptr": f"*{call.base}"}
    floats = {"eps", "key_eps"}
    ints = {"S", "N", "D", "Q", "n_blocks"}
    fn = getattr(k, kernel)
    sig = {}
    for name in fn.arg_names:
        if name in pointers:
            sig[name] = pointers[name]
        elif name.endswith("_ptr"):
            sig[name] = "*fp32"
        elif name in ints:
            sig[name] = "i32"
        elif name in floats:
            sig[name] = "fp32"
        else:
            sig[name] = "constexpr"
    return sig


def _specialization(fn, signature: dict[str, str], D: int) -> dict:
    """What Triton's launcher tells the compiler about the arguments of a real call: every pointer 16-byte
    aligned (the caching allocator's blocks), and D and N multiples of 16 where they are (N = B x T tokens: the
    paper sizes' batches are); S, Q and n_blocks are not specialised (the kernels' do_not_specialize)."""
    aligned = [["tt.divisibility", 16]]
    names = [n for n, t in signature.items() if t.startswith("*")] + (["D"] if D % 16 == 0 else []) + ["N"]
    return {(fn.arg_names.index(n),): aligned for n in names if n in signature and signature[n] != "constexpr"}


def _constexprs(call: Call, cfg: Launch) -> dict:
    """The constexprs gpu_kernels.py passes for ``call`` with ``cfg`` (its _meta, without the launch options)."""
    import triton.language as tl

    meta = gpu_kernels._meta(tl.float16 if call.low == "fp16" else tl.bfloat16, cfg)
    meta = {k: v for k, v in meta.items() if k not in ("num_warps", "num_stages")}
    if call.kernel.startswith("attend"):
        return meta | {"Q_PAD": gpu_kernels._pow2(call.n)}
    meta |= {"K": call.n, "HAS_Q": call.has_q}
    return meta | ({"LOW_Y": call.out != "fp32"} if call.kernel == "merge_fwd" else {})


def compile_call(call: Call, D: int, cfg: Launch | None = None) -> Compiled:
    """Compile ``call``'s kernel at width D for sm_90a (the launch gpu_kernels.py would choose, or ``cfg``) and
    read ptxas's report."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnres import depth_mix_triton as k

    if cfg is None:
        cfg = launch(call.kernel, D, call.n, call.has_q, call.low)
    fn = getattr(k, call.kernel)
    if not hasattr(fn, "arg_names"):
        raise RuntimeError("triton was imported with TRITON_INTERPRET=1: its kernels cannot be compiled here")
    signature = _signature(call.kernel, call)
    source = ASTSource(fn, signature, _constexprs(call, cfg), _specialization(fn, signature, D))
    options = {"num_warps": cfg.warps, "num_stages": cfg.stages}
    compiled = triton.compile(source, target=GPUTarget("cuda", ARCH, 32), options=options)
    text = _ptxas_report(compiled.asm["ptx"], compiled.metadata.enable_fp_fusion)

    def number(pattern: str) -> int:
        found = re.search(pattern, text)
        if found is None:
            raise RuntimeError(f"ptxas's report has no {pattern!r}:\n{text}")
        return int(found.group(1))

    registers = number(r"Used (\d+) registers")
    shared = int(compiled.metadata.shared)
    return Compiled(
        call,
        cfg,
        registers,
        number(r"(\d+) bytes spill stores"),
        number(r"(\d+) bytes spill loads"),
        number(r"(\d+) bytes stack frame"),
        shared,
        blocks_per_sm(registers, cfg.warps, shared),
    )


def _ptxas_report(ptx: str, fp_fusion: bool) -> str:
    """ptxas -v on ``ptx`` with the options Triton's own ptxas run uses (its report is not kept when Triton finds the
    compiled kernel in its cache)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        cmd = [get_ptxas(ARCH).path, "-lineinfo", *([] if fp_fusion else ["--fmad=false"]), "-v"]
        cmd += ["--regAllocOptLevel=2", f"--gpu-name={sm_arch_from_capability(ARCH)}", str(src)]
        cmd += ["-o", str(Path(tmp) / "kernel.cubin")]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return done.stdout + done.stderr


def compile_report(calls: set[Call], D: int) -> list[Compiled]:
    """compile_call for every call at width D, each distinct compilation once, sorted by kernel and n."""
    done: dict[tuple, Compiled] = {}
    out = []
    for call in sorted(calls, key=lambda c: (c.kernel, c.n, c.has_q, c.low, c.out, c.base)):
        cfg = launch(call.kernel, D, call.n, call.has_q, call.low)
        signature = tuple(sorted(_signature(call.kernel, call).items()))
        what = (call.kernel, signature, tuple(sorted(map(str, _constexprs(call, cfg).items()))), cfg)
        if what not in done:
            done[what] = compile_call(call, D, cfg)
        out.append(replace(done[what], call=call))
    return out


# The keys of the packaged table (triton_launch.json): every Q_PAD attend takes; the merges the schemes make
# (K = 0: the normalisation alone; K = 1 to 3 with queries: Block's partial sum, Full's newer sources)
TABLE_KEYS = [(k, n, True) for k in ("attend_fwd", "attend_bwd") for n in (1, 2, 4, 8, 16)] + [
    (k, n, n > 0) for k in ("merge_fwd", "merge_bwd") for n in (0, 1, 2, 3)
]
SELECT_WIDTH = 1264  # the widest paper size; a compiled kernel does not depend on D beyond D % 16


def select_tiles(keys=TABLE_KEYS, D: int = SELECT_WIDTH, log=None) -> dict[str, Tile]:
    """triton_launch.select over every candidate of each key, compiled for sm_90a (bf16 sources; the merge with a
    bf16 output, the heavier of its two output variants): the packaged table."""
    chosen = {}
    for kernel, n, has_q in keys:
        call = Call(kernel, n, has_q, "bf16", "bf16")
        results = []
        for t in candidates(kernel):
            cfg = Launch(t.block_t, CHUNK, -(-D // CHUNK), t.warps, t.stages, t.per_sm, t.unroll)
            c = compile_call(call, D, cfg)
            results.append((t, c.registers, c.spill_stores, c.blocks_per_sm))
        chosen[key(kernel, n, has_q)] = select(results, kernel, n)
        if log is not None:
            log(f"{key(kernel, n, has_q)}: {chosen[key(kernel, n, has_q)]}  (of {results})")
    return chosen
