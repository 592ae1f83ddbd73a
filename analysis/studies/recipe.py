"""The recipe study (``python -m analysis recipe``): ladder rungs x arms x two training recipes (``optimizer+
lr_schedule``, e.g. AdamW + cosine against Muon + WSD) x seeds. (a) the baseline's compute multiplier under the new
recipe against the reference recipe (its runs relabelled ``baseline@<recipe>``); (b) each arm against the baseline
under each recipe; (c) the recipe x arm interaction per rung (analysis.laws.paired.rung_interaction); (d) beside
every multiplier its wall-clock one (analysis.laws.wallclock); each fitted on the design seeds, the held-out seeds
and all, with the held-out check. Writes recipe.json, recipe_summary.md and two figures. Methods: docs/analysis.md,
"Recipe study"."""

from __future__ import annotations

import argparse
import math
import textwrap
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..io.report import SCHEMA_VERSION, write_report
from ..io.runs import AnalysisWarning, load_results, select_completed, size_order, warn_duplicate_cells
from ..laws.fit import PowerLaw
from ..laws.fit_options import MIN_SIZES, FitOptions
from ..laws.heterogeneity import rung_part
from ..laws.isoflop import finite_or_none
from ..laws.paired import rung_interaction, verdict
from ..laws.scaling_ladder import analyse_scaling
from ..laws.wallclock import WallclockOptions, combine, time_ratio
from ..render.figures import delta_errorbar, save
from ..render.multiplier_text import rung_headline, rung_markdown
from ..render.tables import fmt, markdown_table
from .study_registry import add_arms, add_bootstrap, options_from, register, seed_list

RECIPE_COLUMNS = ("optimizer", "lr_schedule")
DESIGN_SEEDS = (0, 1, 2)
HELD_OUT_SEEDS = (20, 21, 22)
DUPLICATE_CELLS = r"\d+ cell\(s\) hold more than one run"  # analysis.io.runs.warn_duplicate_cells's message


@dataclass(frozen=True)
class RecipeOptions:
    """The two recipes compared, the baseline arm, the arms' lr protocol read (the baseline's runs are read under
    any), the seed sets fitted apart, and the scaling fit's options (its bootstrap also the time ratio's)."""

    reference_recipe: str = "adamw+cosine"
    recipe: str = "muon+wsd"
    baseline: str = "baseline"
    lr_protocol: str = "baseline"
    design_seeds: tuple[int, ...] = DESIGN_SEEDS
    held_out_seeds: tuple[int, ...] = HELD_OUT_SEEDS
    fit: FitOptions = field(default_factory=FitOptions)

    @property
    def recipes(self) -> tuple[str, str]:
        return (self.reference_recipe, self.recipe)

    def label(self, recipe: str) -> str:
        return f"{self.baseline}@{recipe}"

    @property
    def wallclock(self) -> WallclockOptions:
        return WallclockOptions(B=self.fit.B, seed=self.fit.seed)


def recipe_of(df: pd.DataFrame) -> pd.Series:
    """Each run's recipe, ``optimizer+lr_schedule``; missing columns or empty fields: a one-line ValueError."""
    src = df.attrs.get("source", "the results table")
    missing = [c for c in RECIPE_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"{src} has no {' or '.join(missing)} column: a recipe study needs each run's optimizer and lr_schedule "
            "(the record fields naming its training recipe)"
        )
    parts = [df[c].fillna("").astype(str).str.strip() for c in RECIPE_COLUMNS]
    empty = (parts[0] == "") | (parts[1] == "")
    if empty.any():
        ids = ", ".join(map(str, df.loc[empty, "run_id"].head(5))) if "run_id" in df.columns else ""
        raise ValueError(
            f"{src}: {int(empty.sum())} run(s) have an empty optimizer or lr_schedule ({ids}); a recipe study needs "
            "both for every run"
        )
    return parts[0] + "+" + parts[1]


def _completed(df: pd.DataFrame, opts: RecipeOptions) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    with warnings.catch_warnings():  # a cell's two recipes (or a timing table's re-runs) are not duplicate runs
        warnings.filterwarnings("ignore", message=DUPLICATE_CELLS, category=AnalysisWarning)
        return select_completed(df, opts.fit.compute)


def _at_protocol(done: pd.DataFrame, opts: RecipeOptions) -> pd.DataFrame:
    """The baseline's runs under any lr protocol, the other arms' under ``opts.lr_protocol``."""
    if "lr_protocol" in done.columns:
        protocol = done["lr_protocol"].fillna("").replace("", "baseline")
        done = done[(done["variant"] == opts.baseline) | (protocol == opts.lr_protocol)]
    return done


