"""optimizer=muon and scheduler=wsd (experiments/training/optim.py): the Muon step against a transcription of its
equations written here in float64 (Moonlight's recipe: Nesterov momentum, quintic Newton-Schulz, decoupled weight decay,
0.2 sqrt(max(A, B)) per logical matrix), torch.optim.Muon itself on a plain matrix, the AdamW part against torch's
AdamW, the parameter groups, the WSD formula at every step, and the harness paths: resume, compile, DDP, FSDP."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import TEST_MAX_BYTES, cli_overrides, compose, run_cli

from attnres import ModelConfig, Transformer
from attnres.config import MoEConfig
from experiments.config import config_schema
from experiments.train import train
from experiments.training.callbacks import read_metrics
from experiments.training.optim import (
    NS_DTYPES,
    WSD_SHAPES,
    Muon,
    matrix_layout,
    muon,
    newton_schulz,
    optimizer_groups,
    param_groups,
    wsd,
    wsd_lambda,
)

A, B, C = 3.4445, -4.7750, 2.0315  # Keller Jordan's quintic coefficients


def ns_reference(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Newton-Schulz orthogonalisation from its equations, float64: X = G / ||G||_F on the wide orientation, then
    ``steps`` times X <- a X + b (X X^T) X + c (X X^T)^2 X."""
    X = G.double()
    tall = X.shape[0] > X.shape[1]
    X = X.T if tall else X
    X = X / X.norm()
    for _ in range(steps):
        S = X @ X.T
        X = A * X + B * S @ X + C * S @ S @ X
    return X.T if tall else X


