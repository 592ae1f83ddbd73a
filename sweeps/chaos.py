"""A chaos sweep: a sweep of tiny runs in 2 parallel workers, killed at random moments and relaunched until every
run is done, then checked against an uninterrupted twin of the same configs.

    python -m sweeps.chaos                       # one round (what tests/test_chaos.py runs), seed 0
    python -m sweeps.chaos --rounds 12 --seed 7  # a longer run by hand: 12 rounds, each a fresh study

**The sweep.** ``python -m experiments.train -m`` of ``--seeds`` seeds x ``--variants`` variants of the smoke
preset, shrunk (``RUN_OVERRIDES``: a few optimizer steps, a checkpoint every 3 steps, two evaluations), through the
joblib launcher (``+launcher=parallel hydra.launcher.n_jobs=2``): a launcher process and its 2 worker processes,
in a process group (session) of their own. The driver only ever signals processes of that group.

**The driver** (:func:`chaos_round`). A round launches the sweep, and while it runs waits a random delay, then
sends SIGKILL, SIGTERM, SIGINT or SIGUSR1 to the launcher or to one of its workers (each drawn from one
``numpy.random.Generator`` seeded by ``--seed`` and the round: a failure is replayed by its seed). With probability
``--second-kill`` a second one follows within 3 seconds, landing while the sweep stops. When the kill comes is
drawn in the launch's own progress, so that it lands inside the launch however fast the machine is: a number k of
run starts, uniform in 0 .. half the runs not yet completed; k = 0 is a delay uniform in ``STARTUP_WINDOW_S`` from
the launch (its start: Python, Hydra, the workers, the first run's setup), k > 0 a delay uniform in
``AFTER_START_S`` after the k-th ``starting;`` / ``resuming from`` line of the launch (a run's training,
evaluations, checkpoints and record, or the next run's setup). After the launch has ended
(and every process of its group is gone: an orphaned worker must notice its dead launcher and stop by itself
within ``ORPHAN_WAIT_S``) the same command is launched again. The first ``--kill-launches`` launches of a round are
attacked; the kills of a relaunch land anywhere in it, its start included. The launches after those run
undisturbed, and the round ends when a launch exits 0 with every run completed, or fails after ``--max-relaunches``
relaunches.

**Phases.** Each kill is classified at the moment it is sent, from outside the processes (so the sweep runs
unmodified): ``startup`` (the launch has no process in a run yet: Python, Hydra, the joblib workers starting),
``run setup`` (a worker holds a run's lock, ``<study>/.locks/<run_id>.lock`` names its pid, but has not printed
the run's ``starting;`` / ``resuming from`` line: data, model, Trainer, the checkpoint read), ``training`` (after
that line: the optimizer steps and the evaluations, which at this size take a few milliseconds each and are not
told apart from outside; the signal in an evaluation is tested deterministically in tests/test_interrupts.py),
``checkpoint write`` (the process has a checkpoint's temporary file open, ``/proc/<pid>/fd``), ``record write``
(it has a file of the study's ledger open: a record, results.json or results.csv, or their temporary files) and
``between runs`` (a worker alive in a launch that started runs, holding no run's lock). A kill of the launcher
takes the phase of its workers (the furthest along, in the order above). The launch number says whether it landed
in a relaunch.

**The checks** (:func:`check_round`), against the twin (the same sweep, never interrupted, in its own runs root):
exactly one completed record per config (``config_hash``) and the same configs as the twin's, every record file
readable, no ``failed`` or ``diverged`` record, every run's last row in results.csv ``completed``, every completed
``val_loss`` bit-identical to the twin's, no run lock (``.locks/*.lock``) and no temporary file (``.*.tmp-*``) left,
no damaged checkpoint set aside (``*.corrupt-*``), and results.csv byte-equal to the table rebuilt from the records
(results.ledger.rebuild_table, in a copy). The guarantee this checks: docs/runs.md, "Killed at random, relaunched".

Linux only (``/proc``); standard library and numpy, the sweep itself in subprocesses.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from results import ledger

REPO = Path(__file__).resolve().parent.parent
SIGNALS = ("SIGKILL", "SIGTERM", "SIGINT", "SIGUSR1")
PHASES = ("startup", "run setup", "training", "checkpoint write", "record write", "between runs")
TARGETS = ("launcher", "worker")
STUDY = "chaos"
# The runs: the smoke preset (cpu_xs, stdlib data, no logger) shrunk to 10 optimizer steps of 8 x 128 tokens, a
# checkpoint every 3 steps, evaluations at 5 and 10 on 16 windows, a metrics row per step.
RUN_OVERRIDES = (
    "experiment=smoke",
    f"study={STUDY}",
    "size.batch_size=8",
    "size.tokens=10240",
    "train.eval_count=2",
    "train.val_sequences=16",
    "train.val_batch_size=16",
    "train.log_every=1",
    "callbacks.model_checkpoint.every_n_train_steps=3",
    "threads=1",
    "trainer.enable_progress_bar=false",
    "logger=none",
)
ORPHAN_WAIT_S = 120.0  # how long a process of a launch whose launcher died may stay in a run (its lock held)
STARTUP_WINDOW_S = 20.0  # a kill before the launch's first run start lands within this many seconds of it
AFTER_START_S = 4.0  # a kill after the k-th run start lands within this many seconds of it (a tiny run's length)
IDLE_GRACE_S = 5.0  # how long the processes left of a launch may hold no run before they count as idle
# Past it a launch is hung: each of its processes is sent SIGABRT (faulthandler, PYTHONFAULTHANDLER=1 in _env, prints
# every thread's stack into the sweep's log), then SIGKILL; the problem names the launch and carries those stacks.
# A launch of the 24 tiny runs takes 1-3 minutes on a loaded 2-core machine.
LAUNCH_TIMEOUT_S = float(os.environ.get("ATTNRES_CHAOS_LAUNCH_TIMEOUT_S", 900))


@dataclass(frozen=True)
class Kill:
    """One signal the driver sent: the round and launch (0 = the round's first), seconds since the launch
    started, whom (launcher or worker), which signal, the phase it landed in (PHASES)."""

    round: int
    launch: int
    at_s: float
    target: str
    signal: str
    phase: str


@dataclass
class Launch:
    """One launch of the sweep: its exit status (negative: killed by that signal), its seconds, whether its
    processes had to be killed by the driver after their launcher died while still in a run (an orphan that did not
    stop), how many idle ones it killed (joblib workers that never got a job: loky's own idle timeout would end
    them after 300 s), whether it ran past LAUNCH_TIMEOUT_S (then the driver killed it, and ``stacks`` holds the
    end of its output: its processes' stacks)."""

    round: int
    number: int
    returncode: int
    seconds: float
    orphans_killed: bool = False
    timed_out: bool = False
    idle_killed: int = 0
    stacks: str = ""


@dataclass
class RoundResult:
    """A round's kills, launches, records and the problems :func:`check_round` found (empty: it passed)."""

    round: int
    seed: int
    kills: list[Kill] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    configs: int = 0
    records: Counter = field(default_factory=Counter)  # status -> record files
    bit_identical: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def relaunches(self) -> int:
        return max(0, len(self.launches) - 1)


def sweep_command(
    runs_root: Path, hydra_dir: Path, seeds: int, variants: Sequence[str], extra: Sequence[str]
) -> list[str]:
    """The sweep: ``seeds`` x ``variants`` tiny runs (RUN_OVERRIDES) in 2 joblib workers into ``runs_root``."""
    return [
        sys.executable,
        "-m",
        "experiments.train",
        "-m",
        *RUN_OVERRIDES,
        f"model={','.join(variants)}",
        f"seed={','.join(str(s) for s in range(seeds))}",
        f"paths.runs_root={runs_root}",
        f"paths.hydra_root={hydra_dir}",
        f"hydra.sweep.dir={hydra_dir}/sweep",
        "+launcher=parallel",
        "hydra.launcher.n_jobs=2",
        *extra,
    ]


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
        "PYTHONFAULTHANDLER": "1",  # SIGABRT prints every thread's stack (a hung launch: run_launch)
    }


def child_pids(pid: int) -> list[int]:
    """The child processes of ``pid`` (from /proc), loky's resource tracker left out, in pid order."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"resource_tracker" not in cmdline:
            kids.append(int(stat.parent.name))
    return sorted(kids)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _open_files(pid: int) -> list[str]:
    out = []
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                out.append(os.readlink(fd))
    return out


def _lock_holders(study_dir: Path) -> dict[int, str]:
    """pid -> run id of every run lock marker in the study (filelock's SoftFileLease writes ``pid=<pid>``)."""
    holders = {}
    for marker in (study_dir / ".locks").glob("*.lock"):
        with contextlib.suppress(OSError):
            match = re.search(r"^pid=(\d+)$", marker.read_text(), re.MULTILINE)
            if match:
                holders[int(match.group(1))] = marker.name[: -len(".lock")]
    return holders


class _Output:
    """The launch's output (launcher and workers share its pipe), drained by a thread into a log file; remembers
    which runs printed their ``starting;`` / ``resuming from`` line."""

    def __init__(self, proc: subprocess.Popen, log_path: Path) -> None:
        self.started: set[str] = set()
        self.start_times: list[float] = []  # time.monotonic() of each run start line
        self.lines = 0
        self.tail: deque[str] = deque(maxlen=400)  # the last lines, for a hung launch's stacks
        self._thread = threading.Thread(target=self._drain, args=(proc, log_path), daemon=True)
        self._thread.start()

    def _drain(self, proc: subprocess.Popen, log_path: Path) -> None:
        assert proc.stdout is not None
        with open(log_path, "a", encoding="utf-8", errors="replace") as log:
            for line in proc.stdout:
                log.write(line)
                self.lines += 1
                self.tail.append(line)
                match = re.match(r"\[attnres\] (\S+): (starting;|resuming from)", line)
                if match:
                    self.started.add(match.group(1))
                    self.start_times.append(time.monotonic())

    def join(self) -> None:
        self._thread.join(timeout=30)


def classify(target_pid: int, workers: list[int], study_dir: Path, started: set[str], launcher: bool) -> str:
    """The phase (PHASES) a signal to ``target_pid`` lands in; for the launcher, its workers' furthest one."""
    holders = _lock_holders(study_dir)

    def phase_of(pid: int) -> str:
        files = _open_files(pid)
        if any("/checkpoints/" in f and ".tmp-" in f for f in files):
            return "checkpoint write"
        if any(str(study_dir) in f and ("/records/" in f or "results." in f) for f in files):
            return "record write"
        run = holders.get(pid)
        if run is None:
            return "between runs" if started else "startup"
        return "training" if run in started else "run setup"

    if not launcher:
        return phase_of(target_pid)
    phases = [phase_of(w) for w in workers]
    if not phases:
        return "startup"
    order = {"startup": 0, "between runs": 1, "run setup": 2, "training": 3, "checkpoint write": 4, "record write": 5}
    return max(phases, key=order.__getitem__)


def run_launch(
    cmd: list[str],
    log_path: Path,
    study_dir: Path,
    rng: np.random.Generator | None,
    round_no: int,
    number: int,
    remaining: int,
    second_kill: float,
) -> tuple[Launch, list[Kill]]:
    """One launch of ``cmd`` in a session of its own; with ``rng``, one random kill (and maybe a second) while it
    runs, at a point drawn in its progress (``remaining``: runs not completed yet; the module docstring).
    Waits until every process of its group is gone (_reap_group)."""
    t0 = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n$ launch {number} of round {round_no}: {' '.join(cmd)}\n")
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    output = _Output(proc, log_path)
    kills: list[Kill] = []
    plan: list[tuple[int, float]] = []  # (run starts to wait for, then seconds)
    if rng is not None:
        k = int(rng.integers(0, max(1, remaining // 2) + 1))
        plan.append((k, float(rng.uniform(0.0, AFTER_START_S if k else STARTUP_WINDOW_S))))
        if rng.random() < second_kill:
            plan.append((-1, float(rng.uniform(0.0, 3.0))))  # -1: after the first kill
    last_kill = t0
    for k, delay in plan:
        while proc.poll() is None:
            if k < 0:
                since = last_kill
            elif k == 0:
                since = t0
            else:
                since = output.start_times[k - 1] if len(output.start_times) >= k else None
            if since is not None and time.monotonic() - since >= delay:
                break
            time.sleep(0.02)
        if proc.poll() is not None:
            break
        last_kill = time.monotonic()
        workers = child_pids(proc.pid)
        assert rng is not None
        target = TARGETS[int(rng.integers(2))] if workers else "launcher"
        signame = SIGNALS[int(rng.integers(len(SIGNALS)))]
        pid = proc.pid if target == "launcher" else workers[int(rng.integers(len(workers)))]
        phase = classify(pid, workers, study_dir, set(output.started), target == "launcher")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, getattr(signal, signame))
            kills.append(Kill(round_no, number, round(time.monotonic() - t0, 3), target, signame, phase))
    timed_out, stacks = False, ""
    try:
        returncode = proc.wait(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        timed_out, lines_before = True, output.lines
        for pid in _group_members(proc.pid):  # faulthandler: every thread's stack, into the log
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGABRT)
        time.sleep(5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        returncode = proc.wait()
        output.join()
        stacks = "".join(list(output.tail)[-min(len(output.tail), output.lines - lines_before) :])
    orphans, idle = _reap_group(proc.pid, study_dir)
    output.join()
    seconds = round(time.monotonic() - t0, 2)
    return Launch(round_no, number, returncode, seconds, orphans, timed_out, idle, stacks), kills


def _group_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[3]) == pgid:
                members.append(int(stat.parent.name))
    return members


def _reap_group(pgid: int, study_dir: Path) -> tuple[bool, int]:
    """Wait until the processes left of a launch (its group) are gone. One that stays in a run (holds a run lock or
    has a file of the study open) for ORPHAN_WAIT_S is killed and reported (True); ones that hold nothing for
    IDLE_GRACE_S are idle joblib workers that never got a job: killed and counted."""
    deadline, idle_since = time.monotonic() + ORPHAN_WAIT_S, time.monotonic()
    while _group_alive(pgid):
        members = _group_members(pgid)
        holders = _lock_holders(study_dir)
        busy = [m for m in members if m in holders or any(str(study_dir) in f for f in _open_files(m))]
        now = time.monotonic()
        if busy:
            idle_since = now
        if now > deadline or (not busy and now - idle_since > IDLE_GRACE_S):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            time.sleep(0.5)
            return bool(busy), 0 if busy else len(members)
        time.sleep(0.1)
    return False, 0


def _completed_by_hash(study_dir: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for rec in ledger.read_records(study_dir):
        if rec.get("status") == "completed":
            out.setdefault(str(rec["config_hash"]), []).append(rec)
    return out


def all_done(study_dir: Path, configs: int) -> bool:
    """Whether the study holds a completed record for ``configs`` distinct configs."""
    return study_dir.is_dir() and len(_completed_by_hash(study_dir)) >= configs


def check_round(study_dir: Path, twin_dir: Path, result: RoundResult) -> None:
    """The checks of the module docstring, each failure appended to ``result.problems``; fills ``records`` and
    ``bit_identical``."""
    problems = result.problems
    twin = {h: recs[0] for h, recs in _completed_by_hash(twin_dir).items()}
    result.configs = len(twin)
    record_files = sorted((study_dir / ledger.RECORDS_DIR).glob("*.json"))
    for path in record_files:
        rec, problem = ledger.read_record_file(path)
        if problem is not None or rec is None:
            problems.append(f"unreadable record {path.name}: {problem}")
        else:
            result.records[str(rec.get("status"))] += 1
    done = _completed_by_hash(study_dir)
    for chash, recs in sorted(done.items()):
        if len(recs) != 1:
            problems.append(f"{len(recs)} completed records for config {chash[:8]} ({recs[0]['run_id']})")
    if set(done) != set(twin):
        missing, extra = sorted(set(twin) - set(done)), sorted(set(done) - set(twin))
        problems.append(f"configs: {len(missing)} of the twin's without a completed record, {len(extra)} not in it")
    for status in ("failed", "diverged"):
        if result.records[status]:
            problems.append(f"{result.records[status]} {status} record(s)")
    rows = ledger.read_rows(study_dir / ledger.RESULTS_TABLE) if (study_dir / ledger.RESULTS_TABLE).is_file() else []
    last = {row["run_id"]: row for row in rows}  # the table is in record order: a run's last row is its state
    for run_id, row in sorted(last.items()):
        if row["status"] != "completed":
            problems.append(f"results.csv: {run_id} ends {row['status']}")
    for chash, recs in sorted(done.items()):
        if chash in twin:
            got, want = recs[0]["val_loss"], twin[chash]["val_loss"]
            if got == want and repr(got) == repr(want):
                result.bit_identical += 1
            else:
                problems.append(f"{recs[0]['run_id']}: val_loss {got!r}, the twin's {want!r}")
    for pattern, what in (
        (".locks/*.lock", "run lock"),
        ("**/.*.tmp-*", "temporary file"),
        ("**/*.corrupt-*", "damaged checkpoint"),
    ):
        left = sorted(study_dir.glob(pattern))
        if left:
            problems.append(f"{len(left)} {what}(s) left: {', '.join(str(p.relative_to(study_dir)) for p in left[:3])}")
    if not (study_dir / ledger.RECORDS_DIR).is_dir():  # every launch failed before its first record
        problems.append(f"no records directory: {study_dir / ledger.RECORDS_DIR}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / STUDY
        shutil.copytree(study_dir / ledger.RECORDS_DIR, copy / ledger.RECORDS_DIR)
        rebuilt = ledger.rebuild_table(copy).read_bytes()
    table = study_dir / ledger.RESULTS_TABLE
    if not table.is_file() or table.read_bytes() != rebuilt:
        problems.append("results.csv differs from the table rebuilt from the records")


def twin_sweep(root: Path, seeds: int, variants: Sequence[str], extra: Sequence[str]) -> tuple[Path, float]:
    """The uninterrupted sweep of the same configs under ``root``: its study directory and its seconds (raises
    when it fails)."""
    cmd = sweep_command(root / "runs", root / "hydra", seeds, variants, extra)
    launch, _ = run_launch(cmd, root / "sweep.log", root / "runs" / STUDY, None, -1, 0, 0.0, 0.0)
    study = root / "runs" / STUDY
    if launch.returncode != 0 or not all_done(study, seeds * len(variants)):
        raise RuntimeError(f"the twin sweep failed (exit {launch.returncode}); log: {root / 'sweep.log'}")
    return study, launch.seconds


def chaos_round(
    root: Path,
    twin_dir: Path,
    round_no: int,
    seed: int,
    seeds: int,
    variants: Sequence[str],
    extra: Sequence[str] = (),
    kill_launches: int = 6,
    max_relaunches: int = 10,
    second_kill: float = 0.3,
) -> RoundResult:
    """One round under ``root``: the sweep launched, attacked during its first ``kill_launches`` launches,
    relaunched until every run is done (at most ``max_relaunches`` relaunches), then checked (check_round)."""
    t0 = time.monotonic()
    rng = np.random.default_rng([seed, round_no])
    result = RoundResult(round_no, seed)
    study = root / "runs" / STUDY
    cmd = sweep_command(root / "runs", root / "hydra", seeds, variants, extra)
    configs = seeds * len(variants)
    for number in range(max_relaunches + 1):
        attacked = number < kill_launches
        remaining = configs - len(_completed_by_hash(study)) if study.is_dir() else configs
        launch, kills = run_launch(
            cmd, root / "sweep.log", study, rng if attacked else None, round_no, number, remaining, second_kill
        )
        result.launches.append(launch)
        result.kills += kills
        if launch.timed_out:
            result.problems.append(
                f"launch {number} ran past {LAUNCH_TIMEOUT_S:.0f} s and was killed; its processes' stacks:\n"
                + launch.stacks[-6000:]
            )
        if launch.orphans_killed:
            result.problems.append(f"launch {number}: processes left after the launcher died had to be killed")
        if launch.returncode == 0 and all_done(study, configs):
            break
        if not attacked and launch.returncode == 0:
            result.problems.append(f"launch {number} exited 0 without every run completed")
    else:
        result.problems.append(f"not every run completed after {max_relaunches} relaunches")
    check_round(study, twin_dir, result)
    result.seconds = round(time.monotonic() - t0, 1)
    return result


def summary(results: Sequence[RoundResult], seconds: float) -> str:
    """The Markdown summary: kills per signal x phase, per target, in relaunches; launches, records, checks."""
    kills = [k for r in results for k in r.kills]
    lines = [
        (
            f"rounds: {len(results)}; kills: {len(kills)} ({sum(k.launch > 0 for k in kills)} during a relaunch); "
            f"launches: {sum(len(r.launches) for r in results)} (relaunches: {sum(r.relaunches for r in results)}, "
            f"at most {max((r.relaunches for r in results), default=0)} in a round); {seconds:.0f} s"
        ),
        "",
        "| phase | " + " | ".join(SIGNALS) + " | all |",
        "|---|" + "---|" * (len(SIGNALS) + 1),
    ]
    table = Counter((k.phase, k.signal) for k in kills)
    for phase in PHASES:
        row = [table[(phase, s)] for s in SIGNALS]
        lines.append(f"| {phase} | " + " | ".join(str(n) for n in row) + f" | {sum(row)} |")
    totals = [sum(table[(p, s)] for p in PHASES) for s in SIGNALS]
    lines.append("| all | " + " | ".join(str(n) for n in totals) + f" | {len(kills)} |")
    targets = Counter(k.target for k in kills)
    idle = sum(launch.idle_killed for r in results for launch in r.launches)
    lines += [
        "",
        "targets: " + ", ".join(f"{t} {targets[t]}" for t in TARGETS) + f"; idle processes of a dead launcher "
        f"(holding no run) killed by the driver: {idle}",
    ]
    records = sum((r.records for r in results), Counter())
    configs = sum(r.configs for r in results)
    lines.append(
        f"records: {sum(records.values())} ("
        + ", ".join(f"{n} {s}" for s, n in sorted(records.items()))
        + f"); configs: {configs}; completed val_loss bit-identical to the twin's: "
        f"{sum(r.bit_identical for r in results)} of {configs}"
    )
    problems = [f"round {r.round}: {p}" for r in results for p in r.problems]
    lines.append("checks: all passed" if not problems else f"checks: {len(problems)} problem(s)")
    lines += [f"  {p}" for p in problems]
    lines += ["", "| round | kills | launches | exit statuses | seconds |", "|---|---|---|---|---|"]
    for r in results:
        codes = " ".join(str(launch.returncode) for launch in r.launches)
        lines.append(f"| {r.round} | {len(r.kills)} | {len(r.launches)} | {codes} | {r.seconds:.0f} |")
    return "\n".join(lines)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m sweeps.chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--rounds", type=int, default=1, help="rounds, each a fresh study killed and relaunched (default 1)"
    )
    ap.add_argument("--seed", type=int, default=0, help="the driver's random seed: the same seed replays the kills")
    ap.add_argument("--seeds", type=int, default=12, help="training seeds per variant (default 12)")
    ap.add_argument("--variants", default="baseline,block_attnres", help="comma-separated conf/model names")
    ap.add_argument("--kill-launches", type=int, default=6, help="launches per round that are attacked (default 6)")
    ap.add_argument("--max-relaunches", type=int, default=10, help="relaunches per round at most (default 10)")
    ap.add_argument("--second-kill", type=float, default=0.3, help="chance of a second kill while it stops (0.3)")
    ap.add_argument("--workdir", default=None, help="where the studies go (default: a temporary directory, removed)")
    ap.add_argument("--markdown", default=None, help="also write the summary to this file")
    ap.add_argument("overrides", nargs="*", help="extra overrides for every run (e.g. data.cache_dir=...)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, print the summary; exit status 1 when a check failed."""
    args = _parser().parse_args(argv)
    if not Path("/proc/self/stat").exists():
        print("[attnres] error: sweeps.chaos needs Linux's /proc to find a sweep's workers", file=sys.stderr)
        return 2
    variants = [v for v in args.variants.split(",") if v]
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        work = Path(args.workdir) if args.workdir else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        print(
            f"[attnres] chaos: twin sweep ({args.seeds} seeds x {len(variants)} variants) in {work / 'twin'}",
            flush=True,
        )
        twin, twin_s = twin_sweep(work / "twin", args.seeds, variants, args.overrides)
        print(f"[attnres] chaos: twin done in {twin_s:.0f} s", flush=True)
        results = []
        for n in range(args.rounds):
            r = chaos_round(
                work / f"round{n}",
                twin,
                n,
                args.seed,
                args.seeds,
                variants,
                args.overrides,
                args.kill_launches,
                args.max_relaunches,
                args.second_kill,
            )
            results.append(r)
            if args.markdown:  # after every round: a long run stopped early keeps what it measured
                _write(Path(args.markdown), summary(results, time.monotonic() - t0))
            print(
                f"[attnres] chaos round {n}: {len(r.kills)} kills, {r.relaunches} relaunches, "
                f"{r.bit_identical}/{r.configs} bit-identical, {len(r.problems)} problem(s), {r.seconds:.0f} s",
                flush=True,
            )
        text = summary(results, time.monotonic() - t0)
    print(text)
    if args.markdown:
        _write(Path(args.markdown), text)
    return 1 if any(r.problems for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
