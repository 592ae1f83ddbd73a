"""summary.md of ``python -m analysis fit`` and ``paper``: the fit document (schema: docs/analysis.md) as Markdown.

Pure functions from the document's dicts to text: the scaling ladder's sections here, one function a section, then
each other study kind's section (analysis.render.tables: block size, ablations, architecture grid).
Nothing here fits or resamples; every number printed is read from the document.
"""

from __future__ import annotations

from typing import Any

from ..laws.fit import ALPHA_BOUNDS
from ..laws.multipliers import PAIRED_SD_FLOOR
from .multiplier_text import e_sensitivity_markdown, nd_markdown, rollout_markdown, rung_markdown, wallclock_line
from .tables import AT_BOUND, ablation_markdown, arch_grid_markdown, block_size_markdown, markdown_table
from .tables import ci as _ci
from .tables import fmt as _fmt
from .tables import loss_cell as _loss_cell


def summary_markdown(doc: dict[str, Any], title: str = "Scaling-law summary") -> str:
    """The tables a user pastes into a paper: losses per size and variant, fitted laws, multipliers; then the
    block-size, ablation and architecture-grid sections of a document that holds them."""
    lines = [f"# {title}", ""]
    if doc.get("source"):
        lines += [f"Source: `{doc['source']}`" + (f", study `{doc['study']}`" if doc.get("study") else "") + ".", ""]
    base = doc.get("baseline", "baseline")
    for section in (_losses, _laws, _multipliers, _precision, _paired_deltas, _paired_multiplier, _protocols):
        lines += section(doc, base)
    lines += [*_outliers(doc), *_excluded(doc)]
    if doc.get("block_size_sweep"):
        lines += block_size_markdown(doc["block_size_sweep"])
    if doc.get("ablations"):
        lines += ["## Ablations", "", *ablation_markdown(doc["ablations"]), ""]
    if doc.get("arch_grid"):
        lines += ["## Architecture grid (Fig. 7)", "", *arch_grid_markdown(doc["arch_grid"]), ""]
    if doc.get("wallclock") is not None:  # the sections `python -m analysis fit` writes only when asked
        lines += [f"## Wall-clock multiplier vs {base} (docs/analysis.md)", ""]
        lines += [f"-{wallclock_line(v, e)[1:]}" for v, e in doc["wallclock"].items()] or ["- no CPU times"]
        lines.append("")
    if doc.get("rollout"):
        lines += rollout_markdown(doc["rollout"], base)
    if doc.get("e_sensitivity"):
        lines += e_sensitivity_markdown(doc["e_sensitivity"], base)
    if doc.get("nd_fit"):
        lines += nd_markdown(doc["nd_fit"])
    return "\n".join(lines)


def _step_span(first: int, last: int) -> str:
    return f"{first}" if first == last else f"{first}–{last}"


def _losses(doc: dict[str, Any], base: str) -> list[str]:
    """Validation loss per size and variant, with the difference from the baseline."""
    if not doc.get("losses"):
        return []
    variants = list(doc.get("variants", {}))
    header = ["size", f"C ({doc.get('compute_units', 'PFLOP/s-days')}, {base})"]
    header += [v if v == base else f"{v} (Δ vs {base})" for v in variants]
    by = {(r["size"], r["variant"]): r for r in doc["losses"]}
    rows = []
    for size in doc.get("sizes", []):
        b = by.get((size, base))
        cells = [size, _fmt(b["C"], 3) if b else "–"]
        for v in variants:
            r = by.get((size, v))
            if r is None:
                cells.append("–")
            elif v == base or r["delta_vs_baseline"] is None:
                cells.append(_loss_cell(r))
            else:
                cells.append(f"{_loss_cell(r)} ({r['delta_vs_baseline']:+.4f})")
        rows.append(cells)
    n_seeds = ", ".join(map(str, sorted({r["n_runs"] for r in doc["losses"]})))
    table = markdown_table(header, rows)
    return ["## Validation loss per size", "", *table, "", f"Mean ± sd over seeds ({n_seeds} per cell).", ""]


