"""scripts/config_walk.py, the walk of a run's config from experiments/train.py:train (docs/DEVELOPING.md): its
counts on a small tree with a known answer, and a walk of this checkout."""

from __future__ import annotations

import ast
import importlib.util
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("config_walk", REPO / "scripts" / "config_walk.py")
assert _spec is not None
assert _spec.loader is not None
config_walk = importlib.util.module_from_spec(_spec)
sys.modules["config_walk"] = config_walk  # its dataclasses look their module up
_spec.loader.exec_module(config_walk)


def _walk(tmp_path: Path, files: dict[str, str], every_call: bool = False) -> tuple[list[str], tuple[int, int, int]]:
    """The files of the walk's stays, and its counts (stays, files entered, returns)."""
    for package in config_walk.PACKAGES:
        (tmp_path / package).mkdir(exist_ok=True)
        (tmp_path / package / "__init__.py").touch()
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text), encoding="utf-8")
    project = config_walk.Project(tmp_path)
    start = project.modules["experiments.train"]
    node = start.defs["train"]
    assert isinstance(node, ast.FunctionDef)
    trail = config_walk.walk(project, config_walk.Frame(start, node, None), {"cfg"}, every_call=every_call)
    stays, files_entered, returns, _ = config_walk.count(trail, tmp_path)
    names = [path.stem for path, _ in trail]
    return [n for i, n in enumerate(names) if i == 0 or n != names[i - 1]], (stays, files_entered, returns)


def test_the_walk_follows_the_config_and_counts_returns(tmp_path):
    files = {
        "experiments/train.py": """
            from experiments.checks import check
            from experiments.record import Record
            from results.io import now

            def train(cfg):
                check(cfg.model)          # a name read from the config: followed
                stamp = now()             # no config: not followed (unless every call)
                run = Record(cfg, stamp)  # run holds the config
                run.write()               # a method on it: followed
                check(cfg)                # walked already: not again
            """,
        "experiments/checks.py": """
            def check(node):
                return helper(node)

            def helper(node):
                return node
            """,
        "experiments/record.py": """
            from results.io import now

            class Record:
                def __init__(self, cfg, stamp):
                    self.cfg = cfg

                def write(self):
                    return now(self.cfg)
            """,
        "results/io.py": """
            def now(*args):
                return 0
            """,
    }
    # train -> checks (check, helper) -> train -> record (__init__) -> train -> record (write) -> io -> record -> train
    assert _walk(tmp_path, files) == (
        ["train", "checks", "train", "record", "train", "record", "io", "record", "train"],
        (9, 4, 5),
    )
    # every call: io is entered from train first (then write's call to now() is walked already)
    assert _walk(tmp_path, files, every_call=True)[0] == [
        "train",
        "checks",
        "train",
        "io",
        "train",
        "record",
        "train",
        "record",
        "train",
    ]


def test_the_walk_of_this_checkout_starts_in_train_and_reaches_every_stage():
    project = config_walk.Project(REPO)
    start = project.modules["experiments.train"]
    node = start.defs["train"]
    assert isinstance(node, ast.FunctionDef)
    trail = config_walk.walk(project, config_walk.Frame(start, node, None), {"cfg"})
    stays, files_entered, returns, per_file = config_walk.count(trail, REPO)
    assert str(trail[0][0].relative_to(REPO)) == "experiments/train.py"
    for stage in ("experiments/config/", "experiments/run/", "experiments/training/"):
        assert any(f.startswith(stage) for f in per_file), stage
    assert returns == stays - files_entered > 0
