"""The Triton depth kernels (attnres/gpu_kernels.py, depth_mix_triton.py) against the torch path of depth.py, on
the CPU under Triton's interpreter.

Triton runs a kernel on CPU tensors only when TRITON_INTERPRET=1 was set before triton was imported: conftest.py
sets it on machines without a GPU device (and this module does when run without conftest, if triton is not
imported yet). On a GPU machine these tests are skipped: there tests/test_gpu.py runs the same comparisons with
the compiled kernels.

Every comparison runs the same computation with the kernels (gpu_kernels.use_kernels(True)) and with the torch
path (use_kernels(False), CPU kernels off), and counts kernel launches, so a test cannot compare the torch path
with itself. The torch path is in turn tested against the paper's definitions in float64 (test_depth.py,
test_model.py). Tolerances: fp32 to rounding; a result stored in bf16 / fp16 to twice its rounding floor
(2^-7 / 2^-10 of its largest entry; the kernels round to nearest even themselves, so the interpreter rounds as a
GPU does). Where a bf16 result's backward is ill-conditioned (test_bf16_backward...), against float64 instead.
The shapes are tiny: the interpreter runs a kernel program as numpy code (about 0.2-0.5 s per op and pass).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (its own library functions read it)
pytest.importorskip(
    "triton", reason="triton is not installed: pip install -r requirements-cpu-triton.txt for these tests (CI does)"
)

from depth_cases import merge_case, sharp_model

from attnres import Transformer, cpu_kernels, depth_mix_triton, gpu_kernels
from attnres.config import ModelConfig
from attnres.depth import attend_batched, merge_read, track_source

pytestmark = pytest.mark.skipif(
    not gpu_kernels._interpreting(),
    reason="triton was imported without TRITON_INTERPRET=1 (a CUDA machine, or another "
    "module imported it first): run this file on its own, or tests/test_gpu.py",
)

KERNELS = ("attend_fwd", "attend_bwd", "merge_fwd", "merge_bwd", "write_table")


class _Counted:
    """A kernel whose launches (kernel[grid](...)) are counted."""

    def __init__(self, kernel, name: str, calls: dict[str, int]) -> None:
        self.kernel, self.name, self.calls = kernel, name, calls

    def __getitem__(self, grid):
        self.calls[self.name] = self.calls.get(self.name, 0) + 1
        return self.kernel[grid]


@pytest.fixture
def launches(monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setenv(cpu_kernels.ENV_SWITCH, "0")  # the reference is the torch path itself
    calls: dict[str, int] = {}
    for name in KERNELS:
        monkeypatch.setattr(depth_mix_triton, name, _Counted(getattr(depth_mix_triton, name), name, calls))
    return calls


def both(fn, launches: dict[str, int]) -> tuple[list, list]:
    """fn() on the kernels, then on the torch path (which must launch none)."""
    with gpu_kernels.use_kernels(True):
        on = fn()
    seen = dict(launches)
    with gpu_kernels.use_kernels(False):
        off = fn()
    assert launches == seen, "the torch path launched a kernel"
    return on, off


def _depth(launches: dict[str, int]) -> dict[str, int]:
    """The depth kernels' launch counts (without the tables' writes)."""
    return {k: v for k, v in launches.items() if k != "write_table"}


FLOOR = {torch.bfloat16: 2**-7, torch.float16: 2**-10}  # twice the rounding floor, relative


def assert_close(
    on: list, off: list, names: list[str], fp32_rtol: float = 2e-5, via: torch.dtype = torch.float32
) -> None:
    """Each pair equal in dtype and shape, and within fp32 rounding (relative to the largest entry), or twice the
    rounding floor of a bf16 / fp16 result or of ``via``, a precision every result passed through (e.g. a read
    stored in bf16 for backward)."""
    assert len(on) == len(off) == len(names)
    for name, a, b in zip(names, on, off):
        assert (a is None) == (b is None), name
        if a is None:
            continue
        assert a.dtype == b.dtype, (name, a.dtype, b.dtype, a.shape, b.shape)
        assert a.shape == b.shape, (name, a.dtype, b.dtype, a.shape, b.shape)
        rtol = max(FLOOR.get(a.dtype, fp32_rtol), FLOOR.get(via, fp32_rtol))
        scale = b.double().abs().max().item()
        err = (a.double() - b.double()).abs().max().item()
        assert err <= rtol * scale + 1e-7, (name, a.dtype, err, scale)


SOURCE_DTYPES = {
    "fp32": [torch.float32],
    "bf16": [torch.bfloat16],
    "fp16": [torch.float16],
    "fp32+bf16": [torch.float32, torch.bfloat16],
}  # the last: the embedding fp32, the rest bf16


@pytest.mark.parametrize(
    ("S", "Q", "D", "dtypes", "track"),
    [
        (4, 3, 37, "fp32", False),  # D not a power of two
        (1, 1, 64, "fp32", True),  # one source, one read
        (5, 4, 24, "fp32+bf16", True),  # Block AttnRes under bf16 autocast
        (3, 2, 17, "fp16", False),
        (6, 5, 40, "bf16", False),  # Q not a power of two
    ],
)
def test_attend_equals_the_torch_path(launches, S, Q, D, dtypes, track):
    """Phase 1 with the key logits: outputs, lse, and the gradients of the queries and of every source (through
    the outputs and through lse); one source without gradient, one non-contiguous, one read unused; tracked
    sources are read by two calls, so a sink is first written, then accumulated into."""
    torch.manual_seed(0)
    B, T, eps = 2, 3, 1e-2  # eps large enough that its terms matter
    kinds = SOURCE_DTYPES[dtypes]
    vs = [torch.randn(B, T, D).to(kinds[min(s, len(kinds) - 1)]).requires_grad_(s != 1 or S == 1) for s in range(S)]
    q = torch.randn(Q, D, requires_grad=True)
    q2 = torch.randn(2, D, requires_grad=True)
    t = track_source if track else (lambda v: v)
    inputs = [q, q2] + [v for v in vs if v.requires_grad]

    def compute():
        sources = [t(v * 1.0) for v in vs]
        if S > 2:
            sources[2] = sources[2].transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
        outs, lse = attend_batched(sources, q, eps)
        more, lse2 = attend_batched(sources[: max(1, S - 1)], q2, eps)
        loss = sum((o * (i + 1)).pow(2).sum() for i, o in enumerate(outs[:-1] if Q > 1 else outs))
        loss = loss + (lse * torch.arange(Q)).sin().sum() + (more[0] * more[1]).sum() + lse2.pow(2).sum()
        return [*outs, lse, *more, lse2, *torch.autograd.grad(loss, inputs)]

    on, off = both(compute, launches)
    assert _depth(launches) == {"attend_fwd": 2, "attend_bwd": 2}
    assert all(o.dtype == torch.float32 for o in on[: Q + 1])
    names = (
        [f"out{i}" for i in range(Q)]
        + ["lse"]
        + ["more0", "more1", "lse2", "grad q", "grad q2"]
        + [f"grad v{s}" for s in range(S) if vs[s].requires_grad]
    )
    assert_close(on, off, names)


@pytest.mark.parametrize(
    ("K", "D", "with_queries", "track", "extra_dtype", "out_dtype"),
    [
        (0, 40, False, False, torch.float32, torch.float32),  # Block's first read of a block: the normalisation alone
        (1, 40, True, True, torch.float32, torch.float32),  # Block's partial sum, its key logit inside
        (3, 33, True, True, torch.float32, torch.float32),  # Full's read group: one query per extra
        (2, 24, False, False, torch.bfloat16, torch.bfloat16),
        (2, 19, True, False, torch.float16, torch.float32),
        (2, 21, True, True, torch.float16, torch.float16),
    ],
)
def test_merge_equals_the_torch_path(launches, K, D, with_queries, track, extra_dtype, out_dtype):
    """The merge fused with the PreNorm normalisation: value, and the gradients of base, z, queries and extras
    (tracked extras used by two merges: written, then accumulated into; one extra non-contiguous). eps is large
    so that the g.h = m D eps rstd^2 term matters."""
    B, T, eps, key_eps = 2, 5, 1e-2, 1e-2
    base, z, queries, extras, inputs = merge_case(K, B, T, D, with_queries, extra_dtype)
    t = track_source if track else (lambda v: v)

    def compute(merge=merge_read):
        es = [t(e * 1.0) for e in extras]
        if K > 1:
            es[1] = es[1].transpose(0, 1).contiguous().transpose(0, 1)
        out = merge(base * 1.0, z, es, eps, out_dtype, queries, key_eps)
        again = merge(base * 2.0, z, es, eps, out_dtype, queries, key_eps) if K else out
        loss = (out * torch.linspace(-1, 1, D)).sum() + again.float().pow(2).mul(0.1).sum()
        return [out, again, *torch.autograd.grad(loss, inputs)]

    on, off = both(compute, launches)
    assert _depth(launches) == {"merge_fwd": 2 if K else 1, "merge_bwd": 2 if K else 1}
    names = (
        ["out", "again", "grad base"]
        + (["grad z"] if K else [])
        + (["grad queries"] if with_queries else [])
        + [f"grad extra {k}" for k in range(K)]
    )
    assert_close(on, off, names, via=out_dtype)  # a low-precision y: backward starts from its gradient


def _model(scheme: str, **kw) -> Transformer:
    cfg = ModelConfig(vocab_size=61, d_model=24, n_layers=3, n_heads=2, max_seq_len=8, residual=scheme, **kw)
    return sharp_model(cfg)


@pytest.mark.parametrize(
    ("scheme", "kw", "bf16"),
    [("block", {"n_blocks": 3}, False), ("full", {}, False), ("block", {"block_size": 4}, True), ("full", {}, True)],
)
def test_models_equal_the_torch_path(launches, scheme, kw, bf16):
    """Block and Full AttnRes end to end, d = 24, with their sources scored inside the kernels (the CUDA path)
    against the torch path (scored once per source, cached): logits and every parameter's gradient. Under bf16
    autocast (fp32 embedding, bf16 sublayer outputs) the two paths' fp32 rounding differences are amplified by the
    bf16 matmuls, so there the check is loose (and the ops' own tests above are exact)."""
    model = _model(scheme, **kw)
    idx = torch.randint(0, 61, (2, 8), generator=torch.Generator().manual_seed(2))

    def compute():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits, loss = model(idx, idx)
        loss.backward()
        return [logits.detach().float()] + [p.grad for p in model.parameters()]

    on, off = both(compute, launches)
    assert set(launches) == set(KERNELS)  # the four depth kernels and the tables' writes
    names = ["logits"] + [n for n, _ in model.named_parameters()]
    if not bf16:
        assert_close(on, off, names, fp32_rtol=1e-4)
        return
    for name, a, b in zip(names, on, off):
        cos = torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0)
        assert cos > 0.999, (name, cos.item())


