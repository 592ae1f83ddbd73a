"""CUDA checks: the same model on the GPU, in bf16 and with flash attention, and the harness' GPU preset.

Skipped where torch sees no CUDA device (CI, this project's CPU machines). On a GPU machine:

    python -m pytest tests/test_gpu.py -q          # also part of scripts/gpu_suite.sh

What they pin down (each a way a GPU port has gone wrong elsewhere): CUDA fp32 == CPU fp32 for every residual
scheme; Block's two-phase path == its plain path under bf16 autocast; zero-init AttnRes == baseline on CUDA;
flash SDPA == math SDPA; the depth softmax stays fp32 under autocast; the read fused with the PreNorm == the
unfused read under bf16 (and keeps one fp32 [B, T, d] less per read); torch.compile == eager; and
`trainer=gpu` (bf16-mixed) trains to a completed record.

The Triton depth kernels (attnres/gpu_kernels.py; on CUDA by default) are checked here compiled, as
tests/test_triton_kernels.py checks them in Triton's interpreter on the CPU: the two ops at the paper's widths
(d 896 and 1264) in fp32 and with bf16 sources against the torch path, Block and Full models end to end, cached
decoding == the full forward, regional and whole-model compile (fullgraph through the custom ops) == eager, and
the four kernels captured in a CUDA graph and replayed on new inputs == run eagerly on them.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from attnres import ModelConfig, Transformer
from attnres.residual import RESIDUAL_SCHEMES

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")
# head_dim 64 so that flash attention applies; 4 blocks (8 sublayers) so Block has several blocks.
SMALL = {
    "vocab_size": 101,
    "n_layers": 4,
    "d_model": 128,
    "n_heads": 4,
    "head_dim": 64,
    "d_ff": 256,
    "max_seq_len": 256,
}


def build(residual: str, seed: int = 0, randomize: bool = True, **kw) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(**{**SMALL, "residual": residual, **kw}))
    if randomize:  # non-zero pseudo-queries, so depth attention is not a plain mean
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.startswith("residual."):
                    p.add_(0.5 * torch.randn(p.shape, generator=g))
    return model


def batch(B: int = 2, T: int = 256, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, SMALL["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def loss_and_grads(model: Transformer, idx: torch.Tensor, amp: bool = False, backend=None):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model.zero_grad(set_to_none=True)
    backends = (
        [backend]
        if backend is not None
        else [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    )
    with sdpa_kernel(backends), torch.autocast(idx.device.type, dtype=torch.bfloat16, enabled=amp):
        _, loss = model(idx, idx)
    loss.backward()
    return loss.detach().float().cpu(), {
        n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None
    }


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))


@pytest.fixture(autouse=True)
def _exact_fp32_matmuls():
    """TF32 would make CUDA fp32 differ from CPU fp32 by ~1e-3; the comparisons below want fp32 itself."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize("residual", list(RESIDUAL_SCHEMES))
def test_cuda_fp32_matches_cpu(residual):
    from torch.nn.attention import SDPBackend

    cpu = build(residual)
    gpu = build(residual).to(CUDA)
    idx = batch(T=64)
    l_cpu, g_cpu = loss_and_grads(cpu, idx, backend=SDPBackend.MATH)
    l_gpu, g_gpu = loss_and_grads(gpu, idx.to(CUDA), backend=SDPBackend.MATH)
    assert torch.allclose(l_cpu, l_gpu, rtol=1e-5, atol=1e-5)
    assert g_cpu.keys() == g_gpu.keys()
    for name in g_cpu:
        assert torch.allclose(g_cpu[name], g_gpu[name], rtol=1e-3, atol=1e-5), name


def test_cuda_block_two_phase_matches_plain_under_bf16():
    idx = batch().to(CUDA)
    fast = build("block", block_size=2).to(CUDA)
    plain = build("block", block_size=2, residual_options={"two_phase": False}).to(CUDA)
    l_fast, g_fast = loss_and_grads(fast, idx, amp=True)
    l_plain, g_plain = loss_and_grads(plain, idx, amp=True)
    assert abs(float(l_fast - l_plain)) < 2e-3 * float(l_plain)
    for name in g_plain:
        assert cosine(g_fast[name], g_plain[name]) > 0.995, name


