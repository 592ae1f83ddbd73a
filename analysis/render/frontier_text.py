"""The text of the compute-optimal frontier (length.json ``frontier``, analysis.laws.frontier): its headline lines,
the equal-exponent test with its crossover warning, approach 2 (analysis.laws.isoflop) and the length report's
Markdown section. Nothing here fits or resamples; every number printed is read from the document.
"""

from __future__ import annotations

from typing import Any

from ..laws.frontier import crossings
from ..laws.isoflop import MIN_RUNGS
from .tables import markdown_table


def _ci(lo: float | None, hi: float | None, spec: str = ".3f") -> str:
    return f"[{lo:{spec}}, {hi:{spec}}]" if lo is not None and hi is not None else "[n/a]"


def _interval(c: list[float] | None, spec: str) -> str:
    return _ci(*c, spec) if c else "[n/a]"


def _m_cell(M: dict[str, Any], i: int) -> str:
    """M(C) at point ``i`` of a curve (``M``: an ``M`` entry of the frontier) with its interval."""
    m = M["M"][i]
    return f"{'n/a' if m is None else f'{m:.3f}x'} {_ci(M['ci95_lo'][i], M['ci95_hi'][i])}"


def _points(C: list[float], M: dict[str, Any]) -> str:
    """M(C) at the bottom, middle and top of the span with bands, and the top's half-width (with its error)."""
    pts = [f"M({C[i]:.3g}) = " + (_m_cell(M, i) if M["M"][i] else "n/a") for i in (0, len(C) // 2, len(C) - 1)]
    half, se = M["half_width_over_M_at_top"], M.get("half_width_at_top_se")
    err = "" if se is None else f", ± {100 * se:.1f} points from the draws alone"
    return f"{', '.join(pts)} (95% half-width at the top {'n/a' if half is None else f'{100 * half:.0f}%'}{err})"


def _reach(reads: dict[str, Any] | None) -> str:
    """How far a curve reads the laws past the measurements: tokens per parameter (above the largest measured,
    below the smallest) and N."""
    if not reads or reads.get("largest_tokens_per_param_read") is None:
        return ""
    tpp, top = reads["largest_tokens_per_param_read"], reads["largest_tokens_per_param_measured"]
    text = f"; reads the laws at up to {tpp:.0f} tokens per parameter (largest measured {top:g}"
    text += f": {tpp / top:.1f}x past it in D)" if tpp > top * 1.01 else ")"
    low, bottom = reads.get("smallest_tokens_per_param_read"), reads.get("smallest_tokens_per_param_measured")
    if low is not None and bottom is not None and low < bottom / 1.01:
        text += f", down to {low:.2g} (smallest measured {bottom:g}: {bottom / low:.1f}x below it)"
    if reads.get("N_reach", 1.0) > 1.01:
        text += f", and at N up to {reads['N_reach']:.1f}x beyond the rungs"
    return text


def exponent_lines(ex: dict[str, Any] | None, fr: dict[str, Any], arm: str, reference: str) -> list[str]:
    """The equal-exponent test and, where the exponents differ, the crossover warning."""
    if not ex:
        return []
    parts = [
        f"{k} {ex[k]['arm']:.3f} vs {ex[k]['reference']:.3f}, difference {ex[k]['difference']:+.3f} "
        f"{_ci(*ex[k]['ci95'], '+.3f')} ({'differ' if ex[k]['differ'] else 'equal within the interval'})"
        for k in ("alpha", "beta")
    ]
    lines = [f"equal exponents ({arm} vs {reference}, paired bootstrap): {'; '.join(parts)}"]
    if ex["differ"]:
        where = []
        for name, M in (("N free", fr["M"]), ("N inside the rungs", (fr.get("within_rungs") or {}).get("M"))):
            if M:
                cross = crossings(fr["C"], M["M"])
                where.append(f"{name}: " + (", ".join(f"C = {c:.3g}" for c in cross) if cross else "not on the span"))
        lines.append(
            "WARNING, crossover: the exponents differ, so M(C) is not one number: it changes with C and can cross 1 "
            f"(M = 1 on the measured span at {'; '.join(where)}); read M(C) where it is measured, not extrapolated"
        )
    return lines


def frontier_lines(fr: dict[str, Any] | None, arm: str, reference: str) -> list[str]:
    """The headline: M(C) at the bottom, middle and top of the measured C with its band and how far each curve
    reads the laws, the equal-exponent test, approach 2, and each rollout."""
    if not fr:
        return []
    if "error" in fr:
        return [f"compute-optimal frontier: n/a ({fr['error']})"]
    C, within = fr["C"], fr.get("within_rungs")
    free = f"{_points(C, fr['M'])}{_reach(fr.get('reads'))}"
    head = f"frontier: {reference}'s compute to reach {arm}'s frontier loss, over {arm}'s (C in PFLOP/s-days), N free"
    lines = [f"{head} (extrapolated past the rungs where N_opt leaves them): {free}"]
    if within:
        lines.append(
            f"frontier with N inside the measured rungs (no extrapolation in N): {_points(C, within['M'])}"
            f"{_reach(within.get('reads'))}"
        )
    lines += exponent_lines(fr.get("exponents"), fr, arm, reference)
    lines += isoflop_lines(fr.get("approach2"), arm, reference)
    for name, ro in fr["rollout"].items():
        without = f"frontier rollout without the {name.replace('_', ' ')}"
        if "error" in ro:
            lines.append(f"{without}: n/a ({ro['error']})")
        else:
            inside = sum(c["inside"] for c in ro["cells"])
            lines.append(f"{without}: {inside} of {len(ro['cells'])} held-out cells inside their predicted intervals")
    return lines


def _tpp(reads: dict[str, Any] | None, i: int) -> str:
    x = (reads or {}).get("reference_tokens_per_param", [None] * (i + 1))[i]
    return "n/a" if x is None else f"{x:.0f}"


def _curve_tables(fr: dict[str, Any], arm: str, reference: str) -> list[str]:
    """The two M(C) tables: N free (with L* per arm) and N inside the measured rungs, every fourth C."""
    header = ["C (PFLOP/s-days)", f"L* {reference} [95%]", f"L* {arm} [95%]", f"N_opt {reference}", f"N_opt {arm}"]
    read_at, span = f"{reference} read at D/N", range(0, len(fr["C"]), 4)
    rows = []
    ref, mine = fr["arms"][reference], fr["arms"][arm]
    for i in span:
        stars = [f"{a['L_star'][i]:.4f} {_ci(a['ci95_lo'][i], a['ci95_hi'][i], '.4f')}" for a in (ref, mine)]
        n_opt = [f"{ref['N_opt'][i]:.3g}", f"{mine['N_opt'][i]:.3g}"]
        rows.append([f"{fr['C'][i]:.3g}", *stars, *n_opt, _tpp(fr.get("reads"), i), _m_cell(fr["M"], i)])
    lines = markdown_table([*header, read_at, "M(C) [95%]"], rows)
    outside = [a for a in (reference, arm) if fr["arms"][a]["N_opt_outside_rungs"]]
    if outside:
        lines += ["", (f"N_opt lies outside the measured rungs somewhere on the span for {', '.join(outside)}: "
                  "there the frontier extrapolates the law in N.")]  # fmt: skip
    within = fr.get("within_rungs")
    if not within:
        return lines
    lines += ["", "With N kept inside the measured rungs (the best the measured model sizes reach at C):", ""]
    rows = []
    for i in span:
        n_ref, n_arm = within["arms"][reference]["N_opt"][i], within["arms"][arm]["N_opt"][i]
        rows.append(
            [f"{fr['C'][i]:.3g}", f"{n_ref:.3g}", f"{n_arm:.3g}", _tpp(within.get("reads"), i), _m_cell(within["M"], i)]
        )
    lines += markdown_table(["C (PFLOP/s-days)", f"N_opt {reference}", f"N_opt {arm}", read_at, "M(C) [95%]"], rows)
    at_edge = [a for a in (reference, arm) if within["arms"][a]["N_opt_at_largest_rung"]]
    if at_edge:
        lines += ["", (f"N_opt reaches the largest rung on the span for {', '.join(at_edge)}: there the compute-"
                  "optimal model is at least that large, and this frontier is the largest rung's.")]  # fmt: skip
    reads = within.get("reads") or {}
    if (reads.get("largest_tokens_per_param_read") or 0) > reads.get("largest_tokens_per_param_measured", 0) * 1.01:
        lines += ["", (f"Inside the rungs in N, not in D: M(C) reads the {reference}'s law at up to "
                  f"{reads['largest_tokens_per_param_read']:.0f} tokens per parameter, past the largest measured "
                  f"({reads['largest_tokens_per_param_measured']:g}).")]  # fmt: skip
    return lines


def frontier_markdown(fr: dict[str, Any] | None, arm: str, reference: str) -> list[str]:
    """length_summary.md's section: the laws, the equal-exponent test, M(C) on the measured span with where it reads
    the laws, L*(C) per arm, approach 2, and the rollouts."""
    if not fr:
        return []
    head = [f"## The compute-optimal frontier: {arm} against {reference}", ""]
    if "error" in fr:
        return [*head, f"n/a: {fr['error']}.", ""]
    lines = [
        *head,
        (
            f"{fr['model']}; {fr['loss']}; {fr['n_runs']} runs, rungs {', '.join(fr['rungs'])}, budgets "
            f"{', '.join(f'{b:g}' for b in fr['budgets'])} tokens per parameter; bands: {fr['bootstrap']} bootstrap "
            f"over seeds, B = {fr['B']} (seed {fr.get('seed', 0)}). M(C) = the {reference}'s compute to reach the "
            f"{arm}'s frontier loss at C, over C; '{reference} read at D/N': the tokens per parameter at which M(C) "
            f"reads the {reference}'s law (at C' = M(C) C)."
        ),
        "",
        *(f"* {a}: {law}" for a, law in fr["laws"].items()),
        "",
        *_curve_tables(fr, arm, reference),
        "",
        *(f"* {line}" for line in frontier_lines(fr, arm, reference)),
        "",
        *isoflop_markdown(fr.get("approach2"), arm, reference),
    ]
    for name, ro in fr["rollout"].items():
        if "error" in ro:
            continue
        rows = []
        for c in ro["cells"]:
            lo, hi = c["prediction_interval95"]
            predicted, inside = f"{c['predicted']:.4f} [{lo:.4f}, {hi:.4f}]", "yes" if c["inside"] else "**no**"
            rows.append([f"{c['arm']}", f"{c['cell']}", predicted, f"{c['measured']:.4f}", inside])
        header = ["arm", "cell", "predicted [95% prediction interval]", "measured", "inside"]
        lines += [f"Rollout without the {name.replace('_', ' ')}:", "", *markdown_table(header, rows), ""]
    return lines


# ---- approach 2, isoFLOP profiles (analysis.laws.isoflop) ------------------------------------------------------------


def isoflop_lines(a2: dict[str, Any] | None, arm: str, reference: str) -> list[str]:
    """The headline: where approach 2 is fitted for each arm, M(C) where it is defined, and where it cannot be."""
    if not a2:
        return []
    levels = a2["levels"]
    short = sum(all(r["arms"][a]["rungs"] < MIN_RUNGS for a in (reference, arm)) for r in levels)
    ms = [f"M({r['C']:.3g}) = {r['M']:.3f}x {_interval(r['M_ci95'], '.3f')}" for r in levels if r["M"] is not None]

    def fitted(a: str) -> str:
        Cs = [r["C"] for r in levels if r["arms"][a].get("L_opt") is not None]
        return f"{len(Cs)} ({f'C {Cs[0]:.3g} to {Cs[-1]:.3g}' if Cs else 'no C'})"

    return [
        f"approach 2 (isoFLOP parabolas in ln N through the rungs reaching C): of {len(levels)} compute levels, fitted "
        f"for {reference} at {fitted(reference)} and for {arm} at {fitted(arm)}; at {short} fewer than {MIN_RUNGS} "
        "rungs reach C for both arms, so it cannot be fitted there; "
        + (f"M(C): {', '.join(ms)}" if ms else "M(C) is defined at no level (the arms' fitted stretches do not meet)")
    ]


def isoflop_markdown(a2: dict[str, Any] | None, arm: str, reference: str) -> list[str]:
    """length_summary.md's part: the levels where at least one arm has MIN_RUNGS rungs, with N_opt, L_opt, M (its
    headline, :func:`isoflop_lines`, is among the frontier's)."""
    if not a2:
        return []
    lines = [
        "### Approach 2 (isoFLOP profiles) beside approach 3",
        "",
        (
            f"{a2['method']}; M(C) from the two arms' L_opt(C), interpolated in ln C between neighbouring fitted "
            f"levels of the {reference} only; bands: {a2['bootstrap']} bootstrap over seeds per rung, B = {a2['B']}. "
            f"The levels where at least one arm has {MIN_RUNGS} rungs reaching C (of {len(a2['levels'])} on the span):"
        ),
        "",
    ]
    rows = []
    for r in a2["levels"]:
        if all(r["arms"][a]["rungs"] < MIN_RUNGS for a in (reference, arm)):
            continue
        cells = []
        for a in (reference, arm):
            e = r["arms"][a]
            if e.get("L_opt") is None:
                cells += [e.get("note") or "n/a", ""]
            else:
                cells += [f"{e['N_opt']:.3g} {_interval(e['N_opt_ci95'], '.3g')}"]
                cells += [f"{e['L_opt']:.4f} {_interval(e['L_opt_ci95'], '.4f')}"]
        m = "n/a" if r["M"] is None else f"{r['M']:.3f}x {_interval(r['M_ci95'], '.3f')}"
        rows.append([f"{r['C']:.3g}", f"{r['arms'][reference]['rungs']} / {r['arms'][arm]['rungs']}", *cells, m])
    header = ["C (PFLOP/s-days)", f"rungs {reference} / {arm}", f"N_opt {reference} [95%]", f"L_opt {reference} [95%]"]
    return [*lines, *markdown_table([*header, f"N_opt {arm} [95%]", f"L_opt {arm} [95%]", "M(C) [95%]"], rows), ""]
