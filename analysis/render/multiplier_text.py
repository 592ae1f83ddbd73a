"""The text of the multiplier reports: Markdown sections and headline lines, built from the numbers analysis.laws
returns (fit.json and length.json entries), never from runs: the rung test and per-rung multipliers
(analysis.laws.heterogeneity), the per-(rung, budget) token multipliers (analysis.laws.cell_multiplier), the rollout
(analysis.laws.rollout), the sensitivity to the asymptote E (analysis.laws.asymptote), the fit over parameters and
tokens (analysis.laws.nd_fit) and the wall-clock multiplier line.
"""

from __future__ import annotations

import math
from typing import Any

from ..laws.heterogeneity import fit_loss_text, rung_time_ratios
from .tables import markdown_table

# ---- the rung test: one multiplier per rung, and the test of one over all (analysis.laws.heterogeneity) --------------


def _ci(c: list[float] | None) -> str:
    if c and all(x is not None and math.isfinite(x) for x in c):
        return f"[{c[0]:.3f}, {c[1]:.3f}]"
    return "[n/a]"


def _m_ci(m: float, c: list[float] | None) -> str:
    return f"{m:.3f}× {_ci(c)}"


def _time_at(size: str, ratios: dict[str, float]) -> float | None:
    """The time ratio of a size (a rung, or a (rung, budget) point named ``<rung>@<budget>``)."""
    return ratios.get(size, ratios.get(str(size).split("@")[0]))


def rung_headline(mult: dict[str, Any], arm: str, timing: dict[str, Any] | None = None) -> list[str]:
    """The lines a report prints about one arm's multiplier: the pooled m with its loss, and where the rung test
    rejects one multiplier over the rungs, m(C) at the measured C, each beside its wall-clock version m_s · t_s where
    the rung's time ratio is known (``mult["rung_time"]`` or ``timing``, a wall-clock entry); then the least-squares
    m where it disagrees with the Huber one."""
    test = mult.get("rung_test") or {}
    delta = (mult.get("joint") or {}).get("huber_delta")
    loss = fit_loss_text(delta) if delta is not None else "its fit loss"
    ratios = mult.get("rung_time") or rung_time_ratios(timing)
    pooled = _m_ci(mult["m"], mult["m_ci95"])
    if test.get("one_multiplier") is False:
        slope = test.get("slope")
        trend = "" if slope is None else f"; d ln m / d ln C = {slope:+.3f} {_ci(test['slope_ci95'])}"
        pts = []
        for r in test["m_of_C"]:
            t = _time_at(r["size"], ratios)
            wall = f" (m_wall {r['m'] * t:.3f}×)" if t is not None else ""
            pts.append(f"{r['size']} (C = {r['C']:.3g}): {_m_ci(r['m'], r['m_ci95'])}{wall}")
        line = (
            f"{arm}: one multiplier does not describe these rungs (p = {test['p']:.2g}, Q = {test['Q']:.1f}, "
            f"{test.get('reference', 'chi2')}): m(C) at the measured C: {', '.join(pts)}{trend}. The pooled m = "
            f"{pooled} ({loss}) averages rungs that disagree."
        )
    else:
        p = "n/a" if test.get("p") is None else f"{test['p']:.2g}"
        line = f"{arm}: pooled m = {pooled} ({loss}); one multiplier over the rungs: p = {p}"
    lsq = mult.get("least_squares")
    if not (lsq and mult.get("loss_disagreement")):
        return [line]
    matters = (
        f"{arm}: the fit's loss matters: {lsq['loss']} gives m = {_m_ci(lsq['m'], lsq['m_ci95'])} against {pooled}"
    )
    return [line, f"{matters} ({loss}), each outside the other's interval"]


