"""Multirun sweeps end to end: records, skip on re-run, failures recorded without stopping the others,
the joblib launcher, and the SLURM launcher config."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run_train(tmp_path: Path, *overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "experiments.train",
        "-m",
        "experiment=smoke",
        "logger=none",
        "threads=1",
        f"paths.runs_root={tmp_path / 'runs'}",
        f"paths.hydra_root={tmp_path / 'outputs'}",
        "trainer.enable_progress_bar=false",
        *overrides,
    ]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def rows(tmp_path: Path, study: str = "smoke") -> list[dict[str, str]]:
    with open(tmp_path / "runs" / study / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def summary_line(out: str) -> str:
    lines = [line for line in out.splitlines() if "sweep finished" in line]
    assert lines, out[-3000:]
    return lines[-1]


@pytest.mark.slow
def test_basic_multirun_records_then_skips_then_survives_a_failure(tmp_path):
    sweep = ("model=baseline,block_attnres", "seed=0,1")
    first = run_train(tmp_path, *sweep)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "4 runs: 4 completed, 0 skipped, 0 failed, 0 diverged" in summary_line(first.stdout)
    table = rows(tmp_path)
    assert len(table) == 4
    assert {r["status"] for r in table} == {"completed"}
    assert {(r["variant"], r["seed"]) for r in table} == {(v, s) for v in ("baseline", "block_attnres") for s in "01"}
    assert all(float(r["val_loss"]) > 0 for r in table)

    again = run_train(tmp_path, *sweep)  # same configs: every run is found completed by config hash
    assert again.returncode == 0, again.stderr[-3000:]
    assert "4 runs: 0 completed, 4 skipped, 0 failed, 0 diverged" in summary_line(again.stdout)
    assert len(rows(tmp_path)) == 4  # nothing appended, nothing trained

    # One config is invalid (Block with more blocks than sublayers), two diverge (NaN injected), and one seed-6 run
    # fails during training:
    mixed = run_train(
        tmp_path, "model=baseline,block_attnres,full_attnres", "seed=5", "model.n_blocks=99", "fault.nan_at_step=3"
    )
    assert mixed.returncode != 0  # the sweep's exit status reports the failure ...
    line = summary_line(mixed.stdout)  # ... after every run was attempted
    assert "3 runs:" in line, line
    assert "1 failed" in line, line
    assert "2 diverged" in line, line
    assert "block_attnres" in mixed.stdout
    assert "config error: " in mixed.stdout
    assert "n_blocks" in mixed.stdout
    new = [r for r in rows(tmp_path) if r["seed"] == "5"]
    # a config that never trained is reported by the sweep, not recorded as a run (issue 15 #7)
    assert {r["variant"]: r["status"] for r in new} == {"baseline": "diverged", "full_attnres": "diverged"}
    crashed = run_train(tmp_path, "model=baseline,full_attnres", "seed=6", "fault.raise_at_step=2")
    assert crashed.returncode != 0
    assert "2 runs:" in summary_line(crashed.stdout)
    failed = [r for r in rows(tmp_path) if r["seed"] == "6"]
    assert [r["status"] for r in failed] == ["failed", "failed"]
    assert all("injected failure" in r["error"] and r["val_loss"] == "" for r in failed)


@pytest.mark.slow
def test_joblib_launcher_runs_two_jobs_in_parallel(tmp_path):
    result = run_train(tmp_path, "+launcher=parallel", "hydra.launcher.n_jobs=2", "model=baseline,full_attnres")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 runs: 2 completed" in summary_line(result.stdout)
    table = rows(tmp_path)
    assert sorted(r["variant"] for r in table) == ["baseline", "full_attnres"]
    # each job ran in its own worker process with one torch thread
    jobs = [json.loads(p.read_text()) for p in (tmp_path / "outputs").rglob("attnres_job.json")]
    assert len(jobs) == 2
    assert len({j["pid"] for j in jobs}) == 2
    assert all(j["threads"] == 1 for j in jobs)


def test_slurm_launcher_config_composes():
    env = {**os.environ, "WANDB_MODE": "disabled"}
    cmd = [
        sys.executable,
        "-m",
        "experiments.train",
        "+sweep=paper_ladder",
        "+launcher=slurm",
        "hydra.launcher.partition=gpu",
        "trainer.devices=8",
        "trainer.num_nodes=2",
        "--cfg",
        "hydra",
    ]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "SlurmLauncher" in text
    assert "partition: gpu" in text
    assert "tasks_per_node: ${trainer.devices}" in text
    assert "nodes: ${trainer.num_nodes}" in text
    job = subprocess.run(
        [*cmd[:-2], "--cfg", "job", "--resolve"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert job.returncode == 0, job.stderr[-3000:]
    assert "strategy: ddp" in job.stdout
    assert "seq_len: 8192" in job.stdout
    assert "auto_requeue: false" in job.stdout


def test_every_sweep_config_composes():
    from hydra import compose, initialize_config_dir

    from experiments.config import config_schema

    config_schema.register()  # the structured configs conf/ composes with (Hydra's ConfigStore)

    for path in sorted((REPO / "conf" / "sweep").glob("*.yaml")):
        with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
            cfg = compose("train", overrides=[f"+sweep={path.stem}"], return_hydra_config=True)
        params = cfg.hydra.sweeper.params
        assert params, path.name
        assert cfg.study, path.name
        for model in str(params.get("model", cfg.model.variant)).split(","):
            assert (REPO / "conf" / "model" / f"{model}.yaml").is_file(), (path.name, model)
        for size in str(params.get("size", cfg.hydra.runtime.choices.size)).split(","):
            assert (REPO / "conf" / "size" / f"{size}.yaml").is_file(), (path.name, size)


SWEEP_KINDS = {
    "cpu_ladder": "scaling",
    "paper_ladder": "scaling",
    "quick": "scaling",
    "cpu_lr": "lr",
    "paper_lr": "lr",
    "block_size": "block_size",
    "cpu_block_size": "block_size",
    "cpu_deep_block_size": "block_size",
    "cpu_deep_ablations": "ablations",
    "ablations": "ablations",
    "cpu_ablations": "ablations",
    "arch_grid": "arch_grid",
    "cpu_arch_grid": "arch_grid",
    "cpu_map_lr": "lr",
    "cpu_map": "map",
    "cpu_deep_lr": "lr",
    "cpu_deep_recipe_lr": "lr",
    "cpu_deep": "scaling",
    "cpu_deep_moe": "scaling",
    "cpu_deep_budgets": "scaling",
    "cpu_deep_budgets_lr": "lr",
    "cpu_deep_budgets_tuned": "scaling",
}


def test_every_sweep_config_sets_its_study_kind():
    """study_kind comes from the sweep config (the analysis fits by it, not by the study's name); a plain run is a
    scaling run, and the kind stays out of the run's identity."""
    from results.config_hash import HASH_EXCLUDE
    from results.record import STUDY_KINDS
    from sweeps.study import sweep_config

    assert {p.stem for p in (REPO / "conf" / "sweep").glob("*.yaml")} == set(SWEEP_KINDS)
    for sweep, kind in SWEEP_KINDS.items():
        assert sweep_config(sweep).study_kind == kind in STUDY_KINDS, sweep
    assert "study_kind" in HASH_EXCLUDE
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        assert compose("train").study_kind == "scaling"


def test_sweep_config_is_composed_with_the_commands_overrides():
    """The study a command writes to is the composed config's: a user's `study=` override moves it; swept values
    (model=a,b) select runs and are not composed."""
    from sweeps import study

    cfg = study.sweep_config("cpu_ladder", ["study=mine", "model=baseline,full_attnres", "seed=3,4"])
    assert cfg.study == "mine"
    assert cfg.study_kind == "scaling"
    assert cfg.model.variant == "baseline"
    assert study._sweep_key("cpu_ladder", "study", ["study=mine"]) == "mine"
    assert study._sweep_key("cpu_ladder", "seed", ["seed=3,4"]) == "3,4"
    assert study._sweep_key("cpu_lr", "size.lr") == "2.0e-3,2.83e-3,4.0e-3,5.66e-3,8.0e-3,1.13e-2,1.6e-2,2.26e-2"


@pytest.mark.parametrize(("name", "analysis"), [("lr", "lr"), ("arch", "fit"), ("quick", "fit")])
def test_study_command_chooses_the_analysis_by_study_kind(tmp_path, monkeypatch, name, analysis):
    from sweeps import study

    calls = []

    def sweep(cmd, log):  # the sweep "ran": its study's table exists
        table = tmp_path / "r" / study._sweep_key(study.STUDIES[name].sweep, "study") / "results.csv"
        table.parent.mkdir(parents=True, exist_ok=True)
        table.write_text("run_id\n")
        return 0

    monkeypatch.setattr(study, "run_streaming", sweep)
    monkeypatch.setattr(study, "run_analysis", lambda argv: calls.append(argv) or (1, None))
    assert (
        study.main([name, "--jobs", "1", "--runs-root", str(tmp_path / "r"), "--reports-root", str(tmp_path / "p")])
        == 1
    )
    (argv,) = calls
    assert argv[0] == analysis


def test_study_command_stops_at_a_bad_override_before_any_run(tmp_path, monkeypatch, capsys):
    from sweeps import study

    monkeypatch.setattr(study, "run_streaming", lambda cmd, log: pytest.fail("the sweep must not start"))
    assert (
        study.main(
            ["quick", "--runs-root", str(tmp_path / "r"), "--reports-root", str(tmp_path / "p"), "nosuchgroup=x"]
        )
        == 2
    )
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "config error: nosuchgroup=x: the config has no key 'nosuchgroup'" in line
    assert (
        study.main(
            ["quick", "--runs-root", str(tmp_path / "r"), "--reports-root", str(tmp_path / "p"), "study_kind=ladder"]
        )
        == 2
    )
    assert "study_kind='ladder'; allowed values: scaling, lr" in capsys.readouterr().err


def test_sweep_summary_counts_and_exit_status(tmp_path):
    from sweeps.sweep_summary import JOB_FILE, collect, summarize

    for i, status in enumerate(["completed", "skipped", "failed", "completed"]):
        d = tmp_path / str(i)
        d.mkdir()
        (d / JOB_FILE).write_text(json.dumps({"job_num": i, "status": status, "run_id": f"r{i}", "error": "boom"}))
    jobs = collect(tmp_path)
    text, ok = summarize(jobs)
    assert not ok
    assert "4 runs: 2 completed, 1 skipped, 1 failed, 0 diverged" in text
    assert "r2: boom" in text


def test_study_command_takes_seeds_from_the_sweep_config():
    """`python -m sweeps.study` has no seed list of its own: conf/sweep/<sweep>.yaml is the one source."""
    from sweeps import study

    assert study._sweep_key("cpu_ladder", "seed") == "0,1,2"
    assert study._sweep_key("cpu_ladder", "study") == "cpu_ladder"
    assert study._sweep_key("cpu_arch_grid", "study") == "arch_grid"
    cmd = study.sweep_command("cpu_ladder", None, 2, "runs", ["logger=csv"])
    assert not any(a.startswith("seed=") for a in cmd)
    assert cmd[-1] == "logger=csv"
    assert "+launcher=parallel" in cmd
    assert "seed=3,4" in study.sweep_command("cpu_ladder", "3,4", 1, "runs", [])
    with pytest.raises(ValueError, match="sets no nonexistent"):
        study._sweep_key("quick", "nonexistent")


def test_study_options_may_come_between_the_study_and_its_overrides(tmp_path, monkeypatch):
    from sweeps import study

    seen = []
    monkeypatch.setattr(study, "run_streaming", lambda cmd, log: seen.append(cmd) or 0)
    rc = study.main(
        [
            "lr",
            "--seeds",
            "10",
            "model=full_attnres",
            "size=cpu_s",
            "--runs-root",
            str(tmp_path / "r"),
            "--reports-root",
            str(tmp_path / "p"),
        ]
    )
    assert rc == 1  # nothing ran, so there is no table to analyse
    (cmd,) = seen
    assert "seed=10" in cmd
    assert cmd[-2:] == ["model=full_attnres", "size=cpu_s"]


def test_study_headline_flags_single_seed_intervals(tmp_path):
    import json

    from analysis.io.fit_document import FitDocument
    from analysis.render.study_headline import fit_headline as headline

    fit = {
        "multipliers": {"block_attnres": {"m": 2.0, "m_ci95": [0.001, 1659.6], "p_m_le_1": 0.14, "paper_M": 21.5}},
        "bootstrap": {
            "mode": "parametric",
            "sigma": 0.05,
            "sigma_source": "residual standard deviation",
            "seeds_per_size": {"cpu_xs": 1, "cpu_s": 1},
        },
    }
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(fit))
    lines = headline(FitDocument.from_json(path))
    assert "m = 2.000x" in lines[0]
    assert "1 seed(s) per size" in lines[-1]
    assert "not a claim" in lines[-1]
    fit["bootstrap"] = {"mode": "paired_cluster", "seeds_per_size": {"cpu_xs": 3}}
    path.write_text(json.dumps(fit))
    assert len(headline(FitDocument.from_json(path))) == 1


