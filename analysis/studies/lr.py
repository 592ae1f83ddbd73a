"""Learning-rate tuning (``python -m analysis lr``): per (size, arm) curve -- per (size, arm, budget) where some ran at
several budgets (tokens per parameter) -- the optimum of the seed-mean loss against ln(lr): the vertex of a
least-squares parabola through the grid points within ``WINDOW`` steps of the grid minimum
(analysis.laws.lr_optimum.quadratic_vertex). A diverged run counts as worse than every completed one. A 95%
percentile interval: a cluster bootstrap over seeds where every grid point has >= 2, else parametric (seed noise:
given, pooled seed sd, else the fits' residual sd). Optima on a grid edge, at the divergence edge or without
curvature are warned about. Several budgets add each arm's lr rule (analysis.laws.lr_rule), the runs that extend a
grid and the config's per-budget sections."""

from __future__ import annotations

import argparse
import math
import re
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from results.io import atomic_write_text

from ..io.runs import AnalysisWarning, load_one_dataset, lr_text, size_order
from ..io.token_budget import tokens_per_param
from ..laws.bootstrap import CI_LEVEL
from ..laws.lr_check import protocol_costs
from ..laws.lr_optimum import WINDOW, loss_at, quadratic_vertex
from ..laws.lr_rule import lr_rule
from .study_registry import add_bootstrap, add_choice, add_results_out, number, register

DEFAULT_B = 2000
LR_COLUMNS = ("size", "variant", "seed", "lr", "status", "val_loss")


@dataclass
class LrOptimum:
    """The tuned learning rate of one (size, variant) curve (lr.json ``optima``)."""

    size: str
    variant: str
    lr: float  # the fitted optimum
    ci95: list[float]  # [lo, hi] (nan when it cannot be estimated)
    grid_best_lr: float  # the grid point with the lowest mean loss
    loss_at_optimum: float  # the quadratic at the optimum
    on_edge: bool  # the optimum may lie beyond the grid ("low" / "high" edge): extend it
    edge: str | None  # "low" | "high" | "divergence" (best = highest lr that did not diverge) | None
    curvature: float  # c of the quadratic, per (ln lr)^2; <= 0 means no minimum was resolved
    n_grid: int  # grid points with a completed run
    n_seeds: int  # seeds per grid point (the smallest count)
    n_diverged: int
    params_non_embedding: float | None
    interval_method: str
    grid: list[float] = field(default_factory=list)
    mean_loss: list[float | None] = field(default_factory=list)  # per grid point; None where every run diverged


def _edge(y: np.ndarray) -> str | None:
    """Where the best grid point sits: 'low' (the lowest completed lr), 'high' (the top of the grid), 'divergence'
    (the highest lr that did not diverge, diverged runs above it) or None."""
    finite = np.isfinite(y)
    if not finite.any():
        return None
    k = int(np.argmin(np.where(finite, y, np.inf)))
    if k == int(np.argmax(finite)):
        return "low"
    if k == len(y) - 1:
        return "high"
    if k == len(y) - 1 - int(np.argmax(finite[::-1])) and np.isposinf(y[k + 1 :]).any():
        return "divergence"
    return None


def lr_runs(df: pd.DataFrame) -> pd.DataFrame:
    """The runs an LR analysis uses: completed or diverged, with an lr; diverged ones get val_loss = +inf."""
    missing = [c for c in LR_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"{df.attrs.get('source', 'the results table')} lacks column(s) needed for an LR analysis: "
            f"{', '.join(missing)} (contract: docs/results_schema.md)"
        )
    d = df.copy()
    d["lr"] = pd.to_numeric(d["lr"], errors="coerce")
    d["val_loss"] = pd.to_numeric(d["val_loss"], errors="coerce")
    keep = d["status"].isin(["completed", "diverged"]) & (d["lr"] > 0)
    keep &= (d["status"] == "diverged") | (d["val_loss"] > 0)
    dropped = d[~keep]
    if len(dropped):
        names = ", ".join(f"{r.run_id} ({r.status})" for r in dropped.itertuples())
        why = f"{len(dropped)} run(s) neither completed nor diverged, or without lr/val_loss"
        warnings.warn(f"LR analysis: {why}, left out: {names}", AnalysisWarning, stacklevel=2)
    d = d[keep].copy()
    d.loc[d["status"] == "diverged", "val_loss"] = np.inf
    d["seed"] = pd.to_numeric(d["seed"], errors="coerce").astype(int)
    return d.sort_values(["variant", "size", "lr", "seed"], kind="stable").reset_index(drop=True)


