"""`python -m analysis fit`: results -> fit.json, summary.md and figures in one directory (the pipeline that writes
them: analysis.render.fit_report.run_fit)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import pandas as pd

from ..io.fit_document import FitDocument
from ..io.runs import load_results, load_wandb, select_dataset, select_seeds
from ..laws.fit_options import FitOptions
from ..render.fit_report import Sections, run_fit
from ..render.multiplier_text import rung_headline
from ..render.study_headline import fit_headline
from .study_registry import add_arms, add_bootstrap, add_choice, fractions, number, options_from, register, seed_list


def load_any(results: str | None, wandb_project: str | None, wandb_group: str | None) -> pd.DataFrame:
    """The result records of ``--results PATH`` or of ``--wandb ENTITY/PROJECT`` (exactly one of them)."""
    if (results is None) == (wandb_project is None):
        raise ValueError("give exactly one of --results PATH or --wandb ENTITY/PROJECT")
    return load_results(results) if results is not None else load_wandb(wandb_project, wandb_group)


def _arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--results",
        help="results.csv, a results.json, or a study/run directory (results.csv or results.json files below it)",
    )
    src.add_argument(
        "--wandb", metavar="ENTITY/PROJECT", help="read the same records from W&B (needs wandb and network)"
    )
    p.add_argument("--wandb-group", help="W&B group (study) to read, with --wandb")
    p.add_argument("--out", required=True, help="output directory")
    add_arms(p)
    p.add_argument(
        "--dataset",
        help="fit only the runs of this data set (data_fingerprint, a prefix of it, or the dataset "
        "path); needed when a table holds several",
    )
    p.add_argument("--study", help="which study to fit as the scaling ladder (default: the one of study_kind scaling)")
    add_choice(p, "--compute", ("pflops_days", "pflops_days_6nd"), "compute column (default: pflops_days)")
    add_bootstrap(p)
    mode = "auto: paired cluster bootstrap over seeds when every size has >= 2 seeds, else parametric"
    add_choice(p, "--bootstrap-mode", ("auto", "cluster", "parametric"), mode)
    p.add_argument(
        "--seed-sigma", type=float, help="seed-noise sd of one run's final val loss, for the parametric bootstrap"
    )
    p.add_argument(
        "--seed-rho", type=float, default=0.0, help="share of seed noise common to both arms of a cell (default: 0)"
    )
    form = "joint-fit form: auto = E + A C^-alpha, falling back to E = 0 when E hits a bound"
    add_choice(p, "--form", ("auto", "saturating", "power_law"), form)
    outliers = "runs the outlier rule flags: keep them in the fit (default; the fit without them is reported too) or "
    add_choice(p, "--outliers", ("keep", "exclude"), outliers + "exclude them")
    p.add_argument(
        "--skip-incomplete",
        action="store_true",
        help="skip (with a warning) variants with fewer than 3 sizes instead of failing",
    )
    p.add_argument(
        "--seeds",
        type=seed_list,
        help="fit only the runs of these seeds, comma-separated (e.g. a study's held-out seeds 20,21,22)",
    )
    p.add_argument("--no-figures", action="store_true", help="write fit.json and summary.md only")
    _add_fit_sections(p)


def _add_fit_sections(f: argparse.ArgumentParser) -> None:
    f.add_argument(
        "--wallclock",
        action="store_true",
        help="add the wall-clock multiplier beside each compute multiplier (from the records' CPU times)",
    )
    f.add_argument(
        "--rollout",
        type=int,
        nargs="?",
        const=1,
        default=0,
        metavar="K",
        help="fit without the K largest rungs (default 1), predict their losses and the multiplier there beside "
        "the measurement (fit.json rollout, fig_rollout.png)",
    )
    f.add_argument(
        "--e-sensitivity",
        type=fractions,
        nargs="?",
        const=(0.5, 0.8, 0.9, 0.95),
        default=None,
        metavar="F,F,...",
        help="the multiplier with E fitted, E = 0 and E pinned at these fractions of the lowest loss "
        "(default 0.5,0.8,0.9,0.95)",
    )
    f.add_argument(
        "--nd",
        action="store_true",
        help="also fit L = E + A/N^alpha + B/D^beta per arm (Chinchilla's approach 3; needs several tokens per "
        "parameter)",
    )


@register(
    "fit",
    arguments=_arguments,
    headline=fit_headline,
    printed=lambda doc: printed_lines(doc),
    files="summary.md, fit.json, figures",
)
def report(args: argparse.Namespace, argv: Sequence[str]) -> Any:
    df = load_any(args.results, args.wandb, args.wandb_group)
    df = select_dataset(df, args.dataset) if args.dataset else df
    df = select_seeds(df, args.seeds) if args.seeds else df
    options = options_from(FitOptions, args, B=args.bootstrap)
    return run_fit(df, args.out, options, make_figures=not args.no_figures, sections=options_from(Sections, args))


def printed_lines(doc: FitDocument) -> list[str]:
    """What ``python -m analysis fit`` prints: each multiplier (and its M(C) where the exponents differ), each
    rung's headline, then the optional sections' lines."""
    lines = []
    for v, m in doc.multipliers.items():
        lo, hi = m.m_ci95 or (None, None)
        lines.append(
            f"{v}: m = {number(m.m)} [{number(lo)}, {number(hi)}], P(m<=1) = {number(m.p_m_le_1)}, "
            f"paper M = {number(m.paper_M)}, per-size geo-mean = {number(m.per_size_geomean)}"
        )
        c = m.paper_M_curve
        if m.headline == "curve" and c is not None:
            lines.append(
                f"  exponents differ significantly: M(C) runs from {number(c.M[0])} at C = {c.C[0]:.3g} "
                f"to {number(c.M[-1])} at C = {c.C[-1]:.3g} (see fit.json paper_M_curve)"
            )
    for v, m in doc.multipliers.items():
        lines += [f"  {line}" for line in rung_headline(m.to_dict(), v, (doc.wallclock or {}).get(v))]
    return lines + _section_lines(doc)


def _section_lines(doc: FitDocument) -> list[str]:
    lines: list[str] = []
    if doc.wallclock:
        from ..render.multiplier_text import wallclock_line

        lines += [wallclock_line(v, e).strip() for v, e in doc.wallclock.items()]
    for v, e in ((doc.rollout or {}).get("variants") or {}).items():
        for p in e["points"]:
            lo, hi = p["prediction_interval95"] or (None, None)
            lines.append(
                f"rollout {v}: {p['arm']} at {p['size']}: predicted {number(p['predicted'])} "
                f"[{number(lo)}, {number(hi)}], "
                f"measured {number(p['measured'])} ({'inside' if p['inside'] else 'OUTSIDE'})"
            )
        lo, hi = e.get("m_ci95") or (None, None)
        m = f"{number(e['m'])} [{number(lo)}, {number(hi)}]"
        lines.append(f"rollout {v}: m fitted without the held-out rung(s) = {m}")
    for v, e in ((doc.e_sensitivity or {}).get("variants") or {}).items():
        lo, hi = e["m_range"]
        lines.append(f"E sensitivity {v}: m from {number(lo)} to {number(hi)} (summary.md has the table)")
    lines += [
        f"nd fit {arm}: {e.get('error') or e['law']}" for arm, e in ((doc.nd_fit or {}).get("arms") or {}).items()
    ]
    return lines