@pytest.mark.parametrize(("scheme", "kw"), [("block", {"block_size": 2}), ("full", {})])
def test_cached_decoding_on_the_kernels_equals_the_full_forward(launches, scheme, kw):
    """Decoding with a KV cache takes the kernels too (one token per row: N = B): prefill 5 tokens, decode 3,
    against one forward over all 8 on the torch path."""
    model = _model(scheme, **kw)
    idx = torch.randint(0, 61, (2, 8), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        with gpu_kernels.use_kernels(False):
            full = model(idx)
        with gpu_kernels.use_kernels(True):
            cache = model.new_cache()
            steps = [model(idx[:, :5], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(5, 8)]
    assert launches["attend_fwd"] > 0
    assert launches["merge_fwd"] > 0
    assert_close([torch.cat(steps, dim=1)], [full], ["logits"], fp32_rtol=1e-4)


def test_torch_compile_fullgraph_traces_through_the_ops(launches):
    """torch.compile(fullgraph=True) of a phase 1 and a merge: the custom ops trace (fake implementations,
    registered autograd) and give eager's values and gradients."""
    torch.manual_seed(3)
    B, T, D, S = 2, 4, 20, 3
    vs = [torch.randn(B, T, D, requires_grad=True) for _ in range(S)]
    q = torch.randn(2, D, requires_grad=True)
    extra = torch.randn(B, T, D, requires_grad=True)

    def fn(q, extra, *vs):
        outs, lse = attend_batched(list(vs), q, 1e-5)
        y = merge_read(outs[0], -lse[None, ..., 0], [extra], 1e-6, torch.float32, q[1:], 1e-5)
        return (y * torch.linspace(-1, 1, D)).sum() + outs[1].pow(2).sum()

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    with gpu_kernels.use_kernels(True):
        eager = [fn(q, extra, *vs)]
        eager += torch.autograd.grad(eager[0], [q, extra, *vs])
        before = dict(launches)
        loss = compiled(q, extra, *vs)
        got = [loss, *torch.autograd.grad(loss, [q, extra, *vs])]
    assert all(launches[k] == 2 * before[k] for k in KERNELS if k in before)  # the compiled graph: the same kernels
    assert_close(got, eager, ["loss", "grad q", "grad extra"] + [f"grad v{s}" for s in range(S)])


def test_dispatch_switches(monkeypatch):
    """CPU tensors take the kernels only inside use_kernels(True) under the interpreter; ATTNRES_TRITON=0 and
    use_kernels(False) switch them off; float64 and mixed low-precision dtypes keep the torch path."""
    x, x16, xb = torch.randn(2, 3, 8), torch.randn(2, 3, 8).half(), torch.randn(2, 3, 8).bfloat16()
    assert not gpu_kernels.applies(x)  # CPU without use_kernels(True)
    with gpu_kernels.use_kernels(True):
        assert gpu_kernels.applies(x, xb)
        assert gpu_kernels.applies(x16)
        assert not gpu_kernels.applies(x.double())
        assert not gpu_kernels.applies(x16, xb)
        with gpu_kernels.use_kernels(False):
            assert not gpu_kernels.applies(x)
    monkeypatch.setenv(gpu_kernels.ENV_SWITCH, "0")
    assert gpu_kernels.status().startswith("off")
    assert not gpu_kernels.applies(x)


# ---------------------------------------------------------------------------------------------------------------
# bf16: the backward as precise as the torch path's


def _rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).abs().max() / ref.abs().max()).item()