def _stub_sweep(monkeypatch, study, tmp_path: Path, seen: list) -> None:
    """The sweep "ran" (its command kept in ``seen``): its study's table exists, empty."""

    def sweep(cmd, log):
        seen.append(cmd)
        name = study._sweep_key(cmd[4].split("=", 1)[1], "study", cmd[5:])
        table = tmp_path / "r" / name / "results.csv"
        table.parent.mkdir(parents=True, exist_ok=True)
        table.write_text("run_id\n")
        return 0

    monkeypatch.setattr(study, "run_streaming", sweep)


def test_the_paper_study_sends_its_sweep_through_the_launcher_given_then_fits(tmp_path, monkeypatch, capsys):
    """`python -m sweeps.study paper data.name=... +launcher=slurm`: the paper ladder's multirun with the user's
    launcher in place of the local parallel one, then `analysis fit` of its table (nothing trains here)."""
    from sweeps import study

    seen, analyses = [], []
    _stub_sweep(monkeypatch, study, tmp_path, seen)
    monkeypatch.setattr(study, "run_analysis", lambda argv: analyses.append(argv) or (1, None))
    roots = ["--jobs", "2", "--runs-root", str(tmp_path / "r"), "--reports-root", str(tmp_path / "p")]
    user = ["data=shards", "data.name=/data/shards", "+launcher=slurm", "hydra.launcher.partition=gpu"]
    assert study.main(["paper", *roots, *user]) == 1  # the stubbed analysis' status
    (cmd,) = seen
    assert cmd[:5] == [*study.TRAIN_COMMAND, "+sweep=paper_ladder"]
    assert cmd[-4:] == user
    assert not any("launcher=parallel" in a or "n_jobs" in a for a in cmd)
    assert "jobs through +launcher=slurm" in capsys.readouterr().out
    (argv,) = analyses
    table, report = tmp_path / "r" / "paper_scaling" / "results.csv", tmp_path / "p" / "paper_scaling"
    assert argv == ["fit", "--results", str(table), "--out", str(report)]
    # the command composes as it stands: the SLURM launcher, the user's corpus, the paper's context
    env = {**os.environ, "WANDB_MODE": "disabled"}
    out = subprocess.run(
        [*cmd[:3], *cmd[4:], "--cfg", "all"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SlurmLauncher" in out.stdout
    assert "partition: gpu" in out.stdout
    assert "name: /data/shards" in out.stdout
    assert "seq_len: 8192" in out.stdout
    assert "study: paper_scaling" in out.stdout
    # without a launcher of the user's, --jobs 2 runs side by side here, as every CPU study does
    seen.clear()
    assert study.main(["paper", *roots, "data.name=/data/shards"]) == 1
    assert "+launcher=parallel" in seen[0]


def test_the_paper_lr_study_tunes_and_writes_the_paper_sizes_lr_table(tmp_path, monkeypatch):
    from sweeps import study

    seen, analyses = [], []
    _stub_sweep(monkeypatch, study, tmp_path, seen)
    monkeypatch.setattr(study, "run_analysis", lambda argv: analyses.append(argv) or (1, None))
    roots = ["--runs-root", str(tmp_path / "r"), "--reports-root", str(tmp_path / "p")]
    assert study.main(["paper_lr", *roots, "--arms", "all", "data.name=/data/shards", "+launcher=slurm"]) == 1
    (cmd,) = seen
    assert "+sweep=paper_lr" in cmd
    assert "model=baseline,full_attnres,block_attnres" in cmd
    (argv,) = analyses
    assert argv[:2] == ["lr", "--results"]
    assert argv[-4:] == ["--rule", "per_size", "--write-config", str(REPO / "conf" / "tuned_lr" / "paper.yaml")]


def test_the_study_fits_in_process_and_prints_the_headline_of_the_document_it_built(tmp_path, monkeypatch, capsys):
    """The analysis runs in the study's process (no `python -m analysis` subprocess): the study prints what the
    command prints, then the headline of the document it built, the same lines as of its fit.json read back."""
    from synthetic_records import write_study

    from analysis.__main__ import main as analysis_main
    from analysis.io.fit_document import FitDocument
    from analysis.render.study_headline import fit_headline
    from sweeps import study

    runs, reports, name = tmp_path / "r", tmp_path / "p", study._sweep_key("quick", "study")
    monkeypatch.setattr(
        study, "run_streaming", lambda cmd, log: 0 if write_study(runs / name, extra_studies=False) else 1
    )
    monkeypatch.setattr(study.subprocess, "call", lambda *a, **k: pytest.fail("the analysis ran in a subprocess"))
    monkeypatch.setattr(study.subprocess, "Popen", lambda *a, **k: pytest.fail("the analysis ran in a subprocess"))
    assert study.main(["quick", "--jobs", "1", "--runs-root", str(runs), "--reports-root", str(reports)]) == 0
    printed = capsys.readouterr().out.splitlines()
    lines = fit_headline(FitDocument.from_json(reports / name / "fit.json"))
    assert any("compute multiplier m = " in line for line in lines)
    start = printed.index(lines[0])
    assert printed[start : start + len(lines)] == lines
    assert printed[start + len(lines)].startswith("[attnres] regime: ")
    assert analysis_main(["fit", "--results", str(runs / name / "results.csv"), "--out", str(tmp_path / "a")]) == 0
    command = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("wrote ")]
    assert command
    assert all(line in printed for line in command)


# A sweep that says it is ready (a file), then waits; the first of SIGTERM, SIGUSR1, SIGUSR2 it receives ends it with
# 128 + that signal, as an interrupted sweep does.
SIGNALLED_SWEEP = """
import pathlib, signal, sys, time
def stop(num, frame):
    print(f"[attnres] sweep stopped by {signal.Signals(num).name}", flush=True)
    sys.exit(128 + num)
for num in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(num, stop)
pathlib.Path(sys.argv[1]).touch()
time.sleep(20)  # no signal came: exit 0
"""


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGUSR1", "SIGUSR2"])
def test_run_streaming_passes_each_stop_signal_on_to_the_sweep(tmp_path, capsys, signame):
    """SIGTERM, SIGUSR1 and SIGUSR2 (SLURM's preemption signal) to ``python -m sweeps.study`` reach its sweep, whose
    exit status (128 + the signal) comes back; the handlers of this process are restored afterwards."""
    import signal
    import threading
    import time

    from sweeps import study

    num = getattr(signal, signame)
    ready = tmp_path / "ready"

    def signal_once_ready() -> None:
        end = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < end:
            time.sleep(0.02)
        os.kill(os.getpid(), num)  # to this process, as SLURM or a user would signal the study command

    def own(num: int, frame: object) -> None:  # this process's handler: only what the sweep is not sent reaches it
        received.append(num)

    received: list[int] = []
    before = signal.signal(num, own)
    try:
        sender = threading.Thread(target=signal_once_ready)
        sender.start()
        rc = study.run_streaming([sys.executable, "-c", SIGNALLED_SWEEP, str(ready)], tmp_path / "sweep.log")
        sender.join()
        assert signal.getsignal(num) is own  # restored
    finally:
        signal.signal(num, before)
    assert (rc, received) == (128 + num, [])
    assert f"[attnres] sweep stopped by {signame}" in capsys.readouterr().out


def test_a_launch_killed_before_its_summary_has_it_rebuilt_by_the_next_launch_of_its_study(tmp_path, capsys):
    """A multirun whose launching process died (no sweep_summary.json; its pid gone) gets its summary at the start of
    the next launch of the same study and runs root: the jobs' own files, a planned job without one counted failed
    (its directory exists) or not started. A launch still alive, or of another study, is left alone."""
    from omegaconf import OmegaConf

    from sweeps.study import sweep_config
    from sweeps.sweep_summary import DIED, JOB_FILE, SUMMARY_FILE, SweepSummary

    multiruns = tmp_path / "outputs" / "multiruns"
    cfg = sweep_config("quick", [f"paths.runs_root={tmp_path / 'runs'}", f"paths.hydra_root={tmp_path / 'outputs'}"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()

    def launch(name: str, pid: int, study: str = "quick") -> Path:
        sweep_dir = multiruns / "2026-01-01" / f"{name}_pid{pid}"
        sweep_dir.mkdir(parents=True)
        OmegaConf.save(OmegaConf.merge(cfg, {"study": study}), sweep_dir / "multirun.yaml")  # as Hydra saves it
        return sweep_dir

    dead, alive, other = launch("00-00-00_0", gone.pid), launch("00-00-01_0", os.getpid()), launch("0", gone.pid, "lr")
    for num, status in ((0, "completed"), (1, "failed")):
        (dead / str(num)).mkdir()
        (dead / str(num) / JOB_FILE).write_text(json.dumps({"job_num": num, "status": status, "run_id": f"r{num}"}))
    (dead / "2").mkdir()  # job 2 started and died: no job file; jobs 3-8 of the 9 planned never started

    SweepSummary().on_multirun_start(cfg)
    out = capsys.readouterr().out
    assert f"[attnres] earlier sweep {dead} (its launch ended before its summary" in out
    assert "9 runs: 1 completed, 0 skipped, 2 failed, 0 diverged, 0 interrupted, 6 not_started" in out
    assert f"failed    job 2: {DIED}" in out
    doc = json.loads((dead / SUMMARY_FILE).read_text())
    assert doc["rebuilt"] is True
    assert doc["counts"] == {
        "completed": 1,
        "skipped": 0,
        "failed": 2,
        "diverged": 0,
        "interrupted": 0,
        "not_started": 6,
    }
    assert [j["job_num"] for j in doc["jobs"]] == list(range(9))
    assert not (alive / SUMMARY_FILE).exists()
    assert not (other / SUMMARY_FILE).exists()
    SweepSummary().on_multirun_start(cfg)  # rebuilt once: the next launch finds it written
    assert "earlier sweep" not in capsys.readouterr().out