@pytest.mark.parametrize(("residual", "kw"), [("full", {}), ("block", {"block_size": 2})])
def test_cuda_fused_read_matches_unfused_under_bf16_and_saves_less(residual, kw, monkeypatch):
    """The read fused with the PreNorm normalisation (mix_sources normalize_eps) against read-then-RMSNorm, in
    bf16 autocast on the GPU; and its point: fewer bytes kept for backward."""
    from attnres.residual import ResidualScheme

    idx = batch().to(CUDA)
    fused = build(residual, **kw).to(CUDA)
    plain = build(residual, **kw).to(CUDA)

    def saved_bytes(model):
        seen = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = loss_and_grads(model, idx, amp=True)
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        return out, sum(v for k, v in seen.items() if k not in params)

    (l_fused, g_fused), bytes_fused = saved_bytes(fused)
    with monkeypatch.context() as m:
        m.setattr(type(plain.residual), "read_normalized", ResidualScheme.read_normalized)
        m.setattr(type(plain.residual), "final_normalized", ResidualScheme.final_normalized)
        (l_plain, g_plain), bytes_plain = saved_bytes(plain)
    assert abs(float(l_fused - l_plain)) < 1e-3 * float(l_plain)
    for name in g_plain:
        assert cosine(g_fused[name], g_plain[name]) > 0.995, name
    B, T = idx.shape
    reads = 2 * SMALL["n_layers"] + 1
    assert bytes_plain - bytes_fused >= 0.9 * reads * B * T * SMALL["d_model"] * 4  # one fp32 read per read


@pytest.mark.parametrize(("residual", "kw"), [("full", {}), ("block", {"block_size": 2}), ("block", {"n_blocks": 1})])
def test_cuda_zero_init_equals_baseline(residual, kw):
    idx = batch().to(CUDA)
    # eps far below the activations' mean square, so RMSNorm is scale-free (as in tests/test_model.py)
    base = build("baseline", randomize=False, norm_eps=1e-12).to(CUDA)
    model = build(residual, randomize=False, norm_eps=1e-12, **kw).to(CUDA)
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)  # AttnRes queries stay zero
    assert set(missing) == {"residual.queries", "residual.key_norm_weight"}
    assert not unexpected
    l_base, _ = loss_and_grads(base, idx)
    l_attn, _ = loss_and_grads(model, idx)
    assert torch.allclose(l_base, l_attn, rtol=1e-5)


@pytest.mark.parametrize("residual", ["baseline", "full", "block"])
def test_cuda_flash_attention_matches_math_in_bf16(residual):
    from torch.nn.attention import SDPBackend

    idx = batch().to(CUDA)
    model = build(residual).to(CUDA)
    l_flash, g_flash = loss_and_grads(model, idx, amp=True, backend=SDPBackend.FLASH_ATTENTION)
    l_math, g_math = loss_and_grads(model, idx, amp=True, backend=SDPBackend.MATH)
    assert abs(float(l_flash - l_math)) < 1e-2
    for name in g_math:
        assert cosine(g_flash[name], g_math[name]) > 0.99, name


@pytest.mark.parametrize("residual", ["full", "block"])
def test_cuda_depth_softmax_stays_fp32_under_autocast(residual):
    model = build(residual).to(CUDA)
    model.record_diagnostics = True
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits, loss = model(batch().to(CUDA), batch().to(CUDA))
    assert logits.dtype == torch.bfloat16
    assert torch.isfinite(loss)
    weights = model.diagnostics["depth_weights"]
    sums = torch.nansum(weights, dim=1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)


@pytest.mark.parametrize("residual", ["full", "block"])
def test_cuda_compile_matches_eager(residual):
    """In fp32 (TF32 off), so that a difference is the compiler's and not bf16 rounding of fused kernels."""
    from torch.nn.attention import SDPBackend

    idx = batch().to(CUDA)
    model = build(residual).to(CUDA)
    l_eager, g_eager = loss_and_grads(model, idx, backend=SDPBackend.MATH)
    compiled = torch.compile(model)
    model.zero_grad(set_to_none=True)
    with torch.nn.attention.sdpa_kernel([SDPBackend.MATH]):
        _, loss = compiled(idx, idx)
    loss.backward()
    assert torch.allclose(loss.detach().cpu(), l_eager, rtol=1e-5)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad.cpu(), g_eager[name], rtol=1e-3, atol=1e-5), name


@pytest.mark.parametrize("variant", ["baseline", "block_attnres"])
def test_gpu_trainer_preset_trains_in_bf16(train_cfg, variant):
    from experiments.train import train

    cfg = train_cfg(f"model={variant}", "trainer=gpu")
    assert cfg.trainer.precision == "bf16-mixed"
    rec = train(cfg)
    assert rec["status"] == "completed"
    assert math.isfinite(rec["val_loss"])
    assert rec["val_loss"] < 5.6
    saved = (Path(rec["run_dir"]) / "config.yaml").read_text()
    assert "precision: bf16-mixed" in saved


# ---------------------------------------------------------------------------------------------------------------
# The Triton depth kernels, compiled


