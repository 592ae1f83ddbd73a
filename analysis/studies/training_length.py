"""Does an arm's gain grow, shrink or stay with training length? (``python -m analysis length``.) Per rung and budget
(tokens per parameter: a multi-budget study's records, or independent runs at several token counts) the same-seed
difference arm - reference with its 95% t interval (analysis.laws.paired) and the cell's multiplier
(analysis.laws.cell_multiplier). Beside it, the compute fit over every (rung, budget) point under ``<out>/fit/`` --
one curve through a family of runs, neither a frontier nor any cell's curve, so its per-point m_s are not the cells'
multipliers -- and the compute-optimal frontier (analysis.laws.frontier)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..io.runs import completed_runs, load_one_dataset
from ..io.token_budget import tokens_per_param
from ..laws.paired import paired_comparison
from ..render.tables import interval_text, markdown_table
from .study_registry import add_arms, add_bootstrap, add_results_out, register


def gain_by_length(df: pd.DataFrame, arm: str = "block_attnres", reference: str = "baseline") -> pd.DataFrame:
    """One row per (rung, budget) where both arms completed a run of one seed: laws.paired.paired_comparison's
    ``ref_loss``, ``delta`` (arm - reference), ``delta_ci95``, ``n_pairs``, ``pair_seeds`` and ``verdict``, with the
    rung's ``n_layers`` and ``params_non_embedding``, ordered by N and budget."""
    done = completed_runs(df)
    done = done.assign(tokens_per_param=tokens_per_param(done))
    table = paired_comparison(done, reference, [arm], ("size", "tokens_per_param"))
    if table.empty or not (table["n_pairs"] > 0).any():
        return pd.DataFrame()
    table = table[table["n_pairs"] > 0]
    shape = done.groupby(["size", "tokens_per_param"])
    rung_params = done.groupby("size")["params_non_embedding"].median()  # one order per rung, whatever its cells hold
    rows = []
    for r in table.itertuples():
        cell = (r.size, r.tokens_per_param)
        n_layers = int(shape.get_group(cell)["n_layers"].iloc[0]) if "n_layers" in done.columns else None
        row = {"size": str(r.size), "n_layers": n_layers, "params_non_embedding": float(rung_params[r.size])}
        row |= {"tokens_per_param": float(r.tokens_per_param), "ref_loss": r.ref_loss, "delta": r.delta}
        rows.append(
            row | {"delta_ci95": r.delta_ci95, "n_pairs": r.n_pairs, "pair_seeds": r.seeds, "verdict": r.verdict}
        )
    out = pd.DataFrame(rows)
    return out.sort_values(["params_non_embedding", "tokens_per_param"], kind="stable").reset_index(drop=True)


def length_markdown(table: pd.DataFrame, arm: str, reference: str) -> list[str]:
    rows = []
    for r in table.itertuples():
        loss = [f"{r.ref_loss:.4f}", f"{r.delta:+.4f}", interval_text(r.delta_ci95)]
        rows.append([f"{r.size}", f"{r.tokens_per_param:g}", *loss, f"{r.n_pairs}", f"{r.verdict}"])
    header = ["rung", "tokens / param", "reference loss", "Δ", "95% interval", "pairs", "verdict"]
    title = f"## {arm} - {reference} per rung and training length (same-seed pairs, 95% t intervals)"
    return [title, "", *markdown_table(header, rows), ""]


def budget_points(df: pd.DataFrame) -> pd.DataFrame:
    """The table with each (rung, budget) as its own size ``<size>@<tokens per param>`` (the rung's name in ``rung``),
    so that a compute fit takes each as one point."""
    tpp = tokens_per_param(df)
    labels = [f"{s}@{t:g}" if np.isfinite(t) else str(s) for s, t in zip(df["size"], tpp)]
    return df.assign(rung=df["size"], size=labels)


FIT_DIR = "fit"  # the compute fit over the study's points, under the report's directory
E_FRACTIONS = (0.5, 0.8, 0.9, 0.95)  # as python -m analysis fit --e-sensitivity
WALL_KEYS = ("m_wall", "m_wall_ci95", "step_time_ratio")


