"""Peer residual schemes (DenseFormer, Hyper-Connections, mHC, LAuReL) against naive transcriptions of their
papers' equations (written here, independently of attnres.peers), plus the invariants each paper promises."""

from __future__ import annotations

import copy
import math
import pathlib

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from attnres import ModelConfig, Transformer, flops_per_token, registry
from attnres.peers import sinkhorn_knopp

torch.set_num_threads(1)

TINY = {"vocab_size": 61, "n_layers": 3, "d_model": 32, "n_heads": 4, "max_seq_len": 16}

# The configs shipped in conf/model/ (name -> ModelConfig fields), plus a few more geometries.
PEERS = {
    "denseformer": ("denseformer", {}),
    "hyper_static": ("hyper", {"dynamic": False}),
    "hyper_dynamic": ("hyper", {"dynamic": True}),
    "mhc": ("mhc", {}),
    "laurel": ("laurel", {}),
}


def make(residual: str, options: dict | None = None, seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**{**TINY, "residual": residual, "residual_options": options or {}, **kw}))


def tokens(B: int = 2, T: int = 12, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def perturb_residual(model: Transformer, seed: int = 1, scale: float = 0.3) -> None:
    """Move every connection parameter away from its init (which would hide most mistakes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.residual.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name in ("dynamic_proj", "phi", "lr_down", "lr_up"):  # projections: unit-scale outputs
                p.add_(noise / math.sqrt(p.shape[-2]))
            else:
                p.add_(noise * scale)


def sublayer(model: Transformer, l: int, h: torch.Tensor) -> torch.Tensor:
    block = model.blocks[l // 2]
    return block.attn(h, model.rope_cos, model.rope_sin) if l % 2 == 0 else block.mlp(h)


def head(model: Transformer, h: torch.Tensor) -> torch.Tensor:
    return model.lm_head(model.norm(h))


def assert_matches(model: Transformer, naive, idx: torch.Tensor) -> None:
    """Logits and every parameter's gradient equal those of the naive rollout (on a copy of the model)."""
    ref = copy.deepcopy(model)
    logits, loss = model(idx, idx)
    expected = naive(ref, idx)
    assert torch.allclose(logits, expected, atol=1e-5), (logits - expected).abs().max()
    loss.backward()
    F.cross_entropy(expected.view(-1, expected.size(-1)), idx.view(-1)).backward()
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        assert p.grad is not None, name
        assert torch.allclose(p.grad, r.grad, atol=1e-5, rtol=1e-3), name


def assert_init_is_prenorm(residual: str, options: dict, eps: float = 1e-5, atol: float = 1e-5) -> None:
    """Shared weights loaded from a baseline: same logits, loss and gradients of every shared weight at step 0."""
    base = make("baseline", norm_eps=eps)
    model = make(residual, options, norm_eps=eps)
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert missing
    assert all(m.startswith("residual.") for m in missing)
    assert not unexpected
    idx = tokens()
    (lb, loss_b), (lm, loss_m) = base(idx, idx), model(idx, idx)
    assert torch.allclose(lm, lb, atol=atol)
    assert abs(loss_m.item() - loss_b.item()) < atol
    loss_b.backward()
    loss_m.backward()
    grads = dict(model.named_parameters())
    for name, p in base.named_parameters():
        assert torch.allclose(grads[name].grad, p.grad, atol=atol, rtol=1e-3), name


# ---------------------------------------------------------------------------------------------------------------
# DenseFormer (Pagliardini et al. 2024; epfml/DenseFormer's forward loop)
def naive_denseformer(model: Transformer, idx: torch.Tensor) -> torch.Tensor:
    """X_0 = embedding; X_i = B_i(Y_{i-1}) (a standard PreNorm block); after block i, if i % p == 0,
    Y_i = sum over j <= i with (i - j) % k == 0 of alpha_ij X_j, else Y_i = X_i; the LM head reads Y_{L_b}."""
    k = model.config.residual_options.get("dilation", 1)
    p = model.config.residual_options.get("period", 1)
    X = [model.tok_emb(idx)]
    y = X[0]
    for i in range(1, model.config.n_layers + 1):
        x = y + sublayer(model, 2 * i - 2, y)
        x = x + sublayer(model, 2 * i - 1, x)
        X.append(x)
        if i % p == 0:
            alphas = iter(model.residual.dwa[str(i)])
            y = 0
            for j in range(i + 1):
                if (i - j) % k == 0:
                    y = y + next(alphas) * X[j]
        else:
            y = x
    return head(model, y)


@pytest.mark.parametrize("options", [{}, {"dilation": 2}, {"period": 2}, {"dilation": 2, "period": 3}])
def test_denseformer_matches_naive_transcription(options):
    model = make("denseformer", options)
    perturb_residual(model, scale=0.5)
    assert_matches(model, naive_denseformer, tokens())


@pytest.mark.parametrize("options", [{}, {"dilation": 2, "period": 2}])
def test_denseformer_init_is_exactly_prenorm(options):
    assert_init_is_prenorm("denseformer", options, atol=1e-6)  # weights 1 and 0: no eps involved


def test_denseformer_parameters_and_depth_weights():
    for Lb in (3, 6):
        model = make("denseformer", n_layers=Lb)
        n = sum(p.numel() for p in model.residual.parameters())
        assert n == Lb * (Lb + 3) // 2  # the paper's count for k = p = 1
    model = make("denseformer", {"dilation": 2, "period": 2}, n_layers=6)
    assert {k: v.numel() for k, v in model.residual.dwa.items()} == {"2": 2, "4": 3, "6": 4}
    model = make("denseformer")
    perturb_residual(model)
    model.record_diagnostics = True
    model(tokens())
    w = model.diagnostics["depth_weights"]  # row 2i: the DWA weights the read after block i sees
    assert w.shape == (model.config.n_reads, model.config.n_layers + 1)
    assert torch.isnan(w[1::2]).all()  # pre-MLP reads see Y_i + attention output, not a DWA
    for i in range(1, model.config.n_layers + 1):
        assert torch.allclose(w[2 * i, : i + 1], model.residual.dwa[str(i)].detach())
    assert len(model.residual.source_labels()) == w.shape[1]


# ---------------------------------------------------------------------------------------------------------------
# Hyper-Connections (Zhu et al., ICLR 2025; Appendix J, Algorithms 2-3)
def naive_hyper(model: Transformer, idx: torch.Tensor) -> torch.Tensor:
    """H^0 = n copies of h^0. Per sublayer k: [A_m | A_r] = static_alpha (+ s_a tanh(norm(H) W_alpha)),
    B = static_beta (+ s_b tanh(norm(H) W_beta)); mix_h = [A_m | A_r]^T H; x_in = mix_h[0];
    H = B^T f(x_in) + mix_h[1:]. The LM head reads the sum of the streams."""
    r, cfg = model.residual, model.config
    n = cfg.residual_options.get("n", 4)
    dynamic = cfg.residual_options.get("dynamic", True)
    emb = model.tok_emb(idx)
    streams = [emb for _ in range(n)]  # list of [B, T, D]
    for k in range(cfg.n_sublayers):
        alpha = [[r.static_alpha[k, i, j] for j in range(n + 1)] for i in range(n)]
        beta = [r.static_beta[k, i] for i in range(n)]
        if dynamic:
            W = r.dynamic_proj[k]  # [D, n + 2] = [W_m | W_r | W_beta]
            for i in range(n):
                h = streams[i]
                mu = h.mean(-1, keepdim=True)
                var = ((h - mu) ** 2).mean(-1, keepdim=True)
                hn = (h - mu) / torch.sqrt(var + cfg.norm_eps) * r.norm_weight[k] + r.norm_bias[k]  # LayerNorm
                wc = torch.tanh(hn @ W[:, : n + 1])  # [B, T, n+1]
                alpha[i] = [alpha[i][j] + r.dynamic_alpha_scale[k] * wc[..., j] for j in range(n + 1)]
                beta[i] = beta[i] + r.dynamic_beta_scale[k] * torch.tanh(hn @ W[:, n + 1])

        def expand(a):
            return a.unsqueeze(-1) if torch.is_tensor(a) and a.dim() else a

        mix = [sum(expand(alpha[i][j]) * streams[i] for i in range(n)) for j in range(n + 1)]
        y = sublayer(model, k, mix[0])
        streams = [expand(beta[i]) * y + mix[1 + i] for i in range(n)]
    return head(model, sum(streams))


@pytest.mark.parametrize(
    "options", [{"dynamic": False}, {"dynamic": True}, {"dynamic": True, "n": 2}, {"dynamic": False, "n": 1}]
)
def test_hyper_connections_match_naive_transcription(options):
    model = make("hyper", options)
    perturb_residual(model)
    assert_matches(model, naive_hyper, tokens())


@pytest.mark.parametrize("options", [{"dynamic": False}, {"dynamic": True}, {"n": 1}, {"n": 2}, {"n": 8}])
def test_hyper_connections_init_is_prenorm(options):
    """A_m = e_{k mod n}, A_r = I, B = 1: every stream is the PreNorm stream; the final sum is n times it, which
    the final RMSNorm does not see (up to its eps: tiny here)."""
    assert_init_is_prenorm("hyper", options, eps=1e-12)


def test_hyper_connections_init_values_follow_appendix_j():
    """Streams are identical at step 0, so which stream a sublayer reads is invisible in the output: check the
    matrices themselves. static_alpha[k] = [e_{k mod n} | I_n], static_beta = 1, W = 0, s_a = s_b = 0.01."""
    n = 4
    r = make("hyper", {"n": n, "dynamic": True}).residual
    for k in range(2 * TINY["n_layers"]):
        e = torch.zeros(n, 1)
        e[k % n] = 1.0
        assert torch.equal(r.static_alpha[k].detach(), torch.cat([e, torch.eye(n)], dim=1))
    assert torch.all(r.static_beta == 1)
    assert torch.count_nonzero(r.dynamic_proj) == 0
    assert torch.all(r.dynamic_alpha_scale == 0.01)
    assert torch.all(r.dynamic_beta_scale == 0.01)
    assert torch.all(r.norm_weight == 1)
    assert torch.count_nonzero(r.norm_bias) == 0


def test_hyper_connections_parameter_counts():
    """Paper: SHC n(n+2) per sublayer; DHC adds d(n+2) + 2 + the norm's parameters (LayerNorm: 2d)."""
    D, L = TINY["d_model"], 2 * TINY["n_layers"]
    for n in (1, 2, 4):
        static = make("hyper", {"n": n, "dynamic": False})
        dynamic = make("hyper", {"n": n, "dynamic": True})
        assert sum(p.numel() for p in static.residual.parameters()) == L * n * (n + 2)
        assert sum(p.numel() for p in dynamic.residual.parameters()) == L * (n * (n + 2) + D * (n + 2) + 2 + 2 * D)


# ---------------------------------------------------------------------------------------------------------------
# mHC (Xie et al. 2025)
def naive_sinkhorn(M: torch.Tensor, iters: int) -> torch.Tensor:
    M = torch.exp(M)
    for _ in range(iters):
        M = M / M.sum(-1, keepdim=True)
        M = M / M.sum(-2, keepdim=True)
    return M


def naive_mhc(model: Transformer, idx: torch.Tensor) -> torch.Tensor:
    """x' = RMSNorm(vec(x_l)); H~pre = a_pre x' phi_pre + b_pre, H~post = a_post x' phi_post + b_post,
    H~res = a_res mat(x' phi_res) + b_res; H^pre = sigma(H~pre), H^post = 2 sigma(H~post),
    H^res = Sinkhorn-Knopp(H~res); x_{l+1} = H^res x_l + H^post^T F(H^pre x_l)."""
    r, cfg = model.residual, model.config
    n = cfg.residual_options.get("n", 4)
    iters = cfg.residual_options.get("sinkhorn_iters", 20)
    emb = model.tok_emb(idx)
    x = torch.stack([emb] * n, dim=-2)  # [B, T, n, D]
    for k in range(cfg.n_sublayers):
        v = x.flatten(-2)
        v = v / torch.sqrt((v**2).mean(-1, keepdim=True) + cfg.norm_eps)
        t = v @ r.phi[k]  # [B, T, n^2 + 2n]
        a_pre, a_post, a_res = r.gate[k]
        b = r.bias[k]
        h_pre = 1 / (1 + torch.exp(-(a_pre * t[..., :n] + b[:n])))
        h_post = 2 / (1 + torch.exp(-(a_post * t[..., n : 2 * n] + b[n : 2 * n])))
        h_res = naive_sinkhorn((a_res * t[..., 2 * n :] + b[2 * n :]).reshape(*t.shape[:-1], n, n), iters)
        y = sublayer(model, k, torch.einsum("btn,btnd->btd", h_pre, x))
        x = torch.einsum("btmn,btnd->btmd", h_res, x) + torch.einsum("btm,btd->btmd", h_post, y)
    return head(model, x.sum(-2))


@pytest.mark.parametrize("options", [{}, {"n": 2, "sinkhorn_iters": 5}])
def test_mhc_matches_naive_transcription(options):
    model = make("mhc", options)
    perturb_residual(model, scale=1.0)
    assert_matches(model, naive_mhc, tokens())


def test_sinkhorn_knopp_is_doubly_stochastic():
    # 20 iterations are an approximation (mHC's t_max): rows converge to 1e-4 for unit-scale logits; sharper
    # logits (std 3) can leave rows off by a few percent, while the columns, normalised last, are exact.
    logits = torch.randn(200, 4, 4, generator=torch.Generator().manual_seed(0))
    M = sinkhorn_knopp(logits, 20)
    assert (M > 0).all()
    assert torch.allclose(M.sum(-2), torch.ones(200, 4), atol=1e-6)  # columns: normalised last
    assert torch.allclose(M.sum(-1), torch.ones(200, 4), atol=1e-3)  # rows: converged
    assert torch.allclose(M, naive_sinkhorn(logits, 20), atol=1e-6)  # the max shift changes nothing
    assert torch.isfinite(sinkhorn_knopp(torch.full((4, 4), 200.0), 20)).all()  # exp(200) would overflow


def test_mhc_init_follows_the_reference():
    """peers.md (mHC-lite protocol): phi = 0, a = 0.01, b_pre = b_post = -1 except +1 on the main stream,
    b_res = -8 except 0 on the diagonal, t_max = 20, n = 4."""
    model = make("mhc")
    r, n = model.residual, 4
    assert r.n == n
    assert r.iters == 20
    assert torch.count_nonzero(r.phi) == 0
    assert torch.all(r.gate == 0.01)
    H = torch.randn(2, 5, n, TINY["d_model"])

    def sig(z):
        return 1 / (1 + math.exp(-z))

    for k in range(model.config.n_sublayers):
        pre, post, res = r.maps(H, k)
        main = torch.arange(n) == k % n
        assert torch.allclose(pre, torch.where(main, sig(1), sig(-1)).expand_as(pre), atol=1e-6)
        assert torch.allclose(post, torch.where(main, 2 * sig(1), 2 * sig(-1)).expand_as(post), atol=1e-6)
        off = math.exp(-8)
        expected_res = torch.full((n, n), off / (1 + (n - 1) * off)).fill_diagonal_(1 / (1 + (n - 1) * off))
        assert torch.allclose(res, expected_res.expand_as(res), atol=1e-6)  # near-identity, exactly doubly stochastic


def test_mhc_mixing_conserves_the_stream_sum():
    """Columns of H^res sum to one, so sum_m (H^res H)_m = sum_n H_n: a sublayer changes the sum of the streams
    only by its write, sum_m H^post_m * y."""
    model = make("mhc")
    perturb_residual(model, scale=1.0)
    r = model.residual
    H = torch.randn(2, 5, 4, TINY["d_model"])
    state = r.State(H=H)
    r.read(state, 3)
    post = state.post
    y = torch.randn(2, 5, TINY["d_model"])
    r.write(state, 3, y)
    assert torch.allclose(state.H.sum(-2), H.sum(-2) + post.sum(-1, keepdim=True) * y, atol=1e-5)


def test_mhc_parameter_count():
    """Per sublayer: phi nD(n^2 + 2n), 3 gates, n^2 + 2n biases."""
    D, L = TINY["d_model"], 2 * TINY["n_layers"]
    for n in (2, 4):
        model = make("mhc", {"n": n})
        per = n * D * (n * n + 2 * n) + 3 + n * n + 2 * n
        assert sum(p.numel() for p in model.residual.parameters()) == L * per


# ---------------------------------------------------------------------------------------------------------------
# LAuReL (Menghani et al., ICML 2025)
def naive_laurel(model: Transformer, idx: torch.Tensor) -> torch.Tensor:
    """x_{k+1} = alpha f(x_k) + g(x_k): RW g = beta x, LR g = x + B A x (alpha = 1), RW+LR g = beta (x + B A x);
    (alpha, beta) = 2 softmax(lambda_k)."""
    r, cfg = model.residual, model.config
    form = cfg.residual_options.get("form", "rw_lr")
    x = model.tok_emb(idx)
    for k in range(cfg.n_sublayers):
        y = sublayer(model, k, x)
        g = x
        if form in ("lr", "rw_lr"):
            g = x + torch.einsum("rd,btr->btd", r.lr_up[k], torch.einsum("dr,btd->btr", r.lr_down[k], x))
        alpha = beta = 1.0
        if form in ("rw", "rw_lr"):
            e = torch.exp(r.rw_logits[k])
            alpha, beta = 2 * e[0] / e.sum(), 2 * e[1] / e.sum()
        x = alpha * y + beta * g
    return head(model, x)


@pytest.mark.parametrize("form", ["rw", "lr", "rw_lr"])
def test_laurel_matches_naive_transcription(form):
    model = make("laurel", {"form": form, "rank": 3})
    perturb_residual(model)
    assert_matches(model, naive_laurel, tokens())


@pytest.mark.parametrize("form", ["rw", "lr", "rw_lr"])
def test_laurel_init_is_exactly_prenorm(form):
    assert_init_is_prenorm("laurel", {"form": form}, atol=1e-6)


def test_laurel_low_rank_init_is_column_orthogonal():
    A = make("laurel", {"rank": 4}).residual.lr_down  # [L, D, r]
    gram = A.transpose(-1, -2) @ A  # [L, r, r]
    assert torch.allclose(gram, gram[0, 0, 0] * torch.eye(4).expand_as(gram))
    assert torch.allclose(A.abs().max(), torch.tensor(1 / math.sqrt(4 * TINY["d_model"])))


# ---------------------------------------------------------------------------------------------------------------
# Shared invariants and the FLOP count
def forward_flops(model: Transformer, idx: torch.Tensor) -> float:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(idx)
    return counter.get_total_flops() / idx.numel()


@pytest.mark.parametrize(
    ("residual", "options"),
    [
        ("denseformer", {}),
        ("denseformer", {"dilation": 2, "period": 2}),
        ("hyper", {"dynamic": False}),
        ("hyper", {"dynamic": True}),
        ("hyper", {"dynamic": True, "n": 2}),
        ("mhc", {}),
        ("mhc", {"n": 2}),
        ("laurel", {"form": "lr"}),
        ("laurel", {"form": "rw_lr", "rank": 2}),
        ("laurel", {"form": "rw"}),
    ],
)
def test_mixing_flops_equal_counted_forward_flops(residual, options):
    """Every weighted combination and projection of these schemes runs as a matmul, so torch's counter sees
    exactly (model - baseline) forward FLOPs == mixing_flops. LAuReL's scalar reweighting alpha f + beta g is
    element-wise (2 MACs per channel per sublayer): added back."""
    model, base, idx = make(residual, options), make("baseline"), tokens()
    counted = forward_flops(model, idx) - forward_flops(base, idx)
    if residual == "laurel" and options["form"] != "lr":
        counted += 4 * TINY["d_model"] * model.config.n_sublayers
    if residual == "denseformer":  # DWA's weighted sums are element-wise multiply-adds (mix_sources): 2*D per pair
        o = model.residual.options
        pairs = sum(
            len(model.residual.dwa_sources(i, o.dilation))
            for i in model.residual.dwa_blocks(model.config.n_layers, o.period)
        )
        counted += 2 * TINY["d_model"] * pairs
    assert counted == pytest.approx(type(model.residual).mixing_flops(model.config), rel=1e-9)


@pytest.mark.parametrize("name", sorted(PEERS))
def test_flop_count_matches_torch_flop_counter(name):
    """Forward + backward of the whole model against attnres.flops (1%, as in tests/test_model.py)."""
    residual, options = PEERS[name]
    cfg = ModelConfig(**{**TINY, "residual": residual, "residual_options": options, "max_seq_len": 32})
    model = Transformer(cfg)
    perturb_residual(model)
    idx = torch.randint(0, cfg.vocab_size, (2, 32))
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        model(idx, idx)[1].backward()
    f = flops_per_token(cfg, 32)
    assert counter.get_total_flops() / idx.numel() == pytest.approx(f.matmul + f.mixing + 2 * f.attention, rel=0.01)


def test_mixing_flops_closed_forms():
    def cfg(r, o):
        return ModelConfig(**{**TINY, "residual": r, "residual_options": o})

    D, L, Lb, n = TINY["d_model"], 2 * TINY["n_layers"], TINY["n_layers"], 4

    def f(r, o):
        return flops_per_token(cfg(r, o)).mixing / 3  # forward FLOPs per token

    assert f("denseformer", {}) == 2 * D * sum(i + 1 for i in range(1, Lb + 1))
    assert f("hyper", {"dynamic": False}) == L * 2 * n * D * (n + 2)
    assert f("hyper", {"dynamic": True}) == L * 4 * n * D * (n + 2)
    assert f("mhc", {}) == L * 2 * n * D * (n + 1) * (n + 2)


@pytest.mark.parametrize("name", sorted(PEERS))
def test_causality(name):
    residual, options = PEERS[name]
    model = make(residual, options)
    perturb_residual(model)
    idx = tokens(T=12)
    changed = idx.clone()
    changed[:, 7:] = (changed[:, 7:] + 5) % TINY["vocab_size"]
    a, b = model(idx), model(changed)
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize("name", sorted(PEERS))
def test_bf16_autocast_runs(name):
    residual, options = PEERS[name]
    model = make(residual, options)
    perturb_residual(model)
    idx = tokens()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(idx, idx)
    assert logits.dtype == torch.bfloat16
    assert torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.residual.parameters())


