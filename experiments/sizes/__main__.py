"""``python -m experiments.sizes``: every size of conf/size/ (N, the d_ff rule, tokens, FLOPs/token, C) and the
shapes of the arch-grid sweeps (paper Fig. 7), each cell composed as its run would be, with its tokens at C.
"""

from __future__ import annotations

from .. import sizes
from ..config.compose import compose, conf_dir, sweep_cells
from ..config.config_schema import build_model_config
from ..run.run_plan import planned_steps

ARCH_SWEEPS = ("arch_grid", "cpu_arch_grid")  # conf/sweep/: the Fig. 7 grid at paper scale and on the CPU


def arch_grid_rows(sweep: str, vocab_size: int) -> list[dict]:
    """One row per run of an arch-grid sweep: the derived shape, what it achieves, and the run's planned steps,
    tokens and compute at the sweep's flops_budget (FLOPs/token need the data's vocabulary: ``vocab_size``)."""
    from attnres import flops_per_token

    rows = []
    for cell in sweep_cells(sweep):
        cfg = compose([f"+sweep={sweep}", *(f"{k}={v}" for k, v in cell.items()), f"data.vocab_size={vocab_size}"])
        mc = build_model_config(cfg)
        s = cfg.size
        shape = sizes.derive_arch_shape(
            s.target_params, s.d_over_lb, s.heads_over_lb, s.head_dim, s.ff_ratio, s.d_multiple, s.ff_multiple
        )
        count = flops_per_token(mc, int(cfg.train.seq_len))
        fpt = count.total
        steps = planned_steps(cfg.train, fpt)
        tokens = steps * int(cfg.train.batch_size) * int(cfg.train.seq_len)
        rows.append(
            {
                "sweep": sweep,
                "size": str(s.name),
                "variant": str(cfg.model.variant),
                "seed": int(cfg.seed),
                **shape.to_dict(),
                "params_non_embedding": round(count.six_n / 6),
                "block_size": mc.sublayers_per_block if mc.reads_block_geometry else None,
                "n_blocks": mc.effective_n_blocks if mc.reads_block_geometry else None,
                "seq_len": int(cfg.train.seq_len),
                "batch_size": int(cfg.train.batch_size),
                "lr": float(cfg.optimizer.lr),
                "flops_budget": float(cfg.train.flops_budget),
                "flops_per_token": fpt,
                "steps": steps,
                "tokens": tokens,
                "flops": fpt * tokens,
            }
        )
    return rows


