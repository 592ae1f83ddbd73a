"""The lines a study prints under its report (``python -m sweeps.study``): the fit's headline (each arm's compute
multiplier with its interval, beside its wall-clock version), the committed full result beside a new run's, and the
regime sentence (the shape, context and tokens per parameter the runs measured, against the paper's claim)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..io.fit_document import FitDocument, Multiplier

PAPER_SUBLAYERS = (24, 34)
PAPER_D_MODEL = (896, 1264)
PAPER_TOKENS_PER_PARAM = (100, 400)  # "~200": within a factor of two counts as the paper's training length
CPU_MAP_NOTE = " (where Block AttnRes starts to pay at CPU scale: docs/results/cpu_map/)"


def regime_sentence(results: Path, why: str | None = None) -> str:
    """One sentence on the regime a study's completed runs measured (depths, widths, heads, context, tokens per
    parameter), where that sits against the paper's claim (the PAPER_* ranges), and ``why`` the study measures
    there."""
    from ..io.runs import completed_runs, load_results

    df = load_results(results)
    df = completed_runs(df)
    if df.empty:
        return "regime: no completed runs"

    def span(col: str) -> str:
        lo, hi = int(df[col].min()), int(df[col].max())
        return f"{lo}" if lo == hi else f"{lo}-{hi}"

    def inside(values: Any, bounds: tuple[int, int]) -> bool:
        return bounds[0] <= values.min() and values.max() <= bounds[1]

    tpp = (df["tokens"] / df["params_non_embedding"]).astype(float)
    tpp_text = f"{tpp.min():.0f}" if round(tpp.min()) == round(tpp.max()) else f"{tpp.min():.0f}-{tpp.max():.0f}"
    layers, widths = df["n_layers"].astype(int), df["d_model"].astype(int)
    sublayers = f"{2 * layers.min()}-{2 * layers.max()}"
    paper_shape = inside(2 * layers, PAPER_SUBLAYERS) and inside(widths, PAPER_D_MODEL)
    if not paper_shape:
        verdict = "so a result here speaks for this shape, not for the paper's"
    elif inside(tpp, PAPER_TOKENS_PER_PARAM):
        verdict = "and these runs are at the paper's shapes and training length, so a result here speaks for its regime"
    else:
        verdict = (
            f"and these runs are at the paper's shapes but {tpp_text} tokens per parameter, so a result here speaks "
            "for the paper's shapes at this training length"
        )
    return (
        f"regime: L_b {span('n_layers')} transformer blocks ({sublayers} sublayers), d_model {span('d_model')} "
        f"({span('n_heads')} heads), context {span('seq_len')}, {tpp_text} tokens per parameter; the paper's claim is "
        f"at 24-34 sublayers, d_model 896-1264 and ~200 tokens per parameter, {verdict}"
        + (f"; {why}" if why else "" if paper_shape else CPU_MAP_NOTE)
    )


def m_interval_text(m: Multiplier) -> str:
    """``m = 1.234x (95% CI 1.100-1.400)``: a multiplier with its interval, as every study line prints it."""
    lo, hi = m.m_ci95 or (float("nan"), float("nan"))
    return f"m = {m.m:.3f}x (95% CI {lo:.3f}-{hi:.3f})"


def committed_lines(path: Path, root: Path | None = None) -> list[str]:
    """The committed full result's multipliers (fit.json at ``path``; its directory named relative to ``root``),
    one line per arm; none when there is no such file."""
    if not path.is_file():
        return []
    fit = FitDocument.from_json(path)
    seeds = "/".join(map(str, sorted(set((fit.bootstrap.seeds_per_size or {}).values())))) if fit.bootstrap else ""
    where = f"{seeds or '?'} seeds per size, {path.parent.relative_to(root) if root else path.parent}"
    return [f"  committed ({where}): {n}: {m_interval_text(m)}" for n, m in fit.multipliers.items() if m.m is not None]


def fit_headline(fit: FitDocument) -> list[str]:
    """One line per variant: the compute multiplier vs the baseline with its 95% interval (``fit``: the document
    ``python -m analysis fit`` built, or read back from its fit.json: ``FitDocument.from_json``)."""
    lines = [
        f"  {name}: best val loss {b.val_loss:.4f} at d/L_b = {b.d_over_lb:g}, H/L_b = {b.heads_over_lb:g}"
        " (the grid: fig7_arch_grid.md)"
        for name, b in (fit.arch_grid.best if fit.arch_grid else {}).items()
    ]
    for name, m in fit.multipliers.items():
        if m.m is not None:
            paper = f", paper-form M at largest C = {m.paper_M:.3f}x" if m.paper_M is not None else ""
            lines.append(f"  {name}: compute multiplier {m_interval_text(m)}, P(m <= 1) = {m.p_m_le_1:.3f}{paper}")
    if fit.multipliers:  # the wall-clock multiplier beside the compute one, where the records hold CPU times
        from ..laws.wallclock import document_wallclock
        from .multiplier_text import wallclock_line

        lines += [wallclock_line(name, e) for name, e in document_wallclock(fit).items()]
    for name, p in fit.protocols.items():
        lo, hi = p.ratio_ci95
        lines.append(
            f"  {name}: own-lr / shared-lr multiplier = {p.ratio_own_over_shared:.3f} (95% CI {lo:.3f}-{hi:.3f})"
        )
    flagged = fit.outliers.flagged if fit.outliers else []
    if flagged:
        lines.append(f"  note: {len(flagged)} run(s) flagged by the outlier rule (kept, marked; summary.md lists them)")
    boot = fit.bootstrap
    if lines and boot is not None and boot.mode == "parametric":
        seeds = sorted(set(boot.seeds_per_size.values()))
        lines.append(
            f"  note: {'/'.join(map(str, seeds)) or '1'} seed(s) per size, so the intervals come from a parametric "
            f"bootstrap with sigma = {boot.sigma or float('nan'):.3g} ({boot.sigma_source}): "
            "a first look, not a claim; run >= 2 seeds (--seeds 0,1) for seed-resampled intervals"
        )
    return lines
