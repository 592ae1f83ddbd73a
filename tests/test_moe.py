"""The MoE MLP sublayer (attnres/moe.py) against a naive per-token transcription of its equations (DeepSeek-V3's
routing, written here from the equations, not from attnres.moe), plus routing ties, empty experts, the
auxiliary-loss-free bias update, load statistics, compilation, zero-init AttnRes, FLOP and parameter counts,
resume and the config's identity."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from attnres import ModelConfig, Transformer, flops_per_token
from attnres.config import MoEConfig
from attnres.flops import param_counts
from attnres.moe import MoEFeedForward, grouped_mm_supported

torch.set_num_threads(1)

TINY = {"vocab_size": 61, "n_layers": 3, "d_model": 32, "n_heads": 4, "max_seq_len": 16, "d_ff": 16}
MOE = {"n_experts": 6, "top_k": 2, "n_shared": 2, "shared_d_ff": 8}
HAS_GROUPED_MM = hasattr(torch, "_grouped_mm")


def config(moe: dict | None = None, **kw) -> ModelConfig:
    return ModelConfig(**{**TINY, "ffn": "moe", "moe": {**MOE, **(moe or {})}, **kw})


def layer(moe: dict | None = None, seed: int = 0, dtype: torch.dtype = torch.float64, **kw) -> MoEFeedForward:
    """One MoE sublayer with random weights (norm gain and bias too, so that every term is exercised)."""
    torch.manual_seed(seed)
    m = MoEFeedForward(config(moe, **kw))
    m.reset_parameters(std=0.3, out_std=0.2)
    with torch.no_grad():
        m.norm.weight.copy_(1 + 0.2 * torch.randn(m.norm.weight.shape))
        m.expert_bias.copy_(0.05 * torch.randn(m.expert_bias.shape))
    return m.to(dtype)


def inputs(B: int = 3, T: int = 5, D: int = 32, seed: int = 1, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ---------------------------------------------------------------------------------------------------------------
# The reference: one token at a time, straight from the equations (module docstring of attnres.moe)
def swiglu(n: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """n [D]; w_gate, w_up [D, F]; w_down [F, D]."""
    return (F.silu(n @ w_gate) * (n @ w_up)) @ w_down


def reference(m: MoEFeedForward, h: torch.Tensor) -> tuple[torch.Tensor, list[list[int]], torch.Tensor]:
    """(output [B, T, D], the experts of every token in selection order, L_bal) of ``m`` on h [B, T, D]."""
    o = m.options
    E, k, Fd = o.n_experts, o.top_k, m.experts_down.shape[1]
    Fs = m.shared_down.weight.shape[1] // o.n_shared if o.n_shared else 0
    B, T, _D = h.shape
    out, chosen_all, aux = torch.zeros_like(h), [], h.new_zeros(())
    for b in range(B):
        f_count, p_sum = [0] * E, h.new_zeros(E)
        for t in range(T):
            x = h[b, t]
            n = x / torch.sqrt(x.pow(2).mean() + m.norm.eps) * m.norm.weight
            logits = m.router.weight @ n  # [E]
            s = logits.sigmoid() if o.score == "sigmoid" else logits.softmax(-1)
            sel = [(s[i] + m.expert_bias[i]).item() for i in range(E)]
            chosen = sorted(range(E), key=lambda i: (-sel[i], i))[:k]  # largest first, ties to the lower index
            chosen_all.append(chosen)
            denom = sum(s[i] for i in chosen) if o.renormalize else 1.0
            y = torch.zeros_like(x)
            for i in chosen:
                g = o.routed_scaling * s[i] / denom
                wgu = m.experts_gate_up[i]
                y = y + g * swiglu(n, wgu[:, :Fd], wgu[:, Fd:], m.experts_down[i])
            for j in range(o.n_shared):  # each shared expert on its own slice of the shared weights
                wg = m.shared_gate_up.weight[j * Fs : (j + 1) * Fs].T
                wu = m.shared_gate_up.weight[o.n_shared * Fs + j * Fs : o.n_shared * Fs + (j + 1) * Fs].T
                y = y + swiglu(n, wg, wu, m.shared_down.weight[:, j * Fs : (j + 1) * Fs].T)
            out[b, t] = y
            for i in chosen:
                f_count[i] += 1
            p_sum = p_sum + s / s.sum()
        f = torch.tensor(f_count, dtype=h.dtype) * E / (k * T)
        aux = aux + o.aux_loss_alpha * (f * p_sum / T).sum()
    return out, chosen_all, aux / B


def grads(m: MoEFeedForward, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    m.zero_grad(set_to_none=True)
    loss.backward()
    return {name: p.grad.clone() for name, p in m.named_parameters()}


DISPATCHES = ["loop", pytest.param("grouped_mm", marks=pytest.mark.skipif(not HAS_GROUPED_MM, reason="no _grouped_mm"))]
# dtype and (atol, rtol) per dispatch: the loop path in fp64; torch's CPU _grouped_mm takes fp32 at most
PRECISION = {"loop": (torch.float64, 1e-11, 1e-9), "grouped_mm": (torch.float32, 1e-5, 1e-4)}


@pytest.mark.parametrize("dispatch", DISPATCHES)
@pytest.mark.parametrize(
    "moe",
    [
        {},
        {"score": "softmax"},
        {"score": "softmax", "renormalize": False, "routed_scaling": 1.0},
        {"n_shared": 0, "top_k": 1},
        {"top_k": 6},  # every expert
        {"aux_loss_alpha": 0.0},
    ],
    ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()) or "default",
)
def test_forward_and_gradients_match_the_per_token_reference(moe, dispatch):
    """Output, L_bal and the gradient of every parameter (norm gain, router, routed and shared experts) of a
    loss using both equal the per-token reference's. fp64 on the loop path; the grouped path runs torch's
    CPU _grouped_mm in fp32 eager (auto picks it only for bf16: attnres.moe.grouped_mm_supported)."""
    dtype, atol, rtol = PRECISION[dispatch]
    m = layer({**moe, "aux_loss_alpha": moe.get("aux_loss_alpha", 0.01), "dispatch": dispatch}, dtype=dtype)
    h = inputs(dtype=dtype)
    probe = torch.randn(h.shape, generator=torch.Generator().manual_seed(7), dtype=h.dtype)
    out = m(h)
    aux = m.last_aux_loss
    got = grads(m, (out * probe).sum() + 10 * aux)
    ref_out, chosen, ref_aux = reference(m, h)
    want = grads(m, (ref_out * probe).sum() + 10 * ref_aux)
    assert torch.allclose(out, ref_out, atol=atol, rtol=rtol)
    assert torch.allclose(aux, ref_aux, atol=atol, rtol=rtol)
    assert set(got) == {n for n, _ in m.named_parameters()}
    for name in got:
        assert torch.allclose(got[name], want[name], atol=atol, rtol=rtol), name
    # the load statistics: tokens per expert are the reference's choices, N k in all, nothing dropped
    counts = torch.bincount(torch.tensor(chosen).flatten(), minlength=m.options.n_experts).float()
    assert torch.equal(m.last_load, counts)
    assert m.last_load.sum() == h.shape[0] * h.shape[1] * m.options.top_k


def test_selection_uses_score_plus_bias_and_weights_use_the_score_alone():
    """A bias large enough forces an expert into every token's top-k, yet its weight is still its own score
    (renormalised): the bias steers routing only."""
    m = layer({"top_k": 2})
    with torch.no_grad():
        m.expert_bias.zero_()
        m.expert_bias[4] = 10.0
    h = inputs()
    out = m(h)
    ref_out, chosen, _ = reference(m, h)
    assert all(c[0] == 4 for c in chosen)
    assert torch.allclose(out, ref_out, atol=1e-12, rtol=1e-10)
    assert m.last_load[4] == h.shape[0] * h.shape[1]


@pytest.mark.parametrize("dispatch", DISPATCHES)
def test_routing_ties_go_to_the_lower_expert_index(dispatch):
    """With a zero router every score is sigmoid(0) = 1/2: all E tie, and the k chosen are experts 0 .. k-1 for
    every token (a stable sort, not torch.topk's unspecified order). With the bias tying experts 1, 3 and 5
    above the rest, top-2 is (1, 3). Repeated calls give bit-identical outputs."""
    dtype, atol, _ = PRECISION[dispatch]
    m = layer({"top_k": 3, "dispatch": dispatch}, dtype=dtype)
    with torch.no_grad():
        m.router.weight.zero_()
        m.expert_bias.zero_()
    h = inputs(dtype=dtype)
    m.train()
    out = m(h)
    assert torch.equal(m.last_load, torch.tensor([15.0, 15, 15, 0, 0, 0]))
    assert torch.equal(m(h), out)
    ref_out, chosen, _ = reference(m, h)
    assert all(c == [0, 1, 2] for c in chosen)
    assert torch.allclose(out, ref_out, atol=atol)
    m2 = layer({"top_k": 2, "dispatch": dispatch}, dtype=dtype)
    with torch.no_grad():
        m2.router.weight.zero_()
        m2.expert_bias.copy_(torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0, 0.5]))
    m2(h)
    assert torch.equal(m2.last_load, torch.tensor([0.0, 15, 0, 15, 0, 0]))


@pytest.mark.parametrize("dispatch", DISPATCHES)
def test_an_expert_that_receives_no_token(dispatch):
    """Expert 2, never selected (a bias of -100), gets no row: the output still equals the reference and its
    weights get a gradient of exactly zero (present, so DDP and the step-1 dead-gradient check see it)."""
    dtype, atol, rtol = PRECISION[dispatch]
    m = layer({"dispatch": dispatch}, dtype=dtype)
    with torch.no_grad():
        m.expert_bias[2] = -100.0
    h = inputs(dtype=dtype)
    out = m(h)
    assert m.last_load[2] == 0
    got = grads(m, out.pow(2).sum())
    ref_out, chosen, _ = reference(m, h)
    assert all(2 not in c for c in chosen)
    assert torch.allclose(out, ref_out, atol=atol, rtol=rtol)
    assert torch.count_nonzero(got["experts_gate_up"][2]) == 0
    assert torch.count_nonzero(got["experts_down"][2]) == 0
    assert torch.count_nonzero(got["experts_down"][0]) > 0


def test_bias_update_from_the_load_of_one_optimizer_step():
    """b_i += u * sign(mean(load) - load_i), from the tokens of every training forward since the last update (two
    micro-batches here); the count is then cleared, so an update with no forward leaves b unchanged; eval
    forwards count nothing, and the bias never gets a gradient."""
    torch.manual_seed(0)
    model = Transformer(config({"bias_update_rate": 0.01}))
    idx = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(3))
    model.train()
    loads = []
    for half in (idx[:1], idx[1:]):
        model(half, half)[1].backward()
        loads.append([m.last_load.clone() for m in model.moe])
    model.eval()
    model(idx)  # not counted
    for i, m in enumerate(model.moe):
        load = loads[0][i] + loads[1][i]
        assert torch.equal(m.load, load)
        assert load.sum() == 24 * m.options.top_k  # every token's k experts: nothing dropped
        before = m.expert_bias.clone()
        m.update_bias()
        assert torch.equal(m.expert_bias, before + 0.01 * torch.sign(load.mean() - load))
        assert torch.count_nonzero(m.load) == 0
    after = [m.expert_bias.clone() for m in model.moe]
    model.update_moe_bias()
    assert all(torch.equal(m.expert_bias, b) for m, b in zip(model.moe, after))
    assert "blocks.0.mlp.expert_bias" in model.state_dict()
    assert all(not n.endswith("expert_bias") for n, _ in model.named_parameters())


def test_bias_updates_balance_the_load():
    """Repeated updates on a fixed batch drive a skewed router (expert 0 favoured) towards balance."""
    m = layer({"top_k": 1, "bias_update_rate": 0.02, "n_shared": 0}, dtype=torch.float32)
    with torch.no_grad():
        m.expert_bias.zero_()
        m.router.weight[0] += 0.1  # with inputs around +3 in every channel: expert 0 wins for most tokens
    h = inputs(B=8, T=16, dtype=torch.float32) + 3
    with torch.no_grad():
        m(h)
        first = m.last_load.max().item()
        for _ in range(200):
            m(h)
            m.load.copy_(m.last_load)
            m.update_bias()
        m(h)
    assert first > 100  # of 128 tokens, 6 experts: balanced is 21.3
    assert m.last_load.max().item() < 40


def test_model_load_statistics_sum_to_tokens_times_k():
    """Through a whole model: every MoE sublayer's load is B T k and the training loss is CE + the sum of the
    sublayers' L_bal; in eval mode the loss is plain CE."""
    torch.manual_seed(0)
    model = Transformer(config({"aux_loss_alpha": 0.01}))
    idx = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(3))
    logits, loss = model(idx, idx)
    ce = F.cross_entropy(logits.view(-1, 61), idx.reshape(-1))
    aux = sum(m.last_aux_loss for m in model.moe)
    assert torch.allclose(loss, ce + aux)
    assert aux > 0
    assert all(m.load.sum() == 24 * 2 for m in model.moe)
    model.eval()
    logits, loss = model(idx, idx)
    assert torch.equal(loss, F.cross_entropy(logits.view(-1, 61), idx.reshape(-1)))