def _print_arch_grid(sweep: str, vocab_size: int) -> None:  # pragma: no cover - a printout
    rows = arch_grid_rows(sweep, vocab_size)
    by_size: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_size.setdefault(r["size"], {})[r["variant"]] = r
    first = rows[0]
    print(
        f"\n{sweep}: C = {first['flops_budget']:.3g} FLOPs per run, target N = {first['target_params']:,.0f}, "
        f"head_dim {first['head_dim']}, d_ff/d = {first['ff_ratio']}, T = {first['seq_len']}, batch "
        f"{first['batch_size']}, lr {first['lr']:g}, vocab {vocab_size:,} (FLOPs/token depend on it)"
    )
    print(
        f"{'cell':22s} {'L_b':>3s} {'d':>5s} {'H':>3s} {'d_ff':>5s} {'N_base':>12s} {'err%':>5s} {'d/L_b':>6s} "
        f"{'H/L_b':>5s} {'ff/d':>5s} {'S x blk':>7s} {'MFLOP/tok':>9s} {'steps b/B':>11s} {'tokens (base)':>15s} "
        f"{'tok/N':>6s} {'C (base)':>9s}"
    )
    for size, v in by_size.items():
        b = v.get("baseline") or next(iter(v.values()))
        blk = next((x for x in v.values() if x["block_size"] is not None), None)
        sb = f"{blk['block_size']}x{blk['n_blocks']}" if blk else "-"
        steps = f"{b['steps']}/{blk['steps']}" if blk else str(b["steps"])
        print(
            f"{size:22s} {b['n_layers']:3d} {b['d_model']:5d} {b['n_heads']:3d} {b['d_ff']:5d} {b['params']:12,d} "
            f"{100 * b['params_error']:5.2f} {b['achieved_d_over_lb']:6.2f} {b['achieved_heads_over_lb']:5.3f} "
            f"{b['achieved_ff_ratio']:5.3f} {sb:>7s} {b['flops_per_token'] / 1e6:9.2f} {steps:>11s} "
            f"{b['tokens']:15,d} {b['tokens'] / b['params']:6.1f} {b['flops']:9.3g}"
        )


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - a printout
    import argparse
    from pathlib import Path

    from omegaconf import OmegaConf

    from attnres import ModelConfig, flops_per_token
    from attnres.flops import param_counts

    ap = argparse.ArgumentParser(
        prog="python -m experiments.sizes",
        description=sizes.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--paper-vocab",
        type=int,
        default=163_840,
        help="vocabulary for the paper arch grid's FLOPs/token and tokens (default: 163,840, the paper's "
        "Kimi tokenizer; use your shards' vocabulary)",
    )
    args = ap.parse_args(argv)

    conf = Path(conf_dir()) / "size"
    print(
        "Sizes given by shape (FLOPs/token at vocabulary 256). N_base: the baseline's activated non-embedding "
        "parameters (Table 2's count); N_total: all its non-embedding parameters (differs for MoE sizes: every "
        "expert); MoE: experts E/top-k/shared x shared_d_ff, d_ff = routed expert width"
    )
    print(
        f"{'size':15s} {'L_b':>3s} {'d':>5s} {'H':>3s} {'hd':>4s} {'d_ff':>5s} {'MoE':>13s} {'N_target':>12s} "
        f"{'N_base':>12s} {'err%':>6s} {'N_total':>14s} {'T':>5s} {'batch':>5s} {'steps':>6s} {'tokens':>14s} "
        f"{'tok/N':>6s} {'MFLOP/tok':>10s} {'C (FLOPs)':>10s}"
    )
    for path in sorted(conf.glob("*.yaml")):
        s = OmegaConf.load(path)
        if "d_over_lb" in s or "tokens_per_param" in s:  # derived sizes (arch grid, map): printed below, per cell
            continue
        cfg = ModelConfig(
            vocab_size=256,
            n_layers=s.n_layers,
            d_model=s.d_model,
            n_heads=s.n_heads,
            head_dim=s.head_dim,
            d_ff=s.d_ff,
            max_seq_len=s.seq_len,
            ffn=s.get("ffn", "dense"),
            moe=OmegaConf.to_container(s.moe) if "moe" in s else None,
        )
        counts = param_counts(cfg)  # built on the meta device: free even at paper size
        n, n_total = counts["activated_non_embedding"], counts["non_embedding"]
        moe = "-"
        if cfg.ffn == "moe":
            o = cfg.moe_options
            moe = f"{o.n_experts}/{o.top_k}/{o.n_shared}x{cfg.shared_d_ff}"
        steps = sizes.steps_for(s.tokens, s.batch_size, s.seq_len)
        tokens = steps * s.batch_size * s.seq_len
        fpt = flops_per_token(cfg, s.seq_len).total
        print(
            f"{s.name:15s} {s.n_layers:3d} {s.d_model:5d} {s.n_heads:3d} {s.head_dim:4d} {s.d_ff:5d} {moe:>13s} "
            f"{s.target_params:12,d} {n:12,d} {100 * (n / s.target_params - 1):6.2f} {n_total:14,d} {s.seq_len:5d} "
            f"{s.batch_size:5d} {steps:6d} {tokens:14,d} {tokens / n:6.1f} {fpt / 1e6:10.2f} {fpt * tokens:10.2e}"
        )
    print(
        "\nArchitecture grids (paper Fig. 7; derived sizes, fixed compute). Columns: the baseline's shape and N, its "
        "error vs the target, the achieved ratios, Block AttnRes's S x blocks, and steps for baseline/Block at C"
    )
    for sweep in ARCH_SWEEPS:
        _print_arch_grid(sweep, args.paper_vocab if sweep == "arch_grid" else 256)
    _print_map(conf / "cpu_map.yaml")


def _print_map(path) -> None:  # pragma: no cover - a printout
    """The depth-by-width map's cells (conf/sweep/cpu_map.yaml): shape, N, tokens and compute per cell."""
    from omegaconf import OmegaConf

    from attnres import ModelConfig, flops_per_token

    s = OmegaConf.load(path)
    print(
        f"\nDepth-by-width map (conf/size/cpu_map.yaml): {s.tokens_per_param} tokens per parameter, context "
        f"{s.seq_len}, batch {s.batch_size}; Block AttnRes n_blocks = min(8, L_b)"
    )
    print(
        f"{'cell':14s} {'L_b':>3s} {'d':>4s} {'H':>3s} {'d_ff':>5s} {'N':>10s} {'steps':>7s} {'tokens':>12s} "
        f"{'MFLOP/tok':>10s} {'C (FLOPs)':>10s}"
    )
    for d_model in (32, 64, 128):
        for n_layers in (4, 8, 16):
            c = sizes.map_cell(n_layers, d_model)
            steps = sizes.steps_for(c.params * s.tokens_per_param, s.batch_size, s.seq_len)
            tokens = steps * s.batch_size * s.seq_len
            cfg = ModelConfig(
                vocab_size=256,
                n_layers=n_layers,
                d_model=d_model,
                n_heads=c.n_heads,
                head_dim=sizes.MAP_HEAD_DIM,
                d_ff=c.d_ff,
                max_seq_len=s.seq_len,
            )
            fpt = flops_per_token(cfg, s.seq_len).total
            print(
                f"{f'map_L{n_layers}_d{d_model}':14s} {n_layers:3d} {d_model:4d} {c.n_heads:3d} {c.d_ff:5d} "
                f"{c.params:10,d} {steps:7d} {tokens:12,d} {fpt / 1e6:10.2f} {fpt * tokens:10.2e}"
            )


if __name__ == "__main__":  # pragma: no cover
    main()
