"""The compute multiplier of one variant against the baseline on a scaling ladder by every estimator (paper-form
M(C), the joint fit's m, the per-size m_s, the paired multiplier), each with its bootstrap interval: fit.json's
``multipliers.<variant>`` (docs/analysis.md, "Methods")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from ..io.runs import size_order
from . import bootstrap as bs
from .fit import (
    PowerLaw,
    arm_slopes_batch,
    fit_joint,
    fit_joint_batch,
    fit_power_law,
    joint_draws_at_bound,
    multiplier_curve,
    wls_line,
)
from .heterogeneity import rung_test

_CHUNK = 400  # replicates per batched call: bounds memory of the (replicates x alphas x points) arrays


def chunked(fn, B: int, *arrays: np.ndarray, chunk: int = _CHUNK) -> dict[str, np.ndarray]:
    """``fn`` on ``chunk`` replicates of ``arrays`` at a time, its arrays concatenated."""
    parts = [fn(*(a[i : i + chunk] for a in arrays)) for i in range(0, B, chunk)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


@dataclass(frozen=True)
class _Pair:
    """One comparison's rows, baseline first: compute, loss, variant mask, sizes, and the variant's sizes in order."""

    C: np.ndarray
    L: np.ndarray
    isv: np.ndarray
    sizes: np.ndarray
    order: list[str]

    @classmethod
    def of(cls, d: pd.DataFrame, variant: str, compute: str) -> _Pair:
        isv = (d["variant"] == variant).to_numpy()
        sizes = d["size"].astype(str).to_numpy()
        order = [s for s in size_order(d, compute) if np.any(isv & (sizes == s))]
        return cls(d[compute].to_numpy(float), d["val_loss"].to_numpy(float), isv, sizes, order)

    def at(self, size: str) -> np.ndarray:
        """The variant's rows at ``size``."""
        return self.isv & (self.sizes == size)


