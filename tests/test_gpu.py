"""CUDA checks: the same model on the GPU, in bf16 and with flash attention, and the harness' GPU preset.

Skipped where torch sees no CUDA device (CI, this project's CPU machines). On a GPU machine:

    python -m pytest tests/test_gpu.py -q          # also part of scripts/gpu_suite.sh

What they pin down (each a way a GPU port has gone wrong elsewhere): CUDA fp32 == CPU fp32 for every residual
scheme; Block's two-phase path == its plain path under bf16 autocast; zero-init AttnRes == baseline on CUDA;
flash SDPA == math SDPA; the depth softmax stays fp32 under autocast; the read fused with the PreNorm == the
unfused read under bf16 (and keeps one fp32 [B, T, d] less per read); torch.compile == eager; and
`trainer=gpu` (bf16-mixed) trains to a completed record.
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
SMALL = dict(vocab_size=101, n_layers=4, d_model=128, n_heads=4, head_dim=64, d_ff=256, max_seq_len=256)


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
    backends = [backend] if backend is not None else [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                                       SDPBackend.MATH]
    with sdpa_kernel(backends), torch.autocast(idx.device.type, dtype=torch.bfloat16, enabled=amp):
        _, loss = model(idx, idx)
    loss.backward()
    return loss.detach().float().cpu(), {n: p.grad.detach().float().cpu() for n, p in model.named_parameters()
                                         if p.grad is not None}


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


@pytest.mark.parametrize("residual,kw", [("full", {}), ("block", {"block_size": 2})])
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


@pytest.mark.parametrize("residual,kw", [("full", {}), ("block", {"block_size": 2}), ("block", {"n_blocks": 1})])
def test_cuda_zero_init_equals_baseline(residual, kw):
    idx = batch().to(CUDA)
    # eps far below the activations' mean square, so RMSNorm is scale-free (as in tests/test_model.py)
    base = build("baseline", randomize=False, norm_eps=1e-12).to(CUDA)
    model = build(residual, randomize=False, norm_eps=1e-12, **kw).to(CUDA)
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)  # AttnRes queries stay zero
    assert set(missing) == {"residual.queries", "residual.key_norm_weight"} and not unexpected
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
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)
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
    assert rec["status"] == "completed" and math.isfinite(rec["val_loss"]) and rec["val_loss"] < 5.6
    saved = (Path(rec["run_dir"]) / "config.yaml").read_text()
    assert "precision: bf16-mixed" in saved
