"""Optimizer and learning-rate schedule factories (targets of conf/optimizer/*.yaml, conf/scheduler/*.yaml).

Both are instantiated with ``_partial_: true`` and completed inside ``LMModule.configure_optimizers``.
Pure torch (no Lightning).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn


def param_groups(
    model: nn.Module,
    weight_decay: float,
    connection_weight_decay: float = 0.0,
    exclude: frozenset[int] = frozenset(),
    connection_lr: float | None = None,
) -> list[dict[str, Any]]:
    """Split parameters (but those whose ``id`` is in ``exclude``) into weight-decay groups.

    * ``decay`` (weight_decay): matrices of the sublayers and the LM head;
    * ``no_decay`` (0): every parameter with dim < 2 (RMSNorm gains) and the token embedding;
    * ``connection`` (connection_weight_decay, default 0): everything under ``residual.`` — the residual
      scheme's own parameters (AttnRes pseudo-queries and key-norm gains, DenseFormer/HC weights), whatever
      their shape. Zero-initialised queries decayed towards zero would fight the very thing being tested, so
      the default is no decay; the value is a recorded setting. With ``connection_lr`` given, this group
      carries its own ``lr`` (the optimizer's lr for the others); a schedule scales it by the same factor.
    Empty groups are dropped. Each group carries a ``name`` for logging.
    """
    groups: dict[str, list[nn.Parameter]] = {"decay": [], "no_decay": [], "connection": []}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen or id(p) in exclude:  # tied weights appear once
            continue
        seen.add(id(p))
        if name.startswith("residual.") or ".residual." in name:
            groups["connection"].append(p)
        elif p.dim() < 2 or name.endswith("tok_emb.weight"):
            groups["no_decay"].append(p)
        else:
            groups["decay"].append(p)
    wd = {"decay": weight_decay, "no_decay": 0.0, "connection": connection_weight_decay}
    out = [{"params": ps, "weight_decay": wd[g], "name": g} for g, ps in groups.items() if ps]
    for group in out:
        if group["name"] == "connection" and connection_lr is not None:
            group["lr"] = connection_lr
    return out


def connection_lr(lr: float, connection_lr_scale: float) -> float | None:
    """The residual scheme's own lr, ``lr * connection_lr_scale``; None at scale 1 (the group then takes the
    optimizer's lr, as before the setting existed). A ValueError naming the key for a scale outside [0, 100]:
    scale 0 freezes those parameters at their initial values (AttnRes: zero queries, uniform depth weights)."""
    ok = isinstance(connection_lr_scale, (int, float)) and not isinstance(connection_lr_scale, bool)
    if not ok or not 0.0 <= connection_lr_scale <= 100.0:
        raise ValueError(f"optimizer.connection_lr_scale={connection_lr_scale!r} must be a number in [0, 100]")
    return None if connection_lr_scale == 1.0 else lr * connection_lr_scale


def amp_clipping(precision: Any, gradient_clip_val: Any) -> bool:
    """True when Lightning's mixed-precision plugin (precision '*-mixed') will clip gradients: then a fused
    optimizer is refused (see :func:`adamw`)."""
    return str(precision).endswith("-mixed") and bool(gradient_clip_val)


def adamw(
    model: nn.Module,
    lr: float,
    betas: Sequence[float] = (0.9, 0.95),
    eps: float = 1e-8,
    weight_decay: float = 0.1,
    connection_weight_decay: float = 0.0,
    fused: bool | None = None,
    amp_clipping: bool = False,
    connection_lr_scale: float = 1.0,
) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`.

    ``fused=None`` picks the fused CUDA kernel on a GPU, except with ``amp_clipping`` (Lightning's mixed-precision
    plugin, ``trainer.precision=*-mixed``, with gradient clipping), which refuses to clip the gradients of an
    optimizer that unscales them itself (a fused one); torch's multi-tensor (foreach) kernel is used then.
    ``connection_lr_scale``: the residual scheme's own parameters train at ``lr`` times it (:func:`connection_lr`).
    """
    return torch.optim.AdamW(
        param_groups(
            model, weight_decay, connection_weight_decay, connection_lr=connection_lr(lr, connection_lr_scale)
        ),
        lr=lr,
        betas=tuple(betas),
        eps=eps,
        fused=resolve_fused(model, fused, amp_clipping) or None,
    )


def resolve_fused(model: nn.Module, fused: bool | None, amp_clipping: bool) -> bool:
    """Whether AdamW runs its fused kernel: ``fused``, or when None on a GPU unless ``amp_clipping`` (see
    :func:`adamw`); a ValueError naming the keys when fused is asked for together with amp clipping."""
    if fused is None:
        return next(model.parameters()).is_cuda and not amp_clipping
    if fused and amp_clipping:
        raise ValueError(
            "optimizer.fused=true cannot be combined with mixed precision (trainer.precision=*-mixed) and "
            "gradient clipping (trainer.gradient_clip_val > 0): Lightning cannot clip a fused optimizer's "
            "gradients. Allowed: optimizer.fused=null (auto) or false, or trainer.gradient_clip_val=0"
        )
    return bool(fused)


def warmup_cosine_lambda(total_steps: int, warmup_steps: int, min_lr_ratio: float):
    """lr multiplier at optimizer step s (0-based): linear warm-up from 1/warmup to 1 over `warmup_steps`,
    then cosine from 1 to `min_lr_ratio` at s = total_steps - 1 (held there afterwards)."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        decay_steps = max(total_steps - 1 - warmup_steps, 1)
        progress = min((step - warmup_steps) / decay_steps, 1.0)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def warmup_cosine(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    warmup_fraction: float = 0.05,
    min_lr_ratio: float = 0.1,
    warmup_steps: int | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then cosine decay to ``min_lr_ratio`` x peak at the last step (stepped every optimizer step).

    The warm-up length is ``warmup_steps`` when given, else ``round(warmup_fraction * total_steps)`` (>= 1).
    """
    if warmup_steps is None:
        warmup_steps = max(1, round(warmup_fraction * total_steps))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine_lambda(total_steps, warmup_steps, min_lr_ratio))


