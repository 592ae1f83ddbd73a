"""The compiled CPU kernels (attnres/cpu_kernels.py, csrc/depth_mix.c) against the torch references of depth.py.

Each comparison runs the same computation with the kernels on and off (ATTNRES_CPU_KERNELS, read at every call)
and spies on the kernel entry points, so a test can never compare the reference with itself. The references
are in turn tested against the paper's definitions in float64 (test_depth.py, test_model.py). The kernels'
memory contract (the read h never kept, base written in place and never kept) is checked here too."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch
from depth_cases import merge_case, reads_sharing_sources, sharp_model

from attnres import Transformer, cpu_kernels
from attnres.config import ModelConfig
from attnres.depth import merge_read, mix_sources, mix_sources_batched, track_source
from attnres.kernel_switch import KernelSwitch

torch.set_num_threads(1)

needs_compiler = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler on this machine"
)


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)  # also after a failed test that set 2


@pytest.fixture
def spy(monkeypatch):
    """Counts the kernel calls: {'mix_forward': n, ...}."""
    calls: dict[str, int] = {}
    for name in ("mix_forward", "mix_backward", "merge_forward", "merge_backward"):
        fn = getattr(cpu_kernels, name)

        def counted(*args, _fn=fn, _name=name):
            calls[_name] = calls.get(_name, 0) + 1
            return _fn(*args)

        monkeypatch.setattr(cpu_kernels, name, counted)
    return calls


def run_both(monkeypatch, fn):
    """fn() with the kernels on, then off: (on, off)."""
    monkeypatch.setenv(cpu_kernels.ENV_SWITCH, "1")
    on = fn()
    monkeypatch.setenv(cpu_kernels.ENV_SWITCH, "0")
    off = fn()
    monkeypatch.setenv(cpu_kernels.ENV_SWITCH, "1")
    return on, off


def assert_close_all(on, off, atol=2e-5, rtol=1e-4):
    assert len(on) == len(off)
    for i, (a, b) in enumerate(zip(on, off)):
        assert (a is None) == (b is None), i
        if a is not None:
            assert a.dtype == b.dtype, i
            assert a.shape == b.shape, i
            assert torch.allclose(a, b, atol=atol, rtol=rtol), (i, (a - b).abs().max().item())


@needs_compiler
def test_the_kernels_build_here():
    """Where a C compiler exists they must build (status says why not otherwise, and is recorded with results)."""
    assert cpu_kernels.status().startswith("on"), cpu_kernels.status()
    assert cpu_kernels.library() is not None


@needs_compiler
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("track", [False, True])
def test_batched_mix_kernel_equals_the_torch_path(monkeypatch, spy, track, threads):
    """Q reads of S sources: outputs, the weights' gradient and every source's gradient, with an unused read,
    a source without gradient, tracked sinks that defer (one used read), are written fresh, or accumulate."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    S, B, T, D, Q = 4, 3, 5, 37, 3  # D not a multiple of the kernel's 16 lanes
    vs = [torch.randn(B, T, D, requires_grad=s != 2) for s in range(S)]
    w = torch.rand(S, B, T, Q).softmax(0).requires_grad_()
    w2 = torch.rand(2, B, T, 2).softmax(0).requires_grad_()
    t = track_source if track else (lambda v: v)

    def compute():
        sources = [t(v * 1.0) for v in vs]
        outs = mix_sources_batched(w, sources)  # read 1 unused
        more = mix_sources_batched(w2, sources[:2])  # the same sinks again
        lone = mix_sources_batched(w2[1:, ..., :1], sources[3:])  # one used read: a fresh sink defers
        loss = (outs[0] * 2).pow(2).sum() + outs[2].sin().sum() + (more[0] * more[1]).sum() + lone[0].pow(3).sum()
        inputs = [w, w2, vs[0], vs[1], vs[3]]
        return [*outs, *more, *lone, *torch.autograd.grad(loss, inputs)]

    on, off = run_both(monkeypatch, compute)
    assert spy.get("mix_forward") == 3
    assert spy.get("mix_backward") == 3
    assert_close_all(on, off)


