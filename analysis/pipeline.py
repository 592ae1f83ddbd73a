"""`python -m analysis fit`: results -> fit.json, summary.md and figures in one directory."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from . import figures
from .bootstrap import DEFAULT_B
from .records import AnalysisWarning, load_results, load_wandb, scaling_runs, select_completed
from .markdown import ablation_markdown, arch_grid_markdown, summary_markdown
from .report import ablation_table, analyse_scaling, arch_grid_table, block_size_sweep, write_json


def run_fit(
    df: pd.DataFrame,
    out: str | Path,
    *,
    baseline: str = "baseline",
    study: str | None = None,
    compute: str = "pflops_days",
    B: int = DEFAULT_B,
    seed: int = 0,
    bootstrap_mode: str = "auto",
    seed_sigma: float | None = None,
    seed_rho: float = 0.0,
    form: str = "auto",
    skip_incomplete: bool = False,
    make_figures: bool = True,
    outliers: str = "keep",
) -> dict[str, Any]:
    """Fit one results table and write everything under ``out``; returns the fit.json document."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base_dir = df.attrs.get("base_dir")
    completed, excluded = select_completed(df, compute)
    ladder = scaling_runs(completed, study)
    if ladder.empty:
        warnings.warn("no scaling-ladder runs: only block-size / ablation / arch-grid outputs are written", AnalysisWarning, stacklevel=2)
        doc: dict[str, Any] = {"schema_version": 1, "source": df.attrs.get("source"), "baseline": baseline, "compute": compute,
                               "excluded_runs": excluded, "variants": {}, "multipliers": {}, "losses": [], "sizes": [],
                               "protocols": {}}  # fmt: skip
    else:
        doc = analyse_scaling(
            ladder, baseline=baseline, compute=compute, B=B, seed=seed, bootstrap_mode=bootstrap_mode,
            seed_sigma=seed_sigma, seed_rho=seed_rho, form=form, skip_incomplete=skip_incomplete,
            excluded=excluded, source=df.attrs.get("source"), study=study, outliers=outliers, base_dir=base_dir,
        )  # fmt: skip
        ladder = doc.pop("_frame")
    sweep = block_size_sweep(completed, baseline)
    ablations = ablation_table(completed, baseline)
    arch = arch_grid_table(completed, baseline)
    doc["block_size_sweep"] = sweep
    doc["ablations"] = ablations
    doc["arch_grid"] = arch
    written: list[Path] = []
    if ablations:
        (out / "table4_ablations.md").write_text("\n".join(["# Ablations (Table 4 style)", ""] + ablation_markdown(ablations)) + "\n")
        written.append(out / "table4_ablations.md")
    if arch:
        (out / "fig7_arch_grid.md").write_text("\n".join(["# Architecture grid (Fig. 7 style)", ""] + arch_grid_markdown(arch)) + "\n")
        written.append(out / "fig7_arch_grid.md")
    if make_figures:
        fitted = ladder[ladder["variant"].isin(list(doc["variants"]))] if not ladder.empty else ladder
        if doc["variants"]:
            written += figures.scaling_figure(fitted, doc, out / "fig4_scaling", compute=compute)
        if not fitted.empty:
            written += figures.loss_curves_figure(fitted, out / "loss_curves", base_dir=base_dir, compute=compute)
            written += figures.dynamics_figure(fitted, out / "fig5_dynamics", base_dir=base_dir, compute=compute)
            written += figures.depth_weights_figure(fitted, out / "fig8_depth_weights", base_dir=base_dir, compute=compute)
        if sweep:
            written += figures.block_size_figure(sweep, out / "fig6_block_size")
        if arch:
            written += figures.arch_grid_figure(arch, out / "fig7_arch_grid")
    doc["files"] = sorted(str(p.relative_to(out)) for p in written) + ["fit.json", "summary.md"]
    write_json(doc, out / "fit.json")
    (out / "summary.md").write_text(summary_markdown(doc))
    return doc


def load_any(results: str | None, wandb_project: str | None, wandb_group: str | None) -> pd.DataFrame:
    if (results is None) == (wandb_project is None):
        raise ValueError("give exactly one of --results PATH or --wandb ENTITY/PROJECT")
    return load_results(results) if results is not None else load_wandb(wandb_project, wandb_group)
