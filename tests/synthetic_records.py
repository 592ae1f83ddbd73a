"""Test data: synthetic result records drawn from known scaling laws, in the documented format
(docs/results_schema.md). Test-only (it ships in no package): the tests recover known multipliers and check that
intervals cover. To try the figures without training anything, from the repository root:

    PYTHONPATH=tests python -c "from synthetic_records import write_study; write_study('/tmp/synth')"
    python -m analysis fit --results /tmp/synth --out /tmp/synth_report

The in-memory tables (:func:`synthetic_ladder`, :func:`block_size_sweep_records`, :func:`ablation_records`,
:func:`synthetic_lr_study`) hold the columns the analysis reads, ``study_kind`` among them; :func:`write_study`
writes them as a study directory whose records carry every field of the current schema (results.ledger).

Truth: the baseline follows ``L_b(C) = E + A (C / C0)^-alpha``; a variant with multiplier m follows
``L_v(C) = L_b(m C)`` ("matches a baseline trained with m x compute"), at its own compute, which is a little
higher than the baseline's (AttnRes adds FLOPs per token).  Seed noise: each run gets N(0, sigma^2), of which a
fraction rho is shared by all variants of one (size, seed) cell -- same data order, same initialisation.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from results import ledger
from results.record import COLUMNS

# CPU-ladder-like sizes, each a 4-tuple (name, n_layers, d_model, n_heads); their compute is spread over C_range
# (synthetic_ladder).
SIZES = (
    ("cpu_xs", 2, 64, 2),
    ("cpu_s", 3, 96, 3),
    ("cpu_m", 4, 128, 4),
    ("cpu_l", 5, 160, 5),
    ("cpu_xl", 6, 192, 6),
    ("cpu_xxl", 8, 256, 8),
)
RESIDUAL_OF = {
    "baseline": "baseline",
    "full_attnres": "full",
    "block_attnres": "block",
    "denseformer": "denseformer",
    "mhc": "mhc",
    "hyper": "hyper",
}
DEFAULT_MULTIPLIERS = {"full_attnres": 1.25, "block_attnres": 1.15}
PFLOPS_DAY = 1e15 * 86400
# The study kind of each synthetic study name (a record carries its kind: docs/results_schema.md, "Study kinds").
KIND_OF_STUDY = {"block_size": "block_size", "ablations": "ablations", "cpu_lr": "lr"}


def residual_of(variant: str) -> str:
    if variant in RESIDUAL_OF:
        return RESIDUAL_OF[variant]
    return "block" if variant.startswith("block") else "full" if variant.startswith("full") else "baseline"


def synthetic_ladder(
    multipliers: dict[str, float] | None = None,
    *,
    baseline: str = "baseline",
    n_sizes: int = 5,
    seeds: tuple[int, ...] | list[int] = (0, 1),
    sigma: float = 0.01,
    rho: float = 0.5,
    E: float = 2.0,
    A: float = 1.5,
    alpha: float = 0.25,
    C0: float = 1e-5,
    C_range: tuple[float, float] = (2e-6, 2e-4),
    flops_overhead: float = 0.01,
    study: str = "cpu_ladder",
    rng: int | np.random.Generator = 0,
) -> pd.DataFrame:
    """A results table (schema columns) for one compute ladder: n_sizes sizes x (baseline + variants) x seeds."""
    multipliers = dict(DEFAULT_MULTIPLIERS if multipliers is None else multipliers)
    rng = np.random.default_rng(rng)
    if not 1 <= n_sizes <= len(SIZES):
        raise ValueError(f"n_sizes={n_sizes} must be in [1, {len(SIZES)}]")
    Cs = np.geomspace(*C_range, n_sizes) if n_sizes > 1 else np.array([C_range[0]])
    arms = {baseline: 1.0} | multipliers
    rows = []
    for (name, n_layers, d_model, n_heads), C_b in zip(SIZES, Cs):
        for seed in seeds:
            shared = rng.standard_normal()
            for variant, m in arms.items():
                C = C_b * (1.0 if variant == baseline else 1.0 + flops_overhead)
                L = E + A * (m * C / C0) ** (-alpha)
                L += sigma * (math.sqrt(rho) * shared + math.sqrt(1 - rho) * rng.standard_normal())
                rows.append(_record(variant, name, seed, n_layers, d_model, n_heads, C, L, study))
    return pd.DataFrame(rows)


def _record(
    variant: str,
    size: str,
    seed: int,
    n_layers: int,
    d_model: int,
    n_heads: int,
    C: float,
    L: float,
    study: str,
    block_size: int | None = None,
) -> dict[str, Any]:
    residual = residual_of(variant)
    flops = C * PFLOPS_DAY
    d_ff = 4 * d_model
    params_ne = 12 * n_layers * d_model * d_model
    fpt = 6.0 * params_ne * 1.3  # ~30% for attention, head and depth mixing
    tokens = int(flops / fpt)
    if residual == "block":
        block_size = block_size or 4
        n_blocks = math.ceil(2 * n_layers / block_size)
    else:
        block_size = n_blocks = None
    tag = f"{variant}-{size}-s{seed}" + (f"-S{block_size}" if study == "block_size" else "")
    run_id = f"{study}-{tag}"
    return {
        "run_id": run_id,
        "study": study,
        "study_kind": KIND_OF_STUDY.get(study, "scaling"),
        "variant": variant,
        "residual": residual,
        "size": size,
        "seed": seed,
        "status": "completed",
        "n_layers": n_layers,
        "d_model": d_model,
        "n_heads": n_heads,
        "d_ff": d_ff,
        "block_size": block_size,
        "n_blocks": n_blocks,
        "seq_len": 256,
        "batch_size": 32,
        "params": params_ne + 256 * d_model,
        "params_non_embedding": params_ne,
        "tokens": tokens,
        "flops_per_token": fpt,
        "flops": fpt * tokens,
        "pflops_days": fpt * tokens / PFLOPS_DAY,
        "flops_6nd": 6.0 * params_ne * tokens,
        "pflops_days_6nd": 6.0 * params_ne * tokens / PFLOPS_DAY,
        "val_loss": L,
        "train_loss": L + 0.02,
        "steps": max(tokens // (32 * 256), 1),
        "lr": 3e-3,
        "wall_time_s": flops / 1e11,
        "git_commit": "synthetic",
        "config_hash": hashlib.sha256(run_id.encode()).hexdigest()[:16],
        "run_dir": f"runs/{run_id}",
        "error": "",
        "started_at": "2026-01-01T00:00:00+00:00",
        "finished_at": "2026-01-01T01:00:00+00:00",
    }


def block_size_sweep_records(
    size_index: int = 2, block_sizes=(1, 2, 4, 8), seeds=(0, 1), sigma: float = 0.005, rng: int = 1
) -> pd.DataFrame:
    """Study ``block_size``: Block AttnRes at one size for several S, plus baseline and Full references."""
    rng = np.random.default_rng(rng)
    name, n_layers, d_model, n_heads = SIZES[size_index]
    base = 3.20
    rows = []
    for seed in seeds:
        for S in block_sizes:
            # Smaller blocks approach Full AttnRes; the largest approach the baseline.
            L = base - 0.06 * (1 - math.log2(S) / math.log2(2 * n_layers) * 0.8) + sigma * rng.standard_normal()
            rows.append(_record("block_attnres", name, seed, n_layers, d_model, n_heads, 3e-5, L, "block_size", S))
        rows.append(
            _record(
                "baseline",
                name,
                seed,
                n_layers,
                d_model,
                n_heads,
                3e-5,
                base + sigma * rng.standard_normal(),
                "block_size",
            )
        )
        rows.append(
            _record(
                "full_attnres",
                name,
                seed,
                n_layers,
                d_model,
                n_heads,
                3e-5,
                base - 0.065 + sigma * rng.standard_normal(),
                "block_size",
            )
        )
    return pd.DataFrame(rows)


def ablation_records(size_index: int = 2, seeds=(0, 1), sigma: float = 0.005, rng: int = 2) -> pd.DataFrame:
    """Study ``ablations``: one row per (variant, seed) at one size, Table 4 style."""
    rng = np.random.default_rng(rng)
    name, n_layers, d_model, n_heads = SIZES[size_index]
    deltas = {
        "baseline": 0.0,
        "denseformer": 0.001,
        "mhc": -0.019,
        "full_attnres": -0.029,
        "full_input_dependent_query": -0.035,
        "full_input_independent": -0.017,
        "full_sigmoid": -0.025,
        "full_no_rmsnorm": -0.023,
        "full_swa": -0.002,
        "block_attnres": -0.020,
        "block_multihead": -0.014,
        "block_no_rmsnorm": -0.016,
    }
    rows = []
    for seed in seeds:
        for v, d in deltas.items():
            L = 3.20 + d + sigma * rng.standard_normal()
            rows.append(_record(v, name, seed, n_layers, d_model, n_heads, 3e-5, L, "ablations"))
    return pd.DataFrame(rows)


def _metrics(row: pd.Series, rng: np.random.Generator, n_evals: int = 12) -> pd.DataFrame:
    steps = int(row["steps"])
    tps = row["tokens"] / steps
    grid = np.unique(np.linspace(0, steps, 4 * n_evals + 1).astype(int))
    frac = np.maximum(grid / steps, 1e-3)
    L_end = float(row["val_loss"])
    curve = L_end + 0.35 * (frac ** (-0.5) - 1)  # a power-law-in-tokens approach to the final loss
    curve = np.minimum(curve, 5.55)  # ~ln(vocab=256) at initialisation
    val = np.where(np.isin(np.arange(grid.size), np.linspace(0, grid.size - 1, n_evals + 1).astype(int)), curve, np.nan)
    val[-1] = L_end
    lr = 3e-3 * 0.5 * (1 + np.cos(np.pi * grid / steps))
    return pd.DataFrame(
        {
            "step": grid,
            "tokens": (grid * tps).astype(np.int64),
            "flops": grid * tps * row["flops_per_token"],
            "train_loss": curve + 0.02 + 0.01 * rng.standard_normal(grid.size),
            "val_loss": val,
            "lr": lr,
            "grad_norm": 0.5 + 0.3 * np.exp(-frac * 5) + 0.02 * rng.standard_normal(grid.size),
            "tokens_per_s": 2e4 * (1 + 0.02 * rng.standard_normal(grid.size)),
        }
    )


def _diagnostics(row: pd.Series, rng: np.random.Generator) -> dict[str, Any]:
    Lb = int(row["n_layers"])
    residual = row["residual"]
    i = np.arange(Lb)
    if residual == "baseline":
        rms = 1.0 + 0.9 * i  # PreNorm: the residual stream grows with depth (Fig. 5b)
        grad = 0.4 + 2.0 * np.exp(-i / 1.5)  # gradients concentrate in the first blocks (Fig. 5c)
    else:
        S = (
            int(row["block_size"]) // 2
            if residual == "block" and row["block_size"] and int(row["block_size"]) >= 2
            else 1
        )
        rms = 1.0 + 0.6 * (i % max(S, 1)) if residual == "block" else 1.0 + 0.25 * np.sqrt(i)
        grad = 0.8 + 0.1 * np.cos(i)
    out: dict[str, Any] = {
        "step": int(row["steps"]),
        "variant": row["variant"],
        "residual": residual,
        "block_output_rms": (rms * (1 + 0.02 * rng.standard_normal(Lb))).tolist(),
        "block_grad_norm": (grad * 1e-2 * (1 + 0.02 * rng.standard_normal(Lb))).tolist(),
        "sublayer_output_rms": np.repeat(rms, 2).tolist(),
    }
    if residual in ("full", "block"):
        out.update(_depth_weights(Lb, residual, row, rng))
    return out


def _depth_weights(Lb: int, residual: str, row: pd.Series, rng: np.random.Generator) -> dict[str, Any]:
    L = 2 * Lb
    kinds = ["attn", "mlp"] * Lb + ["final"]
    if residual == "full":
        labels = ["emb"] + [f"{'attn' if i % 2 == 0 else 'mlp'}{i // 2}" for i in range(L)]  # attnres's names
        visible = [list(range(j + 1)) for j in range(L + 1)]  # read j sees the embedding and outputs 1..j
    else:
        S = int(row["block_size"])
        N = math.ceil(L / S)
        labels = ["emb"] + [f"block{k}" for k in range(1, N + 1)]
        # read j sits in block n = j // S + 1: sees emb, completed blocks b1..b_{n-1}, and the partial b_n if any
        visible = [list(range(j // S + 1 + (j % S > 0))) for j in range(L)] + [list(range(N + 1))]
    W = []
    for j, vis in enumerate(visible):
        logits = np.full(len(labels), np.nan)
        pos = np.array(vis, float)
        lg = 2.0 * (pos - pos.max()) / max(len(vis), 1) * 3 + 0.3 * rng.standard_normal(len(vis))  # locality
        lg[0] += 1.5 if kinds[j] == "attn" else 0.5  # a persistent weight on the embedding
        p = np.exp(lg - lg.max())
        logits[vis] = p / p.sum()
        W.append([None if np.isnan(x) else float(x) for x in logits])
    return {"depth_weights": W, "read_kinds": kinds, "source_labels": labels}


def write_study(
    out_dir: str | Path,
    df: pd.DataFrame | None = None,
    *,
    curves: bool = True,
    diagnostics: bool = True,
    extra_studies: bool = True,
    failed: bool = True,
    rng: int = 0,
) -> Path:
    """Write a study directory under out_dir: one record file per run (``records/``, every schema field present,
    as results.ledger writes them), the table derived from them (results.csv), and each run's files (results.json,
    metrics.csv, diagnostics.json) under its ``run_dir``.

    By default: the 5-size ladder (baseline + Full + Block, 2 seeds), a block-size sweep, an ablation study and
    one diverged run. Returns the path of results.csv.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gen = np.random.default_rng(rng)
    if df is None:
        df = synthetic_ladder(rng=rng)
        if extra_studies:
            df = pd.concat([df, block_size_sweep_records(), ablation_records()], ignore_index=True)
    df = df.copy()
    if failed:
        bad = _record("full_attnres", "cpu_xl", 2, 6, 192, 6, 2e-4, float("nan"), str(df["study"].iloc[0]))
        bad.update(status="diverged", error="loss became NaN at step 412")
        df = pd.concat([df, pd.DataFrame([bad])], ignore_index=True)
    (out / ledger.RECORDS_DIR).mkdir(exist_ok=True)
    for i, (_, row) in enumerate(df.iterrows()):
        run_dir = out / row["run_dir"]
        run_dir.mkdir(parents=True, exist_ok=True)
        cells = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        cells = {k: (v.item() if hasattr(v, "item") else v) for k, v in cells.items()}
        stamp = ledger.compact_timestamp(cells.get("finished_at"))
        rid = ledger.record_key(stamp, str(cells["run_id"]), f"synth-{i:05d}")
        rec = {**ledger.make_record(**{k: v for k, v in cells.items() if k in COLUMNS}), **cells, "record_id": rid}
        (out / ledger.RECORDS_DIR / f"{rid}.json").write_text(json.dumps(rec, indent=1))
        (run_dir / "results.json").write_text(json.dumps(rec, indent=1))
        if curves and row["status"] == "completed":
            _metrics(row, gen).to_csv(run_dir / "metrics.csv", index=False)
        if diagnostics and row["status"] == "completed":
            (run_dir / "diagnostics.json").write_text(json.dumps(_diagnostics(row, gen)))
    return ledger.rebuild_table(out)


