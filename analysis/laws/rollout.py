"""Rollout (fit.json ``rollout``): the ladder's joint fit (analysis.laws.fit.fit_joint) without its largest
rung(s) predicts each arm's mean loss there, with the fit's bootstrap interval widened in log by 1.96 x the fitted
cell means' rms log residual (ln L_pred ± sqrt(d_fit² + (1.96 s)²), each end apart), beside the measurement; and
the predicted Δ and m beside the measured ones. docs/analysis.md ("--rollout").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from ..io.runs import size_order
from . import bootstrap as bs
from .fit import fit_joint, fit_joint_batch
from .fit_options import FitOptions
from .multipliers import chunked

Z95 = 1.959963984540054
_CHUNK = 250  # bootstrap replicates per batched call (bounds the saturating search's memory)


def _log_interval(point: float, boot: np.ndarray, plan: bs.ResamplePlan, extra_sd: float) -> list[float] | None:
    """The percentile interval of ``boot`` about ``point`` in log, widened by ``extra_sd`` (log units) at each end."""
    ok = boot[np.isfinite(boot) & (boot > 0)]
    if not ok.size or not point > 0:
        return None
    lo, hi = bs.interval(point, ok, plan, log=True)
    d_lo, d_hi = math.log(point / lo), math.log(hi / point)
    return [point * math.exp(-math.hypot(d_lo, Z95 * extra_sd)), point * math.exp(math.hypot(d_hi, Z95 * extra_sd))]


def rollout(
    runs: pd.DataFrame,
    options: FitOptions | None = None,
    held_out: int = 1,
    measured: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """fit.json ``rollout``: the ladder ``runs`` (arms as fitted) without their ``held_out`` largest rungs, each
    variant against the baseline: predicted and measured losses, Δ and m at the held-out rungs. ``measured``: the
    full ladder's ``multipliers``, set beside. A ValueError when fewer than three rungs would remain."""
    opt = options if options is not None else FitOptions()
    base, compute = opt.baseline, opt.compute
    sizes = size_order(runs, compute)
    if held_out < 1 or len(sizes) - held_out < 3:
        raise ValueError(
            f"a rollout holds out 1 or more of the {len(sizes)} rungs and fits at least 3: held_out={held_out}"
        )
    held, kept = sizes[-held_out:], sizes[:-held_out]
    train = runs[runs["size"].isin(kept)]
    test = runs[runs["size"].isin(held)]
    out: dict[str, Any] = {
        "held_out": held,
        "fitted_sizes": kept,
        "form_requested": opt.form,
        "prediction_interval": "bootstrap of the fit, widened by the fitted cell means' rms log residual "
        "(docs/analysis.md, Rollout)",
        "variants": {},
    }
    for v in [str(x) for x in pd.unique(runs["variant"]) if x != base]:
        d = pd.concat([train[train["variant"] == base], train[train["variant"] == v]], ignore_index=True)
        if d.empty or d[d["variant"] == v]["size"].nunique() < 2:
            continue
        out["variants"][v] = _rollout_pair(d, test, base, v, opt, (measured or {}).get(v))
    return out


def _point(
    size: str,
    arm: str,
    rows: pd.DataFrame,
    C_at: float,
    pred: float,
    boot: np.ndarray,
    plan: bs.ResamplePlan,
    s_res: float,
) -> dict[str, Any]:
    """One held-out (size, arm): ``pred`` at ``C_at`` with its fit and prediction intervals, beside ``rows``' mean."""
    pi = _log_interval(pred, boot, plan, s_res)
    meas = float(rows["val_loss"].mean())
    sd = float(rows["val_loss"].std(ddof=1)) if len(rows) > 1 else None
    out = {"size": size, "arm": arm, "C": C_at, "predicted": pred, "fit_ci95": _log_interval(pred, boot, plan, 0.0)}
    out |= {"prediction_interval95": pi, "measured": meas, "measured_sd": sd, "n_runs": len(rows)}
    return out | {"error": meas - pred, "inside": bool(pi is not None and pi[0] <= meas <= pi[1])}