@needs_compiler
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("n_extras", "track", "with_queries"),
    [
        (0, False, False),
        (1, False, False),
        (3, False, False),
        (3, True, False),
        (1, False, True),
        (1, True, True),
        (2, True, True),
    ],
)
def test_merge_kernel_equals_the_torch_path(monkeypatch, spy, n_extras, track, with_queries, threads):
    """The fused, normalised read in place into base: value, and the gradients of base, z, queries and extras
    (tracked extras used twice, so a sink is first written, then accumulated into). eps is large so that the
    g.h = m D eps rstd^2 term matters."""
    torch.set_num_threads(threads)
    B, T, D, eps, key_eps = 2, 7, 40, 1e-2, 1e-2
    base, z, queries, extras, inputs = merge_case(n_extras, B, T, D, with_queries)
    t = track_source if track else (lambda v: v)

    def compute():
        es = [t(e * 1.0) for e in extras]
        out = merge_read(base * 1.0, z, es, eps, torch.float32, queries, key_eps)
        again = merge_read(base * 2.0, z, es, eps, torch.float32, queries, key_eps) if n_extras else out
        loss = (out * torch.linspace(-1, 1, D)).sum() + again.pow(2).mul(0.1).sum() + sum(e.pow(2).sum() for e in es)
        return [out, again, *torch.autograd.grad(loss, inputs)]

    on, off = run_both(monkeypatch, compute)
    assert spy.get("merge_forward") == (2 if n_extras else 1) == spy.get("merge_backward")
    assert_close_all(on, off)


@needs_compiler
def test_merge_kernel_only_takes_the_fused_fp32_read(monkeypatch, spy):
    """Unnormalised reads, another output dtype, bf16 or float64 sources keep the torch path."""
    base, e = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    z = torch.zeros(1, 2, 3)
    merge_read(base.clone(), z, [e], None, torch.float32)
    merge_read(base.clone(), z, [e], 1e-6, torch.bfloat16)
    merge_read(base.double(), z.double(), [e.double()], 1e-6, torch.float64)
    merge_read(base.clone(), z, [e.bfloat16()], 1e-6, torch.float32)
    assert "merge_forward" not in spy
    out = merge_read(base.clone(), z, [e], 1e-6, torch.float32)
    assert spy["merge_forward"] == 1
    assert out.dtype == torch.float32


@needs_compiler
@pytest.mark.parametrize("eps", [None, 1e-6])
@pytest.mark.parametrize("track", [False, True])
def test_single_reads_on_the_kernels_equal_the_torch_path(monkeypatch, spy, eps, track):
    """mix_sources (the batched kernel with Q = 1, then the merge kernel with K = 0 when normalised): several reads
    sharing sources, one source made from an earlier read, tracked or not; values and every gradient."""
    torch.manual_seed(0)
    B, T, D = 2, 3, 21
    values = [torch.randn(B, T, D, requires_grad=True) for _ in range(4)]
    w1 = torch.rand(2, B, T).softmax(0).requires_grad_()
    w2 = torch.rand(4, B, T).softmax(0).requires_grad_()

    def compute():
        loss = reads_sharing_sources(values, w1, w2, track, eps)
        return [loss, *torch.autograd.grad(loss, [w1, w2, *values])]

    on, off = run_both(monkeypatch, compute)
    assert spy["mix_forward"] == spy["mix_backward"] == 6
    assert spy.get("merge_forward", 0) == spy.get("merge_backward", 0) == (6 if eps else 0)
    assert_close_all(on, off)


@needs_compiler
def test_the_fused_single_read_keeps_only_its_output_and_the_sources(spy):
    """On the kernels the read h = sum w v is not kept for backward: only the normalised output, rstd, the weights
    and the sources (tracked or not)."""
    torch.manual_seed(6)
    B, T, D, eps = 2, 3, 8, 1e-6
    vs = [torch.randn(B, T, D, requires_grad=True) for _ in range(3)]
    w = torch.rand(3, B, T).softmax(0).requires_grad_()
    for sources in (vs, [track_source(v) for v in vs]):
        saved: list[torch.Tensor] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda x, saved=saved: saved.append(x) or x, lambda x: x):
            out = mix_sources(w, sources, eps)
        big = {x.data_ptr() for x in saved if x.numel() >= B * T * D}
        assert big == {v.data_ptr() for v in vs} | {out.data_ptr()}
    assert spy == {"mix_forward": 2, "merge_forward": 2}