# ---------------------------------------------------------------------------------------------------------
# Muon (Moonlight's recipe) for the sublayers' weight matrices, AdamW for everything else

# Fused weights hold several logical matrices, each orthogonalised on its own (Moonlight: one Muon update per
# matrix): the attention's qkv projection is [q; k; v] along its output rows (attnres.model.Attention), the SwiGLU
# gate_up is [gate; up] (attnres.model.MLP, the MoE's shared experts), and an MoE's routed experts are one matrix
# per expert, [E, D, 2 F] with [gate | up] along the last dim and [E, F, D] (attnres.moe.MoEFeedForward).
# name suffix -> (parts along the output dim, output dim)
MATRIX_LAYOUTS: dict[str, tuple[int, int]] = {
    "attn.qkv.weight": (3, 0),
    "attn.out.weight": (1, 0),
    "mlp.gate_up.weight": (2, 0),
    "mlp.down.weight": (1, 0),
    "mlp.shared_gate_up.weight": (2, 0),
    "mlp.shared_down.weight": (1, 0),
    "mlp.experts_gate_up": (2, -1),
    "mlp.experts_down": (1, -1),
}


def matrix_layout(name: str) -> tuple[int, int] | None:
    """(parts, output dim) of the logical matrices a sublayer weight holds, None for a parameter Muon does not
    take (see :data:`MATRIX_LAYOUTS`)."""
    if not name.startswith("blocks."):
        return None
    for suffix, layout in MATRIX_LAYOUTS.items():
        if name.endswith("." + suffix):
            return layout
    return None


