"""Issue 15, install and entry points: the CPU requirements take torch's CPU build, the GPU route replaces it, and
both console scripts work from any directory, installed editable and from a built wheel.

The install tests build into a throwaway virtual environment that sees this interpreter's packages (torch,
Lightning, ...; nothing is downloaded: --no-index, --no-build-isolation) and run the scripts from a directory
that is not the repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TEST_MAX_BYTES
from packaging.requirements import Requirement

PACKAGE_PARTS = ("attnres", "experiments", "results", "analysis", "sweeps", "conf", "pyproject.toml", "README.md")


def _requirements(name: str) -> tuple[list[str], list[Requirement]]:
    options, reqs = [], []
    for line in (REPO / name).read_text().splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            options.append(line)
        else:
            reqs.append(Requirement(line))
    return options, reqs


def test_cpu_requirements_take_the_cpu_build_of_torch_on_linux():
    import torch

    options, reqs = _requirements("requirements-cpu.txt")
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in options  # PyTorch's CPU-only index
    assert "-e .[dev]" in options
    linux = {"sys_platform": "linux", "platform_system": "Linux"}
    (torch_linux,) = [r for r in reqs if r.name == "torch" and r.marker.evaluate(linux)]
    # Only the CPU build satisfies the Linux pin: the public index's CUDA build (plain 2.13.0) does not, so pip
    # can neither pick it nor fall back to it
    assert torch_linux.specifier.contains("2.13.0+cpu")
    assert not torch_linux.specifier.contains("2.13.0")
    (torch_mac,) = [r for r in reqs if r.name == "torch" and r.marker.evaluate({"sys_platform": "darwin"})]
    assert torch_mac.specifier.contains("2.13.0")
    # CI installs from this file (through requirements-cpu-triton.txt), and on this machine the installed torch is
    # what it pins
    assert "-r requirements-cpu-triton.txt" in (REPO / ".ci" / "run").read_text()
    assert "-r requirements-cpu.txt" in _requirements("requirements-cpu-triton.txt")[0]
    if sys.platform == "linux":
        assert torch_linux.specifier.contains(torch.__version__), torch.__version__


def test_gpu_requirements_replace_a_cpu_build():
    options, reqs = _requirements("requirements-gpu.txt")
    (torch_req,) = [r for r in reqs if r.name == "torch"]
    assert not torch_req.specifier.contains("2.13.0+cpu")  # a CPU build already installed does not satisfy it
    assert torch_req.specifier.contains("2.13.0")  # the public index's Linux wheel: the CUDA build
    assert "-e .[dev]" in options
    assert not any("download.pytorch.org/whl/cpu" in o for o in options)
    cpu_pin = next(r for r in _requirements("requirements-cpu.txt")[1] if r.marker.evaluate({"sys_platform": "linux"}))
    assert str(cpu_pin.specifier).replace("+cpu", "").lstrip("=") in str(torch_req.specifier)  # one torch version
    readme = (REPO / "README.md").read_text()
    assert "pip install -r requirements-cpu.txt" in readme
    assert "pip install -r requirements-gpu.txt" in readme


def _venv(path: Path) -> Path:
    # no pip/setuptools of its own: this interpreter's pip installs into it, with this interpreter's setuptools
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(path)], check=True)
    return path / "bin"


def _copy_project(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for part in PACKAGE_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, dest / part)
    return dest


def _pip(bindir: Path, *args: str) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(bindir / "python"),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            *args,
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def _check_console_scripts(bindir: Path, cwd: Path, tmp: Path, data_cache: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="disabled")

    def run(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)

    help_ = run(str(bindir / "attnres-train"), "--help")
    assert help_.returncode == 0, help_.stderr[-2000:]
    assert "experiment:" in help_.stdout, help_.stderr[-2000:]
    assert "model:" in help_.stdout, help_.stderr[-2000:]
    trained = run(
        str(bindir / "attnres-train"),
        "experiment=smoke",
        "logger=none",
        "threads=1",
        "size.tokens=8192",
        "train.eval_count=1",
        "trainer.enable_progress_bar=false",
        f"paths.runs_root={tmp / 'runs'}",
        f"paths.hydra_root={tmp / 'outputs'}",
        f"data.cache_dir={data_cache}",
        f"data.max_bytes={TEST_MAX_BYTES}",
    )
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-3000:]
    assert ": completed, val_loss" in trained.stdout
    analysis = run(str(bindir / "attnres-analysis"), "paper", "--out", str(tmp / "paper"), "--bootstrap", "10")
    assert analysis.returncode == 0, analysis.stderr[-2000:]
    assert (tmp / "paper" / "fit.json").is_file(), analysis.stderr[-2000:]


@pytest.mark.slow
def test_console_scripts_from_a_built_wheel_in_another_directory(tmp_path, data_cache):
    src = _copy_project(tmp_path / "src")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "wheel"),
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    (wheel,) = (tmp_path / "wheel").glob("attnres-*.whl")
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "attnres_conf/train.yaml" in names
    assert "attnres_conf/experiment/smoke.yaml" in names
    bindir = _venv(tmp_path / "venv")
    _pip(bindir, str(wheel))
    shutil.rmtree(src)  # nothing may come from a source tree
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _check_console_scripts(bindir, elsewhere, tmp_path, data_cache)


@pytest.mark.slow
def test_console_scripts_from_an_editable_install_in_another_directory(tmp_path, data_cache):
    src = _copy_project(tmp_path / "src")
    bindir = _venv(tmp_path / "venv")
    _pip(bindir, "-e", str(src))
    # an editable install reads the repository's conf/: an edit there takes effect
    (src / "conf" / "experiment" / "smoke.yaml").write_text(
        (src / "conf" / "experiment" / "smoke.yaml").read_text().replace("study: smoke", "study: smoke_edited")
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _check_console_scripts(bindir, elsewhere, tmp_path, data_cache)
    assert (tmp_path / "runs" / "smoke_edited").is_dir()


# ---- issue 23: the CPU install without triton, where outputs go, the quick study's time ---------------------------
def test_triton_is_an_opt_in_extra_of_the_cpu_install_and_ci_installs_it():
    """#12: a plain CPU install has no triton (bigger than torch); requirements-cpu-triton.txt adds the version
    torch 2.13's CUDA build uses, CI installs that file, and the README states the sizes."""
    _, cpu = _requirements("requirements-cpu.txt")
    assert "triton" not in {r.name for r in cpu}
    options, extra = _requirements("requirements-cpu-triton.txt")
    assert "-r requirements-cpu.txt" in options
    (triton,) = [r for r in extra if r.name == "triton"]
    assert triton.specifier.contains("3.9.0")
    assert triton.marker.evaluate({"sys_platform": "linux"})
    ci = (REPO / ".ci" / "run").read_text()
    assert "-r requirements-cpu-triton.txt" in ci
    readme = (REPO / "README.md").read_text()
    assert "pip install -r requirements-cpu-triton.txt" in readme
    for size in ("1.4 GiB installed", "997 MiB installed", "2.4 GiB in all"):
        assert size in readme, size