def synthetic_lr_study(
    optima: dict[tuple[str, str], float],
    grid: tuple[float, ...] | list[float] = (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2),
    *,
    seeds: tuple[int, ...] | list[int] = (0,),
    curvature: float = 0.05,
    skew: float = 0.02,
    sigma: float = 0.0,
    diverge_above: float | None = None,
    study: str = "cpu_lr",
    rng: int | np.random.Generator = 0,
) -> pd.DataFrame:
    """An LR-study results table with known optima: ``optima[(size, variant)] = lr*``, and at every grid lr

        L = L0(size) + curvature * u^2 + skew * max(u, 0)^3 + N(0, sigma^2),   u = ln(lr / lr*),

    (skew > 0 steepens the high-lr side, as real curves do). Runs above ``diverge_above`` are recorded diverged."""
    rng = np.random.default_rng(rng)
    by_name = {s[0]: s for s in SIZES}
    rows = []
    for (size, variant), lr_star in optima.items():
        _name, n_layers, d_model, n_heads = by_name[size]
        L0 = 2.4 - 0.1 * list(by_name).index(size)
        for lr in grid:
            for seed in seeds:
                u = math.log(lr / lr_star)
                L = L0 + curvature * u * u + skew * max(u, 0.0) ** 3 + sigma * rng.standard_normal()
                rec = _record(variant, size, seed, n_layers, d_model, n_heads, 1e-5, L, study)
                rec.update(lr=lr, run_id=f"{rec['run_id']}-lr{lr:g}")
                if diverge_above is not None and lr > diverge_above:
                    rec.update(status="diverged", val_loss=None, error="DivergedError: training loss is nan")
                rows.append(rec)
    return pd.DataFrame(rows)


