"""Depth-wise attention: the one operation behind every AttnRes read (paper Eqs. 2-4).

    h = sum_s softmax_s( q . RMSNorm(v_s) ) * v_s

Keys are the RMS-normalised sources, values are the raw sources, there is no 1/sqrt(d) and no temperature,
and the softmax runs in fp32 whatever the input dtype (as in Kimi's production code).
"""

from __future__ import annotations

import torch


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / RMS(x) over the last dim, computed in fp32 (no gain: the gain is folded into the query)."""
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def depth_attention(values: torch.Tensor, query: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Reference depth attention over stacked sources.

    values: [S, ..., D] stacked sources; query: [D] (pseudo-query, RMSNorm gain already folded in).
    Returns [..., D] in the dtype of ``values``.
    """
    if values.dim() < 2 or query.shape != values.shape[-1:]:
        raise ValueError(f"depth_attention: values must be [S, ..., D] and query [D]; got {tuple(values.shape)} and {tuple(query.shape)}")
    keys = rms_normalize(values, eps)  # [S, ..., D] fp32
    logits = (keys * query.to(keys.dtype)).sum(-1)  # [S, ...]
    alpha = logits.softmax(dim=0)  # [S, ...] fp32 (or wider), sums to 1 over sources
    return (alpha.unsqueeze(-1) * values.to(keys.dtype)).sum(0).to(values.dtype)


class _MixSources(torch.autograd.Function):
    """out = sum_s weights[s] * values[s] without keeping a stacked copy of the values for backward.

    weights is [S, B, T] (one read) or [S, B, T, Q] (Q reads at once, Block AttnRes phase 1); values are S
    tensors [B, T, D]; out is [B, T, D] or [Q, B, T, D].

    A plain ``einsum(weights, torch.stack(values))`` saves the [S, B, T, D] stack for backward at every read,
    which makes Full AttnRes activation memory O(L^2 * B*T*D). Here only the (already alive) source tensors and
    the small weights are saved, so memory stays O(L * B*T*D); the stack is a temporary in both passes. The
    arithmetic runs in fp32, as in Kimi's production code, and autocast is kept out of it.
    """

    @staticmethod
    def forward(ctx, weights: torch.Tensor, *values: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weights, *values)
        out_dtype = values[0].dtype
        for v in values[1:]:
            out_dtype = torch.promote_types(out_dtype, v.dtype)
        ctx.compute_dtype = acc = torch.promote_types(out_dtype, torch.float32)  # fp32 at least
        with torch.autocast(device_type=weights.device.type, enabled=False):
            stacked = torch.stack([v.to(acc) for v in values])  # [S, B, T, D] temporary
            if weights.dim() == 3:
                out = torch.einsum("sbt,sbtd->btd", weights.to(acc), stacked)
            else:
                out = torch.einsum("sbtq,sbtd->qbtd", weights.to(acc), stacked)
        return out.to(out_dtype)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        weights, *values = ctx.saved_tensors
        single = weights.dim() == 3
        with torch.autocast(device_type=weights.device.type, enabled=False):
            acc = ctx.compute_dtype
            grad_out = grad_out.to(acc)
            w = weights.to(acc)
            grad_weights = None
            if ctx.needs_input_grad[0]:
                stacked = torch.stack([v.to(acc) for v in values])  # [S, B, T, D] temporary
                eq = "btd,sbtd->sbt" if single else "qbtd,sbtd->sbtq"
                grad_weights = torch.einsum(eq, grad_out, stacked).to(weights.dtype)
            grads = []
            for s, v in enumerate(values):
                if not ctx.needs_input_grad[1 + s]:
                    grads.append(None)
                elif single:
                    grads.append((w[s].unsqueeze(-1) * grad_out).to(v.dtype))
                else:
                    grads.append(torch.einsum("btq,qbtd->btd", w[s], grad_out).to(v.dtype))
        return (grad_weights, *grads)


def mix_sources(weights: torch.Tensor, values: list[torch.Tensor]) -> torch.Tensor:
    """sum_s weights[s] * values[s]: weights [S, B, T] -> [B, T, D], or [S, B, T, Q] -> [Q, B, T, D]."""
    if weights.shape[0] != len(values):
        raise ValueError(f"mix_sources: {weights.shape[0]} weights for {len(values)} sources")
    return _MixSources.apply(weights, *values)


def key_logits(source: torch.Tensor, queries: torch.Tensor, eps: float) -> torch.Tensor:
    """Logits of one source against R queries: q_r . RMSNorm(v) = (v . q_r) / RMS(v).

    source [B, T, D], queries [R, D] (gains folded in) -> [B, T, R] in fp32 (autocast kept out). Written as a
    matmul scaled by 1/RMS so the normalised key is never materialised (one pass over the source for the dot
    products, one for its norm)."""
    with torch.autocast(device_type=source.device.type, enabled=False):
        v = source.to(torch.promote_types(source.dtype, torch.float32))
        rstd = torch.rsqrt(torch.linalg.vecdot(v, v) / v.shape[-1] + eps)  # [B, T]
        return (v @ queries.to(v.dtype).t()) * rstd.unsqueeze(-1)


