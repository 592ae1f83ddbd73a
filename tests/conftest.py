"""Shared fixtures: Hydra composition of conf/ (no Hydra app, no output dirs) and a tiny cached corpus.

Tests never touch the network or the user's W&B: WANDB_MODE=disabled unless a test sets offline itself.
Torch uses one thread (OMP_NUM_THREADS=1, set before anything imports torch; two test processes side by side on
2 cores would otherwise thrash). Without a GPU, Triton runs in its interpreter (TRITON_INTERPRET=1, see below).
Nothing here imports torch itself (the analysis tests check they never need it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
if str(REPO) not in sys.path:  # `pytest` from a fresh clone without `pip install -e .`
    sys.path.insert(0, str(REPO))

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# tests/test_triton_kernels.py runs the CUDA depth kernels on CPU tensors in Triton's interpreter, which is chosen
# when triton is imported (torch.utils.flop_counter imports it, so already at collection): on where no GPU device
# exists. Nothing else launches a Triton kernel on the CPU; on a GPU machine tests/test_gpu.py runs them compiled.
if not any(os.path.exists(dev) for dev in ("/dev/nvidiactl", "/dev/kfd")):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Slice of the stdlib corpus the training tests use (prepared once per session into a temp cache).
TEST_MAX_BYTES = 1_500_000


def compose(overrides: list[str] | tuple[str, ...] = (), config_name: str = "train", return_hydra_config: bool = False):
    """Compose conf/<config_name>.yaml with overrides, the way `python -m experiments.train` would (with
    return_hydra_config: also the `hydra` node, e.g. a sweep's hydra.sweeper.params). Hydra stays initialised for
    the rest of the test (fast repeated composes)."""
    from hydra.core.global_hydra import GlobalHydra

    from experiments.config import compose as composing

    global _HYDRA
    if _HYDRA is None or not GlobalHydra.instance().is_initialized():
        composing.initialize()
        _HYDRA = True
    return composing.compose(overrides, config_name=config_name, return_hydra_config=return_hydra_config)


_HYDRA = None


@pytest.fixture(autouse=True)
def _release_hydra():
    """compose() keeps Hydra initialised within a test (fast repeated composes); release it afterwards so that
    tests which initialise Hydra themselves start from a clean GlobalHydra."""
    yield
    global _HYDRA
    if _HYDRA is not None and "hydra" in sys.modules:
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()
        _HYDRA = None


@pytest.fixture(autouse=True)
def _forget_interrupts():
    """A test that interrupts a run in this process leaves the signal remembered (experiments.run.interrupts: a launch
    starts no run after one); each test starts without."""
    yield
    if "experiments.run.interrupts" in sys.modules:
        sys.modules["experiments.run.interrupts"].reset()


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> Path:
    """A temp dataset cache holding the TEST_MAX_BYTES stdlib slice (prepared once per session)."""
    from experiments.data import prepare_stdlib

    cache = tmp_path_factory.mktemp("data_cache")
    prepare_stdlib(cache, max_bytes=TEST_MAX_BYTES, progress=False)
    return cache


@pytest.fixture
def train_cfg(tmp_path, data_cache):
    """Factory: a cheap, fully offline training config (smoke preset) writing under tmp_path."""

    def make(*overrides: str, runs_root: Path | None = None):
        base = [
            "experiment=smoke",
            f"paths.runs_root={runs_root or tmp_path / 'runs'}",
            f"paths.hydra_root={tmp_path / 'outputs'}",
            f"data.cache_dir={data_cache}",
            f"data.max_bytes={TEST_MAX_BYTES}",
            "threads=1",
            "trainer.enable_progress_bar=false",
        ]
        return compose(base + list(overrides))

    return make


def smoke_overrides(runs_root: Path, data_cache: Path) -> list[str]:
    """The overrides of a smoke run on the test corpus under ``runs_root``: one thread, no progress bar."""
    return [
        "experiment=smoke",
        f"paths.runs_root={runs_root}",
        f"data.cache_dir={data_cache}",
        f"data.max_bytes={TEST_MAX_BYTES}",
        "threads=1",
        "trainer.enable_progress_bar=false",
    ]


def cli_overrides(tmp_path: Path, data_cache: Path) -> list[str]:
    """The overrides of a CLI smoke run on the test corpus: one thread, a metrics row per step, a checkpoint every
    5 steps, Hydra's output under tmp_path (add paths.runs_root)."""
    return [
        "experiment=smoke",
        f"data.cache_dir={data_cache}",
        f"data.max_bytes={TEST_MAX_BYTES}",
        "threads=1",
        "trainer.enable_progress_bar=false",
        "train.log_every=1",
        "callbacks.model_checkpoint.every_n_train_steps=5",
        f"paths.hydra_root={tmp_path / 'outputs'}",
    ]


def run_cli(args: list[str], env_extra: dict[str, str] | None = None, timeout: float = 300):
    """`python -m experiments.train <args>` in a subprocess from the repo root (returns CompletedProcess)."""
    import subprocess

    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
        **(env_extra or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "experiments.train", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


_NAMESPACE: list[str] | bool | None = False  # not probed yet


def mount_namespace() -> list[str] | None:
    """The command prefix that runs a command in a private mount namespace (so a test may mount a tmpfs or a
    read-only bind mount that nothing else sees): ``unshare --mount`` as root, else with a user namespace that maps
    this user to root; None where neither works (the test then skips)."""
    import shutil
    import subprocess

    global _NAMESPACE
    if _NAMESPACE is False:
        _NAMESPACE = None
        if shutil.which("unshare") and sys.platform == "linux":
            prefix = (
                ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]
            )
            probe = subprocess.run([*prefix, "true"], capture_output=True)
            _NAMESPACE = prefix if probe.returncode == 0 else None
    return _NAMESPACE  # type: ignore[return-value]


def run_cli_mounted(mount: str, args: list[str], after: str = "true", timeout: float = 300):
    """`python -m experiments.train <args>` after the shell commands `mount` (e.g. a tmpfs or a read-only bind mount)
    and before `after` (e.g. copying files off that tmpfs), all inside a private mount namespace (mount_namespace();
    the test must skip when it is None). The return code is the training command's."""
    import subprocess

    prefix = mount_namespace()
    assert prefix is not None
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    script = f'{mount} || exit 99; "$0" -m experiments.train "$@"; rc=$?; {after}; exit $rc'
    return subprocess.run(
        [*prefix, "sh", "-c", script, sys.executable, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---- a live one-node SLURM cluster (scripts/slurm_cluster.sh) for tests/test_slurm_live.py -------------------------
# One cluster per pytest session, however many xdist workers: the controller (pytest_configure without
# ``workerinput``; the only process without xdist) names a directory in ATTNRES_SLURM_SESSION, which its workers
# inherit; the first worker that needs the cluster starts it there under a file lock, the others find it running,
# and the controller stops it at pytest_unconfigure (after every worker is done). A cluster that was already up
# (SLURM_CONF set and answering, e.g. started by .ci/run) is used and left running.
SLURM_SCRIPT = REPO / "scripts" / "slurm_cluster.sh"
SLURM_SESSION_ENV = "ATTNRES_SLURM_SESSION"


def pytest_configure(config) -> None:
    if not hasattr(config, "workerinput") and SLURM_SESSION_ENV not in os.environ:
        import tempfile

        os.environ[SLURM_SESSION_ENV] = tempfile.mkdtemp(prefix="attnres-slurm-")
        config._attnres_slurm_session = os.environ[SLURM_SESSION_ENV]


def pytest_unconfigure(config) -> None:
    session = getattr(config, "_attnres_slurm_session", None)
    if session is None:
        return
    import shutil
    import subprocess

    if (Path(session) / "started").exists():
        subprocess.run(["bash", str(SLURM_SCRIPT), "stop", str(Path(session) / "cluster")], capture_output=True)
    shutil.rmtree(session, ignore_errors=True)


def _slurm_answers(conf: str) -> bool:
    import subprocess

    try:
        ping = subprocess.run(
            ["scontrol", "ping"], env={**os.environ, "SLURM_CONF": conf}, capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return ping.returncode == 0 and "UP" in ping.stdout


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """The slurm.conf of a running one-node SLURM cluster, exported as SLURM_CONF for this process and the processes
    it starts (sbatch, squeue, and submitit in a launch); skips where the packages cannot be installed (not root,
    no apt-get, no network)."""
    import fcntl
    import subprocess

    given = os.environ.get("SLURM_CONF")
    if given and _slurm_answers(given):
        return given
    session = Path(os.environ[SLURM_SESSION_ENV])  # set by pytest_configure in the controller
    cluster = session / "cluster"
    conf = str(cluster / "slurm.conf")
    with open(session / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (session / "skip").exists():
            pytest.skip((session / "skip").read_text())
        if not ((session / "started").exists() and _slurm_answers(conf)):
            (session / "started").touch()  # the controller stops whatever part of it started
            env = {**os.environ, "ATTNRES_SLURM_CPUS": str(2 * (os.cpu_count() or 1))}  # jobs mostly wait: side by side
            start = subprocess.run(  # from the session's directory: nothing the daemons leave lands in the repo
                ["bash", str(SLURM_SCRIPT), "start", str(cluster)], cwd=session, env=env, capture_output=True, text=True
            )
            if start.returncode == 3:  # the packages are missing and cannot be installed here
                reason = f"no SLURM cluster: {start.stderr.strip().splitlines()[-1]}"
                (session / "skip").write_text(reason)
                pytest.skip(reason)
            assert start.returncode == 0, f"scripts/slurm_cluster.sh start failed:\n{start.stdout}\n{start.stderr}"
    os.environ["SLURM_CONF"] = conf
    return conf
