"""Residual schemes: how the hidden state entering each sublayer is formed from what came before.

Every scheme implements the same four calls, which the model makes in this order:

    state = scheme.begin(embedding)            # embedding [B, T, D]
    for l in range(L):                         # L = 2 * n_layers sublayers (attention, MLP, attention, ...)
        h = scheme.read(state, l)              # input of sublayer l, [B, T, D] (its PreNorm is inside the sublayer)
        scheme.write(state, l, f_l(h))         # f_l(h): the sublayer's output (a delta)
    h = scheme.final(state)                    # read number L, before the final RMSNorm and LM head

so a scheme is a small swappable component; the transformer never branches on which one it has.

Depth-weight bookkeeping (paper §2):
  * Full AttnRes sources: v_0 = embedding, v_i = f_{i-1}(h_{i-1}) for the sublayers already run. Read l sees
    v_0 .. v_l (l + 1 sources); the final read sees all L + 1.
  * Block AttnRes sources: b_0 = embedding, completed block sums b_1 .. b_{n-1} (sums of sublayer outputs, never
    cumulative states) and, after the first sublayer of a block, the partial sum of the current block (Eq. 6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from .config import ModelConfig
from .depth import depth_attention, mix_sources, rms_normalize


def _rms(x: torch.Tensor) -> float:
    return float(x.detach().float().pow(2).mean().sqrt())


class ResidualScheme(nn.Module):
    """Base class. ``record`` turns on diagnostics (depth weights), read back with :meth:`depth_weights`."""

    # Options this scheme accepts in ModelConfig.residual_options, with their defaults.
    OPTIONS: dict[str, Any] = {}

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        unknown = set(config.residual_options) - set(self.OPTIONS)
        if unknown:
            allowed = ", ".join(sorted(self.OPTIONS)) or "none"
            raise ValueError(
                f"ModelConfig.residual_options has {sorted(unknown)} which residual={config.residual!r} does not "
                f"accept; allowed options: {allowed}"
            )
        self.options = {**self.OPTIONS, **config.residual_options}
        self.record = False
        self._weights: list[torch.Tensor | None] = []  # per read: alpha averaged over tokens, [n_sources]

    def begin(self, embedding: torch.Tensor) -> Any:
        raise NotImplementedError

    def read(self, state: Any, l: int) -> torch.Tensor:
        raise NotImplementedError

    def write(self, state: Any, l: int, out: torch.Tensor) -> None:
        raise NotImplementedError

    def final(self, state: Any) -> torch.Tensor:
        return self.read(state, self.config.n_sublayers)

    @classmethod
    def mixing_flops(cls, config: ModelConfig) -> float:
        """Forward FLOPs per token spent by the scheme itself (the baseline's additions are free)."""
        return 0.0

    # ---- diagnostics ---------------------------------------------------------------------------------------
    def _record(self, l: int, alpha: torch.Tensor) -> None:
        """alpha: [S, B, T] weights of read l over its sources (in source order)."""
        if self.record:
            if len(self._weights) <= l:
                self._weights.extend([None] * (l + 1 - len(self._weights)))
            self._weights[l] = alpha.detach().float().mean(dim=(1, 2)).cpu()

    def depth_weights(self) -> torch.Tensor | None:
        """[n_reads, n_sources] depth weights of the last recorded forward (NaN where a source is not visible),
        or None for schemes without depth weights."""
        if not self._weights or all(w is None for w in self._weights):
            return None
        n_sources = max(w.numel() for w in self._weights if w is not None)
        out = torch.full((self.config.n_reads, n_sources), float("nan"))
        for l, w in enumerate(self._weights):
            if w is not None:
                out[l, : w.numel()] = w
        return out

    def source_labels(self) -> list[str]:
        return []


# ---------------------------------------------------------------------------------------------------------------
class PreNormResidual(ResidualScheme):
    """The baseline: h_{l+1} = h_l + f_l(h_l)."""

    @dataclass
    class State:
        h: torch.Tensor

    def begin(self, embedding: torch.Tensor) -> State:
        return self.State(h=embedding)

    def read(self, state: State, l: int) -> torch.Tensor:
        return state.h

    def write(self, state: State, l: int, out: torch.Tensor) -> None:
        state.h = state.h + out


# ---------------------------------------------------------------------------------------------------------------
class _DepthAttentionResidual(ResidualScheme):
    """Parameters shared by Full and Block AttnRes (same names, so one state dict loads into either):

    queries         [L + 1, D]  pseudo-query w_l of every read, zero-initialised (paper §5: "must be zero")
    key_norm_weight [L + 1, D]  gain of each read's own key RMSNorm, initialised to one; it is folded into the
                                query (w_l * g_l) . x / RMS(x) = w_l . RMSNorm_l(x)
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.queries = nn.Parameter(torch.zeros(config.n_reads, config.d_model))
        self.key_norm_weight = nn.Parameter(torch.ones(config.n_reads, config.d_model))
        self.eps = config.norm_eps

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.queries)
        nn.init.ones_(self.key_norm_weight)

    @classmethod
    def sources_per_read(cls, config: ModelConfig) -> list[int]:
        raise NotImplementedError

    @classmethod
    def mixing_flops(cls, config: ModelConfig) -> float:
        """2*D for the logit and 2*D for the weighted sum, per (read, visible source) pair."""
        return 4.0 * config.d_model * sum(cls.sources_per_read(config))

    def effective_queries(self) -> torch.Tensor:
        """[L + 1, D]: each read's query with its key-norm gain folded in."""
        return self.queries * self.key_norm_weight

    def _key_logits(self, source: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Logits of one source against several queries: source [B, T, D], q [R, D] -> [B, T, R] (fp32).

        The source is normalised once here and scored against every read that will ever see it, so no source
        is re-normalised at later reads."""
        with torch.autocast(device_type=source.device.type, enabled=False):
            keys = rms_normalize(source, self.eps)  # [B, T, D] fp32
            return keys @ q.to(keys.dtype).t()


class FullAttnRes(_DepthAttentionResidual):
    """Full AttnRes (Eqs. 1-4): every read attends over the embedding and all earlier sublayer outputs."""

    @dataclass
    class State:
        q: torch.Tensor  # [L + 1, D] effective queries
        values: list[torch.Tensor] = field(default_factory=list)  # v_0 .. v_i, each [B, T, D]
        logits: list[torch.Tensor] = field(default_factory=list)  # logits[i]: [B, T, L + 1 - i], reads i .. L

    @classmethod
    def sources_per_read(cls, config: ModelConfig) -> list[int]:
        return [l + 1 for l in range(config.n_reads)]

    def begin(self, embedding: torch.Tensor) -> State:
        state = self.State(q=self.effective_queries())
        self._add_source(state, embedding)
        return state

    def _add_source(self, state: State, value: torch.Tensor) -> None:
        i = len(state.values)  # source i is first seen by read i
        state.values.append(value)
        state.logits.append(self._key_logits(value, state.q[i:]))

    def read(self, state: State, l: int) -> torch.Tensor:
        # Read l sees sources 0..l; source i's logit for read l sits at column l - i.
        logits = torch.stack([lg[..., l - i] for i, lg in enumerate(state.logits[: l + 1])])  # [l+1, B, T]
        alpha = logits.softmax(dim=0)  # fp32 softmax over depth
        self._record(l, alpha)
        return mix_sources(alpha, state.values[: l + 1])

    def write(self, state: State, l: int, out: torch.Tensor) -> None:
        self._add_source(state, out)

    def source_labels(self) -> list[str]:
        return ["emb"] + [f"{'attn' if i % 2 == 0 else 'mlp'}{i // 2}" for i in range(self.config.n_sublayers)]


class BlockAttnRes(_DepthAttentionResidual):
    """Block AttnRes (Eqs. 5-6) with the paper's two-phase computation (Algorithm 1).

    Sublayers are grouped into blocks of S = config.sublayers_per_block (the last block may be shorter). At the
    first read of a block, phase 1 scores *all* reads of that block against the completed blocks at once and keeps
    their normalised outputs and log-sum-exp; each later read of the block (phase 2) only scores the running
    partial sum and merges it by online softmax. Option ``two_phase=False`` runs the plain per-read softmax over
    the stacked sources instead (the obviously-correct reference; tests prove the two equal).
    """

    OPTIONS = {"two_phase": True}

    @dataclass
    class State:
        q: torch.Tensor  # [L + 1, D]
        blocks: list[torch.Tensor] = field(default_factory=list)  # b_0 = embedding, b_1 .. completed block sums
        block_logits: list[torch.Tensor] = field(default_factory=list)  # [B, T, L + 1 - first_read_of_block_j]
        block_first_read: list[int] = field(default_factory=list)
        partial: torch.Tensor | None = None  # b_n^i: sum of the outputs of the current block so far
        phase1_out: torch.Tensor | None = None  # [Q, B, T, D] phase-1 outputs of the current block's reads
        phase1_lse: torch.Tensor | None = None  # [B, T, Q] their log-sum-exp over completed blocks
        phase1_alpha: torch.Tensor | None = None  # [n_blocks, B, T, Q] (kept for diagnostics only)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.block_size = config.sublayers_per_block

    @classmethod
    def sources_per_read(cls, config: ModelConfig) -> list[int]:
        """Eq. 6: 1 + completed blocks, plus the partial sum after a block's first sublayer."""
        S = config.sublayers_per_block
        return [1 + l // S + (1 if l % S else 0) for l in range(config.n_reads)]

    def begin(self, embedding: torch.Tensor) -> State:
        state = self.State(q=self.effective_queries())
        self._commit(state, embedding, first_read=0)
        return state

    def _commit(self, state: State, block: torch.Tensor, first_read: int) -> None:
        state.blocks.append(block)
        state.block_first_read.append(first_read)
        state.block_logits.append(self._key_logits(block, state.q[first_read:]))

    def _completed_logits(self, state: State, reads: range) -> torch.Tensor:
        """[n_blocks, B, T, len(reads)] logits of the given reads against every completed block."""
        return torch.stack([lg[..., reads.start - f: reads.stop - f]
                            for lg, f in zip(state.block_logits, state.block_first_read)])

    def read(self, state: State, l: int) -> torch.Tensor:
        position = l % self.block_size  # 0 = first read of a block
        if position == 0 and state.partial is not None:
            # Block boundary: the finished partial sum becomes a completed block b_n (Eq. 5).
            self._commit(state, state.partial, first_read=l)
            state.partial = None
        if not self.options["two_phase"]:
            return self._read_naive(state, l)
        if position == 0:
            self._phase1(state, range(l, min(l + self.block_size, self.config.n_reads)))
        h = state.phase1_out[position]  # [B, T, D]
        if state.partial is None:
            if self.record:
                self._record(l, state.phase1_alpha[..., position])
            return h
        # Phase 2: merge the partial sum into the phase-1 result by online softmax (exact).
        partial_logit = self._key_logits(state.partial, state.q[l: l + 1])[..., 0]  # [B, T]
        w_partial = torch.sigmoid(partial_logit - state.phase1_lse[..., position])  # e^p / (e^lse + e^p)
        if self.record:
            alpha = torch.cat([state.phase1_alpha[..., position] * (1 - w_partial), w_partial[None]])
            self._record(l, alpha)
        w = w_partial.unsqueeze(-1)
        return ((1 - w) * h.float() + w * state.partial.float()).to(h.dtype)

    def _phase1(self, state: State, reads: range) -> None:
        """Batch all reads of the new block against the completed blocks (they do not change inside a block)."""
        logits = self._completed_logits(state, reads)  # [n, B, T, Q]
        state.phase1_lse = torch.logsumexp(logits, dim=0)  # [B, T, Q]
        alpha = torch.exp(logits - state.phase1_lse)  # softmax over completed blocks
        state.phase1_alpha = alpha
        state.phase1_out = mix_sources(alpha, state.blocks)  # [Q, B, T, D]

    def _read_naive(self, state: State, l: int) -> torch.Tensor:
        """Reference: softmax over [b_0 .. b_{n-1}] (+ partial b_n^{i-1} after the block's first sublayer)."""
        sources = state.blocks + ([state.partial] if state.partial is not None else [])
        values = torch.stack(sources)  # [S, B, T, D]
        if self.record:
            keys = rms_normalize(values, self.eps)
            self._record(l, (keys * state.q[l].float()).sum(-1).softmax(0))
        return depth_attention(values, state.q[l], eps=self.eps)

    def write(self, state: State, l: int, out: torch.Tensor) -> None:
        state.partial = out if state.partial is None else state.partial + out

    def source_labels(self) -> list[str]:
        n = self.config.effective_n_blocks
        return ["emb"] + [f"block{j}" for j in range(1, n + 1)]


RESIDUAL_SCHEMES: dict[str, type[ResidualScheme]] = {
    "baseline": PreNormResidual,
    "full": FullAttnRes,
    "block": BlockAttnRes,
}


def build_residual(config: ModelConfig) -> ResidualScheme:
    try:
        cls = RESIDUAL_SCHEMES[config.residual]
    except KeyError:
        raise ValueError(
            f"ModelConfig.residual={config.residual!r} has no implementation; allowed values: "
            f"{', '.join(RESIDUAL_SCHEMES)}"
        ) from None
    return cls(config)