@needs_compiler
@pytest.mark.parametrize("eps", [None, 1e-3])
@pytest.mark.parametrize(("n_extras", "with_queries"), [(0, False), (1, False), (3, False), (2, True)])
def test_the_merge_kernel_writes_into_base_and_never_keeps_it(spy, eps, n_extras, with_queries):
    """Fused in fp32 (the kernel): the result is written into base (no new [B, T, D]) and backward keeps the
    output, the extras and the weights, never base. Unfused, or in another dtype (the reference), base is left
    alone."""
    B, T, D, key_eps = 2, 3, 6, 1e-2
    base, z, queries, extras, _ = merge_case(n_extras, B, T, D, with_queries)
    for out_dtype in (torch.float32, torch.bfloat16):
        before, consumed = base.detach().clone(), base * 1.0
        saved: list[torch.Tensor] = []
        calls = spy.get("merge_forward", 0)
        with torch.autograd.graph.saved_tensors_hooks(lambda x, saved=saved: saved.append(x) or x, lambda x: x):
            out = merge_read(consumed, z, extras, eps, out_dtype, queries, key_eps)
        in_place = eps is not None and out_dtype == torch.float32
        assert spy.get("merge_forward", 0) == calls + in_place
        assert out.dtype == out_dtype
        assert (out.data_ptr() == consumed.data_ptr()) == in_place
        assert in_place or torch.equal(consumed, before)
        if in_place:
            big = {x.data_ptr() for x in saved if x.numel() == base.numel()}
            assert big <= {out.data_ptr()} | {e.data_ptr() for e in extras}


@needs_compiler
def test_a_backward_follows_its_forward_whatever_the_switch_says(spy):
    """The kernel or the reference is chosen per forward call: a kernel forward gets the kernel backward also when
    the kernels are switched off before backward runs."""
    torch.manual_seed(2)
    vs = [torch.randn(2, 3, 8, requires_grad=True) for _ in range(3)]
    w = torch.rand(3, 2, 3).softmax(0).requires_grad_()
    out = mix_sources(w, vs, 1e-6)
    with cpu_kernels.use_kernels(False):
        grads = torch.autograd.grad(out.pow(2).sum(), [w, *vs])
        assert spy["mix_backward"] == spy["merge_backward"] == 1
        out = mix_sources(w, vs, 1e-6)
        expected = torch.autograd.grad(out.pow(2).sum(), [w, *vs])
    assert spy["mix_forward"] == spy["mix_backward"] == 1
    assert_close_all(grads, expected)


def test_the_kernel_switch(monkeypatch):
    """One switch per kernel family (CPU and Triton): the environment variable, overridden by use() blocks, the
    innermost first."""
    from attnres import gpu_kernels

    assert cpu_kernels.use_kernels.__self__ is not gpu_kernels.use_kernels.__self__
    switch = KernelSwitch("ATTNRES_TEST_SWITCH")
    monkeypatch.delenv("ATTNRES_TEST_SWITCH", raising=False)
    assert not switch.off()
    assert switch.forced() is None
    for value in ("0", "off", " False ", "no"):
        monkeypatch.setenv("ATTNRES_TEST_SWITCH", value)
        assert switch.off()
        assert switch.off_reason() == f"off (ATTNRES_TEST_SWITCH={value})"
    with switch.use(True):
        assert not switch.off()
        assert switch.forced() is True
        with switch.use(False):
            assert switch.off()
            assert switch.off_reason() == "off (use_kernels(False))"
            with switch.use(None):
                assert switch.off()
        assert not switch.off()
    assert switch.off()
    assert switch.forced() is None
    monkeypatch.setenv("ATTNRES_TEST_SWITCH", "1")
    assert not switch.off()


def _model(scheme: str, n_blocks: int | None = 8, block_size: int | None = None, **options) -> Transformer:
    cfg = ModelConfig(
        vocab_size=61,
        d_model=48,
        n_layers=4,
        n_heads=4,
        max_seq_len=16,
        residual=scheme,
        n_blocks=n_blocks,
        block_size=block_size,
        residual_options=options,
    )
    return sharp_model(cfg)


