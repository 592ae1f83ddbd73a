"""Acceptance tests of the model library against naive transcriptions of the paper's equations."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from attnres import ModelConfig, Transformer, depth_attention, flops_per_token
from attnres.residual import RESIDUAL_SCHEMES, BlockAttnRes, FullAttnRes

torch.set_num_threads(1)

TINY = {"vocab_size": 61, "n_layers": 3, "d_model": 32, "n_heads": 4, "max_seq_len": 16}


def make(residual: str, seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**{**TINY, "residual": residual, **kw}))


def randomize_queries(model: Transformer, seed: int = 1, scale: float = 1.0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.residual.queries.copy_(torch.randn(model.residual.queries.shape, generator=g) * scale)
        model.residual.key_norm_weight.copy_(1 + 0.3 * torch.randn(model.residual.key_norm_weight.shape, generator=g))


def tokens(B: int = 2, T: int = 12, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------------------
# Independent references, written from the paper's text (not from attnres.residual)
def eq2_to_4(values: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Eqs. 2-4 with explicit sums: phi(q, k) = exp(q . RMSNorm(k)); alpha = phi / sum phi; h = sum alpha v."""
    S = values.shape[0]
    phis = []
    for i in range(S):
        k = values[i] / torch.sqrt((values[i] ** 2).mean(-1, keepdim=True) + eps)
        phis.append(torch.exp((k * w).sum(-1)))
    total = sum(phis)
    return sum((phis[i] / total).unsqueeze(-1) * values[i] for i in range(S))