# Parameters whose gradient is zero at step 0 by construction: they multiply a zero-initialised factor
# (HC: tanh(Hbar W) with W = 0; mHC: the gates multiply x' phi with phi = 0; LAuReL: A feeds B = 0).
ZERO_GRAD_AT_INIT = {
    "denseformer": set(),
    "hyper_static": set(),
    "hyper_dynamic": {"dynamic_alpha_scale", "dynamic_beta_scale", "norm_weight", "norm_bias"},
    "mhc": {"gate"},
    "laurel": {"lr_down"},
}


@pytest.mark.parametrize("name", sorted(PEERS))
def test_connection_parameters_live_under_residual_and_learn(name):
    residual, options = PEERS[name]
    base_names = {n for n, _ in make("baseline").named_parameters()}
    model = make(residual, options)
    extra = {n for n, _ in model.named_parameters()} - base_names
    assert extra
    assert all(n.startswith("residual.") for n in extra)
    idx = tokens()
    model(idx, idx)[1].backward()
    zero = {n for n, p in model.residual.named_parameters() if p.grad is None or p.grad.abs().sum() == 0}
    assert {n.split(".")[0] for n in zero} == ZERO_GRAD_AT_INIT[name]


@pytest.mark.parametrize(
    ("residual", "options", "match"),
    [
        ("hyper", {"n": 0}, r"'n'.*integer >= 1"),
        ("hyper", {"dynamic": "yes"}, r"'dynamic'.*True, False"),
        ("hyper", {"rate": 4}, r"\['rate'\].*allowed options: dynamic, n"),
        ("mhc", {"sinkhorn_iters": 0}, r"'sinkhorn_iters'"),
        ("mhc", {"n": 2.0}, r"'n'"),
        ("denseformer", {"dilation": 0}, r"'dilation'"),
        ("denseformer", {"period": True}, r"'period'"),
        ("laurel", {"form": "pa"}, r"'form'.*'rw', 'lr', 'rw_lr'"),
        ("laurel", {"rank": 0}, r"'rank'"),
    ],
)
def test_invalid_options_name_the_option(residual, options, match):
    with pytest.raises(ValueError, match=match):  # the config itself refuses them, before any model is built
        ModelConfig(**{**TINY, "residual": residual, "residual_options": options})
    with pytest.raises(ValueError, match=match):
        registry.get(residual).Options.parse(options)