class SourceBank:
    """The sources of depth-wise reads, kept in one [B*T, capacity, D] buffer written once per source.

    A read over the first n sources is then one batched matmul over a prefix of the buffer, instead of stacking
    n tensors at every read (O(L^2) copies for Full AttnRes). In backward, every read adds its gradient for the
    values into one shared buffer with a single fused op; each source collects its total gradient once, when
    autograd reaches the point where it was added, instead of autograd summing one gradient per (read, source)
    pair. The buffer holds values in fp32 (at least), as Kimi's code computes depth mixing in fp32.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.size = 0
        self.values: torch.Tensor | None = None  # [B*T, capacity, D], outside autograd
        self.grads: torch.Tensor | None = None  # same shape, allocated at the first backward
        self.tokens: list[torch.Tensor] = []  # one autograd handle per source (see _BankEntry)
        self.shape: tuple[int, ...] = ()
        self.out_dtype: torch.dtype | None = None  # reads return the promoted dtype of the sources

    def add(self, value: torch.Tensor) -> None:
        """Append a source [B, T, D]."""
        if self.values is None:
            B, T, D = value.shape
            self.shape = (B, T, D)
            dtype = torch.promote_types(value.dtype, torch.float32)
            self.values = torch.empty(B * T, self.capacity, D, dtype=dtype, device=value.device)
        if self.size >= self.capacity:
            raise RuntimeError(f"SourceBank is full ({self.capacity} sources)")
        self.out_dtype = value.dtype if self.out_dtype is None else torch.promote_types(self.out_dtype, value.dtype)
        with torch.no_grad():
            self.values[:, self.size].copy_(value.reshape(-1, value.shape[-1]))
        self.tokens.append(_BankEntry.apply(value, self, self.size))
        self.size += 1

    def mix(self, weights: torch.Tensor) -> torch.Tensor:
        """sum_s weights[..., s] * source_s over the first n = weights.shape[-1] sources.

        weights [B, T, n] -> [B, T, D]; or [B, T, Q, n] (Q reads at once) -> [B, T, Q, D]."""
        n = weights.shape[-1]
        if n > self.size:
            raise ValueError(f"SourceBank.mix: {n} weights but only {self.size} sources")
        return _BankMix.apply(weights, self, *self.tokens[:n])

    def seal(self) -> None:
        """Drop the per-source autograd handles once the last read is built.

        The handles' graph nodes point back at this bank (their ctx), so keeping them here would make a
        bank -> token -> node -> bank cycle that Python's GC cannot see through autograd, leaking every forward's
        graph. The reads already hold the graph edges they need; nothing else uses the handles."""
        self.tokens = []

    def _grad_buffer(self) -> torch.Tensor:
        if self.grads is None:
            self.grads = torch.zeros_like(self.values)
        return self.grads


class _BankEntry(torch.autograd.Function):
    """Autograd handle of one source: a scalar token that every read of the source depends on. Its backward runs
    after all those reads' backwards (autograd's topological order) and hands the source its summed gradient."""

    @staticmethod
    def forward(ctx, value: torch.Tensor, bank: SourceBank, index: int) -> torch.Tensor:
        ctx.bank, ctx.index, ctx.value_dtype = bank, index, value.dtype
        return value.new_zeros((), dtype=torch.float32)

    @staticmethod
    def backward(ctx, _grad_token: torch.Tensor):
        bank = ctx.bank
        grad = bank._grad_buffer()[:, ctx.index]  # [B*T, D]
        out = grad.reshape(bank.shape).to(ctx.value_dtype, copy=True)  # copy: the slice is zeroed next
        grad.zero_()  # consumed: a second backward through a retained graph starts from zero again
        return out, None, None


class _BankMix(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weights: torch.Tensor, bank: SourceBank, *tokens: torch.Tensor) -> torch.Tensor:
        n = len(tokens)
        B, T, D = bank.shape
        single = weights.dim() == 3
        with torch.autocast(device_type=weights.device.type, enabled=False):
            w = weights.reshape(B * T, -1, n).to(bank.values.dtype)  # [BT, Q, n]
            out = torch.bmm(w, bank.values[:, :n])  # [BT, Q, D]
        ctx.save_for_backward(weights)
        ctx.bank, ctx.n, ctx.token_dtype = bank, n, tokens[0].dtype if tokens else torch.float32
        out = out.to(bank.out_dtype)
        return out.view(B, T, D) if single else out.view(B, T, -1, D)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (weights,) = ctx.saved_tensors
        bank, n = ctx.bank, ctx.n
        B, T, D = bank.shape
        values = bank.values[:, :n]  # [BT, n, D]
        with torch.autocast(device_type=grad_out.device.type, enabled=False):
            g = grad_out.reshape(B * T, -1, D).to(values.dtype)  # [BT, Q, D]
            w = weights.reshape(B * T, -1, n).to(values.dtype)  # [BT, Q, n]
            grad_w = torch.bmm(g, values.transpose(1, 2)).view(weights.shape).to(weights.dtype)
            grads = bank._grad_buffer()[:, :n]  # [BT, n, D] += sum_q w[q, s] * g[q]
            if w.shape[1] == 1:  # one read: a broadcast multiply-add in place, no temporary
                grads.addcmul_(w.transpose(1, 2), g)
            else:  # (baddbmm_ on a strided slice falls back to a per-batch loop on CPU)
                grads += torch.bmm(w.transpose(1, 2), g)
        zeros = [torch.zeros((), dtype=ctx.token_dtype, device=grad_out.device) for _ in range(n)]
        return (grad_w, None, *zeros)