class ReferenceMuon:
    """Moonlight's update, float64, one logical matrix at a time: M = mu M + g; u = g + mu M (Nesterov);
    W <- W - lr wd W - lr 0.2 sqrt(max(A, B)) NS(u)."""

    def __init__(self, lr: float, wd: float, mu: float = 0.95) -> None:
        self.lr, self.wd, self.mu = lr, wd, mu
        self.momentum: dict[int, torch.Tensor] = {}

    def step(self, key: int, W: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        M = self.mu * self.momentum.get(key, torch.zeros_like(g)) + g
        self.momentum[key] = M
        u = g + self.mu * M
        scale = 0.2 * math.sqrt(max(W.shape))
        return W - self.lr * self.wd * W - self.lr * scale * ns_reference(u)


def test_newton_schulz_batched_is_torchs_bit_for_bit_in_bf16_and_the_equations_in_fp32():
    from torch.optim._muon import _zeropower_via_newtonschulz

    torch.manual_seed(0)
    for shape in ((6, 32, 32), (4, 80, 32), (3, 32, 80)):
        G = torch.randn(*shape)
        got = newton_schulz(G, (A, B, C), 5, 1e-7, torch.bfloat16)
        for g, o in zip(G, got):
            assert torch.equal(o, _zeropower_via_newtonschulz(g, (A, B, C), 5, 1e-7))
        got32 = newton_schulz(G, (A, B, C), 5, 1e-7, torch.float32)
        for g, o in zip(G, got32):
            assert torch.allclose(o.double(), ns_reference(g), atol=2e-5)


def test_muon_on_a_plain_matrix_is_torch_optim_muon_exactly():
    torch.manual_seed(1)
    w = torch.nn.Parameter(torch.randn(48, 32))
    w_torch = torch.nn.Parameter(w.detach().clone())
    ours = Muon([w], lr=0.02, weight_decay=0.1, ns_dtype="bfloat16")
    theirs = torch.optim.Muon([w_torch], lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for _ in range(5):
        g = torch.randn(48, 32)
        w.grad, w_torch.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    assert torch.equal(w, w_torch)


def _tiny(ffn: str = "dense", residual: str = "block") -> Transformer:
    moe = MoEConfig(n_experts=4, top_k=2, n_shared=1, shared_d_ff=8) if ffn == "moe" else None
    cfg = ModelConfig(
        vocab_size=64,
        n_layers=2,
        d_model=16,
        n_heads=2,
        d_ff=24,
        max_seq_len=16,
        residual=residual,
        n_blocks=2,
        ffn=ffn,
        moe=moe,
    )
    torch.manual_seed(0)
    return Transformer(cfg)


def _logical(name: str, W: torch.Tensor) -> list[torch.Tensor]:
    """The matrices a weight holds, written out per kind (not through experiments.training.optim's layout table)."""
    if name.endswith("attn.qkv.weight"):
        return list(W.chunk(3, dim=0))  # [q; k; v] rows (attnres.model.Attention's view(B, T, 3, H, hd))
    if name.endswith("gate_up.weight"):
        return list(W.chunk(2, dim=0))  # [gate; up] rows
    if name.endswith("experts_gate_up"):
        return [m for e in W for m in e.chunk(2, dim=1)]  # per expert [D, gate | up]
    if name.endswith("experts_down"):
        return list(W)
    return [W]


@pytest.mark.parametrize("ffn", ["dense", "moe"])
def test_muon_step_equals_the_transcription_over_several_steps(ffn):
    model = _tiny(ffn)
    opt = muon(model, lr=0.01, weight_decay=0.1, ns_dtype="float32")
    (mg,) = opt.muon.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    tracked = [(names[id(p)], p) for p in mg["params"]]
    ref = ReferenceMuon(lr=0.01, wd=0.1)
    expected = {n: [m.detach().double().clone() for m in _logical(n, p)] for n, p in tracked}
    x = torch.randint(0, 64, (3, 16))
    for _ in range(4):
        opt.zero_grad()
        _, loss = model(x, x)
        loss.backward()
        for n, p in tracked:
            grads = _logical(n, p.grad.detach().double())
            expected[n] = [ref.step(hash((n, i)), W, g) for i, (W, g) in enumerate(zip(expected[n], grads))]
        opt.step()
        for n, p in tracked:
            for W_ref, W in zip(expected[n], _logical(n, p.detach().double())):
                assert torch.allclose(W, W_ref, atol=1e-5, rtol=1e-4), n


def test_the_rest_follows_torchs_adamw_exactly():
    model = _tiny("moe")
    twin = _tiny("moe")
    opt = muon(model, lr=0.01, weight_decay=0.1)
    _, rest = optimizer_groups(twin, 0.1)
    reference = torch.optim.AdamW(rest, lr=0.01, betas=(0.9, 0.95), eps=1e-8)
    x = torch.randint(0, 64, (3, 16))
    for _ in range(3):
        for m, o in ((model, opt), (twin, reference)):
            o.zero_grad()
            _, loss = m(x, x)
            loss.backward()
        # the twin's Muon parameters are not stepped by AdamW; give them the trained values so both forwards agree
        opt.step()
        reference.step()
        with torch.no_grad():
            for (n, p), (_, q) in zip(model.named_parameters(), twin.named_parameters()):
                if matrix_layout(n) is not None:
                    q.copy_(p)
    for (n, p), (_, q) in zip(model.named_parameters(), twin.named_parameters()):
        assert torch.equal(p, q), n


def test_one_function_decides_the_groups():
    model = _tiny("moe")
    (mg,), rest = optimizer_groups(model, 0.1, connection_weight_decay=0.0)
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = {names[id(p)] for p in mg["params"]}
    in_adamw = {names[id(p)]: g["name"] for g in rest for p in g["params"]}
    assert not in_muon & set(in_adamw)
    assert in_muon | set(in_adamw) == set(names.values())  # every parameter exactly once
    assert {n.split(".", 2)[2] for n in in_muon} == {
        "attn.qkv.weight",
        "attn.out.weight",
        "mlp.experts_gate_up",
        "mlp.experts_down",
        "mlp.shared_gate_up.weight",
        "mlp.shared_down.weight",
    }
    assert in_adamw["tok_emb.weight"] == "no_decay"
    assert in_adamw["lm_head.weight"] == "decay"
    assert in_adamw["blocks.0.mlp.router.weight"] == "decay"  # the router is a matrix, but AdamW's
    assert {in_adamw[n] for n in in_adamw if n.startswith("residual.")} == {"connection"}
    opt = muon(model, lr=1e-3)
    assert sum(opt.group_sizes.values()) == sum(p.numel() for p in model.parameters())
    assert opt.group_sizes["muon/muon"] == sum(p.numel() for p in mg["params"])
    # the dense model's split: q, k, v and gate, up each their own matrix
    dense = _tiny("dense", residual="baseline")
    assert matrix_layout("blocks.0.attn.qkv.weight") == (3, 0)
    assert matrix_layout("blocks.0.mlp.gate_up.weight") == (
        2,
        0,
    )
    assert param_groups(dense, 0.1)[0]["name"] == "decay"


def test_schema_constants_agree_with_the_optimizer():
    assert config_schema.NS_DTYPES == NS_DTYPES
    assert config_schema.WSD_SHAPES == WSD_SHAPES


@pytest.mark.parametrize("shape", WSD_SHAPES)
@pytest.mark.parametrize(
    ("total", "warmup_fraction", "decay_fraction"), [(100, 0.05, 0.2), (37, 0.1, 0.5), (10, 0.1, 0.0)]
)
def test_wsd_lr_at_every_step_is_the_formula(shape, total, warmup_fraction, decay_fraction):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.5)
    sched = wsd(
        opt, total, warmup_fraction=warmup_fraction, decay_fraction=decay_fraction, min_lr_ratio=0.1, shape=shape
    )
    warm, decay = max(1, round(warmup_fraction * total)), round(decay_fraction * total)
    for s in range(total):
        if s < warm:
            f = (s + 1) / warm
        elif s < total - decay:
            f = 1.0
        else:
            q = (s - (total - decay) + 1) / decay
            f = 1 - 0.9 * q if shape == "linear" else 0.1 + 0.9 * (1 - math.sqrt(q))
        assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * f, abs=1e-12), s
        opt.step()
        sched.step()
    if decay:
        assert opt.param_groups[0]["lr"] == pytest.approx(0.05)  # ends at min_lr_ratio