def pair_fit(
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
    """The multiplier of ``variant`` vs ``baseline`` with its intervals (m's replicates under ``_m_boot``, not part
    of fit.json). ``draws``: (L, W) replicates of [baseline rows, variant rows] (default: the pair's own stream);
    ``pair_sd``: the per-size paired sd weighting the paired multiplier (:func:`pooled_pair_sd`)."""
    d = pd.concat([df[df["variant"] == baseline], df[df["variant"] == variant]], ignore_index=True)
    pair = _Pair.of(d, variant, compute)
    point = _point_estimates(pair, form, delta)
    Ls, Ws = draws if draws is not None else bs.draw(d, plan, bs.rng_for(plan, "pair:" + variant))
    Ls = np.maximum(Ls, 1e-9)
    boot = _replicates(pair, point, Ls, Ws, plan, delta)
    # the paired multiplier (docs/analysis.md, "Paired multiplier"): per size from the same-seed differences through
    # the baseline's law (alpha_b, E), pooled over sizes by random effects
    law = (float(point["sl"]["alpha_b"]), point["joint"].E)
    laws = (law, (boot["slb"]["alpha_b"], boot["jb"]["E"]))
    per_size, ln_point, ln_boot, weight = _paired_sizes(d, pair, (Ls, Ws), plan, laws, pair_sd)
    paired = {"m": None, "m_ci95": None, "p_m_le_1": None, "per_size": {}}
    if per_size:
        paired = _pool_sizes(per_size, ln_point, ln_boot, weight, plan, law)
    return _multiplier_entry(baseline, pair, point, boot, paired, plan, delta)


def _point_estimates(pair: _Pair, form: str, delta: float) -> dict[str, Any]:
    """Every estimator's point estimate: paper-form M(C), the joint fit, the arms' own exponents under its E, m_s."""
    C, L, isv = pair.C, pair.L, pair.isv
    base_law = fit_power_law(C[~isv], L[~isv])
    var_law = fit_power_law(C[isv], L[isv])
    C_star = float(C[isv].max())  # the paper reads M at its largest compute point
    C_grid = np.geomspace(C[isv].min(), C[isv].max(), 25)
    joint = fit_joint(C, L, isv, form=form, delta=delta)
    lnc = np.log(C / joint.C_ref)
    sl = arm_slopes_batch(lnc, L, isv, np.ones_like(L), joint.E)
    # Baseline curve (with the joint fit's E) inverted at each variant run's loss: m_s needs no variant fit.
    inv_base = PowerLaw(
        A=float(np.exp(sl["a_b"])) * joint.C_ref ** float(sl["alpha_b"]), alpha=float(sl["alpha_b"]), E=joint.E
    )
    m_run = inv_base.compute_for_loss(L) / C  # only the variant entries are used
    per_size = {s: float(np.exp(np.mean(np.log(m_run[pair.at(s)])))) for s in pair.order}
    paper = {"paper_M": float(multiplier_curve(base_law, var_law, C_star)), "C_star": C_star, "C_grid": C_grid}
    out = paper | {"M_grid": multiplier_curve(base_law, var_law, C_grid), "joint": joint, "lnc": lnc, "sl": sl}
    out |= {"alpha_diff": float(sl["alpha_v"] - sl["alpha_b"]), "per_size": per_size}
    return out | {"geo": float(np.exp(np.mean(np.log(list(per_size.values())))))}


def headline_gap(pair: _Pair, point: dict[str, Any]) -> dict[str, Any] | None:
    """Where the joint fit's m lies outside the per-size m_s' range (else None): ln m - ln geo(m_s) split into
    the baseline curves' share (``factor_curves``) and the variant's runs off their fitted curve
    (``factor_off_curve``), docs/analysis.md "Per-size check"."""
    joint = point["joint"]
    m_s = list(point["per_size"].values())
    lo, hi = min(m_s), max(m_s)
    if not (np.isfinite(joint.m) and (joint.m > hi or joint.m < lo)):
        return None
    on_joint = PowerLaw(A=joint.A_base, alpha=joint.alpha, E=joint.E).compute_for_loss(pair.L) / pair.C
    with np.errstate(divide="ignore", invalid="ignore"):
        per = [float(np.exp(np.mean(np.log(on_joint[pair.at(s)])))) for s in pair.order]
        geo_joint = float(np.exp(np.mean(np.log(per))))
    out = {"side": "above" if joint.m > hi else "below", "m_s_min": lo, "m_s_max": hi, "alpha_shared": joint.alpha}
    out |= {"alpha_base": float(point["sl"]["alpha_b"]), "E": joint.E, "m_s_joint_curve_geomean": geo_joint}
    # the baseline curve (the joint fit's vs the baseline's own), and the variant's fitted curve vs its runs
    return out | {"factor_curves": geo_joint / point["geo"], "factor_off_curve": joint.m / geo_joint}


def _replicates(
    pair: _Pair, point: dict[str, Any], Ls: np.ndarray, Ws: np.ndarray, plan: bs.ResamplePlan, delta: float
) -> dict[str, Any]:
    """Every estimator on each bootstrap replicate (Ls, Ws: the pair's rows' losses and weights)."""
    isv, lnc = pair.isv, point["lnc"]
    jb = chunked(lambda l, w: fit_joint_batch(lnc, l, isv, w, point["joint"].form, delta), plan.B, Ls, Ws)
    lnC = np.log(pair.C)
    ab, sb = wls_line(lnC, np.log(Ls), Ws * ~isv)
    av, sv = wls_line(lnC, np.log(Ls), Ws * isv)
    with np.errstate(all="ignore"):
        # Paper-form M(C) per replicate: C_base(L_v(C)) / C with both arms' own power laws.
        def M_of(Cq: np.ndarray) -> np.ndarray:
            lnLv = av[:, None] + sv[:, None] * np.log(Cq)
            return np.exp((lnLv - ab[:, None]) / sb[:, None] - np.log(Cq))

        M_star = M_of(np.array([point["C_star"]]))[:, 0]
        M_curve = M_of(point["C_grid"])
        slb = arm_slopes_batch(lnc, Ls, isv, Ws, jb["E"])
        y = np.maximum(Ls - jb["E"][:, None], 1e-12)
        ln_m = -(np.log(y) - slb["a_b"][:, None]) / slb["alpha_b"][:, None] - lnc  # log(C_b^-1(L)/C) per point
        per_size = {}
        for s in pair.order:
            mask = pair.at(s)
            w = Ws * mask
            per_size[s] = np.exp((w * np.where(mask, ln_m, 0.0)).sum(1) / w.sum(1))
        geo = np.exp(np.nanmean(np.log(np.stack(list(per_size.values()), 1)), 1))
        diff = slb["alpha_v"] - slb["alpha_b"]
    at_bound = joint_draws_at_bound(jb, Ls, Ws, point["joint"].form)
    out = {"jb": jb, "at_bound": at_bound, "M_star": M_star, "M_curve": M_curve, "slb": slb, "diff": diff}
    return out | {"per_size": per_size, "geo": geo}


def _multiplier_entry(
    baseline: str,
    pair: _Pair,
    point: dict[str, Any],
    boot: dict[str, Any],
    paired: dict[str, Any],
    plan: bs.ResamplePlan,
    delta: float,
) -> dict[str, Any]:
    """fit.json's ``multipliers.<variant>`` from the point estimates and their replicates."""
    joint, jb, at_bound = point["joint"], boot["jb"], boot["at_bound"]
    diff_ci = bs.interval(point["alpha_diff"], boot["diff"], plan)
    diff_bound = bs.ends_at_bound(point["alpha_diff"], boot["diff"], at_bound, plan, diff_ci)
    # The exponents differ only where the end that excludes 0 is the data's, not a bound's.
    significant = bool(
        np.isfinite(diff_ci[0]) and ((diff_ci[0] > 0 and not diff_bound[0]) or (diff_ci[1] < 0 and not diff_bound[1]))
    )
    finite_m = np.isfinite(jb["m"]) & (jb["m"] > 0)
    joint_d = joint.to_dict() | {"alpha_ci95": bs.interval(joint.alpha, jb["alpha"], plan)}
    joint_d["alpha_ci95_at_bound"] = bs.ends_at_bound(joint.alpha, jb["alpha"], at_bound, plan, joint_d["alpha_ci95"])
    joint_d["E_ci95"] = bs.interval(joint.E, jb["E"], plan) if joint.form == "saturating" else None
    if joint.form == "saturating":
        joint_d["E_ci95_at_bound"] = bs.ends_at_bound(joint.E, jb["E"], at_bound, plan, joint_d["E_ci95"])
    joint_d |= {"draws_at_bound": int(at_bound.sum()), "huber_delta": delta}
    m_ci = bs.interval(joint.m, jb["m"], plan, log=True)
    per_size = {}
    for s in pair.order:
        mask = pair.at(s)
        per_size[s] = {
            "m": point["per_size"][s],
            "m_ci95": bs.interval(point["per_size"][s], boot["per_size"][s], plan, log=True),
            "C": float(pair.C[mask].mean()),
            "L_variant": float(pair.L[mask].mean()),
            "n_runs": int(mask.sum()),
        }
    exponents = {"E_used": joint.E, "alpha_base": float(point["sl"]["alpha_b"])}
    exponents |= {"alpha_variant": float(point["sl"]["alpha_v"]), "diff": point["alpha_diff"], "diff_ci95": diff_ci}
    exponents |= {"diff_ci95_at_bound": diff_bound, "significant": significant}
    C_grid, M_grid, M_curve = point["C_grid"], point["M_grid"], boot["M_curve"]
    M_ci = [bs.interval(M_grid[i], M_curve[:, i], plan, log=True) for i in range(len(C_grid))]
    return {
        "baseline": baseline,
        "paper_M": point["paper_M"],
        "paper_M_ci95": bs.interval(point["paper_M"], boot["M_star"], plan, log=True),
        "paper_M_at_C": point["C_star"],
        "paper_M_curve": {
            "C": C_grid.tolist(),
            "M": M_grid.tolist(),
            "ci95_lo": [c[0] for c in M_ci],
            "ci95_hi": [c[1] for c in M_ci],
        },
        "m": joint.m,
        "m_ci95": m_ci,
        "m_ci95_at_bound": bs.ends_at_bound(joint.m, jb["m"], at_bound, plan, m_ci, log=True),
        "p_m_le_1": bs.share_at_most(joint.m, jb["m"], plan, 1.0),
        "joint": joint_d,
        "exponents": exponents,
        "headline": "curve" if significant else "m",
        "per_size": per_size,
        "per_size_geomean": point["geo"],
        "per_size_geomean_ci95": bs.interval(point["geo"], boot["geo"], plan, log=True),
        "paired": paired,
        "rung_test": rung_test(
            {s: math.log(v) for s, v in point["per_size"].items()},
            {s: np.log(boot["per_size"][s]) for s in pair.order},
            {s: per_size[s]["C"] for s in pair.order},
            plan,
            sum(plan.seeds_per_size.get(s, 1) - 1 for s in pair.order) if plan.mode == "paired_cluster" else None,
        ),
        "bootstrap_failed": int((~finite_m).sum()),
        "_m_boot": jb["m"],
    } | ({"headline_gap": gap} if (gap := headline_gap(pair, point)) else {})


PAIRED_SD_FLOOR = 0.005  # nats: a paired-difference sd below this is not trusted as a weight


def pooled_pair_sd(paired_deltas: list[dict[str, Any]]) -> dict[str, float]:
    """Per size: the sd of same-seed differences pooled over every variant (n - 1 degrees of freedom each)."""
    acc: dict[str, list[float]] = {}
    for r in paired_deltas:
        if r["sd"] is not None and r["n_pairs"] > 1:
            a = acc.setdefault(r["size"], [0.0, 0.0])
            a[0] += (r["n_pairs"] - 1) * r["sd"] ** 2
            a[1] += r["n_pairs"] - 1
    return {s: math.sqrt(v / k) for s, (v, k) in acc.items() if k > 0}


def _paired_sizes(
    d: pd.DataFrame,
    pair: _Pair,
    draws: tuple[np.ndarray, np.ndarray],
    plan: bs.ResamplePlan,
    laws: tuple[tuple[float, float], tuple[np.ndarray, np.ndarray]],
    pair_sd: dict[str, float] | None,
) -> tuple[dict[str, Any], dict[str, float], dict[str, np.ndarray], dict[str, float | None]]:
    """Per size with same-seed pairs: its entry, ln m_s = -ln(1 + Delta / (L_b - E)) / alpha - ln(C_v / C_b) from
    the mean difference Delta, its replicates and its weight (pairs / max(sd, PAIRED_SD_FLOOR)^2, sd from
    ``pair_sd``; None without an sd). ``laws``: the baseline's (alpha, E) and their replicates."""
    Ls, Ws = draws
    (alpha, E), (alpha_boot, E_boot) = laws
    isv, L, C, sizes = pair.isv, pair.L, pair.C, pair.sizes
    seeds = d["seed"].astype(str).to_numpy()
    per_size: dict[str, Any] = {}
    ln_point, ln_boot, weight = {}, {}, {}
    for s in pair.order:
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
    return per_size, ln_point, ln_boot, weight


def _pool_sizes(
    per_size: dict[str, Any],
    ln_point: dict[str, float],
    ln_boot: dict[str, np.ndarray],
    weight: dict[str, float | None],
    plan: bs.ResamplePlan,
    law: tuple[float, float],
) -> dict[str, Any]:
    """The sizes' m_s pooled in ln m by random effects (DerSimonian-Laird), with the interval (the replicates plus
    a normal between-size term of variance tau^2 sum(w^2)) and the heterogeneity test."""
    alpha, E = law
    # v_s: the pair-noise variance of ln m_s; tau^2: the sizes' spread beyond it (zero when they agree)
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
