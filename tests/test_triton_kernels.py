"""The Triton depth kernels (attnres/gpu_kernels.py, depth_mix_triton.py) against the torch path of depth.py, on
the CPU under Triton's interpreter.

Triton runs a kernel on CPU tensors only when TRITON_INTERPRET=1 was set before triton was imported: conftest.py
sets it on machines without a GPU device (and this module does when run without conftest, if triton is not
imported yet). On a GPU machine these tests are skipped: there tests/test_gpu.py runs the same comparisons with
the compiled kernels.

Every comparison runs the same computation with the kernels (gpu_kernels.use_kernels(True)) and with the torch
path (use_kernels(False), CPU kernels off), and counts kernel launches, so a test cannot compare the torch path
with itself. The torch path is in turn tested against the paper's definitions in float64 (test_depth.py,
test_model.py). Tolerances: fp32 to rounding; a gradient stored in bf16 / fp16 to twice its rounding floor
(2^-7 / 2^-10 of its largest entry: the interpreter truncates fp32 -> bf16 where a GPU rounds).
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

KERNELS = ("attend_fwd", "attend_bwd", "merge_fwd", "merge_bwd")


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
    assert launches == {"attend_fwd": 2, "attend_bwd": 2}
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
    assert launches == {"merge_fwd": 2 if K else 1, "merge_bwd": 2 if K else 1}
    names = (
        ["out", "again", "grad base"]
        + (["grad z"] if K else [])
        + (["grad queries"] if with_queries else [])
        + [f"grad extra {k}" for k in range(K)]
    )
    if out_dtype != torch.bfloat16:
        assert_close(on, off, names, via=out_dtype)  # y is saved in out_dtype: backward starts from it
        return
    # A bf16 output: the kernel keeps y in bf16 and derives its backward from it (the torch reference differentiates
    # in fp32); and the interpreter truncates y to bf16 (a GPU rounds to nearest, as torch does), a bias that adds up
    # over D in the softmax's gradient a_k (g.e_k - g.h), a small difference of O(1) terms. So the values are
    # compared with the torch path, and the gradients with float64: within 10x the error of the same y-based
    # backward computed by torch (_MergeFromOutput; no queries in this case).
    assert_close(on[:2], off[:2], names[:2])
    assert not with_queries
    with gpu_kernels.use_kernels(False):
        from_output = compute(lambda b, zz, es, eps, out_dtype, *_: _MergeFromOutput.apply(b, zz, eps, out_dtype, *es))
    ref_inputs = [x.detach().double().requires_grad_() for x in inputs]
    base, z = ref_inputs[0], ref_inputs[1]
    extras = ref_inputs[2:]
    out_dtype, t = torch.float64, (lambda v: v)
    with gpu_kernels.use_kernels(False):
        inputs = ref_inputs
        ref = compute()
    for name, a, b, r in zip(names[2:], on[2:], from_output[2:], ref[2:]):
        err_on, err_off = (a.double() - r).abs().max().item(), (b.double() - r).abs().max().item()
        assert err_on <= 10 * err_off + 1e-6, (name, err_on, err_off)


class _MergeFromOutput(torch.autograd.Function):
    """merge_read (normalised, no queries) whose backward is derived from its output y kept in ``y_dtype``, by the
    algebra the kernels use (depth._MergeReadC: m = mean(g y), u = g - m y, g.h = m D eps rstd): a yardstick for a
    kernel that keeps y in bf16."""

    @staticmethod
    def forward(ctx, base, z, eps, y_dtype, *extras):
        a = torch.cat([torch.zeros_like(z[:1]), z]).softmax(0)[..., None]  # [K + 1, B, T, 1]
        h = a[0] * base + sum(a[k + 1] * e.float() for k, e in enumerate(extras))
        rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        y = (h * rstd).to(y_dtype)
        ctx.eps = eps
        ctx.save_for_backward(a, y, rstd, *extras)
        return y

    @staticmethod
    def backward(ctx, g):
        a, y, rstd, *extras = ctx.saved_tensors
        g, y = g.float(), y.float()
        m = (g * y).mean(-1, keepdim=True)
        u = g - m * y  # dL/dh = rstd u
        gh = m * y.shape[-1] * ctx.eps * rstd
        grad_z = torch.stack(
            [rstd * a[k + 1] * ((u * e.float()).sum(-1, keepdim=True) - gh) for k, e in enumerate(extras)]
        )[..., 0]
        grad_extras = [(rstd * a[k + 1] * u).to(e.dtype) for k, e in enumerate(extras)]
        return rstd * a[0] * u, grad_z, None, None, *grad_extras


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
    assert set(launches) == set(KERNELS)
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
    assert all(launches[k] == 2 * before[k] for k in KERNELS)  # the compiled graph ran the same kernels
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