def recipe_runs(df: pd.DataFrame, opts: RecipeOptions = RecipeOptions()) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """The completed runs of the two recipes read (:func:`_at_protocol`; with a ``recipe`` column) and the runs left
    out. A recipe or the baseline under one missing: a one-line ValueError; a third recipe: warned, left out."""
    src = df.attrs.get("source", "the results table")
    recipe_of(df.iloc[0:0])  # the columns first: their absence is the one error a pre-recipe table gets
    done, excluded = _completed(df, opts)
    done = done.assign(recipe=recipe_of(done) if len(done) else pd.Series(dtype=str))
    present = done["recipe"].value_counts()
    missing = [r for r in opts.recipes if r not in present.index]
    if missing:
        held = ", ".join(f"{r} ({n} run(s))" for r, n in present.items()) or "no completed run"
        raise ValueError(
            f"the recipe study needs completed runs of both {opts.reference_recipe} and {opts.recipe}; "
            f"{src} has none of {', '.join(missing)} (it holds {held})"
        )
    others = sorted(set(present.index) - set(opts.recipes))
    if others:
        warnings.warn(f"runs of recipe(s) {', '.join(others)} are not read", AnalysisWarning, stacklevel=2)
    done = done[done["recipe"].isin(opts.recipes)]
    for r in opts.recipes:
        warn_duplicate_cells(done[done["recipe"] == r])
    done = _at_protocol(done, opts)
    for r in opts.recipes:
        if not ((done["variant"] == opts.baseline) & (done["recipe"] == r)).any():
            raise ValueError(f"no completed run of the baseline {opts.baseline!r} under {r} in {src}")
    done = done.reset_index(drop=True)
    done.attrs = dict(df.attrs)
    return done, excluded


def seed_sets(runs: pd.DataFrame, opts: RecipeOptions = RecipeOptions()) -> dict[str, list[int]]:
    """The seed sets fitted apart: ``design`` and ``held_out`` (where the runs hold any), and ``all`` unless it
    equals one of them."""
    present = {int(s) for s in runs["seed"]}
    sets = {
        name: sorted(present & set(wanted))
        for name, wanted in (("design", opts.design_seeds), ("held_out", opts.held_out_seeds))
        if present & set(wanted)
    }
    if not any(set(v) == present for v in sets.values()):
        sets["all"] = sorted(present)
    return sets


def headline_set(sets: dict[str, list[int]]) -> str:
    return "all" if "all" in sets else next(iter(sets))


def _finite_interval(x: Any) -> list[float] | None:
    if not x or any(v is None or not math.isfinite(v) for v in x):
        return None
    return [float(v) for v in x]


def _estimate(m: float | None, m_ci95: Any, p_le_1: float | None, timing: dict[str, Any]) -> dict[str, Any]:
    m = float(m) if m is not None and math.isfinite(m) else None
    interval = _finite_interval(m_ci95)
    half = (interval[1] - interval[0]) / 2 / m * 100 if m and interval else None
    p = float(p_le_1) if p_le_1 is not None and math.isfinite(p_le_1) else None
    return {"m": m, "m_ci95": interval, "half_width_pct": half, "p_m_le_1": p, **combine(m, interval, timing)}


def compare(
    runs: pd.DataFrame,
    reference: str,
    arms: list[str],
    opts: RecipeOptions,
    base_dir: str | None = None,
    timed: pd.DataFrame | None = None,
) -> dict[str, dict[str, Any]]:
    """Every arm of ``runs`` against ``reference`` by laws.scaling_ladder's fit, each with its time ratio over
    ``timed`` (default ``runs``): per arm the joint and paired estimates, the joint laws, the exponent difference,
    the rungs, ``n_runs`` and ``sizes``; or ``error`` (with the timing) where it cannot be fitted."""
    timed = runs if timed is None else timed
    runs = runs.drop(columns=[c for c in ("lr_protocol",) if c in runs.columns])  # filtered already: one protocol
    out: dict[str, dict[str, Any]] = {}
    try:
        fit = analyse_scaling(
            runs, opts.fit.replace(baseline=reference, skip_incomplete=True), base_dir=base_dir, source=""
        ).parts
    except ValueError as e:  # too few rungs or seeds to fit: the time ratios still stand
        return {a: {"error": str(e), "timing": time_ratio(timed, reference, a, opts.wallclock)} for a in arms}
    for arm in arms:
        mult = fit["multipliers"].get(arm)
        timing = time_ratio(timed, reference, arm, opts.wallclock)
        if mult is None:
            n = runs[runs["variant"] == arm]["size"].nunique()
            out[arm] = {"error": f"{arm!r} ran at {n} rung(s); a fit needs at least {MIN_SIZES}", "timing": timing}
            continue
        joint, paired = mult["joint"], mult.get("paired") or {}
        exps = mult["exponents"]
        pair = runs[runs["variant"].isin([reference, arm])]
        out[arm] = {
            "joint": _estimate(mult["m"], mult["m_ci95"], mult["p_m_le_1"], timing),
            "paired": _estimate(paired.get("m"), paired.get("m_ci95"), paired.get("p_m_le_1"), timing),
            "m_ci95_at_bound": mult.get("m_ci95_at_bound"),
            "law_reference": {"E": joint["E"], "A": joint["A_base"], "alpha": joint["alpha"]},
            "law_arm": {"E": joint["E"], "A": joint["A_variant"], "alpha": joint["alpha"]},
            "joint_form": joint["form"],
            "exponent_diff": exps["diff"],
            "exponent_diff_ci95": _finite_interval(exps["diff_ci95"]),
            "paired_heterogeneity_p": (paired.get("heterogeneity") or {}).get("p"),
            "rungs": rung_part(mult, timing),
            "timing": timing,
            "n_runs": {k: int((pair["variant"] == v).sum()) for k, v in (("reference", reference), ("arm", arm))},
            "sizes": size_order(pair, opts.fit.compute),
        }
    return out