def _bf16_case(case: str) -> tuple[list[torch.Tensor], object]:
    """Inputs and a loss of the three bf16 cases (every source of the read bf16, so y is bf16 and the merge's
    backward starts from it): "merge", K = 1 with a query, D = 96; "zero source" and "small source": an attend over
    four bf16 sources (one all zero, or scaled to RMS 0.02) then the merge of a bf16 partial sum, as Block AttnRes
    reads under bf16-true. The loss takes fp32 or float64 inputs alike (the reference)."""
    D, B, T = 96, 2, 8
    g = torch.Generator().manual_seed(2)
    weight = torch.randn(B, T, D, generator=g)
    if case == "merge":
        base = torch.randn(B, T, D, generator=g).requires_grad_()
        z = torch.randn(1, B, T, generator=g).requires_grad_()
        w = torch.randn(1, D, generator=g).requires_grad_()
        e = torch.randn(B, T, D, generator=g).bfloat16().requires_grad_()

        def loss(base, z, w, e):
            out = torch.float64 if e.dtype == torch.float64 else torch.bfloat16
            y = merge_read(base, z, [e], 1e-6, out, w, 1e-5)
            return (y.to(weight.dtype if out != torch.float64 else out) * weight.to(y.dtype).to(weight.dtype)).sum()

        return [base, z, w, e], loss
    vs = [torch.randn(B, T, D, generator=g) for _ in range(4)]
    vs[1] = vs[1] * (0.0 if case == "zero source" else 0.02)
    q = torch.randn(2, D, generator=g).requires_grad_()
    part = torch.randn(B, T, D, generator=g).bfloat16().requires_grad_()

    def loss(*xs):
        *vs, q, part = xs
        out = torch.float64 if part.dtype == torch.float64 else torch.bfloat16
        outs, lse = attend_batched(list(vs), q[:1], 1e-5)
        y = merge_read(outs[0], -lse[None, ..., 0], [part], 1e-6, out, q[1:], 1e-5)
        return (y.to(weight.dtype if out != torch.float64 else out) * weight.to(y.dtype)).sum()

    return [*(v.bfloat16().requires_grad_() for v in vs), q, part], loss


