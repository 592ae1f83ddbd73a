"""Resampling for confidence intervals (docs/analysis.md, "Intervals"): the paired, size-stratified cluster
bootstrap over (size, seed) cells (both arms of a cell drawn together), or a parametric seed-noise bootstrap.
Replicates are arrays ``L (B, n)`` and ``W (B, n)`` over the original runs (a resampled cell is an integer weight).
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

DEFAULT_B = 2000
CI_LEVEL = 0.95


@dataclass
class ResamplePlan:
    mode: str  # "paired_cluster" or "parametric"
    B: int = DEFAULT_B
    seed: int = 0
    sigma: float | None = None  # parametric: seed-noise standard deviation of one run's final val loss
    rho: float = 0.0  # parametric: correlation of the noise of the two arms within a cell
    sigma_source: str | None = None
    seeds_per_size: dict[str, int] = field(default_factory=dict)
    scale: float = 1.0  # deviations of replicates are multiplied by this (sqrt(n/(n-1)) small-sample correction)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_resampling(
    df: pd.DataFrame,
    *,
    B: int = DEFAULT_B,
    seed: int = 0,
    mode: str = "auto",
    sigma: float | None = None,
    rho: float = 0.0,
    residual_sigma: float | None = None,
) -> ResamplePlan:
    """How to resample ``df`` (columns size, seed, variant, val_loss). auto: the cluster bootstrap when every size
    has >= 2 seeds, else the parametric one, its sigma the given one, else the pooled seed sd, else
    ``residual_sigma``."""
    if mode not in ("auto", "cluster", "parametric"):
        raise ValueError(f"bootstrap mode={mode!r} is unknown; allowed values: auto, cluster, parametric")
    if B < 1:
        raise ValueError(f"bootstrap B={B} must be >= 1")
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"seed-noise correlation rho={rho} must be in [0, 1)")
    n_seeds = df.groupby("size")["seed"].nunique().to_dict()
    all_multi = min(n_seeds.values()) >= 2
    if mode == "cluster" and not all_multi:
        single = sorted(s for s, k in n_seeds.items() if k < 2)
        raise ValueError(
            f"the cluster bootstrap needs >= 2 seeds at every size; single-seed sizes: {', '.join(single)}"
        )
    if mode == "cluster" or (mode == "auto" and all_multi):
        # Percentile intervals from n resampled seeds are too narrow by ~sqrt((n-1)/n); undo that per stratum.
        ratio = np.mean([k / (k - 1) for k in n_seeds.values()])
        return ResamplePlan("paired_cluster", B, seed, seeds_per_size=n_seeds, scale=float(np.sqrt(ratio)))
    if sigma is not None:
        if not sigma > 0:
            raise ValueError(f"seed-noise sigma={sigma} must be > 0")
        src = "given (--seed-sigma)"
    else:
        groups = df.groupby(["variant", "size"])["val_loss"]
        var = groups.var(ddof=1).dropna()
        dof = (groups.count() - 1)[var.index]
        if dof.sum() >= 2:
            sigma = float(np.sqrt((var * dof).sum() / dof.sum()))
            src = f"pooled seed standard deviation of the {int((dof > 0).sum())} (variant, size) groups with >= 2 seeds"
        elif residual_sigma is not None and residual_sigma > 0:
            sigma = float(residual_sigma)
            src = (
                "residual standard deviation of the per-variant power-law fits (includes misfit; pass --seed-sigma "
                "from a seed study)"
            )
        else:
            raise ValueError("one seed per cell and no seed-noise sigma: pass --seed-sigma (from a pilot seed study)")
    return ResamplePlan("parametric", B, seed, sigma=float(sigma), rho=rho, sigma_source=src, seeds_per_size=n_seeds)


def rng_for(plan: ResamplePlan, key: str) -> np.random.Generator:
    """A generator seeded by (plan.seed, key): reproducible, and independent of the order pairs are analysed in."""
    return np.random.default_rng([plan.seed, zlib.crc32(key.encode())])


def draw(df: pd.DataFrame, plan: ResamplePlan, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Replicates of ``df`` (rows = points in the order given): losses L (B, n) and weights W (B, n)."""
    n = len(df)
    L0 = df["val_loss"].to_numpy(float)
    cells = pd.MultiIndex.from_arrays([df["size"].astype(str), df["seed"].astype(str)])
    cell_codes, cell_index = pd.factorize(cells)
    if plan.mode == "paired_cluster":
        W = np.zeros((plan.B, n))
        sizes = df["size"].astype(str).to_numpy()
        for s in pd.unique(sizes):
            in_s = sizes == s
            codes = np.unique(cell_codes[in_s])  # the seeds (cells) of this size
            k = codes.size
            picks = rng.integers(0, k, size=(plan.B, k))
            counts = (picks[:, :, None] == np.arange(k)).sum(1)  # (B, k): times each cell was drawn
            local = np.searchsorted(codes, cell_codes[in_s])
            W[:, in_s] = counts[:, local]
        return np.broadcast_to(L0, (plan.B, n)).copy(), W
    # Parametric: perturb the observed losses with seed noise; the two arms of a cell share a fraction rho.
    z_cell = rng.standard_normal((plan.B, len(cell_index)))[:, cell_codes]
    z_run = rng.standard_normal((plan.B, n))
    noise = plan.sigma * (np.sqrt(plan.rho) * z_cell + np.sqrt(1.0 - plan.rho) * z_run)
    return L0 + noise, np.ones((plan.B, n))


