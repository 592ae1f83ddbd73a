"""The fit pipeline: one results table -> fit.json, summary.md, the stand-alone tables and the figures, in one
directory (:func:`run_fit`). What is fitted follows each record's study kind: the scaling ladder
(analysis.laws.scaling_ladder), the block-size sweep and the ablation table (analysis.laws.fixed_shape), the
architecture grid (analysis.laws.arch_grid).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..io.fit_document import FitDocument
from ..io.report import SCHEMA_VERSION, write_json
from ..io.runs import AnalysisWarning, as_plain_scaling, scaling_runs, select_completed
from ..laws.arch_grid import arch_grid_table
from ..laws.fit_options import FitOptions
from ..laws.fixed_shape import ablation_table, block_size_sweep
from ..laws.scaling_ladder import analyse_scaling
from . import figures
from .markdown import summary_markdown
from .tables import ablation_markdown, arch_grid_markdown


@dataclass(frozen=True)
class Sections:
    """The optional sections of ``python -m analysis fit``, each off by default: ``wallclock`` (the wall-clock
    multiplier beside each compute one), ``rollout`` (how many largest rungs to hold out and predict; 0: none),
    ``e_sensitivity`` (the fractions of the lowest loss at which E is pinned; None: none), ``nd`` (the fit over
    parameters and tokens)."""

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
    the fit document. The ``scaling`` study (or ``options.study``) is fitted as a compute ladder, the
    ``block_size``, ``ablations`` and ``arch_grid`` studies as their sweep and tables."""
    extra = sections if sections is not None else Sections()
    opt = options if options is not None else FitOptions()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base_dir = df.attrs.get("base_dir")
    df, plain = as_plain_scaling(df)
    if plain is not None:
        warnings.warn(plain, AnalysisWarning, stacklevel=2)
    completed, excluded = select_completed(df, opt.compute)
    ladder = scaling_runs(completed, opt.study)
    if ladder.empty:
        msg = "no scaling-ladder runs: only block-size / ablation / arch-grid outputs are written"
        warnings.warn(msg, AnalysisWarning, stacklevel=2)
        parts: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "source": df.attrs.get("source")}
        parts |= {"baseline": opt.baseline, "compute": opt.compute, "excluded_runs": excluded}
    else:
        fit = analyse_scaling(ladder, opt, excluded=excluded, source=df.attrs.get("source"), base_dir=base_dir)
        parts, ladder = fit.parts, fit.runs
    parts |= {
        "block_size_sweep": block_size_sweep(completed, opt.baseline),
        "ablations": ablation_table(completed, opt.baseline),
        "arch_grid": arch_grid_table(completed, opt.baseline),
    }
    if not ladder.empty:
        parts |= _optional_sections(ladder, parts, opt, extra)
    doc = FitDocument.from_dict(parts)
    written = _write_tables(doc, out)
    if make_figures:
        written += _draw_figures(doc, ladder, out, opt.compute, base_dir)
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
    tables = []
    if doc.ablations:
        tables.append(("table4_ablations.md", "# Ablations (Table 4 style)", ablation_markdown(doc.ablations)))
    if doc.arch_grid:
        grid = arch_grid_markdown(doc.arch_grid.to_dict())
        tables.append(("fig7_arch_grid.md", "# Architecture grid (Fig. 7 style)", grid))
    for name, title, md in tables:
        (out / name).write_text("\n".join([title, "", *md]) + "\n")
    return [out / name for name, _, _ in tables]


def _draw_figures(doc: FitDocument, ladder: pd.DataFrame, out: Path, compute: str, base_dir: str | None) -> list[Path]:
    """Every figure the document and the analysed ladder runs allow (PNG and PDF each)."""
    written: list[Path] = []
    fitted = ladder[ladder["variant"].isin(list(doc.variants))] if not ladder.empty else ladder
    if doc.variants:
        written += figures.scaling_figure(fitted, doc, out / "fig4_scaling", compute=compute)
    if not fitted.empty:
        for draw, name in (
            (figures.loss_curves_figure, "loss_curves"),
            (figures.dynamics_figure, "fig5_dynamics"),
            (figures.depth_weights_figure, "fig8_depth_weights"),
        ):
            written += draw(fitted, out / name, base_dir=base_dir, compute=compute)
    if doc.block_size_sweep:
        written += figures.block_size_figure(doc.block_size_sweep, out / "fig6_block_size")
    if doc.arch_grid:
        written += figures.arch_grid_figure(doc.arch_grid, out / "fig7_arch_grid")
    if doc.rollout and not ladder.empty:
        written += figures.rollout_figure(doc.rollout, ladder, out / "fig_rollout", doc.baseline, compute)
    return written
