"""Residual schemes: how the hidden state entering each sublayer is formed from what came before.

Every scheme implements the same four calls, which the model makes in this order:

    state = scheme.begin(embedding)            # embedding [B, T, D]
    for l in range(L):                         # L = 2 * n_layers sublayers (attention, MLP, attention, ...)
        h = scheme.read(state, l)              # input of sublayer l, [B, T, D] (its PreNorm is inside the sublayer)
        scheme.write(state, l, f_l(h))         # f_l(h): the sublayer's output (a delta)
    h = scheme.final(state)                    # read number L, before the final RMSNorm and LM head

so a scheme is a small swappable component; the transformer never branches on which one it has. In training the
model calls ``read_normalized(state, l, eps)`` = rmsnorm_unit(read(state, l)) instead of ``read`` (and
``final_normalized`` instead of ``final``): the read together with the normalisation step of the PreNorm that
consumes it, which Full and Block AttnRes fuse so that the read itself is not kept for backward.

Depth-weight bookkeeping (paper §2):
  * Full AttnRes sources: v_0 = embedding, v_i = f_{i-1}(h_{i-1}) for the sublayers already run. Read l sees
    v_0 .. v_l (l + 1 sources); the final read sees all L + 1.
  * Block AttnRes sources: b_0 = embedding, completed block sums b_1 .. b_{n-1} (sums of sublayer outputs, never
    cumulative states) and, after the first sublayer of a block, the partial sum of the current block (Eq. 6).

The paper's ablations (Table 4) are options of Full / Block AttnRes (``ModelConfig.residual_options``, typed by
``AttnResOptions`` and its subclasses); the peer schemes (DenseFormer, Hyper-Connections, mHC, LAuReL) live in
``attnres/peers.py``. Every scheme registers itself with ``@register(name)`` (attnres/registry.py);
``RESIDUAL_SCHEMES`` is that registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, cast

import torch
import torch.nn as nn

from . import gpu_kernels
from .config import ModelConfig
from .depth import (
    attend_batched,
    key_logits,
    merge_read,
    mix_sources,
    mix_sources_batched,
    read_dtype,
    rms_normalize,
    rmsnorm_unit,
    track_source,
)
from .registry import SCHEMES, SchemeOptions, get, option, option_key, register


def _rms(x: torch.Tensor) -> float:
    return float(x.detach().float().pow(2).mean().sqrt())


def _present(entry: torch.Tensor | None) -> torch.Tensor:
    """An entry that the path reading it has set (a source's key-logit cache): not None."""
    assert entry is not None
    return entry


class ResidualScheme(nn.Module):
    """Base class. ``record`` turns on diagnostics (depth weights), read back with :meth:`depth_weights`.

    A concrete scheme is registered with ``@register(name)`` and defines ``Options``, the SchemeOptions dataclass
    of what it accepts in ``ModelConfig.residual_options``; it reads them, typed and checked, as ``self.options``
    (= ``config.options``)."""

    Options: ClassVar[type[SchemeOptions]] = SchemeOptions
    # Whether the scheme reads ModelConfig.n_blocks / block_size (only then are they checked)
    uses_block_geometry: ClassVar[bool] = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.options = config.options
        self.record = False
        self._weights: list[torch.Tensor | None] = []  # per read: alpha averaged over tokens, [n_sources]

    # ---- the interface -------------------------------------------------------------------------------------
    def begin(self, embedding: torch.Tensor) -> Any:
        raise NotImplementedError

    def read(self, state: Any, l: int) -> torch.Tensor:
        raise NotImplementedError

    def write(self, state: Any, l: int, out: torch.Tensor) -> None:
        raise NotImplementedError

    def final(self, state: Any) -> torch.Tensor:
        return self.read(state, self.config.n_sublayers)

    def read_normalized(self, state: Any, l: int, eps: float) -> torch.Tensor:
        """rmsnorm_unit(read(state, l)): the read followed by the normalisation of the consuming sublayer's
        PreNorm (its gain comes after). What the model calls; schemes that mix sources fuse the two so that the
        read itself is not stored for backward."""
        return rmsnorm_unit(self.read(state, l), eps)

    def final_normalized(self, state: Any, eps: float) -> torch.Tensor:
        """rmsnorm_unit(final(state)): the final read and the normalisation of the final RMSNorm."""
        return rmsnorm_unit(self.final(state), eps)

    @classmethod
    def mixing_flops(cls, config: ModelConfig) -> float:
        """Forward FLOPs per token spent by the scheme itself.

        Convention (the same as the rest of ``attnres.flops``): 2 FLOPs per multiply-accumulate of every weighted
        combination and projection the scheme computes (what a matmul FLOP counter sees); normalisations and
        element-wise nonlinearities (RMSNorm/LayerNorm, softmax, sigmoid, tanh, Sinkhorn iterations) and the
        plain residual additions are not counted, as the model's count leaves out its norms and activations.
        The baseline's additions are therefore free."""
        return 0.0

    # ---- diagnostics ---------------------------------------------------------------------------------------
    def _record(self, l: int, alpha: torch.Tensor, sources: list[int] | None = None) -> None:
        """alpha: [S, B, T] weights of read l over its sources (in source order; broadcastable in B and T).
        ``sources``: the source index of each row when the visible sources are not 0 .. S-1."""
        if self.record:
            if len(self._weights) <= l:
                self._weights.extend([None] * (l + 1 - len(self._weights)))
            w = alpha.detach().float().mean(dim=(1, 2)).cpu()
            if sources is not None:
                placed = torch.full((max(sources) + 1,), float("nan"))
                placed[sources] = w
                w = placed
            self._weights[l] = w

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
@dataclass(frozen=True)
class BaselineOptions(SchemeOptions):
    """The baseline has no options."""


@register("baseline")
class PreNormResidual(ResidualScheme):
    """The baseline: h_{l+1} = h_l + f_l(h_l)."""

    Options = BaselineOptions

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
@dataclass(frozen=True)
class AttnResOptions(SchemeOptions):
    """Options shared by Full and Block AttnRes: the paper's Table 4 ablations (defaults: the paper's AttnRes).
    What each does: :class:`_DepthAttentionResidual`."""

    query: Literal["static", "input_dependent"] = "static"
    mixing: Literal["attention", "static"] = "attention"
    normalizer: Literal["softmax", "sigmoid"] = "softmax"
    key_norm: bool = True
    heads: int = option(1, minimum=1)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mixing == "static":  # no query and no keys: the options about them must keep their defaults
            clash = [
                f"{name}={getattr(self, name)!r}"
                for name, default in (("query", "static"), ("key_norm", True), ("heads", 1))
                if getattr(self, name) != default
            ]
            if clash:
                raise ValueError(
                    f"model.residual_options (ModelConfig.residual_options): mixing='static' has no query and no "
                    f"keys, so it cannot be combined with {', '.join(clash)}"
                )

    def check(self, config: ModelConfig) -> None:
        if config.d_model % self.heads:
            raise ValueError(f"{option_key('heads', self.heads)} must divide d_model={config.d_model}")

    @property
    def paper_attention(self) -> bool:
        """Static queries, one softmax over all channels, attention mixing: what the fast paths need."""
        return (
            self.query == "static" and self.mixing == "attention" and self.normalizer == "softmax" and self.heads == 1
        )


@dataclass(frozen=True)
class FullAttnResOptions(AttnResOptions):
    """Full AttnRes: the shared options, ``window`` (the SWA ablation; None = every source) and ``read_group``
    (a speed setting, see :class:`FullAttnRes`)."""

    window: int | None = option(None, minimum=1)
    read_group: int = option(4, minimum=1)


@dataclass(frozen=True)
class BlockAttnResOptions(AttnResOptions):
    """Block AttnRes: the shared options and ``two_phase`` (False: the plain per-read reference path)."""

    two_phase: bool = True


class _DepthAttentionResidual(ResidualScheme):
    """Parameters shared by Full and Block AttnRes (same names, so one state dict loads into either):

    queries         [L + 1, D]  pseudo-query w_l of every read, zero-initialised (paper §5: "must be zero")
    key_norm_weight [L + 1, D]  gain of each read's own key RMSNorm, initialised to one; it is folded into the
                                query (w_l * g_l) . x / RMS(x) = w_l . RMSNorm_l(x)

    Options (the paper's Table 4 ablations; the defaults are the paper's AttnRes):

    query="input_dependent"  q_l = w_l + W_l RMSNorm(x) with W_l [D, D] (``query_proj``, zero-init, so step 0 is
                             unchanged) and x the current hidden state: the most recent source for Full (the
                             previous sublayer's output, the embedding at read 0) and the running partial block
                             for Block (the just-completed block at a block boundary) -- the tensor the paper's
                             Fig. 2 code calls ``hidden_states``. [Assumption: the paper gives no formula.]
    mixing="static"          no query, no key: alpha_l = normalizer(s_l) over the visible sources, with one learned
                             scalar logit per (read, source slot) (``mixing_logits``, zero-init: a uniform average).
    normalizer="sigmoid"     alpha_i = sigmoid(logit_i), no normalisation across sources (the paper attributes
                             softmax's advantage to its "competitive normalization"); at zero init every weight is
                             1/2, so the read is half the baseline stream and step 0 still equals the baseline.
    key_norm=False           keys are the raw sources (no RMSNorm and therefore no ``key_norm_weight``).
    heads=H                  D is split into H channel groups; group h scores sources with its slice of the query
                             against the RMSNorm of the source's slice (one RMS per group) and has its own softmax.
    """

    Options = AttnResOptions
    options: AttnResOptions

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        o = self.options
        R, D = config.n_reads, config.d_model
        self.eps = config.norm_eps
        self.heads = o.heads
        self.static_mixing = o.mixing == "static"
        self.input_dependent = o.query == "input_dependent"
        if self.static_mixing:
            self.mixing_logits = nn.Parameter(torch.zeros(R, self.n_source_slots(config)))
        else:
            self.queries = nn.Parameter(torch.zeros(R, D))
            if o.key_norm:
                self.key_norm_weight = nn.Parameter(torch.ones(R, D))
            if self.input_dependent:
                self.query_proj = nn.Parameter(torch.zeros(R, D, D))  # W_l: q_l = w_l + W_l x

    def reset_parameters(self) -> None:
        for name in ("queries", "query_proj", "mixing_logits"):
            if hasattr(self, name):
                nn.init.zeros_(getattr(self, name))
        if hasattr(self, "key_norm_weight"):
            nn.init.ones_(self.key_norm_weight)

    # ---- geometry --------------------------------------------------------------------------------------------
    @classmethod
    def sources_per_read(cls, config: ModelConfig) -> list[int]:
        raise NotImplementedError

    @classmethod
    def n_source_slots(cls, config: ModelConfig) -> int:
        """Most sources any read sees (columns of ``mixing_logits``)."""
        raise NotImplementedError

    @classmethod
    def mixing_flops(cls, config: ModelConfig) -> float:
        """Per (read, visible source) pair: 2*D for the logit and 2*D for the weighted sum (static mixing: the sum
        only); input-dependent queries add the D x D projection, 2*D^2 per read."""
        options = config.options
        assert isinstance(options, AttnResOptions)  # config.residual is this scheme
        D, pairs = config.d_model, sum(cls.sources_per_read(config))
        if options.mixing == "static":
            return 2.0 * D * pairs
        flops = 4.0 * D * pairs
        if options.query == "input_dependent":
            flops += 2.0 * D * D * config.n_reads
        return flops

    # ---- scoring: the pieces every read is made of -----------------------------------------------------------
    def effective_queries(self) -> torch.Tensor:
        """[L + 1, D]: each read's query with its key-norm gain folded in."""
        if hasattr(self, "key_norm_weight"):
            return self.queries * self.key_norm_weight
        return self.queries

    def _scores_in_kernels(self, embedding: torch.Tensor) -> bool:
        """Whether this forward scores its sources inside the fused kernels (attend_batched, merge_read with
        queries) instead of once per source when it is written (the key-logit cache): on CUDA, where the Triton
        kernels read each source once for its logits and its multiply-adds. Needs the paper's RMS-normalised keys,
        and not while recording depth weights (the kernels do not return them)."""
        return self.options.key_norm and not self.record and gpu_kernels.applies(embedding)

    def _keys(self, source: torch.Tensor) -> torch.Tensor:
        """[..., D] -> keys [..., D] in fp32: RMSNorm per channel group (no gain), or the raw source."""
        x = source.to(torch.promote_types(source.dtype, torch.float32))
        if not self.options.key_norm:
            return x
        return rms_normalize(x.unflatten(-1, (self.heads, -1)), self.eps).flatten(-2)

    def _input_query(self, l: int, current: torch.Tensor) -> torch.Tensor:
        """Input-dependent query of read l: [B, T, D] fp32, gain folded in like the static one."""
        x = rms_normalize(current, self.eps)  # [B, T, D] fp32
        q = self.queries[l].to(x.dtype) + x @ self.query_proj[l].to(x.dtype).t()
        if hasattr(self, "key_norm_weight"):
            q = q * self.key_norm_weight[l].to(x.dtype)
        return q

    def _key_logits(self, source: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Logits of one source against several static queries: source [B, T, D], q [R, D] -> [B, T, R, H] fp32.

        The source is normalised once here and scored against every read that will ever see it, so no source
        is re-normalised at later reads."""
        if self.heads == 1 and self.options.key_norm:  # the paper's AttnRes: no normalised key materialised
            return key_logits(source, q, self.eps).unsqueeze(-1)
        with torch.autocast(device_type=source.device.type, enabled=False):
            keys = self._keys(source).unflatten(-1, (self.heads, -1))  # [B, T, H, D/H]
            q = q.to(keys.dtype).unflatten(-1, (self.heads, -1))  # [R, H, D/H]
            return torch.einsum("bthe,rhe->btrh", keys, q)

    def _logits(self, keys: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Stacked keys [S, B, T, D] against one read's query q ([D] static or [B, T, D]) -> [S, B, T, H]."""
        keys = keys.unflatten(-1, (self.heads, -1))  # [S, B, T, H, D/H]
        q = q.to(keys.dtype).unflatten(-1, (self.heads, -1))
        if q.dim() == 2:
            return torch.einsum("sbthe,he->sbth", keys, q)
        return torch.einsum("sbthe,bthe->sbth", keys, q)

    def _static_logits(self, l: int, slots: list[int] | int) -> torch.Tensor:
        """Static mixing: read l's learned logits of the given source slots -> [S, 1, 1, 1] (broadcast over tokens)."""
        s = self.mixing_logits[l, slots] if isinstance(slots, list) else self.mixing_logits[l, :slots]
        return s.float().view(-1, 1, 1, 1)

    # ---- reads: read(l) = _read(l, None); read_normalized(l, eps) = _read(l, eps), fused ------------------
    def _read(self, state: Any, l: int, normalize_eps: float | None) -> torch.Tensor:
        """Read l; with ``normalize_eps``, rmsnorm_unit of it (see ResidualScheme.read_normalized)."""
        raise NotImplementedError

    def read(self, state: Any, l: int) -> torch.Tensor:
        return self._read(state, l, None)

    def read_normalized(self, state: Any, l: int, eps: float) -> torch.Tensor:
        return self._read(state, l, eps)

    def final_normalized(self, state: Any, eps: float) -> torch.Tensor:
        return self._read(state, self.config.n_sublayers, eps)

    def _attend(
        self,
        l: int,
        logits: torch.Tensor,
        values: list[torch.Tensor],
        sources: list[int] | None = None,
        normalize_eps: float | None = None,
    ) -> torch.Tensor:
        """Weights from logits [S, B, T, H] (softmax over sources, or sigmoid), then the weighted sum of the raw
        values: h [B, T, D] in the values' dtype, computed in fp32 (rmsnorm_unit(h) with ``normalize_eps``)."""
        with torch.autocast(device_type=values[0].device.type, enabled=False):
            # softmax: [S, B, T, H] sums to 1 over sources, per channel group; sigmoid: [S, B, T, H] independent gates
            alpha = logits.softmax(dim=0) if self.options.normalizer == "softmax" else torch.sigmoid(logits)
            if self.record:
                self._record(l, alpha.mean(-1), sources)  # averaged over channel groups
            S, (B, T, _D) = len(values), values[0].shape
            if self.heads == 1:
                return mix_sources(alpha[..., 0].expand(S, B, T), values, normalize_eps)
            # One weighted sum per channel group. This stacks the sources (the fused mix_sources only takes one
            # weight per source), so the multihead ablation keeps O(S*B*T*D) per read for backward.
            stacked = torch.stack(values).unflatten(-1, (self.heads, -1)).to(alpha.dtype)  # [S, B, T, H, D/H]
            h = torch.einsum("sbth,sbthe->bthe", alpha, stacked).flatten(-2).to(values[0].dtype)
        return h if normalize_eps is None else rmsnorm_unit(h, normalize_eps)


@register("full")
class FullAttnRes(_DepthAttentionResidual):
    """Full AttnRes (Eqs. 1-4): every read attends over the embedding and all earlier sublayer outputs.

    Extra option ``window=W`` (the paper's SWA ablation): read l sees only the embedding and the W most recent
    sublayer outputs v_{l-W+1} .. v_l.

    Fast paths: each source is scored once, when it is written, against the static queries of every read that
    will see it (all options with static queries); with input-dependent queries each source's normalised keys
    are cached instead and scored at each read.

    Option ``read_group=G`` (default 4; a speed setting, the result is the same): the reads are taken G at a
    time, the way Block AttnRes' two-phase computation takes a block. At the group's first read l0, the sources
    every read of the group sees (v_0 .. v_l0) are mixed for all G reads in one pass (mix_sources_batched: each
    loaded once per group instead of once per read); each read then merges the group's newer sources by online
    softmax (merge_read). G = 1 mixes every read's sources itself (mix_sources). Used with the paper's attention
    (static queries, softmax, one head, no window); other ablations always take G = 1.
    """

    Options = FullAttnResOptions
    options: FullAttnResOptions

    @dataclass
    class State:
        q: torch.Tensor | None  # [L + 1, D] effective static queries (None: static mixing / input-dependent)
        values: list[torch.Tensor] = field(default_factory=list)  # v_0 .. v_i, each [B, T, D]
        # per source i: logits [B, T, n_i, H] against reads i .. i + n_i - 1 (static queries), its keys
        # [B, T, D] (input-dependent queries), or None (static mixing)
        cache: list[torch.Tensor | None] = field(default_factory=list)
        # the current read group (read_group > 1), over the sources all its reads see:
        group_lse: torch.Tensor | None = None  # [B, T, Q] log-sum-exp of their logits
        group_alpha: torch.Tensor | None = None  # [S, B, T, Q] their softmax weights (kept for diagnostics)
        group_out: list[torch.Tensor | None] = field(default_factory=list)  # Q x [B, T, D] fp32, until read
        fused: bool = False  # sources are scored inside the kernels, not cached (_scores_in_kernels)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        o = self.options
        self.window = o.window
        self.read_group = o.read_group if o.paper_attention and o.window is None else 1

    @classmethod
    def _visible(cls, l: int, window: int | None) -> list[int]:
        """Source indices read l sees: all of 0 .. l, or the embedding and the `window` most recent outputs."""
        if window is None:
            return list(range(l + 1))
        return [0, *list(range(max(1, l - window + 1), l + 1))]

    @classmethod
    def sources_per_read(cls, config: ModelConfig) -> list[int]:
        options = config.options
        assert isinstance(options, FullAttnResOptions)  # config.residual is this scheme
        window = options.window
        return [len(cls._visible(l, window)) for l in range(config.n_reads)]

    @classmethod
    def n_source_slots(cls, config: ModelConfig) -> int:
        return config.n_reads

    def _reads_seeing(self, i: int) -> range:
        """Reads that will see source i: from read i on, for `window` reads (the embedding: every read)."""
        n_reads = self.config.n_reads
        if self.window is None or i == 0:
            return range(i, n_reads)
        return range(i, min(i + self.window, n_reads))

    def begin(self, embedding: torch.Tensor) -> State:
        static_query = not (self.static_mixing or self.input_dependent)
        state = self.State(
            q=self.effective_queries() if static_query else None,
            fused=self.read_group > 1 and self._scores_in_kernels(embedding),
        )
        self._add_source(state, embedding)
        return state

    def _add_source(self, state: State, value: torch.Tensor) -> None:
        i = len(state.values)  # source i is first seen by read i
        value = track_source(value)  # many reads mix it: their gradients accumulate in place
        state.values.append(value)
        if state.fused:
            state.cache.append(None)  # scored by the read groups' kernels
        elif state.q is not None:
            reads = self._reads_seeing(i)
            state.cache.append(self._key_logits(value, state.q[reads.start : reads.stop]))
        elif self.input_dependent:
            state.cache.append(self._keys(value))
        else:
            state.cache.append(None)

    def _read(self, state: State, l: int, normalize_eps: float | None) -> torch.Tensor:
        if self.read_group > 1:
            return self._read_grouped(state, l, normalize_eps)
        visible = self._visible(l, self.window)
        if self.static_mixing:
            logits = self._static_logits(l, visible)  # [S, 1, 1, 1]
        elif state.q is not None:
            # source i's logit for read l sits at column l - i of its cache
            logits = torch.stack([_present(state.cache[i])[:, :, l - i] for i in visible])  # [S, B, T, H]
        else:
            with torch.autocast(device_type=state.values[0].device.type, enabled=False):
                q = self._input_query(l, state.values[-1])  # current hidden state: the latest source
                logits = self._logits(torch.stack([_present(state.cache[i]) for i in visible]), q)  # [S, B, T, H]
        return self._attend(
            l,
            logits,
            [state.values[i] for i in visible],
            sources=visible if self.window is not None else None,
            normalize_eps=normalize_eps,
        )

    def _read_grouped(self, state: State, l: int, normalize_eps: float | None) -> torch.Tensor:
        """Read l as part of its read group (see ``read_group``): the group's phase-1 output merged with the
        sources written since the group's first read l0 (v_{l0+1} .. v_l) by online softmax."""
        position = l % self.read_group
        first = l - position  # the group's first read: it and every later read of the group see v_0 .. v_first
        if position == 0 and state.fused:  # one pass scores and mixes v_0 .. v_first for the group's reads
            reads = range(first, min(first + self.read_group, self.config.n_reads))
            assert state.q is not None  # read groups: static queries
            queries = state.q[reads.start : reads.stop]  # [Q, D]
            # the outputs' list holds None for each output once read
            state.group_out, state.group_lse = cast(
                "tuple[list[torch.Tensor | None], torch.Tensor]",
                attend_batched(state.values[: first + 1], queries, self.eps),
            )
        elif position == 0:
            reads = range(first, min(first + self.read_group, self.config.n_reads))
            # source i's logit for read r sits at column r - i of its cache
            logits = torch.stack(
                [_present(state.cache[i])[:, :, reads.start - i : reads.stop - i, 0] for i in range(first + 1)]
            )  # [first + 1, B, T, Q]
            state.group_lse = torch.logsumexp(logits, dim=0)  # [B, T, Q]
            state.group_alpha = torch.exp(logits - state.group_lse)  # [first + 1, B, T, Q]
            state.group_out = cast(  # holds None for each output once read
                "list[torch.Tensor | None]", mix_sources_batched(state.group_alpha, state.values[: first + 1])
            )
        base, state.group_out[position] = state.group_out[position], None  # freed once read
        assert base is not None  # each read takes its phase-1 output once
        assert state.group_lse is not None
        newer = range(first + 1, l + 1)
        extras, out_dtype = [state.values[i] for i in newer], read_dtype(state.values[: l + 1])
        if state.fused:  # the newer sources' logits (query q_l each) are computed inside the merge
            assert state.q is not None
            K = len(newer)
            z = -state.group_lse[None, ..., position].expand(K, -1, -1) if K else None  # [K, B, T]
            query = state.q[l : l + 1].expand(K, -1) if K else None  # [K, D]
            return merge_read(base, z, extras, normalize_eps, out_dtype, query, self.eps)
        z = None
        if newer:  # their logits relative to the log-sum-exp of the group's common sources: [K, B, T]
            z = torch.stack([_present(state.cache[i])[:, :, l - i, 0] for i in newer]) - state.group_lse[..., position]
        if self.record:
            assert state.group_alpha is not None  # recording: not fused
            alpha = state.group_alpha[..., position]
            if z is not None:
                a = torch.cat([torch.zeros_like(z[:1]), z]).softmax(0)
                alpha = torch.cat([alpha * a[0], a[1:]])
            self._record(l, alpha)
        return merge_read(base, z, extras, normalize_eps, out_dtype)

    def write(self, state: State, l: int, out: torch.Tensor) -> None:
        self._add_source(state, out)

    def source_labels(self) -> list[str]:
        return ["emb"] + [f"{'attn' if i % 2 == 0 else 'mlp'}{i // 2}" for i in range(self.config.n_sublayers)]


@register("block")
class BlockAttnRes(_DepthAttentionResidual):
    """Block AttnRes (Eqs. 5-6) with the paper's two-phase computation (Algorithm 1).

    Sublayers are grouped into blocks of S = config.sublayers_per_block (the last block may be shorter). At the
    first read of a block, phase 1 computes *all* reads of that block against the completed blocks at once: their
    softmax weights, log-sum-exp and weighted sums (mix_sources_batched: each completed block is loaded once for
    the whole block, forward and backward, instead of once per read). Each read of the block (phase 2) then only
    scores the running partial sum and merges it into its phase-1 output by online softmax (merge_read). The
    phase-1 outputs are not kept for backward: each lives until its read. Option ``two_phase=False`` runs the
    plain per-read softmax over the stacked sources instead (the obviously-correct reference; tests prove the two
    equal).

    The two-phase path needs static queries, one softmax over all channels (heads=1) and attention mixing; with
    any other ablation option (query="input_dependent", mixing="static", normalizer="sigmoid", heads>1) the
    scheme runs the plain path whatever ``two_phase`` says. key_norm=False keeps the two-phase path.
    """

    Options = BlockAttnResOptions
    options: BlockAttnResOptions
    uses_block_geometry = True

    @dataclass
    class State:
        q: torch.Tensor | None  # [L + 1, D] (None for static mixing)
        blocks: list[torch.Tensor] = field(default_factory=list)  # b_0 = embedding, b_1 .. completed block sums
        block_logits: list[torch.Tensor] = field(default_factory=list)  # [B, T, L + 1 - first_read_of_block_j]
        block_first_read: list[int] = field(default_factory=list)
        partial: torch.Tensor | None = None  # b_n^i: sum of the outputs of the current block so far
        # phase 1 of the current block's Q reads, over the completed blocks:
        phase1_lse: torch.Tensor | None = None  # [B, T, Q] log-sum-exp of their logits
        phase1_alpha: torch.Tensor | None = None  # [n_blocks, B, T, Q] their softmax weights (kept for diagnostics)
        phase1_out: list[torch.Tensor | None] = field(default_factory=list)  # Q x [B, T, D] fp32, until read
        fused: bool = False  # completed blocks are scored inside phase 1's kernel, not cached (_scores_in_kernels)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.block_size = config.sublayers_per_block
        self.two_phase = self.options.two_phase and self.options.paper_attention

    @classmethod
    def sources_per_read(cls, config: ModelConfig) -> list[int]:
        """Eq. 6: 1 + completed blocks, plus the partial sum after a block's first sublayer."""
        S = config.sublayers_per_block
        return [1 + l // S + (1 if l % S else 0) for l in range(config.n_reads)]

    @classmethod
    def n_source_slots(cls, config: ModelConfig) -> int:
        return config.effective_n_blocks + 1

    def begin(self, embedding: torch.Tensor) -> State:
        state = self.State(
            q=None if self.static_mixing else self.effective_queries(),
            fused=self.two_phase and self._scores_in_kernels(embedding),
        )
        self._commit(state, embedding, first_read=0)
        return state

    def _commit(self, state: State, block: torch.Tensor, first_read: int) -> None:
        block = track_source(block)  # every later read mixes it: gradients accumulate in place
        state.blocks.append(block)
        if self.two_phase and not state.fused:
            assert state.q is not None  # two-phase: static queries
            state.block_first_read.append(first_read)
            state.block_logits.append(self._key_logits(block, state.q[first_read:])[..., 0])

    def _completed_logits(self, state: State, reads: range) -> torch.Tensor:
        """[n_blocks, B, T, len(reads)] logits of the given reads against every completed block."""
        return torch.stack(
            [lg[..., reads.start - f : reads.stop - f] for lg, f in zip(state.block_logits, state.block_first_read)]
        )

    def _read(self, state: State, l: int, normalize_eps: float | None) -> torch.Tensor:
        position = l % self.block_size  # 0 = first read of a block
        if position == 0 and state.partial is not None:
            # Block boundary: the finished partial sum becomes a completed block b_n (Eq. 5).
            self._commit(state, state.partial, first_read=l)
            state.partial = None
        if not self.two_phase:
            return self._read_naive(state, l, normalize_eps)
        if position == 0:
            self._phase1(state, range(l, min(l + self.block_size, self.config.n_reads)))
        base, state.phase1_out[position] = state.phase1_out[position], None  # freed once read
        assert base is not None  # each read takes its phase-1 output once
        out_dtype = read_dtype(state.blocks if state.partial is None else [*state.blocks, state.partial])
        if state.partial is None:
            if self.record:
                assert state.phase1_alpha is not None  # recording: not fused
                self._record(l, state.phase1_alpha[..., position])
            return merge_read(base, None, [], normalize_eps, out_dtype)
        # Phase 2: merge the partial sum by online softmax (exact), with weight sigmoid(its logit - phase-1 lse).
        assert state.phase1_lse is not None
        assert state.q is not None  # two-phase: static queries
        lse = state.phase1_lse[None, ..., position]  # [1, B, T]
        if self.options.key_norm:  # the key logit q_l . RMSNorm(partial) is computed inside the merge
            z, query = -lse, state.q[l : l + 1]
        else:  # raw keys (ablation)
            z, query = self._key_logits(state.partial, state.q[l : l + 1])[..., 0, 0] - lse, None
        if self.record:
            assert state.phase1_alpha is not None  # recording: not fused
            logit = self._key_logits(state.partial, state.q[l : l + 1])[..., 0, 0]  # [B, T]
            w_partial = torch.sigmoid(logit - state.phase1_lse[..., position])  # e^p / (e^lse + e^p)
            self._record(l, torch.cat([state.phase1_alpha[..., position] * (1 - w_partial), w_partial[None]]))
        return merge_read(base, z, [state.partial], normalize_eps, out_dtype, query, self.eps)

    def _phase1(self, state: State, reads: range) -> None:
        """Batch all reads of the new block against the completed blocks (they do not change inside a block):
        log-sum-exp [B, T, Q], softmax weights [n, B, T, Q] and the weighted sums (Q x [B, T, D], fp32). Fused (CUDA):
        one kernel scores and mixes the blocks, and returns no weights."""
        if state.fused:
            assert state.q is not None  # two-phase: static queries
            queries = state.q[reads.start : reads.stop]  # [Q, D]
            # the outputs' list holds None for each output once read
            state.phase1_out, state.phase1_lse = cast(
                "tuple[list[torch.Tensor | None], torch.Tensor]", attend_batched(state.blocks, queries, self.eps)
            )
            return
        logits = self._completed_logits(state, reads)  # [n, B, T, Q]
        state.phase1_lse = torch.logsumexp(logits, dim=0)  # [B, T, Q]
        state.phase1_alpha = torch.exp(logits - state.phase1_lse)  # [n, B, T, Q]
        state.phase1_out = cast(  # holds None for each output once read
            "list[torch.Tensor | None]", mix_sources_batched(state.phase1_alpha, state.blocks)
        )

    def _read_naive(self, state: State, l: int, normalize_eps: float | None) -> torch.Tensor:
        """Plain path: one read over [b_0 .. b_{n-1}] (+ partial b_n^{i-1} after the block's first sublayer)."""
        sources = state.blocks + ([state.partial] if state.partial is not None else [])
        if self.static_mixing:
            return self._attend(l, self._static_logits(l, len(sources)), sources, normalize_eps=normalize_eps)
        assert state.q is not None  # attention mixing: set in begin
        with torch.autocast(device_type=sources[0].device.type, enabled=False):
            keys = torch.stack([self._keys(s) for s in sources])  # [S, B, T, D] fp32
            # input-dependent: from the partial block, or the block just completed
            q = self._input_query(l, sources[-1]) if self.input_dependent else state.q[l]
            logits = self._logits(keys, q)  # [S, B, T, H]
        return self._attend(l, logits, sources, normalize_eps=normalize_eps)

    def write(self, state: State, l: int, out: torch.Tensor) -> None:
        state.partial = out if state.partial is None else state.partial + out

    def source_labels(self) -> list[str]:
        n = self.config.effective_n_blocks
        return ["emb"] + [f"block{j}" for j in range(1, n + 1)]


# The registry: every registered scheme by name (the peers join it when attnres.peers is imported).
RESIDUAL_SCHEMES: dict[str, type[ResidualScheme]] = SCHEMES


def build_residual(config: ModelConfig) -> ResidualScheme:
    """The residual scheme ``config.residual`` names, built for ``config``."""
    return get(config.residual)(config)
