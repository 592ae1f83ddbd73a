"""``optimizer.connection_lr_scale``: the residual scheme's own parameters (everything under ``residual.``) train at
the optimizer's lr times the scale, under AdamW and under Muon's AdamW part, and every other parameter at the lr; the
default (1.0) leaves every committed run's config_hash where it was."""

from __future__ import annotations

import pytest
import torch
from conftest import compose

from attnres import ModelConfig, Transformer
from experiments.run.identity import experiment_config, resolved_container, run_identity
from experiments.training.optim import adamw, muon, optimizer_groups, wsd

LR = 0.01


def _model(residual: str = "block") -> Transformer:
    cfg = ModelConfig(
        vocab_size=64, n_layers=2, d_model=16, n_heads=2, d_ff=24, max_seq_len=16, residual=residual, n_blocks=2
    )
    torch.manual_seed(0)
    model = Transformer(cfg)
    with torch.no_grad():  # move the zero-initialised queries away from zero, so their updates are not special
        for name, p in model.named_parameters():
            if name.startswith("residual."):
                p.add_(0.1 * torch.randn_like(p))
    return model


def _lrs(opt: torch.optim.Optimizer, model: torch.nn.Module) -> dict[str, float]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: g["lr"] for g in opt.param_groups for p in g["params"]}


@pytest.mark.parametrize("factory", [adamw, muon], ids=["adamw", "muon"])
@pytest.mark.parametrize("scale", [0.0, 0.3, 3.0])
def test_the_scale_sets_the_lr_of_exactly_the_residual_parameters_through_the_schedule(factory, scale):
    model = _model()
    opt = factory(model, lr=LR, connection_lr_scale=scale)
    sched = wsd(opt, total_steps=20, warmup_fraction=0.1, decay_fraction=0.5)
    x = torch.randint(0, 64, (2, 16))
    for step in range(20):
        factor = sched.lr_lambdas[0](step)
        lrs = _lrs(opt, model)
        assert set(lrs) == {n for n, _ in model.named_parameters()}
        for name, lr in lrs.items():
            expected = LR * factor * (scale if name.startswith("residual.") else 1.0)
            assert lr == pytest.approx(expected, rel=1e-12, abs=1e-15), (step, name)
        opt.zero_grad()
        model(x, x)[1].backward()
        opt.step()
        sched.step()


def test_adamw_with_a_scale_is_torchs_adamw_with_the_residual_group_at_the_scaled_lr():
    model, twin = _model(), _model()
    opt = adamw(model, lr=LR, weight_decay=0.1, connection_lr_scale=0.3)
    named = [(n, p) for n, p in twin.named_parameters() if p is not twin.tok_emb.weight]
    groups = [
        {"params": [p for n, p in named if n.startswith("residual.")], "lr": 0.3 * LR, "weight_decay": 0.0},
        {"params": [p for n, p in named if not n.startswith("residual.") and p.dim() < 2], "weight_decay": 0.0},
        {"params": [twin.tok_emb.weight], "weight_decay": 0.0},
        {"params": [p for n, p in named if not n.startswith("residual.") and p.dim() >= 2], "weight_decay": 0.1},
    ]
    reference = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95), eps=1e-8)
    x = torch.randint(0, 64, (2, 16))
    for _ in range(4):
        for m, o in ((model, opt), (twin, reference)):
            o.zero_grad()
            m(x, x)[1].backward()
            o.step()
    for (n, p), (_, q) in zip(model.named_parameters(), twin.named_parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-7), n


def test_scale_zero_freezes_the_residual_parameters_and_one_is_the_unscaled_optimizer():
    model = _model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = muon(model, lr=LR, connection_lr_scale=0.0)
    x = torch.randint(0, 64, (2, 16))
    for _ in range(3):
        opt.zero_grad()
        model(x, x)[1].backward()
        opt.step()
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) == n.startswith("residual."), n
    # scale 1: the groups carry no lr of their own, exactly as without the setting
    _, rest = optimizer_groups(_model(), 0.1)
    assert all("lr" not in g for g in rest)
    a, b = _model(), _model()
    oa, ob = muon(a, lr=LR), muon(b, lr=LR, connection_lr_scale=1.0)
    for m, o in ((a, oa), (b, ob)):
        o.zero_grad()
        m(x, x)[1].backward()
        o.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("bad", [-0.1, 101.0, True])
def test_a_bad_scale_fails_in_one_line_naming_the_key(bad):
    with pytest.raises(ValueError, match=r"optimizer\.connection_lr_scale"):
        adamw(_model(), lr=LR, connection_lr_scale=bad)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("bad", ["-1", "101", "abc"])
def test_a_bad_scale_in_the_config_fails_naming_the_key(optimizer, bad):
    from experiments.config.validation import check_config

    with pytest.raises(Exception, match=r"connection_lr_scale"):
        check_config(compose(["experiment=smoke", f"optimizer={optimizer}", f"optimizer.connection_lr_scale={bad}"]))


DEEP_MUON = ("+sweep=cpu_deep", "optimizer=muon", "scheduler=wsd", "tuned_lr=cpu_deep_muon_wsd", "size.n_layers=8")


@pytest.mark.parametrize(
    ("overrides", "recorded"),
    [  # docs/results/cpu_deep_recipe/records (Muon + WSD) and docs/results/cpu_deep/records (AdamW + cosine)
        ((*DEEP_MUON, "model=block_attnres", "seed=0"), "15b9d08572fbcb5c"),
        ((*DEEP_MUON, "model=baseline", "seed=0"), "89e54e3d65826341"),
        (("+sweep=cpu_deep", "size.n_layers=8", "model=block_attnres", "seed=0"), "015d2b4971444d04"),
    ],
)
def test_the_default_scale_keeps_committed_hashes_and_another_scale_is_another_run(overrides, recorded):
    assert run_identity(compose(list(overrides)))[0] == recorded
    assert run_identity(compose([*overrides, "optimizer.connection_lr_scale=1.0"]))[0] == recorded
    assert run_identity(compose([*overrides, "optimizer.connection_lr_scale=1"]))[0] == recorded
    scaled = compose([*overrides, "optimizer.connection_lr_scale=0.3"])
    assert run_identity(scaled)[0] != recorded
    assert experiment_config(resolved_container(scaled))["optimizer"]["connection_lr_scale"] == 0.3