def fit_points(
    df: pd.DataFrame, out: Path, arm: str, reference: str, make_figures: bool, bootstrap: int = 2000, seed: int = 0
) -> dict[str, Any] | None:
    """The compute fit over :func:`budget_points` under ``out`` (run_fit with every optional section) and its
    headline numbers for length.json; ``{"error": why}`` when the points are too few (3 per arm)."""
    from ..laws.fit_options import FitOptions
    from ..render.fit_report import Sections, run_fit

    points = budget_points(df)
    points = points[points["variant"].isin([arm, reference])]
    done = completed_runs(points)
    fewest = done.groupby("variant")["size"].nunique().reindex([arm, reference]).fillna(0).min()
    options = FitOptions(baseline=reference, B=bootstrap, seed=seed, skip_incomplete=True)
    # the rollout fits the points but the largest, which needs 3 left: a 3-point table is fitted without it
    sections = Sections(wallclock=True, rollout=int(fewest >= 4), e_sensitivity=E_FRACTIONS, nd=True)
    try:
        doc = run_fit(points, out, options, make_figures=make_figures, sections=sections)
    except ValueError as err:
        return {"error": str(err)}
    m = doc.multipliers.get(arm)
    if m is None:
        return {"error": f"{arm} has fewer than 3 completed (rung, budget) points"}
    wall = (doc.wallclock or {}).get(arm, {})
    ro = ((doc.rollout or {}).get("variants") or {}).get(arm, {})
    es = ((doc.e_sensitivity or {}).get("variants") or {}).get(arm, {})
    test = m.to_dict().get("rung_test") or {}
    head = {"dir": out.name, "m": m.m, "m_ci95": m.m_ci95, "p_m_le_1": m.p_m_le_1, "rung_test_p": test.get("p")}
    head |= {"one_multiplier": test.get("one_multiplier")} | {k: wall.get(k) for k in WALL_KEYS}
    head |= {"rollout_points": ro.get("points", []), "rollout_m": ro.get("m"), "rollout_m_ci95": ro.get("m_ci95")}
    return head | {"e_sensitivity_m_range": es.get("m_range")}


