"""The rules behind conf/size/*.yaml: how d_ff, the token budgets and the arch-grid shapes were chosen.

    python -m experiments.sizes          # prints every size (N, d_ff rule, tokens, FLOPs/token, C) and the
                                         # shapes of the arch_grid studies (paper Fig. 7) with their tokens at C
                                         # (experiments/sizes/__main__.py)

Non-embedding parameters (Kaplan's N = ``Transformer.num_params(non_embedding=True)``: everything except the
token embedding and the LM head) of the *baseline* with SwiGLU MLPs, a = n_heads * head_dim:

    N = L_b * (4 a d + 3 d d_ff + 2 d) + d        q,k,v,o + gate/up/down + two RMSNorm gains per block + final norm

so for a target N (the paper's activated-parameter column for the paper sizes, a geometric ladder for the CPU
sizes) d_ff = (N - d - L_b (4 a d + 2 d)) / (3 d L_b), rounded to a multiple of ``multiple``. AttnRes adds
(4 L_b + 2) d parameters (a query and a key-norm gain per read), which is below 0.05% at every size here.

The CPU ladder (conf/size/cpu_xs, cpu_s, cpu_m, cpu_l, cpu_xl.yaml; experiment/cpu_ladder.yaml; how it was chosen
and what limits its precision: docs/results/cpu_ladder/design.md) is a depth ladder (AttnRes acts along depth):
L_b = 4..8 transformer blocks on a residual stream of width d = 32 (2 heads x head_dim 16), context 128, byte
vocabulary (256). The default study trains the first four sizes (cpu_xs..cpu_l); cpu_xl is the fifth rung
(``python -m sweeps.study cpu5``). Its rules (checked by tests/test_configs.py):

  * target non-embedding parameters form a geometric ladder, N_target = 48,000 x 1.25^i (i = 0..4);
  * d_ff is solved for N_target with the equation above (:func:`solve_d_ff`, multiple of 8);
  * batch 4 x 128 = 512 tokens per step (small batches win both loss and seed noise at this scale);
  * tokens = 9 x N_target, rounded to whole batches by the trainer (844..2,060 steps): the most that fits the
    study's 30-minute budget, since seed noise falls steeply with training length here;
  * lr: tuned per size by the LR study (conf/sweep/cpu_lr.yaml), read from the generated conf/tuned_lr/cpu.yaml.

MoE sizes (conf/size/paper_<N>_moe.yaml, cpu_moe.yaml; ffn: moe, docs/moe.md): the paper's own d_ff column is
the routed experts' width, so the one free width is the shared expert's: :func:`solve_shared_d_ff` solves it so
that the *activated* non-embedding parameters (:func:`moe_activated_non_embedding`: router and shared expert
included, k of the E routed experts) match the target (Table 2 within 1%; checked by tests/test_configs.py).

Derived shapes (conf/size/paper_arch.yaml, cpu_arch.yaml; the arch_grid study, paper Fig. 7): a size given by
(target N, r = d/L_b, h = H/L_b, head_dim, f = d_ff/d) gets its integer shape from :func:`derive_arch_shape`.
Fixed-compute budgets: :func:`steps_for_budget` turns a FLOP budget C into whole optimizer steps.

Plain arithmetic (no Hydra, no torch): the config checks and the ``attnres_arch`` resolver build on it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass


def baseline_non_embedding(n_layers: int, d_model: int, attn_dim: int, d_ff: int) -> int:
    d = d_model
    return n_layers * (4 * attn_dim * d + 3 * d * d_ff + 2 * d) + d


def solve_d_ff(n_layers: int, d_model: int, attn_dim: int, target: float, multiple: int = 16) -> int:
    """The d_ff (a multiple of `multiple`) whose baseline N is closest to `target`."""
    d = d_model
    exact = (target - d - n_layers * (4 * attn_dim * d + 2 * d)) / (3 * d * n_layers)
    lo = max(multiple, multiple * math.floor(exact / multiple))
    return min((lo, lo + multiple), key=lambda f: abs(baseline_non_embedding(n_layers, d, attn_dim, f) - target))


def moe_activated_non_embedding(
    n_layers: int, d_model: int, attn_dim: int, d_ff: int, n_experts: int, top_k: int, shared_width: int
) -> int:
    """Activated non-embedding parameters of the MoE baseline (ffn="moe"): per block q,k,v,o + router (d E) +
    k routed experts (3 d d_ff each) + the shared experts (3 d S, S = n_shared * shared_d_ff) + two RMSNorm gains,
    plus the final norm (= Transformer.num_params(non_embedding=True, activated=True))."""
    d = d_model
    per_block = 4 * attn_dim * d + d * n_experts + 3 * d * d_ff * top_k + 3 * d * shared_width + 2 * d
    return n_layers * per_block + d


def solve_shared_d_ff(
    n_layers: int,
    d_model: int,
    attn_dim: int,
    d_ff: int,
    n_experts: int,
    top_k: int,
    n_shared: int,
    target: float,
    multiple: int = 16,
) -> int:
    """The shared-expert width (each of ``n_shared``, a multiple of `multiple`) whose activated MoE N is closest to
    `target`: the MoE sizes' one free width, since Table 2's d_ff is the routed experts' (docs/moe.md)."""

    def n_of(width: int) -> int:
        return moe_activated_non_embedding(n_layers, d_model, attn_dim, d_ff, n_experts, top_k, n_shared * width)

    d = d_model
    exact = (target - n_of(0)) / (3 * d * n_layers * n_shared)
    lo = max(multiple, multiple * math.floor(exact / multiple))
    return min((lo, lo + multiple), key=lambda w: abs(n_of(w) - target))


