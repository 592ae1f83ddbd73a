"""The main job in one command: run a study's sweep, then the analysis, and print the headline.

    python -m sweeps.study            # the default study, deep: the deep CPU ladder's 30-minute slice
    python -m sweeps.study <study>    # any study below (--help lists them with what each measures)
    python -m sweeps.study figures    # every paper figure and table reachable on the CPU, beside ours: the gallery's
                                      # studies (committed runs restored, the rest trained), then reports/README.md
    python -m sweeps.study paper data=shards data.name=/data/shards +launcher=slurm hydra.launcher.partition=<p>
                                      # the paper's ladder (Table 2, Fig. 4) on a GPU cluster: one SLURM job per
                                      # run, then the fit and the headline as above (paper_lr: its lr tuning)
    python -m sweeps.study cpu --jobs 1 --seeds 0,1,2

A study is data: its sweep config (conf/sweep/<sweep>.yaml) and its study file (sweeps/studies/<name>.yaml, the
schema: sweeps/study_spec.py); this module is the command line, the planning and the running. Runs go to
``<runs-root>/<study>/`` (one directory per run plus ``results.csv``); the report (``fit.json``, ``summary.md``,
figures; for ``lr``: ``lr.json``, ``lr_summary.md``, ``fig_lr.png``) to ``<reports-root>/<study>/``. Re-running a
command skips completed runs and resumes interrupted ones, so an interrupted study is finished by running the same
command again.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from results.record import STUDY_KINDS
from sweeps.study_spec import FIGURES, Study, StudyFileError, studies

if TYPE_CHECKING:
    from omegaconf import DictConfig

REPO = Path(__file__).resolve().parent.parent
ARMS = {"default": None, "all": "baseline,full_attnres,block_attnres"}
DEFAULT_STUDY = "deep"
try:
    STUDIES: dict[str, Study] = studies()  # sweeps/studies/<name>.yaml
except StudyFileError as e:
    if __name__ != "__main__":
        raise
    print(f"[attnres] study file error: {e}", file=sys.stderr)
    raise SystemExit(2) from None

# `python -m sweeps.study figures`: the studies behind the gallery (analysis/render/gallery.py; a study file's
# `gallery`), in their ranks' order, each with its seeds and the committed record directories restored into its runs
# first (unless --fresh), then the map's and the paper's analyses and the gallery page.
FIGURE_STUDIES: tuple[tuple[str, str | None, tuple[str, ...]], ...] = tuple(
    (name, g.seeds, g.records)
    for name, g in sorted(
        ((n, s.gallery) for n, s in STUDIES.items() if s.gallery is not None), key=lambda item: item[1].rank
    )
)
FIGURE_MAP_RECORDS = "docs/results/cpu_map"  # the map costs ~55 core-hours: always its committed records
FIGURE_ARCH_GRID = "docs/results/cpu_arch_grid"  # Fig. 7's fixed-compute grid: a committed demonstration

TRAIN_COMMAND = (sys.executable, "-m", "experiments.train", "-m")
LAUNCHER_KEYS = ("launcher", "hydra/launcher")  # an override of one of them chooses the sweep's launcher


def sweep_command(sweep: str, seeds: str | None, jobs: int, runs_root: str, extra: list[str]) -> list[str]:
    """The multirun command; seeds=None keeps the sweep config's own seed list. ``jobs`` > 1 runs the jobs side by
    side on this machine (``+launcher=parallel``) unless ``extra`` chooses a launcher itself (``+launcher=slurm``)."""
    cmd = [*TRAIN_COMMAND, f"+sweep={sweep}", f"paths.runs_root={runs_root}", "trainer.enable_progress_bar=false"]
    if seeds is not None:
        cmd.insert(5, f"seed={seeds}")
    if jobs > 1 and not any(o.lstrip("+~").split("=", 1)[0] in LAUNCHER_KEYS for o in extra):
        cmd += ["+launcher=parallel", f"hydra.launcher.n_jobs={jobs}"]
    return cmd + extra


def sweep_config(sweep: str, overrides: Sequence[str] = ()) -> DictConfig:
    """conf/train.yaml with ``+sweep=<sweep>`` and ``overrides`` composed by Hydra's compose API, the ``hydra``
    node (with ``hydra.sweeper.params``) included and nothing resolved. Sweep overrides (``model=a,b``) choose
    runs, not the study's settings, and are left out: composition takes one value per key."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from experiments.config.compose import compose

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    single = [text for text, o in zip(overrides, parsed) if not o.is_sweep_override()]
    return compose([f"+sweep={sweep}", *single], return_hydra_config=True)


FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)  # passed on to the sweep by run_streaming


def run_streaming(cmd: list[str], log_path: Path) -> int:
    """Run a command, keep its full output in a log file and echo the lines a person wants to see.

    SIGTERM, SIGUSR1 and SIGUSR2 (SLURM's preemption and time-limit signal, docs/cluster.md) to this process are
    passed on to the command (which stops its runs cleanly) and its end is awaited; Ctrl-C reaches both anyway. The
    command watches this process (``ATTNRES_PARENT_PID``, experiments.run.interrupts.watch_parent): if this one is
    killed outright, the sweep stops its run in flight as interrupted instead of going on with nobody reading its
    output."""
    from experiments.run.interrupts import PARENT_ENV

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env={**os.environ, "PYTHONUNBUFFERED": "1", PARENT_ENV: str(os.getpid())},
        )
        assert proc.stdout is not None

        def forward(signum: int, frame: object) -> None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)

        previous = {num: signal.signal(num, forward) for num in FORWARDED_SIGNALS}
        try:
            for line in proc.stdout:
                log.write(line)
                if line.startswith("[attnres]") or (line.startswith("  ") and ("failed" in line or "diverged" in line)):
                    print(line.rstrip(), flush=True)
                elif "Error" in line and not line.startswith(" "):
                    print("   " + line.rstrip(), flush=True)
        except KeyboardInterrupt:  # Ctrl-C reached the whole group: let the runs checkpoint and record, then stop
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            log.write(proc.stdout.read())
            proc.wait()
            raise
        finally:
            for num, handler in previous.items():
                signal.signal(num, handler)
        return proc.wait()


def restore_records(source: Path, study_dir: Path) -> tuple[int, list[str]]:
    """Copy the valid record files of ``source`` (a directory of ``records/*.json``, or one holding ``records/``)
    that ``study_dir`` lacks into its ``records/``, then rebuild its results.csv: a relaunch of the study then skips
    the completed runs they hold (a completed record is found by config_hash). Returns (files copied, problems:
    unreadable or malformed files, which are reported and left out)."""
    import shutil

    from results.ledger import RECORDS_DIR, read_record_file, rebuild_table

    src = source / RECORDS_DIR if (source / RECORDS_DIR).is_dir() else source
    if not src.is_dir():
        raise FileNotFoundError(f"--from-records: {source} is not a directory of record files")
    target = study_dir / RECORDS_DIR
    target.mkdir(parents=True, exist_ok=True)
    copied, problems = 0, []
    for path in sorted(src.glob("*.json")):
        rec, problem = read_record_file(path)
        if problem is not None:
            problems.append(problem)
            continue
        if rec is not None and not (target / path.name).exists():
            shutil.copy2(path, target / path.name)
            copied += 1
    rebuild_table(study_dir)
    return copied, problems


# The paper's claim (its Table 2, the scaling ladder of conf/size/paper_*.yaml): 2 L_b = 24-34 sublayers, d_model
# 896-1264, ~200 tokens per parameter.
def analysis_arguments(args: Sequence[str]) -> list[str]:
    """A study's extra analysis arguments (``--option value`` pairs): a value with a ``/`` is a repository path,
    made absolute, and its pair is left out where the path does not exist (e.g. timing records not committed in this
    checkout); any other value (a number) is passed as it is."""
    out: list[str] = []
    for option, value in zip(args[::2], args[1::2]):
        if "/" not in value:
            out += [option, value]
        elif (path := REPO / value).exists():
            out += [option, str(path)]
    return out


def run_analysis(argv: list[str]) -> tuple[int, Any]:
    """``python -m analysis <argv>`` in this process (analysis.__main__.run: the same files and printout): its exit
    status and the document it built (None after an error)."""
    from analysis.__main__ import run

    try:
        return run(argv)
    except SystemExit as e:  # argparse refused the arguments (it has printed why)
        return (e.code if isinstance(e.code, int) else 2), None