@needs_compiler
@pytest.mark.parametrize(
    ("scheme", "options"),
    [
        ("block", {"n_blocks": 2}),
        ("block", {"block_size": 3}),
        ("block", {"n_blocks": 2, "key_norm": False}),
        ("full", {}),
        ("full", {"read_group": 3}),
    ],
)
def test_models_train_the_same_with_and_without_the_kernels(monkeypatch, spy, scheme, options):
    """Block and Full AttnRes in fp32, kernels on vs off, both against the same model in float64 (where the
    kernels never run): logits and every parameter's gradient are as close to it with the kernels as without."""
    model = _model(scheme, **options)
    idx = torch.randint(0, 61, (3, 16), generator=torch.Generator().manual_seed(2))

    def compute(m=model):
        m.zero_grad(set_to_none=True)
        logits, loss = m(idx, idx)
        loss.backward()
        return [logits.detach(), *(p.grad for p in m.parameters())]

    on, off = run_both(monkeypatch, compute)
    assert spy.get("merge_backward", 0) > 0
    assert spy.get("mix_backward", 0) > 0
    calls = dict(spy)
    reference = compute(copy.deepcopy(model).double())
    assert spy == calls  # float64: the torch path
    names = ["logits"] + [n for n, _ in model.named_parameters()]
    for name, a, b, r in zip(names, on, off, reference):
        err_on, err_off = (a.double() - r).abs().max().item(), (b.double() - r).abs().max().item()
        assert err_on <= 2 * err_off + 1e-6, (name, err_on, err_off)


def test_switched_off_and_unbuildable_kernels_fall_back(monkeypatch, tmp_path, spy):
    """ATTNRES_CPU_KERNELS=0, or no working compiler: the torch path runs, and status says why."""
    monkeypatch.setenv(cpu_kernels.ENV_SWITCH, "0")
    assert cpu_kernels.status() == "off (ATTNRES_CPU_KERNELS=0)"
    assert cpu_kernels.library() is None
    monkeypatch.setenv(cpu_kernels.ENV_SWITCH, "1")
    monkeypatch.setattr(cpu_kernels, "_state", {})  # forget this process's build
    monkeypatch.setenv("ATTNRES_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    with pytest.warns(UserWarning, match="did not build"):
        assert cpu_kernels.status().startswith("unavailable: ")
    assert cpu_kernels.library() is None  # the failed build is remembered: no second attempt, no second warning
    if shutil.which("cc") or shutil.which("gcc"):  # a cache directory that cannot be created: no crash either
        monkeypatch.setattr(cpu_kernels, "_state", {})
        monkeypatch.delenv("CC")
        blocked = tmp_path / "blocked"
        blocked.write_text("a file where the cache directory should be")
        monkeypatch.setenv("ATTNRES_CACHE_DIR", str(blocked))
        with pytest.warns(UserWarning, match="did not build"):
            assert cpu_kernels.status().startswith("unavailable: ")
    model = _model("block", n_blocks=2)
    _, loss = model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))
    loss.backward()
    assert torch.isfinite(loss)
    assert not spy


@needs_compiler
def test_a_build_is_cached_per_source_and_machine(monkeypatch, tmp_path):
    """One compile per (source, flags, compiler, CPU): a second process loads the cached library."""
    monkeypatch.setattr(cpu_kernels, "_state", {})
    monkeypatch.setenv("ATTNRES_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_kernels, "_compiler_version", lambda cc: "some cc 1.0")
    assert cpu_kernels.status().startswith("on")
    built = list((tmp_path / "kernels").glob("depth_mix-*.so"))
    assert len(built) == 1
    assert built[0].stat().st_mode & 0o777 == 0o755
    monkeypatch.setattr(cpu_kernels, "_state", {})  # as in a new process
    monkeypatch.setattr(cpu_kernels.subprocess, "run", lambda *a, **k: pytest.fail(f"compiled again: {a}"))
    assert cpu_kernels.status().startswith("on")
    assert str(built[0]) in cpu_kernels.status()


@needs_compiler
def test_processes_building_at_once_share_one_cache(tmp_path):
    """The parallel launcher starts several runs at once on an empty cache: each builds or loads, none fails."""
    import os
    import subprocess
    import sys

    code = "from attnres import cpu_kernels; print(cpu_kernels.status())"
    repo = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "ATTNRES_CACHE_DIR": str(tmp_path),
        cpu_kernels.ENV_SWITCH: "1",
        "PYTHONPATH": str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    assert all(out.startswith("on (") for out, _ in outs), outs
    assert len(list((tmp_path / "kernels").glob("depth_mix-*.so"))) == 1
    assert not list((tmp_path / "kernels").glob("*.so.tmp*"))
    assert len(list((tmp_path / "kernels").iterdir())) == 1