def analyse_length(
    df: pd.DataFrame,
    out: Path,
    arm: str = "block_attnres",
    reference: str = "baseline",
    make_figures: bool = True,
    fit: bool = True,
    bootstrap: int = 2000,
    seed: int = 0,
    frontier_bootstrap: int | None = None,
    shared_lr: float | None = None,
    compare_to: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """``python -m analysis length``: length.json, length_summary.md and figures under ``out``: the Δ and multiplier
    per cell; with ``fit`` the compute fit (:func:`fit_points`) and the frontier (``frontier_bootstrap`` replicates;
    default: doubled until stable). An lr grid gets the lr check at ``shared_lr`` (then the rest reads that lr's
    runs); ``compare_to`` (every budget at one shared lr) adds ``lr_protocols``; per_arm runs beside the paper's
    protocol's add ``best_against_best``."""
    from ..io.report import write_report
    from ..laws.cell_multiplier import cell_multipliers
    from ..laws.frontier import FRONTIER_B, FRONTIER_B_MAX, frontier_with_laws
    from ..laws.length_protocols import best_against_best, compare_protocols, split_best
    from ..laws.lr_check import has_lr_grid, lr_check
    from ..render.figures import frontier_figure, length_figure
    from ..render.frontier_text import frontier_markdown
    from ..render.length_protocols_text import best_markdown, protocols_markdown
    from ..render.lr_check_text import lr_check_markdown
    from ..render.multiplier_text import cell_markdown

    out.mkdir(parents=True, exist_ok=True)
    df, best = split_best(df)
    check = lr_check(df, arm, reference, shared_lr) if has_lr_grid(df) else None
    if check is not None:  # the study proper is the shared lr's runs
        df = df[[math.isclose(float(x), check["shared_lr"], rel_tol=1e-6) for x in df["lr"]]]
    table = gain_by_length(df, arm, reference)
    if table.empty:
        raise ValueError(f"no rung and budget where both {arm!r} and {reference!r} completed a run of one seed")
    figures: list[Path] = []
    if make_figures:
        figures += length_figure(table, out / "fig_length", arm, reference)
    doc: dict[str, Any] = {"arm": arm, "reference": reference, "rows": table.to_dict("records")}
    if check is not None:
        doc["lr_check"] = check
    d_law = None
    if fit:
        doc["fit"] = fit_points(df, out / FIT_DIR, arm, reference, make_figures, bootstrap, seed)
        if doc["fit"] and "error" not in doc["fit"]:
            figures.append(out / FIT_DIR)
        B = frontier_bootstrap if frontier_bootstrap is not None else min(FRONTIER_B, bootstrap)
        # by default (and with a full --bootstrap) the replicates double until M's top half-width is stable
        B_max = FRONTIER_B_MAX if frontier_bootstrap is None and bootstrap >= FRONTIER_B else None
        doc["frontier"], d_law = frontier_with_laws(df, arm, reference, B=B, seed=seed, B_max=B_max)
    doc["cells"] = cell_multipliers(df, table, arm, reference, B=bootstrap, seed=seed, approach3=d_law)
    if compare_to is not None:
        doc["lr_protocols"] = compare_protocols(compare_to, df, arm, reference)
    if best is not None:
        doc["best_against_best"] = best_against_best(df, best, arm, reference)
    if fit and make_figures:
        figures += frontier_figure(table, doc["frontier"], out / "fig_frontier", arm, reference, doc["cells"])
    md = length_markdown(table, arm, reference) + cell_markdown(doc["cells"], arm, reference)
    md += lr_check_markdown(check, arm, reference) if check is not None else []
    md += protocols_markdown(doc["lr_protocols"]) if compare_to is not None else []
    if best is not None:
        md += best_markdown(doc["best_against_best"], arm, reference)
    md += fit_markdown(doc.get("fit"), arm, reference) + frontier_markdown(doc.get("frontier"), arm, reference)
    return write_report(out, doc, "length.json", {"length_summary.md": "\n".join(md)}, figures)


def _ci(c: list[float] | None, spec: str = ".3f") -> str:
    return f"[{c[0]:{spec}}, {c[1]:{spec}}]" if c else "[n/a]"


def fit_lines(fit: dict[str, Any] | None, arm: str) -> list[str]:
    if not fit:
        return []
    if "error" in fit:
        return [f"compute fit over the (rung, budget) points: n/a ({fit['error']})"]
    p, rejected = fit.get("rung_test_p"), "rejected" if fit.get("one_multiplier") is False else "not rejected"
    one = "" if p is None else f"; one multiplier over the points {rejected} (p = {p:.2g})"
    m = (
        f"{arm}: compute multiplier over the (rung, budget) points m = {fit['m']:.3f}x {_ci(fit['m_ci95'])}{one}: "
        "one curve through every rung and budget, which mixes them; its per-point m_s (fit/summary.md) are not "
        "the cells' multipliers (the per-cell m above is)"
    )
    lines = [m]
    if fit.get("m_wall") is not None:
        lines.append(
            f"{arm}: wall-clock multiplier m_wall = {fit['m_wall']:.3f}x {_ci(fit.get('m_wall_ci95'))} "
            f"(step-time ratio {fit['step_time_ratio']:.3f})"
        )
    for pt in fit.get("rollout_points", []):
        inside = "inside" if pt["inside"] else "OUTSIDE"
        interval = _ci(pt["prediction_interval95"], ".4f")
        lines.append(
            f"rollout: {pt['arm']} at {pt['size']} predicted {pt['predicted']:.4f} {interval} from the other points, "
            f"measured {pt['measured']:.4f} ({inside})"
        )
    if fit.get("rollout_m") is not None:
        m_ci = _ci(fit["rollout_m_ci95"])
        lines.append(f"rollout: m fitted without the largest point = {fit['rollout_m']:.3f}x {m_ci}")
    if fit.get("e_sensitivity_m_range"):
        lo, hi = fit["e_sensitivity_m_range"]
        lines.append(f"{arm}: m from {lo:.3f}x to {hi:.3f}x as E is fitted, 0 or pinned (fit/summary.md)")
    return lines


def fit_markdown(fit: dict[str, Any] | None, arm: str, reference: str) -> list[str]:
    if not fit:
        return []
    what = (
        "Every (rung, budget) is one point of L = E + A C^-alpha: one curve through all rungs and budgets, which "
        "are not one curve (the family of these runs, not a compute-optimal frontier, and no cell's own "
        "curve). Its per-point m_s in the full report are distances along that mixed curve and can contradict "
        "the cells' Δ; the cells' multipliers are the table above. Full report: [fit/summary.md](fit/summary.md)."
    )
    title = f"## Compute fit over the (rung, budget) points: {arm} against {reference}"
    return [title, "", what, "", *(f"* {line}" for line in fit_lines(fit, arm)), ""]


def headline_lines(doc: dict[str, Any]) -> list[str]:
    """One line per (rung, budget) with its Δ and multiplier, then the lr, fit and frontier sections' lines."""
    from ..render.frontier_text import frontier_lines
    from ..render.length_protocols_text import best_lines, growth_lines
    from ..render.lr_check_text import lr_check_lines
    from ..render.multiplier_text import m_text

    cells = {(c["size"], c["tokens_per_param"]): c for c in doc.get("cells") or []}
    lines = []
    for r in doc["rows"]:
        line = (
            f"{r['size']} at {r['tokens_per_param']:g} tokens/param: {doc['arm']} - {doc['reference']} "
            f"{r['delta']:+.4f} {_ci(r['delta_ci95'], '+.4f')}, {r['n_pairs']} pairs, {r['verdict']}"
        )
        c = cells.get((r["size"], r["tokens_per_param"]))
        if c is not None:
            x = c.get("d_star_over_d_max")
            line += f"; m = {m_text(c)} (D*/D_max {'n/a' if x is None else f'{x:.2f}'}"
            line += "" if c.get("m_wall") is None else f", m_wall {c['m_wall']:.3f}x"
            line += ")"
        lines.append(line)
    if doc.get("lr_check"):
        lines += lr_check_lines(doc["lr_check"], doc["arm"], doc["reference"])
    lines += growth_lines(doc["lr_protocols"]) if doc.get("lr_protocols") else []
    lines += best_lines(doc["best_against_best"], doc["arm"]) if doc.get("best_against_best") else []
    return (
        lines
        + fit_lines(doc.get("fit"), doc["arm"])
        + frontier_lines(doc.get("frontier"), doc["arm"], doc["reference"])
    )


# ---- python -m analysis <command> -----------------------------------------------------------------------------------


def _arguments(p: argparse.ArgumentParser) -> None:
    add_results_out(
        p,
        "a study with several budgets per rung (results.csv or directory)",
        "output directory (length.json, length_summary.md, fig_length.png)",
    )
    add_arms(p, "block_attnres")
    p.add_argument(
        "--no-fit",
        action="store_true",
        help="the per-budget differences only: no compute fit over the (rung, budget) points (fit/)",
    )
    add_bootstrap(p, "the fit's bootstrap replicates")
    p.add_argument(
        "--frontier-bootstrap",
        type=int,
        default=None,
        metavar="B",
        help="the frontier's bootstrap replicates, fixed (default: 1000 doubled up to 8000 until M's half-width at the "
        "top of the span is stable to 2 points; with --bootstrap below 1000, --bootstrap)",
    )
    p.add_argument(
        "--shared-lr",
        type=float,
        default=None,
        metavar="LR",
        help="with an lr grid: the lr both arms ran at in the study proper (default: the grid's middle lr)",
    )
    p.add_argument(
        "--compare-to",
        default=None,
        metavar="RESULTS",
        help="the same study's records with every budget at one shared lr (results.csv or directory, e.g. "
        "docs/results/cpu_deep_budgets), while --results ran each budget at its own lr: both protocols side by side",
    )
    p.add_argument("--no-figures", action="store_true", help="write length.json and length_summary.md only")


@register("length", arguments=_arguments, headline=headline_lines, files="length_summary.md, length.json, figures")
def report(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    df = load_one_dataset(args.results)
    same = {k: getattr(args, k) for k in ("bootstrap", "seed", "frontier_bootstrap", "shared_lr")}
    compare_to = load_one_dataset(args.compare_to) if args.compare_to else None
    given = {"make_figures": not args.no_figures, "fit": not args.no_fit, "compare_to": compare_to}
    return analyse_length(df, Path(args.out), args.arm, args.baseline, **given, **same)
