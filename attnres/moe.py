"""The mixture-of-experts MLP sublayer (``ModelConfig.ffn="moe"``), in the DeepSeek-V3 / Moonlight / Kimi Linear
design the paper's scaling models use (docs/moe.md). Pure torch.

For one token with normalised input n = RMSNorm(h) (D wide), E routed experts, k of them active:

    s   = sigmoid(n W_r)               [E]  router scores (score="softmax": softmax(n W_r))
    K   = top-k of (s + b)                  selection only: b is the balancing bias (a buffer, no gradient);
                                            ties go to the lower expert index (a stable sort, so deterministic)
    g_i = gamma * s_i / sum_{j in K} s_j    for i in K  (renormalize=False: g_i = gamma * s_i); gamma = routed_scaling
    f(h) = sum_{i in K} g_i E_i(n) + S(n)   E_i: SwiGLU of width d_ff; S: the shared experts (n_shared SwiGLUs of
                                            width shared_d_ff, computed as one SwiGLU n_shared * shared_d_ff wide)

Auxiliary-loss-free balancing (DeepSeek-V3 §2.1.2): every training forward adds the tokens each expert received to
``load``; :meth:`MoEFeedForward.update_bias`, called once per optimizer step (Transformer.update_moe_bias), moves
b_i += u * sign(mean(load) - load_i) outside the gradient and clears ``load``. Optionally a small sequence-wise
balance loss (DeepSeek-V3's L_bal, weight ``aux_loss_alpha``): per sequence of T tokens,

    f_i = E / (k T) * #{t: i in K_t},   P_i = 1/T sum_t s_{t,i} / sum_j s_{t,j},   L_bal = alpha * sum_i f_i P_i,

averaged over the sequences of the batch; Transformer.forward adds it to the training loss.

Dispatch is dropless: the N*k (token, expert) pairs are sorted by expert (stable: token order inside each expert),
every expert's rows go through one grouped matmul, and the weighted outputs are summed back per token. The grouped
matmul is ``torch._grouped_mm`` where the build and device have it (bf16; CUDA sm90+, or the CPU fallback), else
a loop over the E experts (the reference path; every expert runs, one with no token on a 0-row slice, so every
expert weight gets a gradient). No per-token Python loop either way.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig, MoEConfig
from .depth import rmsnorm_unit
from .rmsnorm import RMSNorm


def route(
    logits: torch.Tensor, bias: torch.Tensor, options: MoEConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Router logits [N, E] (fp32 or wider), balancing bias [E] -> weights [N, k], experts [N, k], scores [N, E].

    experts[t] are the k largest of scores[t] + bias, in decreasing order, ties to the lower index; weights are
    those experts' *scores* (not score + bias), renormalised over the k when ``options.renormalize``, times
    ``options.routed_scaling``."""
    scores = logits.sigmoid() if options.score == "sigmoid" else logits.softmax(dim=-1)  # [N, E]
    with torch.no_grad():  # selection only: the bias never gets a gradient
        order = torch.sort(scores + bias, dim=-1, descending=True, stable=True).indices  # [N, E]
        experts = order[:, : options.top_k]  # [N, k]
    weights = scores.gather(-1, experts)  # [N, k]
    if options.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * options.routed_scaling, experts, scores


@functools.cache
def _cuda_capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def grouped_mm_supported(device: torch.device, dtype: torch.dtype, *dims: int) -> bool:
    """Whether ``torch._grouped_mm`` can run the experts here (checked at runtime, no probe call): the build has
    it, the operands are bf16 (what its CUDA kernel and its compile-time shape function accept), every matrix
    width is a multiple of 8 (16-byte rows), and the device is the CPU (the build's fallback) or CUDA sm90+."""
    if not hasattr(torch, "_grouped_mm") or dtype != torch.bfloat16 or any(d % 8 for d in dims):
        return False
    if device.type == "cpu":
        return True
    return device.type == "cuda" and _cuda_capability(device.index or 0) >= (9, 0)


def expert_matmul(x: torch.Tensor, w: torch.Tensor, groups: torch.Tensor | list[int]) -> torch.Tensor:
    """Rows x [M, D_in], sorted by expert, times that expert's w [E, D_in, D_out] -> [M, D_out]. ``groups``: the
    end row of every expert's rows, an int32 tensor [E] (one torch._grouped_mm), or the rows per expert as a list
    (a loop over the E experts: the reference / fallback path)."""
    if isinstance(groups, torch.Tensor):
        return torch._grouped_mm(x, w, offs=groups)
    return torch.cat([chunk @ w[e] for e, chunk in enumerate(x.split(groups))])