# ---------------------------------------------------------------------------------------------------------------
# Compilation, zero-init AttnRes, resume
@pytest.mark.skipif(not HAS_GROUPED_MM, reason="this torch has no _grouped_mm")
def test_compile_fullgraph_on_cpu():
    """torch.compile(fullgraph=True) of the MoE sublayer (bf16: auto dispatch takes torch._grouped_mm, whose
    compile-time shape function wants bf16) equals eager, forward and gradients. Skipped only when inductor
    cannot build a CPU kernel here (no C++ compiler)."""
    m = layer({"dispatch": "auto"}, dtype=torch.bfloat16)
    assert grouped_mm_supported(torch.device("cpu"), torch.bfloat16, 32, 16)
    h = inputs(dtype=torch.bfloat16)
    m.train()
    eager = m.from_normalized(h)
    g_eager = grads(m, eager.float().pow(2).sum())
    compiled = torch.compile(MoEFeedForward.from_normalized, fullgraph=True)
    try:
        out = compiled(m, h)
    except Exception as e:  # classified below: only a missing C++ toolchain skips
        if "CppCompileError" in type(e).__name__ or "C++ compiler" in str(e) or "InvalidCxxCompiler" in str(e):
            pytest.skip(f"inductor cannot compile a CPU kernel here: {type(e).__name__}")
        raise
    eager_load = m.last_load.clone()
    out = compiled(m, h)  # a second call: no recompilation needed, same result
    assert torch.equal(m.last_load, eager_load)  # the same routing
    g = grads(m, out.float().pow(2).sum())

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:  # bf16 rounding (inductor computes in fp32 inside)
        return bool((a.float() - b.float()).abs().max() <= 2e-2 * b.float().abs().max())

    assert close(out, eager)
    for name in g:
        assert close(g[name], g_eager[name]), name


