"""Learning-rate tuning: the optimum of loss against log(lr) per (size, arm), with a bootstrap interval.

Input: the tidy results table of an LR study (one row per run; columns size, variant, seed, lr, status,
val_loss, params_non_embedding). Per (size, variant) the runs at each grid point are averaged over seeds, and

    loss(x) = a + b (x - x_k) + c (x - x_k)^2,    x = ln(lr),

is fitted by least squares to the grid points within ``WINDOW`` steps of the grid minimum x_k (loss against
log-lr is parabolic only near its minimum: the high-lr side steepens towards divergence). The optimum is the
vertex x* = x_k - b / (2c), kept inside the fitted window. A run that diverged counts as worse than every
completed run at that size (it marks the high side of the curve, but has no loss to fit).

Flags, each warned about: ``on_edge`` when the grid minimum is the lowest completed grid point or the top of the
grid (the optimum may lie beyond it: extend the grid); ``edge == "divergence"`` when it is the highest lr that did
not diverge (the optimum may lie between it and the diverging lr); ``curvature`` <= 0 when the window shows no
minimum (the best grid point is reported).

Intervals (95% percentile, on ln lr): with >= 2 seeds at every grid point of a curve, the seeds are resampled
with replacement as clusters (a seed's runs at every lr together, since they share data order and
initialisation); with one seed, the losses are perturbed with N(0, sigma^2), where sigma is the given seed-noise
sd, else the pooled seed sd of curves with several seeds, else the pooled residual sd of the quadratic fits
(which includes misfit). Each replicate re-finds its own grid minimum and window.

A scipy reference (:func:`reference_optimum`, a bounded scalar minimisation of the same quadratic) checks the
closed-form vertex in the tests.
"""

from __future__ import annotations

import argparse
import math
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from results.io import atomic_write_text

from ..io.runs import AnalysisWarning
from .study_registry import add_bootstrap, add_results_out, number, register

WINDOW = 2  # grid steps on each side of the grid minimum used by the quadratic fit
CI_LEVEL = 0.95
DEFAULT_B = 2000
LR_COLUMNS = ("size", "variant", "seed", "lr", "status", "val_loss")


@dataclass
class LrOptimum:
    """The tuned learning rate of one (size, variant) curve."""

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------------------------------------------
# One curve
# ----------------------------------------------------------------------------------------------------------------


def quadratic_vertex(x: np.ndarray, y: np.ndarray, window: int = WINDOW) -> tuple[float, float, float, int, int]:
    """(x*, y(x*), c, lo, hi) of the least-squares parabola through the points ``lo..hi`` around the minimum of y.

    x must be sorted ascending; y may hold +inf for grid points whose runs diverged (they bound the window
    but are not fitted). x* is the vertex when c > 0 and lies inside [x_lo, x_hi], else the window's best grid
    point clipped to that range. With fewer than 3 finite points the best grid point is returned with c = nan.
    """
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    finite = np.isfinite(y)
    if not finite.any():
        return float("nan"), float("nan"), float("nan"), 0, len(x) - 1
    k = int(np.nanargmin(np.where(finite, y, np.inf)))
    lo, hi = max(0, k - window), min(len(x) - 1, k + window)
    sel = np.arange(lo, hi + 1)
    sel = sel[finite[sel]]
    if sel.size < 3:
        return float(x[k]), float(y[k]), float("nan"), lo, hi
    u = x[sel] - x[k]
    c2, b, a = np.polyfit(u, y[sel], 2)
    if not c2 > 0:
        return float(x[k]), float(y[k]), float(c2), lo, hi
    v = -b / (2 * c2)
    v = float(np.clip(v, x[sel].min() - x[k], x[sel].max() - x[k]))
    return float(x[k] + v), float(a + b * v + c2 * v * v), float(c2), lo, hi


def reference_optimum(x: np.ndarray, y: np.ndarray, window: int = WINDOW) -> float:
    """scipy reference for :func:`quadratic_vertex` (tests): fit the same parabola with scipy.optimize.curve_fit
    and minimise it with a bounded scalar search over the fitted window."""
    from scipy.optimize import curve_fit, minimize_scalar

    x = np.asarray(x, float)
    y = np.asarray(y, float)
    k = int(np.nanargmin(np.where(np.isfinite(y), y, np.inf)))
    lo, hi = max(0, k - window), min(len(x) - 1, k + window)
    sel = [i for i in range(lo, hi + 1) if np.isfinite(y[i])]
    xs, ys = x[sel], y[sel]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "covariance could not be estimated" on exact fits: only the fit is used
        (a, b, c), _ = curve_fit(lambda t, a, b, c: a + b * t + c * t * t, xs, ys, p0=(float(ys.mean()), 0.0, 1.0))
    res = minimize_scalar(
        lambda t: a + b * t + c * t * t, bounds=(xs.min(), xs.max()), method="bounded", options={"xatol": 1e-10}
    )
    return float(res.x)


