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

PACKAGE_PARTS = ("attnres", "experiments", "analysis", "sweeps", "conf", "pyproject.toml", "README.md")


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
    # CI installs from this file, and on this machine the installed torch is what it pins
    assert "-r requirements-cpu.txt" in (REPO / ".ci" / "run").read_text()
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