@pytest.mark.parametrize(("residual", "kw"), [("full", {}), ("block", {"block_size": 2})])
def test_zero_init_attnres_with_moe_equals_the_moe_baseline(residual, kw):
    """Zero pseudo-queries make step 0 of an MoE Full/Block AttnRes model equal the MoE baseline's: logits, loss,
    the routing (load) of every sublayer and the gradients of every shared weight (fp64, as the routing is
    discontinuous: a float64 margin keeps every token's top-k the same)."""

    def make(res: str, **extra) -> Transformer:
        torch.manual_seed(0)
        return Transformer(config({"aux_loss_alpha": 0.01}, residual=res, norm_eps=1e-12, **extra)).double()

    base, attn = make("baseline"), make(residual, **kw)
    missing, unexpected = attn.load_state_dict(base.state_dict(), strict=False)
    assert set(missing) == {"residual.queries", "residual.key_norm_weight"}
    assert not unexpected
    idx = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(3))
    lb, loss_b = base(idx, idx)
    la, loss_a = attn(idx, idx)
    assert torch.allclose(la, lb, atol=1e-10)
    assert abs(loss_a.item() - loss_b.item()) < 1e-10
    assert all(torch.equal(a.load, b.load) for a, b in zip(attn.moe, base.moe))
    loss_b.backward()
    loss_a.backward()
    shared = dict(attn.named_parameters())
    for name, p in base.named_parameters():
        # ~1e-7 of the gradient's scale, as for a dense model in fp64 (the AttnRes reads' key-norm eps)
        assert (shared[name].grad - p.grad).abs().max() <= 1e-6 * p.grad.abs().max(), name