def study_list(width: int = 118) -> str:
    """The studies for ``--help``: each name and its ``what``, wrapped under it."""
    lines = ["studies (sweeps/studies/<name>.yaml):"]
    for name, study in sorted(STUDIES.items()):
        default = " (the default)" if name == DEFAULT_STUDY else ""
        lines.append(f"  {name}{default}: sweep conf/sweep/{study.sweep}.yaml")
        lines += textwrap.wrap(study.what, width, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m sweeps.study",
        description=__doc__,
        epilog=study_list(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "study",
        nargs="?",
        default=DEFAULT_STUDY,
        choices=[*sorted(STUDIES), FIGURES],
        help=f"which study (default: {DEFAULT_STUDY}); {FIGURES}: every study behind the gallery of the paper's "
        "figures, then the gallery page",
    )
    ap.add_argument(
        "--fresh",
        action="store_true",
        help=f"restore no committed records first ({FIGURES}, and the studies that reuse committed runs, e.g. "
        "deep_recipe), so that every run trains (hours; the map always uses its committed records)",
    )
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: the sweep config's)")
    ap.add_argument(
        "--arms",
        default="default",
        choices=sorted(ARMS),
        help="lr study: 'default' tunes the baseline only (the paper's protocol), 'all' every arm",
    )
    ap.add_argument(
        "--rule",
        default=None,
        choices=["per_size", "trend"],
        help="lr study: the lr written per size, each curve's own optimum or the arm's power law over "
        "sizes (default: the study's own; trend for the ladder, which smooths single-size seed noise)",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="parallel single-thread jobs (default: 2, or 1 on a 1-core machine)",
    )
    ap.add_argument("--runs-root", default="runs", help="where run directories and results.csv go (default: runs)")
    ap.add_argument(
        "--from-records",
        metavar="DIR",
        help="first copy the run records committed under DIR (e.g. docs/results/cpu_map) into the runs root, so "
        "that the study skips the runs they hold as completed",
    )
    ap.add_argument("--reports-root", default="reports", help="where the report goes (default: reports)")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides passed to every run, e.g. logger=csv")
    return ap


@dataclass(frozen=True)
class Plan:
    """One study's launch, checked before anything runs: its sweep commands (one per pass), kind, name, seeds and
    where its results table and report go."""

    cmds: list[list[str]]
    kind: str
    name: str
    seeds: str
    results: Path
    report: Path
    wandb_project: str | None = None  # the W&B project its runs log to; None: the sweep logs no W&B


def plan_study(study: Study, args: argparse.Namespace, ap: argparse.ArgumentParser) -> Plan | None:
    """The study's Plan, or None after printing the config error (a bad override, kind or name) that would make
    the sweep fail."""
    from experiments.config.compose import cli_problem
    from experiments.config.validation import check_name

    extra = list(study.overrides)
    if ARMS[args.arms] is not None:
        extra.append(f"model={ARMS[args.arms]}")
    cmds = [
        sweep_command(study.sweep, args.seeds, args.jobs, args.runs_root, extra + list(p) + args.overrides)
        for p in study.passes
    ]
    for cmd in cmds:
        problem = cli_problem(["-m", f"+sweep={study.sweep}", *cmd[len(TRAIN_COMMAND) + 1 :]])
        if problem is not None:
            print(f"[attnres] config error: {problem}", file=sys.stderr)
            return None
    overrides = cmds[0][len(TRAIN_COMMAND) + 1 :]  # what the first pass sets beyond +sweep=<sweep>
    cfg = sweep_config(study.sweep, overrides)
    kind = str(cfg.study_kind)
    if kind not in STUDY_KINDS:
        print(f"[attnres] error: study_kind={kind!r}; allowed values: {', '.join(STUDY_KINDS)}", file=sys.stderr)
        return None
    if ARMS[args.arms] is not None and kind != "lr":
        ap.error("--arms applies to the lr study only")
    name = _sweep_key(study.sweep, "study", overrides, cfg)
    try:
        check_name("study", name)  # it names <runs-root>/<study> and <reports-root>/<study>
    except ValueError as e:
        print(f"[attnres] config error: {e}", file=sys.stderr)
        return None
    seeds = _sweep_key(study.sweep, "seed", overrides, cfg)
    results = Path(args.runs_root) / name / "results.csv"
    project = str(cfg.project) if "wandb" in (cfg.get("logger") or {}) else None
    return Plan(cmds, kind, name, seeds, results, Path(args.reports_root) / name, project)


def run_passes(plan: Plan) -> int:
    """Each pass's sweep, streamed to the report's sweep.log; stops at the first interrupted one. Returns the first
    non-zero exit status (an interruption's, as a shell reports it: 128 + signal)."""
    sweep_rc = 0
    for cmd in plan.cmds:
        print(f"[attnres] $ {' '.join(cmd[1:])}", flush=True)
        try:
            rc = run_streaming(cmd, plan.report / "sweep.log")
        except KeyboardInterrupt:
            rc = 130
        sweep_rc = sweep_rc or rc
        if rc > 128 or rc < 0:
            sweep_rc = rc
            break
    if sweep_rc > 128 or sweep_rc < 0:  # interrupted (SIGINT / SIGTERM / SIGUSR1 / SIGUSR2, or killed): runs in flight
        # saved a checkpoint (a kill -9 of the sweep itself leaves the last periodic one)
        print(
            f"[attnres] interrupted: runs in flight saved a checkpoint and were recorded as interrupted; re-run the "
            f"same command to resume (log: {plan.report / 'sweep.log'})",
            flush=True,
        )
        return sweep_rc if sweep_rc > 0 else 128 - sweep_rc  # killed by signal n: 128 + n, as a shell reports it
    return sweep_rc


def analysis_argv(
    study: Study,
    kind: str,
    results: str,
    out: str,
    rule: str | None = None,
    write_config: str | None = None,
    args: Sequence[str] = (),
) -> list[str]:
    """The ``python -m analysis`` argv that reports a study of ``kind`` from its ``results`` table into ``out``: the
    command registered for that study kind (analysis.studies.study_registry.for_kind: lr and the fixed-shape kinds)
    or else the study's ``analysis`` (scaling kinds), with ``args`` appended (the study's analysis arguments, as the
    caller resolves their paths; not to ``fit``'s); the lr analysis takes ``rule`` (else the study's own) and
    ``write_config`` (where the tuned lrs go). scripts/regenerate_reports.py rebuilds the committed reports by it."""
    command = analysis_command(study, kind)
    argv = [command, "--results", results, "--out", out]
    if kind == "lr":
        return argv + ["--rule", rule or study.lr_rule] + (["--write-config", write_config] if write_config else [])
    if command != study.analysis:
        return argv
    return argv + list(args if command != "fit" else ())


def analysis_command(study: Study, kind: str) -> str:
    """The analysis command that reports a study of ``kind``: the one registered for the kind, else the study's."""
    from analysis.studies.study_registry import for_kind

    registered = for_kind(kind)
    return registered.name if registered is not None else study.analysis


def study_runs(study: Study) -> tuple[str, str]:
    """(the study's name, its study_kind) as its sweep composes them with the study's own overrides (the first
    pass's): its runs go to ``<runs-root>/<name>``."""
    overrides = [*study.overrides, *study.passes[0]]
    cfg = sweep_config(study.sweep, overrides)
    return _sweep_key(study.sweep, "study", overrides, cfg), str(cfg.study_kind)


def analyse(study: Study, plan: Plan, rule: str | None, t0: float) -> int:
    """The study kind's analysis of the completed runs (``python -m analysis <command>``, run in this process), then
    its headline lines from the document it built. Returns the analysis' exit status."""
    report = plan.report
    tuned = str(REPO / study.tuned_config) if study.tuned_config else None
    argv = analysis_argv(
        study, plan.kind, str(plan.results), str(report), rule, tuned, analysis_arguments(study.analysis_args)
    )
    from analysis.render.study_headline import committed_lines, regime_sentence
    from analysis.studies.study_registry import get, headline_lines

    command = analysis_command(study, plan.kind)
    print(f"[attnres] $ -m analysis {' '.join(argv)}", flush=True)
    rc, document = run_analysis(argv)
    scaling = get(command).study_kind is None  # a scaling kind, reported by the study's own analysis
    if rc != 0 or (scaling and document is None):
        return rc
    print(f"[attnres] report: {report}/ ({get(command).files}); total {time.time() - t0:.0f} s")
    if plan.kind == "lr" and study.tuned_config:
        print(f"[attnres] tuned lrs written to {REPO / study.tuned_config}: the ladder's sizes read them from now on")
    lines: list[str] = []
    if scaling:
        lines = headline_lines(command, document)
        for line in lines:
            print(line)
        for line in committed_lines(REPO / study.committed, REPO) if study.committed else []:
            print(line)
        print(f"[attnres] {regime_sentence(plan.results, study.why)}")
    if plan.wandb_project is not None:
        from sweeps.study_summary import log_study_summary

        where = log_study_summary(report, plan.wandb_project, plan.name, lines)
        if where is not None:
            print(f"[attnres] the report as one W&B run ({plan.name}/summary, group {plan.name}): {where}")
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_intermixed_args(argv)  # options may come between the study and its overrides
    if args.study == FIGURES:
        return run_figures(args.jobs, Path(args.runs_root), Path(args.reports_root), args.fresh)
    study = STUDIES[args.study]
    plan = plan_study(study, args, ap)
    if plan is None:
        return 2
    t0 = time.time()
    for src in () if args.fresh else study.reuse:
        if (REPO / src).is_dir():
            copied, problems = restore_records(REPO / src, plan.results.parent)
            for problem in problems:
                print(f"[attnres] warning: {problem}", file=sys.stderr)
            print(f"[attnres] reused {copied} committed record(s) from {src} (by config_hash)", flush=True)
    if args.from_records:
        try:
            copied, problems = restore_records(Path(args.from_records), plan.results.parent)
        except FileNotFoundError as e:
            print(f"[attnres] error: {e}", file=sys.stderr)
            return 2
        for problem in problems:
            print(f"[attnres] warning: {problem}", file=sys.stderr)
        print(f"[attnres] restored {copied} record(s) from {args.from_records} into {plan.results.parent}", flush=True)
    launcher = next((o for o in args.overrides if o.lstrip("+~").split("=", 1)[0] in LAUNCHER_KEYS), None)
    jobs = f"jobs through {launcher}" if launcher else f"{args.jobs} parallel job(s)"
    print(f"[attnres] {study.what}; seeds {plan.seeds}; {jobs}", flush=True)
    sweep_rc = run_passes(plan)
    if sweep_rc > 128:
        return sweep_rc
    print(
        f"[attnres] sweep done in {time.time() - t0:.0f} s (exit {sweep_rc}); full log: {plan.report / 'sweep.log'}",
        flush=True,
    )
    if not plan.results.is_file():
        print(f"[attnres] no results table at {plan.results}: nothing to analyse", file=sys.stderr)
        return sweep_rc or 1
    analysis_rc = analyse(study, plan, args.rule, t0)  # failed runs are recorded as failed and never fitted
    return sweep_rc or analysis_rc


def run_figures(jobs: int, runs_root: Path, reports_root: Path, fresh: bool) -> int:
    """The gallery from one command: every study behind it (completed runs are skipped; with ``fresh`` nothing
    committed is restored first, so every run trains), the map's and the paper's analyses, then
    ``<reports_root>/README.md``. Returns the first non-zero exit status, else 0."""
    from analysis.render.gallery import GallerySources, gallery_entries, write_gallery

    t0, rc = time.time(), 0
    for name, seeds, committed in FIGURE_STUDIES:
        study_name = _sweep_key(STUDIES[name].sweep, "study", STUDIES[name].overrides)
        for src in () if fresh else committed:
            if (REPO / src).is_dir():
                copied, problems = restore_records(REPO / src, runs_root / study_name)
                for problem in problems:
                    print(f"[attnres] warning: {problem}", file=sys.stderr)
                print(f"[attnres] restored {copied} record(s) from {src} into {runs_root / study_name}", flush=True)
        argv = [name, "--jobs", str(jobs), "--runs-root", str(runs_root), "--reports-root", str(reports_root)]
        study_rc = main(argv + (["--seeds", seeds] if seeds else []))
        if study_rc > 128:  # interrupted: stop here, as a single study does
            return study_rc
        rc = rc or study_rc
    restore_records(REPO / FIGURE_MAP_RECORDS, runs_root / "cpu_map")
    for argv in (
        ["map", "--results", str(runs_root / "cpu_map"), "--out", str(reports_root / "cpu_map")],
        ["paper", "--out", str(reports_root / "paper_refit")],
    ):
        print(f"[attnres] $ python -m analysis {' '.join(argv)}", flush=True)
        rc = rc or run_analysis(argv)[0]
    sources = GallerySources.from_studies(reports_root, runs_root, REPO / FIGURE_ARCH_GRID)
    page = write_gallery(gallery_entries(sources), reports_root / "README.md")
    print(f"[attnres] gallery: {page} (the committed one: docs/results/README.md); total {time.time() - t0:.0f} s")
    return rc


def _sweep_key(sweep: str, key: str, overrides: Sequence[str] = (), cfg: DictConfig | None = None) -> str:
    """The value a multirun of conf/sweep/<sweep>.yaml gives ``key`` (e.g. ``study``, or ``seed``: "0,1,2"), as
    text: the last override of it, else the sweep's swept parameter (hydra.sweeper.params), else the composed
    config's value (``cfg``: :func:`sweep_config` of the same sweep and overrides, composed when not given)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    for text, o in reversed(list(zip(overrides, parsed))):
        if o.get_key_element() == key:
            return text.split("=", 1)[1]
    cfg = cfg if cfg is not None else sweep_config(sweep, overrides)
    params = cfg.hydra.sweeper.get("params") or {}
    if key in params:
        return str(params[key])
    if key in cfg and key != "hydra":
        return str(cfg[key])
    raise ValueError(f"conf/sweep/{sweep}.yaml sets no {key}")


if __name__ == "__main__":
    raise SystemExit(main())
