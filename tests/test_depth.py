"""The depth-mixing ops (attnres/depth.py) with tracked sources against plain autograd and their definitions, in
float64, where every op runs its plain-torch reference (the fused kernels, and their memory contract, are checked
against these references in tests/test_cpu_kernels.py and tests/test_triton_kernels.py)."""

import gc
import weakref

import pytest
import torch
from depth_cases import reads_sharing_sources

from attnres.depth import (
    attend_batched,
    key_logits,
    merge_read,
    mix_sources,
    mix_sources_batched,
    mix_sources_reference,
    rms_normalize,
    rmsnorm_unit,
    track_source,
)

torch.set_num_threads(1)


@pytest.mark.parametrize("eps", [None, 1e-6])
def test_tracked_sources_gradients_match_plain_autograd_and_finite_differences(eps):
    torch.manual_seed(0)
    B, T, D = 2, 3, 5
    values = [torch.randn(B, T, D, dtype=torch.double, requires_grad=True) for _ in range(4)]
    w1 = torch.rand(2, B, T, dtype=torch.double, requires_grad=True)
    w2 = torch.rand(4, B, T, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w1, w2, *vs: reads_sharing_sources(vs, w1, w2, True, eps), (w1, w2, *values))
    plain = torch.autograd.grad(reads_sharing_sources(values, w1, w2, False, eps), [w1, w2, *values])
    out = reads_sharing_sources(values, w1, w2, True, eps)
    g1 = torch.autograd.grad(out, [w1, w2, *values], retain_graph=True)
    g2 = torch.autograd.grad(out, [w1, w2, *values])  # a retained graph: the sinks start from zero again
    for p, a, b in zip(plain, g1, g2):
        assert torch.allclose(p, a)
        assert torch.allclose(a, b)


def test_sinks_do_not_outlive_backward():
    """Regression guard (the SourceBank it replaces once leaked every step through an autograd cycle)."""
    from attnres import ModelConfig, Transformer, grad_sinks

    alive: weakref.WeakSet = weakref.WeakSet()
    original = grad_sinks.GradSink.__init__

    def tracking_init(self):
        original(self)
        alive.add(self)

    grad_sinks.GradSink.__init__ = tracking_init
    try:
        for residual in ("full", "block"):
            model = Transformer(
                ModelConfig(
                    vocab_size=32, n_layers=2, d_model=16, n_heads=2, max_seq_len=8, residual=residual, block_size=2
                )
            )
            idx = torch.randint(0, 32, (2, 8))
            for _ in range(2):
                model(idx, idx)[1].backward()
            gc.collect()
            assert len(alive) == 0, residual
    finally:
        grad_sinks.GradSink.__init__ = original


def test_track_source_is_the_identity_without_autograd():
    x = torch.randn(2, 3, 4, requires_grad=True)
    with torch.no_grad():
        assert track_source(x) is x
    y = torch.randn(2, 3, 4)
    assert track_source(y) is y


def test_mix_sources_gradcheck():
    torch.manual_seed(2)
    vs = [torch.randn(2, 3, 4, dtype=torch.double, requires_grad=True) for _ in range(3)]
    w = torch.rand(3, 2, 3, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w, *v: mix_sources(w, list(v)), (w, *vs))
    with pytest.raises(ValueError, match=r"\[S, B, T\]"):
        mix_sources(torch.rand(3, 2, 3, 5), vs)


@pytest.mark.parametrize("track", [False, True])
def test_mix_sources_batched_equals_one_read_at_a_time(track):
    """Q reads of the same sources in one pass == Q separate reads, in value and every gradient (an unused read
    included), for plain and tracked sources; and finite differences."""
    torch.manual_seed(3)
    S, B, T, D, Q = 3, 2, 3, 4, 4
    vs = [torch.randn(B, T, D, dtype=torch.double, requires_grad=True) for _ in range(S)]
    w = torch.rand(S, B, T, Q, dtype=torch.double, requires_grad=True)
    t = track_source if track else (lambda v: v)

    def loss(batched: bool, used=range(Q - 1)):  # the last read unused
        sources = [t(v * 1.0) for v in vs]
        outs = mix_sources_batched(w, sources) if batched else [mix_sources(w[..., q], sources) for q in range(Q)]
        return sum((outs[q] * (q + 1)).pow(2).sum() for q in used), outs

    fast, outs = loss(True)
    assert all(o.dtype == torch.double and o.shape == (B, T, D) for o in outs)
    assert len(outs) == Q
    slow, _ = loss(False)
    assert torch.allclose(fast, slow)
    for a, b in zip(torch.autograd.grad(fast, [w, *vs]), torch.autograd.grad(slow, [w, *vs])):
        assert torch.allclose(a, b)
    assert torch.autograd.gradcheck(lambda w, *v: mix_sources_batched(w, [t(x) for x in v]), (w, *vs))
    # gradients that autograd shares between outputs, or expands from a scalar (sinks keep them for a while)
    sources = [t(v * 1.0) for v in vs]
    outs = mix_sources_batched(w, sources)
    shared = torch.autograd.grad((outs[0] + outs[1]).sum() * 3 + outs[2].mean(), [w, *vs])
    outs = [mix_sources(w[..., q], [v * 1.0 for v in vs]) for q in range(Q)]
    expected = torch.autograd.grad((outs[0] + outs[1]).sum() * 3 + outs[2].mean(), [w, *vs])
    for a, b in zip(shared, expected):
        assert torch.allclose(a, b)
    with pytest.raises(ValueError, match=r"\[S, B, T, Q\]"):
        mix_sources_batched(w[..., 0], vs)