def test_resume_from_a_state_dict_is_bit_identical():
    """Three AdamW steps with a bias update after each, a save (model and optimizer state dicts), three more:
    the same parameters, biases and losses as six uninterrupted steps (expert_bias is in the state dict)."""

    def fresh() -> tuple[Transformer, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = Transformer(config({"aux_loss_alpha": 0.01}, residual="block", block_size=2))
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(model, opt, i) -> float:
        idx = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(i))
        loss = model(idx, idx)[1]
        opt.zero_grad()
        loss.backward()
        model.update_moe_bias()
        opt.step()
        return loss.item()

    model, opt = fresh()
    straight = [step(model, opt, i) for i in range(6)]
    first, opt1 = fresh()
    resumed = [step(first, opt1, i) for i in range(3)]
    saved = copy.deepcopy((first.state_dict(), opt1.state_dict()))
    second, opt2 = fresh()
    second.load_state_dict(saved[0])
    opt2.load_state_dict(saved[1])
    resumed += [step(second, opt2, i) for i in range(3, 6)]
    assert resumed == straight
    for (name, a), b in zip(model.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name
    assert torch.count_nonzero(model.moe[0].expert_bias) > 0


# ---------------------------------------------------------------------------------------------------------------
# Counting: FLOPs and parameters of the activated experts
@pytest.mark.parametrize("moe", [{}, {"n_shared": 0}, {"top_k": 1, "n_experts": 3}])
def test_flops_per_token_count_the_activated_experts(moe):
    """A training step's FLOPs counted by torch (forward and backward, loop dispatch so every expert matmul is an
    aten.mm) equal flops_per_token: 6 x (attention weights + router + k routed + shared experts + LM head) +
    causal attention (exact: the counter sees every matmul, and nothing else is counted); the baseline scheme
    mixes nothing."""
    cfg = config({**moe, "dispatch": "loop"}, max_seq_len=32)
    torch.manual_seed(0)
    model = Transformer(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, 32))
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        model(idx, idx)[1].backward()
    f = flops_per_token(cfg, 32)
    # SDPA's math kernel computes the full T x T scores: twice the causal count of attnres.flops
    assert counter.get_total_flops() == pytest.approx((f.matmul + 2 * f.attention) * idx.numel(), rel=1e-12)
    assert f.mixing == 0


