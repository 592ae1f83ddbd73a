"""The paper's Table 4 ablations of AttnRes (options of Full / Block AttnRes), each tested against a naive
transcription of its description (paper §5.3), written here independently of attnres.residual."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from attnres import ModelConfig, Transformer, flops_per_token
from attnres.residual import FullAttnRes

torch.set_num_threads(1)

TINY = {"vocab_size": 61, "n_layers": 3, "d_model": 32, "n_heads": 4, "max_seq_len": 16}

# The configs shipped in conf/model/ (name -> ModelConfig fields), on the tiny model.
ABLATIONS = {
    "full_input_dependent_query": ("full", {"query": "input_dependent"}),
    "full_static_mixing": ("full", {"mixing": "static"}),
    "full_sigmoid": ("full", {"normalizer": "sigmoid"}),
    "full_no_key_norm": ("full", {"key_norm": False}),
    "full_sliding_window": ("full", {"window": 2}),  # W = 8 in the paper; 2 of the tiny model's 6 outputs
    "block_no_key_norm": ("block", {"key_norm": False}),
    "block_multihead": ("block", {"heads": 4}),
}


def make(residual: str, options: dict | None = None, seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**{**TINY, "residual": residual, "residual_options": options or {}, **kw}))


def tokens(B: int = 2, T: int = 12, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def randomize_residual(model: Transformer, seed: int = 1) -> None:
    """Every connection parameter random (not the zero init, which would hide most mistakes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.residual.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name == "key_norm_weight":
                p.copy_(1 + 0.3 * noise)
            elif name == "query_proj":
                p.copy_(noise * 0.5 / math.sqrt(p.shape[-1]))
            else:
                p.copy_(noise)


# ---------------------------------------------------------------------------------------------------------------
# Independent reference: one read of AttnRes with every Table 4 option, written out per channel group and source.
def rmsnorm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps)


def naive_read(res, opts: dict, l: int, sources: list[torch.Tensor], slots: list[int], eps: float) -> torch.Tensor:
    """h_l = sum_i alpha_i v_i, with
    alpha_i = exp(s_i) / sum_j exp(s_j)   (softmax)   or   1 / (1 + exp(-s_i))   (sigmoid),
    s_i = q . k_i per channel group, k_i = RMSNorm(v_i) over the group (or v_i), q = w_l (+ W_l RMSNorm(v_last))
    with the key RMSNorm gain on the query; static mixing: s_i = the learned scalar of (read l, source slot i)."""
    D = sources[0].shape[-1]
    heads = opts.get("heads", 1)
    width = D // heads
    static = opts.get("mixing") == "static"
    key_norm = opts.get("key_norm", True)
    if not static:
        q = res.queries[l]
        if opts.get("query") == "input_dependent":
            q = q + torch.einsum("ed,btd->bte", res.query_proj[l], rmsnorm(sources[-1], eps))
        if key_norm:
            q = q * res.key_norm_weight[l]
    out = torch.zeros_like(sources[0])
    for g in range(heads):
        c = slice(g * width, (g + 1) * width)
        scores = []
        for i, v in enumerate(sources):
            if static:
                scores.append(res.mixing_logits[l, slots[i]])
            else:
                k = rmsnorm(v[..., c], eps) if key_norm else v[..., c]
                scores.append((q[..., c] * k).sum(-1))
        if opts.get("normalizer", "softmax") == "softmax":
            total = sum(torch.exp(s) for s in scores)
            alphas = [torch.exp(s) / total for s in scores]
        else:
            alphas = [1 / (1 + torch.exp(-s)) for s in scores]
        for a, v in zip(alphas, sources):
            out[..., c] = out[..., c] + (a.unsqueeze(-1) if torch.is_tensor(a) and a.dim() else a) * v[..., c]
    return out


