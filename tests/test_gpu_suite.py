"""Issue 37, the GPU suite made self-contained: the wheels of scripts/gpu_prepare.sh cover every import of the
suite's code paths that the GPU image lacks (scripts/gpu_wheels.txt against scripts/gpu_image_packages.txt, the
imports found statically with `ast`), the plan fits the 9-minute budget, and `bash scripts/gpu_suite.sh --dry-run`
installs wheels of this machine's Python and trains through a SIGUSR1 and a resume, on the CPU.

The tests that download wheels are skipped when the package registry cannot be reached (CI reaches it)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from conftest import REPO

SUITE = REPO / "scripts" / "gpu_suite.sh"
PREPARE = REPO / "scripts" / "gpu_prepare.sh"
IMAGE_LIST = REPO / "scripts" / "gpu_image_packages.txt"
REPO_PACKAGES = {"attnres", "experiments", "results", "analysis", "sweeps"}
BUDGET_S = 540
# Third-party modules imported only inside functions of the suite's modules, on paths the suite does not take.
LAZY_OFF_PATH = {
    "wandb": (
        "logger=wandb only (experiments/training/instantiators.py; finish_wandb reads sys.modules): the suite runs "
        "logger=none"
    ),
    "datasets": "data from Hugging Face (experiments/data/sources.py): the suite trains on the stdlib corpus",
    "tokenizers": "tokenizer=bpe (experiments/data/format.py): the suite uses bytes",
}
# Shipped although the image has them.
SHIPPED_OVER_THE_IMAGE = {
    "filelock": (
        "the image's is torch's, of an unrecorded version; experiments/run/locks.py needs SoftFileLease (>=3.30)"
    )
}
# What the walk must find, or it is not walking the suite at all.
MUST_FIND = {"torch", "triton", "lightning", "hydra", "omegaconf", "filelock", "numpy", "pytest"}
# Linux, CPython 3.12: the GPU image's interpreter (scripts/gpu_prepare.sh)
GPU_MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}


def _checks_module():
    spec = importlib.util.spec_from_file_location("gpu_suite_checks", REPO / "scripts" / "gpu_suite_checks.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


checks = _checks_module()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages() -> dict[str, list[str]]:
    """scripts/gpu_image_packages.txt: distribution (normalized) -> the top-level modules it provides."""
    out = {}
    for line in IMAGE_LIST.read_text(encoding="utf-8").splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            out[_norm(fields[0])] = fields[1:]
    return out


# ---- the static walk -------------------------------------------------------------------------------------------
def _module_file(name: str) -> Path | None:
    parts = name.split(".")
    if parts[0] in REPO_PACKAGES:
        base = REPO.joinpath(*parts)
    elif len(parts) == 1 and (REPO / "tests" / f"{name}.py").is_file():  # conftest, depth_cases (tests/ on the path)
        base = REPO / "tests" / name
    else:
        return None
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return base / "__init__.py" if (base / "__init__.py").is_file() else None


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module, package: str) -> list[tuple[str, bool]]:
    """(absolute module name, imported inside a function) of every import a module executes; `if TYPE_CHECKING:`
    blocks are left out, relative imports resolved against `package`; `from m import x` gives m and m.x."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub, in_function)
                continue
            lazy = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                found.append((mod, in_function))
                found.extend((f"{mod}.{a.name}", in_function) for a in child.names)
            visit(child, lazy)

    visit(tree, False)
    return found


def _lazy_exports(tree: ast.Module, package: str) -> list[str]:
    """The submodules a PEP 562 package names in its `_EXPORTS = {name: submodule}` (experiments/data)."""
    for node in tree.body:
        named = isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets
        )
        if named and isinstance(node.value, ast.Dict):
            return sorted({f"{package}.{v.value}" for v in node.value.values if isinstance(v, ast.Constant)})
    return []


