"""The scaling-ladder analysis (study kind ``scaling``): one compute ladder's completed runs -> fit.json's scaling
parts (docs/analysis.md): each arm's law, each variant's multipliers (laws.multipliers), losses per size, same-seed
differences, the outlier rule's verdict, the lr-protocol comparison and the study's precision. Numbers only."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import pairwise
from typing import Any

import numpy as np
import pandas as pd

from .. import health
from ..io.report import SCHEMA_VERSION
from ..io.runs import OWN_LR, AnalysisWarning, size_order, split_lr_protocols
from . import bootstrap as bs
from .fit import PowerLaw, fit_power_law, wls_line
from .fit_options import MIN_SIZES, OUTLIER_MODES, FitOptions
from .heterogeneity import LSQ_DELTA, loss_summary, losses_disagree
from .multipliers import pair_fit, pooled_pair_sd


@dataclass
class ScalingFit:
    """:func:`analyse_scaling`'s result: ``parts`` (JSON-ready) and ``runs`` as analysed (for the figures)."""

    parts: dict[str, Any]
    runs: pd.DataFrame


def check_ladder(df: pd.DataFrame, baseline: str, skip_incomplete: bool = False) -> list[str]:
    """Variants to fit (baseline first); a ValueError without the baseline or for a variant under MIN_SIZES sizes."""
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


def _loss_table(df: pd.DataFrame, variants: list[str], baseline: str, compute: str) -> list[dict[str, Any]]:
    rows = []
    base = df[df["variant"] == baseline].groupby("size")["val_loss"].mean()
    for size in size_order(df, compute):
        for v in variants:
            d = df[(df["variant"] == v) & (df["size"] == size)]
            if d.empty:
                continue
            mean = float(d["val_loss"].mean())
            sd = float(d["val_loss"].std(ddof=1)) if len(d) > 1 else None
            delta = mean - float(base[size]) if size in base.index and v != baseline else None
            row = {"size": size, "variant": v, "C": float(d[compute].mean()), "val_loss": mean, "val_loss_sd": sd}
            rows.append(row | {"n_runs": len(d), "delta_vs_baseline": delta})
    return rows


def _variant_fit(d: pd.DataFrame, name: str, plan: bs.ResamplePlan, compute: str) -> dict[str, Any]:
    C = d[compute].to_numpy(float)
    law = fit_power_law(C, d["val_loss"])
    Ls, Ws = bs.draw(d, plan, bs.rng_for(plan, "variant:" + name))
    a, s = wls_line(np.log(C), np.log(np.maximum(Ls, 1e-12)), Ws)
    resid = np.log(d["val_loss"].to_numpy(float)) - np.log(law.loss(C))
    out = {"A": law.A, "A_ci95": bs.interval(law.A, np.exp(a), plan, log=True), "alpha": law.alpha}
    out["alpha_ci95"] = bs.interval(law.alpha, -s, plan)
    out["E"] = None  # the paper form has no E; the joint fit's E is under multipliers.<name>.joint
    out |= {"law": law.describe(4), "sizes": size_order(d, compute), "n_runs": len(d), "C_min": float(C.min())}
    return out | {"C_max": float(C.max()), "rmse_log": float(np.sqrt(np.mean(resid**2)))}