def baseline_table(runs: pd.DataFrame, opts: RecipeOptions) -> pd.DataFrame:
    base = runs[runs["variant"] == opts.baseline].copy()
    base["variant"] = [opts.label(r) for r in base["recipe"]]
    return base


def interaction_rows(runs: pd.DataFrame, arms: list[str], opts: RecipeOptions) -> list[dict[str, Any]]:
    """Per arm under both recipes and rung: laws.paired.rung_interaction's Δ under each recipe and the interaction
    Δ_recipe − Δ_reference, its verdict in words (``gains more under <recipe>`` when its interval lies below 0)."""
    by = {r: runs[runs["recipe"] == r] for r in (opts.recipe, opts.reference_recipe)}
    words = {"wins": f"gains more under {opts.recipe}", "loses": f"gains less under {opts.recipe}"}
    rows = []
    for arm in arms:
        if not all((df["variant"] == arm).any() for df in by.values()):
            continue
        for r in rung_interaction(by, arm, opts.baseline).to_dict("records"):
            word = verdict(r["interaction_ci95"], r["n_pairs"])
            row = {"arm": arm} | {k: r[k] for k in ("n_layers", "d_model", "seeds")}
            row["baseline_loss"] = {k: finite_or_none(r[f"ref_loss_{k}"]) for k in opts.recipes}
            row["delta"] = {
                k: {"delta": r[f"delta_{k}"], "ci95": r[f"delta_{k}_ci95"], "verdict": r[f"verdict_{k}"]}
                for k in opts.recipes
            }
            row |= {"interaction": r["interaction"], "interaction_ci95": r["interaction_ci95"]}
            rows.append(row | {"interaction_verdict": words.get(word, word), "n_pairs": r["n_pairs"]})
    return rows


def timing_runs(df: pd.DataFrame, opts: RecipeOptions = RecipeOptions()) -> pd.DataFrame:
    """The completed runs of a timing table that (d) reads, as :func:`recipe_runs`'s; either recipe may be absent."""
    done, _ = _completed(df, opts)
    if done.empty:
        return done.assign(recipe=pd.Series(dtype=str))
    done = done.assign(recipe=recipe_of(done))
    return _at_protocol(done[done["recipe"].isin(opts.recipes)], opts).reset_index(drop=True)


@dataclass
class RecipeReport:
    """recipe.json's document (``parts``) and the runs read, which the figures draw."""

    parts: dict[str, Any]
    runs: pd.DataFrame


def analyse_recipe(
    df: pd.DataFrame, opts: RecipeOptions = RecipeOptions(), timing: pd.DataFrame | None = None
) -> RecipeReport:
    """The recipe study's report from all its records ``df``: ``baseline_recipe[<seed set>]`` (a),
    ``arms_vs_baseline[<recipe>][<seed set>][<arm>]`` (b, d), ``interaction`` (c), ``held_out_check``, ``cost``, ...
    ``timing``: records of extra runs of the same configurations, read (for every seed set) for the time ratios only."""
    runs, excluded = recipe_runs(df, opts)
    timed = (
        pd.concat([runs, timing_runs(timing, opts)], ignore_index=True) if timing is not None and len(timing) else runs
    )
    base_dir = df.attrs.get("base_dir")
    arms = sorted(set(runs["variant"]) - {opts.baseline})
    sets = seed_sets(runs, opts)
    a: dict[str, Any] = {}
    b: dict[str, Any] = {r: {} for r in opts.recipes}
    new, reference = opts.label(opts.recipe), opts.label(opts.reference_recipe)
    for name, seeds in sets.items():
        sub = runs[runs["seed"].isin(seeds)]
        a[name] = compare(baseline_table(sub, opts), reference, [new], opts, base_dir, baseline_table(timed, opts))[new]
        for r in opts.recipes:
            one = sub[sub["recipe"] == r]
            here = [x for x in arms if (one["variant"] == x).any()]
            b[r][name] = (
                compare(one, opts.baseline, here, opts, base_dir, timed=timed[timed["recipe"] == r]) if here else {}
            )
    rungs = [{"size": s} for s in size_order(runs, opts.fit.compute)]
    if {"n_layers", "d_model"} <= set(runs.columns):
        for rung in rungs:
            first = runs[runs["size"] == rung["size"]].iloc[0]
            rung |= {"n_layers": int(first["n_layers"]), "d_model": int(first["d_model"])}
    parts = {
        "schema_version": SCHEMA_VERSION,
        "source": df.attrs.get("source"),
        "reference_recipe": opts.reference_recipe,
        "recipe": opts.recipe,
        "baseline": opts.baseline,
        "arms": arms,
        "lr_protocol": opts.lr_protocol,
        "compute": opts.fit.compute,
        "n_runs": len(runs),
        "runs_per_recipe": {r: int((runs["recipe"] == r).sum()) for r in opts.recipes},
        "rungs": rungs,
        "seed_sets": sets,
        "headline_seed_set": headline_set(sets),
        "regime": regime_line(runs, opts),
        "bootstrap": {"B": opts.fit.B, "seed": opts.fit.seed, "mode": opts.fit.bootstrap_mode},
        "baseline_recipe": a,
        "arms_vs_baseline": b,
        "interaction": interaction_rows(runs, arms, opts),
        "held_out_check": held_out_check(a, b, opts),
        "cost": cost(runs, opts),
        "timing_runs": len(timed) - len(runs),
        "excluded_runs": excluded,
    }
    return RecipeReport(parts, runs)