class PaperRMSNorm(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def paper_block_attn_res(blocks, partial_block, proj: nn.Linear, norm: nn.Module) -> torch.Tensor:
    """Fig. 2 of the paper, verbatim in structure."""
    V = torch.stack([*blocks, partial_block])  # [N+1, B, T, D]
    K = norm(V)
    logits = torch.einsum("d, n b t d -> n b t", proj.weight.squeeze(), K)
    return torch.einsum("n b t, n b t d -> b t d", logits.softmax(0), V)


def sublayer(model: Transformer, l: int, h: torch.Tensor) -> torch.Tensor:
    block = model.blocks[l // 2]
    return block.attn(h, model.rope_cos, model.rope_sin) if l % 2 == 0 else block.mlp(h)


def naive_forward(model: Transformer, idx: torch.Tensor) -> torch.Tensor:
    """Whole-model rollout written from Eqs. 1-6 and the K3 bookkeeping (blocks=[], partial=embedding)."""
    cfg = model.config
    L, eps = cfg.n_sublayers, cfg.norm_eps
    emb = model.tok_emb(idx)
    if cfg.residual == "baseline":
        h = emb
        for l in range(L):
            h = h + sublayer(model, l, h)
        return model.lm_head(model.norm(h))
    q = model.residual.queries * model.residual.key_norm_weight  # RMSNorm gain folded into the query
    if cfg.residual == "full":
        sources = [emb]  # v_0 = h_1, then v_i = f_i(h_i): deltas, never cumulative states
        for l in range(L):
            h = eq2_to_4(torch.stack(sources), q[l], eps)
            sources.append(sublayer(model, l, h))
        h = eq2_to_4(torch.stack(sources), q[L], eps)  # final read over all sources
        return model.lm_head(model.norm(h))
    S = cfg.sublayers_per_block
    blocks, partial = [], emb
    for l in range(L):
        h = eq2_to_4(torch.stack([*blocks, partial]), q[l], eps)
        if l % S == 0:  # block boundary: commit (layer 0 commits the embedding alone as b_0)
            blocks.append(partial)
            partial = None
        out = sublayer(model, l, h)
        partial = out if partial is None else partial + out
    h = eq2_to_4(torch.stack([*blocks, partial]), q[L], eps)
    return model.lm_head(model.norm(h))


# ---------------------------------------------------------------------------------------------------------------
def test_depth_attention_matches_equations_and_paper_pseudocode():
    torch.manual_seed(0)
    S, B, T, D, eps = 5, 2, 3, 16, 1e-6
    values = torch.randn(S, B, T, D) * torch.linspace(0.1, 10, S).view(S, 1, 1, 1)
    w = torch.randn(D)
    expected = eq2_to_4(values, w, eps)
    assert torch.allclose(depth_attention(values, w, eps=eps), expected, atol=1e-5)

    proj, norm = nn.Linear(D, 1, bias=False), PaperRMSNorm(D, eps)
    with torch.no_grad():
        proj.weight.normal_()
        norm.weight.uniform_(0.5, 1.5)
    paper = paper_block_attn_res(list(values[:-1]), values[-1], proj, norm)
    folded = proj.weight.squeeze() * norm.weight  # gain folded into the query
    assert torch.allclose(depth_attention(values, folded.detach(), eps=eps), paper, atol=1e-5)


def test_depth_attention_zero_query_is_mean_and_scale_invariant_logits():
    values = torch.randn(4, 3, 8)
    assert torch.allclose(depth_attention(values, torch.zeros(8)), values.mean(0), atol=1e-6)
    # RMSNorm on keys: a pure rescaling of one source changes its value, never its weight
    w = torch.randn(8)
    scaled = values.clone()
    scaled[2] *= 100
    a = depth_attention(values, w)
    b = depth_attention(scaled, w)
    with torch.no_grad():
        kn = values / values.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt()
        alpha = (kn @ w).softmax(0)
    assert torch.allclose(b - a, alpha[2].unsqueeze(-1) * 99 * values[2], atol=1e-3)


@pytest.mark.parametrize(
    ("residual", "kw"),
    [
        ("full", {}),
        ("block", {"block_size": 2}),
        ("block", {"block_size": 4}),
        ("block", {"n_blocks": 4}),
        ("block", {"block_size": 6}),  # 6 sublayers: n_blocks = 1
        ("block", {"block_size": 5}),  # last block shorter (5 + 1)
    ],
)
def test_zero_init_equals_baseline(residual, kw):
    # Sources of every read sum to the baseline stream; PreNorm and the final norm are scale-invariant,
    # so only RMSNorm's eps separates the two: make it negligible.
    base = make("baseline", norm_eps=1e-12)
    attn = make(residual, norm_eps=1e-12, **kw)
    missing, unexpected = attn.load_state_dict(base.state_dict(), strict=False)
    assert set(missing) == {"residual.queries", "residual.key_norm_weight"}
    assert not unexpected
    assert torch.count_nonzero(attn.residual.queries) == 0
    idx = tokens()
    lb, loss_b = base(idx, idx)
    la, loss_a = attn(idx, idx)
    assert torch.allclose(la, lb, atol=1e-5)
    assert abs(loss_a.item() - loss_b.item()) < 1e-5


def test_zero_init_gradients_of_shared_weights_match_baseline():
    base = make("baseline", norm_eps=1e-12)
    attn = make("block", norm_eps=1e-12, block_size=2)
    attn.load_state_dict(base.state_dict(), strict=False)
    idx = tokens()
    base(idx, idx)[1].backward()
    attn(idx, idx)[1].backward()
    for (name, p_b), (_, p_a) in zip(
        base.named_parameters(), [(n, p) for n, p in attn.named_parameters() if not n.startswith("residual.")]
    ):
        assert torch.allclose(p_a.grad, p_b.grad, atol=1e-5, rtol=1e-3), name


def test_block_with_one_sublayer_per_block_equals_full():
    full = make("full")
    block = make("block", block_size=1)
    block.load_state_dict(full.state_dict())  # same parameter names: one state dict loads into either
    randomize_queries(full)
    block.load_state_dict(full.state_dict())
    idx = tokens()
    lf, loss_f = full(idx, idx)
    lb, loss_b = block(idx, idx)
    assert torch.allclose(lf, lb, atol=1e-5)
    loss_f.backward()
    loss_b.backward()
    assert torch.allclose(full.residual.queries.grad, block.residual.queries.grad, atol=1e-5)


@pytest.mark.parametrize(
    ("residual", "kw"),
    [
        ("full", {}),
        ("full", {"residual_options": {"read_group": 1}}),
        ("full", {"residual_options": {"read_group": 3}}),
        ("block", {"block_size": 2}),
        ("block", {"block_size": 4}),
        ("block", {"n_blocks": 1}),
        ("block", {"block_size": 5}),
        ("block", {"block_size": 3}),
    ],
)
def test_matches_naive_rollout_forward_and_gradients(residual, kw):
    model = make(residual, **kw)
    randomize_queries(model)
    ref = copy.deepcopy(model)
    idx = tokens()
    out = model(idx, idx)
    expected = naive_forward(ref, idx)
    assert torch.allclose(out[0], expected, atol=1e-5)
    out[1].backward()
    F.cross_entropy(expected.view(-1, expected.size(-1)), idx.view(-1)).backward()
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.allclose(p.grad, r.grad, atol=1e-5, rtol=1e-3), name


def assert_fast_path_equals_plain(fast: Transformer, slow: Transformer, idx: torch.Tensor) -> None:
    """Same weights (sharp softmax from large queries, which exercises the online-softmax merge): same logits
    and every gradient."""
    randomize_queries(fast, scale=3.0)
    slow.load_state_dict(fast.state_dict())
    lf, loss_f = fast(idx, idx)
    ls, loss_s = slow(idx, idx)
    assert torch.allclose(lf, ls, atol=1e-5)
    loss_f.backward()
    loss_s.backward()
    for (name, p), (_, r) in zip(fast.named_parameters(), slow.named_parameters()):
        assert torch.allclose(p.grad, r.grad, atol=1e-5, rtol=1e-3), name


@pytest.mark.parametrize("kw", [{"block_size": 2}, {"block_size": 4}, {"block_size": 5}, {"n_blocks": 1}])
def test_two_phase_equals_naive_block(kw):
    assert_fast_path_equals_plain(
        make("block", **kw), make("block", **kw, residual_options={"two_phase": False}), tokens()
    )


@pytest.mark.parametrize("read_group", [2, 3, 4, 7, 100])
def test_full_read_groups_equal_one_read_at_a_time(read_group):
    """read_group only changes how Full AttnRes computes (G reads share one pass over their common sources)."""
    fast = make("full", residual_options={"read_group": read_group})
    slow = make("full", residual_options={"read_group": 1})
    idx = tokens()
    assert_fast_path_equals_plain(fast, slow, idx)
    fast.record_diagnostics = slow.record_diagnostics = True  # the recorded depth weights too (unfused reads)
    with torch.no_grad():
        fast(idx), slow(idx)
    assert torch.allclose(
        fast.diagnostics["depth_weights"], slow.diagnostics["depth_weights"], atol=1e-6, equal_nan=True
    )


@pytest.mark.parametrize(
    ("residual", "kw"),
    [
        ("full", {}),
        ("full", {"residual_options": {"read_group": 3}}),
        ("block", {"block_size": 2}),
        ("block", {"block_size": 5}),
    ],
)
def test_scoring_inside_the_kernels_equals_the_key_logit_cache(residual, kw, monkeypatch):
    """The CUDA path's bookkeeping (sources scored inside attend_batched and merge_read, no key-logit cache) on the
    CPU, where those functions run their torch reference: the same logits and gradients as the cached path, and
    against the naive rollout, in float64."""
    cached = make(residual, **kw).double()
    randomize_queries(cached, scale=3.0)
    fused = copy.deepcopy(cached)
    monkeypatch.setattr(type(fused.residual), "_scores_in_kernels", lambda self, x: True)
    idx = tokens()
    state = fused.residual.begin(fused.tok_emb(idx))
    assert state.fused
    assert not isinstance(state, BlockAttnRes.State) or not state.block_logits
    lf, loss_f = fused(idx, idx)
    lc, loss_c = cached(idx, idx)
    assert torch.allclose(lf, lc, atol=1e-10)
    assert torch.allclose(lf, naive_forward(copy.deepcopy(cached), idx))
    loss_f.backward()
    loss_c.backward()
    for (name, p), (_, r) in zip(fused.named_parameters(), cached.named_parameters()):
        assert torch.allclose(p.grad, r.grad, atol=1e-10, rtol=1e-8), name


def expected_groups(L: int, S: int, l: int) -> list[list[int]]:
    """Eq. 6 as sets of sublayer indices (-1 = the embedding b_0) visible to read l."""
    groups = [[-1]]
    n_done = l // S  # blocks completed before read l
    groups += [list(range(j * S, min((j + 1) * S, L))) for j in range(n_done)]
    if l % S:
        groups.append(list(range(n_done * S, l)))  # partial sum b_n^{i-1}
    return groups


@pytest.mark.parametrize(("L", "S"), [(6, 2), (6, 4), (6, 6), (6, 1), (8, 3), (10, 4)])
@pytest.mark.parametrize("two_phase", [True, False])
def test_block_source_sets_follow_eq6(L, S, two_phase):
    """Drive the scheme with orthogonal sublayer outputs: the coefficient of each output in a read's result
    reveals which source it belongs to (outputs of one block share one weight) and which it cannot see (0)."""
    D = L + 1
    cfg = ModelConfig(
        vocab_size=8,
        n_layers=L // 2,
        d_model=D,
        n_heads=1,
        head_dim=2,
        residual="block",
        block_size=S,
        residual_options={"two_phase": two_phase},
    )
    scheme = BlockAttnRes(cfg)
    with torch.no_grad():
        scheme.queries.normal_(generator=torch.Generator().manual_seed(L * 10 + S))
    basis = torch.eye(D).view(D, 1, 1, D)  # e_0 = embedding, e_{l+1} = output of sublayer l
    state = scheme.begin(basis[0])
    for l in range(L + 1):
        h = scheme.read(state, l) if l < L else scheme.final(state)
        coef = h.detach().view(D)
        groups = expected_groups(L, S, l)
        weights = []
        for g in groups:
            c = coef[[i + 1 for i in g]]
            assert torch.allclose(c, c[0].expand_as(c), atol=1e-6), (l, g)  # one weight per source
            weights.append(float(c[0]))
        assert math.isclose(sum(weights), 1.0, rel_tol=1e-5)  # softmax over exactly these sources
        assert len({round(w, 7) for w in weights}) == len(weights)  # distinct sources, distinct weights
        assert torch.all(coef[l + 1 :] == 0)  # nothing from the future
        if l < L:
            scheme.write(state, l, basis[l + 1])
    assert BlockAttnRes.sources_per_read(cfg) == [len(expected_groups(L, S, l)) for l in range(L + 1)]


@pytest.mark.parametrize("read_group", [1, 4])
def test_full_source_sets_are_embedding_plus_every_earlier_output(read_group):
    L = 6
    cfg = ModelConfig(
        vocab_size=8,
        n_layers=L // 2,
        d_model=L + 1,
        n_heads=1,
        head_dim=2,
        residual="full",
        residual_options={"read_group": read_group},
    )
    scheme = FullAttnRes(cfg)
    with torch.no_grad():
        scheme.queries.normal_(generator=torch.Generator().manual_seed(0))
    basis = torch.eye(L + 1).view(L + 1, 1, 1, L + 1)
    state = scheme.begin(basis[0])
    for l in range(L + 1):
        coef = (scheme.read(state, l) if l < L else scheme.final(state)).detach().view(-1)
        assert torch.all(coef[: l + 1] > 0)
        assert torch.all(coef[l + 1 :] == 0)
        assert len(set(coef[: l + 1].tolist())) == l + 1  # every output its own source (no blocks)
        if l < L:
            scheme.write(state, l, basis[l + 1])


@pytest.mark.parametrize("residual", ["full", "block"])
def test_gradients_reach_every_pseudo_query(residual):
    model = make(residual, block_size=2)
    idx = tokens()
    model(idx, idx)[1].backward()  # at zero init: queries get gradients, they are not stuck
    grad = model.residual.queries.grad
    per_read = grad.abs().sum(-1)
    # Read 0 has a single source (the embedding): its softmax is identically 1, so its query is inert by
    # construction (Kimi's code skips that read). Every other read's query must receive gradient.
    assert per_read[0] == 0
    assert torch.all(per_read[1:] > 0), per_read


@pytest.mark.parametrize("residual", ["baseline", "full", "block"])
def test_causality(residual):
    model = make(residual, block_size=2)
    randomize_queries(model) if residual != "baseline" else None
    idx = tokens(T=12)
    changed = idx.clone()
    changed[:, 7:] = (changed[:, 7:] + 5) % TINY["vocab_size"]
    a, b = model(idx), model(changed)
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize("residual", ["full", "block"])
def test_bf16_autocast_runs_and_depth_softmax_stays_fp32(residual):
    model = make(residual, block_size=2)
    randomize_queries(model)
    idx = tokens()
    model.record_diagnostics = True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(idx, idx)
        logit_dtype = model.residual._key_logits(
            torch.randn(2, 3, TINY["d_model"]).bfloat16(), model.residual.queries[:3]
        ).dtype
    assert logits.dtype == torch.bfloat16
    assert torch.isfinite(loss)
    assert logit_dtype == torch.float32
    w = model.diagnostics["depth_weights"]
    sums = torch.nansum(w, dim=1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-6)  # fp32-accurate normalisation
    loss.backward()
    assert torch.isfinite(model.residual.queries.grad).all()


def test_diagnostics_shapes():
    model = make("full")
    model.record_diagnostics = True
    model(tokens())
    d = model.diagnostics
    L = model.config.n_sublayers
    assert d["depth_weights"].shape == (L + 1, L + 1)
    assert d["sublayer_output_rms"].shape == (L,)
    assert d["block_output_rms"].shape == (model.config.n_layers,)
    assert torch.isnan(d["depth_weights"][0, 1:]).all()
    assert not torch.isnan(d["depth_weights"][-1]).any()
    assert len(model.read_kinds()) == L + 1
    assert len(model.residual.source_labels()) == L + 1
    base = make("baseline")
    base.record_diagnostics = True
    base(tokens())
    assert "depth_weights" not in base.diagnostics


@pytest.mark.parametrize("residual", ["baseline", "full", "block"])
def test_flop_count_matches_torch_flop_counter(residual):
    """Matmul + mixing + causal attention vs torch's counter. The counter sees the math SDPA path, which computes
    the full T x T score matrix, so its attention is twice our causal count; it does not count the elementwise
    products of the depth-mixing backward, hence the 1% tolerance."""
    cfg = ModelConfig(**{**TINY, "residual": residual, "block_size": 2, "max_seq_len": 32})
    model = Transformer(cfg)
    if residual != "baseline":
        randomize_queries(model)
    idx = torch.randint(0, cfg.vocab_size, (2, 32))
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        model(idx, idx)[1].backward()
    counted = counter.get_total_flops() / idx.numel()
    f = flops_per_token(cfg, 32)
    # mix_sources' weighted sums and their weight gradients are element-wise (2*D each per (read, source) pair
    # forward, 2*D backward...): the counter does not see them
    unseen = 3 * 2 * cfg.d_model * sum(type(model.residual).sources_per_read(cfg)) if residual != "baseline" else 0
    assert counted + unseen == pytest.approx(f.matmul + f.mixing + 2 * f.attention, rel=0.01)


def test_parameter_names_shared_between_full_and_block():
    full, block = make("full"), make("block", block_size=2)
    block.load_state_dict(full.state_dict(), strict=True)
    assert [n for n, _ in full.named_parameters()] == [n for n, _ in block.named_parameters()]


def test_head_dim_may_differ_from_d_model_over_heads():
    cfg = ModelConfig(vocab_size=50, n_layers=1, d_model=24, n_heads=3, head_dim=16, max_seq_len=8)
    assert cfg.attn_dim == 48
    logits = Transformer(cfg)(torch.randint(0, 50, (1, 8)))
    assert logits.shape == (1, 8, 50)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"residual": "nope"}, "residual"),
        ({"residual": "block", "n_blocks": 99}, "n_blocks"),
        ({"residual": "block", "block_size": 0}, "block_size"),
        ({"d_model": 30, "n_heads": 4}, "d_model"),
        ({"n_layers": 0}, "n_layers"),
        ({"d_model": -8}, "d_model"),
        ({"residual": "full", "residual_options": {"bogus": 1}}, "residual_options"),
    ],
)
def test_invalid_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Transformer(ModelConfig(**{**TINY, **kwargs}))


