"""Does an arm's gain grow, shrink or stay with training length? The same-seed difference arm - reference per
rung at each budget (tokens per parameter), with 95% Student-t intervals (analysis.laws.paired), and its figure.
For any table with several budgets per rung: a multi-budget study's records (``budget``, docs/runs.md "Several
budgets from one run") or independent runs of one rung at several token counts (tokens / params_non_embedding).
``python -m analysis length``.

Per cell, the multiplier that goes with each difference (analysis.laws.cell_multiplier): the reference's tokens, at
the rung's N, to reach the arm's loss, over the cell's, read off the reference's own law at that rung through its
measured loss there, so that it agrees with the difference by construction (Δ < 0: m > 1), with how far it
extrapolates past the rung's largest budget and its wall-clock version.

Beside it, the compute fit over the study's points: every (rung, budget) is one point of the joint law
``L_arm = E + A_arm C^-alpha`` (:func:`budget_points`; analysis.render.fit_report.run_fit), with its wall-clock
version, the rollout (the largest compute point, i.e. the largest rung at the largest budget, held out and
predicted), the multiplier's sensitivity to E and the fit over (N, D) per arm, under ``<out>/fit/``. The points mix
rungs and budgets, so that curve is the loss of this family of runs against compute, neither a compute-optimal
frontier nor any cell's curve: its per-point m_s (fit/summary.md) are not the cells' multipliers, and the length
report does not present them as such. Then the compute-optimal frontier (analysis.laws.frontier, with approach 2 of
analysis.laws.isoflop beside it).

Plain functions on tidy DataFrames; no torch.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..io.token_budget import tokens_per_param
from ..laws.paired import paired_comparison
from ..render.tables import interval_text, markdown_table
from .study_registry import add_arms, add_bootstrap, add_results_out, register


def gain_by_length(df: pd.DataFrame, arm: str = "block_attnres", reference: str = "baseline") -> pd.DataFrame:
    """One row per (rung, budget) where both arms ran: ``size``, ``n_layers`` (when recorded),
    ``tokens_per_param``, ``ref_loss`` (the reference's mean on the pairs' seeds), ``delta`` (arm - reference,
    negative: the arm wins), ``delta_ci95`` (t interval, None under two pairs), ``n_pairs``, ``pair_seeds``,
    ``verdict`` (analysis.laws.paired.verdict). Completed runs only; several runs of one arm, rung, budget and seed
    are a ValueError (analysis.laws.paired.paired_comparison)."""
    done = df[df["status"] == "completed"] if "status" in df.columns else df
    done = done.assign(tokens_per_param=tokens_per_param(done))
    table = paired_comparison(done, reference, [arm], ("size", "tokens_per_param"))
    if table.empty or not (table["n_pairs"] > 0).any():
        return pd.DataFrame()
    table = table[table["n_pairs"] > 0]
    shape = done.groupby(["size", "tokens_per_param"])
    rung_params = done.groupby("size")["params_non_embedding"].median()  # one order per rung, whatever its cells hold
    rows = [
        {
            "size": str(r.size),
            "n_layers": int(shape.get_group((r.size, r.tokens_per_param))["n_layers"].iloc[0])
            if "n_layers" in done.columns
            else None,
            "params_non_embedding": float(rung_params[r.size]),
            "tokens_per_param": float(r.tokens_per_param),
            "ref_loss": r.ref_loss,
            "delta": r.delta,
            "delta_ci95": r.delta_ci95,
            "n_pairs": r.n_pairs,
            "pair_seeds": r.seeds,
            "verdict": r.verdict,
        }
        for r in table.itertuples()
    ]
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
    """The table with each (rung, budget) as its own size, ``<size>@<tokens per param>`` (e.g. ``deep_L8@32``), so
    that a compute fit takes every budget of every rung as one point; the rung's own name is kept in ``rung``."""
    tpp = tokens_per_param(df)
    labels = [f"{s}@{t:g}" if np.isfinite(t) else str(s) for s, t in zip(df["size"], tpp)]
    return df.assign(rung=df["size"], size=labels)