def rung_markdown(
    multipliers: dict[str, dict[str, Any]], timings: dict[str, dict[str, Any]] | None = None
) -> list[str]:
    """summary.md's section: per arm, the per-size m_s under both losses with intervals, the rung test, and where
    each rung's time ratio t_s is known (the part's ``rung_time``, or ``timings[arm]``, a wall-clock entry) the
    wall-clock m_s · t_s beside each."""
    lines: list[str] = []
    for arm, mm in multipliers.items():
        test = mm.get("rung_test")
        if not test:
            continue
        lsq = mm.get("least_squares") or {}
        ratios = mm.get("rung_time") or rung_time_ratios((timings or {}).get(arm))
        lines += [f"### {arm}: one multiplier per rung, and the test of one over all", ""]
        lines += [f"- {line}" for line in rung_headline(mm, arm, (timings or {}).get(arm))]
        huber_text, lsq_text = fit_loss_text(mm["joint"]["huber_delta"]), lsq.get("loss", "least squares")
        wall = ["t_s", "m_s · t_s"] if ratios else []
        header = ["size", "C", f"m_s, {huber_text} [95%]", f"m_s, {lsq_text} [95%]", *wall]
        rows = []
        for r in test["m_of_C"]:
            other = (lsq.get("per_size") or {}).get(r["size"])
            row = [f"{r['size']}", f"{r['C']:.3g}", _m_ci(r["m"], r["m_ci95"])]
            row.append(_m_ci(other["m"], other["m_ci95"]) if other else "n/a")
            if ratios:
                t = _time_at(r["size"], ratios)
                row += [f"{t:.3f}", f"{r['m'] * t:.3f}×"] if t is not None else ["n/a", "n/a"]
            rows.append(row)
        lines += ["", *markdown_table(header, rows)]
        if lsq:
            pooled = f"| pooled m | | {_m_ci(mm['m'], mm['m_ci95'])} | {_m_ci(lsq['m'], lsq['m_ci95'])} |"
            lines.append(pooled + (" | |" if ratios else ""))
        if ratios:
            note = (
                "t_s = s_ref / s_arm (seconds per FLOP) at that rung (analysis.laws.wallclock); m_s · t_s is the "
                "rung's wall-clock multiplier, a point value (m_s's interval only)."
            )
            lines += ["", note]
        lines.append("")
    return lines


# ---- per-cell token multipliers (analysis.laws.cell_multiplier) ------------------------------------------------------


def m_text(e: dict[str, Any], m_key: str = "m", ci_key: str = "m_ci95") -> str:
    """``1.234x [1.100, 1.400]`` from an entry's m and interval; an end beyond the extrapolation limits as
    ``>cap`` / ``<floor``; a None m by its note (">10x", "<0.1x"), else "n/a"."""
    m, ci, note = e.get(m_key), e.get(ci_key), e.get("note")
    head = f"{m:.3f}x" if m is not None else (note if note in (">10x", "<0.1x") else "n/a")
    if ci is None:
        return head
    beyond = e.get("m_ci95_beyond") if ci_key == "m_ci95" else [x is None for x in ci]
    texts = []
    for end, out in zip(ci, beyond or [False, False]):
        if not out:
            texts.append(f"{end:.3f}")
        elif end is None:
            texts.append("n/a")
        else:
            texts.append(f"<{end:.3g}" if end < 1 else f">{end:.3g}")
    return f"{head} [{texts[0]}, {texts[1]}]"


