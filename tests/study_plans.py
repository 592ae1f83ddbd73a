"""What ``python -m sweeps.study`` plans for every study, as plain data: the sweep commands (one per pass), the
study's kind, name, seeds, results table and report directory, the analysis argv it runs, and the records it
reuses; the figures command's studies; and what scripts/regenerate_reports.py regenerates. tests/data/study_plans.json
holds this as the code planned it at c3a49b9, before the studies became data (sweeps/studies/*.yaml: the
Study(...) entries of sweeps/study.py's STUDIES, the REPORTS and NOT_REGENERABLE of scripts/regenerate_reports.py);
tests/test_study_files.py compares."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FROZEN = Path(__file__).resolve().parent / "data" / "study_plans.json"
REGENERATE = "python tests/study_plans.py"  # (re)writes FROZEN from the code as it plans now


def stale(what: str) -> str:
    """The failure message of a comparison with FROZEN: what differs, and how to rewrite the file after a deliberate
    change."""
    return (
        f"{what} differs from tests/data/study_plans.json; if the change is deliberate, rewrite that file with "
        f"`{REGENERATE}` (from the repository root, ~3 min) and review its diff"
    )


# (label, argv after the study's name): the default launch, and one with every option that changes the plan
VARIANTS = (
    ("default", ["--runs-root", "RUNS", "--reports-root", "REPORTS"]),
    ("options", ["--jobs", "1", "--seeds", "5,6", "--runs-root", "R2", "--reports-root", "P2", "logger=csv"]),
)
LR_VARIANT = ("arms_all", ["--arms", "all", "--rule", "trend", "--runs-root", "RUNS", "--reports-root", "REPORTS"])


def _plain(value: Any) -> Any:
    """JSON-ready, with this machine's python and repository replaced by placeholders."""
    text = json.dumps(value, default=str)
    text = text.replace(json.dumps(sys.executable)[1:-1], "<python>").replace(json.dumps(str(REPO))[1:-1], "<repo>")
    return json.loads(text)


def study_plan(name: str, argv: list[str]) -> dict[str, Any]:
    """The plan and the analysis argv of ``python -m sweeps.study <name> <argv>`` (nothing runs)."""
    from sweeps import study as s

    ap = s._parser()
    args: argparse.Namespace = ap.parse_intermixed_args([name, *argv])
    spec = s.STUDIES[name]
    plan = s.plan_study(spec, args, ap)
    assert plan is not None, name
    seen: list[list[str]] = []
    run_analysis = s.run_analysis
    s.run_analysis = lambda a: seen.append(a) or (1, None)  # type: ignore[assignment]
    try:
        s.analyse(spec, plan, args.rule, 0.0)
    finally:
        s.run_analysis = run_analysis  # type: ignore[assignment]
    return _plain(
        {
            "cmds": plan.cmds,
            "kind": plan.kind,
            "name": plan.name,
            "seeds": plan.seeds,
            "results": str(plan.results),
            "report": str(plan.report),
            "analysis": seen,
            "what": spec.what,
            "committed": spec.committed,
            "why": spec.why,
            "reuse": list(spec.reuse),
        }
    )


def all_plans() -> dict[str, Any]:
    """Every study under every variant (the lr studies also with ``--arms all``), the figures' studies, and the
    reports scripts/regenerate_reports.py regenerates (and those it cannot)."""
    from sweeps import study as s

    plans: dict[str, Any] = {}
    for name in sorted(s.STUDIES):
        variants = [*VARIANTS, LR_VARIANT] if s.STUDIES[name].tuned_config else VARIANTS
        plans[name] = {label: study_plan(name, argv) for label, argv in variants}
    regen = regenerate_reports()
    planned, not_regenerable = regen.planned_reports()
    reports = [
        {
            "out": r.out,
            "command": list(r.command),
            "studies": [[study, list(src)] for study, src in r.studies],
            "pinned": r.pinned,
            "in_place": r.in_place,
        }
        for r in planned
    ]
    figures = [[name, seeds, list(src)] for name, seeds, src in s.FIGURE_STUDIES]
    return _plain(
        {
            "studies": plans,
            "figures": figures,
            "reports": reports,
            "not_regenerable": not_regenerable,
            "default": s.DEFAULT_STUDY,
        }
    )


def regenerate_reports() -> Any:
    """scripts/regenerate_reports.py as a module."""
    if "regenerate_reports" in sys.modules:
        return sys.modules["regenerate_reports"]
    spec = importlib.util.spec_from_file_location("regenerate_reports", REPO / "scripts" / "regenerate_reports.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["regenerate_reports"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":  # python tests/study_plans.py: (re)writes tests/data/study_plans.json
    import contextlib
    import io

    sys.path.insert(0, str(REPO))
    with contextlib.redirect_stdout(io.StringIO()):  # the analysis command lines analyse() prints
        plans = all_plans()
    FROZEN.write_text(json.dumps(plans, indent=1, sort_keys=True) + "\n", encoding="utf-8")