def _merge_reference(base, z, extras, eps, queries=None, key_eps=1e-5):
    """The read as one softmax over [base's group (logit 0 relative to its lse), extra_1 .. extra_K]: written
    from the definition with plain ops (with queries, z is the offset and each extra adds q_k . RMSNorm(e_k))."""
    h = base
    if queries is not None:
        z = z + torch.stack([(rms_normalize(e, key_eps) * q).sum(-1) for e, q in zip(extras, queries)])
    if extras:
        a = torch.cat([torch.zeros_like(z[:1]), z]).softmax(0)
        h = a[0, ..., None] * base + sum(a[k + 1, ..., None] * e for k, e in enumerate(extras))
    return h if eps is None else rms_normalize(h, eps)


@pytest.mark.parametrize("eps", [None, 1e-3])
@pytest.mark.parametrize(
    ("n_extras", "track", "with_queries"),
    [(0, False, False), (1, False, False), (3, False, False), (3, True, False), (1, False, True), (2, True, True)],
)
def test_merge_read_matches_its_definition_and_finite_differences(eps, n_extras, track, with_queries):
    """The merge never keeps base; its backward derives everything from g.h (from the norm's backward when
    fused). eps is large here so that the g.h = m D eps rstd^2 term is not negligible. With queries the extras'
    key logits are computed inside (Block's partial sum)."""
    torch.manual_seed(5)
    B, T, D, key_eps = 2, 3, 6, 1e-2
    base = torch.randn(B, T, D, dtype=torch.double, requires_grad=True)
    extras = [(torch.randn(B, T, D, dtype=torch.double) * 0.3).requires_grad_() for _ in range(n_extras)]
    z = (torch.randn(n_extras, B, T, dtype=torch.double) * 3).requires_grad_() if n_extras else None
    queries = torch.randn(n_extras, D, dtype=torch.double, requires_grad=True) if with_queries else None
    inputs = [base] + ([z] if n_extras else []) + ([queries] if with_queries else []) + extras
    t = track_source if track else (lambda v: v)

    def merged(b, zz, *rest, out_dtype=torch.double):  # extras used twice: by this read and directly
        qq, es = (rest[0], rest[1:]) if with_queries else (None, rest)
        es = [t(e * 1.0) for e in es]
        return merge_read(b * 1.0, zz, es, eps, out_dtype, qq, key_eps), es  # fused: base is consumed: a copy

    out, used = merged(base, z, *inputs[2:])
    ref = _merge_reference(base, z, extras, eps, queries, key_eps)
    assert torch.allclose(out, ref)
    g = torch.randn_like(out)
    loss = (out * g).sum() + sum(e.pow(2).sum() for e in used)
    loss_ref = (ref * g).sum() + sum(e.pow(2).sum() for e in extras)
    for a, b in zip(torch.autograd.grad(loss, inputs), torch.autograd.grad(loss_ref, inputs)):
        assert torch.allclose(a, b)
    assert torch.autograd.gradcheck(lambda *x: merged(x[0], x[1] if n_extras else None, *x[2:])[0], tuple(inputs))
    for out_dtype in (torch.double, torch.float):  # (base written in place, never kept: test_cpu_kernels.py)
        out = merge_read(base * 1.0, z, extras, eps, out_dtype, queries, key_eps)
        assert out.dtype == out_dtype
        assert torch.allclose(out.double(), ref, atol=1e-6)
    with pytest.raises(ValueError, match=r"z must be \[K, B, T\]"):
        merge_read(base * 1.0, torch.zeros(n_extras + 1, B, T, dtype=torch.double), extras, eps, torch.double)


