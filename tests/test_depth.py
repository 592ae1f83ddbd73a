"""The depth-mixing kernels (mix_sources with tracked sources, key_logits) against plain autograd, in float64."""

import gc
import weakref

import pytest
import torch

from attnres.depth import _mix_sources_traced, key_logits, mix_sources, rms_normalize, rmsnorm_unit, track_source

torch.set_num_threads(1)


def _reads(vs, w1, w2, track: bool, eps: float | None = None):
    """Sources mixed by several reads, one source depending on an earlier read (as in Full AttnRes). With eps the
    reads are fused with the PreNorm normalisation (the model's path, where sinks defer their terms)."""
    t = track_source if track else (lambda v: v)
    a, b = t(vs[0]), t(vs[1] * 2)
    o1 = mix_sources(w1, [a, b], eps)
    c, d = t(vs[2] + o1), t(vs[3])
    o2 = mix_sources(w2, [a, b, c, d], eps)
    o3 = mix_sources(w1, [d, a], eps)
    o4 = mix_sources(w2, [d, c, b, a], eps)  # more reads of a than a sink's group: a flush before the hand-over
    o5 = mix_sources(w1, [a, d], eps)
    o6 = mix_sources(w1, [b, a], eps)
    return o1.sum() * 0.3 + (o2 * o2).sum() + o1.pow(2).sum() + (o3 * o2).sum() + (o4 * o5).sum() + o6.sum()


@pytest.mark.parametrize("eps", [None, 1e-6])
def test_tracked_sources_gradients_match_plain_autograd_and_finite_differences(eps):
    torch.manual_seed(0)
    B, T, D = 2, 3, 5
    values = [torch.randn(B, T, D, dtype=torch.double, requires_grad=True) for _ in range(4)]
    w1 = torch.rand(2, B, T, dtype=torch.double, requires_grad=True)
    w2 = torch.rand(4, B, T, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w1, w2, *vs: _reads(vs, w1, w2, True, eps), (w1, w2, *values))
    plain = torch.autograd.grad(_reads(values, w1, w2, False, eps), [w1, w2, *values])
    out = _reads(values, w1, w2, True, eps)
    g1 = torch.autograd.grad(out, [w1, w2, *values], retain_graph=True)
    g2 = torch.autograd.grad(out, [w1, w2, *values])  # a retained graph: the sinks start from zero again
    for p, a, b in zip(plain, g1, g2):
        assert torch.allclose(p, a) and torch.allclose(a, b)


def test_sinks_do_not_outlive_backward():
    """Regression guard (the SourceBank it replaces once leaked every step through an autograd cycle)."""
    from attnres import ModelConfig, Transformer
    from attnres import depth

    alive: weakref.WeakSet = weakref.WeakSet()
    original = depth._GradSink.__init__

    def tracking_init(self):
        original(self)
        alive.add(self)

    depth._GradSink.__init__ = tracking_init
    try:
        for residual in ("full", "block"):
            model = Transformer(ModelConfig(vocab_size=32, n_layers=2, d_model=16, n_heads=2, max_seq_len=8,
                                            residual=residual, block_size=2))
            idx = torch.randint(0, 32, (2, 8))
            for _ in range(2):
                model(idx, idx)[1].backward()
            gc.collect()
            assert len(alive) == 0, residual
    finally:
        depth._GradSink.__init__ = original


def test_track_source_is_the_identity_without_autograd():
    x = torch.randn(2, 3, 4, requires_grad=True)
    with torch.no_grad():
        assert track_source(x) is x
    y = torch.randn(2, 3, 4)
    assert track_source(y) is y


def test_mix_sources_gradcheck():
    torch.manual_seed(2)
    vs = [torch.randn(2, 3, 4, dtype=torch.double, requires_grad=True) for _ in range(3)]
    for shape in [(3, 2, 3), (3, 2, 3, 5)]:
        w = torch.rand(*shape, dtype=torch.double, requires_grad=True)
        assert torch.autograd.gradcheck(lambda w, *v: mix_sources(w, list(v)), (w, *vs))


