"""`python -m analysis fit`: results -> fit.json, summary.md and figures in one directory."""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..io.fit_document import FitDocument
from ..io.report import SCHEMA_VERSION, write_json
from ..io.runs import (
    AnalysisWarning,
    as_plain_scaling,
    load_results,
    load_wandb,
    scaling_runs,
    select_completed,
    select_dataset,
    select_seeds,
)
from ..laws.fit_options import FitOptions
from ..render import figures
from ..render.figures import block_size_figure
from ..render.markdown import summary_markdown
from ..render.multiplier_text import rung_headline
from ..render.study_headline import fit_headline
from ..render.tables import ablation_markdown, arch_grid_markdown
from .ablations import ablation_table
from .arch_grid import arch_grid_table
from .block_size import block_size_sweep
from .scaling import analyse_scaling
from .study_registry import add_bootstrap, fractions, number, register, seed_list


@dataclass(frozen=True)
class Sections:
    """The optional sections of ``python -m analysis fit`` (each off by default, so that a report without them is
    unchanged): ``wallclock`` (the wall-clock multiplier beside each compute one, where the records hold CPU times),
    ``rollout`` (the number of largest rungs held out and predicted; 0: none), ``e_sensitivity`` (the fractions of
    the lowest loss at which E is pinned; None: no table), ``nd`` (the fit over parameters and tokens)."""

    wallclock: bool = False
    rollout: int = 0
    e_sensitivity: tuple[float, ...] | None = None
    nd: bool = False


def run_fit(
    df: pd.DataFrame,
    out: str | Path,
    options: FitOptions | None = None,
    *,
    make_figures: bool = True,
    sections: Sections | None = None,
) -> FitDocument:
    """Fit one results table and write everything under ``out`` (fit.json, summary.md, tables, figures); returns
    the fit document. What is fitted follows each record's study kind: the ``scaling`` study (or
    ``options.study``) as a compute ladder, the ``block_size``, ``ablations`` and ``arch_grid`` studies as their
    sweep and tables; ``sections`` adds the optional ones (:class:`Sections`)."""
    extra = sections if sections is not None else Sections()
    opt = options if options is not None else FitOptions()
    baseline, compute = opt.baseline, opt.compute
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base_dir = df.attrs.get("base_dir")
    df, plain = as_plain_scaling(df)
    if plain is not None:
        warnings.warn(plain, AnalysisWarning, stacklevel=2)
    completed, excluded = select_completed(df, compute)
    ladder = scaling_runs(completed, opt.study)
    if ladder.empty:
        warnings.warn(
            "no scaling-ladder runs: only block-size / ablation / arch-grid outputs are written",
            AnalysisWarning,
            stacklevel=2,
        )
        parts: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "source": df.attrs.get("source"),
            "baseline": baseline,
            "compute": compute,
            "excluded_runs": excluded,
        }
    else:
        fit = analyse_scaling(ladder, opt, excluded=excluded, source=df.attrs.get("source"), base_dir=base_dir)
        parts, ladder = fit.parts, fit.runs
    parts |= {
        "block_size_sweep": block_size_sweep(completed, baseline),
        "ablations": ablation_table(completed, baseline),
        "arch_grid": arch_grid_table(completed, baseline),
    }
    if not ladder.empty:
        parts |= _optional_sections(ladder, parts, opt, extra)
    doc = FitDocument.from_dict(parts)
    written = _write_tables(doc, out)
    if make_figures:
        written += _draw_figures(doc, ladder, out, compute, base_dir)
        if doc.rollout and not ladder.empty:
            from ..render.figures import rollout_figure

            written += rollout_figure(doc.rollout, ladder, out / "fig_rollout", baseline, compute)
    doc.files = [*sorted(str(p.relative_to(out)) for p in written), "fit.json", "summary.md"]
    plain = doc.to_dict()
    write_json(plain, out / "fit.json")
    (out / "summary.md").write_text(summary_markdown(plain))
    return doc