def _log(samples: np.ndarray, est: float) -> tuple[np.ndarray, float]:
    """ln of the positive samples (nan elsewhere) and of ``est`` (nan unless > 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.log(np.where(samples > 0, samples, np.nan))
    return s, (np.log(est) if est > 0 else np.nan)


def interval(
    est: float, samples: np.ndarray, plan: ResamplePlan, log: bool = False, level: float = CI_LEVEL
) -> list[float]:
    """Percentile interval of ``samples`` (deviations from ``est`` scaled by plan.scale), optionally in log space."""
    s = np.asarray(samples, float)
    if log:
        s, est = _log(s, est)
    s = s[np.isfinite(s)]
    if s.size == 0 or not np.isfinite(est):
        return [float("nan"), float("nan")]
    adj = est + plan.scale * (s - est)
    q = 100 * (1 - level) / 2
    lo, hi = np.percentile(adj, [q, 100 - q])
    return [float(np.exp(lo)), float(np.exp(hi))] if log else [float(lo), float(hi)]


def ends_at_bound(
    est: float,
    samples: np.ndarray,
    at_bound: np.ndarray,
    plan: ResamplePlan,
    ci: list[float],
    log: bool = False,
) -> list[bool]:
    """[lo, hi]: whether each end of ``ci`` (:func:`interval` of ``samples``) is set by an optimizer bound: some
    replicate flagged in ``at_bound`` lies at or beyond it (after the same scaling)."""
    flags = [False, False]
    s = np.asarray(samples, float)
    mask = np.asarray(at_bound, bool)
    if not mask.any() or ci is None or any(c is None or not np.isfinite(c) for c in ci):
        return flags
    if log:
        s, est = _log(s, est)
        lo, hi = np.log(ci[0]), np.log(ci[1])
    else:
        lo, hi = ci
    if not np.isfinite(est):
        return flags
    adj = est + plan.scale * (s[mask] - est)
    adj = adj[np.isfinite(adj)]
    tol = 1e-12 * max(1.0, abs(hi), abs(lo))
    return [bool((adj <= lo + tol).any()), bool((adj >= hi - tol).any())]


def share_at_most(est: float, samples: np.ndarray, plan: ResamplePlan, threshold: float = 1.0) -> float:
    """P(m <= threshold) over the (scaled, log-space) bootstrap distribution of a positive quantity."""
    ls, l_est = _log(np.asarray(samples, float), est)
    ls = ls[np.isfinite(ls)]
    if ls.size == 0 or not est > 0:
        return float("nan")
    adj = l_est + plan.scale * (ls - l_est)
    return float(np.mean(adj <= np.log(threshold)))