def _kernel_launches(monkeypatch) -> dict[str, int]:
    from attnres import depth_mix_triton

    calls: dict[str, int] = {}
    for name in ("attend_fwd", "attend_bwd", "merge_fwd", "merge_bwd"):
        kernel = getattr(depth_mix_triton, name)

        class Counted:
            def __getitem__(self, grid, _k=kernel, _n=name):
                calls[_n] = calls.get(_n, 0) + 1
                return _k[grid]

        monkeypatch.setattr(depth_mix_triton, name, Counted())
    return calls


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("D", [896, 1264])  # (small and odd D: tests/test_triton_kernels.py)
@pytest.mark.parametrize("low", [False, True])
def test_cuda_triton_ops_equal_the_torch_path(D, low, monkeypatch):
    """attend (phase 1, scoring included) and merge (with a key logit inside) at the paper widths, the sources fp32
    or the embedding fp32 and the rest bf16 (autocast's mix): values and every gradient against the torch path."""
    from attnres import gpu_kernels
    from attnres.depth import attend_batched, merge_read, track_source

    assert gpu_kernels.applies(torch.zeros(1, 1, D, device=CUDA)), gpu_kernels.status()
    calls = _kernel_launches(monkeypatch)
    torch.manual_seed(0)
    B, T, S, Q = 2, 256, 5, 3
    vs = [torch.randn(B, T, D, device=CUDA) for _ in range(S)]
    if low:
        vs = [vs[0]] + [v.bfloat16() for v in vs[1:]]
    vs = [v.requires_grad_() for v in vs]
    q = torch.randn(Q + 1, D, device=CUDA, requires_grad=True)

    def compute():
        sources = [track_source(v * 1.0) for v in vs]
        outs, lse = attend_batched(sources[:-1], q[:Q], 1e-6)
        y = merge_read(outs[1] * 1.0, -lse[None, ..., 1], [sources[-1]], 1e-6, torch.float32, q[Q:], 1e-6)  # (consumed)
        loss = (y * torch.linspace(-1, 1, D, device=CUDA)).sum() + outs[0].pow(2).sum() + outs[2].sum() + lse.sum()
        return [*outs, lse, y, *torch.autograd.grad(loss, [q, *vs])]

    on = compute()
    assert calls == {"attend_fwd": 1, "attend_bwd": 1, "merge_fwd": 1, "merge_bwd": 1}
    with gpu_kernels.use_kernels(False):
        off = compute()
    assert calls == {"attend_fwd": 1, "attend_bwd": 1, "merge_fwd": 1, "merge_bwd": 1}
    for i, (a, b) in enumerate(zip(on, off)):
        assert a.dtype == b.dtype, i
        assert a.shape == b.shape, i
        tol = 2**-7 if a.dtype == torch.bfloat16 else 1e-4  # bf16: a gradient rounded once; fp32: summation order
        assert _rel_err(a, b) <= tol, (i, _rel_err(a, b))


@pytest.mark.parametrize(("residual", "kw"), [("block", {"block_size": 2}), ("block", {"n_blocks": 2}), ("full", {})])
@pytest.mark.parametrize("amp", [False, True])
def test_cuda_models_on_the_kernels_equal_the_torch_path(residual, kw, amp, monkeypatch):
    """Block and Full AttnRes with the Triton kernels (the CUDA default) against the torch path: fp32 (TF32 off) to
    rounding; under bf16 autocast within bf16's effect on the rest of the model."""
    from torch.nn.attention import SDPBackend

    from attnres import gpu_kernels

    calls = _kernel_launches(monkeypatch)
    model = build(residual, **kw).to(CUDA)
    idx = batch().to(CUDA)
    l_on, g_on = loss_and_grads(model, idx, amp=amp, backend=SDPBackend.MATH)
    assert set(calls) == {"attend_fwd", "attend_bwd", "merge_fwd", "merge_bwd"}
    with gpu_kernels.use_kernels(False):
        l_off, g_off = loss_and_grads(model, idx, amp=amp, backend=SDPBackend.MATH)
    if not amp:
        assert torch.allclose(l_on, l_off, rtol=1e-5)
        for name in g_off:
            assert torch.allclose(g_on[name], g_off[name], rtol=1e-3, atol=1e-5), name
    else:
        assert abs(float(l_on - l_off)) < 2e-3 * float(l_off)
        for name in g_off:
            assert cosine(g_on[name], g_off[name]) > 0.995, name