def sublayer(model: Transformer, l: int, h: torch.Tensor) -> torch.Tensor:
    block = model.blocks[l // 2]
    return block.attn(h, model.rope_cos, model.rope_sin) if l % 2 == 0 else block.mlp(h)


def naive_forward(model: Transformer, idx: torch.Tensor) -> torch.Tensor:
    """Whole-model rollout: Full reads see v_0 (embedding) .. v_l, or with a window the embedding and the W most
    recent outputs; Block reads see [b_0 .. b_{n-1}, partial] with the K3 bookkeeping (blocks=[], partial=emb)."""
    cfg, res = model.config, model.residual
    opts, L, eps = cfg.residual_options, cfg.n_sublayers, cfg.norm_eps
    emb = model.tok_emb(idx)
    if cfg.residual == "full":
        W = opts.get("window")
        sources = [emb]
        for l in range(L + 1):
            visible = list(range(l + 1)) if W is None else [0] + [i for i in range(1, l + 1) if l - i < W]
            h = naive_read(res, opts, l, [sources[i] for i in visible], visible, eps)
            if l < L:
                sources.append(sublayer(model, l, h))
        return model.lm_head(model.norm(h))
    S = cfg.sublayers_per_block
    blocks, partial = [], emb
    for l in range(L):
        group = [*blocks, partial]
        h = naive_read(res, opts, l, group, list(range(len(group))), eps)
        if l % S == 0:
            blocks.append(partial)
            partial = None
        out = sublayer(model, l, h)
        partial = out if partial is None else partial + out
    group = [*blocks, partial]
    h = naive_read(res, opts, L, group, list(range(len(group))), eps)
    return model.lm_head(model.norm(h))


def assert_matches_naive(model: Transformer, idx: torch.Tensor) -> None:
    ref = copy.deepcopy(model)
    logits, loss = model(idx, idx)
    expected = naive_forward(ref, idx)
    assert torch.allclose(logits, expected, atol=1e-5), (logits - expected).abs().max()
    loss.backward()
    F.cross_entropy(expected.view(-1, expected.size(-1)), idx.view(-1)).backward()
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        assert p.grad is not None, name
        assert torch.allclose(p.grad, r.grad, atol=1e-5, rtol=1e-3), name


# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("residual", "options", "kw"),
    [
        ("full", {"query": "input_dependent"}, {}),
        ("full", {"mixing": "static"}, {}),
        ("full", {"normalizer": "sigmoid"}, {}),
        ("full", {"key_norm": False}, {}),
        ("full", {"window": 2}, {}),
        ("full", {"window": 3, "normalizer": "sigmoid"}, {}),
        ("full", {"heads": 4}, {}),
        ("full", {"heads": 2, "query": "input_dependent", "key_norm": False}, {}),
        ("block", {"query": "input_dependent"}, {"block_size": 2}),
        ("block", {"mixing": "static"}, {"block_size": 4}),
        ("block", {"normalizer": "sigmoid"}, {"block_size": 2}),
        ("block", {"key_norm": False}, {"block_size": 2}),  # two-phase path
        ("block", {"key_norm": False, "two_phase": False}, {"block_size": 5}),
        ("block", {"heads": 4}, {"block_size": 2}),
        ("block", {"heads": 8, "normalizer": "sigmoid"}, {"block_size": 3}),
    ],
)
def test_ablation_matches_naive_transcription(residual, options, kw):
    model = make(residual, options, **kw)
    randomize_residual(model)
    assert_matches_naive(model, tokens())


@pytest.mark.parametrize(
    ("residual", "options"),
    [
        ("full", {"query": "input_dependent"}),
        ("full", {"mixing": "static"}),
        ("full", {"normalizer": "sigmoid"}),
        ("full", {"key_norm": False}),
        ("full", {"heads": 4}),
        ("block", {"query": "input_dependent"}),
        ("block", {"mixing": "static"}),
        ("block", {"normalizer": "sigmoid"}),
        ("block", {"key_norm": False}),
        ("block", {"heads": 4}),
    ],
)
def test_ablation_zero_init_equals_baseline(residual, options):
    """Zero queries / projections / logits: softmax reads are the uniform mean of their sources and sigmoid reads
    half their sum; either way a positive multiple of the baseline stream, which PreNorm and the final RMSNorm
    do not see (up to eps). The sliding window is the exception: it drops sources, so it has no such invariant."""
    base = make("baseline", norm_eps=1e-12)
    model = make(residual, options, norm_eps=1e-12, block_size=2)
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert missing
    assert all(m.startswith("residual.") for m in missing)
    assert not unexpected
    idx = tokens()
    (lb, loss_b), (la, loss_a) = base(idx, idx), model(idx, idx)
    assert torch.allclose(la, lb, atol=1e-5)
    assert abs(loss_a.item() - loss_b.item()) < 1e-5
    loss_a.backward()
    for name, p in model.residual.named_parameters():  # zero init is not a dead end: the new parameters learn
        if name != "key_norm_weight":  # its gradient is w_l * (...) = 0 until the queries move, as in the paper
            assert p.grad is not None, name
            assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize(
    "options",
    [
        {"query": "input_dependent"},
        {"mixing": "static"},
        {"normalizer": "sigmoid"},
        {"key_norm": False},
        {"heads": 4},
        {"heads": 2, "normalizer": "sigmoid", "query": "input_dependent"},
    ],
)
def test_block_with_one_sublayer_per_block_equals_full(options):
    full = make("full", options)
    randomize_residual(full)
    block = make("block", options, block_size=1)
    block.load_state_dict(full.state_dict())  # same parameter names and shapes
    idx = tokens()
    (lf, loss_f), (lb, loss_b) = full(idx, idx), block(idx, idx)
    assert torch.allclose(lf, lb, atol=1e-5)
    loss_f.backward()
    loss_b.backward()
    for (name, p), (_, q) in zip(full.residual.named_parameters(), block.residual.named_parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-3), name