def test_invalid_residual_lists_allowed_values():
    with pytest.raises(ValueError, match=r"baseline.*full.*block"):
        ModelConfig(residual="attnres")


def test_registry_holds_each_scheme_once_with_its_own_options():
    import dataclasses

    from attnres import registry
    from attnres.residual import PreNormResidual

    assert list(RESIDUAL_SCHEMES) == ["baseline", "full", "block", "denseformer", "hyper", "mhc", "laurel"]
    assert RESIDUAL_SCHEMES is registry.SCHEMES
    for name, cls in RESIDUAL_SCHEMES.items():
        assert cls.Options.scheme == name
        assert dataclasses.is_dataclass(cls.Options)
        assert type(ModelConfig(residual=name, n_layers=2, d_model=32, n_blocks=2).options) is cls.Options
    with pytest.raises(ValueError, match="'full' is registered twice"):
        registry.register("full")(FullAttnRes)

    class NoOwnOptions(PreNormResidual):
        pass

    with pytest.raises(TypeError, match="must define its own Options"):
        registry.register("no_own_options")(NoOwnOptions)
    assert "no_own_options" not in RESIDUAL_SCHEMES


def test_options_keep_booleans_apart_from_integers():
    """YAML's true is not 1: a bool option refuses 0/1 and an int option refuses True (messages name the key)."""
    from attnres import BlockAttnResOptions, FullAttnResOptions

    assert FullAttnResOptions.parse({"window": None}).window is None
    for options, key in (
        ({"key_norm": 1}, "key_norm"),
        ({"heads": True}, "heads"),
        ({"read_group": 2.0}, "read_group"),
        ({"query": True}, "query"),
    ):
        with pytest.raises(ValueError, match=rf"model\.residual_options\.{key}=.*\['{key}'\]"):
            FullAttnResOptions.parse(options)
    with pytest.raises(ValueError, match=r"two_phase=0 .*allowed values: True, False"):
        BlockAttnResOptions(two_phase=0)