def suite_roots() -> tuple[list[str], list[Path], set[str]]:
    """What scripts/gpu_suite.sh runs: `python -m X` modules, the repository's .py files it names, and the
    `_target_`s of conf/ (Hydra imports them at run time). Third-party `-m` modules (pytest) come back apart."""
    text = SUITE.read_text(encoding="utf-8")
    modules: list[str] = []
    third: set[str] = set()
    for m in sorted(set(re.findall(r"-m ([A-Za-z_][\w.]*)", text))):
        if m.split(".")[0] in REPO_PACKAGES:
            modules += [m, f"{m}.__main__"] if (REPO.joinpath(*m.split(".")) / "__main__.py").is_file() else [m]
        else:
            third.add(m.split(".")[0])
    files = sorted({REPO / f for f in re.findall(r"\b((?:tests|scripts)/\w+\.py)\b", text)})
    if any(f.parent.name == "tests" for f in files):
        files.append(REPO / "tests" / "conftest.py")
    for yaml in sorted((REPO / "conf").rglob("*.yaml")):
        for target in re.findall(r"_target_:\s*([\w.]+)", yaml.read_text(encoding="utf-8")):
            top = target.split(".")[0]
            if top in REPO_PACKAGES:
                modules.append(target.rpartition(".")[0])
            elif top not in sys.stdlib_module_names:
                third.add(top)
    return modules, files, third


def walk_suite() -> tuple[dict[str, set[str]], dict[str, set[str]], set[str]]:
    """Every third-party top-level module the suite's code paths import, split into those imported at module level
    somewhere (name -> importing modules) and those only ever imported inside functions; plus the modules walked."""
    modules, files, third_roots = suite_roots()
    eager: dict[str, set[str]] = {t: {"gpu_suite.sh"} for t in third_roots}
    lazy: dict[str, set[str]] = {}
    seen: set[str] = set()
    todo: list[tuple[str, Path | None]] = [(m, None) for m in modules] + [(f.stem, f) for f in files]
    while todo:
        name, path = todo.pop()
        path = path or _module_file(name)
        if path is None or str(path) in seen:
            continue
        seen.add(str(path))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        parts = name.split(".")
        todo += [(".".join(parts[:i]), None) for i in range(1, len(parts))]  # parent packages run first
        todo += [(m, None) for m in _lazy_exports(tree, name)]
        for mod, in_function in _imports(tree, package):
            top = mod.split(".")[0]
            if not top or top in sys.stdlib_module_names or top == "__future__":
                continue
            if _module_file(mod) is not None:
                todo.append((mod, None))
            elif top in REPO_PACKAGES or _module_file(top) is not None:
                continue  # a name imported from a repository module (from experiments.data import X)
            else:
                (lazy if in_function else eager).setdefault(top, set()).add(name)
    lazy = {k: v for k, v in lazy.items() if k not in eager}
    return eager, lazy, seen


def shipped_modules() -> dict[str, str]:
    """Top-level module -> the distribution of scripts/gpu_wheels.txt that brings it (from this machine's install,
    the versions gpu_prepare.sh downloads)."""
    out = {}
    for name in checks.wheel_names():
        for mod in checks.top_levels(metadata.distribution(name)):
            out[mod] = name
    return out


# ---- static checks -------------------------------------------------------------------------------------------
def test_the_wheels_cover_every_import_of_the_suite_the_image_lacks():
    eager, lazy, walked = walk_suite()
    found = set(eager) | set(lazy)
    assert found >= MUST_FIND, f"the walk missed {MUST_FIND - found}; walked {len(walked)} files"
    assert len(walked) > 40, walked
    in_image = {m for mods in image_packages().values() for m in mods}
    shipped = shipped_modules()
    uncovered = {m: sorted(v) for m, v in eager.items() if m not in in_image and m not in shipped}
    assert not uncovered, f"imported by the suite, neither in the image nor in scripts/gpu_wheels.txt: {uncovered}"
    off_path = {m: sorted(v) for m, v in lazy.items() if m not in in_image and m not in shipped}
    unexplained = {m: v for m, v in off_path.items() if m not in LAZY_OFF_PATH}
    assert not unexplained, (
        f"imported in functions, neither shipped nor known to be off the suite's path: {unexplained}"
    )
    # the ones left out must stay lazy: a module-level import of one would break the suite on the GPU machine
    assert not set(LAZY_OFF_PATH) & set(eager), {m: sorted(eager[m]) for m in set(LAZY_OFF_PATH) & set(eager)}
    # and W&B stays off: every training and benchmark command of the suite runs without it
    text = SUITE.read_text(encoding="utf-8")
    assert "logger=none" in text
    assert "--harness-logger none" in text
    assert "logger=wandb" not in text
    # nothing shipped that the suite does not need (the requirements of what it needs count as needed)
    on_path = found - set(LAZY_OFF_PATH)
    needed = {shipped[m] for m in on_path if m in shipped and m not in in_image} | set(SHIPPED_OVER_THE_IMAGE)
    closure = set(needed)
    for name in sorted(needed):
        closure |= {r for r in _requirements(name) if r in {_norm(n) for n in checks.wheel_names()}}
    extra = {_norm(n) for n in checks.wheel_names()} - {_norm(n) for n in closure}
    assert not extra, f"scripts/gpu_wheels.txt ships what the suite does not import: {extra}"