def _optional_sections(ladder: pd.DataFrame, parts: dict[str, Any], opt: FitOptions, extra: Sections) -> dict:
    """The sections :class:`Sections` asks for, from the ladder's runs as analysed and its fitted multipliers."""
    out: dict[str, Any] = {}
    if extra.wallclock:
        from ..laws.wallclock import ladder_wallclock

        out["wallclock"] = ladder_wallclock(ladder, opt.baseline, parts["multipliers"])
    if extra.rollout:
        from ..laws.rollout import rollout

        out["rollout"] = rollout(ladder, opt, extra.rollout, parts["multipliers"])
    if extra.e_sensitivity is not None:
        from ..laws.asymptote import e_sensitivity

        out["e_sensitivity"] = e_sensitivity(ladder, opt, extra.e_sensitivity)
    if extra.nd:
        from ..laws.nd_fit import NDOptions, nd_fit

        out["nd_fit"] = nd_fit(ladder, NDOptions(B=opt.B, seed=opt.seed))
    return out


def _write_tables(doc: FitDocument, out: Path) -> list[Path]:
    """The non-ladder kinds' stand-alone tables: table4_ablations.md, fig7_arch_grid.md (where they apply)."""
    written: list[Path] = []
    if doc.ablations:
        md = ["# Ablations (Table 4 style)", "", *ablation_markdown(doc.ablations)]
        (out / "table4_ablations.md").write_text("\n".join(md) + "\n")
        written.append(out / "table4_ablations.md")
    if doc.arch_grid:
        md = ["# Architecture grid (Fig. 7 style)", "", *arch_grid_markdown(doc.arch_grid.to_dict())]
        (out / "fig7_arch_grid.md").write_text("\n".join(md) + "\n")
        written.append(out / "fig7_arch_grid.md")
    return written


def _draw_figures(doc: FitDocument, ladder: pd.DataFrame, out: Path, compute: str, base_dir: str | None) -> list[Path]:
    """Every figure the document and the analysed ladder runs allow (PNG and PDF each)."""
    written: list[Path] = []
    fitted = ladder[ladder["variant"].isin(list(doc.variants))] if not ladder.empty else ladder
    if doc.variants:
        written += figures.scaling_figure(fitted, doc, out / "fig4_scaling", compute=compute)
    if not fitted.empty:
        written += figures.loss_curves_figure(fitted, out / "loss_curves", base_dir=base_dir, compute=compute)
        written += figures.dynamics_figure(fitted, out / "fig5_dynamics", base_dir=base_dir, compute=compute)
        written += figures.depth_weights_figure(fitted, out / "fig8_depth_weights", base_dir=base_dir, compute=compute)
    if doc.block_size_sweep:
        written += block_size_figure(doc.block_size_sweep, out / "fig6_block_size")
    if doc.arch_grid:
        written += figures.arch_grid_figure(doc.arch_grid, out / "fig7_arch_grid")
    return written


def load_any(results: str | None, wandb_project: str | None, wandb_group: str | None) -> pd.DataFrame:
    """The result records of ``--results PATH`` or of ``--wandb ENTITY/PROJECT`` (exactly one of them)."""
    if (results is None) == (wandb_project is None):
        raise ValueError("give exactly one of --results PATH or --wandb ENTITY/PROJECT")
    return load_results(results) if results is not None else load_wandb(wandb_project, wandb_group)