@pytest.mark.parametrize("case", ["merge", "zero source", "small source"])
def test_bf16_backward_is_as_precise_as_the_torch_path(launches, case):
    """With a bf16 y, every gradient of the kernels is within 2x of the torch path's own error, both against the
    same computation in float64. The softmax's gradient a_k dL/dh . (e_k - h) is a small difference of O(1)
    terms where a_k ~ 1; a zero source's (or a small one's) gradient has it times rstd = eps^-1/2. Before the merge
    kept y in fp32 and took e_k - h, its backward started from the bf16 y: dz and dw 20-25x the torch path's error
    and the zero source's gradient 1000 times its largest entry (docs/performance.md, "Triton kernels on CUDA")."""
    inputs, loss = _bf16_case(case)
    reference = [x.detach().double().requires_grad_() for x in inputs]
    with gpu_kernels.use_kernels(False):
        ref = torch.autograd.grad(loss(*reference), reference)
    on, off = both(lambda: torch.autograd.grad(loss(*inputs), inputs), launches)
    assert _depth(launches) == ({"merge_fwd": 1, "merge_bwd": 1} if case == "merge" else
        {"attend_fwd": 1, "attend_bwd": 1, "merge_fwd": 1, "merge_bwd": 1})  # fmt: skip
    for i, (a, b, r) in enumerate(zip(on, off, ref)):
        assert a.dtype == b.dtype == inputs[i].dtype
        assert _rel_err(a, r) <= 2 * _rel_err(b, r), (case, i, _rel_err(a, r), _rel_err(b, r))