def test_registry_lists_the_peers():
    with pytest.raises(ValueError, match=r"baseline.*full.*block.*denseformer.*hyper.*mhc.*laurel"):
        ModelConfig(residual="resformer")


# The variants shipped for the `ablations` sweep: one conf/model/<name>.yaml each, named as in result records.
TABLE4 = {  # the paper's Table 4 ablation settings, as shipped
    "full_input_dependent_query": ("full", {"query": "input_dependent"}),
    "full_static_mixing": ("full", {"mixing": "static"}),
    "full_sigmoid": ("full", {"normalizer": "sigmoid"}),
    "full_no_key_norm": ("full", {"key_norm": False}),
    "block_no_key_norm": ("block", {"key_norm": False}),
    "full_sliding_window": ("full", {"window": 8}),
    "block_multihead": ("block", {"heads": 16}),
}


SHIPPED = [
    "full_input_dependent_query",
    "full_static_mixing",
    "full_sigmoid",
    "full_no_key_norm",
    "block_no_key_norm",
    "full_sliding_window",
    "block_multihead",
    "denseformer",
    "hyper_static",
    "hyper_dynamic",
    "mhc",
    "laurel",
]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_configs_build_and_run(name):
    """conf/model/<name>.yaml: `variant` is its file name; the other keys are ModelConfig fields that build a
    model with the scheme and options the name promises (on a small size: 4 blocks, d_model 32)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "conf" / "model" / f"{name}.yaml"
    fields = yaml.safe_load(path.read_text())
    assert fields.pop("variant") == name
    cfg = ModelConfig(**{**TINY, "n_layers": 4, **fields})
    model = Transformer(cfg)
    residual, options = {**TABLE4, **PEERS}[name]
    assert cfg.residual == residual
    assert all(getattr(model.residual.options, k) == v for k, v in options.items())
    defaults = type(model.residual).Options().as_dict()
    changed = {k for k, v in model.residual.options.as_dict().items() if v != defaults[k]}
    assert changed <= set(options)  # nothing else departs from the scheme's defaults
    idx = tokens()
    assert torch.isfinite(model(idx, idx)[1])