def _laws(doc: dict[str, Any], base: str) -> list[str]:
    """Each arm's fitted paper-form law."""
    if not doc.get("variants"):
        return []
    rows = []
    for v, f in doc["variants"].items():
        A, alpha = f"{f['A']:.4f} {_ci(f['A_ci95'], 4)}", f"{f['alpha']:.4f} {_ci(f['alpha_ci95'], 3)}"
        rows.append([v, A, alpha, str(len(f["sizes"])), f"{f['rmse_log']:.2g}"])
    table = markdown_table(["variant", "A [95% CI]", "α [95% CI]", "sizes", "rmse(log L)"], rows)
    return ["## Fitted laws (paper form, L = A·C^−α, C in PFLOP/s-days)", "", *table, ""]


def _bound_note(doc: dict[str, Any]) -> list[str]:
    """One paragraph, where some interval end of the joint fits is set by a search bound, saying which bounds and
    how many replicates ended on one (fit.json's ``joint.draws_at_bound``)."""
    hits = {
        v: mm["joint"].get("draws_at_bound") or 0
        for v, mm in doc["multipliers"].items()
        if any(
            any(flags or [])
            for flags in (
                mm.get("m_ci95_at_bound"),
                (mm.get("exponents") or {}).get("diff_ci95_at_bound"),
                mm["joint"].get("alpha_ci95_at_bound"),
                mm["joint"].get("E_ci95_at_bound"),
            )
        )
    }
    if not hits:
        return []
    B = (doc.get("bootstrap") or {}).get("B")
    counts = ", ".join(f"{v} {n}" + (f" of {B}" if B else "") for v, n in hits.items())
    note = (
        f"An interval end printed as ≤x / ≥x {AT_BOUND} is unbounded: bootstrap replicates of the saturating joint "
        f"fit ended on its search bounds (α in [{ALPHA_BOUNDS[0]:g}, {ALPHA_BOUNDS[1]:g}], E at most the smallest "
        f"loss) and reach that end, so the bound, not the data, sets it; x is how far out it is at least "
        f"(replicates on a bound: {counts}). The same holds for numbers derived from those replicates "
        "(m, α_v − α_b)."
    )
    return [note, ""]


def _headline_note(mm: dict[str, Any]) -> list[str]:
    """Where the joint fit's m lies outside the range of the per-size m_s, one sentence on why, from the
    document's ``headline_gap`` (analysis.laws.multipliers.headline_gap)."""
    g = mm.get("headline_gap")
    if not g:
        return []
    return [
        (
            f"  Why m ({mm['m']:.3f}) lies {g['side']} every per-size m_s ({g['m_s_min']:.3f}–{g['m_s_max']:.3f}, "
            f"geo-mean {mm['per_size_geomean']:.3f}): the m_s invert the baseline's own curve (α_b = "
            f"{g['alpha_base']:.4f}), m the joint fit's (shared α = {g['alpha_shared']:.4f}); on the joint fit's "
            f"baseline curve the m_s have a geo-mean of {g['m_s_joint_curve_geomean']:.3f} (the curves account for "
            f"×{g['factor_curves']:.3f}), and the rest, ×{g['factor_off_curve']:.3f}, is the variant's runs lying off "
            "its fitted curve on average (the robust fit does not pass through the size means)."
        )
    ]