def _edge(y: np.ndarray) -> str | None:
    """Where the best grid point sits: 'low' (the lowest lr with a completed run) or 'high' (the top of the grid),
    so the optimum may lie beyond the grid; 'divergence' (the highest lr that did not diverge, with diverged runs
    right above it), so the optimum may lie between it and the diverging lr; else None."""
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


# ----------------------------------------------------------------------------------------------------------------
# A whole LR study
# ----------------------------------------------------------------------------------------------------------------


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
        warnings.warn(
            f"LR analysis: {len(dropped)} run(s) neither completed nor diverged, or without lr/val_loss, "
            f"left out: {names}",
            AnalysisWarning,
            stacklevel=2,
        )
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


def _residual_sigma(curves: dict[tuple[str, str], tuple[np.ndarray, list[int], np.ndarray]]) -> float | None:
    """Pooled residual sd of the windowed quadratic fits of all curves (dof-weighted)."""
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


def _pooled_seed_sigma(curves: dict[tuple[str, str], tuple[np.ndarray, list[int], np.ndarray]]) -> float | None:
    ss, dof = 0.0, 0
    for _, _, M, _ in curves.values():
        for j in range(M.shape[1]):
            col = M[:, j][np.isfinite(M[:, j])]
            if col.size >= 2:
                ss += float(((col - col.mean()) ** 2).sum())
                dof += col.size - 1
    return math.sqrt(ss / dof) if dof >= 2 else None