def _requirements(name: str) -> set[str]:
    """The distributions `name` requires on the GPU machine (Linux, CPython 3.12, no extras)."""
    from packaging.requirements import Requirement

    out = set()
    for line in metadata.requires(name) or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(GPU_MARKERS):
            out.add(_norm(req.name))
    return out


def test_the_wheels_bring_their_requirements():
    """--no-deps installs exactly the list: whatever a shipped distribution requires is in the image or shipped."""
    have = set(image_packages()) | {_norm(n) for n in checks.wheel_names()}
    missing = {n: sorted(_requirements(n) - have) for n in checks.wheel_names() if _requirements(n) - have}
    assert not missing, missing


def test_the_image_list_is_dated_and_names_what_the_issue_says():
    text = IMAGE_LIST.read_text(encoding="utf-8")
    assert re.search(r"as known on 20\d\d-\d\d-\d\d", text)
    image = image_packages()
    assert {"torch", "triton", "lightning", "pandas", "scipy", "matplotlib"} <= set(image)
    assert not {"hydra-core", "omegaconf", "wandb"} & set(image)  # what the image lacks (issue 37)
    assert all(image.values()), [d for d, mods in image.items() if not mods]


def test_the_plan_is_in_priority_order_and_fits_nine_minutes():
    out = subprocess.run(["bash", str(SUITE), "--list"], capture_output=True, text=True, check=True).stdout
    rows = [ln.split() for ln in out.splitlines()]
    plan = [(r[0], int(r[1].rstrip("s"))) for r in rows if r[0] != "total" and "(optional)" not in " ".join(r)]
    names = [n for n, _ in plan]
    assert names[:3] == ["install", "tests", "train"], names
    order = ["eager_194m", "regional_194m", "depth_roofline", "moe", "muon"]
    assert [n for n in names if n in order] == order, names
    assert sum(s for _, s in plan) <= BUDGET_S, plan
    (total,) = [int(r[1].rstrip("s")) for r in rows if r[0] == "total"]
    assert total == sum(s for _, s in plan)