def held_out_check(a: dict[str, Any], b: dict[str, Any], opts: RecipeOptions) -> list[dict[str, Any]]:
    """Per multiplier fitted on both design and held-out seeds, per estimator: whether the held-out m lies ``inside``
    the design interval (None without one)."""
    pairs = [(f"{opts.recipe} vs {opts.reference_recipe} (baseline)", a)]
    pairs += [
        (f"{arm} vs {opts.baseline} under {r}", {k: v.get(arm, {}) for k, v in b[r].items()})
        for r in opts.recipes
        for arm in dict.fromkeys(arm for fits in b[r].values() for arm in fits)
    ]
    rows = []
    for what, by_set in pairs:
        design, held = by_set.get("design") or {}, by_set.get("held_out") or {}
        if "error" in design or "error" in held or not design or not held:
            continue
        for est in ("joint", "paired"):
            d, h = design[est], held[est]
            interval = d["m_ci95"]
            inside = interval[0] <= h["m"] <= interval[1] if interval and h["m"] is not None else None
            row = {"comparison": what, "estimator": est, "design_m": d["m"], "design_m_ci95": interval}
            rows.append(row | {"held_out_m": h["m"], "held_out_m_ci95": h["m_ci95"], "inside": inside})
    return rows


def cost(runs: pd.DataFrame, opts: RecipeOptions) -> dict[str, Any]:
    """Per recipe and in all, in hours: the summed ``cpu_h`` and ``wall_h``, and ``span_h``, first start to last
    finish; None where no run records it."""

    def hours(d: pd.DataFrame, col: str) -> float | None:
        v = pd.to_numeric(d[col], errors="coerce").dropna() if col in d.columns else pd.Series(dtype=float)
        return float(v.sum() / 3600) if len(v) else None

    def span(d: pd.DataFrame) -> float | None:
        if not {"started_at", "finished_at"} <= set(d.columns):
            return None
        start = pd.to_datetime(d["started_at"], errors="coerce", utc=True).min()
        end = pd.to_datetime(d["finished_at"], errors="coerce", utc=True).max()
        return float((end - start).total_seconds() / 3600) if pd.notna(start) and pd.notna(end) else None

    parts = {"all": runs} | {r: runs[runs["recipe"] == r] for r in opts.recipes}
    return {
        k: {"cpu_h": hours(d, "cpu_time_s"), "wall_h": hours(d, "wall_time_s"), "span_h": span(d), "runs": len(d)}
        for k, d in parts.items()
    }


def regime_line(runs: pd.DataFrame, opts: RecipeOptions) -> str:
    def span(col: str) -> str | None:
        if col not in runs.columns or runs[col].isna().all():
            return None
        lo, hi = int(runs[col].min()), int(runs[col].max())
        return f"{lo}" if lo == hi else f"{lo}–{hi}"

    bits = []
    if (lb := span("n_layers")) is not None:
        bits.append(f"L_b {lb}")
    if (d := span("d_model")) is not None:
        bits.append(f"d_model {d}")
    if {"tokens", "params_non_embedding"} <= set(runs.columns):
        tpp = (runs["tokens"] / runs["params_non_embedding"]).astype(float).dropna()
        if len(tpp):
            bits.append(
                f"{tpp.min():.0f}"
                + (f"–{tpp.max():.0f}" if round(tpp.min()) != round(tpp.max()) else "")
                + " tokens per parameter"
            )
    seeds = sorted({int(s) for s in runs["seed"]})
    return (
        f"Regime: {', '.join(bits) or 'shape not recorded'}; {len(runs)} completed runs of "
        f"{', '.join([opts.baseline, *sorted(set(runs['variant']) - {opts.baseline})])} under "
        f"{opts.reference_recipe} and {opts.recipe}; seeds {','.join(map(str, seeds))}; arms at the "
        f"{opts.lr_protocol} lr protocol. The paper's claim is at 24–34 sublayers, d_model 896–1264 and ~200 tokens "
        "per parameter: this speaks for this shape only."
    )


def _m_cell(est: dict[str, Any] | None, key: str = "m", with_half: bool = True) -> str:
    if not est or est.get(key) is None:
        return "n/a"
    interval = est.get(f"{key}_ci95")
    text = f"{est[key]:.3f}× {_interval(interval)}"
    if with_half and key == "m" and est.get("half_width_pct") is not None:
        text += f" (±{est['half_width_pct']:.0f}%)"
    return text


def _interval(interval: list[float] | None) -> str:
    return f"[{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "[n/a]"


