"""Completed runs -> the fit.json document (schema: docs/analysis.md); analysis/markdown.py renders it as Markdown."""

from __future__ import annotations

import json
import math
import warnings
from datetime import datetime, timezone
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from . import bootstrap as bs
from . import health
from .fit import (
    HUBER_DELTA,
    PowerLaw,
    arm_slopes_batch,
    fit_joint,
    fit_joint_batch,
    fit_power_law,
    multiplier_curve,
    wls_line,
)
from .runs import AnalysisWarning, keep_most_common, runs_of_kind, size_order

SCHEMA_VERSION = 1
MIN_SIZES = 3
_CHUNK = 400  # replicates per batched call: bounds memory of the (replicates x alphas x points) arrays


def check_ladder(df: pd.DataFrame, baseline: str, skip_incomplete: bool = False) -> list[str]:
    """Variants to fit (baseline first).  Raise if the baseline is absent or any variant has < 3 sizes."""
    variants = list(pd.unique(df["variant"]))
    if baseline not in variants:
        raise ValueError(
            f"no completed runs of the baseline {baseline!r} "
            f"(variants present: {', '.join(map(str, variants)) or 'none'}); "
            "pass --baseline NAME to choose another"
        )
    ok = []
    for v in [baseline] + [v for v in variants if v != baseline]:
        sizes = size_order(df[df["variant"] == v])
        if len(sizes) < MIN_SIZES:
            msg = (
                f"variant {v!r} has completed runs at only {len(sizes)} size(s) ({', '.join(sizes)}); "
                f"a scaling-law fit needs at least {MIN_SIZES} sizes"
            )
            if skip_incomplete and v != baseline:
                warnings.warn(msg + " -- skipped", AnalysisWarning, stacklevel=2)
                continue
            raise ValueError(msg)
        ok.append(v)
    return ok


def _residual_sigma(df: pd.DataFrame, variants: list[str], compute: str) -> float | None:
    """Pooled residual sd (loss units) of the per-variant paper-form fits: a last-resort seed-noise estimate."""
    sq, dof = 0.0, 0
    for v in variants:
        d = df[df["variant"] == v]
        law = fit_power_law(d[compute], d["val_loss"])
        sq += float(((d["val_loss"] - law.loss(d[compute])) ** 2).sum())
        dof += len(d) - 2
    return math.sqrt(sq / dof) if dof > 0 else None