def test_total_and_activated_parameter_counts():
    """total counts all E experts; activated only k of them (router and shared experts always); equal for dense;
    six_n is 6 x the activated non-embedding count."""
    cfg = config()
    model = Transformer(cfg)
    counts = param_counts(cfg)
    D, Fd, L = 32, 16, 3
    expert = 3 * D * Fd
    assert counts["total"] == model.num_params()
    assert counts["total"] - counts["activated"] == L * (6 - 2) * expert
    assert counts["non_embedding"] - counts["activated_non_embedding"] == L * (6 - 2) * expert
    attn = 4 * D * D
    router, shared = D * 6, 3 * D * 2 * 8
    norms = 2 * D * L + D
    assert counts["activated_non_embedding"] == L * (attn + router + 2 * expert + shared) + norms
    assert flops_per_token(cfg).six_n == 6 * counts["activated_non_embedding"]
    dense = param_counts(ModelConfig(**TINY))
    assert dense["total"] == dense["activated"]


# ---------------------------------------------------------------------------------------------------------------
# Configuration
@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"ffn": "sparse"}, r"ffn='sparse' \(model.ffn\) is unknown; allowed values: dense, moe"),
        ({"moe": {"top_k": 2}}, r"moe \(model.moe\) is set but ffn='dense'"),
        ({"ffn": "moe", "moe": {"top_k": 9, "n_experts": 8}}, r"top_k=9 .* at most n_experts=8"),
        ({"ffn": "moe", "moe": {"score": "relu"}}, r"score='relu'"),
        ({"ffn": "moe", "moe": {"topk": 2}}, r"model.moe has \['topk'\], which is not an MoE setting"),
        ({"ffn": "moe", "moe": {"n_shared": -1}}, r"n_shared=-1"),
        ({"ffn": "moe", "moe": {"routed_scaling": 0}}, r"routed_scaling=0"),
    ],
)
def test_bad_moe_settings_are_named(kw, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{**TINY, **kw})