def lr_optima(
    df: pd.DataFrame,
    *,
    B: int = DEFAULT_B,
    seed: int = 0,
    seed_sigma: float | None = None,
    window: int = WINDOW,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The tuned lr of every (size, variant) curve of an LR study, with bootstrap intervals.

    Returns (table, info): the table has one row per curve (the :class:`LrOptimum` fields), ordered by variant
    and by size (ascending non-embedding parameters); info records how the intervals were made.
    """
    d = lr_runs(df)
    if d.empty:
        raise ValueError("no completed or diverged runs with an lr: nothing to tune")
    curves = {}
    for (variant, size), g in d.groupby(["variant", "size"], sort=False):
        curves[(str(size), str(variant))] = _curve_matrix(g)
    pooled_seed = _pooled_seed_sigma(curves)
    sigma, sigma_source = _noise_sigma(curves, seed_sigma, pooled_seed)
    rows = []
    for (size, variant), (x, seeds, M, lrs) in curves.items():
        y = _mean_over_seeds(M)
        x_opt, y_opt, c, _, _ = quadratic_vertex(x, y, window)
        edge = _edge(y)
        rng = np.random.default_rng([seed, zlib.crc32(f"lr:{size}:{variant}".encode())])
        ci, method, n_seeds = _optimum_interval(x, seeds, M, x_opt, rng, B, window, sigma, sigma_source)
        g = d[(d["size"] == size) & (d["variant"] == variant)]
        n_params = (
            pd.to_numeric(g.get("params_non_embedding"), errors="coerce").median()
            if "params_non_embedding" in g
            else None
        )
        k = int(np.argmin(np.where(np.isfinite(y), y, np.inf))) if np.isfinite(y).any() else 0
        rows.append(
            LrOptimum(
                size=size,
                variant=variant,
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
            ).to_dict()
        )
    table = pd.DataFrame(rows)
    order = table.groupby("size")["params_non_embedding"].median().sort_values(na_position="last").index.tolist()
    table["_o"] = table["size"].map({s: i for i, s in enumerate(order)})
    table = table.sort_values(["variant", "_o"], kind="stable").drop(columns="_o").reset_index(drop=True)
    _warn_doubtful_optima(table)
    info = {
        "B": B,
        "seed": seed,
        "window": window,
        "ci_level": CI_LEVEL,
        "sigma": sigma,
        "sigma_source": sigma_source,
        "pooled_seed_sd": pooled_seed,
    }
    return table, info


def _noise_sigma(
    curves: dict[tuple[str, str], Any], seed_sigma: float | None, pooled_seed: float | None
) -> tuple[float | None, str]:
    """The seed noise of one run's loss for the parametric bootstrap, and where it came from: given, else pooled
    over the grid points with >= 2 seeds, else the quadratic fits' residuals."""
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


def _optimum_interval(
    x: np.ndarray,
    seeds: list[int],
    M: np.ndarray,
    x_opt: float,
    rng: np.random.Generator,
    B: int,
    window: int,
    sigma: float | None,
    sigma_source: str,
) -> tuple[list[float], str, int]:
    """One curve's 95% interval of the optimal lr (a cluster bootstrap over seeds when every grid point has >= 2,
    else parametric with ``sigma``), the method in words, and the fewest seeds of a grid point."""
    y = _mean_over_seeds(M)
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
    xs = np.array([quadratic_vertex(x, r, window)[0] for r in reps]) if reps else np.array([])
    xs = xs[np.isfinite(xs)]
    if xs.size and np.isfinite(x_opt):
        q = 100 * (1 - CI_LEVEL) / 2
        lo, hi = np.percentile(x_opt + scale * (xs - x_opt), [q, 100 - q])
        return [float(np.exp(lo)), float(np.exp(hi))], method, n_seeds
    return [float("nan"), float("nan")], method, n_seeds


def _warn_doubtful_optima(table: pd.DataFrame) -> None:
    """An AnalysisWarning for each optimum on a grid edge, at the divergence edge, or without curvature (stacklevel
    3: the warning names lr_optima's caller, as when these checks were inline)."""
    for r in table.itertuples():
        if r.on_edge:
            where = "below the lowest" if r.edge == "low" else "above the highest"
            warnings.warn(
                f"LR optimum of {r.variant} at {r.size} lies at the {r.edge} edge of the grid "
                f"(best grid lr {r.grid_best_lr:.3g}, grid {min(r.grid):.3g}..{max(r.grid):.3g}): extend the "
                f"grid {where} point",
                AnalysisWarning,
                stacklevel=3,
            )
        elif r.edge == "divergence":
            warnings.warn(
                f"LR optimum of {r.variant} at {r.size} is the highest lr that did not diverge "
                f"({r.grid_best_lr:.3g}): the optimum may lie between it and the next grid point; refine the "
                "grid there",
                AnalysisWarning,
                stacklevel=3,
            )
        elif not r.curvature > 0:
            warnings.warn(
                f"LR curve of {r.variant} at {r.size} shows no minimum around its best grid lr "
                f"{r.grid_best_lr:.3g} (curvature {r.curvature:.3g}); reported that grid point",
                AnalysisWarning,
                stacklevel=3,
            )


def lr_trend(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per variant, the least-squares power law lr* = a * N^b over sizes (N = non-embedding parameters): the
    scaling rule of the tuned lr, reported next to the per-size optima (needs >= 2 sizes with N)."""
    out = {}
    for variant, g in table.groupby("variant", sort=False):
        g = g[np.isfinite(g["lr"]) & g["params_non_embedding"].notna()]
        if g["params_non_embedding"].nunique() < 2:
            continue
        b, ln_a = np.polyfit(np.log(g["params_non_embedding"].astype(float)), np.log(g["lr"]), 1)
        out[str(variant)] = {"a": float(math.exp(ln_a)), "b": float(b), "n_sizes": len(g)}
    return out


# ----------------------------------------------------------------------------------------------------------------
# Outputs: lr.json, lr_summary.md, the figure, and the generated config the sizes read
# ----------------------------------------------------------------------------------------------------------------

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
    """The generated config: ``lr[variant][size]`` plus intervals, edge flags and where the numbers came from.

    rule "per_size" writes each curve's own optimum; "trend" writes the arm's power law lr* = a N^b (fitted over
    its sizes, :func:`lr_trend`) at each size's N, which smooths single-size noise. Both are kept in the document
    (``lr_per_size``, ``lr_trend``) whichever one ``lr`` holds."""
    if rule not in RULES:
        raise ValueError(f"rule={rule!r}; allowed values: {', '.join(RULES)}")
    trend = lr_trend(table) if trend is None else trend
    doc: dict[str, Any] = {
        "provenance": {
            **provenance,
            "rule": rule,
            "method": (
                f"quadratic in ln(lr) over the grid points within {info['window']} steps of the grid minimum; "
                f"{int(100 * info['ci_level'])}% bootstrap interval (B = {info['B']}, seed {info['seed']})"
                + ("; lr = the arm's power law a * N^b over sizes at each size's N" if rule == "trend" else "")
            ),
        }
    }
    for key in ("lr", "lr_per_size", "lr_trend", "ci95", "on_edge"):
        doc[key] = {}
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
    return doc


def write_tuned_config(doc: dict[str, Any], path: str | Path, command: str) -> Path:
    """Write the generated config atomically (a half-written file must never be read by a launching run)."""
    import yaml

    path = Path(path)
    text = TUNED_HEADER.format(command=command) + yaml.safe_dump(
        doc, sort_keys=False, default_flow_style=None, width=110
    )
    atomic_write_text(path, text)
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
    lines = [
        "# Learning-rate tuning",
        "",
        f"Source: `{source}`." if source else "",
        "",
        (
            f"| arm | size | N | optimum [95% CI] | lr written (rule {rule}) | best grid lr | loss at optimum | "
            "grid points | seeds | flags |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        flags = []
        if r.on_edge:
            flags.append(f"**on the {r.edge} edge: extend the grid**")
        elif r.edge == "divergence":
            flags.append("highest lr that did not diverge")
        if not r.curvature > 0:
            flags.append("no curvature")
        if r.n_diverged:
            flags.append(f"{r.n_diverged} diverged")
        n = f"{r.params_non_embedding:,.0f}" if r.params_non_embedding else "n/a"
        out_lr = ((tuned or {}).get(str(r.variant)) or {}).get(str(r.size))
        lines.append(
            f"| {r.variant} | {r.size} | {n} | {_fmt(r.lr)} [{_fmt(r.ci95[0])}, {_fmt(r.ci95[1])}] | "
            f"{_fmt(out_lr)} | {_fmt(r.grid_best_lr)} | {_fmt(r.loss_at_optimum)} | {r.n_grid} | {r.n_seeds} | "
            f"{', '.join(flags)} |"
        )
    lines += [
        "",
        (
            f"Optimum: vertex of a least-squares parabola in ln(lr) through the grid points within {info['window']} "
            "steps of the grid minimum (kept inside that window); a diverged run counts as worse than every completed "
            f"one. Intervals: {int(100 * info['ci_level'])}% percentile bootstrap, B = {info['B']}; single-seed curves "
            f"use a parametric bootstrap with sigma = {_fmt(info['sigma'])} ({info['sigma_source']})."
        ),
    ]
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
) -> dict[str, Any]:
    """`python -m analysis lr`: lr.json, lr_summary.md, fig_lr.{png,pdf} in ``out``, and the generated config."""
    import json
    from datetime import datetime, timezone

    from ..render import figures

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table, info = lr_optima(df, B=B, seed=seed, seed_sigma=seed_sigma)
    trend = lr_trend(table)
    runs = lr_runs(df)
    commits = sorted({str(c) for c in df.get("git_commit", pd.Series(dtype=str)).dropna() if str(c)})
    studies = sorted({str(s) for s in df.get("study", pd.Series(dtype=str)).dropna() if str(s)})
    provenance = {
        "study": ",".join(studies) or None,
        "source": df.attrs.get("source"),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commits": commits,
        "n_runs": len(runs),
        "n_diverged": int((runs["status"] == "diverged").sum()),
    }
    doc = {
        "schema_version": 1,
        "provenance": provenance,
        "info": info,
        "trend": trend,
        "optima": json.loads(table.to_json(orient="records")),
    }
    try:
        tuned: dict[str, Any] | None = tuned_document(table, info, provenance, rule, trend)
    except ValueError:
        if write_config is not None:
            raise
        tuned = None  # e.g. rule=trend with one size: nothing to write, the optima are still reported
    doc["rule"] = rule
    doc["tuned_lr"] = tuned["lr"] if tuned else None  # what the sizes read under `rule`
    written = []
    if make_figures:
        written += figures.lr_figure(runs, table, out / "fig_lr", tuned=doc["tuned_lr"], rule=rule)
    if write_config is not None and tuned is not None:
        written.append(write_tuned_config(tuned, write_config, command))
    (out / "lr.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "lr_summary.md").write_text(lr_markdown(table, info, trend, df.attrs.get("source"), doc["tuned_lr"], rule))
    doc["files"] = [str(p) for p in written] + [str(out / "lr.json"), str(out / "lr_summary.md")]
    doc["table"] = table
    return doc


# ---- python -m analysis <command> -----------------------------------------------------------------------------------


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
    p.add_argument(
        "--rule",
        default="per_size",
        choices=["per_size", "trend"],
        help="lr written per size: each size's own optimum (default), or the arm's power law in N over sizes",
    )
    p.add_argument("--no-figures", action="store_true", help="write lr.json and lr_summary.md only")


@register(
    "lr",
    help="tune the learning rate per (size, arm) from an LR study; write the config the sizes read",
    arguments=_arguments,
)
def report(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """``lr``: the tuned lr per (size, arm), lr.json, lr_summary.md (and the generated config when asked)."""
    from ..io.runs import load_one_dataset

    command = "python -m analysis " + " ".join(argv)
    df = load_one_dataset(args.results, ("completed", "diverged"), args.dataset)
    doc = run_lr(
        df,
        args.out,
        B=args.bootstrap,
        seed=args.seed,
        seed_sigma=args.seed_sigma,
        write_config=args.write_config,
        command=command,
        make_figures=not args.no_figures,
        rule=args.rule,
    )
    for r in doc["table"].itertuples():
        lo, hi = r.ci95
        edge = f"  ON THE {r.edge.upper()} EDGE OF THE GRID" if r.on_edge else ""
        print(f"{r.variant} {r.size}: lr = {number(r.lr, '.3g')} [{number(lo, '.3g')}, {number(hi, '.3g')}]{edge}")
    print(f"wrote {', '.join(doc['files'])}")
    return doc