def test_wsd_constant_phase_does_not_depend_on_the_run_length():
    short, long = wsd_lambda(100, 5, 20, 0.1), wsd_lambda(400, 5, 80, 0.1)
    assert [short(s) for s in range(80)] == [long(s) for s in range(80)]


def test_wsd_overlapping_warmup_and_decay_is_refused():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="overlap"):
        wsd(opt, 10, warmup_fraction=0.5, decay_fraction=0.6)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("optimizer.ns_dtype=float16", "optimizer.ns_dtype"),
        ("optimizer.adjust_lr_fn=rms", "optimizer.adjust_lr_fn"),
        ("optimizer.momentum=1.0", "optimizer.momentum"),
        ("scheduler.shape=cosine", "scheduler.shape"),
        ("scheduler.decay_fraction=1.5", "scheduler.decay_fraction"),
    ],
)
def test_bad_muon_and_wsd_settings_fail_in_one_line(override, match):
    from experiments.config.validation import check_config

    with pytest.raises(ValueError, match=match):
        check_config(compose(["experiment=smoke", "optimizer=muon", "scheduler=wsd", override]))


def test_fsdp_with_muon_fails_before_training_in_one_line(tmp_path, data_cache):
    res = run_cli(
        [
            *cli_overrides(tmp_path, data_cache),
            f"paths.runs_root={tmp_path / 'r'}",
            "optimizer=muon",
            "trainer=fsdp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "trainer.precision=32-true",
        ]
    )
    assert res.returncode != 0
    assert "optimizer=muon cannot train under FSDP" in res.stderr
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").rglob("*.json"))  # nothing written