def _chunked(fn, B: int, *arrays: np.ndarray) -> dict[str, np.ndarray]:
    parts = [fn(*(a[i : i + _CHUNK] for a in arrays)) for i in range(0, B, _CHUNK)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _loss_table(df: pd.DataFrame, variants: list[str], baseline: str, compute: str) -> list[dict[str, Any]]:
    rows = []
    base = df[df["variant"] == baseline].groupby("size")["val_loss"].mean()
    for size in size_order(df, compute):
        for v in variants:
            d = df[(df["variant"] == v) & (df["size"] == size)]
            if d.empty:
                continue
            mean = float(d["val_loss"].mean())
            rows.append(
                {
                    "size": size,
                    "variant": v,
                    "C": float(d[compute].mean()),
                    "val_loss": mean,
                    "val_loss_sd": float(d["val_loss"].std(ddof=1)) if len(d) > 1 else None,
                    "n_runs": len(d),
                    "delta_vs_baseline": mean - float(base[size]) if size in base.index and v != baseline else None,
                }
            )
    return rows


def _variant_fit(d: pd.DataFrame, name: str, plan: bs.ResamplePlan, compute: str) -> dict[str, Any]:
    C = d[compute].to_numpy(float)
    law = fit_power_law(C, d["val_loss"])
    Ls, Ws = bs.draw(d, plan, bs.rng_for(plan, "variant:" + name))
    a, s = wls_line(np.log(C), np.log(np.maximum(Ls, 1e-12)), Ws)
    resid = np.log(d["val_loss"].to_numpy(float)) - np.log(law.loss(C))
    return {
        "A": law.A,
        "A_ci95": bs.interval(law.A, np.exp(a), plan, log=True),
        "alpha": law.alpha,
        "alpha_ci95": bs.interval(law.alpha, -s, plan),
        "E": None,  # the paper form has no E; the joint fit's E is under multipliers.<name>.joint
        "law": law.describe(4),
        "sizes": size_order(d, compute),
        "n_runs": len(d),
        "C_min": float(C.min()),
        "C_max": float(C.max()),
        "rmse_log": float(np.sqrt(np.mean(resid**2))),
    }


def _pair_fit(
    df: pd.DataFrame,
    baseline: str,
    variant: str,
    plan: bs.ResamplePlan,
    compute: str,
    form: str,
    delta: float,
    draws: tuple[np.ndarray, np.ndarray] | None = None,
    pair_sd: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The multiplier of ``variant`` vs ``baseline`` with its intervals. ``draws`` = (L, W) replicates of the rows
    [baseline runs, variant runs] in that order (default: drawn here from the pair's own random stream); the
    replicates of m are returned under ``_m_boot`` (not part of fit.json). ``pair_sd``: the paired-difference sd
    per size that weights the paired multiplier (:func:`pooled_pair_sd`)."""
    d = pd.concat([df[df["variant"] == baseline], df[df["variant"] == variant]], ignore_index=True)
    C = d[compute].to_numpy(float)
    L = d["val_loss"].to_numpy(float)
    isv = (d["variant"] == variant).to_numpy()
    sizes = d["size"].astype(str).to_numpy()

    # --- point estimates -----------------------------------------------------------------------------------
    base_law = fit_power_law(C[~isv], L[~isv])
    var_law = fit_power_law(C[isv], L[isv])
    C_star = float(C[isv].max())  # the paper reads M at its largest compute point
    paper_M = float(multiplier_curve(base_law, var_law, C_star))
    C_grid = np.geomspace(C[isv].min(), C[isv].max(), 25)
    M_grid = multiplier_curve(base_law, var_law, C_grid)

    joint = fit_joint(C, L, isv, form=form, delta=delta)
    C_ref = joint.C_ref
    lnc = np.log(C / C_ref)
    sl = arm_slopes_batch(lnc, L, isv, np.ones_like(L), joint.E)
    alpha_diff = float(sl["alpha_v"] - sl["alpha_b"])
    # Baseline curve (with the joint fit's E) inverted at each variant run's loss: m_s needs no variant fit.
    inv_base = PowerLaw(
        A=float(np.exp(sl["a_b"])) * C_ref ** float(sl["alpha_b"]), alpha=float(sl["alpha_b"]), E=joint.E
    )
    m_run = inv_base.compute_for_loss(L) / C  # only the variant entries are used
    order = [s for s in size_order(d, compute) if np.any(isv & (sizes == s))]
    per_size_point = {s: float(np.exp(np.mean(np.log(m_run[isv & (sizes == s)])))) for s in order}
    geo_point = float(np.exp(np.mean(np.log(list(per_size_point.values())))))

    # --- bootstrap -----------------------------------------------------------------------------------------
    Ls, Ws = draws if draws is not None else bs.draw(d, plan, bs.rng_for(plan, "pair:" + variant))
    Ls = np.maximum(Ls, 1e-9)
    jb = _chunked(lambda l, w: fit_joint_batch(lnc, l, isv, w, joint.form, delta), plan.B, Ls, Ws)
    lnC = np.log(C)
    ab, sb = wls_line(lnC, np.log(Ls), Ws * ~isv)
    av, sv = wls_line(lnC, np.log(Ls), Ws * isv)
    with np.errstate(all="ignore"):
        # Paper-form M(C) per replicate: C_base(L_v(C)) / C with both arms' own power laws.
        def M_of(Cq: np.ndarray) -> np.ndarray:
            lnLv = av[:, None] + sv[:, None] * np.log(Cq)
            return np.exp((lnLv - ab[:, None]) / sb[:, None] - np.log(Cq))

        M_star = M_of(np.array([C_star]))[:, 0]
        M_curve = M_of(C_grid)
        slb = arm_slopes_batch(lnc, Ls, isv, Ws, jb["E"])
        diff_b = slb["alpha_v"] - slb["alpha_b"]
        y = np.maximum(Ls - jb["E"][:, None], 1e-12)
        ln_m = -(np.log(y) - slb["a_b"][:, None]) / slb["alpha_b"][:, None] - lnc  # log(C_b^-1(L)/C) per point
        per_size_boot = {}
        for s in order:
            mask = isv & (sizes == s)
            w = Ws * mask
            per_size_boot[s] = np.exp((w * np.where(mask, ln_m, 0.0)).sum(1) / w.sum(1))
        geo_boot = np.exp(np.nanmean(np.log(np.stack(list(per_size_boot.values()), 1)), 1))

    paired = _paired_multiplier(
        d,
        isv,
        L,
        C,
        order,
        Ls,
        Ws,
        plan,
        alpha=float(sl["alpha_b"]),
        E=joint.E,
        alpha_boot=slb["alpha_b"],
        E_boot=jb["E"],
        pair_sd=pair_sd,
    )
    diff_ci = bs.interval(alpha_diff, diff_b, plan)
    significant = bool(np.isfinite(diff_ci[0]) and (diff_ci[0] > 0 or diff_ci[1] < 0))
    finite_m = np.isfinite(jb["m"]) & (jb["m"] > 0)
    joint_d = joint.to_dict()
    joint_d["alpha_ci95"] = bs.interval(joint.alpha, jb["alpha"], plan)
    joint_d["E_ci95"] = bs.interval(joint.E, jb["E"], plan) if joint.form == "saturating" else None
    joint_d["huber_delta"] = delta
    per_size = {}
    for s in order:
        mask = isv & (sizes == s)
        per_size[s] = {
            "m": per_size_point[s],
            "m_ci95": bs.interval(per_size_point[s], per_size_boot[s], plan, log=True),
            "C": float(C[mask].mean()),
            "L_variant": float(L[mask].mean()),
            "n_runs": int(mask.sum()),
        }
    return {
        "baseline": baseline,
        "paper_M": paper_M,
        "paper_M_ci95": bs.interval(paper_M, M_star, plan, log=True),
        "paper_M_at_C": C_star,
        "paper_M_curve": {
            "C": C_grid.tolist(),
            "M": M_grid.tolist(),
            "ci95_lo": [bs.interval(M_grid[i], M_curve[:, i], plan, log=True)[0] for i in range(len(C_grid))],
            "ci95_hi": [bs.interval(M_grid[i], M_curve[:, i], plan, log=True)[1] for i in range(len(C_grid))],
        },
        "m": joint.m,
        "m_ci95": bs.interval(joint.m, jb["m"], plan, log=True),
        "p_m_le_1": bs.share_at_most(joint.m, jb["m"], plan, 1.0),
        "joint": joint_d,
        "exponents": {
            "E_used": joint.E,
            "alpha_base": float(sl["alpha_b"]),
            "alpha_variant": float(sl["alpha_v"]),
            "diff": alpha_diff,
            "diff_ci95": diff_ci,
            "significant": significant,
        },
        "headline": "curve" if significant else "m",
        "per_size": per_size,
        "per_size_geomean": geo_point,
        "per_size_geomean_ci95": bs.interval(geo_point, geo_boot, plan, log=True),
        "paired": paired,
        "bootstrap_failed": int((~finite_m).sum()),
        "_m_boot": jb["m"],
    }


PAIRED_SD_FLOOR = 0.005  # nats: a paired-difference sd below this is not trusted as a weight


def pooled_pair_sd(paired_deltas: list[dict[str, Any]]) -> dict[str, float]:
    """Per size: the sd of same-seed differences pooled over every variant (degrees of freedom n - 1 each).
    Three pairs give a poor sd (its 95% range is 0.16-1.9x the true one); pooling the arms of a size steadies the
    weights and gives every arm the same ones."""
    acc: dict[str, list[float]] = {}
    for r in paired_deltas:
        if r["sd"] is not None and r["n_pairs"] > 1:
            a = acc.setdefault(r["size"], [0.0, 0.0])
            a[0] += (r["n_pairs"] - 1) * r["sd"] ** 2
            a[1] += r["n_pairs"] - 1
    return {s: math.sqrt(v / k) for s, (v, k) in acc.items() if k > 0}


def _paired_multiplier(
    d: pd.DataFrame,
    isv: np.ndarray,
    L: np.ndarray,
    C: np.ndarray,
    order: list[str],
    Ls: np.ndarray,
    Ws: np.ndarray,
    plan: bs.ResamplePlan,
    *,
    alpha: float,
    E: float,
    alpha_boot: np.ndarray,
    E_boot: np.ndarray,
    pair_sd: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The multiplier from same-seed differences: at each size, the mean paired difference Delta = L_v - L_b
    (same initialisation seed and data order) read through the baseline law L = E + A C^-alpha at the size's mean
    baseline loss: ln m_s = -ln(1 + Delta / (L_b - E)) / alpha - ln(C_v / C_b) (to first order -Delta / (alpha
    (L_b - E)), the local slope). Pairing cancels what the two runs of a seed share, so m_s
    can be far tighter than the joint fit where the arms' trajectories stay together, and no tighter where they
    diverge. Sizes are pooled in ln m by random effects (DerSimonian-Laird): each size's pair-noise variance
    v_s = max(sd_s, PAIRED_SD_FLOOR)^2 / n / (alpha (L_b - E))^2, sd_s from ``pair_sd`` (the size's paired sd pooled
    over arms; this arm's own where absent; equal weights when a size has none), plus tau^2, the sizes' spread beyond
    it (Cochran's Q, reported with I^2). The interval: the same bootstrap replicates as the joint fit (cells, alpha,
    E) with the weights held at their point values, plus a normal between-size term of variance tau^2 sum(w^2).
    The constant-multiplier assumption of the shared-exponent joint fit applies; a small heterogeneity p says the
    sizes disagree with it."""
    seeds = d["seed"].astype(str).to_numpy()
    sizes = d["size"].astype(str).to_numpy()
    per_size: dict[str, Any] = {}
    ln_point, ln_boot, weight = {}, {}, {}
    for s in order:
        base_row = {seeds[i]: i for i in np.flatnonzero(~isv & (sizes == s))}
        pairs = [(base_row[seeds[i]], i) for i in np.flatnonzero(isv & (sizes == s)) if seeds[i] in base_row]
        if not pairs:
            continue
        ib, iv = (np.array(x) for x in zip(*pairs))
        delta = L[iv] - L[ib]
        ln_c = float(np.log(C[iv].mean() / C[ib].mean()))  # the variant's own FLOP overhead at this size
        ln_point[s] = float(-np.log1p(delta.mean() / (L[ib].mean() - E)) / alpha - ln_c)
        w = Ws[:, iv]  # a cell's weight is shared by both arms
        with np.errstate(all="ignore"):
            delta_b = ((Ls[:, iv] - Ls[:, ib]) * w).sum(1) / w.sum(1)
            base_b = (Ls[:, ib] * w).sum(1) / w.sum(1)
            ln_boot[s] = -np.log1p(delta_b / (base_b - E_boot)) / alpha_boot - ln_c
        sd = float(np.std(delta, ddof=1)) if len(delta) > 1 else None
        sd_w = (pair_sd or {}).get(s, sd)
        weight[s] = len(delta) / max(sd_w, PAIRED_SD_FLOOR) ** 2 if sd_w is not None else None
        m_s = float(np.exp(ln_point[s]))
        per_size[s] = {
            "m": m_s,
            "m_ci95": bs.interval(m_s, np.exp(ln_boot[s]), plan, log=True),
            "delta": float(delta.mean()),
            "delta_sd": sd,
            "n_pairs": len(delta),
            "L_base": float(L[ib].mean()),
        }
    if not per_size:
        return {"m": None, "m_ci95": None, "p_m_le_1": None, "per_size": {}}
    # Random-effects pooling (DerSimonian-Laird): v_s, the pair-noise variance of ln m_s; tau^2, the spread of the
    # sizes' own multipliers beyond it (zero when they agree). Without tau^2 a pooled m would claim the precision of
    # its tightest sizes even where the sizes disagree.
    slope = {s: alpha * (per_size[s]["L_base"] - E) for s in per_size}
    equal = any(w is None for w in weight.values())
    v = {s: (1.0 if equal else 1.0 / weight[s]) / slope[s] ** 2 for s in per_size}
    w_fe = {s: 1.0 / v[s] for s in v}
    k = len(v)
    ln_fe = sum(w_fe[s] * ln_point[s] for s in v) / sum(w_fe.values())
    Q = float(sum(w_fe[s] * (ln_point[s] - ln_fe) ** 2 for s in v)) if not equal else None
    tau2 = 0.0
    if Q is not None and k > 1:
        c = sum(w_fe.values()) - sum(x**2 for x in w_fe.values()) / sum(w_fe.values())
        tau2 = max(0.0, (Q - (k - 1)) / c) if c > 0 else 0.0
    w_re = {s: 1.0 / (v[s] + tau2) for s in v} if not equal else dict.fromkeys(v, 1.0)
    total = sum(w_re.values())
    share = {s: w / total for s, w in w_re.items()}
    ln_m = sum(share[s] * ln_point[s] for s in share)
    with np.errstate(all="ignore"):
        ln_b = sum(share[s] * ln_boot[s] for s in share)
    if tau2 > 0:  # the between-size part, which resampling seeds within sizes cannot see
        ln_b = ln_b + math.sqrt(tau2 * sum(x**2 for x in share.values())) * bs.rng_for(
            plan, "paired-tau"
        ).standard_normal(ln_b.shape)
    boot = np.exp(ln_b)
    m = float(np.exp(ln_m))
    for s in per_size:
        per_size[s]["weight"] = share[s]
        per_size[s].pop("L_base")
    p_het = float(stats.chi2.sf(Q, k - 1)) if Q is not None and k > 1 else None
    return {
        "m": m,
        "m_ci95": bs.interval(m, boot, plan, log=True),
        "p_m_le_1": bs.share_at_most(m, boot, plan, 1.0),
        "per_size": per_size,
        "sd_floor": PAIRED_SD_FLOOR,
        "heterogeneity": {
            "Q": Q,
            "dof": k - 1,
            "p": p_het,
            "tau": math.sqrt(tau2),
            "I2": max(0.0, (Q - (k - 1)) / Q) if Q else None,
        },
    }


OWN_LR = "@own_lr"  # arm-name suffix of runs trained at their own tuned lr (lr_protocol=per_arm)


def split_lr_protocols(df: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Runs of a non-baseline variant trained with ``lr_protocol=per_arm`` become the arm ``<variant>@own_lr``;
    everything else keeps its variant name (the baseline's lr is the same under both protocols)."""
    if "lr_protocol" not in df.columns:
        return df
    named = df["variant"].astype(str).str.endswith(OWN_LR)  # already split (a refit of an analysed frame)
    own = (df["lr_protocol"].astype(str) == "per_arm") & (df["variant"] != baseline) & ~named
    if not own.any():
        return df
    df = df.copy()
    df.loc[own, "variant"] = df.loc[own, "variant"].astype(str) + OWN_LR
    return df


def flag_runs(
    df: pd.DataFrame, base_dir: str | None = None
) -> tuple[pd.DataFrame, list[dict[str, Any]], list[dict[str, Any]]]:
    """The outlier rule (analysis.health) on completed runs: adds a ``flags`` column (comma-separated, "" when
    clean) and returns (df, flagged runs, cells whose seeds disagree beyond health.CELL_SD_BOUND).

    Curve flags are recomputed from the run's metrics.csv when its directory is found (so every run is judged by
    the current rule), else taken from the record's ``health`` column; ``off_mates`` compares each run with its
    (variant, size) cell."""
    from .runs import resolve_run_dir

    df = df.copy()
    flags: list[list[str]] = []
    for _, row in df.iterrows():
        run_dir = resolve_run_dir(row, base_dir)
        path = run_dir / "metrics.csv" if run_dir is not None else None
        if path is None or not path.is_file():
            h = str(row.get("health", "") or "")
            flags.append([f for f in h.split(",") if f and f not in ("ok", "nan")])
            continue
        m = pd.read_csv(path)
        val = m.dropna(subset=["val_loss"]) if "val_loss" in m else m.iloc[0:0]
        total = float(row.get("steps") or (m["step"].max() if len(m) else 0))
        flags.append(
            health.curve_flags(m["step"], m.get("train_loss", [None] * len(m)), val["step"], val["val_loss"], total)
        )
    cells = {k: g for k, g in df.groupby(["variant", "size"], sort=False)}
    sigma = health.pooled_seed_sd([g["val_loss"].to_numpy(float) for g in cells.values()])
    index = {idx: i for i, idx in enumerate(df.index)}
    disagree = []
    for (variant, size), g in cells.items():
        for idx, off in zip(g.index, health.off_seed_mates(g["val_loss"].to_numpy(float), sigma)):
            if off:
                flags[index[idx]].append("off_mates")
        if len(g) >= 2:
            sd = float(g["val_loss"].std(ddof=1))
            if sd > health.CELL_SD_BOUND:
                disagree.append(
                    {
                        "variant": variant,
                        "size": size,
                        "sd": sd,
                        "n_runs": len(g),
                        "val_losses": [float(v) for v in g["val_loss"]],
                        "bound": health.CELL_SD_BOUND,
                    }
                )
    df["flags"] = [",".join(f) for f in flags]
    flagged = [
        {
            "run_id": r["run_id"],
            "variant": r["variant"],
            "size": r["size"],
            "seed": r["seed"],
            "val_loss": float(r["val_loss"]),
            "flags": r["flags"],
        }
        for _, r in df[df["flags"] != ""].iterrows()
    ]
    for f in flagged:
        warnings.warn(
            f"outlier rule: {f['run_id']} ({f['variant']}/{f['size']}/seed {f['seed']}, val loss "
            f"{f['val_loss']:.4f}) is flagged {f['flags']}; kept in the fit and marked (docs/analysis.md)",
            AnalysisWarning,
            stacklevel=2,
        )
    for c in disagree:
        warnings.warn(
            f"seeds disagree: {c['variant']} at {c['size']} has seed sd {c['sd']:.4f} > {c['bound']} nats "
            f"({', '.join(f'{v:.4f}' for v in c['val_losses'])})",
            AnalysisWarning,
            stacklevel=2,
        )
    return df, flagged, disagree


def _paired_deltas(df: pd.DataFrame, variants: list[str], baseline: str, compute: str) -> list[dict[str, Any]]:
    """Per size and variant: the same-seed differences L_variant - L_baseline, their mean and sd."""
    rows = []
    base = df[df["variant"] == baseline].groupby(["size", "seed"])["val_loss"].mean()
    for size in size_order(df, compute):
        for v in variants:
            if v == baseline:
                continue
            d = df[(df["variant"] == v) & (df["size"] == size)].groupby("seed")["val_loss"].mean()
            diffs = [float(d[sd] - base[(size, sd)]) for sd in d.index if (size, sd) in base.index]
            if diffs:
                rows.append(
                    {
                        "size": size,
                        "variant": v,
                        "n_pairs": len(diffs),
                        "mean": float(np.mean(diffs)),
                        "sd": float(np.std(diffs, ddof=1)) if len(diffs) > 1 else None,
                        "diffs": diffs,
                    }
                )
    return rows


def _protocol_comparison(
    df: pd.DataFrame, baseline: str, variant: str, plan: bs.ResamplePlan, compute: str, form: str, delta: float
) -> dict[str, Any]:
    """m of ``variant`` at the baseline's lr (the paper's protocol) and at its own tuned lr, both from the same
    bootstrap replicates (cells drawn once for all three arms), and their ratio own / shared with its interval."""
    own = variant + OWN_LR
    u = pd.concat(
        [df[df["variant"] == baseline], df[df["variant"] == variant], df[df["variant"] == own]], ignore_index=True
    )
    Lu, Wu = bs.draw(u, plan, bs.rng_for(plan, "protocols:" + variant))
    nb, nv = int((u["variant"] == baseline).sum()), int((u["variant"] == variant).sum())
    idx_shared = np.r_[np.arange(nb), nb + np.arange(nv)]
    idx_own = np.r_[np.arange(nb), nb + nv + np.arange(len(u) - nb - nv)]
    sd = pooled_pair_sd(_paired_deltas(df, [variant, own], baseline, compute))
    shared = _pair_fit(
        df, baseline, variant, plan, compute, form, delta, draws=(Lu[:, idx_shared], Wu[:, idx_shared]), pair_sd=sd
    )
    mine = _pair_fit(df, baseline, own, plan, compute, form, delta, draws=(Lu[:, idx_own], Wu[:, idx_own]), pair_sd=sd)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio_boot = mine["_m_boot"] / shared["_m_boot"]
    ratio = mine["m"] / shared["m"]
    return {
        "shared_lr": {
            "m": shared["m"],
            "m_ci95": shared["m_ci95"],
            "p_m_le_1": shared["p_m_le_1"],
            "paired_m": shared["paired"]["m"],
            "paired_m_ci95": shared["paired"]["m_ci95"],
        },
        "own_lr": {
            "m": mine["m"],
            "m_ci95": mine["m_ci95"],
            "p_m_le_1": mine["p_m_le_1"],
            "paired_m": mine["paired"]["m"],
            "paired_m_ci95": mine["paired"]["m_ci95"],
        },
        "ratio_own_over_shared": ratio,
        "ratio_ci95": bs.interval(ratio, ratio_boot, plan, log=True),
    }


OUTLIER_MODES = ("keep", "exclude")


def analyse_scaling(
    df: pd.DataFrame,
    *,
    baseline: str = "baseline",
    compute: str = "pflops_days",
    B: int = bs.DEFAULT_B,
    seed: int = 0,
    bootstrap_mode: str = "auto",
    seed_sigma: float | None = None,
    seed_rho: float = 0.0,
    form: str = "auto",
    delta: float = HUBER_DELTA,
    skip_incomplete: bool = False,
    excluded: list[dict[str, Any]] | None = None,
    source: str | None = None,
    study: str | None = None,
    outliers: str = "keep",
    base_dir: str | None = None,
) -> dict[str, Any]:
    """Fit every variant of one compute ladder and compare each to the baseline; returns the fit.json document.

    ``df`` holds completed runs of one scaling study (see records.select_completed / records.scaling_runs).
    Runs trained with ``lr_protocol=per_arm`` form the arm ``<variant>@own_lr`` (:func:`split_lr_protocols`);
    a variant present under both protocols also gets ``protocols[variant]``: both multipliers and their ratio.
    The outlier rule flags runs (:func:`flag_runs`); ``outliers="keep"`` fits them (and adds the fit without them
    as ``without_flagged``), ``"exclude"`` leaves them out and lists them under ``excluded_runs``.
    """
    if outliers not in (*OUTLIER_MODES, "ignore"):
        raise ValueError(f"outliers={outliers!r}; allowed values: {', '.join(OUTLIER_MODES)}")
    df = split_lr_protocols(df, baseline)
    excluded = list(excluded or [])
    flagged: list[dict[str, Any]] = []
    disagree: list[dict[str, Any]] = []
    if outliers != "ignore":
        df, flagged, disagree = flag_runs(df, base_dir)
    if outliers == "exclude" and flagged:
        excluded += [{**f, "status": "completed", "reason": f"outlier rule: {f['flags']}"} for f in flagged]
        df = df[df["flags"] == ""].reset_index(drop=True)
    variants = check_ladder(df, baseline, skip_incomplete)
    df = df[df["variant"].isin(variants)].reset_index(drop=True)
    plan = bs.plan_resampling(
        df,
        B=B,
        seed=seed,
        mode=bootstrap_mode,
        sigma=seed_sigma,
        rho=seed_rho,
        residual_sigma=_residual_sigma(df, variants, compute),
    )
    if plan.mode == "parametric" and seed_sigma is None:
        warnings.warn(
            f"parametric bootstrap with sigma = {plan.sigma:.3g}: {plan.sigma_source}", AnalysisWarning, stacklevel=2
        )
    out: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": source if source is not None else df.attrs.get("source"),
        "study": study
        if study is not None
        else (sorted(set(df["study"]))[0] if "study" in df.columns and len(df) else None),
        "baseline": baseline,
        "compute": compute,
        "compute_units": "PFLOP/s-days",
        "n_runs": len(df),
        "sizes": size_order(df, compute),
        "excluded_runs": excluded,
        "bootstrap": plan.to_dict() | {"ci_level": bs.CI_LEVEL, "interval": "percentile"},
        "variants": {},
        "multipliers": {},
        "losses": _loss_table(df, variants, baseline, compute),
        "paired_deltas": _paired_deltas(df, variants, baseline, compute),
        "outliers": {
            "mode": outliers,
            "flagged": flagged,
            "cells_disagreeing": disagree,
            "rule": {
                "spike_ratio": health.SPIKE_RATIO,
                "spike_span": health.SPIKE_SPAN,
                "val_rise": health.VAL_RISE,
                "plateau_gain": health.PLATEAU_GAIN,
                "off_mates_sigmas": health.OFF_MATES_SIGMAS,
                "off_mates_floor": health.OFF_MATES_FLOOR,
                "cell_sd_bound": health.CELL_SD_BOUND,
            },
        },
        "protocols": {},
    }
    for v in variants:
        out["variants"][v] = _variant_fit(df[df["variant"] == v], v, plan, compute)
    for v in variants:
        if v != baseline:
            fit = _pair_fit(df, baseline, v, plan, compute, form, delta, pair_sd=pooled_pair_sd(out["paired_deltas"]))
            fit.pop("_m_boot")
            out["multipliers"][v] = fit
    for v in variants:
        if v != baseline and v + OWN_LR in variants:
            out["protocols"][v] = _protocol_comparison(df, baseline, v, plan, compute, form, delta)
    if outliers == "keep" and flagged:
        clean = df[df["flags"] == ""].reset_index(drop=True)
        try:
            sub = analyse_scaling(
                clean,
                baseline=baseline,
                compute=compute,
                B=B,
                seed=seed,
                bootstrap_mode=bootstrap_mode,
                seed_sigma=seed_sigma,
                seed_rho=seed_rho,
                form=form,
                delta=delta,
                skip_incomplete=True,
                outliers="ignore",
            )
            out["without_flagged"] = {
                v: {
                    "m": m["m"],
                    "m_ci95": m["m_ci95"],
                    "p_m_le_1": m["p_m_le_1"],
                    "paired_m": m["paired"]["m"],
                    "paired_m_ci95": m["paired"]["m_ci95"],
                }
                for v, m in sub["multipliers"].items()
            }
        except ValueError as e:  # too few runs left to fit
            out["without_flagged"] = {"error": str(e)}
    out["precision"] = _precision(out, baseline)
    out["_frame"] = df  # the runs as analysed (arms, flags) for the figures; not part of fit.json
    return out


def _precision(doc: dict[str, Any], baseline: str) -> dict[str, Any]:
    """How well the study resolves its answer: the baseline's seed sd per size, whether its mean loss falls with
    every step in compute, the baseline law's rmse(log L) over runs and over size means, and each multiplier's 95%
    half-width relative to m."""
    base = [r for r in doc["losses"] if r["variant"] == baseline]  # ordered by compute
    means = [r["val_loss"] for r in base]
    f = doc["variants"].get(baseline, {})
    rmse_means = None
    if f and len(base) >= 2:
        law = PowerLaw(f["A"], f["alpha"])
        rmse_means = float(
            np.sqrt(np.mean([(math.log(r["val_loss"]) - math.log(float(law.loss(r["C"])))) ** 2 for r in base]))
        )

    def half_width(est: dict[str, Any]) -> float | None:  # 95% half-width / m of {m, m_ci95}
        lo, hi = est.get("m_ci95") or (None, None)
        ok = est.get("m") and lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)
        return (hi - lo) / 2 / est["m"] if ok else None

    half = {v: half_width(m) for v, m in doc["multipliers"].items()}
    half_paired = {v: half_width(m.get("paired") or {}) for v, m in doc["multipliers"].items()}
    return {
        "paired_m_half_width_over_m": half_paired,
        "baseline_seed_sd": {r["size"]: r["val_loss_sd"] for r in base},
        "baseline_decreasing": bool(all(b < a for a, b in pairwise(means))),
        "baseline_rmse_log_runs": f.get("rmse_log"),
        "baseline_rmse_log_means": rmse_means,
        "m_half_width_over_m": half,
    }


# ----------------------------------------------------------------------------------------------------------------
# Non-ladder studies: block-size sweep (Fig. 6) and ablations (Table 4)
# ----------------------------------------------------------------------------------------------------------------


def _mean_sd(d: pd.DataFrame) -> dict[str, Any]:
    return {
        "val_loss": float(d["val_loss"].mean()),
        "val_loss_sd": float(d["val_loss"].std(ddof=1)) if len(d) > 1 else None,
        "n_runs": len(d),
    }


def _reference(df_all: pd.DataFrame, study_rows: pd.DataFrame, variant: str) -> dict[str, Any] | None:
    """A reference variant's loss at the sweep's size: from the sweep study itself, else from any other study."""
    if study_rows.empty:
        return None
    size = study_rows["size"].mode().iloc[0]
    for pool in (study_rows, df_all):
        d = pool[(pool["variant"] == variant) & (pool["size"] == size)]
        if not d.empty:
            return _mean_sd(d) | {"size": size}
    return None


def block_size_sweep(
    df_all: pd.DataFrame, baseline: str = "baseline", full: str = "full_attnres"
) -> dict[str, Any] | None:
    """Fig. 6 data: Block AttnRes loss per block size S at one model size (the study of kind ``block_size``).

    The swept runs are those with a ``block_size`` (the record leaves it empty for every other residual scheme);
    ``baseline`` and ``full`` name the reference arms."""
    if "study" not in df_all.columns or "block_size" not in df_all.columns:
        return None
    rows = runs_of_kind(df_all, "block_size")
    blocks = rows[rows["block_size"].notna()]
    if blocks.empty:
        return None
    blocks = keep_most_common(blocks, "variant", "block-size study sweeps several variants", stacklevel=2)
    sizes = sorted(set(blocks["size"]))
    if len(sizes) > 1:
        warnings.warn(
            f"block-size study spans several sizes ({', '.join(sizes)}); using the most common",
            AnalysisWarning,
            stacklevel=2,
        )
        blocks = blocks[blocks["size"] == blocks["size"].mode().iloc[0]]
    points = [{"block_size": int(S)} | _mean_sd(g) for S, g in blocks.groupby("block_size", sort=True)]
    return {
        "size": str(blocks["size"].iloc[0]),
        "points": points,
        "baseline": _reference(df_all, rows, baseline),
        "full": _reference(df_all, rows, full),
    }


def ablation_table(df_all: pd.DataFrame, baseline: str = "baseline") -> list[dict[str, Any]] | None:
    """Table 4 data: one row per variant of the study of kind ``ablations`` (mean over seeds), with Δ vs the
    baseline."""
    if "study" not in df_all.columns:
        return None
    rows = runs_of_kind(df_all, "ablations")
    if rows.empty:
        return None
    ref = _reference(df_all, rows, baseline)
    order = list(pd.unique(rows["variant"]))
    if baseline in order:
        order.remove(baseline)
        order.insert(0, baseline)
    table = []
    for v in order:
        d = rows[rows["variant"] == v]
        entry = {"variant": v} | _mean_sd(d)
        entry["delta_vs_baseline"] = entry["val_loss"] - ref["val_loss"] if ref is not None and v != baseline else None
        table.append(entry)
    if ref is not None and baseline not in order:
        table.insert(
            0,
            {
                "variant": baseline,
                "val_loss": ref["val_loss"],
                "val_loss_sd": ref["val_loss_sd"],
                "n_runs": ref["n_runs"],
                "delta_vs_baseline": None,
                "note": "from another study at the same size",
            },
        )
    return table


def arch_grid_table(
    df_all: pd.DataFrame, baseline: str = "baseline", study: str | None = None
) -> dict[str, Any] | None:
    """Fig. 7 data: final val loss per variant over the (H/L_b rows, d/L_b columns) grid of the study of kind
    ``arch_grid`` (or of the study named ``study``).

    Cells are the runs' nominal grid coordinates (record columns ``d_over_lb``, ``heads_over_lb``: the size's
    targets); the shapes they were rounded to are kept per cell under ``cells``. Seeds are averaged. Rows run from
    the largest H/L_b to the smallest, as in the paper's figure. Several compute budgets in one study are
    ambiguous: the most common one is used, with a warning.
    """
    if "study" not in df_all.columns:
        return None
    rows = df_all[df_all["study"] == study] if study is not None else runs_of_kind(df_all, "arch_grid")
    if rows.empty:
        return None
    study = str(rows["study"].iloc[0])
    missing = [c for c in ("d_over_lb", "heads_over_lb") if c not in rows.columns]
    if missing:
        warnings.warn(
            f"{study} runs lack column(s) {', '.join(missing)} (records written before the arch grid "
            "existed?); no architecture-grid table",
            AnalysisWarning,
            stacklevel=2,
        )
        return None
    rows = rows.copy()
    for col in (
        "d_over_lb",
        "heads_over_lb",
        "flops_budget",
        "n_layers",
        "d_model",
        "n_heads",
        "d_ff",
        "params_non_embedding",
        "tokens",
        "flops",
    ):
        if col in rows.columns:
            rows[col] = pd.to_numeric(rows[col], errors="coerce")
    off_grid = rows[rows["d_over_lb"].isna() | rows["heads_over_lb"].isna()]
    if not off_grid.empty:
        warnings.warn(
            f"{len(off_grid)} {study} run(s) have no grid coordinates (a size not derived from d/L_b, H/L_b) "
            f"and are left out: {', '.join(off_grid['run_id'].astype(str))}",
            AnalysisWarning,
            stacklevel=2,
        )
        rows = rows.drop(off_grid.index)
    if rows.empty:
        return None
    budgets = sorted(set(rows["flops_budget"].dropna())) if "flops_budget" in rows.columns else []
    if len(budgets) > 1:
        keep = rows["flops_budget"].mode().iloc[0]
        warnings.warn(
            f"{study} holds runs at several compute budgets ({', '.join(f'{b:.3g}' for b in budgets)}); "
            f"using the most common, {keep:.3g} FLOPs",
            AnalysisWarning,
            stacklevel=2,
        )
        rows = rows[rows["flops_budget"] == keep]
    xs = sorted({float(x) for x in rows["d_over_lb"]})
    ys = sorted({float(y) for y in rows["heads_over_lb"]}, reverse=True)
    variants = list(pd.unique(rows["variant"]))
    if baseline in variants:
        variants.remove(baseline)
        variants.insert(0, baseline)
    loss: dict[str, list[list[float | None]]] = {}
    sd: dict[str, list[list[float | None]]] = {}
    n_runs: dict[str, list[list[int]]] = {}
    best: dict[str, Any] = {}
    for v in variants:
        d = rows[rows["variant"] == v]
        grid = np.full((len(ys), len(xs)), np.nan)
        sgrid = np.full((len(ys), len(xs)), np.nan)
        ngrid = np.zeros((len(ys), len(xs)), int)
        for (x, y), g in d.groupby(["d_over_lb", "heads_over_lb"]):
            i, j = ys.index(float(y)), xs.index(float(x))
            grid[i, j] = g["val_loss"].mean()
            sgrid[i, j] = g["val_loss"].std(ddof=1) if len(g) > 1 else np.nan
            ngrid[i, j] = len(g)
        loss[v] = [[None if np.isnan(c) else float(c) for c in r] for r in grid]
        sd[v] = [[None if np.isnan(c) else float(c) for c in r] for r in sgrid]
        n_runs[v] = ngrid.tolist()
        if np.isfinite(grid).any():
            i, j = np.unravel_index(np.nanargmin(grid), grid.shape)
            best[v] = {"val_loss": float(grid[i, j]), "d_over_lb": xs[j], "heads_over_lb": ys[i]}
    delta = None
    if baseline in loss:
        b = np.array(loss[baseline], dtype=float)
        delta = {
            v: [[None if np.isnan(c) else float(c) for c in r] for r in np.array(loss[v], dtype=float) - b]
            for v in variants
            if v != baseline
        }
    shape_cols = [
        c for c in ("size", "n_layers", "d_model", "n_heads", "d_ff", "params_non_embedding") if c in rows.columns
    ]
    cells = []
    for (x, y), g in rows.groupby(["d_over_lb", "heads_over_lb"], sort=True):
        first = g[g["variant"] == baseline].iloc[0] if (g["variant"] == baseline).any() else g.iloc[0]
        cell = {"d_over_lb": float(x), "heads_over_lb": float(y)}
        for c in shape_cols:
            cell[c] = first[c] if c == "size" else (None if pd.isna(first[c]) else int(first[c]))
        if cell.get("n_layers"):
            cell["achieved_d_over_lb"] = cell["d_model"] / cell["n_layers"] if cell.get("d_model") else None
            cell["achieved_heads_over_lb"] = cell["n_heads"] / cell["n_layers"] if cell.get("n_heads") else None
        cell["tokens"] = {str(v): float(t["tokens"].mean()) for v, t in g.groupby("variant")} if "tokens" in g else None
        cells.append(cell)
    return {
        "study": study,
        "baseline": baseline if baseline in loss else None,
        "flops_budget": float(rows["flops_budget"].iloc[0]) if budgets else None,
        "d_over_lb": xs,
        "heads_over_lb": ys,
        "variants": variants,
        "val_loss": loss,
        "val_loss_sd": sd,
        "n_runs": n_runs,
        "delta_vs_baseline": delta,
        "best": best,
        "cells": cells,
    }


# ----------------------------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------------------------


def _clean(obj: Any) -> Any:
    """JSON-safe: numpy scalars to Python, NaN/inf to null."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    return obj


def write_json(doc: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(_clean(doc), indent=2, allow_nan=False) + "\n")