# ---------------------------------------------------------------------------------------------------------------
# CUDA graphs: the launch path reads no host memory


def test_tables_are_written_by_kernel_arguments(launches):
    """A table of addresses, codes and modes (more values than one write_table launch takes, any magnitude an
    address has) comes back exactly: written on the device from kernel arguments, no host copy."""
    values = [0, 1, 2, 1 << 47, (1 << 40) + 12345, 7] * 13  # 78 values: 3 launches of 32
    table = gpu_kernels._table(values, torch.device("cpu"))
    assert table.dtype == torch.int64
    assert table.tolist() == values
    assert launches["write_table"] == 3


def test_launch_path_builds_no_tensor_from_host_data(launches, monkeypatch):
    """Both ops, forward and backward, create no tensor from host data and pin none: a launch is allocations and
    kernels whose arguments carry the addresses, which a CUDA graph captures and replays (the addresses of a
    captured graph's tensors stay fixed). tests/test_gpu.py captures one on a GPU; here it holds by construction:
    torch.tensor / as_tensor / pin_memory, the calls a host-to-device table needs, fail if the launch path makes
    them."""
    B, T, D = 2, 3, 20
    torch.manual_seed(5)
    vs = [torch.randn(B, T, D, requires_grad=True) for _ in range(3)]
    q = torch.randn(2, D, requires_grad=True)
    extra = torch.randn(B, T, D).bfloat16().requires_grad_()

    def refuse(name):
        def fail(*args, **kwargs):
            raise AssertionError(f"the launch path called {name}")

        return fail

    with gpu_kernels.use_kernels(True):
        for name in ("tensor", "as_tensor"):
            monkeypatch.setattr(torch, name, refuse(f"torch.{name}"))
        monkeypatch.setattr(torch.Tensor, "pin_memory", refuse("Tensor.pin_memory"))
        outs, lse = attend_batched(vs, q, 1e-5)
        y = merge_read(outs[0], -lse[None, ..., 0], [extra], 1e-6, torch.float32, q[1:], 1e-5)
        y.sum().backward()
    monkeypatch.undo()
    assert _depth(launches) == {"attend_fwd": 1, "attend_bwd": 1, "merge_fwd": 1, "merge_bwd": 1}
    assert launches["write_table"] == 4  # one table per launch