MUON = ["optimizer=muon", "scheduler=wsd", "model=block_attnres", "size.lr=1e-2"]


def _losses(run_dir: Path) -> list[float]:
    return [r["train_loss"] for r in read_metrics(run_dir / "metrics.csv")]


@pytest.mark.slow
def test_a_resumed_muon_wsd_run_equals_an_uninterrupted_one_bit_for_bit(tmp_path, data_cache):
    common = [*cli_overrides(tmp_path, data_cache), *MUON]
    killed = run_cli([*common, f"paths.runs_root={tmp_path / 'a'}", "fault.kill_at_step=8"])
    assert killed.returncode == -9, killed.stderr[-2000:]  # last checkpoint: step 5, in the constant phase
    resumed = run_cli([*common, f"paths.runs_root={tmp_path / 'a'}"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from" in resumed.stdout
    reference = train(compose([*common, f"paths.runs_root={tmp_path / 'b'}"]))
    (run_dir,) = (tmp_path / "a" / "smoke").glob("block_attnres_*")
    assert _losses(run_dir) == _losses(Path(reference["run_dir"]))
    rec = json.loads((run_dir / "results.json").read_text())
    assert rec["val_loss"] == reference["val_loss"]
    assert (rec["optimizer"], rec["lr_schedule"]) == ("muon", "wsd")
    groups = json.loads((run_dir / "optimizer_groups.json").read_text())
    assert set(groups) == {"muon/muon", "adamw/decay", "adamw/no_decay", "adamw/connection"}
    assert rec["step_cpu_s"]
    assert rec["step_cpu_s"] > 0


@pytest.mark.slow
def test_compiled_muon_equals_eager_within_rounding(train_cfg):
    small = [
        "size.n_layers=2",
        "size.seq_len=32",
        "size.batch_size=8",
        "size.tokens=10240",
        "model.n_blocks=2",
        "train.log_every=1",
        "train.eval_count=2",
        "train.val_sequences=16",
    ]
    eager = train(train_cfg(*MUON, *small, "train_path=eager"))
    compiled = train(train_cfg(*MUON, *small, "train_path=compiled"))
    a, b = _losses(Path(eager["run_dir"])), _losses(Path(compiled["run_dir"]))
    assert len(a) == len(b) == 40
    assert max(abs(x - y) for x, y in zip(a, b)) <= 1e-4
    assert a[-1] < a[0] - 0.5


@pytest.mark.slow
def test_two_process_ddp_with_muon_matches_single_process(tmp_path, data_cache):
    common = [
        "experiment=smoke",
        *MUON,
        f"data.cache_dir={data_cache}",
        f"data.max_bytes={TEST_MAX_BYTES}",
        "threads=1",
        "trainer.enable_progress_bar=false",
        "size.tokens=32768",
        "size.batch_size=16",
        "train.eval_count=4",
        "train.val_sequences=16",
        "train.log_every=4",
        f"paths.hydra_root={tmp_path / 'outputs'}",
    ]
    single = run_cli([*common, f"paths.runs_root={tmp_path / 'single'}"], timeout=240)
    assert single.returncode == 0, single.stderr[-3000:]
    ddp = run_cli(
        [
            *common,
            f"paths.runs_root={tmp_path / 'ddp'}",
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "trainer.precision=32-true",
        ],
        timeout=240,
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "MEMBER: 2/2" in ddp.stdout + ddp.stderr

    def val(root: Path) -> list[float]:
        (run_dir,) = (root / "smoke").glob("block_attnres_*")
        return [r["val_loss"] for r in read_metrics(run_dir / "metrics.csv") if r.get("val_loss") is not None]

    ref, got = val(tmp_path / "single"), val(tmp_path / "ddp")
    assert len(ref) == len(got) == 4
    assert got == pytest.approx(ref, abs=1e-4)
    assert ref[-1] < ref[0] - 0.05