def test_moe_config_defaults():
    """The defaults docs/moe.md states: top-8 of 64 routed experts, 1 shared of width d_ff, sigmoid scores
    renormalised over the k, routed scaling 2.446, u = 1e-3, alpha = 1e-4."""
    o = ModelConfig(**{**TINY, "ffn": "moe"}).moe_options
    assert (o.n_experts, o.top_k, o.n_shared, o.shared_d_ff) == (64, 8, 1, None)
    assert (o.score, o.renormalize, o.routed_scaling) == ("sigmoid", True, 2.446)
    assert (o.bias_update_rate, o.aux_loss_alpha, o.dispatch) == (1e-3, 1e-4, "auto")
    assert o == MoEConfig()


# ---------------------------------------------------------------------------------------------------------------
# Through the harness, and across data-parallel ranks
def test_a_moe_run_through_the_harness(train_cfg):
    """experiment=smoke on size=cpu_moe (Block AttnRes): the run completes (the step-1 dead-gradient check passes:
    every expert weight gets a gradient), its record's N is the activated count (params: every expert), and the
    checkpoint holds balancing biases that LMModule moved once per optimizer step (12 steps of u = 1e-3:
    |b_i| <= 0.012, on the 1e-3 grid)."""
    from pathlib import Path

    from omegaconf import OmegaConf

    from experiments.config.config_schema import build_model_config
    from experiments.train import train

    cfg = train_cfg("size=cpu_moe", "model=block_attnres")
    rec = train(cfg)
    assert rec["status"] == "completed"
    assert rec["steps"] == 12
    # non-embedding counts do not depend on the vocabulary (which the prepared data sets)
    counts = param_counts(build_model_config(OmegaConf.merge(cfg, {"data": {"vocab_size": 256}})))
    assert rec["params_non_embedding"] == counts["activated_non_embedding"] < counts["non_embedding"]
    assert rec["params"] > counts["non_embedding"]  # every expert, and the embeddings
    ckpt = torch.load(Path(rec["run_dir"]) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    biases = [v for k, v in ckpt["state_dict"].items() if k.endswith("mlp.expert_bias")]
    assert len(biases) == 4
    for b in biases:
        assert b.dtype == torch.float32
        assert torch.count_nonzero(b) > 0
        assert b.abs().max() <= 12 * 1e-3 + 1e-6
        steps = b / 1e-3
        assert torch.allclose(steps, steps.round(), atol=1e-3)
    # router statistics: every logged step x 4 MoE layers x 8 experts, dropless, the bias the checkpoint holds
    from analysis.router import load_balance, read_router

    router = read_router(Path(rec["run_dir"]) / "router.csv")
    assert router["step"].nunique() >= 2
    assert set(router["layer"]) == set(range(4))
    assert set(router["expert"]) == set(range(8))
    bal = load_balance(router)
    assert (bal["dropped"] == 0).all()  # N k pairs routed every step: 4 x 128 tokens x top-2
    assert (bal["load_max_over_mean"] >= 1).all()
    assert (bal["load_min_over_mean"] <= 1).all()
    last = router[router["step"] == router["step"].max()]
    if last["step"].iloc[0] == 12:
        ckpt_bias = torch.stack(biases).numpy()
        assert last.pivot(index="layer", columns="expert", values="bias").to_numpy() == pytest.approx(ckpt_bias)
    assert (Path(rec["run_dir"]) / "fig_router.png").stat().st_size > 0


def _ddp_worker(rank: int, world: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(Transformer(config({"bias_update_rate": 0.01})))
        idx = torch.randint(0, 61, (4, 12), generator=torch.Generator().manual_seed(3))
        half = idx[2 * rank : 2 * rank + 2]
        for micro in (half[:1], half[1:]):  # two micro-batches per step: DDP broadcasts buffers before each
            model(micro, micro)[1].backward()
        model.module.update_moe_bias()
        if rank == 0:
            torch.save([m.expert_bias.clone() for m in model.module.moe] + [m.step_load for m in model.module.moe], out)
    finally:
        dist.destroy_process_group()


def test_bias_update_sums_the_load_over_ranks_on_gloo(tmp_path):
    """Two gloo ranks, each two micro-batches of its half of the batch: after update_moe_bias every MoE sublayer's
    bias is the one a single process computes from the whole batch (the load all-reduced, nothing lost to DDP's
    buffer broadcast between micro-batches)."""
    import torch.multiprocessing as mp

    out = tmp_path / "bias.pt"
    mp.start_processes(
        _ddp_worker, args=(2, str(tmp_path / "init"), str(out)), nprocs=2, join=True, start_method="spawn"
    )
    torch.manual_seed(0)
    single = Transformer(config({"bias_update_rate": 0.01}))
    idx = torch.randint(0, 61, (4, 12), generator=torch.Generator().manual_seed(3))
    for row in range(4):
        single(idx[row : row + 1], idx[row : row + 1])[1].backward()
    single.update_moe_bias()
    got = torch.load(out)
    n = len(single.moe)
    biases, step_loads = got[:n], got[n:]
    assert all(torch.count_nonzero(b) > 0 for b in biases)
    for a, b in zip(biases, (m.expert_bias for m in single.moe)):
        assert torch.equal(a, b)
    for a, m in zip(step_loads, single.moe):  # the router statistics of the step: the whole batch's load
        assert torch.equal(a, m.step_load)
        assert float(a.sum()) == 4 * 12 * m.options.top_k


def test_decoding_with_a_kv_cache_equals_the_full_forward():
    """Routing is per token, so prefill + one-token decode steps of an MoE Block AttnRes model give the logits of
    one forward over every token (eval mode: nothing is counted)."""
    torch.manual_seed(0)
    model = Transformer(config(residual="block", block_size=2)).double().eval()
    idx = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(3))
    full = model(idx)
    cache = model.new_cache()
    parts = [model(idx[:, :6], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(6, 10)]
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-10)
    assert all(torch.count_nonzero(m.load) == 0 for m in model.moe)


def test_regional_compilation_of_an_moe_model_matches_eager():
    """Transformer.compile_regions with MoE MLPs (fp32 on the CPU: the loop path, which breaks the graph at its
    one host sync; regional compilation is not fullgraph) gives eager's loss, gradients and load counts."""
    torch.manual_seed(0)
    eager = Transformer(config({"aux_loss_alpha": 0.01}, residual="block", block_size=2))
    compiled = copy.deepcopy(eager)
    compiled.compile_regions()
    idx = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(3))
    loss_e = eager(idx, idx)[1]
    loss_e.backward()
    loss_c = compiled(idx, idx)[1]
    loss_c.backward()
    assert torch.allclose(loss_c, loss_e, atol=1e-5)
    assert all(torch.equal(a.load, b.load) for a, b in zip(compiled.moe, eager.moe))
    grads_c = dict(compiled.named_parameters())
    for name, p in eager.named_parameters():
        assert torch.allclose(grads_c[name].grad, p.grad, atol=1e-5, rtol=1e-4), name