def _ratio(x: float | None, interval: list[float] | None = None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.3f}" + (f" {_interval(interval)}" if interval else "")


def _loss(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _seed_text(sets: dict[str, list[int]], name: str) -> str:
    return f"{name} ({','.join(map(str, sets[name]))})"


DEFINITIONS = (
    "m: the reference reaches the arm's loss with m× the arm's compute (joint fit: shared exponent, 95% bootstrap "
    "interval; paired: same-seed differences through the reference's law), ± the half-width in % of m. m_wall = m × "
    "s_ref / s_arm, s = cpu_time_s / flops pooled per arm (geometric mean over rungs of per-rung geometric means): "
    "> 1 means the arm also wins on the clock. Step-time ratio: (cpu_time_s / steps) arm ÷ reference; m_wall = m ÷ "
    'step-time ratio × FLOPs-per-step ratio. docs/analysis.md, "Recipe study".'
)


def recipe_markdown(doc: dict[str, Any]) -> str:
    ref, new, sets = doc["reference_recipe"], doc["recipe"], doc["seed_sets"]
    notes: list[str] = []
    out = [f"# Recipe study: {new} against {ref}", "", doc["regime"], "", DEFINITIONS, ""]
    out += [f"## (a) The baseline: {new} against {ref}", ""]
    columns = ["runs", "m", "m_wall", "paired m", "paired m_wall"]
    rows = [_row([_seed_text(sets, name)], e, notes, f"(a) {name}") for name, e in doc["baseline_recipe"].items()]
    out += markdown_table(["seeds", *columns, "step-time ratio", "FLOPs/step ratio"], rows)
    out += ["", "## (b) Each arm against the baseline, under each recipe", ""]
    rows = [
        _row([r, _seed_text(sets, name), arm], e, notes, f"(b) {r} {name} {arm}", p=True)
        for r, by_set in doc["arms_vs_baseline"].items()
        for name, fits in by_set.items()
        for arm, e in fits.items()
    ]
    out += markdown_table(["recipe", "seeds", "arm", *columns, "P(m ≤ 1)", "step-time ratio"], rows)
    out += _held_out_section(doc) + _interaction_section(doc) + rung_section(doc) + _step_time_section(doc)
    header = ["runs of", "runs", "CPU time (h, summed)", "wall time (h, summed)", "first start to last finish (h)"]
    rows = [[k, f"{v['runs']}", *(fmt(v[t], 3) for t in ("cpu_h", "wall_h", "span_h"))] for k, v in doc["cost"].items()]
    out += ["", "## Cost", "", *markdown_table(header, rows)]
    if doc["excluded_runs"]:
        out += ["", "## Runs not read", ""]
        out += [
            f"- {e['run_id']} ({e['variant']}/{e['size']}/seed {e['seed']}): {e['reason']}"
            for e in doc["excluded_runs"]
        ]
    if notes:
        out += ["", "## Why a number is n/a", "", *notes]
    return "\n".join(out) + "\n"


def _held_out_section(doc: dict[str, Any]) -> list[str]:
    if not doc["held_out_check"]:
        return []
    out = ["", "## Held-out seeds against the design seeds' interval", ""]
    rows = []
    for h in doc["held_out_check"]:
        inside = "n/a" if h["inside"] is None else ("yes" if h["inside"] else "**no**")
        design = _m_cell({"m": h["design_m"], "m_ci95": h["design_m_ci95"]}, with_half=False)
        held = _m_cell({"m": h["held_out_m"], "m_ci95": h["held_out_m_ci95"]}, with_half=False)
        rows.append([f"{h['comparison']}", f"{h['estimator']}", design, held, inside])
    header = ["comparison", "estimator", "design m [95%]", "held-out m [95%]", "held-out m inside?"]
    return [*out, *markdown_table(header, rows)]


def _interaction_section(doc: dict[str, Any]) -> list[str]:
    ref, new, base = doc["reference_recipe"], doc["recipe"], doc["baseline"]
    out = ["", "## (c) Recipe × arm interaction per rung (same-seed, 95% t intervals)", ""]
    if not doc["interaction"]:
        out.append(f"n/a: no arm ran under both recipes beside the {base}.")
    for arm in dict.fromkeys(r["arm"] for r in doc["interaction"]):
        rows = []
        for r in (x for x in doc["interaction"] if x["arm"] == arm):
            bl = r["baseline_loss"]
            cells = [f"{r['n_layers']}", f"{r['d_model']}", ",".join(map(str, r["seeds"])) or "none"]
            cells += [f"{_loss(bl[ref])} / {_loss(bl[new])}", _delta(r["delta"][ref]), _delta(r["delta"][new])]
            rows.append([*cells, f"{_signed(r['interaction'], r['interaction_ci95'])} {r['interaction_verdict']}"])
        header = ["L_b", "d_model", "seeds", f"{base} loss {ref} / {new}", f"Δ {ref}", f"Δ {new}", "interaction"]
        what = f"{arm} − {base}; interaction = Δ {new} − Δ {ref} (negative: {arm} gains more under {new})."
        out += [what, "", *markdown_table(header, rows), ""]
    return out


def _row(head: list[str], e: dict[str, Any], notes: list[str], what: str, p: bool = False) -> list[str]:
    """One multiplier row (P(m <= 1) when ``p``), then the time ratios; what is n/a gets a note saying why."""
    t = e.get("timing") or {}
    if "error" in e:
        notes.append(f"- {what}: {e['error']}")
        cells = ["–"] + ["n/a"] * (5 if p else 4)
    else:
        j, pm = e["joint"], e["paired"]
        cells = [f"{e['n_runs']['reference']}+{e['n_runs']['arm']}", _m_cell(j), _m_cell(j, "m_wall")]
        cells += [_m_cell(pm), _m_cell(pm, "m_wall")] + ([fmt(j["p_m_le_1"], 2)] if p else [])
    if t.get("error"):
        notes.append(f"- {what}, wall clock: {t['error']}")
    elif t.get("note"):
        notes.append(f"- {what}, wall-clock interval: {t['note']}")
    cells.append(_ratio(t.get("step_time_ratio"), t.get("step_time_ratio_ci95")))
    if not p:
        cells.append(_ratio(t.get("flops_per_step_ratio")))
    return [*head, *cells]


def _signed(x: float | None, interval: list[float] | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.4f} " + (f"[{interval[0]:+.4f}, {interval[1]:+.4f}]" if interval else "[n/a]")


def _delta(d: dict[str, Any]) -> str:
    return f"{_signed(d['delta'], d['ci95'])} {d['verdict']}"


def _step_time_section(doc: dict[str, Any]) -> list[str]:
    name = doc["headline_seed_set"]
    columns: list[tuple[str, dict[str, Any]]] = []
    a = doc["baseline_recipe"].get(name, {})
    if "timing" in a:
        columns.append((f"{doc['baseline']} {doc['recipe']} ÷ {doc['reference_recipe']}", a["timing"]))
    columns += [(f"{arm} ÷ {doc['baseline']}, {r}", e["timing"]) for r, arm, e in _headline_fits(doc) if "timing" in e]
    if not columns:
        return []
    rungs = list(dict.fromkeys(p["rung"] for _, t in columns for p in t["per_rung"]))
    read = "; ".join(f"{c}: {t.get('time_source', 'cpu_time_s')}" for c, t in columns)
    out = [
        "",
        f"## Step-time ratio per rung ({name} seeds; geometric means)",
        "",
        f"Time read per comparison: {read}.",
        "",
    ]
    rows = []
    for rung in rungs:
        cells = [f"{rung}"]
        for _, t in columns:
            p = next((p for p in t["per_rung"] if p["rung"] == rung), None)
            cells.append(f"{p['step_time_ratio']:.3f} ({p['n_ref']}+{p['n_arm']} runs)" if p else "n/a")
        rows.append(cells)
    rows.append(["pooled", *(_ratio(t.get("step_time_ratio"), t.get("step_time_ratio_ci95")) for _, t in columns)])
    return [*out, *markdown_table(["rung", *(c for c, _ in columns)], rows)]


RECIPE_COLORS = ("0.35", "tab:red")  # reference recipe, new recipe
ARM_MARKERS = ("o", "s", "D", "^")


def plot_interaction(doc: dict[str, Any], path: str | Path) -> Path:
    """Left: each arm's Δ per rung under each recipe; right: the interaction per rung (hollow: no interval)."""
    rows = doc["interaction"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), sharex=True)
    rungs = sorted({(r["n_layers"], r["d_model"]) for r in rows})
    x_of = {k: i for i, k in enumerate(rungs)}
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    n = max(len(arms), 1)
    for j, arm in enumerate(arms):
        mine = [r for r in rows if r["arm"] == arm]
        x = [x_of[(r["n_layers"], r["d_model"])] for r in mine]
        marker = ARM_MARKERS[j % len(ARM_MARKERS)]
        for k, (recipe, color) in enumerate(zip((doc["reference_recipe"], doc["recipe"]), RECIPE_COLORS)):
            points = [(r["delta"][recipe]["delta"], r["delta"][recipe]["ci95"]) for r in mine]
            _points(left, x, (j * 2 + k - (2 * n - 1) / 2) * 0.08, points, color, marker, f"{arm}, {recipe}")
        points = [(r["interaction"], r["interaction_ci95"]) for r in mine]
        _points(right, x, (j - (n - 1) / 2) * 0.1, points, "tab:purple", marker, arm)
    hollow = any(not r["interaction_ci95"] for r in rows)
    for ax in (left, right):
        ax.axhline(0, color="0.5", lw=0.8)
        ax.set_xticks(range(len(rungs)), [f"L_b {a}\nd {b}" for a, b in rungs])
        ax.set_xlim(-0.6, max(len(rungs), 1) - 0.4)  # one rung: the offsets stay small beside the axis
        if rows:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no arm ran under both recipes", ha="center", va="center", transform=ax.transAxes)
    if hollow:
        fig.text(0.5, 0.01, "hollow: no interval (fewer than two same-seed pairs)", ha="center", fontsize=7)
    left.set_ylabel(f"val loss: arm − {doc['baseline']}")
    left.set_title("same-seed difference per rung, 95% t interval", fontsize=9)
    right.set_ylabel(f"Δ {doc['recipe']} − Δ {doc['reference_recipe']}")
    right.set_title("interaction (< 0: the arm gains more under the new recipe)", fontsize=9)
    return _save(fig, path)


