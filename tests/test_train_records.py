"""experiments/records.py: the results table survives concurrent appenders; identity and provenance helpers."""

from __future__ import annotations

import csv
import json
import multiprocessing as mp
import subprocess
from pathlib import Path

import pytest

from experiments import records


def _append_many(table: str, writer: int, n: int, barrier) -> None:
    barrier.wait()  # both processes start appending at the same moment
    for i in range(n):
        rec = records.make_record(run_id=f"w{writer}_{i:04d}", study="s", status="completed", seed=writer,
                                  val_loss=1.0 + i / 1000, error="a, \"quoted\"\nmultiline error" if i % 7 == 0 else "")
        records.append_row(table, rec)


def test_two_processes_append_concurrently_without_losing_or_corrupting_rows(tmp_path):
    table = tmp_path / "study" / "results.csv"
    n = 150
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_append_many, args=(str(table), w, n, barrier)) for w in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with open(table, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(records.COLUMNS)  # exactly one header
    body = rows[1:]
    assert len(body) == 2 * n and all(len(r) == len(records.COLUMNS) for r in body)
    ids = [r[0] for r in body]
    assert sorted(ids) == sorted(f"w{w}_{i:04d}" for w in (0, 1) for i in range(n))
    by_id = {r["run_id"]: r for r in records.read_rows(table)}
    assert by_id["w1_0007"]["error"] == 'a, "quoted"\nmultiline error' and by_id["w0_0001"]["error"] == ""


def test_record_columns_and_statuses(tmp_path):
    rec = records.make_record(run_id="r", status="failed", error="boom")
    assert list(rec) == list(records.COLUMNS) and rec["val_loss"] is None
    with pytest.raises(KeyError, match="not result-record columns"):
        records.make_record(run_id="r", loss=1.0)
    with pytest.raises(ValueError, match="allowed values: completed, failed, diverged"):
        records.make_record(run_id="r", status="done")
    records.write_json(tmp_path / "results.json", {**rec, "val_loss": float("nan")})
    assert json.loads((tmp_path / "results.json").read_text())["val_loss"] is None


def test_find_completed_and_widening(tmp_path):
    table = tmp_path / "results.csv"
    records.append_row(table, records.make_record(run_id="a", status="failed", config_hash="h1"))
    assert records.find_completed(table, "h1") is None
    records.append_row(table, records.make_record(run_id="a", status="completed", config_hash="h1", val_loss=2.5))
    assert records.find_completed(table, "h1")["val_loss"] == "2.5"
    # a newer schema with an extra column: the table is widened, old rows kept
    records.append_row(table, {**records.make_record(run_id="b", status="completed", config_hash="h2"), "extra": 7})
    rows = records.read_rows(table)
    assert [r["run_id"] for r in rows] == ["a", "a", "b"] and rows[-1]["extra"] == "7" and rows[0]["extra"] == ""


def test_config_hash_is_order_independent():
    assert records.config_hash({"a": 1, "b": {"c": [1, 2]}}) == records.config_hash({"b": {"c": [1, 2]}, "a": 1})
    assert records.config_hash({"a": 1}) != records.config_hash({"a": 2})
    assert len(records.config_hash({})) == 16


def test_git_commit_tolerates_no_repository(tmp_path):
    assert records.git_commit(tmp_path) == ""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    assert records.git_commit(tmp_path) == ""  # no commit yet
    commit = records.git_commit(Path(__file__).resolve().parents[1])
    assert commit == "" or len(commit.split("+")[0]) == 40


def test_find_completed_uses_the_last_record_of_a_run(tmp_path):
    """The trainer's skip rule and the analysis agree: the last record of a config decides."""
    from experiments import records

    table = tmp_path / "results.csv"
    base = {"run_id": "r", "config_hash": "h1"}
    records.append_row(table, records.make_record(**base, status="failed", error="killed"))
    assert records.find_completed(table, "h1") is None
    records.append_row(table, records.make_record(**base, status="completed", val_loss=1.5))
    assert records.find_completed(table, "h1")["status"] == "completed"
    records.append_row(table, records.make_record(**base, status="failed", error="re-run with force, failed"))
    assert records.find_completed(table, "h1") is None