@pytest.mark.parametrize("block_size", [2, 4, 5])
def test_two_phase_equals_plain_path_without_key_norm(block_size):
    fast = make("block", {"key_norm": False}, block_size=block_size)
    slow = make("block", {"key_norm": False, "two_phase": False}, block_size=block_size)
    randomize_residual(fast)
    slow.load_state_dict(fast.state_dict())
    assert fast.residual.two_phase
    assert not slow.residual.two_phase
    idx = tokens()
    (lf, loss_f), (ls, loss_s) = fast(idx, idx), slow(idx, idx)
    assert torch.allclose(lf, ls, atol=1e-5)
    loss_f.backward()
    loss_s.backward()
    assert torch.allclose(fast.residual.queries.grad, slow.residual.queries.grad, atol=1e-5, rtol=1e-3)


@pytest.mark.parametrize(
    "options", [{"normalizer": "sigmoid"}, {"heads": 4}, {"query": "input_dependent"}, {"mixing": "static"}]
)
def test_block_ablations_fall_back_to_the_plain_path(options):
    assert not make("block", options, block_size=2).residual.two_phase
    assert make("block", {"key_norm": False}, block_size=2).residual.two_phase


@pytest.mark.parametrize("W", [1, 2, 4, 8])
def test_sliding_window_sees_embedding_and_w_most_recent_outputs(W):
    """Orthogonal sources: the coefficient of each basis vector in a read shows which sources it sees."""
    L = 6
    cfg = ModelConfig(
        vocab_size=8,
        n_layers=L // 2,
        d_model=L + 1,
        n_heads=1,
        head_dim=2,
        residual="full",
        residual_options={"window": W},
    )
    scheme = FullAttnRes(cfg)
    with torch.no_grad():
        scheme.queries.normal_(generator=torch.Generator().manual_seed(W))
    basis = torch.eye(L + 1).view(L + 1, 1, 1, L + 1)  # e_0 = embedding, e_{i+1} = output of sublayer i
    state = scheme.begin(basis[0])
    for l in range(L + 1):
        coef = (scheme.read(state, l) if l < L else scheme.final(state)).detach().view(-1)
        seen = {0} | {i for i in range(1, l + 1) if i > l - W}
        assert {i for i in range(L + 1) if coef[i] != 0} == seen, (l, coef)
        assert math.isclose(float(coef.sum()), 1.0, rel_tol=1e-5)
        if l < L:
            scheme.write(state, l, basis[l + 1])
    assert FullAttnRes.sources_per_read(cfg) == [1 + min(l, W) for l in range(L + 1)]


def test_window_at_least_depth_equals_full():
    full = make("full")
    randomize_residual(full)
    windowed = make("full", {"window": full.config.n_sublayers})
    windowed.load_state_dict(full.state_dict())
    idx = tokens()
    assert torch.allclose(full(idx), windowed(idx), atol=1e-6)


