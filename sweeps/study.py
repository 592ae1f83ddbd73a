"""The main job in one command: run a study's sweep, then the analysis, and print the headline.

    python -m sweeps.study            # the CPU ladder: 3 arms x 4 sizes x 3 seeds on the embedded data, then the fit
    python -m sweeps.study cpu5       # the same study with its fifth rung (cpu_xl) added
    python -m sweeps.study quick      # first contact: 3 arms x 3 small sizes, 1 seed, short budgets
    python -m sweeps.study per_arm    # Full and Block AttnRes at their own tuned lr, into the CPU ladder's table:
                                      # the fit then reports the multiplier under both lr protocols
    python -m sweeps.study lr         # LR tuning of the CPU ladder (baseline; --arms all: every arm), then
                                      # `python -m analysis lr`, which writes conf/tuned_lr/cpu.yaml (the sizes read it)
    python -m sweeps.study arch       # Fig. 7 on the CPU: baseline / Block AttnRes x a 3 x 3 shape grid at
                                      # fixed compute
    python -m sweeps.study cpu --jobs 1 --seeds 0,1,2

Runs go to ``<runs-root>/<study>/`` (one directory per run plus ``results.csv``); the report (``fit.json``,
``summary.md``, figures; for ``lr``: ``lr.json``, ``lr_summary.md``, ``fig_lr.png``) to ``<reports-root>/<study>/``.
Re-running a command skips completed runs and resumes interrupted ones, so an interrupted study is finished by
running the same command again.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.schema import STUDY_KINDS, FitDocument

if TYPE_CHECKING:
    from omegaconf import DictConfig

REPO = Path(__file__).resolve().parent.parent
ARMS = {"default": None, "all": "baseline,full_attnres,block_attnres"}


@dataclass(frozen=True)
class Study:
    """A named study: its sweep config (whose ``study_kind`` chooses the analysis: ``lr`` runs
    ``python -m analysis lr``, every other kind ``python -m analysis fit``) and what it adds to the sweep."""

    sweep: str  # conf/sweep/<sweep>.yaml
    what: str
    overrides: tuple[str, ...] = ()  # appended to the sweep (before the user's own)
    tuned_config: str | None = None  # study_kind lr: where the tuned lrs are written (relative to the repository)
    notes: tuple[str, ...] = field(default_factory=tuple)


STUDIES = {
    "cpu": Study(
        "cpu_ladder",
        "CPU ladder: baseline / Full / Block AttnRes x cpu_xs..cpu_l, every arm at the baseline's tuned lr",
    ),
    "cpu5": Study(
        "cpu_ladder",
        "CPU ladder with its fifth rung: baseline / Full / Block AttnRes x cpu_xs..cpu_xl",
        overrides=("size=cpu_xs,cpu_s,cpu_m,cpu_l,cpu_xl",),
    ),
    "quick": Study("quick", "quick look: baseline / Full / Block AttnRes x 3 small sizes, short budgets"),
    "per_arm": Study(
        "cpu_ladder",
        "CPU ladder, Full and Block AttnRes at their own tuned lr (lr_protocol=per_arm)",
        overrides=("lr_protocol=per_arm", "model=full_attnres,block_attnres"),
    ),
    "lr": Study(
        "cpu_lr", "LR tuning of the CPU ladder (a log-spaced lr grid per size)", tuned_config="conf/tuned_lr/cpu.yaml"
    ),
    "arch": Study(
        "cpu_arch_grid", "architecture grid (Fig. 7): baseline / Block AttnRes x 3 d/L_b x 3 H/L_b at fixed compute"
    ),
}


TRAIN_COMMAND = (sys.executable, "-m", "experiments.train", "-m")


def sweep_command(sweep: str, seeds: str | None, jobs: int, runs_root: str, extra: list[str]) -> list[str]:
    """The multirun command; seeds=None keeps the sweep config's own seed list."""
    cmd = [*TRAIN_COMMAND, f"+sweep={sweep}", f"paths.runs_root={runs_root}", "trainer.enable_progress_bar=false"]
    if seeds is not None:
        cmd.insert(5, f"seed={seeds}")
    if jobs > 1:
        cmd += ["+launcher=parallel", f"hydra.launcher.n_jobs={jobs}"]
    return cmd + extra


