"""The Python steps of scripts/gpu_suite.sh (issue 37), one subcommand each; standard library and results/ only.

    install --wheels DIR --target DIR    the suite's first step: install DIR/*.whl (from scripts/gpu_prepare.sh) with
                                         pip --no-index --no-deps --target, then check in a fresh interpreter that
                                         every module they bring imports from the target; without DIR, check that
                                         every distribution of scripts/gpu_wheels.txt imports already
    train --workdir DIR --out JSON -- OVERRIDES...
                                         the training step: `python -m experiments.train OVERRIDES` interrupted once
                                         with SIGUSR1 (the harness's fault injection) and relaunched with the same
                                         command; then the checks (the loss fell, the record is complete, metrics.csv
                                         holds every step once, the checkpoints) -> JSON
    bundle --out DIR --steps TSV         every gpu_*.json of DIR and the steps' outcomes into DIR/gpu_results.json,
                                         the parts removed (at most 8 files come back from the GPU machine)

Exit status: 0 when every check passed, 1 otherwise (each failed check on its own line).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import zipfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WHEEL_LIST = REPO / "scripts" / "gpu_wheels.txt"
BUNDLE = "gpu_results.json"
# fields of a completed record that may be empty: set by derived (fixed-compute) sizes only
# empty in a plain run: no FLOPs budget, no map cell, no error, not a multi-budget launch (train.budgets)
MAY_BE_EMPTY = frozenset({"flops_budget", "d_over_lb", "heads_over_lb", "error", "budget", "trunk_id"})


def wheel_names(path: Path = WHEEL_LIST) -> list[str]:
    """The distributions of scripts/gpu_wheels.txt, in file order (comments and blank lines skipped)."""
    names = []
    for line in path.read_text(encoding="utf-8").splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            names.append(name)
    return names


def _say(msg: str) -> None:
    print(f"gpu_suite_checks: {msg}", flush=True)


# ---- install ------------------------------------------------------------------------------------------------
def top_levels(dist: metadata.Distribution) -> list[str]:
    """The top-level modules a distribution brings (top_level.txt, else the first parts of its RECORD)."""
    text = dist.read_text("top_level.txt")
    if text:
        return sorted({t.strip() for t in text.split() if t.strip()})
    tops = set()
    for f in dist.files or []:
        first = f.parts[0]
        if f.suffix in (".py", ".so") and first != ".." and not first.endswith((".dist-info", ".data")):
            tops.add(first.split(".")[0])  # a package's directory, or a module's file name
    return sorted(tops)


def _unzip_pure(wheel: Path, target: Path) -> None:
    """Install a pure-python wheel without pip (a wheel is a zip of its purelib tree): where the image has no pip."""
    with zipfile.ZipFile(wheel) as z:
        info = next((n for n in z.namelist() if n.endswith(".dist-info/WHEEL")), None)
        if info is None or "Root-Is-Purelib: true" not in z.read(info).decode():
            raise SystemExit(f"gpu_suite_checks: {wheel.name} is not a pure-python wheel and this python has no pip")
        z.extractall(target)


def _import_report(dists: Sequence[metadata.Distribution], target: Path | None) -> list[tuple[str, str, str, str]]:
    """(distribution, version, module, where it imports from) of every top-level module of `dists`, imported in a
    fresh interpreter with `target` first on PYTHONPATH, as the suite's later steps see them."""
    mods = [(d.metadata["Name"], d.version, mod) for d in dists for mod in top_levels(d)]
    code = (
        "import importlib, json, sys\n"
        "ms = [importlib.import_module(m) for m in json.loads(sys.argv[1])]\n"
        "print(json.dumps([getattr(m, '__file__', None) or list(m.__path__)[0] for m in ms]))\n"
    )
    env = dict(os.environ)
    if target is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(target), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps([m for _, _, m in mods])],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"gpu_suite_checks: an import failed: {tail}")
    wheres = json.loads(proc.stdout.strip().splitlines()[-1])
    return [(name, version, mod, where) for (name, version, mod), where in zip(mods, wheres)]