def _multipliers(doc: dict[str, Any], base: str) -> list[str]:
    """The multipliers table, each variant's joint fit and per-size m_s, and how the intervals were drawn."""
    if not doc.get("multipliers"):
        return []
    header = ["variant", "paper M at C_max [95% CI]", "joint-fit m [95% CI]", "P(m ≤ 1)"]
    header += ["per-size geo-mean m_s [95% CI]", "α_v − α_b [95% CI]"]
    rows = []
    for v, mm in doc["multipliers"].items():
        ex = mm["exponents"]
        flag = " (differ)" if ex["significant"] else ""
        paper = f"{mm['paper_M']:.3f}× {_ci(mm['paper_M_ci95'])} (C = {mm['paper_M_at_C']:.3g})"
        m = f"{mm['m']:.3f}× {_ci(mm['m_ci95'], at_bound=mm.get('m_ci95_at_bound'))}"
        geo = f"{mm['per_size_geomean']:.3f}× {_ci(mm['per_size_geomean_ci95'])}"
        diff = f"{ex['diff']:+.4f} {_ci(ex['diff_ci95'], 2, at_bound=ex.get('diff_ci95_at_bound'))}{flag}"
        rows.append([v, paper, m, _fmt(mm["p_m_le_1"], 3), geo, diff])
    lines = [f"## Compute multipliers vs {base}", "", *markdown_table(header, rows), "", *_bound_note(doc)]
    for v, mm in doc["multipliers"].items():
        j = mm["joint"]
        form = "L = E + A_arm·C^−α, E and α shared" if j["form"] == "saturating" else "L = A_arm·C^−α, α shared (E = 0)"
        alpha = f"{j['alpha']:.4f} {_ci(j['alpha_ci95'], at_bound=j.get('alpha_ci95_at_bound'))}"
        lines += [f"- **{v}**: joint fit {form}: E = {_fmt(j['E'])}, α = {alpha}.", *_headline_note(mm)]
        if j.get("fallback"):
            lines.append(f"  Fallback: {j['fallback']}.")
        if mm["headline"] == "curve":
            c = mm["paper_M_curve"]
            pts = ", ".join(
                f"M({c['C'][i]:.3g}) = {c['M'][i]:.3f} {_ci([c['ci95_lo'][i], c['ci95_hi'][i]])}"
                for i in (0, len(c["C"]) // 2, -1)
            )
            lines.append(f"  The exponents differ significantly, so the multiplier is a curve, not one number: {pts}.")
        sizes = ", ".join(f"{s}: {p['m']:.3f}" for s, p in mm["per_size"].items())
        lines.append(f"  Per-size m_s: {sizes}.")
    b = doc["bootstrap"]
    if b["mode"] == "paired_cluster":
        how = (
            f"paired, size-stratified cluster bootstrap over seeds (both arms of a size/seed cell together), "
            f"deviations scaled by {b['scale']:.3f} = sqrt(mean n/(n−1))"
        )
    else:
        how = f"parametric seed-noise bootstrap, σ = {b['sigma']:.3g} ({b['sigma_source']}), ρ = {b['rho']}"
    lines += ["", f"Intervals: 95% percentile, {how}; B = {b['B']}, seed {b['seed']}.", ""]
    return lines + rung_markdown(doc["multipliers"], doc.get("wallclock"))


def _precision(doc: dict[str, Any], base: str) -> list[str]:
    """How well the study resolves its answer (fit.json ``precision``)."""
    pr = doc.get("precision")
    if not pr:
        return []
    sds = [v for v in pr["baseline_seed_sd"].values() if v is not None]
    seed_sds = ", ".join(f"{k} {_fmt(v, 3)}" for k, v in pr["baseline_seed_sd"].items())
    halves = ", ".join(f"{v} {_fmt(h, 3)}" for v, h in pr["m_half_width_over_m"].items())
    paired = ", ".join(f"{v} {_fmt(h, 3)}" for v, h in (pr.get("paired_m_half_width_over_m") or {}).items())
    runs, means = _fmt(pr["baseline_rmse_log_runs"], 3), _fmt(pr["baseline_rmse_log_means"], 3)
    return [
        "## Precision",
        "",
        f"- Baseline seed sd per size: {seed_sds}" + (f" (largest {max(sds):.4f})" if sds else "") + ".",
        f"- Baseline mean loss strictly decreasing with compute: {'yes' if pr['baseline_decreasing'] else '**no**'}.",
        f"- Baseline power law rmse(log L): {runs} over runs, {means} over size means.",
        f"- Multiplier 95% half-width / m: {halves}; paired multiplier: {paired}.",
        "",
    ]


def _paired_deltas(doc: dict[str, Any], base: str) -> list[str]:
    """The same-seed differences per size and variant."""
    if not doc.get("paired_deltas"):
        return []
    rows = []
    for r in doc["paired_deltas"]:
        diffs = ", ".join(f"{x:+.4f}" for x in r["diffs"])
        rows.append([r["size"], r["variant"], str(r["n_pairs"]), f"{r['mean']:+.4f}", _fmt(r["sd"], 3), diffs])
    table = markdown_table(["size", "variant", "pairs", "mean Δ", "sd of Δ", "Δ per seed"], rows)
    return [f"## Paired differences vs {base} (same seed: same initialisation and data order)", "", *table, ""]


def _paired_multiplier(doc: dict[str, Any], base: str) -> list[str]:
    """The paired multiplier per size, pooled, and the sizes' heterogeneity."""
    paired = {v: m["paired"] for v, m in doc.get("multipliers", {}).items() if (m.get("paired") or {}).get("m")}
    if not paired:
        return []
    lines = [
        "## Paired multiplier (same-seed differences through the baseline's local slope)",
        "",
        (
            "At each size, ln m_s = −ln(1 + mean Δ / (L_b − E)) / α_b − ln(C_v / C_b): the mean paired difference "
            "read through the baseline law at the size's baseline loss. Sizes pooled in ln m, weighted by pairs "
            f"/ max(sd Δ of the size, pooled over arms, {PAIRED_SD_FLOOR:g})². Same bootstrap replicates as the "
            "joint fit. It assumes one constant multiplier, as the joint fit does, and is tight only where an arm's "
            "runs stay with their baseline seed-mates. With three seeds its interval can be overconfident (three "
            "pairs do not estimate the pair noise): the joint fit is the headline."
        ),
        "",
        "| variant | size | pairs | mean Δ ± sd | m_s [95% CI] | weight |",
        "|---|---|---|---|---|---|",
    ]
    for v, p in paired.items():
        for size, r in p["per_size"].items():
            sd = f" ± {r['delta_sd']:.4f}" if r["delta_sd"] is not None else ""
            lines.append(
                f"| {v} | {size} | {r['n_pairs']} | {r['delta']:+.4f}{sd} | {r['m']:.3f}× {_ci(r['m_ci95'])} "
                f"| {r['weight']:.2f} |"
            )
        pooled = f"**{p['m']:.3f}× {_ci(p['m_ci95'])}**, P(m ≤ 1) = {_fmt(p['p_m_le_1'], 3)}"
        lines.append(f"| **{v}** | **pooled** | | | {pooled} | 1 |")
    lines.append("")
    for v, p in paired.items():
        h = p.get("heterogeneity") or {}
        if h.get("Q") is not None:
            one = (h["p"] or 1) >= 0.05
            verdict = "consistent with one multiplier" if one else "**the sizes disagree: no single multiplier**"
            lines.append(
                f"- {v}: heterogeneity over sizes Q = {h['Q']:.2f} on {h['dof']} dof, p = {_fmt(h['p'], 3)}, "
                f"I² = {_fmt(h['I2'], 2)}, τ(ln m) = {h['tau']:.3f}: {verdict}."
            )
    return [*lines, ""]


def _protocols(doc: dict[str, Any], base: str) -> list[str]:
    """The multiplier at the shared and at each arm's own tuned lr."""
    if not doc.get("protocols"):
        return []
    rows = []
    for v, p in doc["protocols"].items():
        both = (p["shared_lr"], p["own_lr"])
        paired = [f"{q['paired_m']:.3f}× {_ci(q['paired_m_ci95'])}" if q.get("paired_m") else "n/a" for q in both]
        ms = [f"{q['m']:.3f}× {_ci(q['m_ci95'])}" for q in both]
        rows.append([v, *ms, f"{p['ratio_own_over_shared']:.3f} {_ci(p['ratio_ci95'])}", *paired])
    header = ["variant", "m, shared lr [95% CI]", "m, own lr [95% CI]", "own / shared [95% CI]"]
    header += ["paired m, shared lr", "paired m, own lr"]
    return [
        "## Learning-rate protocols",
        "",
        (
            "Shared lr: every arm at the baseline's tuned lr (the paper's protocol). Own lr: each arm at its own "
            "tuned lr. Both multipliers come from the same bootstrap replicates, so their ratio has its own interval."
        ),
        "",
        *markdown_table(header, rows),
        "",
    ]


def _outliers(doc: dict[str, Any]) -> list[str]:
    """The outlier rule, the runs it flags, the disagreeing cells and the fit without the flagged runs."""
    o = doc.get("outliers") or {}
    if not o:
        return []
    rule = o["rule"]
    lines = [
        "## Outlier rule",
        "",
        (
            f"A run is flagged when its training loss spikes (the median of {rule['spike_span']} logged values > "
            f"{rule['spike_ratio']}× the median of the 10 before them, or an evaluation > "
            f"{100 * rule['val_rise']:g}% above the best earlier one, after the first 10% of training), when it "
            f"plateaus (val loss better by < {100 * rule['plateau_gain']:g}% over the second half), or when its "
            f"final loss is > {rule['off_mates_sigmas']:g} pooled seed sds and > {rule['off_mates_floor']} nats off "
            f"its cell's median. Cells whose seed sd exceeds {rule['cell_sd_bound']} nats are listed. Mode: "
            f"**{o['mode']}** flagged runs."
        ),
        "",
    ]
    lines += [
        f"- `{f['run_id']}` ({f['variant']}/{f['size']}/seed {f['seed']}): val loss {f['val_loss']:.4f}, "
        f"flags {f['flags']}"
        for f in o.get("flagged") or []
    ] or ["- No run is flagged."]
    if o.get("data_spikes"):
        events = ", ".join(
            f"seed {e['seed']} at step {_step_span(e['step'], e['last_step'])} ({e['n_runs']} runs)"
            for e in o["data_spikes"]
        )
        lines.append(
            f"- Not flagged, the data's: spikes that runs of another trajectory on the same batches (seed, data, batch "
            f"shape) show within {rule['data_event_steps']} steps, a stretch of hard text every model scores high: "
            f"{events}."
        )
    for c in o.get("cells_disagreeing", []):
        lines.append(
            f"- Seeds disagree: {c['variant']} at {c['size']}, sd {c['sd']:.4f} > {c['bound']} "
            f"({', '.join(f'{x:.4f}' for x in c['val_losses'])})."
        )
    wf = doc.get("without_flagged")
    if wf and "error" in wf:
        lines.append(f"- Without the flagged runs the ladder cannot be fitted: {wf['error']}")
    elif wf:
        fits = "; ".join(
            f"{v} m = {m['m']:.3f}× {_ci(m['m_ci95'])}"
            + (f" (paired {m['paired_m']:.3f}× {_ci(m['paired_m_ci95'])})" if m.get("paired_m") else "")
            for v, m in wf.items()
        )
        lines.append(f"- Without the flagged runs: {fits}.")
    return [*lines, ""]


def _excluded(doc: dict[str, Any]) -> list[str]:
    """The runs left out of the fit, and why."""
    if not doc.get("excluded_runs"):
        return []
    runs = [
        f"- `{e['run_id']}` ({e['variant']}/{e['size']}/seed {e['seed']}): {e['reason']}" for e in doc["excluded_runs"]
    ]
    return ["## Excluded runs", "", *runs, ""]