# ---- python -m analysis <command> -----------------------------------------------------------------------------------


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
    p.add_argument("--baseline", default="baseline", help="variant name of the baseline arm (default: baseline)")
    p.add_argument(
        "--dataset",
        help="fit only the runs of this data set (data_fingerprint, a prefix of it, or the dataset "
        "path); needed when a table holds several",
    )
    p.add_argument("--study", help="which study to fit as the scaling ladder (default: the one of study_kind scaling)")
    p.add_argument(
        "--compute",
        default="pflops_days",
        choices=["pflops_days", "pflops_days_6nd"],
        help="compute column (default: pflops_days)",
    )
    add_bootstrap(p)
    p.add_argument(
        "--bootstrap-mode",
        default="auto",
        choices=["auto", "cluster", "parametric"],
        help="auto: paired cluster bootstrap over seeds when every size has >= 2 seeds, else parametric",
    )
    p.add_argument(
        "--seed-sigma", type=float, help="seed-noise sd of one run's final val loss, for the parametric bootstrap"
    )
    p.add_argument(
        "--seed-rho", type=float, default=0.0, help="share of seed noise common to both arms of a cell (default: 0)"
    )
    p.add_argument(
        "--form",
        default="auto",
        choices=["auto", "saturating", "power_law"],
        help="joint-fit form: auto = E + A C^-alpha, falling back to E = 0 when E hits a bound",
    )
    p.add_argument(
        "--outliers",
        default="keep",
        choices=["keep", "exclude"],
        help="runs the outlier rule flags: keep them in the fit (default; the fit without them is reported too) "
        "or exclude them",
    )
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
    """``fit``'s optional sections (docs/analysis.md): wall clock, rollout, E sensitivity, the N-D fit."""
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
    help="fit a results table and write fit.json, summary.md and figures",
    arguments=_arguments,
    headline=fit_headline,
    aliases=("arch_grid",),  # the architecture grid is reported by the fit (fit.json arch_grid, its table and figure)
    files="summary.md, fit.json, figures",
)
def report(args: argparse.Namespace, argv: Sequence[str]) -> Any:
    """``fit``: fit.json, summary.md and figures, then each multiplier's headline."""

    df = load_any(args.results, args.wandb, args.wandb_group)
    if args.dataset:
        df = select_dataset(df, args.dataset)
    if args.seeds:
        df = select_seeds(df, args.seeds)
    options = FitOptions(
        baseline=args.baseline,
        study=args.study,
        compute=args.compute,
        B=args.bootstrap,
        seed=args.seed,
        bootstrap_mode=args.bootstrap_mode,
        seed_sigma=args.seed_sigma,
        seed_rho=args.seed_rho,
        form=args.form,
        skip_incomplete=args.skip_incomplete,
        outliers=args.outliers,
    )
    sections = Sections(wallclock=args.wallclock, rollout=args.rollout, e_sensitivity=args.e_sensitivity, nd=args.nd)
    doc = run_fit(df, args.out, options, make_figures=not args.no_figures, sections=sections)
    for v, m in doc.multipliers.items():
        lo, hi = m.m_ci95 or (None, None)
        print(
            f"{v}: m = {number(m.m)} [{number(lo)}, {number(hi)}], P(m<=1) = {number(m.p_m_le_1)}, "
            f"paper M = {number(m.paper_M)}, per-size geo-mean = {number(m.per_size_geomean)}"
        )
        c = m.paper_M_curve
        if m.headline == "curve" and c is not None:
            print(
                f"  exponents differ significantly: M(C) runs from {number(c.M[0])} at C = {c.C[0]:.3g} "
                f"to {number(c.M[-1])} at C = {c.C[-1]:.3g} (see fit.json paper_M_curve)"
            )
    for v, m in doc.multipliers.items():
        for line in rung_headline(m.to_dict(), v, (doc.wallclock or {}).get(v)):
            print(f"  {line}")
    for line in _section_lines(doc):
        print(line)
    print(f"wrote {', '.join(doc.files)} to {args.out}")
    return doc


def _section_lines(doc: FitDocument) -> list[str]:
    """The optional sections' headline lines (wall-clock multipliers, the rollout's predictions, the E range)."""
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
    for arm, e in ((doc.nd_fit or {}).get("arms") or {}).items():
        if e.get("error"):
            lines.append(f"nd fit {arm}: {e['error']}")
        else:
            lines.append(f"nd fit {arm}: {e['law']}")
    return lines
