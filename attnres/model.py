"""A Llama-style PreNorm decoder whose residual connection is a swappable component (attnres.residual).

token embedding -> [ attention sublayer, MLP sublayer ] x n_layers -> final read -> RMSNorm -> LM head

Each sublayer is f(h) = Op(RMSNorm(h)): PreNorm lives *inside* the sublayer, so AttnRes mixes the raw
sublayer outputs and the baseline adds them. RoPE, causal SDPA attention, SwiGLU MLP (or, with ffn="moe", the
mixture of SwiGLU experts of attnres.moe), no biases.

Inference: ``model(idx, cache=model.new_cache())`` fills a KVCache (prefill) and later calls with the same cache
take the next tokens (decode). Only attention mixes positions: every residual scheme works token by token, so a
new token's depth sources (Full AttnRes' sublayer outputs, Block AttnRes' block sums, HC's streams) are made in
its own forward and nothing of an earlier position is recomputed or kept besides the keys and values.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .config import ModelConfig
from .depth import rmsnorm_unit
from .moe import MoEFeedForward, moe_layers
from .residual import ResidualScheme, build_residual
from .rmsnorm import RMSNorm


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [max_seq_len, head_dim // 2] for rotary position embeddings."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, hd]; rotate the (first half, second half) pairs of each head by position-dependent angles."""
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.to(x.dtype)


class KVCache:
    """Keys and values of every attention sublayer, for incremental decoding.

    k[i], v[i]: [B, H, max_len, hd] of transformer block i, allocated at its first write (in the keys' dtype);
    positions 0 .. length - 1 are filled. Transformer.forward(idx, cache=...) reads and extends it and advances
    ``length`` by idx's T."""

    def __init__(self, n_layers: int, max_len: int) -> None:
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers
        self.max_len, self.length = max_len, 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [B, H, T, hd] at positions length .. length + T - 1; return every position's so far."""
        if self.k[layer] is None:
            B, H, _, hd = k.shape
            self.k[layer] = k.new_empty(B, H, self.max_len, hd)
            self.v[layer] = v.new_empty(B, H, self.max_len, hd)
        k_all, v_all = self.k[layer], self.v[layer]
        assert k_all is not None
        assert v_all is not None  # allocated together with k_all
        end = self.length + k.shape[2]
        k_all[:, :, self.length : end] = k
        v_all[:, :, self.length : end] = v
        return k_all[:, :, :end], v_all[:, :, :end]


class CausalSelfAttention(nn.Module):
    """f(h) = W_o · Attention(RoPE(W_q n), RoPE(W_k n), W_v n), with n = RMSNorm(h)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim = config.n_heads, config.head_dim
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.qkv = nn.Linear(config.d_model, 3 * config.attn_dim, bias=False)
        self.out = nn.Linear(config.attn_dim, config.d_model, bias=False)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None = None, layer: int = 0
    ) -> torch.Tensor:
        return self.from_normalized(rmsnorm_unit(h, self.norm.eps), cos, sin, cache, layer)

    def from_normalized(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None = None, layer: int = 0
    ) -> torch.Tensor:
        """The sublayer after its PreNorm's normalisation: x = rmsnorm_unit(h) [B, T, D]. With ``cache``, x holds
        positions cache.length .. + T - 1, which attend to every cached position and causally among themselves."""
        B, T, _ = x.shape
        start = 0 if cache is None else cache.length
        q, k, v = self.qkv(self.norm.scale(x)).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        cos, sin = cos[start : start + T], sin[start : start + T]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # [B, H, T, hd]
        if cache is not None:
            k, v = cache.update(layer, k, v)  # [B, H, start + T, hd]
        mask = None  # causal from position 0 (is_causal), or one new token that sees everything
        if start and T > 1:  # new positions i see cached ones and new ones up to i: [T, start + T]
            mask = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(start)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not start and T > 1)  # [B, H, T, hd]
        return self.out(y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    """f(h) = W_down (silu(W_gate n) * W_up n), with n = RMSNorm(h)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        assert config.d_ff is not None  # set by ModelConfig.__post_init__
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.gate_up = nn.Linear(config.d_model, 2 * config.d_ff, bias=False)
        self.down = nn.Linear(config.d_ff, config.d_model, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.from_normalized(rmsnorm_unit(h, self.norm.eps))

    def from_normalized(self, x: torch.Tensor) -> torch.Tensor:
        """The sublayer after its PreNorm's normalisation: x = rmsnorm_unit(h) [B, T, D]."""
        gate, up = self.gate_up(self.norm.scale(x)).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class TransformerBlock(nn.Module):
    """One attention and one MLP sublayer (sublayers 2i and 2i+1). The residual scheme decides what each reads."""

    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        self.index = index
        self.attn = CausalSelfAttention(config)
        self.mlp: SwiGLU | MoEFeedForward = MoEFeedForward(config) if config.ffn == "moe" else SwiGLU(config)
        # Recompute each sublayer in backward instead of storing its internals. Only the sublayers are
        # checkpointed (pure functions of h); the residual scheme's bookkeeping runs once, never replayed.
        self.activation_checkpointing = False
        # Regional compilation (Transformer.compile_regions): compiled (attention, MLP) from_normalized, each
        # called with its module; shared by every block, so they compile once.
        self.compiled: tuple[Callable, Callable] | None = None

    def _run(self, fn, *args):
        if self.activation_checkpointing and torch.is_grad_enabled():
            return checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)

    def forward(
        self,
        state,
        residual: ResidualScheme,
        cos: torch.Tensor,
        sin: torch.Tensor,
        probe=None,
        cache: KVCache | None = None,
    ):
        """Run sublayers 2i (attention) and 2i+1 (MLP); the residual scheme forms their inputs. With ``cache``
        (decoding) the attention reads and extends it, and the sublayers run eagerly."""
        attn, mlp = self.attn.from_normalized, self.mlp.from_normalized
        if self.compiled is not None and cache is None:
            attn, mlp = (functools.partial(f, m) for f, m in zip(self.compiled, (self.attn, self.mlp)))
        decoding = () if cache is None else (cache, self.index)
        self._sublayer(2 * self.index, self.attn, attn, state, residual, probe, cos, sin, *decoding)
        self._sublayer(2 * self.index + 1, self.mlp, mlp, state, residual, probe)
        return state

    def _sublayer(
        self,
        l: int,
        sublayer: CausalSelfAttention | SwiGLU | MoEFeedForward,
        from_normalized: Callable,
        state,
        residual: ResidualScheme,
        probe,
        *args,
    ) -> None:
        if probe is None:
            # The read and the sublayer's PreNorm normalisation in one step: a depth-mixing scheme then keeps its
            # sources for backward, not the read h as well (attnres.depth.mix_sources).
            x = residual.read_normalized(state, l, sublayer.norm.eps)
            out = self._run(from_normalized, x, *args)
        else:  # diagnostics need the read h itself
            h = residual.read(state, l)
            out = self._run(sublayer, h, *args)
            probe(l, h, out)
        residual.write(state, l, out)