def cmd_install(args: argparse.Namespace) -> int:
    wheels_dir = Path(args.wheels)
    wheels = sorted(wheels_dir.glob("*.whl")) if wheels_dir.is_dir() else []
    if not wheels:
        try:
            dists = [metadata.distribution(n) for n in wheel_names()]
        except metadata.PackageNotFoundError as e:
            _say(f"no wheels in {wheels_dir}/ and {e.name} is not installed: run scripts/gpu_prepare.sh")
            return 1
        report = _import_report(dists, None)
        _say(
            f"install skipped: no wheels in {wheels_dir}/ and {', '.join(sorted({r[0] for r in report}))} "
            "import already"
        )
        return 0
    target = Path(args.target)
    target.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    has_pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0
    if has_pip:
        cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile", "--quiet"]
        cmd += ["--disable-pip-version-check", "--target", str(target), *map(str, wheels)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            _say(f"pip install --no-index --target failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
            return 1
    else:
        for w in wheels:
            _unzip_pure(w, target)
    dists = list(metadata.distributions(path=[str(target)]))
    missing = sorted(set(map(_norm, wheel_names())) - {_norm(d.metadata["Name"]) for d in dists})
    for dist, version, mod, where in _import_report(dists, target):
        inside = Path(where).resolve().is_relative_to(target.resolve())
        print(f"  {dist} {version}: {mod} from {'the target' if inside else where}")
        if not inside:
            _say(f"{mod} imports from {where}, not from the installed wheels in {target}")
            return 1
    how = "pip --no-index --no-deps --target" if has_pip else "unzipped (no pip here)"
    _say(f"installed {len(wheels)} wheels from {wheels_dir}/ into {target} ({how}, {time.perf_counter() - t0:.1f} s)")
    if missing:
        _say(f"{wheels_dir}/ lacks {', '.join(missing)} of scripts/gpu_wheels.txt (re-run scripts/gpu_prepare.sh)")
        return 1
    return 0


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


# ---- train --------------------------------------------------------------------------------------------------
def _launch(cmd: list[str]) -> tuple[int, float, str]:
    """Run one launch, its output passed through (the suite's log) and kept; (exit status, seconds, output)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line)
    sys.stdout.flush()
    return proc.wait(), time.perf_counter() - t0, "".join(lines)


def _metrics(path: Path) -> list[dict[str, float | None]]:
    with open(path, newline="", encoding="utf-8") as f:
        return [{k: (float(v) if v not in ("", None) else None) for k, v in row.items()} for row in csv.DictReader(f)]


def _peak_flops() -> float | None:
    """The dense bf16 peak of this GPU (the benchmark's table), None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    proc = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    sys.path.insert(0, str(REPO))
    from experiments.bench.size_section import GPU_PEAK_BF16  # no torch at import

    name = proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else ""
    return next((v for k, v in GPU_PEAK_BF16.items() if k in name), None)


def cmd_train(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(REPO))
    from results import ledger
    from results.record import malformed

    work = Path(args.workdir)
    study = "gpu_suite_train"
    cmd = [sys.executable, "-m", "experiments.train", *args.overrides, f"study={study}"]
    cmd += [
        f"paths.runs_root={work / 'runs'}",
        f"paths.hydra_root={work / 'outputs'}",
        f"data.cache_dir={work / 'data'}",
    ]
    cmd += [f"fault.signal_at_step={args.signal_step}", "fault.signal=SIGUSR1"]
    _say(f"launch 1 (SIGUSR1 at step {args.signal_step}), then the same command again: {' '.join(cmd)}")
    rc1, s1, _ = _launch(cmd)
    rc2, s2, out2 = (None, 0.0, "")
    want_rc1 = 128 + signal.SIGUSR1
    checks: dict[str, bool] = {f"launch 1 stopped by SIGUSR1 (exit {want_rc1})": rc1 == want_rc1}
    if rc1 == want_rc1:
        rc2, s2, out2 = _launch(cmd)
    checks["launch 2 (the same command) resumed and exited 0"] = rc2 == 0 and "resuming from" in out2
    study_dir = work / "runs" / study
    records, problems = ledger.read_study(study_dir) if study_dir.is_dir() else ([], ["no study directory"])
    checks["no malformed record"] = not problems
    statuses = [r.get("status") for r in records]
    checks["records: interrupted, then completed"] = statuses == ["interrupted", "completed"]
    done: dict[str, Any] = records[-1] if records and records[-1].get("status") == "completed" else {}
    stopped: dict[str, Any] = records[0] if records else {}
    stopped_at = stopped.get("steps")
    checks["interrupted at the step after the signal, SIGUSR1 named"] = (
        stopped_at == args.signal_step + 1 and "SIGUSR1" in str(stopped.get("error"))
    )
    empty = sorted(k for k, v in done.items() if v is None and k not in MAY_BE_EMPTY)
    checks[f"completed record has every field (empty: {', '.join(empty) or 'none'})"] = bool(done) and not empty
    checks["completed record is well-formed"] = bool(done) and malformed(done) is None
    checks[f"{args.steps} steps trained"] = done.get("steps") == args.steps
    checks["health ok"] = done.get("health") == "ok"
    if args.expect_train_path:
        checks[f"train_path {args.expect_train_path}"] = done.get("train_path") == args.expect_train_path
    run_dir = Path(str(done.get("run_dir") or stopped.get("run_dir") or work / "none"))
    rows = _metrics(run_dir / "metrics.csv") if (run_dir / "metrics.csv").is_file() else []
    steps = [int(r["step"] or 0) for r in rows]
    checks["metrics.csv: every step once, in order"] = steps == list(range(1, args.steps + 1))
    losses = [float(r["train_loss"]) for r in rows if r.get("train_loss") is not None]
    first = losses[0] if losses else math.nan
    tail = statistics.fmean(losses[-5:]) if len(losses) >= 5 else math.nan
    val = float(done.get("val_loss") or math.nan)
    # byte-level loss starts near ln(256) = 5.55; 40 steps at the size's lr take it well below that
    checks[f"the loss fell: last 5 steps {tail:.3f} and val {val:.3f} <= {args.fall:.2f} x step 1's {first:.3f}"] = (
        tail <= args.fall * first and val <= args.fall * first
    )
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt")) if run_dir.is_dir() else []
    checks["checkpoints: last.ckpt and last.prev.ckpt"] = ckpts == ["last.ckpt", "last.prev.ckpt"]
    config = (run_dir / "config.yaml").read_text(encoding="utf-8") if (run_dir / "config.yaml").is_file() else ""
    if args.expect_precision:
        checks[f"precision {args.expect_precision}"] = f"precision: {args.expect_precision}" in config
    # throughput: every step but the first of each launch (compilation)
    warm = [r for r in rows if r.get("step") not in (1.0, float(args.signal_step + 2)) and r.get("tokens_per_s")]
    tps = statistics.median(float(r["tokens_per_s"] or 0) for r in warm) if warm else None
    fpt = done.get("flops_per_token")
    peak = _peak_flops()
    summary = {
        "command": cmd,
        "launches": [{"rc": rc1, "seconds": round(s1, 2)}, {"rc": rc2, "seconds": round(s2, 2)}],
        "checks": checks,
        "passed": all(checks.values()),
        "train_loss_first": first,
        "train_loss_last5": tail,
        "val_loss": val,
        "tokens_per_s_median": tps,
        "flop_per_s": tps * fpt if tps and fpt else None,
        "mfu": tps * fpt / peak if tps and fpt and peak else None,
        "record": done or stopped,
        "interrupted_record": stopped,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAILED'}] {name}")
    mfu = f", MFU {summary['mfu']:.1%}" if summary["mfu"] else ""
    tput = f"{tps:,.0f} tokens/s{mfu}" if tps else "no throughput"
    _say(f"train: {'passed' if summary['passed'] else 'FAILED'}; launches {s1:.0f} s + {s2:.0f} s, {tput}")
    return 0 if summary["passed"] else 1


# ---- bundle -------------------------------------------------------------------------------------------------
def cmd_bundle(args: argparse.Namespace) -> int:
    out = Path(args.out)
    steps = []
    if Path(args.steps).is_file():
        for line in Path(args.steps).read_text(encoding="utf-8").splitlines():
            name, rc, seconds, limit, outcome = line.split("\t")
            row = {"step": name, "rc": int(rc), "seconds": int(seconds), "limit_s": int(limit), "outcome": outcome}
            steps.append(row)
    parts = sorted(p for p in out.glob("gpu_*.json") if p.name != BUNDLE)
    results: dict[str, Any] = {}
    for p in parts:
        try:
            results[p.stem] = json.loads(p.read_text(encoding="utf-8"))
        except ValueError as e:  # a step killed while writing: keep its text
            results[p.stem] = {"unreadable": str(e), "text": p.read_text(encoding="utf-8", errors="replace")[-4000:]}
    doc = {
        "meta": {"finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dry_run": args.dry_run},
        "steps": steps,
        "results": results,
    }
    tmp = out / (BUNDLE + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    tmp.replace(out / BUNDLE)
    for p in parts:
        p.unlink()
    files = sorted(p.name for p in out.iterdir())
    _say(f"bundled {len(parts)} JSON files into {out / BUNDLE}; {out} holds {len(files)} files: {', '.join(files)}")
    return 0 if len(files) <= 8 else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/gpu_suite_checks.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("install", help="install the wheel folder into a target and check the imports")
    i.add_argument("--wheels", required=True)
    i.add_argument("--target", required=True)
    t = sub.add_parser("train", help="the training step: interrupted once, resumed, checked")
    t.add_argument("--workdir", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, required=True, help="optimizer steps the overrides give")
    t.add_argument("--signal-step", type=int, required=True, help="SIGUSR1 before the step after this one")
    t.add_argument("--fall", type=float, default=0.85, help="loss at the end <= this x the first step's")
    t.add_argument("--expect-train-path", default=None, help="e.g. compiled:regional")
    t.add_argument("--expect-precision", default=None, help="e.g. bf16-mixed")
    t.add_argument("overrides", nargs="*", help="experiments.train overrides (after --)")
    b = sub.add_parser("bundle", help="merge the step JSONs into one file")
    b.add_argument("--out", required=True)
    b.add_argument("--steps", required=True)
    b.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    return {"install": cmd_install, "train": cmd_train, "bundle": cmd_bundle}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
