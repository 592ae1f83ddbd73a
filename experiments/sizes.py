"""The rules behind conf/size/*.yaml, executable: how d_ff, the token budgets and the arch-grid shapes were chosen.

    python -m experiments.sizes          # prints every size (N, d_ff rule, tokens, FLOPs/token, C) and the
                                         # shapes of the arch_grid studies (paper Fig. 7) with their tokens at C

Non-embedding parameters (Kaplan's N = ``Transformer.num_params(non_embedding=True)``: everything except the
token embedding and the LM head) of the *baseline* with SwiGLU MLPs, a = n_heads * head_dim:

    N = L_b * (4 a d + 3 d d_ff + 2 d) + d        q,k,v,o + gate/up/down + two RMSNorm gains per block + final norm

so for a target N (the paper's activated-parameter column for the paper sizes, a geometric ladder for the CPU
sizes) d_ff = (N - d - L_b (4 a d + 2 d)) / (3 d L_b), rounded to a multiple of ``multiple``. AttnRes adds
(4 L_b + 2) d parameters (a query and a key-norm gain per read), which is below 0.05% at every size here.

Derived shapes (conf/size/paper_arch.yaml, cpu_arch.yaml; the arch_grid study, paper Fig. 7): a size given by
(target N, r = d/L_b, h = H/L_b, head_dim, f = d_ff/d) gets its integer shape from :func:`derive_arch_shape`.
Fixed-compute budgets: :func:`steps_for_budget` turns a FLOP budget C into whole optimizer steps.
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
        return {**asdict(self), "params_error": self.params_error, "achieved_d_over_lb": self.achieved_d_over_lb,
                "achieved_heads_over_lb": self.achieved_heads_over_lb, "achieved_ff_ratio": self.achieved_ff_ratio}


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
def derive_arch_shape(target_params: float, d_over_lb: float, heads_over_lb: float, head_dim: int, ff_ratio: float,
                      d_multiple: int = 16, ff_multiple: int = 16) -> ArchShape:
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
    for key, value in (("target_params", target_params), ("d_over_lb", d_over_lb), ("heads_over_lb", heads_over_lb),
                       ("ff_ratio", ff_ratio)):
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
            for d in range(d_multiple * max(1, math.floor(lo / d_multiple) - 1),
                           d_multiple * (math.ceil(hi / d_multiple) + 1) + 1, d_multiple):
                ff_n = (target - d - lb * (4 * a * d + 2 * d)) / (3 * d * lb)  # N exact
                ff_lo, ff_hi = sorted((f * d, ff_n))
                for d_ff in range(ff_multiple * max(1, math.floor(ff_lo / ff_multiple)),
                                  ff_multiple * max(1, math.ceil(ff_hi / ff_multiple)) + 1, ff_multiple):
                    n = baseline_non_embedding(lb, d, a, d_ff)
                    cost = ((_PARAMS_WEIGHT * math.log(n / target)) ** 2 + math.log(d / lb / r) ** 2
                            + math.log(heads / lb / h) ** 2 + math.log(d_ff / d / f) ** 2)
                    key = (cost, lb, d, heads, d_ff)
                    if best is None or key < best[0]:
                        best = (key, ArchShape(lb, d, heads, head_dim, d_ff, n, target, r, h, f))
    assert best is not None  # every (L_b, H) yields at least one (d, d_ff)
    return best[1]


ARCH_SWEEPS = ("arch_grid", "cpu_arch_grid")  # conf/sweep/: the Fig. 7 grid at paper scale and on the CPU


def sweep_cells(sweep: str) -> list[dict[str, str]]:
    """Every point of conf/sweep/<sweep>.yaml's hydra.sweeper.params, as {key: value} overrides (Hydra's own
    override parser expands the values, so ranges and choice() work as they do in a real multirun)."""
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser

    cfg = compose_train([f"+sweep={sweep}"], hydra_config=True)
    params = cfg.hydra.sweeper.params or {}
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    axes = [[(o.key_or_group, str(v)) for v in (o.sweep_string_iterator() if o.is_sweep_override() else [o.value()])]
            for o in parsed]
    return [dict(point) for point in itertools.product(*axes)]


def compose_train(overrides: list[str], hydra_config: bool = False):
    """conf/train.yaml composed with overrides, as `python -m experiments.train` would (reuses an initialised
    Hydra, e.g. the tests')."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from . import train  # noqa: F401 - registers the attnres_* resolvers

    if GlobalHydra.instance().is_initialized():
        return compose("train", overrides=overrides, return_hydra_config=hydra_config)
    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose("train", overrides=overrides, return_hydra_config=hydra_config)


def arch_grid_rows(sweep: str, vocab_size: int) -> list[dict]:
    """One row per run of an arch-grid sweep: the derived shape, what it achieves, and the run's planned steps,
    tokens and compute at the sweep's flops_budget (FLOPs/token need the data's vocabulary: ``vocab_size``)."""
    from attnres import flops_per_token

    from .validation import build_model_config, planned_steps

    rows = []
    for cell in sweep_cells(sweep):
        cfg = compose_train([f"+sweep={sweep}", *(f"{k}={v}" for k, v in cell.items()), f"data.vocab_size={vocab_size}"])
        mc = build_model_config(cfg)
        s = cfg.size
        shape = derive_arch_shape(s.target_params, s.d_over_lb, s.heads_over_lb, s.head_dim, s.ff_ratio,
                                  s.d_multiple, s.ff_multiple)
        count = flops_per_token(mc, int(cfg.train.seq_len))
        fpt = count.total
        steps = planned_steps(cfg.train, fpt)
        tokens = steps * int(cfg.train.batch_size) * int(cfg.train.seq_len)
        rows.append({
            "sweep": sweep, "size": str(s.name), "variant": str(cfg.model.variant), "seed": int(cfg.seed),
            **shape.to_dict(), "params_non_embedding": round(count.six_n / 6),
            "block_size": mc.sublayers_per_block if mc.residual == "block" else None,
            "n_blocks": mc.effective_n_blocks if mc.residual == "block" else None,
            "seq_len": int(cfg.train.seq_len), "batch_size": int(cfg.train.batch_size), "lr": float(cfg.optimizer.lr),
            "flops_budget": float(cfg.train.flops_budget), "flops_per_token": fpt, "steps": steps, "tokens": tokens,
            "flops": fpt * tokens,
        })  # fmt: skip
    return rows


def _print_arch_grid(sweep: str, vocab_size: int) -> None:  # pragma: no cover - a printout
    rows = arch_grid_rows(sweep, vocab_size)
    by_size: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_size.setdefault(r["size"], {})[r["variant"]] = r
    first = rows[0]
    print(f"\n{sweep}: C = {first['flops_budget']:.3g} FLOPs per run, target N = {first['target_params']:,.0f}, "
          f"head_dim {first['head_dim']}, d_ff/d = {first['ff_ratio']}, T = {first['seq_len']}, batch "
          f"{first['batch_size']}, lr {first['lr']:g}, vocab {vocab_size:,} (FLOPs/token depend on it)")
    print(f"{'cell':22s} {'L_b':>3s} {'d':>5s} {'H':>3s} {'d_ff':>5s} {'N_base':>12s} {'err%':>5s} {'d/L_b':>6s} "
          f"{'H/L_b':>5s} {'ff/d':>5s} {'S x blk':>7s} {'MFLOP/tok':>9s} {'steps b/B':>11s} {'tokens (base)':>15s} "
          f"{'tok/N':>6s} {'C (base)':>9s}")
    for size, v in by_size.items():
        b = v.get("baseline") or next(iter(v.values()))
        blk = next((x for x in v.values() if x["block_size"] is not None), None)
        sb = f"{blk['block_size']}x{blk['n_blocks']}" if blk else "-"
        steps = f"{b['steps']}/{blk['steps']}" if blk else str(b["steps"])
        print(f"{size:22s} {b['n_layers']:3d} {b['d_model']:5d} {b['n_heads']:3d} {b['d_ff']:5d} {b['params']:12,d} "
              f"{100 * b['params_error']:5.2f} {b['achieved_d_over_lb']:6.2f} {b['achieved_heads_over_lb']:5.3f} "
              f"{b['achieved_ff_ratio']:5.3f} {sb:>7s} {b['flops_per_token'] / 1e6:9.2f} {steps:>11s} "
              f"{b['tokens']:15,d} {b['tokens'] / b['params']:6.1f} {b['flops']:9.3g}")


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - a printout
    import argparse
    from pathlib import Path

    from omegaconf import OmegaConf

    from attnres import ModelConfig, flops_per_token
    from attnres.flops import non_embedding_params

    ap = argparse.ArgumentParser(prog="python -m experiments.sizes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paper-vocab", type=int, default=163_840,
                    help="vocabulary for the paper arch grid's FLOPs/token and tokens (default: 163,840, the paper's "
                         "Kimi tokenizer; use your shards' vocabulary)")
    args = ap.parse_args(argv)

    conf = Path(__file__).resolve().parents[1] / "conf" / "size"
    print("Sizes given by shape (FLOPs/token at vocabulary 256):")
    print(f"{'size':12s} {'L_b':>3s} {'d':>5s} {'H':>3s} {'hd':>4s} {'d_ff':>5s} {'N_target':>12s} {'N_base':>12s} "
          f"{'err%':>6s} {'T':>5s} {'batch':>5s} {'steps':>6s} {'tokens':>14s} {'tok/N':>6s} {'MFLOP/tok':>10s} {'C (FLOPs)':>10s}")
    for path in sorted(conf.glob("*.yaml")):
        s = OmegaConf.load(path)
        if "d_over_lb" in s:  # a derived size (arch grid): printed below, per grid cell
            continue
        cfg = ModelConfig(vocab_size=256, n_layers=s.n_layers, d_model=s.d_model, n_heads=s.n_heads,
                          head_dim=s.head_dim, d_ff=s.d_ff, max_seq_len=s.seq_len)
        n = non_embedding_params(cfg)  # built on the meta device: free even at paper size
        steps = steps_for(s.tokens, s.batch_size, s.seq_len)
        tokens = steps * s.batch_size * s.seq_len
        fpt = flops_per_token(cfg, s.seq_len).total
        print(f"{s.name:12s} {s.n_layers:3d} {s.d_model:5d} {s.n_heads:3d} {s.head_dim:4d} {s.d_ff:5d} "
              f"{s.target_params:12,d} {n:12,d} {100 * (n / s.target_params - 1):6.2f} {s.seq_len:5d} "
              f"{s.batch_size:5d} {steps:6d} {tokens:14,d} {tokens / n:6.1f} {fpt / 1e6:10.2f} {fpt * tokens:10.2e}")
    print("\nArchitecture grids (paper Fig. 7; derived sizes, fixed compute). Columns: the baseline's shape and N, its "
          "error vs the target, the achieved ratios, Block AttnRes's S x blocks, and steps for baseline/Block at C")
    for sweep in ARCH_SWEEPS:
        _print_arch_grid(sweep, args.paper_vocab if sweep == "arch_grid" else 256)


if __name__ == "__main__":  # pragma: no cover
    main()