def test_multihead_key_norm_is_per_channel_group():
    """Scaling one channel group of one source leaves every other group's read untouched: each group normalises
    its own slice of the keys and has its own softmax (a whole-vector RMSNorm would couple the groups)."""
    cfg = ModelConfig(
        vocab_size=8, n_layers=1, d_model=16, n_heads=1, head_dim=2, residual="full", residual_options={"heads": 4}
    )
    scheme = FullAttnRes(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        scheme.queries.normal_(generator=g)
    sources = [torch.randn(2, 3, 16, generator=g) for _ in range(3)]

    def read_last(srcs):
        state = scheme.begin(srcs[0])
        for l, s in enumerate(srcs[1:]):
            scheme.read(state, l)
            scheme.write(state, l, s)
        return scheme.read(state, len(srcs) - 1)

    h = read_last(sources)
    scaled = [s.clone() for s in sources]
    scaled[1][..., :4] *= 100.0  # channel group 0 of source 1
    h2 = read_last(scaled)
    assert torch.allclose(h[..., 4:], h2[..., 4:], atol=1e-6)
    assert not torch.allclose(h[..., :4], h2[..., :4])


def test_sigmoid_weights_are_independent_gates():
    model = make("full", {"normalizer": "sigmoid"})
    model.record_diagnostics = True
    model(tokens())
    w = model.diagnostics["depth_weights"]
    assert torch.allclose(w[~torch.isnan(w)], torch.full_like(w[~torch.isnan(w)], 0.5))  # zero init: sigmoid(0)
    randomize_residual(model)
    model(tokens())
    w = model.diagnostics["depth_weights"]
    seen = w[~torch.isnan(w)]
    assert torch.all((seen > 0) & (seen < 1))
    assert not torch.allclose(torch.nansum(w, 1)[1:], torch.ones(w.shape[0] - 1))  # no normalisation


@pytest.mark.parametrize("residual", ["full", "block"])
def test_static_mixing_weights_are_the_softmax_of_learned_scalars(residual):
    model = make(residual, {"mixing": "static"}, block_size=2)
    randomize_residual(model)
    model.record_diagnostics = True
    model(tokens())
    w = model.diagnostics["depth_weights"]
    counts = type(model.residual).sources_per_read(model.config)
    for l, S in enumerate(counts):
        expected = model.residual.mixing_logits[l, :S].detach().softmax(0)
        assert torch.allclose(w[l, :S], expected, atol=1e-6)
        assert torch.isnan(w[l, S:]).all()


def test_depth_weights_of_windowed_and_multihead_reads():
    model = make("full", {"window": 2})
    randomize_residual(model)
    model.record_diagnostics = True
    model(tokens())
    w = model.diagnostics["depth_weights"]  # [L + 1, L + 1], NaN where a source is outside the window
    L = model.config.n_sublayers
    assert w.shape == (L + 1, L + 1)
    for l in range(L + 1):
        seen = {0} | {i for i in range(1, l + 1) if i > l - 2}
        assert {i for i in range(L + 1) if not torch.isnan(w[l, i])} == seen
    assert torch.allclose(torch.nansum(w, 1), torch.ones(L + 1), atol=1e-6)
    model = make("block", {"heads": 4}, block_size=2)
    randomize_residual(model)
    model.record_diagnostics = True
    model(tokens())
    w = model.diagnostics["depth_weights"]  # averaged over channel groups: still a distribution per read
    assert torch.allclose(torch.nansum(w, 1), torch.ones(w.shape[0]), atol=1e-6)


@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_bf16_autocast_runs(name):
    residual, options = ABLATIONS[name]
    model = make(residual, options, block_size=2)
    randomize_residual(model)
    idx = tokens()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(idx, idx)
    assert logits.dtype == torch.bfloat16
    assert torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.residual.parameters())


# ---------------------------------------------------------------------------------------------------------------
def forward_flops(model: Transformer, idx: torch.Tensor) -> float:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(idx)
    return counter.get_total_flops() / idx.numel()


@pytest.mark.parametrize(
    ("residual", "options"),
    [
        ("full", {}),
        ("full", {"query": "input_dependent"}),
        ("full", {"mixing": "static"}),
        ("full", {"normalizer": "sigmoid"}),
        ("full", {"key_norm": False}),
        ("full", {"window": 2}),
        ("full", {"heads": 4}),
        ("block", {"two_phase": False}),
        ("block", {"query": "input_dependent"}),
        ("block", {"mixing": "static"}),
        ("block", {"normalizer": "sigmoid"}),
        ("block", {"key_norm": False, "two_phase": False}),
        ("block", {"heads": 4}),
    ],
)
def test_mixing_flops_equal_counted_forward_flops(residual, options):
    """Every logit, weighted sum and query projection is a matmul, so torch's counter sees exactly the scheme's
    FLOPs: (model - baseline) forward FLOPs per token == mixing_flops. (The two-phase Block path is left out:
    its online-softmax merge is element-wise, and so is a read with a single source, which einsum runs as a plain
    scaling: 2*D each, added back.) Closed form of the Full count: 4 D sum_l (l + 1)."""
    model = make(residual, options, block_size=2)
    base = make("baseline", block_size=2)
    idx = tokens()
    counted = forward_flops(model, idx) - forward_flops(base, idx)
    expected = type(model.residual).mixing_flops(model.config)
    sources = type(model.residual).sources_per_read(model.config)
    assert sources.count(1) == 1  # read 0: the embedding alone
    # mix_sources forms the weighted sums with element-wise multiply-adds, which the counter does not see: 2*D per
    # (read, source) pair, added back. The multihead ablation sums with an einsum (counted), except a read with
    # a single source, which einsum runs as a plain scaling.
    D = TINY["d_model"]
    added_back = 2 * D * (sources.count(1) if options.get("heads", 1) > 1 else sum(sources))
    assert counted + added_back == pytest.approx(expected, rel=1e-9)
    if residual == "full" and not options:
        L, D = model.config.n_sublayers, model.config.d_model
        assert expected == 4 * D * sum(l + 1 for l in range(L + 1))
    if options.get("query") == "input_dependent":
        plain = type(model.residual).mixing_flops(ModelConfig(**{**TINY, "residual": residual, "block_size": 2}))
        assert expected - plain == 2 * TINY["d_model"] ** 2 * model.config.n_reads