RECIPES = {"adamw+cosine": ("adamw", "cosine"), "muon+wsd": ("muon", "wsd")}


def synthetic_recipe_study(
    multipliers: dict[str, dict[str, float]] | None = None,
    *,
    speedup: float = 2.0,
    reference_recipe: str = "adamw+cosine",
    recipe: str = "muon+wsd",
    n_sizes: int = 4,
    seeds: tuple[int, ...] | list[int] = (0, 1, 2, 20, 21, 22),
    sigma: float = 0.01,
    rho: float = 0.5,
    seconds_per_flop: dict[tuple[str, str], float] | None = None,
    time_noise: float = 0.05,
    E: float = 2.0,
    A: float = 1.5,
    alpha: float = 0.25,
    C0: float = 1e-5,
    C_range: tuple[float, float] = (2e-6, 2e-4),
    flops_overhead: float = 0.01,
    study: str = "cpu_deep_recipe",
    rng: int | np.random.Generator = 0,
) -> pd.DataFrame:
    """A recipe study (issue 35): n_sizes rungs x (baseline + arms) x two recipes x seeds, drawn from known laws.

    The reference recipe's baseline follows ``L_b(C) = E + A (C / C0)^-alpha``; under ``recipe`` the baseline follows
    ``L_b(speedup * C)`` (it reaches the reference baseline's loss with 1/speedup of the compute), and an arm with
    multiplier m under a recipe follows that recipe's baseline law at m x its compute (``multipliers[recipe][arm]``;
    default Block AttnRes 1.15 under the reference recipe, 1.30 under the new one). Each row carries the noiseless
    loss as ``true_loss``. Seed noise N(0, sigma^2), a fraction rho shared by the arms of one (rung, seed, recipe).
    CPU time = ``seconds_per_flop[(recipe, variant)]`` x flops x exp(N(0, time_noise^2)) (default 1e-10 s/FLOP for
    every run, the new recipe's 1.25x); ``optimizer`` and ``lr_schedule`` name the recipe (RECIPES)."""
    multipliers = (
        {reference_recipe: {"block_attnres": 1.15}, recipe: {"block_attnres": 1.30}}
        if multipliers is None
        else multipliers
    )
    spf = {(reference_recipe, "*"): 1e-10, (recipe, "*"): 1.25e-10} | dict(seconds_per_flop or {})
    rng = np.random.default_rng(rng)
    Cs = np.geomspace(*C_range, n_sizes) if n_sizes > 1 else np.array([C_range[0]])
    rows = []
    for (name, n_layers, d_model, n_heads), C_b in zip(SIZES, Cs):
        for seed in seeds:
            for r, scale in ((reference_recipe, 1.0), (recipe, speedup)):
                shared = rng.standard_normal()
                for variant, m in {"baseline": 1.0, **multipliers.get(r, {})}.items():
                    C = C_b * (1.0 if variant == "baseline" else 1.0 + flops_overhead)
                    truth = E + A * (scale * m * C / C0) ** (-alpha)
                    L = truth + sigma * (math.sqrt(rho) * shared + math.sqrt(1 - rho) * rng.standard_normal())
                    rec = _record(variant, name, seed, n_layers, d_model, n_heads, C, L, study)
                    opt, sched = RECIPES.get(r, tuple(r.split("+", 1)))
                    s = spf.get((r, variant), spf.get((r, "*"), 1e-10))
                    cpu = s * rec["flops"] * math.exp(time_noise * rng.standard_normal())
                    rec.update(
                        run_id=f"{rec['run_id']}-{opt}-{sched}",
                        optimizer=opt,
                        lr_schedule=sched,
                        lr_protocol="baseline",
                        cpu_time_s=cpu,
                        wall_time_s=cpu,
                        true_loss=truth,
                    )
                    rows.append(rec)
    return pd.DataFrame(rows)