def test_mix_sources_fused_with_the_prenorm_normalisation_equals_the_two_steps():
    """normalize_eps returns rmsnorm_unit of the read; values and every gradient (tracked sources included) are
    those of the unfused two steps, and of the reference (what torch.compile traces). (That the fused kernels keep
    only the normalised output, rstd, the weights and the sources: test_cpu_kernels.py.)"""
    torch.manual_seed(6)
    B, T, D, eps = 2, 3, 8, 1e-6
    vs = [torch.randn(B, T, D, dtype=torch.double, requires_grad=True) for _ in range(3)]
    w = torch.rand(3, B, T, dtype=torch.double).softmax(0).requires_grad_()
    assert torch.autograd.gradcheck(lambda w, *v: mix_sources(w, list(v), eps), (w, *vs))
    for track in (False, True):
        t = track_source if track else (lambda v: v)
        fused = mix_sources(w, [t(v) for v in vs], eps)
        unfused = rmsnorm_unit(mix_sources(w, list(vs)), eps)
        traced = mix_sources_reference(w, list(vs), eps)
        assert torch.allclose(fused, unfused)
        assert torch.allclose(fused, traced)
        g = torch.randn_like(fused)
        for a, b in zip(torch.autograd.grad(fused, [w, *vs], g), torch.autograd.grad(unfused, [w, *vs], g)):
            assert torch.allclose(a, b)


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
        if len(shape) == 3:
            out, ref = mix_sources(w, vals), mix_sources(w_ref, ref_vals)
        else:  # the batched reads, stacked for the comparison
            out, ref = torch.stack(mix_sources_batched(w, vals)), torch.stack(mix_sources_batched(w_ref, ref_vals))
        assert out.dtype == torch.float32
        assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-6)
        g = torch.randn_like(ref)
        grads = torch.autograd.grad(out, [w, *vals], g.float())
        grads_ref = torch.autograd.grad(ref, [w_ref, *ref_vals], g)
        for s, (a, b) in enumerate(zip(grads, grads_ref)):
            assert a.dtype == ([w, *vals])[s].dtype
            # the gradient is rounded to bf16 once for bf16 sources (products with bf16 values, as autocast does)
            assert torch.allclose(a.double(), b, rtol=2e-2, atol=2e-2 * b.abs().max().item()), s
    # fused with the PreNorm normalisation: the same within bf16 rounding of the gradient
    w_ref = torch.rand(S, B, T, dtype=torch.double).softmax(0).requires_grad_()
    w = w_ref.detach().float().requires_grad_()
    out, ref = mix_sources(w, vals, 1e-6), mix_sources(w_ref, ref_vals, 1e-6)
    assert out.dtype == torch.float32
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-5)
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
    assert not big_fp32
    assert any(t.data_ptr() == src.data_ptr() for t in saved)
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


@pytest.mark.parametrize("track", [False, True])
def test_attend_batched_matches_its_definition_and_finite_differences(track):
    """Phase 1 with the key logits (the op the GPU kernel implements): Q softmaxes over S sources of
    q . RMSNorm(v), their log-sum-exp and the mixes, with gradients through both outputs; a non-contiguous source
    (the key logits' backward once failed on one with several queries)."""
    torch.manual_seed(7)
    S, B, T, D, Q, eps = 3, 2, 3, 5, 3, 1e-2
    vs = [torch.randn(B, T, D, dtype=torch.double, requires_grad=True) for _ in range(S)]
    q = torch.randn(Q, D, dtype=torch.double, requires_grad=True)
    t = track_source if track else (lambda v: v)

    def ours(q, *vs):
        sources = [t(v * 1.0) for v in vs]
        sources[1] = sources[1].transpose(0, 1).contiguous().transpose(0, 1)
        outs, lse = attend_batched(sources, q, eps)
        return (*outs, lse)

    def reference(q, *vs):
        logits = torch.stack([rms_normalize(v, eps) @ q.t() for v in vs])  # [S, B, T, Q]
        alpha = logits.softmax(0)
        outs = [(alpha[..., i, None] * torch.stack(vs)).sum(0) for i in range(Q)]
        return (*outs, torch.logsumexp(logits, 0))

    got, want = ours(q, *vs), reference(q, *vs)
    assert all(torch.allclose(a, b) for a, b in zip(got, want))
    g = [torch.randn_like(x) for x in want]
    for a, b in zip(torch.autograd.grad(got, [q, *vs], g), torch.autograd.grad(want, [q, *vs], g)):
        assert torch.allclose(a, b)
    assert torch.autograd.gradcheck(ours, (q, *vs))
    with pytest.raises(ValueError, match=r"queries must be \[Q, D\]"):
        attend_batched(vs, q[:, :2], eps)
