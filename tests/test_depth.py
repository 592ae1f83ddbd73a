"""The depth-mixing kernels (SourceBank, key_logits, mix_sources) against plain autograd, in float64."""

import torch

from attnres.depth import SourceBank, key_logits, mix_sources, rms_normalize

torch.set_num_threads(1)


def test_source_bank_gradients_match_finite_differences():
    torch.manual_seed(0)
    B, T, D = 2, 3, 5
    values = [torch.randn(B, T, D, dtype=torch.double, requires_grad=True) for _ in range(4)]
    w1 = torch.rand(B, T, 2, dtype=torch.double, requires_grad=True)
    w2 = torch.rand(B, T, 2, 4, dtype=torch.double, requires_grad=True)

    def f(w1, w2, *vs):
        bank = SourceBank(6)
        bank.add(vs[0])
        bank.add(vs[1] * 2)
        o1 = bank.mix(w1)  # one read over 2 sources
        bank.add(vs[2] + o1)  # a source that depends on an earlier read
        bank.add(vs[3])
        o2 = bank.mix(w2)  # two reads at once over 4 sources
        return o1.sum() * 0.3 + (o2 * o2).sum() + o1.pow(2).sum()

    assert torch.autograd.gradcheck(f, (w1, w2, *values))
    out = f(w1, w2, *values)  # a retained graph gives the same gradients twice (the bank's buffer is consumed)
    g1 = torch.autograd.grad(out, values, retain_graph=True)
    g2 = torch.autograd.grad(out, values)
    assert all(torch.allclose(a, b) for a, b in zip(g1, g2))


def test_source_bank_equals_mix_sources():
    torch.manual_seed(1)
    values = [torch.randn(2, 4, 8) for _ in range(3)]
    w = torch.rand(2, 4, 3)
    bank = SourceBank(3)
    for v in values:
        bank.add(v)
    assert torch.allclose(bank.mix(w), mix_sources(w.permute(2, 0, 1), values), atol=1e-6)


def test_mix_sources_gradcheck():
    torch.manual_seed(2)
    vs = [torch.randn(2, 3, 4, dtype=torch.double, requires_grad=True) for _ in range(3)]
    for shape in [(3, 2, 3), (3, 2, 3, 5)]:
        w = torch.rand(*shape, dtype=torch.double, requires_grad=True)
        assert torch.autograd.gradcheck(lambda w, *v: mix_sources(w, list(v)), (w, *vs))


def test_key_logits_equal_normalised_keys_and_gradcheck():
    torch.manual_seed(3)
    x = torch.randn(2, 3, 6, dtype=torch.double, requires_grad=True)
    q = torch.randn(4, 6, dtype=torch.double, requires_grad=True)
    assert torch.allclose(key_logits(x, q, 1e-5), rms_normalize(x, 1e-5) @ q.t())
    assert torch.autograd.gradcheck(lambda x, q: key_logits(x, q, 1e-5), (x, q))


def test_banks_are_freed_after_backward(monkeypatch):
    """Regression: the bank's autograd handles once formed a cycle through autograd that leaked every step's graph
    (tens of MB per step). After forward + backward no SourceBank may stay alive."""
    import gc
    import weakref

    from attnres import ModelConfig, Transformer
    from attnres import depth

    alive: weakref.WeakSet = weakref.WeakSet()
    original = depth.SourceBank.__init__

    def tracking_init(self, capacity):
        original(self, capacity)
        alive.add(self)

    monkeypatch.setattr(depth.SourceBank, "__init__", tracking_init)
    for residual in ("full", "block"):
        model = Transformer(ModelConfig(vocab_size=32, n_layers=2, d_model=16, n_heads=2, max_seq_len=8,
                                        residual=residual, block_size=2))
        idx = torch.randint(0, 32, (2, 8))
        for _ in range(2):
            model(idx, idx)[1].backward()
        gc.collect()
        assert len(alive) == 0, residual