def test_bundle_merges_the_jsons_and_fails_past_eight_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "gpu_suite.log").write_text("log\n")
    (out / "gpu_a.json").write_text(json.dumps({"x": 1}))
    (out / "gpu_b.json").write_text("{torn")
    steps = tmp_path / "steps.tsv"
    steps.write_text("a\t0\t3\t15\tok\nb\t124\t15\t15\tfailed\n")
    assert checks.main(["bundle", "--out", str(out), "--steps", str(steps)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["gpu_results.json", "gpu_suite.log"]
    doc = json.loads((out / "gpu_results.json").read_text())
    assert doc["results"]["gpu_a"] == {"x": 1}
    assert "unreadable" in doc["results"]["gpu_b"]
    assert [s["outcome"] for s in doc["steps"]] == ["ok", "failed"]
    for i in range(8):
        (out / f"other_{i}.txt").write_text("")
    assert checks.main(["bundle", "--out", str(out), "--steps", str(steps)]) == 1


# ---- with wheels (the registry) ------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "PYTHON": sys.executable}


@pytest.fixture(scope="module")
def local_wheels(tmp_path_factory) -> Path:
    """scripts/gpu_prepare.sh --local into a temporary folder (skipped when the registry cannot be reached)."""
    probe = tmp_path_factory.mktemp("probe")
    pin = f"iniconfig=={metadata.version('iniconfig')}"
    reach = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(probe), pin],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if reach.returncode != 0:
        pytest.skip(f"the package registry is not reachable: {reach.stderr.strip()[-200:]}")
    dest = tmp_path_factory.mktemp("wheels")
    proc = subprocess.run(
        ["bash", str(PREPARE), "--local", "--dest", str(dest)], cwd=REPO, env=_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(checks.wheel_names())} wheels for this python" in proc.stdout, proc.stdout
    assert re.search(r"antlr4_python3_runtime-[\w.]+-py3-none-any\.whl", proc.stdout), proc.stdout  # an sdist, built
    return dest


def test_prepare_fails_with_one_line_over_the_limit(tmp_path, local_wheels):
    small = tmp_path / "list.txt"
    small.write_text("iniconfig\n")
    env = {**_env(), "GPU_WHEELS_LIST": str(small), "GPU_CARRY_LIMIT_MIB": "0.001"}
    proc = subprocess.run(
        ["bash", str(PREPARE), "--dest", str(tmp_path / "w")], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "over the 0.001 MiB" in proc.stderr, proc.stderr
    assert sorted(p.name for p in (tmp_path / "w").iterdir())[0].startswith("iniconfig-")  # cp312 flags accepted


def test_install_fails_when_a_wheel_of_the_list_is_missing(tmp_path, local_wheels):
    partial = tmp_path / "partial"
    partial.mkdir()
    for w in local_wheels.glob("*.whl"):
        if not w.name.startswith("hydra_core-"):
            shutil.copy(w, partial)
    cmd = ["scripts/gpu_suite_checks.py", "install", "--wheels", str(partial), "--target", str(tmp_path / "t")]
    proc = subprocess.run(
        [sys.executable, *cmd],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "lacks hydra-core" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_dry_run_installs_the_wheels_and_trains_through_sigusr1_and_a_resume(tmp_path, local_wheels):
    """The suite's first steps on the CPU, as on the GPU: the wheel install (this Python's wheels), the GPU tests
    (skipped here, through the shipped pytest) and the training run at cpu_xs with its interrupt and resume."""
    out = tmp_path / "out"
    env = {**_env(), "OUT": str(out), "WHEEL_DIR": str(local_wheels), "STEPS": "install tests train"}
    proc = subprocess.run(
        ["bash", str(SUITE), "--dry-run"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "hydra from the target" in log
    assert "omegaconf from the target" in log
    assert re.search(r"installed \d+ wheels from .* \(pip --no-index --no-deps --target", log), log[-4000:]
    assert "interrupted by SIGUSR1 at step 21" in log
    assert "resuming from" in log
    assert "FAILED" not in log
    assert sorted(p.name for p in out.iterdir()) == ["gpu_results.json", "gpu_suite.log"]
    doc = json.loads((out / "gpu_results.json").read_text())
    assert doc["meta"]["dry_run"] is True
    assert [(s["step"], s["outcome"]) for s in doc["steps"]] == [("install", "ok"), ("tests", "ok"), ("train", "ok")]
    train = doc["results"]["gpu_train"]
    assert train["passed"], train["checks"]
    assert all(train["checks"].values()), train["checks"]
    assert [launch["rc"] for launch in train["launches"]] == [138, 0]
    assert train["record"]["status"] == "completed"
    assert train["record"]["steps"] == 40
    assert train["record"]["train_path"] == "compiled:regional"
    assert train["val_loss"] < 0.85 * train["train_loss_first"]


def test_bench_times_muon_for_the_suites_muon_step():
    """The muon step's `experiments.bench --optimizer muon`: the timed step runs Muon + AdamW
    (experiments.training.optim)."""
    import torch

    from experiments.bench import shapes
    from experiments.bench.runner import build_runner
    from experiments.bench.settings import parse_args
    from experiments.training.optim import MuonWithAdamW

    assert parse_args(["--optimizer", "muon"]).optimizer == "muon"
    assert parse_args([]).optimizer == "adamw"
    with pytest.raises(SystemExit):
        parse_args(["--optimizer", "sgd"])
    runner = build_runner(
        shapes.TINY, "block", torch.device("cpu"), 0, False, False, False, "auto", optimizer_name="muon"
    )
    assert isinstance(runner.optimizer, MuonWithAdamW)
    before = {n: p.detach().clone() for n, p in runner.model.named_parameters()}
    runner.train_step()
    # every weight moved but the residual scheme's zero-gradient ones at step 1 (zero-init queries: key-norm gains)
    still = [n for n, p in runner.model.named_parameters() if torch.equal(before[n], p)]
    assert all(n.startswith("residual.") for n in still), still