def test_tied_embeddings_and_param_counts():
    model = make("baseline", tie_embeddings=True)
    assert model.lm_head.weight is model.tok_emb.weight
    untied = make("baseline")
    emb = TINY["vocab_size"] * TINY["d_model"]
    assert untied.num_params() - model.num_params() == emb
    assert untied.num_params(non_embedding=True) == model.num_params(non_embedding=True)


@pytest.mark.parametrize("residual", ["baseline", "block"])
def test_activation_checkpointing_gives_identical_gradients(residual):
    a = make(residual, block_size=2)
    randomize_queries(a) if residual != "baseline" else None
    b = copy.deepcopy(a)
    b.set_activation_checkpointing(True)
    idx = tokens()
    a(idx, idx)[1].backward()
    b(idx, idx)[1].backward()
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name


@pytest.mark.parametrize(
    ("residual", "kw"),
    [
        ("full", {}),
        ("block", {"block_size": 2}),
        ("block", {"block_size": 4, "residual_options": {"two_phase": False}}),
        ("full", {"residual_options": {"heads": 2}}),
    ],
)
def test_fused_read_and_prenorm_equal_the_unfused_model(residual, kw, monkeypatch):
    """The model reads through read_normalized (the read fused with the PreNorm normalisation); the plain
    read-then-RMSNorm composition (the base class' read_normalized) gives the same loss and gradients."""
    from attnres.residual import ResidualScheme

    fused = make(residual, **kw)
    randomize_queries(fused) if "heads" not in kw.get("residual_options", {}) else None
    plain = copy.deepcopy(fused)
    idx = tokens()
    _, loss = fused(idx, idx)
    loss.backward()
    with monkeypatch.context() as m:
        m.setattr(type(plain.residual), "read_normalized", ResidualScheme.read_normalized)
        m.setattr(type(plain.residual), "final_normalized", ResidualScheme.final_normalized)
        _, loss_plain = plain(idx, idx)
        loss_plain.backward()
    assert torch.allclose(loss, loss_plain, rtol=1e-6)
    for (name, p), (_, q) in zip(fused.named_parameters(), plain.named_parameters()):  # fp32 rounding: ~1e-6
        assert (p.grad - q.grad).norm() <= 1e-5 * q.grad.norm(), name