def steps_for(tokens: float, batch_size: int, seq_len: int) -> int:
    """Optimizer steps of a run: the token budget rounded to whole batches (at least one)."""
    return max(1, round(tokens / (batch_size * seq_len)))


def steps_for_budget(flops_budget: float, flops_per_token: float, batch_size: int, seq_len: int) -> int:
    """Optimizer steps of a fixed-compute run: D = C / C_token tokens, rounded to whole batches (at least one)."""
    if not (flops_budget > 0 and flops_per_token > 0):
        raise ValueError(f"flops_budget={flops_budget!r} and flops_per_token={flops_per_token!r} must be > 0")
    return steps_for(flops_budget / flops_per_token, batch_size, seq_len)


# ---------------------------------------------------------------------------------------------------------
# Derived shapes: (N, d/L_b, H/L_b, head_dim, d_ff/d) -> (L_b, d_model, n_heads, d_ff)

ARCH_SHAPE_FIELDS = ("n_layers", "d_model", "n_heads", "d_ff", "params")
# How much a relative error in N counts against one in a ratio: N is the quantity the grid holds fixed.
_PARAMS_WEIGHT = 3.0


@dataclass(frozen=True)
class ArchShape:
    """An integer model shape derived from targets, with what it achieves (N = baseline non-embedding params)."""

    n_layers: int
    d_model: int
    n_heads: int
    head_dim: int
    d_ff: int
    params: int
    target_params: float
    d_over_lb: float
    heads_over_lb: float
    ff_ratio: float

    @property
    def params_error(self) -> float:
        """Achieved N / target N - 1."""
        return self.params / self.target_params - 1

    @property
    def achieved_d_over_lb(self) -> float:
        return self.d_model / self.n_layers

    @property
    def achieved_heads_over_lb(self) -> float:
        return self.n_heads / self.n_layers

    @property
    def achieved_ff_ratio(self) -> float:
        return self.d_ff / self.d_model

    def to_dict(self) -> dict[str, float]:
        return {
            **asdict(self),
            "params_error": self.params_error,
            "achieved_d_over_lb": self.achieved_d_over_lb,
            "achieved_heads_over_lb": self.achieved_heads_over_lb,
            "achieved_ff_ratio": self.achieved_ff_ratio,
        }


def _continuous_depth(target: float, r: float, h: float, head_dim: int, f: float) -> float:
    """The real L_b with N(L_b) = target when d = r L_b, H = h L_b, d_ff = f d (N is increasing in L_b)."""

    def n(lb: float) -> float:
        d = r * lb
        return lb * (4 * head_dim * h * lb * d + 3 * f * d * d + 2 * d) + d

    lo, hi = 1e-3, 1.0
    while n(hi) < target:
        hi *= 2
    for _ in range(100):  # bisection in log space: ~1e-30 relative width, far below integer rounding
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if n(mid) < target else (lo, mid)
    return math.sqrt(lo * hi)