def flag_runs(
    df: pd.DataFrame, base_dir: str | None = None
) -> tuple[pd.DataFrame, list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The outlier rule (analysis.health) on completed runs: adds a ``flags`` column (comma-separated, "" when
    clean) and returns (df, flagged runs, cells whose seeds disagree beyond health.CELL_SD_BOUND, the data's spikes:
    spikes that runs of other trajectories on the same batches share, not flagged; :func:`_data_spikes`)."""
    df = df.copy()
    flags = _curve_flags(df, base_dir)
    data_spikes = _data_spikes(df, flags)
    disagree = _check_cells(df, flags)
    df["flags"] = [",".join(f) for f in flags]
    keys = ("run_id", "variant", "size", "seed")
    flagged = [
        {k: r[k] for k in keys} | {"val_loss": float(r["val_loss"]), "flags": r["flags"]}
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
    return df, flagged, disagree, data_spikes


DATA_ORDER = ("seed", "data_fingerprint", "batch_size", "seq_len")  # a run's batches: experiments.data.sampling


def _data_spikes(df: pd.DataFrame, flags: list[list[str]]) -> list[dict[str, Any]]:
    """Drop from ``flags`` (in place) the spikes that are the data's (analysis.health.data_events; a run's
    trajectory is its trunk's, ``trunk_id``, else its own) and return them as events: per seed, the spikes whose
    steps chain within DATA_EVENT_STEPS of each other are one event (``step`` its first, ``last_step`` its last)."""
    if "seed" not in df.columns:
        return []
    cols = [c for c in DATA_ORDER if c in df.columns]
    orders = [tuple(str(v) for v in r) for r in df[cols].itertuples(index=False)]
    trunks = df["trunk_id"] if "trunk_id" in df.columns else pd.Series([None] * len(df), index=df.index)
    trajectories = [str(t) if isinstance(t, str) and t else str(r) for t, r in zip(trunks, df["run_id"])]
    spikes = [next((f for f in fl if f.startswith("spike@")), None) for fl in flags]
    steps = [int(f.split("@", 1)[1]) if f else None for f in spikes]
    shared_spikes: list[tuple[int, int, str]] = []
    shared = health.data_events(steps, orders, trajectories)
    for fl, spike, step, seed, run_id, is_data in zip(flags, spikes, steps, df["seed"], df["run_id"], shared):
        if is_data and spike is not None and step is not None:
            fl.remove(spike)
            shared_spikes.append((int(seed), step, str(run_id)))
    events: list[dict[str, Any]] = []
    for seed, step, run_id in sorted(shared_spikes):
        last = events[-1] if events else None
        if last is not None and last["seed"] == seed and step - last["last_step"] <= health.DATA_EVENT_STEPS:
            last["last_step"] = step
            last["run_ids"].append(run_id)
        else:
            events.append({"seed": seed, "step": step, "last_step": step, "run_ids": [run_id]})
    return [e | {"n_runs": len(e["run_ids"]), "run_ids": sorted(e["run_ids"])} for e in events]


def _curve_flags(df: pd.DataFrame, base_dir: str | None) -> list[list[str]]:
    """Each run's curve flags: from its metrics.csv when found (the current rule), else its record's ``health``."""
    from ..io.runs import resolve_run_dir

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
    return flags


def _check_cells(df: pd.DataFrame, flags: list[list[str]]) -> list[dict[str, Any]]:
    """Flag ``off_mates`` the runs far from their cell's seed-mates; return the cells whose seeds disagree."""
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
                losses = [float(v) for v in g["val_loss"]]
                cell = {"variant": variant, "size": size, "sd": sd, "n_runs": len(g), "val_losses": losses}
                disagree.append(cell | {"bound": health.CELL_SD_BOUND})
    return disagree


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
                sd = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else None
                row = {"size": size, "variant": v, "n_pairs": len(diffs), "mean": float(np.mean(diffs)), "sd": sd}
                rows.append(row | {"diffs": diffs})
    return rows


def _protocol_comparison(
    df: pd.DataFrame, baseline: str, variant: str, plan: bs.ResamplePlan, compute: str, form: str, delta: float
) -> dict[str, Any]:
    """m of ``variant`` at the baseline's lr and at its own tuned lr, on one draw of the three arms' cells, and
    their ratio own / shared with its interval."""
    own = variant + OWN_LR
    u = pd.concat(
        [df[df["variant"] == baseline], df[df["variant"] == variant], df[df["variant"] == own]], ignore_index=True
    )
    Lu, Wu = bs.draw(u, plan, bs.rng_for(plan, "protocols:" + variant))
    nb, nv = int((u["variant"] == baseline).sum()), int((u["variant"] == variant).sum())
    idx_shared = np.r_[np.arange(nb), nb + np.arange(nv)]
    idx_own = np.r_[np.arange(nb), nb + nv + np.arange(len(u) - nb - nv)]
    sd = pooled_pair_sd(_paired_deltas(df, [variant, own], baseline, compute))
    shared = pair_fit(
        df, baseline, variant, plan, compute, form, delta, draws=(Lu[:, idx_shared], Wu[:, idx_shared]), pair_sd=sd
    )
    mine = pair_fit(df, baseline, own, plan, compute, form, delta, draws=(Lu[:, idx_own], Wu[:, idx_own]), pair_sd=sd)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio_boot = mine["_m_boot"] / shared["_m_boot"]
    ratio = mine["m"] / shared["m"]
    return {
        "shared_lr": _headline(shared),
        "own_lr": _headline(mine),
        "ratio_own_over_shared": ratio,
        "ratio_ci95": bs.interval(ratio, ratio_boot, plan, log=True),
    }


def analyse_scaling(
    df: pd.DataFrame,
    options: FitOptions | None = None,
    *,
    excluded: list[dict[str, Any]] | None = None,
    source: str | None = None,
    base_dir: str | None = None,
) -> ScalingFit:
    """fit.json's scaling parts for one scaling study's completed runs ``df``: every variant fitted and compared to
    the baseline. ``excluded``: runs left out before; ``source``: the input (default ``df.attrs["source"]``);
    ``base_dir``: where run directories (metrics for the outlier rule) are found. Per-arm-lr runs form
    ``<variant>@own_lr``; ``outliers="keep"`` fits flagged runs and adds ``without_flagged``, ``"exclude"`` drops
    them into ``excluded_runs``."""
    opt = options if options is not None else FitOptions()
    if opt.outliers not in (*OUTLIER_MODES, "ignore"):
        raise ValueError(f"outliers={opt.outliers!r}; allowed values: {', '.join(OUTLIER_MODES)}")
    df = split_lr_protocols(df, opt.baseline)
    excluded = list(excluded or [])
    flagged: list[dict[str, Any]] = []
    disagree: list[dict[str, Any]] = []
    data_spikes: list[dict[str, Any]] = []
    if opt.outliers != "ignore":
        df, flagged, disagree, data_spikes = flag_runs(df, base_dir)
    if opt.outliers == "exclude" and flagged:
        excluded += [{**f, "status": "completed", "reason": f"outlier rule: {f['flags']}"} for f in flagged]
        df = df[df["flags"] == ""].reset_index(drop=True)
    variants = check_ladder(df, opt.baseline, opt.skip_incomplete)
    df = df[df["variant"].isin(variants)].reset_index(drop=True)
    plan = opt.plan(df, _residual_sigma(df, variants, opt.compute))
    if plan.mode == "parametric" and opt.seed_sigma is None:
        warnings.warn(
            f"parametric bootstrap with sigma = {plan.sigma:.3g}: {plan.sigma_source}", AnalysisWarning, stacklevel=2
        )
    out = _document_head(df, opt, plan, variants, excluded, source)
    out["outliers"] = _outlier_report(opt.outliers, flagged, disagree, data_spikes)
    out["protocols"] = {}
    _fit_arms(out, df, opt, plan, variants)
    if opt.outliers == "keep" and flagged:
        out["without_flagged"] = _without_flagged(df, opt)
    out["precision"] = _precision(out, opt.baseline)
    return ScalingFit(out, df)


def _document_head(
    df: pd.DataFrame,
    opt: FitOptions,
    plan: bs.ResamplePlan,
    variants: list[str],
    excluded: list[dict[str, Any]],
    source: str | None,
) -> dict[str, Any]:
    """The document's first parts (``variants`` and ``multipliers`` empty: :func:`_fit_arms` fills them)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": source if source is not None else df.attrs.get("source"),
        "study": opt.study
        if opt.study is not None
        else (sorted(set(df["study"]))[0] if "study" in df.columns and len(df) else None),
        "baseline": opt.baseline,
        "compute": opt.compute,
        "compute_units": "PFLOP/s-days",
        "n_runs": len(df),
        "sizes": size_order(df, opt.compute),
        "excluded_runs": excluded,
        "bootstrap": plan.to_dict() | {"ci_level": bs.CI_LEVEL, "interval": "percentile"},
        "variants": {},
        "multipliers": {},
        "losses": _loss_table(df, variants, opt.baseline, opt.compute),
        "paired_deltas": _paired_deltas(df, variants, opt.baseline, opt.compute),
    }


def _outlier_report(
    mode: str, flagged: list[dict[str, Any]], disagree: list[dict[str, Any]], data_spikes: list[dict[str, Any]]
) -> dict[str, Any]:
    """fit.json ``outliers``: the mode, the flagged runs, the disagreeing cells, the data's spikes (only when there
    are some) and the rule's constants."""
    names = ("SPIKE_RATIO", "SPIKE_SPAN", "VAL_RISE", "PLATEAU_GAIN", "OFF_MATES_SIGMAS", "OFF_MATES_FLOOR")
    rule = {n.lower(): getattr(health, n) for n in (*names, "CELL_SD_BOUND")}
    if data_spikes:
        rule["data_event_steps"] = health.DATA_EVENT_STEPS
    out = {"mode": mode, "flagged": flagged, "cells_disagreeing": disagree}
    return out | ({"data_spikes": data_spikes} if data_spikes else {}) | {"rule": rule}