def synthetic_budget_ladder(
    laws: dict[str, tuple[float, float, float, float, float]] | None = None,
    *,
    n_sizes: int = 4,
    budgets: tuple[float, ...] = (8.0, 32.0, 128.0),
    seeds: tuple[int, ...] | list[int] = (0, 1, 2),
    sigma: float = 0.003,
    rho: float = 0.5,
    study: str = "cpu_budgets",
    rng: int | np.random.Generator = 0,
) -> pd.DataFrame:
    """A multi-budget study (``train.budgets``): n_sizes sizes x ``budgets`` (tokens per non-embedding parameter) x
    arms x seeds, each arm's loss drawn from its planted Chinchilla law ``laws[arm] = (E, A, alpha, B, beta)``:
    L = E + A / N^alpha + B / D^beta, N = params_non_embedding, D = tokens; seed noise as :func:`synthetic_ladder`'s.
    Records carry ``budget`` (and ``trunk_id``: the run at the largest budget of the same arm, size and seed)."""
    laws = laws or {"baseline": (1.8, 40.0, 0.3, 60.0, 0.28), "block_attnres": (1.8, 34.0, 0.3, 60.0, 0.28)}
    rng = np.random.default_rng(rng)
    rows = []
    for name, n_layers, d_model, n_heads in SIZES[:n_sizes]:
        for seed in seeds:
            for budget in budgets:
                shared = rng.standard_normal()
                for variant, (E, A, alpha, B, beta) in laws.items():
                    rec = _record(variant, name, seed, n_layers, d_model, n_heads, 1e-6, 1.0, study)
                    N = rec["params_non_embedding"]
                    D = int(budget * N)
                    L = E + A / N**alpha + B / D**beta
                    L += sigma * (math.sqrt(rho) * shared + math.sqrt(1 - rho) * rng.standard_normal())
                    run_id = f"{rec['run_id']}-b{budget:g}"
                    trunk = f"{rec['run_id']}-b{max(budgets):g}"
                    fpt = rec["flops_per_token"]
                    rec.update(
                        run_id=run_id,
                        tokens=D,
                        flops=fpt * D,
                        pflops_days=fpt * D / PFLOPS_DAY,
                        flops_6nd=6.0 * N * D,
                        pflops_days_6nd=6.0 * N * D / PFLOPS_DAY,
                        val_loss=L,
                        train_loss=L + 0.02,
                        steps=max(D // (32 * 256), 1),
                        config_hash=hashlib.sha256(run_id.encode()).hexdigest()[:16],
                        run_dir=f"runs/{run_id}",
                        budget=budget,
                        trunk_id=trunk,
                    )
                    rows.append(rec)
    return pd.DataFrame(rows)
