"""Peer residual schemes, behind the same begin/read/write/final interface as baseline / Full / Block AttnRes.

    denseformer  DenseFormer (Pagliardini et al. 2024): a depth-weighted average (DWA) of the embedding and all
                 transformer-block outputs after every block; identity init (= PreNorm at step 0).
    hyper        Hyper-Connections (Zhu et al., ICLR 2025): n residual streams, static (SHC) or dynamic (DHC)
                 width/depth connections per sublayer; init = PreNorm at step 0.
    mhc          Manifold-constrained HC (Xie et al. 2025): HC with sigmoid read/write gates and a Sinkhorn-Knopp
                 doubly-stochastic stream mixer computed from RMSNorm(vec H).
    laurel       LAuReL (Menghani et al., ICML 2025): learned residual weights (RW) and/or a low-rank term on
                 the residual (LR); init = PreNorm at step 0.

Formulas and initialisations follow the cited papers and their reference code. Each scheme's options are a
SchemeOptions dataclass next to it (``model.residual_options`` in the configs). Every parameter lives in the
scheme module, i.e. under ``residual.`` in the model, where the trainer's weight decay default (none) applies.
Sublayer index k = l runs over all L = 2 * n_layers sublayers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig
from .depth import mix_sources, rms_normalize
from .registry import SchemeOptions, option, register
from .residual import ResidualScheme


def _fp32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DenseFormerOptions(SchemeOptions):
    """``dilation`` k: a DWA averages the sources j with (i - j) % k == 0; ``period`` p: a DWA follows the blocks
    i with i % p == 0 (1 x 1 = the dense DenseFormer)."""

    dilation: int = option(1, minimum=1)
    period: int = option(1, minimum=1)


@register("denseformer")
class DenseFormer(ResidualScheme):
    """DenseFormer: after transformer block i (attention + MLP with their ordinary residual adds), the stream is
    replaced by the depth-weighted average Y_i = sum_j a_ij X_j of the embedding X_0 and the block outputs
    X_1 .. X_i (X_i = the stream leaving block i, a full hidden state, not a delta).

    Options (the paper's sparsity): ``dilation`` k keeps sources j with (i - j) % k == 0; ``period`` p applies a DWA
    only after blocks i with i % p == 0 (1 x 1 = the dense DenseFormer). Weights are free scalars (no softmax,
    they may go negative), initialised to 1 on X_i and 0 elsewhere, so step 0 is exactly the PreNorm baseline.

    dwa[str(i)]  [n_i]  the weights of the DWA after block i, over its sources in increasing j.
    """

    Options = DenseFormerOptions
    options: DenseFormerOptions

    @dataclass
    class State:
        x: torch.Tensor  # [B, T, D] the stream the next sublayer reads
        outputs: list[torch.Tensor] = field(default_factory=list)  # X_0 = embedding, X_1 .. block outputs

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.dilation, self.period = self.options.dilation, self.options.period
        self.dwa = nn.ParameterDict(
            {
                str(i): nn.Parameter(torch.zeros(len(self.dwa_sources(i, self.dilation))))
                for i in self.dwa_blocks(config.n_layers, self.period)
            }
        )
        self.reset_parameters()

    @staticmethod
    def dwa_blocks(n_layers: int, period: int) -> list[int]:
        """Blocks (1-based) followed by a DWA."""
        return [i for i in range(1, n_layers + 1) if i % period == 0]

    @staticmethod
    def dwa_sources(i: int, dilation: int) -> list[int]:
        """Outputs X_j averaged after block i (j = 0 is the embedding)."""
        return [j for j in range(i + 1) if (i - j) % dilation == 0]

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for w in self.dwa.values():
                w.zero_()
                w[-1] = 1.0  # the last source is X_i itself: identity

    @classmethod
    def mixing_flops(cls, config: ModelConfig) -> float:
        """2*D per (DWA, source) pair."""
        o = config.options
        assert isinstance(o, DenseFormerOptions)  # config.residual is this scheme
        pairs = sum(len(cls.dwa_sources(i, o.dilation)) for i in cls.dwa_blocks(config.n_layers, o.period))
        return 2.0 * config.d_model * pairs

    def begin(self, embedding: torch.Tensor) -> State:
        if self.record:
            self._record(0, torch.ones(1, 1, 1))  # read 0 is the embedding alone
        return self.State(x=embedding, outputs=[embedding])

    def read(self, state: State, l: int) -> torch.Tensor:
        return state.x

    def write(self, state: State, l: int, out: torch.Tensor) -> None:
        state.x = state.x + out
        if l % 2 == 0:  # attention sublayer: the block is not finished
            return
        i = l // 2 + 1  # transformer block i (1-based) just finished
        state.outputs.append(state.x)
        if i % self.period:
            if self.record:
                self._record(l + 1, torch.ones(1, 1, 1), sources=[i])
            return
        sources = self.dwa_sources(i, self.dilation)
        weights = self.dwa[str(i)]  # [n_i]
        if self.record:
            self._record(l + 1, weights.view(-1, 1, 1), sources=sources)  # read 2i reads Y_i
        B, T, _ = state.x.shape
        state.x = mix_sources(
            weights.view(-1, 1, 1).expand(len(sources), B, T), [state.outputs[j] for j in sources]
        )  # Y_i [B, T, D]

    def final(self, state: State) -> torch.Tensor:
        return state.x  # Y_{L_b}: the last block is followed by its DWA when L_b % period == 0

    def source_labels(self) -> list[str]:
        return ["emb"] + [f"block{i}" for i in range(1, self.config.n_layers + 1)]


# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HyperConnectionsOptions(SchemeOptions):
    """``n``: the expansion rate (residual streams); ``dynamic``: DHC (True) or SHC (False)."""

    n: int = option(4, minimum=1)
    dynamic: bool = True


@register("hyper")
class HyperConnections(ResidualScheme):
    """Hyper-Connections (paper §2 and Appendix J). The residual is a hyper hidden matrix H [B, T, n, D] of n
    streams, H_0 = n copies of the embedding. Around sublayer k, with the matrix [[0, B], [A_m, A_r]]:

        x_in = A_m^T H                    (width connection: the sublayer input, [B, T, D])
        H'   = A_r^T H + B^T f_k(x_in)    (A_r mixes the streams, B writes the output into each stream)

    and the final read sums the streams. Dynamic HC (option ``dynamic``, default True) adds input-dependent
    corrections from Hbar = LayerNorm_k(H) (each stream normalised on its own):

        A_m(H) = A_m + s_a tanh(Hbar W_m),  A_r(H) = A_r + s_a tanh(Hbar W_r),  B(H) = B + s_b tanh(Hbar W_b)

    Init (§2.3): A_m = e_{k mod n}, A_r = I, B = 1, W = 0, s_a = s_b = 0.01. Every stream then holds exactly the
    PreNorm residual stream, each sublayer reads it, and the final sum is n times the baseline's last state, which
    the final RMSNorm maps to the same output (up to its eps).

    static_alpha   [L, n, n+1]  [A_m | A_r] per sublayer (row i: stream i's read weight, then its mixing row)
    static_beta    [L, n]       B
    dynamic_proj   [L, D, n+2]  [W_m | W_r | W_b] (Appendix J's dynamic_alpha_fn and dynamic_beta_fn, packed)
    dynamic_alpha_scale, dynamic_beta_scale  [L]
    norm_weight, norm_bias  [L, D]  the LayerNorm of each sublayer's dynamic branch
    """

    Options = HyperConnectionsOptions
    options: HyperConnectionsOptions

    @dataclass
    class State:
        H: torch.Tensor  # [B, T, n, D] fp32
        residual: torch.Tensor | None = None  # A_r^T H of the sublayer being run, [B, T, n, D]
        beta: torch.Tensor | None = None  # its write weights B, [B, T, n] or [n]

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        n, L, D = self.options.n, config.n_sublayers, config.d_model
        self.n, self.dynamic, self.eps = n, self.options.dynamic, config.norm_eps
        self.static_alpha = nn.Parameter(torch.empty(L, n, n + 1))
        self.static_beta = nn.Parameter(torch.empty(L, n))
        if self.dynamic:
            self.dynamic_proj = nn.Parameter(torch.empty(L, D, n + 2))
            self.dynamic_alpha_scale = nn.Parameter(torch.empty(L))
            self.dynamic_beta_scale = nn.Parameter(torch.empty(L))
            self.norm_weight = nn.Parameter(torch.empty(L, D))
            self.norm_bias = nn.Parameter(torch.empty(L, D))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.static_alpha.zero_()
            for k in range(self.config.n_sublayers):
                self.static_alpha[k, k % self.n, 0] = 1.0  # A_m = e_{k mod n}
            self.static_alpha[:, :, 1:].diagonal(dim1=-2, dim2=-1).fill_(1.0)  # A_r = I
            self.static_beta.fill_(1.0)
            if self.dynamic:
                self.dynamic_proj.zero_()
                self.dynamic_alpha_scale.fill_(0.01)
                self.dynamic_beta_scale.fill_(0.01)
                self.norm_weight.fill_(1.0)
                self.norm_bias.zero_()

    @classmethod
    def mixing_flops(cls, config: ModelConfig) -> float:
        """Per sublayer: A^T H 2n(n+1)D, the write B^T y 2nD; dynamic adds Hbar [W_m|W_r|W_b] 2nD(n+2)."""
        o = config.options
        assert isinstance(o, HyperConnectionsOptions)  # config.residual is this scheme
        n, D = o.n, config.d_model
        per_sublayer = 2.0 * n * (n + 1) * D + 2.0 * n * D
        if o.dynamic:
            per_sublayer += 2.0 * n * D * (n + 2)
        return per_sublayer * config.n_sublayers

    def begin(self, embedding: torch.Tensor) -> State:
        H = _fp32(embedding).unsqueeze(-2).expand(*embedding.shape[:-1], self.n, embedding.shape[-1])
        return self.State(H=H)

    def read(self, state: State, l: int) -> torch.Tensor:
        H = state.H  # [B, T, n, D]
        with torch.autocast(device_type=H.device.type, enabled=False):
            alpha, beta = self.static_alpha[l], self.static_beta[l]  # [n, n+1], [n]
            if self.dynamic:
                Hbar = F.layer_norm(H, H.shape[-1:], self.norm_weight[l], self.norm_bias[l], self.eps)
                dyn = torch.tanh(Hbar @ self.dynamic_proj[l])  # [B, T, n, n+2]
                alpha = alpha + self.dynamic_alpha_scale[l] * dyn[..., : self.n + 1]  # [B, T, n, n+1]
                beta = beta + self.dynamic_beta_scale[l] * dyn[..., self.n + 1]  # [B, T, n]
            mixed = alpha.transpose(-1, -2) @ H  # [B, T, n+1, D]: row 0 = A_m^T H, rows 1.. = A_r^T H
        state.residual, state.beta = mixed[..., 1:, :], beta
        return mixed[..., 0, :]

    def write(self, state: State, l: int, out: torch.Tensor) -> None:
        with torch.autocast(device_type=out.device.type, enabled=False):
            # B^T y: the outer product of the write weights [.., n, 1] and the output [B, T, 1, D]
            assert state.residual is not None  # set by the read of this sublayer
            assert state.beta is not None
            state.H = state.residual + state.beta.unsqueeze(-1) @ _fp32(out).unsqueeze(-2)
        state.residual = state.beta = None

    def final(self, state: State) -> torch.Tensor:
        return state.H.sum(dim=-2)  # [B, T, D]: the streams summed, then the model's final RMSNorm


# ---------------------------------------------------------------------------------------------------------------
def sinkhorn_knopp(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """[..., n, n] -> doubly-stochastic [..., n, n]: exp, then alternately normalise rows and columns.

    The per-matrix max is subtracted first: a common factor leaves the result unchanged and keeps exp finite."""
    M = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iters):
        M = M / M.sum(dim=-1, keepdim=True)  # rows sum to 1
        M = M / M.sum(dim=-2, keepdim=True)  # columns sum to 1
    return M


@dataclass(frozen=True)
class ManifoldHyperConnectionsOptions(SchemeOptions):
    """``n``: residual streams; ``sinkhorn_iters``: Sinkhorn-Knopp iterations t_max of the stream mixer."""

    n: int = option(4, minimum=1)
    sinkhorn_iters: int = option(20, minimum=1)


@register("mhc")
class ManifoldHyperConnections(ResidualScheme):
    """mHC (Xie et al. 2025: the equations for H^pre, H^post, H^res). Streams H [B, T, n, D] (H_0 = n copies of the
    embedding, read out as their sum, as in HC). Around sublayer k, from x' = RMSNorm(vec H) [B, T, nD]:

        H^pre  = sigmoid(a_pre  * x' phi_pre  + b_pre)          [B, T, n]    the read weights
        H^post = 2 sigmoid(a_post * x' phi_post + b_post)       [B, T, n]    the write weights
        H^res  = SinkhornKnopp(a_res * mat(x' phi_res) + b_res) [B, T, n, n] doubly stochastic (t_max iterations)
        x_in = H^pre H,      H' = H^res H + H^post^T f_k(x_in)

    Init (the mHC-lite protocol, arXiv 2601.05732 §3.3, since mHC publishes only a = 0.01): phi = 0, a = 0.01,
    b_pre = b_post = -1 except +1 on the main stream k mod n, b_res = -8 except 0 on the diagonal (H^res close to
    I). [Assumption: the main stream rotates with k as HC's A_m does.] The RMSNorm has no gain (it folds into phi).
    Not equivalent to PreNorm at step 0, and the paper does not claim it is.

    phi   [L, nD, n^2 + 2n]  columns: pre (n) | post (n) | res (n^2, row-major)
    gate  [L, 3]             a_pre, a_post, a_res
    bias  [L, n^2 + 2n]      b_pre | b_post | b_res
    """

    Options = ManifoldHyperConnectionsOptions
    options: ManifoldHyperConnectionsOptions

    @dataclass
    class State:
        H: torch.Tensor  # [B, T, n, D] fp32
        residual: torch.Tensor | None = None  # H^res H, [B, T, n, D]
        post: torch.Tensor | None = None  # H^post, [B, T, n]

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        n, L, D = self.options.n, config.n_sublayers, config.d_model
        self.n, self.iters, self.eps = n, self.options.sinkhorn_iters, config.norm_eps
        self.phi = nn.Parameter(torch.empty(L, n * D, n * n + 2 * n))
        self.gate = nn.Parameter(torch.empty(L, 3))
        self.bias = nn.Parameter(torch.empty(L, n * n + 2 * n))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        n = self.n
        with torch.no_grad():
            self.phi.zero_()
            self.gate.fill_(0.01)
            self.bias.zero_()
            self.bias[:, : 2 * n].fill_(-1.0)
            for k in range(self.config.n_sublayers):
                self.bias[k, k % n] = 1.0  # b_pre: the main stream
                self.bias[k, n + k % n] = 1.0  # b_post: the main stream
            b_res = self.bias[:, 2 * n :].unflatten(-1, (n, n))  # a view into bias
            b_res.fill_(-8.0)
            b_res.diagonal(dim1=-2, dim2=-1).fill_(0.0)

    @classmethod
    def mixing_flops(cls, config: ModelConfig) -> float:
        """Per sublayer: x' phi 2nD(n^2+2n), H^pre H 2nD, H^res H 2n^2 D, the write 2nD."""
        o = config.options
        assert isinstance(o, ManifoldHyperConnectionsOptions)  # config.residual is this scheme
        n, D = o.n, config.d_model
        return (2.0 * n * D * (n * n + 2 * n) + 2.0 * n * D + 2.0 * n * n * D + 2.0 * n * D) * config.n_sublayers

    def maps(self, H: torch.Tensor, l: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """H^pre [B, T, n], H^post [B, T, n], H^res [B, T, n, n] of sublayer l for streams H [B, T, n, D]."""
        n = self.n
        z = rms_normalize(H.flatten(-2), self.eps) @ self.phi[l]  # [B, T, n^2 + 2n]
        a_pre, a_post, a_res = self.gate[l]
        b = self.bias[l]
        pre = torch.sigmoid(a_pre * z[..., :n] + b[:n])
        post = 2 * torch.sigmoid(a_post * z[..., n : 2 * n] + b[n : 2 * n])
        res = sinkhorn_knopp((a_res * z[..., 2 * n :] + b[2 * n :]).unflatten(-1, (n, n)), self.iters)
        return pre, post, res

    def begin(self, embedding: torch.Tensor) -> State:
        H = _fp32(embedding).unsqueeze(-2).expand(*embedding.shape[:-1], self.n, embedding.shape[-1])
        return self.State(H=H)

    def read(self, state: State, l: int) -> torch.Tensor:
        H = state.H  # [B, T, n, D]
        with torch.autocast(device_type=H.device.type, enabled=False):
            pre, post, res = self.maps(H, l)
            state.residual, state.post = res @ H, post  # H^res H: [B, T, n, D]
            return (pre.unsqueeze(-2) @ H).squeeze(-2)  # H^pre H: [B, T, D]

    def write(self, state: State, l: int, out: torch.Tensor) -> None:
        with torch.autocast(device_type=out.device.type, enabled=False):
            assert state.residual is not None  # set by the read of this sublayer
            assert state.post is not None
            state.H = state.residual + state.post.unsqueeze(-1) @ _fp32(out).unsqueeze(-2)  # + H^post^T y
        state.residual = state.post = None

    def final(self, state: State) -> torch.Tensor:
        return state.H.sum(dim=-2)  # [B, T, D]


# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LAuReLOptions(SchemeOptions):
    """``form``: rw (learned residual weights), lr (low-rank term) or rw_lr (both); ``rank``: r of the low-rank term."""

    form: Literal["rw", "lr", "rw_lr"] = "rw_lr"
    rank: int = option(4, minimum=1)


@register("laurel")
class LAuReL(ResidualScheme):
    """LAuReL (Learned Augmented Residual Layer), per sublayer k, with h the stream entering it (option ``form``):

        rw:     h' = alpha_k f_k(h) + beta_k h
        lr:     h' = f_k(h) + h + (h A_k) B_k                    A_k [D, r], B_k [r, D]
        rw_lr:  h' = alpha_k f_k(h) + beta_k (h + (h A_k) B_k)   (the paper's recommended combination)

    (alpha_k, beta_k) = 2 softmax(lambda_k) with lambda_k = 0 at init, i.e. (1, 1): the paper asks for bounded
    weights without fixing the map; this is the map of the hyper-connection-factory reference code. B_k = 0 and
    A_k column-orthogonal (A_ij = 1/sqrt(r D) where i mod r == j), so step 0 is exactly the PreNorm baseline.
    """

    Options = LAuReLOptions
    options: LAuReLOptions

    @dataclass
    class State:
        h: torch.Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        L, D, r = config.n_sublayers, config.d_model, self.options.rank
        self.reweight = self.options.form in ("rw", "rw_lr")
        self.low_rank = self.options.form in ("lr", "rw_lr")
        if self.reweight:
            self.rw_logits = nn.Parameter(torch.empty(L, 2))
        if self.low_rank:
            self.lr_down = nn.Parameter(torch.empty(L, D, r))  # A
            self.lr_up = nn.Parameter(torch.empty(L, r, D))  # B
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            if self.reweight:
                self.rw_logits.zero_()
            if self.low_rank:
                D, r = self.lr_down.shape[1:]
                self.lr_down.zero_()
                for j in range(r):
                    self.lr_down[:, j::r, j] = 1.0 / math.sqrt(r * D)
                self.lr_up.zero_()

    @classmethod
    def mixing_flops(cls, config: ModelConfig) -> float:
        """Per sublayer: the low-rank term 4*D*r; the reweighting alpha f + beta g, 2 MACs per channel (4*D)."""
        o = config.options
        assert isinstance(o, LAuReLOptions)  # config.residual is this scheme
        per_sublayer = 0.0
        if o.form in ("lr", "rw_lr"):
            per_sublayer += 4.0 * config.d_model * o.rank
        if o.form in ("rw", "rw_lr"):
            per_sublayer += 4.0 * config.d_model
        return per_sublayer * config.n_sublayers

    def begin(self, embedding: torch.Tensor) -> State:
        return self.State(h=embedding)

    def read(self, state: State, l: int) -> torch.Tensor:
        return state.h

    def write(self, state: State, l: int, out: torch.Tensor) -> None:
        h = state.h
        if self.low_rank:
            h = h + (h @ self.lr_down[l].to(h.dtype)) @ self.lr_up[l].to(h.dtype)  # [B, T, D]
        if self.reweight:
            alpha, beta = 2 * self.rw_logits[l].softmax(-1)
            state.h = alpha * out + beta * h
        else:
            state.h = out + h