def _fit_arms(
    out: dict[str, Any], df: pd.DataFrame, opt: FitOptions, plan: bs.ResamplePlan, variants: list[str]
) -> None:
    """Fill ``variants``, ``multipliers`` and ``protocols``, in that order (each from its own random stream)."""
    base, compute, form, delta = opt.baseline, opt.compute, opt.form, opt.delta
    for v in variants:
        out["variants"][v] = _variant_fit(df[df["variant"] == v], v, plan, compute)
    for v in variants:
        if v != base:
            sd = pooled_pair_sd(out["paired_deltas"])
            fit = pair_fit(df, base, v, plan, compute, form, delta, pair_sd=sd)
            fit.pop("_m_boot")
            if delta < LSQ_DELTA:  # the same law and replicates by least squares, beside the Huber fit
                lsq = loss_summary(pair_fit(df, base, v, plan, compute, form, LSQ_DELTA, pair_sd=sd), LSQ_DELTA)
                fit["least_squares"] = lsq
                fit["loss_disagreement"] = losses_disagree(fit["m"], fit["m_ci95"], lsq["m"], lsq["m_ci95"])
            out["multipliers"][v] = fit
    for v in variants:
        if v != base and v + OWN_LR in variants:
            out["protocols"][v] = _protocol_comparison(df, base, v, plan, compute, form, delta)


def _without_flagged(df: pd.DataFrame, opt: FitOptions) -> dict[str, Any]:
    """fit.json ``without_flagged``: the multipliers refitted without the flagged runs (or why they cannot be)."""
    clean = df[df["flags"] == ""].reset_index(drop=True)
    try:
        sub = analyse_scaling(clean, opt.replace(skip_incomplete=True, outliers="ignore")).parts
    except ValueError as e:  # too few runs left to fit
        return {"error": str(e)}
    return {v: _headline(m) for v, m in sub["multipliers"].items()}


def _headline(multiplier: dict[str, Any]) -> dict[str, Any]:
    """A multiplier's headline numbers: the joint fit's m with its interval and P(m <= 1), and the paired m."""
    paired = {"paired_m": multiplier["paired"]["m"], "paired_m_ci95": multiplier["paired"]["m_ci95"]}
    return {k: multiplier[k] for k in ("m", "m_ci95", "p_m_le_1")} | paired


def _precision(doc: dict[str, Any], baseline: str) -> dict[str, Any]:
    """How well the study resolves its answer: the baseline's seed sd per size, whether its mean loss falls with
    compute, its law's rmse(log L) over runs and size means, and each multiplier's 95% half-width over m."""
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