def _rollout_pair(
    d: pd.DataFrame, test: pd.DataFrame, base: str, v: str, opt: FitOptions, full: dict[str, Any] | None
) -> dict[str, Any]:
    compute, delta = opt.compute, opt.delta
    C, L = d[compute].to_numpy(float), d["val_loss"].to_numpy(float)
    isv = (d["variant"] == v).to_numpy()
    jf = fit_joint(C, L, isv, form=opt.form, delta=delta)
    # the scatter the fit leaves at the level of a cell mean (one arm, one rung, its seeds averaged)
    fitted = np.where(isv, jf.variant_law().loss(C), jf.base_law().loss(C))
    cells = d.assign(_pred=fitted)
    means = cells.groupby(["variant", "size"])[["val_loss", "_pred"]].mean()
    r = np.log(means["val_loss"].to_numpy(float)) - np.log(means["_pred"].to_numpy(float))
    dof = max(len(r) - 4, 1)
    s_res = float(math.sqrt(float((r**2).sum()) / dof))
    plan = opt.plan(d, float(np.std(L - fitted, ddof=1)))
    Ls, Ws = bs.draw(d, plan, bs.rng_for(plan, "rollout:" + v))
    Ls = np.maximum(Ls, 1e-9)
    lnc = np.log(C / jf.C_ref)
    jb = chunked(lambda l, w: fit_joint_batch(lnc, l, isv, w, jf.form, delta), len(Ls), Ls, Ws, chunk=_CHUNK)
    points, deltas = [], []
    for size in size_order(test, compute):
        at = test[test["size"] == size]
        pred_arm = {}
        for arm, law, amp in ((base, jf.base_law(), jb["A_b"]), (v, jf.variant_law(), jb["A_v"])):
            rows = at[at["variant"] == arm]
            if rows.empty:
                continue
            C_at = float(np.exp(np.log(rows[compute].to_numpy(float)).mean()))
            pred_arm[arm] = jb["E"] + amp * (C_at / jf.C_ref) ** (-jb["alpha"])
            points.append(_point(size, arm, rows, C_at, float(law.loss(C_at)), pred_arm[arm], plan, s_res))
        if len(pred_arm) == 2:
            b_rows, v_rows = at[at["variant"] == base], at[at["variant"] == v]
            pairs = pd.merge(b_rows[["seed", "val_loss"]], v_rows[["seed", "val_loss"]], on="seed")
            pred_d = float(points[-1]["predicted"] - points[-2]["predicted"])
            boot_d = pred_arm[v] - pred_arm[base]
            ok = boot_d[np.isfinite(boot_d)]
            ci = bs.interval(pred_d, ok, plan) if ok.size else None
            measured = float((pairs["val_loss_y"] - pairs["val_loss_x"]).mean()) if len(pairs) else None
            delta_row = {"size": size, "predicted": pred_d, "predicted_ci95": ci, "measured": measured}
            deltas.append(delta_row | {"n_pairs": len(pairs)})
    m_ok = jb["m"][np.isfinite(jb["m"]) & (jb["m"] > 0)]
    entry: dict[str, Any] = {
        "joint": {k: getattr(jf, k) for k in ("form", "E", "A_base", "A_variant", "alpha", "m", "C_ref", "fallback")},
        "m": jf.m,
        "m_ci95": bs.interval(jf.m, m_ok, plan, log=True) if m_ok.size else None,
        "residual_sd_log": s_res,
        "bootstrap": plan.mode,
        "points": points,
        "delta": deltas,
    }
    if full:
        entry |= {"measured_m": full.get("m"), "measured_m_ci95": full.get("m_ci95")}
        held = {p["size"] for p in points}
        entry["measured_m_s"] = {s: (full.get("per_size") or {}).get(s, {}).get("m") for s in held}
    return entry