@pytest.mark.parametrize(("residual", "kw"), [("full", {}), ("block", {"block_size": 2})])
def test_compiled_model_matches_eager_including_every_gradient(residual, kw):
    """torch.compile traces the depth ops' plain-torch references; loss and *every* gradient must match eager
    (a traced hand-written Function once returned all-zero gradients upstream of it: docs/depth_ops.md)."""
    import torch._dynamo

    model = make(residual, **kw)
    randomize_queries(model)
    idx = tokens()
    _, loss = model(idx, idx)
    loss.backward()
    eager = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    _, loss_c = torch.compile(model)(idx, idx)
    loss_c.backward()
    assert torch.allclose(loss_c, loss, rtol=1e-5)
    for name, p in model.named_parameters():  # fp32 reassociation: ~2e-6 relative; a dropped path: 1
        assert p.grad is not None, name
        assert (p.grad - eager[name]).norm() <= 1e-4 * eager[name].norm(), name
    torch._dynamo.reset()


def test_regional_compilation_matches_eager_and_compiles_each_sublayer_once():
    """compile_regions(): the attention and MLP sublayers compiled by inductor, the residual scheme eager. Loss and
    every gradient equal eager's for the baseline, Block and Full; the two compiled sublayers are compiled once and
    reused by every block of every model (what keeps compile time flat in depth)."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    idx = tokens()
    for residual, kw in (("block", {"block_size": 2}), ("full", {}), ("baseline", {})):
        model = make(residual, **kw)
        if residual != "baseline":
            randomize_queries(model)
        eager = copy.deepcopy(model)
        model.compile_regions(backend=counter)
        _, loss = model(idx, idx)
        loss.backward()
        _, loss_e = eager(idx, idx)
        loss_e.backward()
        assert torch.allclose(loss, loss_e, rtol=1e-5), residual
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            assert p.grad is not None, (residual, name)
            assert (p.grad - q.grad).norm() <= 1e-4 * q.grad.norm() + 1e-12, (residual, name)
    assert counter.frame_count == 2  # CausalSelfAttention.from_normalized and SwiGLU.from_normalized
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------------------------
# Inference with a KV cache

DECODE_CASES = [(r, {"n_blocks": 3} if r == "block" else {}) for r in RESIDUAL_SCHEMES] + [
    ("full", {"residual_options": {"read_group": 1}}),
    ("full", {"residual_options": {"query": "input_dependent"}}),
    ("full", {"residual_options": {"window": 2}}),
    ("block", {"block_size": 2}),
    ("block", {"block_size": 3, "residual_options": {"two_phase": False}}),
    ("block", {"n_blocks": 2, "residual_options": {"normalizer": "sigmoid"}}),
    ("hyper", {"residual_options": {"dynamic": False}}),
    ("mhc", {"residual_options": {"n": 2}}),
]


@pytest.mark.parametrize(("residual", "kw"), DECODE_CASES)
def test_cached_decoding_equals_the_full_forward(residual, kw):
    """Prefill of 4 tokens, 3 single-token decode steps, then a 3-token chunk: the logits of every position equal
    one forward over all 10 tokens, for every residual scheme (their depth state is per token: only attention's
    keys and values are cached, and no earlier position is recomputed)."""
    model = make(residual, **kw)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # every residual parameter away from its (often identity) initialisation
        for name, p in model.named_parameters():
            if name.startswith("residual."):
                p.add_(0.5 * torch.randn(p.shape, generator=g))
    idx = tokens(B=2, T=10)
    with torch.inference_mode():
        full = model(idx)
        cache = model.new_cache()
        steps = [model(idx[:, :4], cache=cache)]
        steps += [model(idx[:, t : t + 1], cache=cache) for t in range(4, 7)]
        steps.append(model(idx[:, 7:], cache=cache))
    assert cache.length == 10
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=2e-5, rtol=1e-4)


def test_generate_continues_greedily_with_the_cache():
    """generate(): the greedy continuation equals re-running the whole sequence for each new token."""
    model = make("block", block_size=2)
    randomize_queries(model)
    prompt = tokens(B=2, T=5)
    out = model.generate(prompt, max_new_tokens=4)
    assert out.shape == (2, 9)
    assert torch.equal(out[:, :5], prompt)
    seq = prompt
    with torch.no_grad():
        for _ in range(4):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(tokens(B=1, T=4), cache=_filled_cache(model, 14))  # 14 + 4 > max_seq_len 16


def _filled_cache(model: Transformer, length: int):
    cache = model.new_cache()
    cache.length = length
    return cache