def _curve_matrix(d: pd.DataFrame) -> tuple[np.ndarray, list[int], np.ndarray, np.ndarray]:
    """(ln lr grid, seeds, loss matrix [seeds, grid], lr grid) of one curve; nan where a seed lacks a grid point."""
    lrs = np.sort(d["lr"].unique())
    seeds = sorted(d["seed"].unique())
    M = np.full((len(seeds), len(lrs)), np.nan)
    for r in d.itertuples():
        M[seeds.index(r.seed), int(np.searchsorted(lrs, r.lr))] = r.val_loss
    return np.log(lrs), seeds, M, lrs


def _mean_over_seeds(M: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """Per grid point: +inf when any run there diverged (a diverging lr is not a usable optimum), else the
    (weighted) mean of the completed runs; nan where there are none."""
    w = np.ones(M.shape[0]) if w is None else w
    present = np.isfinite(M) | np.isposinf(M)
    wm = np.where(present, w[:, None], 0.0)
    div = (np.isposinf(M) & (wm > 0)).any(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (np.where(np.isfinite(M), M, 0.0) * wm).sum(0) / wm.sum(0)
    return np.where(div, np.inf, np.where(wm.sum(0) > 0, mean, np.nan))


Curves = dict[tuple[Any, ...], tuple[np.ndarray, list[int], np.ndarray, np.ndarray]]


def _residual_sigma(curves: Curves) -> float | None:
    ss, dof = 0.0, 0
    for x, _, M, _ in curves.values():
        y = _mean_over_seeds(M)
        _, _, c, lo, hi = quadratic_vertex(x, y)
        sel = np.arange(lo, hi + 1)
        sel = sel[np.isfinite(y[sel])]
        if sel.size <= 3 or not np.isfinite(c):
            continue
        coef = np.polyfit(x[sel], y[sel], 2)
        ss += float(((np.polyval(coef, x[sel]) - y[sel]) ** 2).sum())
        dof += sel.size - 3
    return math.sqrt(ss / dof) if dof > 0 else None


def _pooled_seed_sigma(curves: Curves) -> float | None:
    ss, dof = 0.0, 0
    for _, _, M, _ in curves.values():
        for j in range(M.shape[1]):
            col = M[:, j][np.isfinite(M[:, j])]
            if col.size >= 2:
                ss += float(((col - col.mean()) ** 2).sum())
                dof += col.size - 1
    return math.sqrt(ss / dof) if dof >= 2 else None


def budgets_of(d: pd.DataFrame) -> pd.Series | None:
    """Each run's tokens per parameter when some (variant, size) ran at several budgets, else None; a run without a
    budget in a multi-budget table is a ValueError naming it."""
    if d.empty or not {"tokens", "params_non_embedding"} <= set(d.columns):
        return None
    tpp = tokens_per_param(d)
    if not (d.assign(_tpp=tpp).groupby(["variant", "size"])["_tpp"].nunique() > 1).any():
        return None
    if tpp.isna().any():
        names = ", ".join(str(r) for r in d.loc[tpp.isna(), "run_id"])
        raise ValueError(f"runs without a budget (tokens / params_non_embedding) in a multi-budget lr study: {names}")
    return tpp


def lr_optima_with_draws(
    df: pd.DataFrame,
    *,
    B: int = DEFAULT_B,
    seed: int = 0,
    seed_sigma: float | None = None,
    window: int = WINDOW,
) -> tuple[pd.DataFrame, dict[str, Any], np.ndarray]:
    """The tuned lr of every curve with its bootstrap interval: (table, info, draws). The table: one row per curve
    (:class:`LrOptimum`'s fields; with several budgets also ``tokens_per_param``, ``tokens``, ``ci_ratio`` (hi / lo)
    and ``next_lr`` (on a grid edge: half the lowest lr or twice the highest)), by variant, size (ascending N) and
    budget; ``info``: how the intervals were made; ``draws``: each curve's bootstrap ln lr*, (B, rows), nan where
    none was located (what the lr rule's interval resamples)."""
    d = lr_runs(df)
    if d.empty:
        raise ValueError("no completed or diverged runs with an lr: nothing to tune")
    tpp = budgets_of(d)
    keys = ["variant", "size"] if tpp is None else ["variant", "size", "tokens_per_param"]
    d = d if tpp is None else d.assign(tokens_per_param=tpp)
    curves: Curves = {}
    groups = {}
    for key, g in d.groupby(keys, sort=False):
        cell = (str(key[1]), str(key[0]), *(float(k) for k in key[2:]))  # (size, variant[, tokens per param])
        curves[cell], groups[cell] = _curve_matrix(g), g
    pooled_seed = _pooled_seed_sigma(curves)
    sigma, sigma_source = _noise_sigma(curves, seed_sigma, pooled_seed)
    rows, draws = [], []
    for cell, curve in curves.items():
        tag = f"lr:{cell[0]}:{cell[1]}" + (f":{cell[2]:g}" if len(cell) > 2 else "")
        rng = np.random.default_rng([seed, zlib.crc32(tag.encode())])
        row, cell_draws = _optimum_row(cell, curve, groups[cell], rng, B, window, sigma, sigma_source)
        rows.append(row)
        draws.append(cell_draws)
    table = pd.DataFrame(rows)
    order = table.groupby("size")["params_non_embedding"].median().sort_values(na_position="last").index.tolist()
    table["_o"] = table["size"].map({s: i for i, s in enumerate(order)})
    by = ["variant", "_o"] + (["tokens_per_param"] if tpp is not None else [])
    table = table.sort_values(by, kind="stable")
    draw_matrix = np.column_stack(draws)[:, table.index.to_numpy()] if draws else np.empty((B, 0))
    table = table.drop(columns="_o").reset_index(drop=True)
    _warn_doubtful_optima(table)
    info = {"B": B, "seed": seed, "window": window, "ci_level": CI_LEVEL, "sigma": sigma, "sigma_source": sigma_source}
    return table, info | {"pooled_seed_sd": pooled_seed}, draw_matrix


def _optimum_row(
    cell: tuple[Any, ...],
    curve: tuple[np.ndarray, list[int], np.ndarray, np.ndarray],
    g: pd.DataFrame,
    rng: np.random.Generator,
    B: int,
    window: int,
    sigma: float | None,
    sigma_source: str,
) -> tuple[dict[str, Any], np.ndarray]:
    """One curve's row of :func:`lr_optima_with_draws` and its B bootstrap draws of ln lr* (nan where a replicate
    located none): a cluster bootstrap over seeds when every grid point has >= 2, else parametric with ``sigma``."""
    x, seeds, M, lrs = curve
    y = _mean_over_seeds(M)
    x_opt, y_opt, c, _, _ = quadratic_vertex(x, y, window)
    edge = _edge(y)
    per_point = (np.isfinite(M) | np.isposinf(M)).sum(0)
    n_seeds = int(per_point[per_point > 0].min()) if (per_point > 0).any() else 0
    if n_seeds >= 2:
        method = f"cluster bootstrap over {len(seeds)} seeds"
        picks = rng.integers(0, len(seeds), size=(B, len(seeds)))
        reps = [_mean_over_seeds(M, np.bincount(p, minlength=len(seeds)).astype(float)) for p in picks]
        scale = math.sqrt(len(seeds) / (len(seeds) - 1))
    elif sigma is not None and np.isfinite(y).sum() >= 3:
        method = f"parametric, sigma = {sigma:.3g} ({sigma_source})"
        noise = rng.standard_normal((B, len(y))) * sigma
        reps = list(y[None, :] + np.where(np.isfinite(y), noise, 0.0))
        scale = 1.0
    else:
        method, reps, scale = "none (too few points)", [], 1.0
    all_xs = np.array([quadratic_vertex(x, r, window)[0] for r in reps]) if reps else np.full(B, np.nan)
    xs = all_xs[np.isfinite(all_xs)]
    ci, cell_draws = [float("nan"), float("nan")], np.full(B, np.nan)
    if xs.size and np.isfinite(x_opt):
        q = 100 * (1 - CI_LEVEL) / 2
        lo, hi = np.percentile(x_opt + scale * (xs - x_opt), [q, 100 - q])
        ci, cell_draws = [float(np.exp(lo)), float(np.exp(hi))], x_opt + scale * (all_xs - x_opt)
    n_params = (
        pd.to_numeric(g.get("params_non_embedding"), errors="coerce").median() if "params_non_embedding" in g else None
    )
    k = int(np.argmin(np.where(np.isfinite(y), y, np.inf))) if np.isfinite(y).any() else 0
    optimum = LrOptimum(
        size=cell[0],
        variant=cell[1],
        lr=float(np.exp(x_opt)) if np.isfinite(x_opt) else float("nan"),
        ci95=ci,
        grid_best_lr=float(lrs[k]),
        loss_at_optimum=y_opt,
        on_edge=edge in ("low", "high"),
        edge=edge,
        curvature=c,
        n_grid=int(np.isfinite(y).sum()),
        n_seeds=n_seeds,
        n_diverged=int((g["status"] == "diverged").sum()),
        params_non_embedding=None if n_params is None or not np.isfinite(n_params) else float(n_params),
        interval_method=method,
        grid=[float(v) for v in lrs],
        mean_loss=[None if not np.isfinite(v) else float(v) for v in y],
    )
    row = asdict(optimum)
    if len(cell) > 2:  # a multi-budget study's curve
        lo, hi = ci
        next_lr = {"low": float(lrs.min()) / 2, "high": float(lrs.max()) * 2}.get(edge or "")
        row |= {
            "tokens_per_param": cell[2],
            "tokens": float(pd.to_numeric(g["tokens"], errors="coerce").median()),
            "ci_ratio": hi / lo if np.isfinite(lo) and np.isfinite(hi) and lo > 0 else float("nan"),
            "ci_end_rise": _interval_end_rise(x, y, ci, y_opt, window),
            "next_lr": next_lr if edge in ("low", "high") else None,
        }
    return row, cell_draws


def _interval_end_rise(x: np.ndarray, y: np.ndarray, ci: list[float], y_opt: float, window: int) -> float:
    """How far the loss off the grid curve (:func:`loss_at`) rises from the optimum to the worse end of its interval:
    a wide interval with a rise under the seed noise is a flat valley, where the optimum's place is not resolved and
    matters little; nan where an end lies off the grid."""
    if not (np.isfinite(y_opt) and all(np.isfinite(c) and c > 0 for c in ci)):
        return float("nan")
    return max(loss_at(x, y, math.log(c), window) for c in ci) - y_opt


def _noise_sigma(curves: Curves, seed_sigma: float | None, pooled_seed: float | None) -> tuple[float | None, str]:
    """The seed noise for the parametric bootstrap and its source: given, pooled seed sd, else fit residuals."""
    if seed_sigma is not None:
        if not seed_sigma > 0:
            raise ValueError(f"seed-noise sigma={seed_sigma} must be > 0")
        return float(seed_sigma), "given (--seed-sigma)"
    if pooled_seed is not None:
        return pooled_seed, "pooled seed sd of the grid points with >= 2 seeds"
    return (
        _residual_sigma(curves),
        "pooled residual sd of the quadratic fits (includes misfit; pass --seed-sigma from a seed study)",
    )


def _where(r: Any) -> str:
    tpp = getattr(r, "tokens_per_param", None)
    return f"{r.size}" if tpp is None or not np.isfinite(tpp) else f"{r.size} @ {tpp:g} tokens/param"


def _warn_doubtful_optima(table: pd.DataFrame) -> None:
    """An AnalysisWarning (naming lr_optima_with_draws' caller) for each optimum on a grid edge, at the divergence
    edge, or without curvature."""
    for r in table.itertuples():
        if r.on_edge:
            where = "below the lowest" if r.edge == "low" else "above the highest"
            text = (
                f"LR optimum of {r.variant} at {_where(r)} lies at the {r.edge} edge of the grid (best grid lr "
                f"{r.grid_best_lr:.3g}, grid {min(r.grid):.3g}..{max(r.grid):.3g}): extend the grid {where} point"
            )
        elif r.edge == "divergence":
            text = (
                f"LR optimum of {r.variant} at {_where(r)} is the highest lr that did not diverge "
                f"({r.grid_best_lr:.3g}): the optimum may lie between it and the next grid point; refine the grid there"
            )
        elif not r.curvature > 0:
            text = (
                f"LR curve of {r.variant} at {_where(r)} shows no minimum around its best grid lr "
                f"{r.grid_best_lr:.3g} (curvature {r.curvature:.3g}); reported that grid point"
            )
        else:
            continue
        warnings.warn(text, AnalysisWarning, stacklevel=4)


def lr_trend(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per variant, the least-squares power law lr* = a * N^b over its sizes (needs >= 2 sizes with N)."""
    out = {}
    for variant, g in table.groupby("variant", sort=False):
        g = g[np.isfinite(g["lr"]) & g["params_non_embedding"].notna()]
        if g["params_non_embedding"].nunique() < 2:
            continue
        b, ln_a = np.polyfit(np.log(g["params_non_embedding"].astype(float)), np.log(g["lr"]), 1)
        out[str(variant)] = {"a": float(math.exp(ln_a)), "b": float(b), "n_sizes": len(g)}
    return out


SWEEP_DIR = Path(__file__).resolve().parents[2] / "conf" / "sweep"  # where a study's sweep file is looked up


def not_located(r: Any) -> str | None:
    """Why a multi-budget row's optimum is not located (and stays out of the lr rule), or None."""
    lo, hi = r.ci95
    if r.on_edge:
        return f"on the {r.edge} edge"
    if r.edge == "divergence":
        return "at the divergence edge"
    if not r.curvature > 0:
        return "no curvature"
    if not (np.isfinite(r.lr) and np.isfinite(lo) and np.isfinite(hi)):
        return "no interval"
    if not (r.params_non_embedding and np.isfinite(r.tokens) and r.tokens > 0):
        return "no N or D"
    return None


def lr_rules(table: pd.DataFrame, draws: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per arm of a multi-budget table, the lr rule ``ln lr* = a + b ln N + c ln D`` over the located optima
    (analysis.laws.lr_rule), with ``cells`` (each with ``loo_lr``, the rule without it) and ``excluded`` (why)."""
    out = {}
    for variant, g in table.groupby("variant", sort=False):
        why = {i: not_located(r) for i, r in zip(g.index, g.itertuples())}
        idx = [i for i in g.index if why[i] is None]
        cells = table.loc[idx]
        rule = lr_rule(
            np.log(cells["lr"].to_numpy(float)),
            np.log(cells["params_non_embedding"].to_numpy(float)),
            np.log(cells["tokens"].to_numpy(float)),
            np.log(np.array(cells["ci95"].tolist(), float).reshape(-1, 2)),
            draws[:, idx],
        )
        loo = rule["loo"] or [{"predicted_ln_lr": None, "inside": None}] * len(idx)
        rule["cells"] = []
        for r, o in zip(cells.itertuples(), loo):
            cell = {"size": str(r.size), "tokens_per_param": float(r.tokens_per_param), "lr": float(r.lr)}
            loo_lr = None if o["predicted_ln_lr"] is None else math.exp(o["predicted_ln_lr"])
            rule["cells"].append(cell | {"ci95": [float(x) for x in r.ci95], "loo_lr": loo_lr, "inside": o["inside"]})
        rule["excluded"] = [
            {"size": str(table.at[i, "size"]), "tokens_per_param": float(table.at[i, "tokens_per_param"]), "reason": w}
            for i, w in why.items()
            if w is not None
        ]
        out[str(variant)] = rule
    return out


def rules_without_smallest(table: pd.DataFrame, draws: np.ndarray) -> dict[str, Any] | None:
    """:func:`lr_rules` refitted without the smallest size (by N), the usual check that one rung off the power law in
    N does not set the rule: ``{"size": the size left out, "rules": ...}``; None with under three sizes."""
    order = size_order(table, "params_non_embedding")
    if len(order) < 3:
        return None
    keep = (table["size"] != order[0]).to_numpy()
    rest = table[keep].reset_index(drop=True)
    return {"size": str(order[0]), "rules": lr_rules(rest, draws[:, keep])}


def study_sweep(runs: pd.DataFrame, sweep_dir: Path = SWEEP_DIR) -> str | None:
    """The sweep (conf/sweep/<name>.yaml) that trains the one study the runs name: the file named as it, else the one
    file whose ``study:`` is it; else None."""
    studies = {str(s) for s in runs.get("study", pd.Series(dtype=str)).dropna() if str(s)}
    if len(studies) != 1 or not sweep_dir.is_dir():
        return None
    (study,) = studies
    if (sweep_dir / f"{study}.yaml").is_file():
        return study
    line = re.compile(rf"^study:\s*{re.escape(study)}\s*$", re.MULTILINE)
    named = [p.stem for p in sorted(sweep_dir.glob("*.yaml")) if line.search(p.read_text(encoding="utf-8"))]
    return named[0] if len(named) == 1 else None


def next_runs(table: pd.DataFrame, runs: pd.DataFrame, sweep: str | None) -> list[dict[str, Any]]:
    """The launches that extend a multi-budget grid whose optimum is on an edge, one per (arm, size, next lr): the
    budgets on that edge, the size's seeds and the ``python -m experiments.train`` command (None without a sweep)."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in table[table["on_edge"]].itertuples():
        key = (str(r.variant), str(r.size), lr_text(r.next_lr))
        if key in out:
            out[key]["budgets"].append(float(r.tokens_per_param))
            continue
        mine = runs[(runs["variant"] == r.variant) & (runs["size"] == r.size)]
        seeds = sorted({int(s) for s in mine["seed"]})
        layers = pd.to_numeric(mine.get("n_layers", pd.Series(dtype=float)), errors="coerce").dropna()
        size_arg = f"size.n_layers={int(layers.median())}" if len(layers) else f"size={r.size}"
        command = (
            f"python -m experiments.train -m +sweep={sweep} seed={','.join(map(str, seeds))} {size_arg} "
            f"model={r.variant} size.lr={key[2]}"
        )
        run = {"variant": key[0], "size": key[1], "lr": float(r.next_lr), "edge": r.edge}
        out[key] = run | {"budgets": [float(r.tokens_per_param)], "seeds": seeds, "command": command if sweep else None}
    return list(out.values())


def _budget_key(tpp: float) -> int | float:
    return int(tpp) if float(tpp).is_integer() else float(tpp)


def at_smallest_budget(table: pd.DataFrame) -> pd.DataFrame:
    smallest = table.groupby(["variant", "size"])["tokens_per_param"].transform("min")
    return table[table["tokens_per_param"] == smallest]


def budget_labels(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with each (size, budget) as its own size ``<size>@<tokens per param>``: one lr curve per budget."""
    tpp = df["tokens_per_param"] if "tokens_per_param" in df.columns else tokens_per_param(df)
    return df.assign(size=[f"{s}@{t:g}" for s, t in zip(df["size"], tpp)])


TUNED_HEADER = """\
# GENERATED by `{command}` -- do not edit by hand.
# The tuned learning rates of the LR study below, read by the size configs through the `attnres_lr` resolver
# (conf/train.yaml: `lr_protocol` baseline = every arm at the baseline's lr, the paper's protocol; per_arm = each
# arm at its own). Regenerate by re-running the LR study (docs/usage.md: "Learning-rate tuning and the two protocols").
"""


RULES = ("per_size", "trend")


def tuned_document(
    table: pd.DataFrame,
    info: dict[str, Any],
    provenance: dict[str, Any],
    rule: str = "per_size",
    trend: dict[str, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """The generated config: ``lr[variant][size]`` under ``rule`` ("per_size": each curve's optimum; "trend": the
    arm's :func:`lr_trend` at the size's N), both kept (``lr_per_size``, ``lr_trend``), with intervals, edge flags and
    provenance. A multi-budget table: all at each size's smallest budget, plus ``*_per_budget[arm][size][budget]``."""
    if rule not in RULES:
        raise ValueError(f"rule={rule!r}; allowed values: {', '.join(RULES)}")
    budgets = table if "tokens_per_param" in table.columns else None
    table = at_smallest_budget(table) if budgets is not None else table
    trend = lr_trend(table) if trend is None else trend
    method = (
        f"quadratic in ln(lr) over the grid points within {info['window']} steps of the grid minimum; "
        f"{int(100 * info['ci_level'])}% bootstrap interval (B = {info['B']}, seed {info['seed']})"
        + ("; lr = the arm's power law a * N^b over sizes at each size's N" if rule == "trend" else "")
    )
    doc: dict[str, Any] = {"provenance": {**provenance, "rule": rule, "method": method}}
    doc |= {key: {} for key in ("lr", "lr_per_size", "lr_trend", "ci95", "on_edge")}
    for r in table.itertuples():
        v, s = str(r.variant), str(r.size)
        t = trend.get(v)
        at_n = t["a"] * r.params_non_embedding ** t["b"] if t and r.params_non_embedding else None
        if rule == "trend" and at_n is None:
            raise ValueError(f"rule=trend: no lr trend for {v} (it needs >= 2 sizes with parameter counts)")
        doc["lr_per_size"].setdefault(v, {})[s] = float(f"{r.lr:.4g}")
        if at_n is not None:
            doc["lr_trend"].setdefault(v, {})[s] = float(f"{at_n:.4g}")
        doc["lr"].setdefault(v, {})[s] = float(f"{(at_n if rule == 'trend' else r.lr):.4g}")
        doc["ci95"].setdefault(v, {})[s] = [float(f"{x:.4g}") for x in r.ci95]
        doc["on_edge"].setdefault(v, {})[s] = bool(r.on_edge)
    if budgets is not None:
        doc["provenance"]["method"] += (
            "; lr, ci95 and on_edge: each size's optimum at its smallest budget; *_per_budget: at every budget "
            "(tokens per parameter)"
        )
        for r in budgets.itertuples():
            v, s, b = str(r.variant), str(r.size), _budget_key(r.tokens_per_param)
            doc.setdefault("lr_per_budget", {}).setdefault(v, {}).setdefault(s, {})[b] = float(f"{r.lr:.4g}")
            ci = [float(f"{x:.4g}") for x in r.ci95]
            doc.setdefault("ci95_per_budget", {}).setdefault(v, {}).setdefault(s, {})[b] = ci
            doc.setdefault("on_edge_per_budget", {}).setdefault(v, {}).setdefault(s, {})[b] = bool(r.on_edge)
    return doc


def write_tuned_config(doc: dict[str, Any], path: str | Path, command: str) -> Path:
    """Write the generated config atomically (a launching run must never read a half-written one)."""
    import yaml

    path = Path(path)
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=110)
    atomic_write_text(path, TUNED_HEADER.format(command=command) + body)
    return path


def _fmt(x: float) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.3g}"


def lr_markdown(
    table: pd.DataFrame,
    info: dict[str, Any],
    trend: dict[str, Any],
    source: str | None,
    tuned: dict[str, dict[str, float]] | None = None,
    rule: str = "per_size",
) -> str:
    """The LR study's summary table; ``tuned`` (``lr[variant][size]``) is what the sizes read under ``rule``."""
    from ..render.lr_budget_tables import flag_text
    from ..render.tables import markdown_table

    header = ["arm", "size", "N", "optimum [95% CI]", f"lr written (rule {rule})", "best grid lr", "loss at optimum"]
    rows = []
    for r in table.itertuples():
        n = f"{r.params_non_embedding:,.0f}" if r.params_non_embedding else "n/a"
        out_lr = ((tuned or {}).get(str(r.variant)) or {}).get(str(r.size))
        cells = [f"{r.variant}", f"{r.size}", n, f"{_fmt(r.lr)} [{_fmt(r.ci95[0])}, {_fmt(r.ci95[1])}]", _fmt(out_lr)]
        cells += [_fmt(r.grid_best_lr), _fmt(r.loss_at_optimum), f"{r.n_grid}", f"{r.n_seeds}"]
        rows.append([*cells, flag_text(r, "extend the grid")])
    lines = ["# Learning-rate tuning", "", f"Source: `{source}`." if source else "", ""]
    lines += markdown_table([*header, "grid points", "seeds", "flags"], rows)
    method = (
        f"Optimum: vertex of a least-squares parabola in ln(lr) through the grid points within {info['window']} "
        "steps of the grid minimum (kept inside that window); a diverged run counts as worse than every completed "
        f"one. Intervals: {int(100 * info['ci_level'])}% percentile bootstrap, B = {info['B']}; single-seed curves "
        f"use a parametric bootstrap with sigma = {_fmt(info['sigma'])} ({info['sigma_source']})."
    )
    lines += ["", method]
    if trend:
        lines += ["", "Scaling of the tuned lr with non-embedding parameters N (least squares in log-log):", ""]
        lines += [f"- {v}: lr* = {t['a']:.3g} · N^{t['b']:.3f} over {t['n_sizes']} sizes" for v, t in trend.items()]
    return "\n".join(lines) + "\n"


def run_lr(
    df: pd.DataFrame,
    out: str | Path,
    *,
    B: int = DEFAULT_B,
    seed: int = 0,
    seed_sigma: float | None = None,
    write_config: str | Path | None = None,
    command: str = "python -m analysis lr",
    make_figures: bool = True,
    rule: str = "per_size",
    sweep: str | None = None,
) -> dict[str, Any]:
    """`python -m analysis lr`: lr.json, lr_summary.md, fig_lr.{png,pdf} in ``out``, and the generated config; with
    several budgets also ``rules``, ``next_runs`` (commands naming ``sweep``, default :func:`study_sweep`) and
    ``protocol_costs``."""
    import json
    from datetime import datetime, timezone

    from ..render import figures
    from ..render.lr_budget_tables import budget_markdown

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table, info, draws = lr_optima_with_draws(df, B=B, seed=seed, seed_sigma=seed_sigma)
    multi = "tokens_per_param" in table.columns
    trend = lr_trend(at_smallest_budget(table) if multi else table)
    runs = lr_runs(df)

    def named(column: str) -> list[str]:
        return sorted({str(x) for x in df.get(column, pd.Series(dtype=str)).dropna() if str(x)})

    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    provenance = {"study": ",".join(named("study")) or None, "source": df.attrs.get("source"), "created": created}
    provenance |= {"git_commits": named("git_commit"), "n_runs": len(runs)}
    provenance["n_diverged"] = int((runs["status"] == "diverged").sum())
    doc = {"schema_version": 1, "provenance": provenance, "info": info, "trend": trend}
    doc["optima"] = json.loads(table.to_json(orient="records"))
    try:
        tuned: dict[str, Any] | None = tuned_document(table, info, provenance, rule, trend)
    except ValueError:
        if write_config is not None:
            raise
        tuned = None  # e.g. rule=trend with one size: nothing to write, the optima are still reported
    doc["rule"] = rule
    doc["tuned_lr"] = tuned["lr"] if tuned else None  # what the sizes read under `rule`
    if multi:
        doc["rules"] = lr_rules(table, draws)
        doc["rules_without_smallest"] = rules_without_smallest(table, draws)
        doc["next_runs"] = next_runs(table, runs, sweep if sweep is not None else study_sweep(runs))
        costs = protocol_costs(table, "baseline") if (table["variant"] == "baseline").any() else pd.DataFrame()
        doc["protocol_costs"] = json.loads(costs.to_json(orient="records"))
    written = []
    if make_figures and multi:
        written += figures.lr_figure(budget_labels(runs), budget_labels(table), out / "fig_lr")
    elif make_figures:
        written += figures.lr_figure(runs, table, out / "fig_lr", tuned=doc["tuned_lr"], rule=rule)
    if write_config is not None and tuned is not None:
        written.append(write_tuned_config(tuned, write_config, command))
    (out / "lr.json").write_text(json.dumps(doc, indent=1) + "\n")
    source = df.attrs.get("source")
    summary = (
        budget_markdown(
            table, info, source, doc["next_runs"], doc["rules"], doc["protocol_costs"], doc["rules_without_smallest"]
        )
        if multi
        else lr_markdown(table, info, trend, source, doc["tuned_lr"], rule)
    )
    (out / "lr_summary.md").write_text(summary)
    doc["files"] = [str(p) for p in written] + [str(out / "lr.json"), str(out / "lr_summary.md")]
    doc["table"] = table
    return doc


def _arguments(p: argparse.ArgumentParser) -> None:
    add_results_out(
        p, "the LR study's results.csv (or a study directory)", "output directory (lr.json, lr_summary.md, fig_lr.png)"
    )
    p.add_argument(
        "--dataset", help="only the runs of this data set (data_fingerprint, a prefix of it, or the dataset path)"
    )
    p.add_argument(
        "--write-config", metavar="PATH", help="also write the tuned lrs as a config, e.g. conf/tuned_lr/cpu.yaml"
    )
    add_bootstrap(p)
    p.add_argument("--seed-sigma", type=float, help="seed-noise sd of one run's val loss, for single-seed curves")
    rule = "lr written per size: each size's own optimum (default), or the arm's power law in N over sizes"
    add_choice(p, "--rule", RULES, rule)
    p.add_argument(
        "--sweep",
        help=(
            "with several budgets: the sweep that trains the study, named in the commands that extend a grid "
            "(default: conf/sweep's file of the study the records name)"
        ),
    )
    p.add_argument("--no-figures", action="store_true", help="write lr.json and lr_summary.md only")


@register(
    "lr",
    arguments=_arguments,
    files="lr_summary.md, lr.json, fig_lr.png",
    study_kind="lr",
    printed=lambda doc: printed_lines(doc),
)
def report(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    df = load_one_dataset(args.results, ("completed", "diverged"), args.dataset)
    same = {k: getattr(args, k) for k in ("seed", "seed_sigma", "write_config", "rule", "sweep")}
    command = "python -m analysis " + " ".join(argv)
    return run_lr(df, args.out, B=args.bootstrap, command=command, make_figures=not args.no_figures, **same)


def printed_lines(doc: dict[str, Any]) -> list[str]:
    """What ``python -m analysis lr`` prints: per curve its optimum, interval and edge flag (with several budgets
    the interval's width and next lr), then the launches that extend a grid, the lr rules and protocol costs."""
    from ..render.lr_budget_tables import next_run_lines, protocol_verdicts, ratio_text, rule_sentence

    lines = []
    for r in doc["table"].itertuples():
        lo, hi = r.ci95
        edge = f"  ON THE {r.edge.upper()} EDGE OF THE GRID" if r.on_edge else ""
        where, width = f"{r.size}", ""
        if "rules" in doc:
            where, width = _where(r), f" ({ratio_text(lo, hi)} wide)"
            edge += f": next lr {lr_text(r.next_lr)}" if r.on_edge else ""
        lines.append(
            f"{r.variant} {where}: lr = {number(r.lr, '.3g')} [{number(lo, '.3g')}, {number(hi, '.3g')}]{width}{edge}"
        )
    lines += [f"next run: {line}" for line in next_run_lines(doc.get("next_runs", []))]
    lines += [rule_sentence(v, rule) for v, rule in doc.get("rules", {}).items()]
    lines += [f"protocol cost, {line}" for line in protocol_verdicts(doc.get("protocol_costs", []))]
    return lines