@pytest.mark.parametrize("residual", list(RESIDUAL_SCHEMES))
def test_cuda_cached_decoding_equals_the_full_forward(residual):
    """Prefill 200 tokens, decode 6 one at a time, then a chunk of 50 (flash attention and the Triton kernels):
    the logits of a forward over all 256, fp32 with TF32 off."""
    model = build(residual).to(CUDA)
    idx = batch(T=256).to(CUDA)
    with torch.inference_mode():
        full = model(idx)
        cache = model.new_cache()
        steps = [model(idx[:, :200], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(200, 206)]
        steps.append(model(idx[:, 206:], cache=cache))
    assert torch.allclose(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("residual", ["baseline", "full", "block"])
def test_cuda_regional_compile_matches_eager(residual):
    """compile_regions (inductor, the attention and MLP compiled once, the Triton depth kernels eager) == eager.
    The three schemes share the compiled sublayers (same shapes), so only the first compiles."""
    import copy

    from torch.nn.attention import SDPBackend

    idx = batch().to(CUDA)
    model = build(residual).to(CUDA)
    l_eager, g_eager = loss_and_grads(model, idx, backend=SDPBackend.MATH)
    compiled = copy.deepcopy(model)
    compiled.compile_regions()
    l_comp, g_comp = loss_and_grads(compiled, idx, backend=SDPBackend.MATH)
    assert torch.allclose(l_comp, l_eager, rtol=1e-5)
    for name in g_eager:
        assert torch.allclose(g_comp[name], g_eager[name], rtol=1e-3, atol=1e-5), name


def test_cuda_compile_fullgraph_through_the_triton_ops():
    """inductor with fullgraph=True over a phase 1 and a merge: the custom ops are opaque nodes of one graph."""
    import torch._dynamo

    from attnres.depth import attend_batched, merge_read

    torch.manual_seed(1)
    vs = [torch.randn(2, 64, 96, device=CUDA, requires_grad=True) for _ in range(3)]
    q = torch.randn(2, 96, device=CUDA, requires_grad=True)

    def fn(q, *vs):
        outs, lse = attend_batched(list(vs[:2]), q, 1e-6)
        y = merge_read(outs[0], -lse[None, ..., 0], [vs[2]], 1e-6, torch.float32, q[1:], 1e-6)
        return y.pow(3).sum() + outs[1].sum()

    eager = fn(q, *vs)
    g_eager = torch.autograd.grad(eager, [q, *vs])
    torch._dynamo.reset()
    got = torch.compile(fn, fullgraph=True)(q, *vs)
    for a, b in zip((got, *torch.autograd.grad(got, [q, *vs])), (eager, *g_eager)):
        assert _rel_err(a, b) <= 1e-4


def test_cuda_graph_replays_the_triton_ops_on_new_inputs():
    """attend and merge, their forward and backward kernels (the custom ops, tables included), captured in one
    CUDA graph: replayed after new values are copied into the captured inputs, they give what running them
    eagerly on those values gives, bit for bit. The launch path reads no host memory (its tables are written by
    kernels whose arguments carry the addresses), so the replay is the captured computation."""
    from attnres import gpu_kernels as gk

    torch.manual_seed(0)
    B, T, D, S, Q = 2, 128, 896, 4, 3
    vs = [torch.randn(B, T, D, device=CUDA).bfloat16() for _ in range(S)]
    q = torch.randn(Q + 1, D, device=CUDA)
    extra = torch.randn(B, T, D, device=CUDA).bfloat16()
    grad_y = torch.randn(B, T, D, device=CUDA)
    inputs = [*vs, q, extra, grad_y]

    def step() -> list[torch.Tensor]:
        source_grads = [torch.empty_like(v) for v in vs]
        extra_grad = torch.empty_like(extra)
        outs, lse, logits, rstd = gk.attend(vs, q[:Q], 1e-6)
        y, y32, a, r, lg, kr = gk.merge(outs[0], -lse[None, ..., 0], [extra], q[Q:], 1e-6, 1e-6, torch.bfloat16)
        gb, gz, gq = gk.merge_backward(grad_y, y32, a, r, [extra], q[Q:], lg, kr, torch.float32, [extra_grad], [1])
        grads = [gb, *(o * 0.5 for o in outs[1:])]
        gq1 = gk.attend_backward(vs, q[:Q], lse, logits, rstd, grads, -gz[0, ..., None].expand_as(lse).contiguous(),
                                 source_grads, [1] * S)  # fmt: skip
        return [*outs, lse, y, gb, gz, gq, gq1, extra_grad, *source_grads]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up: compiles the kernels outside the capture
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for x in inputs:
        x.copy_(torch.randn(x.shape, device=CUDA).to(x.dtype))
    graph.replay()
    torch.cuda.synchronize()
    replayed = [c.clone() for c in captured]
    eager = step()
    for i, (a, b) in enumerate(zip(replayed, eager)):
        assert torch.equal(a, b), i