@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_flop_count_matches_torch_flop_counter(name):
    """Forward + backward of the whole model against attnres.flops (1%: the counter misses the element-wise
    products of the depth-mixing backward and sees SDPA's full T x T scores, as in tests/test_model.py)."""
    residual, options = ABLATIONS[name]
    cfg = ModelConfig(**{**TINY, "residual": residual, "residual_options": options, "block_size": 2, "max_seq_len": 32})
    model = Transformer(cfg)
    randomize_residual(model)
    idx = torch.randint(0, cfg.vocab_size, (2, 32))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        model(idx, idx)[1].backward()
    f = flops_per_token(cfg, 32)
    # the weighted sums (forward) and their weight gradients (backward) are element-wise in mix_sources: 2*D
    # each per (read, source) pair, not seen by the counter (the multihead einsum path is seen)
    unseen = 0 if options.get("heads", 1) > 1 else 3 * 2 * cfg.d_model * sum(type(model.residual).sources_per_read(cfg))
    assert counter.get_total_flops() / idx.numel() + unseen == pytest.approx(
        f.matmul + f.mixing + 2 * f.attention, rel=0.01
    )


# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("residual", "options", "match"),
    [
        ("full", {"query": "learned"}, r"'query'.*'static', 'input_dependent'"),
        ("full", {"mixing": "dynamic"}, r"'mixing'.*'attention', 'static'"),
        ("full", {"normalizer": "relu"}, r"'normalizer'.*'softmax', 'sigmoid'"),
        ("full", {"key_norm": 0}, r"'key_norm'.*True, False"),  # a bool, not an int
        ("block", {"key_norm": "no"}, r"'key_norm'"),
        ("block", {"two_phase": 1}, r"'two_phase'"),
        ("full", {"heads": 5}, r"'heads'.*divide d_model"),
        ("full", {"heads": 0}, r"'heads'.*integer >= 1"),
        ("full", {"heads": True}, r"'heads'"),
        ("full", {"window": 0}, r"'window'.*integer >= 1"),
        ("full", {"window": 2.5}, r"'window'"),
        ("block", {"window": 8}, r"\['window'\].*allowed options"),
        ("full", {"mixing": "static", "query": "input_dependent"}, r"mixing='static'.*query='input_dependent'"),
        ("block", {"mixing": "static", "heads": 4}, r"mixing='static'.*heads=4"),
        ("full", {"mixing": "static", "key_norm": False}, r"mixing='static'.*key_norm=False"),
    ],
)
def test_invalid_options_name_the_option_and_allowed_values(residual, options, match):
    kwargs = {**TINY, "residual": residual, "residual_options": options, "block_size": 2}
    with pytest.raises(ValueError, match=match):  # the config refuses them, so no model or FLOP count sees them
        ModelConfig(**kwargs)
    with pytest.raises(ValueError, match=match):
        Transformer(ModelConfig(**kwargs))
    with pytest.raises(ValueError, match=match):  # the FLOP count validates too (it never builds the model)
        flops_per_token(ModelConfig(**kwargs))


def test_connection_parameters_live_under_residual():
    base_names = {n for n, _ in make("baseline").named_parameters()}
    for residual, options in ABLATIONS.values():
        extra = {n for n, _ in make(residual, options, block_size=2).named_parameters()} - base_names
        assert extra, extra
        assert all(n.startswith("residual.") for n in extra), extra
    # query_proj is one D x D matrix per read: (L + 1) D^2 parameters, as the paper says ("d x d per layer")
    m = make("full", {"query": "input_dependent"})
    assert m.residual.query_proj.shape == (m.config.n_reads, TINY["d_model"], TINY["d_model"])
    assert not hasattr(make("full", {"key_norm": False}).residual, "key_norm_weight")
    assert not hasattr(make("full", {"mixing": "static"}).residual, "queries")