class Transformer(nn.Module):
    # diagnostics of a recording forward (set there): RMS of every read's input and of every sublayer's output
    _read_rms: list[torch.Tensor]
    _out_rms: list[torch.Tensor]

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(TransformerBlock(config, i) for i in range(config.n_layers))
        self.residual = build_residual(config)
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        assert config.head_dim is not None  # set by ModelConfig.__post_init__
        cos, sin = rope_tables(config.head_dim, config.max_seq_len, config.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.record_diagnostics = False
        self.diagnostics: dict[str, torch.Tensor] = {}
        self.moe = moe_layers(self)  # the MoE sublayers (ffn="moe"), empty for a dense model
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2/nanoGPT init: N(0, 0.02); projections back into the residual stream scaled by 1/sqrt(2 L_b);
        norms at one; AttnRes pseudo-queries at zero (each scheme resets its own parameters)."""
        std = self.config.init_std
        out_std = std / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            if name.startswith("residual.") or (".mlp." in name and self.config.ffn == "moe"):
                continue
            if p.dim() == 1:  # RMSNorm gains
                nn.init.ones_(p)
            elif name.endswith(("attn.out.weight", "mlp.down.weight")):
                nn.init.normal_(p, std=out_std)
            else:
                nn.init.normal_(p, std=std)
        for moe in self.moe:
            moe.reset_parameters(std, out_std)
        if hasattr(self.residual, "reset_parameters"):
            self.residual.reset_parameters()  # type: ignore[operator]  # a scheme's method, not a Module attribute

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None):
        """idx [B, T] token ids -> logits [B, T, V]; with targets [B, T] returns (logits, mean cross-entropy).

        With ``cache`` (new_cache()), idx continues the tokens the cache holds: positions cache.length .. + T - 1
        (T > 1 at the start: prefill; one token later: decode). Their logits equal those of a forward over all the
        tokens at once (tests/test_model.py)."""
        _B, T = idx.shape
        start = 0 if cache is None else cache.length
        if start + T > self.config.max_seq_len:
            raise ValueError(f"sequence length {start + T} exceeds ModelConfig.max_seq_len={self.config.max_seq_len}")
        recording = self.record_diagnostics
        self.residual.record = recording
        probe = self._probe if recording else None
        if recording:
            self._read_rms, self._out_rms = [], []

        x = self.tok_emb(idx)  # [B, T, D]
        state = self.residual.begin(x)
        for block in self.blocks:
            state = block(state, self.residual, self.rope_cos, self.rope_sin, probe, cache)
        if cache is not None:
            cache.length += T
        aux_loss = self._moe_bookkeeping()
        if recording:
            h = self.residual.final(state)  # [B, T, D] final depth-wise read
            self._read_rms.append(h.detach().float().pow(2).mean().sqrt())
            self._collect_diagnostics()
            x = rmsnorm_unit(h, self.norm.eps)
        else:
            x = self.residual.final_normalized(state, self.norm.eps)  # [B, T, D] the final read, normalised
        logits = self.lm_head(self.norm.scale(x))  # [B, T, V]

        if targets is None:
            return logits
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        if aux_loss is not None:
            loss = loss + aux_loss
        return logits, loss

    # ---- mixture of experts (ffn="moe") -------------------------------------------------------------------------
    def _moe_bookkeeping(self) -> torch.Tensor | None:
        """After a forward of an MoE model in training mode: add each MoE sublayer's token counts to its ``load``
        (read by update_moe_bias) and return the sum of their balance losses (None when the model is dense, in
        eval mode, or aux_loss_alpha = 0). Done here, not in the sublayer, so that an activation-checkpointed
        sublayer recomputed in backward counts its tokens once."""
        if not self.moe or not self.training:
            return None
        for moe in self.moe:
            assert moe.last_load is not None  # set by the forward that just ran
            moe.load.add_(moe.last_load)
        if self.config.moe_options.aux_loss_alpha == 0:
            return None
        return torch.stack([m.last_aux_loss for m in self.moe if m.last_aux_loss is not None]).sum()

    def update_moe_bias(self) -> None:
        """Once per optimizer step: every MoE sublayer's auxiliary-loss-free bias update from the load counted
        since the last call (MoEFeedForward.update_bias). Nothing for a dense model."""
        for moe in self.moe:
            moe.update_bias()

    # ---- diagnostics (paper Fig. 5 and Fig. 8) ------------------------------------------------------------
    def _probe(self, l: int, h: torch.Tensor, out: torch.Tensor) -> None:
        self._read_rms.append(h.detach().float().pow(2).mean().sqrt())
        self._out_rms.append(out.detach().float().pow(2).mean().sqrt())

    def _collect_diagnostics(self) -> None:
        read_rms = torch.stack(self._read_rms).cpu()  # [L + 1]: RMS of the input of every read
        self.diagnostics = {
            "read_rms": read_rms,
            "sublayer_output_rms": torch.stack(self._out_rms).cpu(),  # [L]
            # hidden state leaving transformer block i = what the next read (2i + 2, or the final read) returns
            "block_output_rms": read_rms[2::2].clone(),  # [L_b]
        }
        weights = self.residual.depth_weights()
        if weights is not None:
            self.diagnostics["depth_weights"] = weights  # [L + 1, n_sources]
        self._read_rms, self._out_rms = [], []

    # ---- inference ---------------------------------------------------------------------------------------------
    def new_cache(self, max_len: int | None = None) -> KVCache:
        """An empty KVCache for up to max_len positions (default max_seq_len)."""
        return KVCache(self.config.n_layers, max_len or self.config.max_seq_len)

    @torch.inference_mode()
    def generate(
        self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.0, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """idx [B, T] followed by max_new_tokens tokens, [B, T + max_new_tokens]: greedy at temperature 0, else
        sampled from softmax(logits / temperature). One forward over the prompt fills a KV cache (prefill), then
        one forward per new token (decode)."""
        cache = self.new_cache(idx.shape[1] + max_new_tokens)
        logits = self(idx, cache=cache)
        tokens = [idx]
        for i in range(max_new_tokens):
            last = logits[:, -1].float()  # [B, V]
            if temperature > 0:
                nxt = torch.multinomial((last / temperature).softmax(-1), 1, generator=generator)
            else:
                nxt = last.argmax(-1, keepdim=True)  # [B, 1]
            tokens.append(nxt)
            if i + 1 < max_new_tokens:
                logits = self(nxt, cache=cache)
        return torch.cat(tokens, dim=1)

    # ---- compilation ---------------------------------------------------------------------------------------------
    def compile_regions(self, **options) -> None:
        """Regional compilation: torch.compile the attention and the MLP sublayer (from their PreNorm's normalised
        input on), once each, shared by every transformer block (so compile time does not grow with depth); the
        residual scheme between them stays eager (on CUDA, the depth mixing's Triton kernels). ``options`` go to
        torch.compile. Training and full forwards use them; decoding with a cache runs the sublayers eagerly."""
        attn = torch.compile(CausalSelfAttention.from_normalized, **options)
        mlp = torch.compile(MoEFeedForward.from_normalized if self.moe else SwiGLU.from_normalized, **options)
        for block in cast("Iterable[TransformerBlock]", self.blocks):
            block.compiled = (attn, mlp)

    def read_kinds(self) -> list[str]:
        return ["attn", "mlp"] * self.config.n_layers + ["final"]

    def set_activation_checkpointing(self, enabled: bool) -> None:
        for block in cast("Iterable[TransformerBlock]", self.blocks):
            block.activation_checkpointing = enabled

    # ---- bookkeeping ----------------------------------------------------------------------------------------
    def num_params(self, non_embedding: bool = False, activated: bool = False) -> int:
        """All parameters, or (Kaplan's N) those outside the token embedding and the LM head; ``activated``: only
        those one token uses (an MoE model's k of E routed experts; the router and shared experts count)."""
        n = sum(p.numel() for p in self.parameters())  # a tied head is counted once
        if activated:
            n -= sum(moe.inactive_params() for moe in self.moe)
        if non_embedding:
            n -= self.tok_emb.weight.numel()
            if not self.config.tie_embeddings:
                n -= self.lm_head.weight.numel()
        return n