def test_mix_sources_fused_with_the_prenorm_normalisation_equals_the_two_steps():
    """normalize_eps returns rmsnorm_unit of the read; values and every gradient (tracked sources included) are
    those of the unfused two steps, and of the compile path's plain ops."""
    torch.manual_seed(6)
    B, T, D, eps = 2, 3, 8, 1e-6
    vs = [torch.randn(B, T, D, dtype=torch.double, requires_grad=True) for _ in range(3)]
    w = torch.rand(3, B, T, dtype=torch.double).softmax(0).requires_grad_()
    assert torch.autograd.gradcheck(lambda w, *v: mix_sources(w, list(v), eps), (w, *vs))
    for track in (False, True):
        t = track_source if track else (lambda v: v)
        fused = mix_sources(w, [t(v) for v in vs], eps)
        unfused = rmsnorm_unit(mix_sources(w, list(vs)), eps)
        traced = _mix_sources_traced(w, list(vs), eps)
        assert torch.allclose(fused, unfused) and torch.allclose(fused, traced)
        g = torch.randn_like(fused)
        for a, b in zip(torch.autograd.grad(fused, [w, *vs], g), torch.autograd.grad(unfused, [w, *vs], g)):
            assert torch.allclose(a, b)
    # the read h = sum w v is not kept for backward: only the normalised output, rstd, weights and the sources
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x) or x, lambda x: x):
        out = mix_sources(w, vs, eps)
    big = {x.data_ptr() for x in saved if x.numel() >= B * T * D}
    assert big == {v.data_ptr() for v in vs} | {out.data_ptr()}


def test_mix_sources_with_bf16_sources_accumulates_in_fp32():
    """Under autocast the embedding is fp32 and sublayer outputs are bf16: the read is fp32, accumulated in fp32
    without widening copies; gradients match float64 on the same (bf16-rounded) inputs."""
    torch.manual_seed(4)
    S, B, T, D = 6, 2, 5, 64
    ref_vals = [torch.randn(B, T, D, dtype=torch.double) for _ in range(S)]
    vals = [ref_vals[0].float()] + [v.bfloat16() for v in ref_vals[1:]]  # source 0 fp32, the rest bf16
    ref_vals = [v.double().requires_grad_() for v in vals]
    vals = [v.clone().requires_grad_() for v in vals]
    for shape in [(S, B, T), (S, B, T, 3)]:
        w_ref = torch.rand(*shape, dtype=torch.double).softmax(0).requires_grad_()
        w = w_ref.detach().float().requires_grad_()
        out, ref = mix_sources(w, vals), mix_sources(w_ref, ref_vals)
        assert out.dtype == torch.float32
        assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-6)
        g = torch.randn_like(ref)
        grads = torch.autograd.grad(out, [w, *vals], g.float())
        grads_ref = torch.autograd.grad(ref, [w_ref, *ref_vals], g)
        for s, (a, b) in enumerate(zip(grads, grads_ref)):
            assert a.dtype == ([w] + vals)[s].dtype
            # the gradient is rounded to bf16 once for bf16 sources (products with bf16 values, as autocast does)
            assert torch.allclose(a.double(), b, rtol=2e-2, atol=2e-2 * b.abs().max().item()), s
    # fused with the PreNorm normalisation: the same within bf16 rounding of the gradient
    w_ref = torch.rand(S, B, T, dtype=torch.double).softmax(0).requires_grad_()
    w = w_ref.detach().float().requires_grad_()
    out, ref = mix_sources(w, vals, 1e-6), mix_sources(w_ref, ref_vals, 1e-6)
    assert out.dtype == torch.float32 and torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, [w, *vals], g.float()), torch.autograd.grad(ref, [w_ref, *ref_vals], g)):
        assert torch.allclose(a.double(), b, rtol=2e-2, atol=2e-2 * b.abs().max().item())


def test_key_logits_equal_normalised_keys_and_gradcheck():
    torch.manual_seed(3)
    x = torch.randn(2, 3, 6, dtype=torch.double, requires_grad=True)
    q = torch.randn(4, 6, dtype=torch.double, requires_grad=True)
    assert torch.allclose(key_logits(x, q, 1e-5), rms_normalize(x, 1e-5) @ q.t())
    assert torch.autograd.gradcheck(lambda x, q: key_logits(x, q, 1e-5), (x, q))


def test_key_logits_keep_no_fp32_copy_of_a_bf16_source():
    """Backward keeps the bf16 source itself (alive anyway) and the small rstd/logits, not a widened copy."""
    torch.manual_seed(5)
    B, T, D, R = 2, 8, 64, 3
    src = torch.randn(B, T, D).bfloat16().requires_grad_()
    q = torch.randn(R, D, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = key_logits(src, q, 1e-5)
    big_fp32 = [t for t in saved if t.dtype == torch.float32 and t.numel() >= B * T * D]
    assert not big_fp32 and any(t.data_ptr() == src.data_ptr() for t in saved)
    # and the gradients are those of the fp32 formula on the same bf16 values
    ref_src = src.detach().double().requires_grad_()
    ref_q = q.detach().double().requires_grad_()
    ref = rms_normalize(ref_src, 1e-5) @ ref_q.t()
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    gs, gq = torch.autograd.grad(out, [src, q], g.float())
    rs, rq = torch.autograd.grad(ref, [ref_src, ref_q], g)
    assert torch.allclose(gq.double(), rq, rtol=1e-4, atol=1e-5)
    assert torch.allclose(gs.double(), rs, rtol=2e-2, atol=2e-2 * rs.abs().max().item())  # rounded to bf16 once