def optimizer_groups(
    model: nn.Module, weight_decay: float, connection_weight_decay: float = 0.0, connection_lr: float | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The one place that decides which optimizer trains which parameter under ``optimizer=muon``.

    Muon: the weight matrices of the attention and MLP sublayers (:data:`MATRIX_LAYOUTS`: q, k, v and the output
    projection; gate, up and down, an MoE's routed experts one matrix per expert and its shared experts), each
    group entry carrying its ``layouts``. AdamW, in :func:`param_groups`' groups: everything else, i.e. the token
    embedding, the LM head, every RMSNorm gain, the MoE router, and every parameter of the residual scheme
    (AttnRes pseudo-queries and key norms, the peers' mixing weights), the last at ``connection_lr`` when given.
    Returns (muon groups, adamw groups); empty groups are dropped (why each kind goes where: docs/optimizers.md)."""
    matrices, layouts = [], []
    for name, p in model.named_parameters():
        layout = matrix_layout(name)
        if p.requires_grad and layout is not None and not name.startswith("residual."):
            matrices.append(p)
            layouts.append(layout)
    exclude = frozenset(id(p) for p in matrices)
    rest = param_groups(model, weight_decay, connection_weight_decay, exclude, connection_lr)
    muon_groups = [{"params": matrices, "layouts": layouts, "weight_decay": weight_decay, "name": "muon"}]
    return [g for g in muon_groups if g["params"]], rest


def _matrices(t: torch.Tensor, layout: tuple[int, int]) -> list[torch.Tensor]:
    """The logical matrices of a weight (views): a 3-D parameter is one stack entry per expert; each 2-D matrix is
    cut into ``parts`` equal pieces along its output dim."""
    parts, dim = layout
    stack = list(t.unbind(0)) if t.dim() == 3 else [t]
    return [piece for m in stack for piece in m.chunk(parts, dim=dim)]


NS_DTYPES = (None, "bfloat16", "float32")  # Muon's ns_dtype: None = bf16 on CUDA, fp32 elsewhere


def newton_schulz(
    G: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float, dtype: torch.dtype
):
    """Orthogonalise a stack of same-shape matrices G [n, A, B] at once: torch.optim.Muon's quintic Newton-Schulz
    iteration (``torch.optim._muon._zeropower_via_newtonschulz``, the reference: X = G / ||G||_F, then k times
    X <- a X + (b S + c S^2) X with S = X X^T, on the wide orientation) as batched matmuls in ``dtype``. In bf16
    it equals the reference matrix by matrix bit for bit (tests/test_muon.py); one batched call replaces ~25 small
    ops per matrix, which dominate the step of a small model."""
    a, b, c = coefficients
    tall = G.size(-2) > G.size(-1)
    X = G.to(dtype)
    if tall:
        X = X.transpose(-2, -1)
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        S = X @ X.transpose(-2, -1)
        X = torch.baddbmm(X, torch.baddbmm(S, S, S, beta=b, alpha=c), X, beta=a)
    return X.transpose(-2, -1) if tall else X


class Muon(torch.optim.Optimizer):
    """torch.optim.Muon's update applied to each logical matrix of a parameter (:data:`MATRIX_LAYOUTS`): momentum
    ``B = mu B + (1 - mu) g`` (torch's EMA form: the orthogonalisation makes the update scale-free), the Nesterov
    look-ahead ``g + mu (B - g)``, Newton-Schulz orthogonalisation ``O`` of it (:func:`newton_schulz`, 5 steps,
    Keller Jordan's coefficients), decoupled weight decay ``W -= lr wd W``, then ``W -= lr * adjust(A, B) * O`` per
    matrix of shape A x B (``adjust_lr_fn="match_rms_adamw"``: 0.2 sqrt(max(A, B)), Moonlight's scale, so AdamW's lr
    and weight decay carry over).

    With ``ns_dtype=bfloat16`` this is torch.optim.Muon's step on a plain 2-D weight, bit for bit (tests/
    test_muon.py). What it adds: the split of fused weights and stacked experts into their matrices (torch's class
    takes one 2-D matrix per tensor), and the orthogonalisation of all same-shape matrices in one batched call.
    ``ns_dtype=None`` runs it in bf16 on CUDA (as torch) and fp32 elsewhere: bf16 matmuls are ~20x slower than
    fp32 on a CPU without bf16 units, and fp32 is the same iteration without bf16's rounding (docs/optimizers.md).
    """

    def __init__(
        self,
        params: Any,
        lr: float,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        eps: float = 1e-7,
        adjust_lr_fn: str | None = "match_rms_adamw",
        ns_dtype: str | None = None,
    ) -> None:
        from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C

        if adjust_lr_fn not in (None, "original", "match_rms_adamw"):
            raise ValueError(f"optimizer.adjust_lr_fn={adjust_lr_fn!r}; allowed values: original, match_rms_adamw")
        if ns_dtype not in NS_DTYPES:
            raise ValueError(f"optimizer.ns_dtype={ns_dtype!r}; allowed values: null, {', '.join(NS_DTYPES[1:])}")
        defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_steps": ns_steps,
            "eps": eps,
            "adjust_lr_fn": adjust_lr_fn,
            "ns_coefficients": (DEFAULT_A, DEFAULT_B, DEFAULT_C),
            "ns_dtype": ns_dtype,
            "layouts": None,
        }
        super().__init__(params, defaults)
        for group in self.param_groups:
            if group["layouts"] is None:
                group["layouts"] = [(1, 0)] * len(group["params"])
            for p in group["params"]:
                if p.dim() not in (2, 3):
                    raise ValueError(f"Muon takes 2-D matrices and 3-D stacks of them, not a {p.dim()}-D parameter")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        from torch.optim._muon import _adjust_lr

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd, mu = float(group["lr"]), group["weight_decay"], group["momentum"]
            by_shape: dict[tuple[Any, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
            for p, layout in zip(group["params"], group["layouts"]):
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mu)
                update = p.grad.lerp(buf, mu) if group["nesterov"] else buf
                p.mul_(1 - lr * wd)
                for w, u in zip(_matrices(p, layout), _matrices(update, layout)):
                    by_shape.setdefault((tuple(u.shape), u.device), []).append((w, u))
            for pairs in by_shape.values():
                name = group["ns_dtype"] or ("bfloat16" if pairs[0][1].is_cuda else "float32")
                dtype = getattr(torch, name)
                ortho = newton_schulz(
                    torch.stack([u for _, u in pairs]), group["ns_coefficients"], group["ns_steps"], group["eps"], dtype
                )
                for (w, _), o in zip(pairs, ortho):
                    w.add_(o.to(w.dtype), alpha=-_adjust_lr(lr, group["adjust_lr_fn"], w.shape))
        return loss


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimizer for Lightning made of two: :class:`Muon` over the sublayer matrices and torch's AdamW over the
    rest (:func:`optimizer_groups`). Its ``param_groups`` are the two optimizers' own group dicts (Muon's first),
    so a scheduler or Lightning's clipping sees every parameter and sets every group's lr; ``step`` runs both;
    the state dict holds both states. ``group_sizes`` says how many parameters each optimizer trains."""

    def __init__(self, muon: Muon, adamw: torch.optim.AdamW) -> None:
        self.muon, self.adamw = muon, adamw
        super().__init__([*muon.param_groups, *adamw.param_groups], {})
        self.group_sizes = {
            f"{kind}/{g.get('name', i)}": sum(p.numel() for p in g["params"])
            for kind, opt in (("muon", muon), ("adamw", adamw))
            for i, g in enumerate(opt.param_groups)
        }

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if set(state_dict) != {"muon", "adamw"}:
            raise ValueError(
                f"optimizer state has keys {sorted(state_dict)}, not a MuonWithAdamW state (muon, adamw): "
                "was this checkpoint written with another optimizer?"
            )
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        self.param_groups = [*self.muon.param_groups, *self.adamw.param_groups]  # loading made new group dicts


def muon(
    model: nn.Module,
    lr: float,
    momentum: float = 0.95,
    nesterov: bool = True,
    ns_steps: int = 5,
    adjust_lr_fn: str = "match_rms_adamw",
    ns_dtype: str | None = None,
    weight_decay: float = 0.1,
    connection_weight_decay: float = 0.0,
    betas: Sequence[float] = (0.9, 0.95),
    eps: float = 1e-8,
    fused: bool | None = None,
    amp_clipping: bool = False,
    connection_lr_scale: float = 1.0,
) -> MuonWithAdamW:
    """Muon over the sublayer matrices and AdamW over the rest (:func:`optimizer_groups`), at one lr and weight
    decay (``match_rms_adamw`` makes Muon's update RMS match AdamW's, so both carry over). ``betas``, ``eps``,
    ``fused`` and ``connection_weight_decay`` are the AdamW part's, as in :func:`adamw`. ``ns_dtype``: the
    orthogonalisation's precision, ``bfloat16``, ``float32`` or None (bf16 on CUDA, fp32 elsewhere: :class:`Muon`).
    ``connection_lr_scale``: the residual scheme's own parameters (in the AdamW part) train at ``lr`` times it."""

    muon_groups, adamw_groups = optimizer_groups(
        model, weight_decay, connection_weight_decay, connection_lr(lr, connection_lr_scale)
    )
    fused = resolve_fused(model, fused, amp_clipping)
    return MuonWithAdamW(
        Muon(
            muon_groups,
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            adjust_lr_fn=adjust_lr_fn,
            ns_dtype=ns_dtype,
        ),
        torch.optim.AdamW(adamw_groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused or None),
    )


# ---------------------------------------------------------------------------------------------------------
# Warm-up, stable, decay (WSD)

WSD_SHAPES = ("linear", "1-sqrt")


def wsd_lambda(total_steps: int, warmup_steps: int, decay_steps: int, min_lr_ratio: float, shape: str = "1-sqrt"):
    """lr multiplier at optimizer step s (0-based): linear warm-up from 1/warmup to 1 over ``warmup_steps``; 1 until
    the decay starts at s0 = total_steps - decay_steps; then with p = (s - s0 + 1) / decay_steps (1 at the last
    step, held afterwards) ``1 - (1 - r) p`` (linear) or ``r + (1 - r)(1 - sqrt(p))`` (1-sqrt, Hägele et al. 2024),
    r = ``min_lr_ratio``. The constant phase does not depend on ``total_steps``: only where the decay starts does."""
    if shape not in WSD_SHAPES:
        raise ValueError(f"scheduler.shape={shape!r}; allowed values: {', '.join(WSD_SHAPES)}")
    start = total_steps - decay_steps

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if step < start or decay_steps <= 0:
            return 1.0
        p = min((step - start + 1) / decay_steps, 1.0)
        if shape == "linear":
            return 1.0 - (1.0 - min_lr_ratio) * p
        return min_lr_ratio + (1.0 - min_lr_ratio) * (1.0 - math.sqrt(p))

    return factor


def wsd(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    warmup_fraction: float = 0.05,
    decay_fraction: float = 0.2,
    min_lr_ratio: float = 0.1,
    shape: str = "1-sqrt",
    warmup_steps: int | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """Warm-up, stable, decay: :func:`wsd_lambda` with ``round(decay_fraction * total_steps)`` decay steps and the
    warm-up of :func:`warmup_cosine` (``warmup_steps`` when given, else ``round(warmup_fraction * total_steps)``,
    >= 1). The warm-up and the decay may not overlap."""
    if warmup_steps is None:
        warmup_steps = max(1, round(warmup_fraction * total_steps))
    decay_steps = round(decay_fraction * total_steps)
    if warmup_steps + decay_steps > total_steps:
        raise ValueError(
            f"scheduler: warm-up ({warmup_steps} steps) and decay ({decay_steps} steps) overlap in a "
            f"{total_steps}-step run; lower scheduler.warmup_fraction / warmup_steps or scheduler.decay_fraction"
        )
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, wsd_lambda(total_steps, warmup_steps, decay_steps, min_lr_ratio, shape)
    )