@functools.lru_cache(maxsize=4096)
def derive_arch_shape(
    target_params: float,
    d_over_lb: float,
    heads_over_lb: float,
    head_dim: int,
    ff_ratio: float,
    d_multiple: int = 16,
    ff_multiple: int = 16,
) -> ArchShape:
    """The integer shape closest to the targets (paper Fig. 7's grid cells, our dense SwiGLU proxy).

    Targets: non-embedding parameters N of the baseline, r = d_model / L_b, h = n_heads / L_b (heads of fixed
    width head_dim, so the attention width a = head_dim * H is not tied to d_model) and f = d_ff / d_model, with

        N = L_b (4 a d + 3 d d_ff + 2 d) + d.

    The shape returned minimises the sum of squared relative errors, with N weighted 3x since N is what the grid
    holds fixed (primes: achieved; ties go to the smaller shape):

        (3 ln(N' / N))^2 + ln(r' / r)^2 + ln(h' / h)^2 + ln(f' / f)^2

    over integer L_b within 2 of the continuous solution L_b* (d = r L_b, H = h L_b, d_ff = f d); H = floor or
    ceil of h L_b (at least 1); d a multiple of ``d_multiple`` between r L_b and the d that gives N at d_ff = f d
    (one multiple beyond each); d_ff a multiple of ``ff_multiple`` between f d and the d_ff that gives N exactly
    (the minimiser over d_ff lies between those two, each term being monotone on either side of it).
    """
    for key, value in (
        ("target_params", target_params),
        ("d_over_lb", d_over_lb),
        ("heads_over_lb", heads_over_lb),
        ("ff_ratio", ff_ratio),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"size.{key}={value!r} must be a positive number")
    for key, value in (("head_dim", head_dim), ("d_multiple", d_multiple), ("ff_multiple", ff_multiple)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"size.{key}={value!r} must be a positive integer")
    target, r, h, f = float(target_params), float(d_over_lb), float(heads_over_lb), float(ff_ratio)
    lb_star = _continuous_depth(target, r, h, head_dim, f)
    best: tuple[tuple[float, int, int, int, int], ArchShape] | None = None
    for lb in range(max(1, math.floor(lb_star) - 2), math.ceil(lb_star) + 3):
        for heads in sorted({max(1, math.floor(h * lb)), max(1, math.ceil(h * lb))}):
            a = heads * head_dim
            # N = 3 f L_b d^2 + (4 a L_b + 2 L_b + 1) d at d_ff = f d: the positive root
            qa, qb = 3 * f * lb, 4 * a * lb + 2 * lb + 1
            d_n = (-qb + math.sqrt(qb * qb + 4 * qa * target)) / (2 * qa)
            lo, hi = sorted((d_n, r * lb))
            for d in range(
                d_multiple * max(1, math.floor(lo / d_multiple) - 1),
                d_multiple * (math.ceil(hi / d_multiple) + 1) + 1,
                d_multiple,
            ):
                ff_n = (target - d - lb * (4 * a * d + 2 * d)) / (3 * d * lb)  # N exact
                ff_lo, ff_hi = sorted((f * d, ff_n))
                for d_ff in range(
                    ff_multiple * max(1, math.floor(ff_lo / ff_multiple)),
                    ff_multiple * max(1, math.ceil(ff_hi / ff_multiple)) + 1,
                    ff_multiple,
                ):
                    n = baseline_non_embedding(lb, d, a, d_ff)
                    cost = (
                        (_PARAMS_WEIGHT * math.log(n / target)) ** 2
                        + math.log(d / lb / r) ** 2
                        + math.log(heads / lb / h) ** 2
                        + math.log(d_ff / d / f) ** 2
                    )
                    rank = (cost, lb, d, heads, d_ff)
                    if best is None or rank < best[0]:
                        best = (rank, ArchShape(lb, d, heads, head_dim, d_ff, n, target, r, h, f))
    assert best is not None  # every (L_b, H) yields at least one (d, d_ff)
    return best[1]


# ---------------------------------------------------------------------------------------------------------
# Depth-by-width map cells (conf/size/cpu_map.yaml; the map study, docs/results/cpu_map/): (L_b, d_model) -> shape

MAP_CELL_FIELDS = ("n_heads", "d_ff", "params", "n_blocks")
MAP_HEAD_DIM = 16  # the CPU ladder's head width: heads grow with the width (d 32: 2 heads, 64: 4, 128: 8)
MAP_FF_RATIO = 2.5  # the CPU ladder's d_ff / d_model (80 / 32)
MAP_MAX_BLOCKS = 8  # Block AttnRes' N: the paper's 8 blocks, or one block per transformer block below L_b = 8


@dataclass(frozen=True)
class MapCell:
    """The shape of a map cell: ``n_heads = d_model / head_dim`` (head_dim 16 in the map; L_b on the deep ladder,
    2 heads), ``d_ff = 2.5 d_model`` (a multiple of 8), N by the baseline formula above, and Block AttnRes'
    ``n_blocks = min(8, L_b)`` (S = 2 sublayers per block up to L_b = 8, as in the CPU ladder at L_b = 4;
    S = 2 L_b / 8 above, as in the paper)."""

    n_layers: int
    d_model: int
    n_heads: int
    d_ff: int
    params: int
    n_blocks: int


def map_cell(n_layers: int, d_model: int, head_dim: int = MAP_HEAD_DIM) -> MapCell:
    if n_layers < 1 or head_dim < 1 or d_model <= 0 or d_model % head_dim:
        raise ValueError(
            f"map cell L_b={n_layers}, d_model={d_model}, head_dim={head_dim}: L_b must be >= 1 and d_model a "
            f"positive multiple of the head width"
        )
    n_heads = d_model // head_dim
    d_ff = 8 * round(MAP_FF_RATIO * d_model / 8)
    params = baseline_non_embedding(n_layers, d_model, n_heads * head_dim, d_ff)
    return MapCell(n_layers, d_model, n_heads, d_ff, params, min(MAP_MAX_BLOCKS, n_layers))