def _points(ax, x: list[int], off: float, points: list[tuple], color: str, marker: str, label: str) -> None:
    """(y, interval) at ``x + off``: error bars, hollow without an interval; missing points skipped."""
    labelled = False
    for xi, (yi, c) in zip((xi + off for xi in x), points):
        if yi is None or not math.isfinite(yi):
            continue
        lab = None if labelled else label
        labelled = True
        if c:
            delta_errorbar(ax, [xi], [yi], [c], fmt=marker, color=color, capsize=3, ms=5, label=lab)
        else:
            ax.plot([xi], [yi], marker, mfc="none", color=color, ms=6, label=lab)


def _laws_and_arrow(ax: plt.Axes, a: dict[str, Any], doc: dict[str, Any], C: np.ndarray) -> None:
    """Comparison (a)'s joint laws over compute ``C`` and, where m is plottable, the arrow × m from the new recipe's
    law (inside the data) to where the reference's reaches the same loss."""
    m = a["joint"]["m"]
    arrow = m is not None and 0.05 < m < 20
    c_star = float(C.min() if not arrow or m >= 1 else C.max())
    ends = [C.min(), C.max()] + ([c_star * m] if arrow else [])
    grid = np.geomspace(min(ends) / 1.3, max(ends) * 1.3, 100)
    for key, color, recipe in (
        ("law_reference", RECIPE_COLORS[0], doc["reference_recipe"]),
        ("law_arm", RECIPE_COLORS[1], doc["recipe"]),
    ):
        ax.plot(grid, PowerLaw(**a[key]).loss(grid), "-", color=color, lw=1.2, label=f"joint fit, {recipe}")
    if arrow:
        L_star = float(PowerLaw(**a["law_arm"]).loss(c_star))
        arrow_style = {"arrowstyle": "->", "color": "tab:blue", "lw": 1.2}
        ax.annotate("", xy=(c_star * m, L_star), xytext=(c_star, L_star), arrowprops=arrow_style)
        box = {"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8}
        style = {"textcoords": "offset points", "color": "tab:blue", "fontsize": 8, "ha": "center", "va": "bottom"}
        ax.annotate(f"× {m:.2f}", xy=(c_star * math.sqrt(m), L_star), xytext=(0, 9), bbox=box, **style)


def plot_baseline(runs: pd.DataFrame, doc: dict[str, Any], path: str | Path) -> Path:
    """The baseline's val loss against compute under both recipes with comparison (a)'s laws and m."""
    name = doc["headline_seed_set"]
    a = doc["baseline_recipe"].get(name, {})
    base = runs[(runs["variant"] == doc["baseline"]) & runs["seed"].isin(doc["seed_sets"][name])]
    compute = doc["compute"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for recipe, color in zip((doc["reference_recipe"], doc["recipe"]), RECIPE_COLORS):
        d = base[base["recipe"] == recipe]
        ax.scatter(d[compute], d["val_loss"], s=12, color=color, alpha=0.35, lw=0)
        g = d.groupby("size").agg(C=(compute, "mean"), L=("val_loss", "mean")).sort_values("C")
        ax.plot(g["C"], g["L"], "o", color=color, ms=6, label=f"{doc['baseline']}, {recipe} (rung means)")
    C = base[compute].to_numpy(float)
    if "error" in a or not len(C):
        text, size = textwrap.fill(f"fit n/a: {a.get('error', 'no runs')}", 48), 7
    else:
        j = a["joint"]
        _laws_and_arrow(ax, a, doc, C)
        m_wall, paired = _m_cell(j, "m_wall"), _m_cell(a["paired"], with_half=False)
        text, size = f"m = {_m_cell(j, with_half=False)}\nm_wall = {m_wall}\npaired m = {paired}", 8
    box = {"boxstyle": "round", "fc": "white", "ec": "0.7"}
    ax.text(0.98, 0.97, text, transform=ax.transAxes, ha="right", va="top", fontsize=size, bbox=box)
    ax.set_xscale("log")
    ax.set_xlabel(f"compute ({compute}, PFLOP/s-days)")
    ax.set_ylabel("final val loss")
    ax.set_title(f"{doc['baseline']}: {doc['recipe']} vs {doc['reference_recipe']} ({name} seeds)", fontsize=9)
    ax.legend(fontsize=7, loc="lower left" if len(C) and "error" not in a else "best")
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    fig.tight_layout()
    return save(fig, path, (".png",), dpi=140, tight=False)[0]


def read_studies(paths: list[str] | list[Path]) -> pd.DataFrame:
    """The records of one or more study directories or results tables as one (run directories under the first's)."""
    frames = [load_results(p) for p in paths]
    if len(frames) == 1:
        return frames[0]
    df = pd.concat(frames, ignore_index=True)
    df.attrs = {"source": "; ".join(str(f.attrs.get("source")) for f in frames)}
    df.attrs["base_dir"] = frames[0].attrs.get("base_dir")
    return df


def _headline_fits(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(recipe, arm, its fit) of comparison (b) on the headline seed set."""
    name = doc["headline_seed_set"]
    return [(r, arm, e) for r, by_set in doc["arms_vs_baseline"].items() for arm, e in by_set.get(name, {}).items()]


def headline_lines(doc: dict[str, Any]) -> list[str]:
    name = doc["headline_seed_set"]
    lines = []
    for set_name, e in doc["baseline_recipe"].items():
        lines.append(f"(a) {doc['baseline']} {doc['recipe']} vs {doc['reference_recipe']}, {set_name}: {_line(e)}")
    lines += [f"(b) {arm} vs {doc['baseline']} under {r}, {name}: {_line(e)}" for r, arm, e in _headline_fits(doc)]
    for row in doc["interaction"]:
        lines.append(
            f"(c) {row['arm']} L_b {row['n_layers']}: interaction "
            f"{_signed(row['interaction'], row['interaction_ci95'])} {row['interaction_verdict']}"
        )
    for r, arm, e in _headline_fits(doc):
        if e.get("rungs"):
            lines += [f"(b) under {r}, {name}: {line}" for line in rung_headline(e["rungs"], arm)]
    checks = [h for h in doc["held_out_check"] if h["inside"] is not None]
    if checks:
        inside = sum(h["inside"] for h in checks)
        lines.append(f"held-out m inside the design interval: {inside} of {len(checks)} (recipe_summary.md)")
    return lines


def _line(e: dict[str, Any]) -> str:
    if "error" in e:
        return f"n/a ({e['error']})"
    j, p = e["joint"], e["paired"]
    return (
        f"m = {_m_cell(j)}, m_wall = {_m_cell(j, 'm_wall')}; paired m = {_m_cell(p)}, m_wall = {_m_cell(p, 'm_wall')}"
    )


def run_recipe(
    df: pd.DataFrame,
    out: str | Path,
    opts: RecipeOptions = RecipeOptions(),
    *,
    make_figures: bool = True,
    timing: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """:func:`analyse_recipe` on ``df``, written under ``out`` (recipe.json, recipe_summary.md, figures)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report = analyse_recipe(df, opts, timing)
    doc = report.parts
    figures = [out / "fig_recipe_interaction.png", out / "fig_recipe_baseline.png"] if make_figures else []
    if make_figures:
        plot_interaction(doc, figures[0])
        plot_baseline(report.runs, doc, figures[1])
    return write_report(out, doc, "recipe.json", {"recipe_summary.md": recipe_markdown(doc)}, figures)


def rung_section(doc: dict[str, Any]) -> list[str]:
    """Per recipe and arm on the headline seed set, the multiplier per rung and the test of one over the rungs."""
    name = doc["headline_seed_set"]
    parts = {f"{arm} under {r} ({name} seeds)": e["rungs"] for r, arm, e in _headline_fits(doc) if e.get("rungs")}
    if not parts:
        return []
    return ["", "## Multiplier per rung, and the test of one over all", "", *rung_markdown(parts)]


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--results", required=True, nargs="+", help="the study's results.csv or directory (several are read as one)"
    )
    p.add_argument("--out", required=True, help="output directory (recipe.json, recipe_summary.md, figures)")
    p.add_argument("--seeds", type=seed_list, help="read only the runs of these seeds, comma-separated")
    add_arms(p)
    p.add_argument("--reference-recipe", default="adamw+cosine", help="optimizer+lr_schedule (default: adamw+cosine)")
    p.add_argument("--recipe", default="muon+wsd", help="the recipe compared with it (default: muon+wsd)")
    p.add_argument("--lr-protocol", default="baseline", help="the arms' lr protocol read (default: baseline)")
    p.add_argument("--design-seeds", type=seed_list, default=[0, 1, 2], help="design seeds (default: 0,1,2)")
    p.add_argument("--held-out-seeds", type=seed_list, default=[20, 21, 22], help="held-out seeds (default: 20,21,22)")
    add_bootstrap(p)
    p.add_argument("--no-figures", action="store_true", help="write recipe.json and recipe_summary.md only")
    p.add_argument(
        "--timing",
        nargs="+",
        default=None,
        metavar="DIR",
        help="study directories or results.csv files of extra runs of the same configurations, read for the step-time "
        "ratios only (e.g. re-runs of committed runs whose records predate step_cpu_s), never fitted",
    )


@register("recipe", arguments=_arguments, headline=headline_lines, files="recipe_summary.md, recipe.json, figures")
def report(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    from ..io.runs import select_seeds

    df = read_studies(args.results)
    df = select_seeds(df, args.seeds) if args.seeds else df
    seeds = {"design_seeds": tuple(args.design_seeds), "held_out_seeds": tuple(args.held_out_seeds)}
    opts = options_from(RecipeOptions, args, **seeds, fit=FitOptions(B=args.bootstrap, seed=args.seed))
    timing = read_studies(args.timing) if args.timing else None
    return run_recipe(df, args.out, opts, make_figures=not args.no_figures, timing=timing)