FIT_DIR = "fit"  # the compute fit over the study's points, under the report's directory
E_FRACTIONS = (0.5, 0.8, 0.9, 0.95)  # as python -m analysis fit --e-sensitivity


def fit_points(
    df: pd.DataFrame, out: Path, arm: str, reference: str, make_figures: bool, bootstrap: int = 2000, seed: int = 0
) -> dict[str, Any] | None:
    """The compute fit over :func:`budget_points` under ``out`` (run_fit with every optional section: wall-clock,
    rollout of the largest point, E sensitivity, (N, D)); its headline numbers for length.json (the pooled m, the
    rung test's p over the points, m_wall, the rollout, the E range), or None (with the reason in ``error``) when
    the points are too few for a ladder fit (3 per arm). No per-point m_s: they are read off one curve through every
    (rung, budget) point, not any cell's own (the per-cell multipliers are analysis.laws.cell_multiplier's)."""
    from ..laws.fit_options import FitOptions
    from ..render.fit_report import Sections, run_fit

    points = budget_points(df)
    points = points[points["variant"].isin([arm, reference])]
    done = points[points["status"] == "completed"] if "status" in points.columns else points
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
    return {
        "dir": out.name,
        "m": m.m,
        "m_ci95": m.m_ci95,
        "p_m_le_1": m.p_m_le_1,
        "rung_test_p": test.get("p"),
        "one_multiplier": test.get("one_multiplier"),
        "m_wall": wall.get("m_wall"),
        "m_wall_ci95": wall.get("m_wall_ci95"),
        "step_time_ratio": wall.get("step_time_ratio"),
        "rollout_points": ro.get("points", []),
        "rollout_m": ro.get("m"),
        "rollout_m_ci95": ro.get("m_ci95"),
        "e_sensitivity_m_range": es.get("m_range"),
    }


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
    """``python -m analysis length``: length.json, length_summary.md and fig_length.png under ``out``: the
    same-seed Δ per cell and each cell's multiplier (``cells``: analysis.laws.cell_multiplier, ``bootstrap``
    replicates of the rung's law); with ``fit`` the compute fit over the study's points under ``out/fit/``
    (:func:`fit_points`) and the compute-optimal frontier (analysis.laws.frontier, with approach 2; fig_frontier.png)
    on ``frontier_bootstrap`` replicates, by default FRONTIER_B doubled up to FRONTIER_B_MAX until M's half-width at
    the top of the span is stable (with ``bootstrap`` below FRONTIER_B: ``bootstrap``, fixed), whose reference law
    also gives each cell's approach-3 multiplier. Records with several lrs per arm, rung and budget get the lr check
    (analysis.laws.lr_check, length.json ``lr_check``, at ``shared_lr``, default the grid's middle lr);
    everything else then reads the shared lr's runs. ``compare_to``: the same study's records with every budget at one
    shared lr, while ``df`` ran each budget at its own: both lr protocols side by side (length.json ``lr_protocols``,
    analysis.laws.length_protocols). Runs of ``df`` under ``lr_protocol`` per_arm beside runs under the paper's
    protocol are the arm at its own optimum for some cells: best against best (length.json ``best_against_best``,
    analysis.laws.length_protocols.split_best); everything else reads the paper's protocol's runs."""
    from ..io.report import write_report
    from ..laws.cell_multiplier import cell_multipliers
    from ..laws.frontier import FRONTIER_B, FRONTIER_B_MAX, frontier_with_laws
    from ..laws.length_protocols import best_against_best, split_best
    from ..laws.lr_check import has_lr_grid, lr_check
    from ..render.figures import frontier_figure, length_figure
    from ..render.frontier_text import frontier_markdown
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
        from ..laws.length_protocols import compare_protocols

        doc["lr_protocols"] = compare_protocols(compare_to, df, arm, reference)
    if best is not None:
        doc["best_against_best"] = best_against_best(df, best, arm, reference)
    if fit and make_figures:
        figures += frontier_figure(table, doc["frontier"], out / "fig_frontier", arm, reference, doc["cells"])
    md = length_markdown(table, arm, reference) + cell_markdown(doc["cells"], arm, reference)
    md += lr_check_markdown(check, arm, reference) if check is not None else []
    if compare_to is not None:
        from ..render.length_protocols_text import protocols_markdown

        md += protocols_markdown(doc["lr_protocols"])
    if best is not None:
        from ..render.length_protocols_text import best_markdown

        md += best_markdown(doc["best_against_best"], arm, reference)
    md += fit_markdown(doc.get("fit"), arm, reference) + frontier_markdown(doc.get("frontier"), arm, reference)
    return write_report(out, doc, "length.json", {"length_summary.md": "\n".join(md)}, figures)