def sweep_config(sweep: str, overrides: Sequence[str] = ()) -> DictConfig:
    """conf/train.yaml with ``+sweep=<sweep>`` and ``overrides`` composed by Hydra's compose API, the ``hydra``
    node (with ``hydra.sweeper.params``) included and nothing resolved. Sweep overrides (``model=a,b``) choose
    runs, not the study's settings, and are left out: composition takes one value per key."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from experiments.compose import compose

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    single = [text for text, o in zip(overrides, parsed) if not o.is_sweep_override()]
    return compose([f"+sweep={sweep}", *single], return_hydra_config=True)


def run_streaming(cmd: list[str], log_path: Path) -> int:
    """Run a command, keep its full output in a log file and echo the lines a person wants to see.

    SIGTERM and SIGUSR1 to this process are passed on to the command (which stops its runs cleanly) and its end is
    awaited; Ctrl-C reaches both anyway. The command watches this process (``ATTNRES_PARENT_PID``,
    experiments.interrupts.watch_parent): if this one is killed outright, the sweep stops its run in flight as
    interrupted instead of going on with nobody reading its output."""
    from experiments.interrupts import PARENT_ENV

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

        previous = {num: signal.signal(num, forward) for num in (signal.SIGTERM, signal.SIGUSR1)}
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


def headline(fit_path: Path) -> list[str]:
    """One line per variant: the compute multiplier vs the baseline with its 95% interval."""
    fit = FitDocument.from_json(fit_path)
    lines = []
    for name, b in (fit.arch_grid.best if fit.arch_grid else {}).items():
        lines.append(
            f"  {name}: best val loss {b.val_loss:.4f} at d/L_b = {b.d_over_lb:g}, H/L_b = {b.heads_over_lb:g}"
            f" (the grid: fig7_arch_grid.md)"
        )
    for name, m in fit.multipliers.items():
        if m.m is None:
            continue
        lo, hi = m.m_ci95 or (float("nan"), float("nan"))
        lines.append(
            f"  {name}: compute multiplier m = {m.m:.3f}x (95% CI {lo:.3f}-{hi:.3f}), "
            f"P(m <= 1) = {m.p_m_le_1:.3f}"
            + (f", paper-form M at largest C = {m.paper_M:.3f}x" if m.paper_M is not None else "")
        )
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m sweeps.study", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("study", nargs="?", default="cpu", choices=sorted(STUDIES), help="which study (default: cpu)")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: the sweep config's)")
    ap.add_argument(
        "--arms",
        default="default",
        choices=sorted(ARMS),
        help="lr study: 'default' tunes the baseline only (the paper's protocol), 'all' every arm",
    )
    ap.add_argument(
        "--rule",
        default="trend",
        choices=["per_size", "trend"],
        help="lr study: the lr written per size, each curve's own optimum or the arm's power law over "
        "sizes (default: trend, which smooths single-size seed noise)",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="parallel single-thread jobs (default: 2, or 1 on a 1-core machine)",
    )
    ap.add_argument("--runs-root", default="runs", help="where run directories and results.csv go (default: runs)")
    ap.add_argument("--reports-root", default="reports", help="where the report goes (default: reports)")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides passed to every run, e.g. logger=csv")
    args = ap.parse_intermixed_args(argv)  # options may come between the study and its overrides

    study = STUDIES[args.study]
    extra = list(study.overrides)
    if ARMS[args.arms] is not None:
        extra.append(f"model={ARMS[args.arms]}")
    cmd = sweep_command(study.sweep, args.seeds, args.jobs, args.runs_root, extra + args.overrides)
    overrides = cmd[len(TRAIN_COMMAND) + 1 :]  # what the sweep command sets beyond +sweep=<sweep>
    from experiments.compose import cli_problem
    from experiments.validation import check_name

    problem = cli_problem(["-m", f"+sweep={study.sweep}", *overrides])  # a bad override: the sweep would fail
    if problem is not None:
        print(f"[attnres] config error: {problem}", file=sys.stderr)
        return 2
    cfg = sweep_config(study.sweep, overrides)
    kind = str(cfg.study_kind)
    if kind not in STUDY_KINDS:
        print(f"[attnres] error: study_kind={kind!r}; allowed values: {', '.join(STUDY_KINDS)}", file=sys.stderr)
        return 2
    if ARMS[args.arms] is not None and kind != "lr":
        ap.error("--arms applies to the lr study only")
    study_name = _sweep_key(study.sweep, "study", overrides, cfg)
    try:
        check_name("study", study_name)  # it names <runs-root>/<study> and <reports-root>/<study>
    except ValueError as e:
        print(f"[attnres] config error: {e}", file=sys.stderr)
        return 2
    seeds = _sweep_key(study.sweep, "seed", overrides, cfg)
    results = Path(args.runs_root) / study_name / "results.csv"
    report = Path(args.reports_root) / study_name
    t0 = time.time()
    print(
        f"[attnres] {study.what}; seeds {seeds}; {args.jobs} parallel job(s)\n[attnres] $ {' '.join(cmd[1:])}",
        flush=True,
    )
    try:
        sweep_rc = run_streaming(cmd, report / "sweep.log")
    except KeyboardInterrupt:
        sweep_rc = 130
    if sweep_rc > 128 or sweep_rc < 0:  # interrupted (SIGINT / SIGTERM / SIGUSR1, or killed): runs in flight
        # saved a checkpoint (a kill -9 of the sweep itself leaves the last periodic one)
        print(
            f"[attnres] interrupted: runs in flight saved a checkpoint and were recorded as interrupted; re-run the "
            f"same command to resume (log: {report / 'sweep.log'})",
            flush=True,
        )
        return sweep_rc if sweep_rc > 0 else 128 - sweep_rc  # killed by signal n: 128 + n, as a shell reports it
    print(
        f"[attnres] sweep done in {time.time() - t0:.0f} s (exit {sweep_rc}); full log: {report / 'sweep.log'}",
        flush=True,
    )
    if not results.is_file():
        print(f"[attnres] no results table at {results}: nothing to analyse", file=sys.stderr)
        return sweep_rc or 1
    if kind == "lr":
        tuned = REPO / study.tuned_config if study.tuned_config else None
        fit_cmd = [
            sys.executable,
            "-m",
            "analysis",
            "lr",
            "--results",
            str(results),
            "--out",
            str(report),
            "--rule",
            args.rule,
        ]
        if tuned is not None:
            fit_cmd += ["--write-config", str(tuned)]
        print(f"[attnres] $ {' '.join(fit_cmd[1:])}", flush=True)
        fit_rc = subprocess.call(fit_cmd)
        if fit_rc == 0:
            print(f"[attnres] report: {report}/ (lr_summary.md, lr.json, fig_lr.png); total {time.time() - t0:.0f} s")
            if tuned is not None:
                print(f"[attnres] tuned lrs written to {tuned}: the ladder's sizes read them from now on")
        return sweep_rc or fit_rc
    fit_cmd = [sys.executable, "-m", "analysis", "fit", "--results", str(results), "--out", str(report)]
    print(f"[attnres] $ {' '.join(fit_cmd[1:])}", flush=True)
    fit_rc = subprocess.call(fit_cmd)
    if fit_rc == 0 and (report / "fit.json").is_file():
        print(f"[attnres] report: {report}/ (summary.md, fit.json, figures); total {time.time() - t0:.0f} s")
        for line in headline(report / "fit.json"):
            print(line)
    return sweep_rc or fit_rc


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