def cell_markdown(cells: list[dict[str, Any]], arm: str, reference: str) -> list[str]:
    """length_summary.md's section: per cell Delta with its interval, m with its interval and D* / D_max, the
    step-time ratio and m_wall, and approach 3's m where present."""
    if not cells:
        return []
    a3 = any("approach3" in c for c in cells)
    what = (
        f"m = D*/D: the tokens the {reference} needs at the rung's N to reach {arm}'s loss, over the cell's D, read"
        f" off the {reference}'s own law at that rung, L = E_r + B_r D^-beta_r (least squares over its budgets and "
        "seeds), through its measured loss at the cell: L_ref(D*) - L_ref(D) = Δ. So Δ < 0 gives m > 1 and Δ > 0 "
        "gives m < 1, and m's 95% interval excludes 1 exactly where Δ's excludes 0 (Δ from its t distribution, the"
        " law from a bootstrap over seeds). D*/D_max: how far D* lies past the rung's largest measured budget "
        "(above 1: the law extrapolated); beyond 10x m is not measured (>10x). m_wall = m / r, r the cell's step-"
        "time ratio (arm / reference, steady-state step_cpu_s, geometric mean over its seed pairs)."
    )
    if a3:
        what += f" Approach 3: the same m read off the {reference}'s L(N, D) law of the frontier below, as a check."
    header = ["rung", "tokens / param", "Δ [95%]", "law at the rung", "m [95%]", "D*/D_max", "r", "m_wall [95%]"]
    rows = []
    for c in cells:
        law = c.get("law") or {}
        law_text = "n/a" if "error" in law else f"{law['E']:.3f} + {law['B']:.3g}/D^{law['beta']:.3f}"
        x, r, ci = c.get("d_star_over_d_max"), c.get("step_time_ratio"), c["delta_ci95"]
        delta = f"{c['delta']:+.4f} " + (f"[{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "[n/a]")
        row = [f"{c['size']}", f"{c['tokens_per_param']:g}", delta, law_text, m_text(c)]
        row += ["n/a" if x is None else f"{x:.2f}", "n/a" if r is None else f"{r:.3f}"]
        row.append(m_text(c, "m_wall", "m_wall_ci95") if c["m_wall"] is not None else "n/a")
        if a3:
            row.append(m_text(c["approach3"]) if c.get("approach3") else "n/a")
        rows.append(row)
    lines = [f"## {reference}'s tokens to reach {arm}'s loss, per rung and budget", "", what, ""]
    lines += markdown_table(header + (["m, approach 3 [95%]"] if a3 else []), rows)
    notes = sorted({c["note"] for c in cells if c.get("note") and c["note"] not in (">10x", "<0.1x")})
    return [*lines, "", *(f"* not measured: {n}" for n in notes), *([""] if notes else [])]


# ---- rollout (analysis.laws.rollout), E sensitivity (analysis.laws.asymptote), N-D fit (analysis.laws.nd_fit) --------


def _f(x: float | None, spec: str) -> str:
    return "n/a" if x is None or x != x else format(x, spec)


def _with_ci(x: str, ci: list[float] | None, spec: str) -> str:
    return x + (f" [{ci[0]:{spec}}, {ci[1]:{spec}}]" if ci else "")


def rollout_markdown(ro: dict[str, Any], base: str) -> list[str]:
    """summary.md's rollout section."""
    rows = []
    for v, e in ro["variants"].items():
        for p in e["points"]:
            pi = p["prediction_interval95"]
            pi_text = f"{pi[0]:.4f}-{pi[1]:.4f}" if pi else "n/a"
            measured, inside = f"{p['measured']:.4f} ({p['n_runs']})", "yes" if p["inside"] else "**no**"
            rows.append([v, f"{p['size']}", f"{p['arm']}", f"{p['predicted']:.4f}", pi_text, measured, inside])
    header = ["pair", "rung", "arm", "predicted", "95% prediction interval", "measured (runs)", "inside"]
    lines = [
        f"## Rollout: fitted on {', '.join(ro['fitted_sizes'])}, predicting {', '.join(ro['held_out'])}",
        "",
        (
            "Each variant's joint fit with the baseline, without the held-out rung(s); the prediction interval is the "
            "fit's bootstrap widened by the fitted cell means' rms log residual (docs/analysis.md, Rollout)."
        ),
        "",
        *markdown_table(header, rows),
        "",
    ]
    rows = []
    for v, e in ro["variants"].items():
        for dl in e["delta"]:
            predicted = _with_ci(f"{dl['predicted']:+.4f}", dl["predicted_ci95"], "+.4f")
            fitted = _with_ci(f"{e['m']:.3f}", e.get("m_ci95"), ".3f")
            full = _with_ci(_f(e.get("measured_m"), ".3f"), e.get("measured_m_ci95"), ".3f")
            measured = f"{_f(dl['measured'], '+.4f')} ({dl['n_pairs']})"
            m_s = _f((e.get("measured_m_s") or {}).get(dl["size"]), ".3f")
            rows.append([v, f"{dl['size']}", predicted, measured, fitted, full, m_s])
    header = ["variant", "rung", f"predicted Δ vs {base} [95%]", "measured Δ (pairs)", "m fitted [95%]"]
    return [*lines, *markdown_table([*header, "m full ladder [95%]", "m_s at the rung"], rows), ""]


def e_sensitivity_markdown(es: dict[str, Any], base: str) -> list[str]:
    """summary.md's section: one table per variant."""
    lines = [f"## Sensitivity of the multiplier to the asymptote E (joint fit with {base}, Huber on log-loss)", ""]
    for v, e in es["variants"].items():
        lo, hi = e["m_range"]
        lines += [f"**{v}**: m from {lo:.3f} to {hi:.3f} over these E (lowest observed loss {e['L_min']:.4f}).", ""]
        rows = []
        for r in e["rows"]:
            note = " (at a bound)" if r.get("at_bound") else (" (fell back to E = 0)" if r.get("fallback") else "")
            cells = [f"{r['E_mode']}{note}", f"{r['E']:.4f}", f"{r['E_over_min_L']:.3f}", f"{r['alpha']:.4f}"]
            rows.append([*cells, f"{r['m']:.3f}", f"{r['objective']:.3e}", f"{r['objective_excess']:.2e}"])
        header = ["E", "value", "E / min L", "alpha", "m", "Huber objective", "excess over best"]
        lines += [*markdown_table(header, rows), ""]
    return lines


def nd_markdown(nd: dict[str, Any]) -> list[str]:
    """summary.md's section: one row per arm."""
    lines = [
        f"## Fit over parameters and tokens: {nd['model']} (N = {nd['N']}, D = {nd['D']})",
        "",
        f"{nd['loss']}; {nd['E_bound']}; 95% bootstrap intervals.",
        "",
        *markdown_table(["arm", "runs", "E", "A", "alpha", "B", "beta", "rmse(log L)"], []),
    ]
    for arm, e in nd["arms"].items():
        if e.get("error"):
            lines.append(f"| {arm} | {e.get('n_runs', 0)} | {e['error']} | | | | | |")
            continue
        terms = (("E", ".3f"), ("A", ".3g"), ("alpha", ".3f"), ("B", ".3g"), ("beta", ".3f"))
        cells = " | ".join(_cell(e, k, spec) for k, spec in terms)
        lines.append(f"| {arm} | {e['n_runs']} | {cells} | {e['rmse_log']:.4f} |")
    return [*lines, ""]


def _cell(e: dict[str, Any], k: str, spec: str) -> str:
    lo, hi = e[f"{k}_ci95"]
    return f"{e[k]:{spec}} [{lo:{spec}}, {hi:{spec}}]"


def wallclock_line(name: str, entry: dict[str, Any]) -> str:
    """One line: the compute multiplier, the time ratio and the wall-clock multiplier of one arm (an entry of
    :func:`ladder_wallclock`); what the headlines of ``python -m analysis fit`` and ``python -m sweeps.study`` print."""

    def ci(c: list[float] | None) -> str:
        return f" (95% CI {c[0]:.3f}-{c[1]:.3f})" if c else ""

    if entry.get("m_wall") is None:
        why = entry.get("error") or "no compute multiplier"
        return f"  {name}: wall-clock multiplier n/a ({why})"
    source = "step_cpu_s" if str(entry.get("time_source", "")).startswith("step_cpu_s") else "cpu_time_s"
    return (
        f"  {name}: wall-clock multiplier m_wall = {entry['m_wall']:.3f}x{ci(entry.get('m_wall_ci95'))} "
        f"= compute m {entry['m']:.3f}x x time ratio s_ref/s_arm {entry['s_ref_over_s_arm']:.3f}"
        f"{ci(entry.get('s_ref_over_s_arm_ci95'))}; step-time ratio {entry['step_time_ratio']:.3f} (from {source})"
    )