class MoEFeedForward(nn.Module):
    """The MoE MLP sublayer f(h) (module docstring): ``from_normalized(x)`` with x = rmsnorm_unit(h) [B, T, D].

    Parameters: ``norm.weight`` [D], ``router.weight`` [E, D], ``experts_gate_up`` [E, D, 2 d_ff] (gate, then up),
    ``experts_down`` [E, d_ff, D], and with shared experts ``shared_gate_up.weight`` [2 S, D], ``shared_down.weight``
    [D, S] (S = n_shared * shared_d_ff). Buffer ``expert_bias`` [E] (fp32, in the state dict: training state);
    ``load`` [E] (fp32, tokens per expert since the last update_bias: zero at every step boundary, so a plain
    tensor attribute, moved with the module, in no state dict and never broadcast by DDP).
    After each forward: ``last_load`` [E] (that forward's tokens per expert, sums to N k) and ``last_aux_loss``
    (L_bal, a 0-dim tensor, 0 when aux_loss_alpha = 0); Transformer.forward reads both. After each update_bias:
    ``step_load`` [E] (the tokens per expert that update used, summed over ranks: the router statistics of that
    optimizer step)."""

    expert_bias: torch.Tensor  # a registered buffer

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.options = opts = config.moe_options
        D, F_ = config.d_model, config.d_ff
        assert F_ is not None  # set by ModelConfig.__post_init__
        E = opts.n_experts
        self.norm = RMSNorm(D, config.norm_eps)
        self.router = nn.Linear(D, E, bias=False)
        self.experts_gate_up = nn.Parameter(torch.empty(E, D, 2 * F_))
        self.experts_down = nn.Parameter(torch.empty(E, F_, D))
        shared = opts.n_shared * config.shared_d_ff
        self.shared_gate_up = nn.Linear(D, 2 * shared, bias=False) if shared else None
        self.shared_down = nn.Linear(shared, D, bias=False) if shared else None
        self.register_buffer("expert_bias", torch.zeros(E, dtype=torch.float32))
        # not a buffer: DDP would overwrite it with rank 0's at every forward (broadcast_buffers), losing the
        # other ranks' counts between micro-batches; update_bias sums it over ranks instead
        self.load = torch.zeros(E, dtype=torch.float32)
        self.last_load: torch.Tensor | None = None
        self.last_aux_loss: torch.Tensor | None = None
        self.step_load: torch.Tensor | None = None

    def _apply(self, fn, recurse=True):  # nn.Module's signature
        """Moves and casts like any module, and ``load`` with it, except that the balancing state stays fp32 (a bf16
        bias could not hold increments of u = 1e-3 once |b| grows past ~0.25): .to(bfloat16) casts the weights."""
        super()._apply(fn, recurse)
        bias = self._buffers["expert_bias"]
        if bias is not None and bias.dtype != torch.float32:
            self._buffers["expert_bias"] = bias.float()
        self.load = fn(self.load).float()
        return self

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.from_normalized(rmsnorm_unit(h, self.norm.eps))

    def from_normalized(self, x: torch.Tensor) -> torch.Tensor:
        """x = rmsnorm_unit(h) [B, T, D] -> f(h) [B, T, D]."""
        opts = self.options
        B, T, D = x.shape
        N, E, k = B * T, opts.n_experts, opts.top_k
        n = self.norm.scale(x).reshape(N, D)  # [N, D]
        router_dtype = torch.promote_types(n.dtype, torch.float32)  # fp32 at least, as DeepSeek-V3
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(n.to(router_dtype), self.router.weight.to(router_dtype))  # [N, E]
        weights, experts, scores = route(logits, self.expert_bias, opts)  # [N, k], [N, k], [N, E]

        # dispatch: the N k (token, slot) pairs sorted by expert; pair p = token p // k, slot p % k
        flat = experts.reshape(N * k)  # [N k]
        order = torch.sort(flat, stable=True).indices  # [N k] pair ids, grouped by expert, token order inside
        counts = torch.bincount(flat, minlength=E)  # [E] rows per expert
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else n.dtype
        rows = n.to(dtype)[:, None].expand(N, k, D).reshape(N * k, D)[order]  # [N k, D]
        w_gate_up, w_down = self.experts_gate_up.to(dtype), self.experts_down.to(dtype)
        grouped = opts.dispatch == "grouped_mm" or (
            opts.dispatch == "auto" and grouped_mm_supported(x.device, dtype, D, w_down.shape[1])
        )
        # [E] end rows (int32) for _grouped_mm, or rows per expert for the loop (one host sync)
        groups = torch.cumsum(counts, dim=0).to(torch.int32) if grouped else counts.tolist()
        gate, up = expert_matmul(rows, w_gate_up, groups).chunk(2, dim=-1)  # [N k, d_ff] each
        out_rows = expert_matmul(F.silu(gate) * up, w_down, groups)  # [N k, D]
        out_rows = out_rows * weights.reshape(N * k)[order, None].to(dtype)  # g_i E_i(n)
        # combine: back to (token, slot) order, then the sum over the k slots (no atomics: deterministic)
        unsorted = torch.empty_like(out_rows)
        unsorted[order] = out_rows
        out = unsorted.view(N, k, D).sum(dim=1)  # [N, D]
        if self.shared_gate_up is not None and self.shared_down is not None:
            s_gate, s_up = self.shared_gate_up(n).chunk(2, dim=-1)
            out = out + self.shared_down(F.silu(s_gate) * s_up)

        self.last_load = counts.detach().float()
        self.last_aux_loss = self.balance_loss(scores.view(B, T, E), experts.view(B, T, k))
        return out.view(B, T, D).to(x.dtype)

    def balance_loss(self, scores: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """DeepSeek-V3's sequence-wise L_bal (module docstring) from scores [B, T, E] and experts [B, T, k]; a
        0-dim fp32 tensor (0 when aux_loss_alpha = 0). Gradients reach the scores only (f is a count)."""
        alpha, k = self.options.aux_loss_alpha, self.options.top_k
        if alpha == 0:
            return scores.new_zeros(())
        _B, T, E = scores.shape
        with torch.no_grad():
            chosen = torch.zeros_like(scores).scatter_(-1, experts, 1.0)  # [B, T, E] one-hot of K_t
            f = chosen.sum(dim=1) * (E / (k * T))  # [B, E]
        p = (scores / scores.sum(dim=-1, keepdim=True)).mean(dim=1)  # [B, E]
        return alpha * (f * p).sum(dim=-1).mean()

    @torch.no_grad()
    def update_bias(self) -> None:
        """Once per optimizer step: b_i += u * sign(mean(load) - load_i) from the tokens counted since the last
        call (summed over data-parallel ranks when torch.distributed is initialised), then clear the count. A step
        that counted nothing (sign(0) = 0) leaves b unchanged."""
        load = self.load
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(load)
        self.expert_bias += self.options.bias_update_rate * torch.sign(load.mean() - load)
        self.step_load = load.clone()
        load.zero_()

    def reset_parameters(self, std: float, out_std: float) -> None:
        """Router and input matrices N(0, std), output matrices (back into the residual stream) N(0, out_std), norm
        at one, balancing bias and load at zero."""
        nn.init.ones_(self.norm.weight)
        nn.init.normal_(self.router.weight, std=std)
        nn.init.normal_(self.experts_gate_up, std=std)
        nn.init.normal_(self.experts_down, std=out_std)
        if self.shared_gate_up is not None and self.shared_down is not None:
            nn.init.normal_(self.shared_gate_up.weight, std=std)
            nn.init.normal_(self.shared_down.weight, std=out_std)
        self.expert_bias.zero_()
        self.load.zero_()

    def inactive_params(self) -> int:
        """Parameters a token does not use: the (E - k) routed experts it is not sent to."""
        E, k = self.options.n_experts, self.options.top_k
        per_expert = (self.experts_gate_up.numel() + self.experts_down.numel()) // E
        return (E - k) * per_expert


def moe_layers(model: nn.Module) -> list[MoEFeedForward]:
    """The MoE sublayers of ``model``, in order."""
    return [m for m in model.modules() if isinstance(m, MoEFeedForward)]


def router_statistics(model: nn.Module) -> dict[str, Any] | None:
    """The router's state after the latest update_bias: ``load`` [L_moe][E] (tokens per expert in that optimizer
    step, summed over ranks), ``bias`` [L_moe][E] (the balancing bias after the update) and ``top_k``; None for a
    dense model or before the first update."""
    layers = moe_layers(model)
    if not layers or any(m.step_load is None for m in layers):
        return None
    return {
        "load": [m.step_load.tolist() for m in layers],  # type: ignore[union-attr]
        "bias": [m.expert_bias.tolist() for m in layers],
        "top_k": layers[0].options.top_k,
    }


def expected_load(tokens: int, options: MoEConfig) -> float:
    """Tokens per expert under perfect balance: tokens * k / E."""
    return tokens * options.top_k / options.n_experts


__all__ = [
    "MoEFeedForward",
    "expected_load",
    "expert_matmul",
    "grouped_mm_supported",
    "moe_layers",
    "route",
    "router_statistics",
]