def test_the_triton_interpreter_tests_skip_with_a_reason_without_triton(tmp_path):
    """#12: without triton (here hidden behind a package that cannot be imported) the interpreter tests skip,
    saying how to install it; nothing else fails on the import."""
    hidden = tmp_path / "hide" / "triton"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ModuleNotFoundError('no triton here', name='triton')\n")
    env = {**os.environ, "PYTHONPATH": f"{hidden.parent}{os.pathsep}{REPO}", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_triton_kernels.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode in (0, 5), out.stdout[-3000:] + out.stderr[-2000:]  # 5: the module skipped as a whole
    assert "1 skipped" in out.stdout, out.stdout[-2000:]
    assert "warning" not in out.stdout, out.stdout[-2000:]
    assert "triton is not installed: pip install -r requirements-cpu-triton.txt" in out.stdout


def test_outputs_go_under_the_working_directory_and_the_readme_says_so(tmp_path, monkeypatch):
    """#13: runs/ and outputs/ are relative to where a command runs (Hydra does not chdir), next to the console
    scripts in the README."""
    from conftest import compose

    from experiments.run.identity import run_identity

    monkeypatch.chdir(tmp_path)
    cfg = compose(["experiment=smoke"])
    assert run_identity(cfg)[3] == tmp_path.resolve() / "runs" / "smoke"
    assert cfg.paths.hydra_root == "outputs"
    readme = " ".join((REPO / "README.md").read_text().split())
    scripts = readme.index("Both console scripts")
    where = readme.index("Where their outputs go:")
    assert 0 < where - scripts < 600  # beside the console scripts
    assert "are relative to the directory you run the command from (Hydra does not change directory)" in readme
    assert "from another directory they land there" in readme


def test_the_readme_times_the_quick_study_as_a_range_with_the_load():
    """#15: the quick study's time depends on the machine's load: a range, each end with its condition."""
    import re

    readme = " ".join((REPO / "README.md").read_text().split())
    quick = readme[readme.index("`python -m sweeps.study quick` is a first contact") :][:600]
    assert re.search(r"\d+ min \d+ s to \d+ min \d+ s", quick), quick
    assert "with the cores to itself" in quick
    assert "while other jobs were using them" in quick


def test_every_python_package_of_the_project_is_in_the_wheel():
    """Each directory with an __init__.py under a shipped package is listed in pyproject.toml's packages (setuptools
    ships only the listed ones: a sub-package left out imports in the checkout and fails from a wheel)."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tops = {name for name in listed if "." not in name and (REPO / name / "__init__.py").is_file()}
    found = {
        ".".join(init.parent.relative_to(REPO).parts)
        for top in tops
        for init in (REPO / top).rglob("__init__.py")
        if "data" not in init.parent.relative_to(REPO).parts
    }
    assert found - listed == set(), f"add to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"