def _ci(c: list[float] | None, spec: str = ".3f") -> str:
    return f"[{c[0]:{spec}}, {c[1]:{spec}}]" if c else "[n/a]"


def fit_lines(fit: dict[str, Any] | None, arm: str) -> list[str]:
    """The compute fit's headline: the pooled m over the points (with what it is not), m_wall, the rollout's
    prediction against the measurement, the E range."""
    if not fit:
        return []
    if "error" in fit:
        return [f"compute fit over the (rung, budget) points: n/a ({fit['error']})"]
    p = fit.get("rung_test_p")
    one = (
        ""
        if p is None
        else f"; one multiplier over the points {'rejected' if fit.get('one_multiplier') is False else 'not rejected'}"
        f" (p = {p:.2g})"
    )
    lines = [
        (
            f"{arm}: compute multiplier over the (rung, budget) points m = {fit['m']:.3f}x {_ci(fit['m_ci95'])}{one}: "
            "one curve through every rung and budget, which mixes them; its per-point m_s (fit/summary.md) are not "
            "the cells' multipliers (the per-cell m above is)"
        )
    ]
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
    head = [
        f"## Compute fit over the (rung, budget) points: {arm} against {reference}",
        "",
        (
            "Every (rung, budget) is one point of L = E + A C^-alpha: one curve through all rungs and budgets, which "
            "are not one curve (the family of these runs, not a compute-optimal frontier, and no cell's own "
            "curve). Its per-point m_s in the full report are distances along that mixed curve and can contradict "
            "the cells' Δ; the cells' multipliers are the table above. Full report: [fit/summary.md](fit/summary.md)."
        ),
        "",
    ]
    return [*head, *(f"* {line}" for line in fit_lines(fit, arm)), ""]


def headline_lines(doc: dict[str, Any]) -> list[str]:
    """What ``python -m analysis length`` and ``python -m sweeps.study`` print: one line per (rung, budget) with
    its Δ and multiplier, then the compute fit's and the frontier's headlines."""
    from ..render.frontier_text import frontier_lines
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
    if doc.get("lr_protocols"):
        from ..render.length_protocols_text import growth_lines

        lines += growth_lines(doc["lr_protocols"])
    if doc.get("best_against_best"):
        from ..render.length_protocols_text import best_lines

        lines += best_lines(doc["best_against_best"], doc["arm"])
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


@register(
    "length",
    help="arm - baseline per rung at each training length (tokens per parameter): 95%% t intervals",
    arguments=_arguments,
    headline=headline_lines,
    files="length_summary.md, length.json, figures",
)
def report(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """``length``: the arm's same-seed difference per rung and budget, then one line per row."""
    from pathlib import Path

    from ..io.runs import load_one_dataset

    df = load_one_dataset(args.results)
    doc = analyse_length(
        df,
        Path(args.out),
        args.arm,
        args.baseline,
        make_figures=not args.no_figures,
        fit=not args.no_fit,
        bootstrap=args.bootstrap,
        seed=args.seed,
        frontier_bootstrap=args.frontier_bootstrap,
        shared_lr=args.shared_lr,
        compare_to=load_one_dataset(args.compare_to) if args.compare_to else None,
    )
    return doc
