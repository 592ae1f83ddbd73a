"""results/ledger.py: the ledger (one immutable record file per record, results.csv derived from them)
survives concurrent writers, torn and garbled bytes; identity and provenance helpers."""

from __future__ import annotations

import csv
import io
import json
import multiprocessing as mp
import subprocess
import sys
from pathlib import Path

import pytest

from results import ledger
from results.config_hash import config_hash
from results.io import git_commit, write_json
from results.record import COLUMNS


def _done(**fields):
    """A valid completed record (the schema requires a positive val_loss and compute)."""
    return ledger.make_record(**{"status": "completed", "val_loss": 2.5, "pflops_days": 1e-9, **fields})


def _append_many(study: str, writer: int, n: int, barrier) -> None:
    barrier.wait()  # both processes start writing at the same moment
    for i in range(n):
        rec = _done(
            run_id=f"w{writer}_{i:04d}",
            study="s",
            seed=writer,
            val_loss=1.0 + i / 1000,
            error='a, "quoted"\nmultiline error' if i % 7 == 0 else "",
        )
        ledger.add_record(study, rec)


def test_two_processes_write_concurrently_without_losing_or_corrupting_rows(tmp_path):
    table = tmp_path / "study" / "results.csv"
    n = 60
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_append_many, args=(str(table.parent), w, n, barrier)) for w in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with open(table, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(COLUMNS)  # exactly one header
    body = rows[1:]
    assert len(body) == 2 * n
    assert all(len(r) == len(COLUMNS) for r in body)
    ids = [r[0] for r in body]
    assert sorted(ids) == sorted(f"w{w}_{i:04d}" for w in (0, 1) for i in range(n))
    by_id = {r["run_id"]: r for r in ledger.read_rows(table)}
    assert by_id["w1_0007"]["error"] == 'a, "quoted"\nmultiline error'
    assert by_id["w0_0001"]["error"] == ""
    assert len(list((table.parent / "records").glob("*.json"))) == 2 * n  # one immutable file per record


def test_record_columns_and_statuses(tmp_path):
    rec = ledger.make_record(run_id="r", status="failed", error="boom")
    assert list(rec) == list(COLUMNS)
    assert rec["val_loss"] is None
    with pytest.raises(KeyError, match="not result-record columns"):
        ledger.make_record(run_id="r", loss=1.0)
    with pytest.raises(ValueError, match="allowed values: completed, failed, diverged, interrupted"):
        ledger.make_record(run_id="r", status="done")
    write_json(tmp_path / "results.json", {**rec, "val_loss": float("nan")})
    assert json.loads((tmp_path / "results.json").read_text())["val_loss"] is None


def test_find_completed_and_widening(tmp_path):
    study = tmp_path / "study"
    ledger.add_record(study, ledger.make_record(run_id="a", status="failed", config_hash="h1"))
    assert ledger.find_completed(study, "h1") is None
    ledger.add_record(study, _done(run_id="a", config_hash="h1", val_loss=2.5))
    assert ledger.find_completed(study, "h1")["val_loss"] == 2.5
    # a newer schema with an extra column: the table is widened, old rows kept
    ledger.add_record(study, {**_done(run_id="b", config_hash="h2"), "extra": 7})
    rows = ledger.read_rows(study / "results.csv")
    assert [r["run_id"] for r in rows] == ["a", "a", "b"]
    assert rows[-1]["extra"] == "7"
    assert rows[0]["extra"] == ""


def test_config_hash_is_order_independent():
    assert config_hash({"a": 1, "b": {"c": [1, 2]}}) == config_hash({"b": {"c": [1, 2]}, "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})
    assert len(config_hash({})) == 16


def test_git_commit_tolerates_no_repository(tmp_path):
    assert git_commit(tmp_path) == ""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    assert git_commit(tmp_path) == ""  # no commit yet
    commit = git_commit(Path(__file__).resolve().parents[1])
    assert commit == "" or len(commit.split("+")[0]) == 40


def test_find_completed_uses_the_last_record_of_a_run(tmp_path):
    """The trainer's skip rule and the analysis agree: the last record of a config decides."""
    study = tmp_path / "study"
    base = {"run_id": "r", "config_hash": "h1"}
    ledger.add_record(study, ledger.make_record(**base, status="failed", error="killed"))
    assert ledger.find_completed(study, "h1") is None
    ledger.add_record(study, _done(**base, val_loss=1.5))
    assert ledger.find_completed(study, "h1")["status"] == "completed"
    ledger.add_record(study, ledger.make_record(**base, status="failed", error="re-run with force, failed"))
    assert ledger.find_completed(study, "h1") is None


# ---- issue 15, items 1-3: bad bytes, torn rows and malformed records never hide another run ------------------
def _table(path: Path, recs: list[dict]) -> None:
    """A results.csv in the current layout (every column, each row with its record_id), written row by row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        for i, r in enumerate(recs):
            w.writerow([ledger._cell({**r, "record_id": f"rid{i}"}.get(c)) for c in COLUMNS])


def test_a_non_utf8_row_is_reported_with_file_and_line_and_later_launches_still_work(tmp_path):
    study = tmp_path / "study"
    table = study / "results.csv"
    ledger.add_record(study, _done(run_id="a", config_hash="ha"))
    ledger.add_record(study, _done(run_id="b", config_hash="hb"))
    lines = table.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b"a,", b"\xffa,", 1)  # one bad byte in run a's row (file line 2)
    table.write_bytes(b"\n".join(lines))
    with pytest.warns(ledger.LedgerWarning, match=rf"{table}:2: not valid UTF-8 \(byte 0xff"):
        assert [r["run_id"] for r in ledger.read_rows(table)] == ["b"]
    with pytest.warns(ledger.LedgerWarning, match=rf"{table}:2: not valid UTF-8"):
        assert ledger.find_completed(study, "ha")["run_id"] == "a"  # the records are the truth: a is not hidden
    with pytest.warns(ledger.LedgerWarning, match=r"results.csv:2: not valid UTF-8"):
        ledger.add_record(study, _done(run_id="c", config_hash="hc"))  # a new record is written and tabled
    assert [r["run_id"] for r in ledger.read_rows(table)] == ["a", "b", "c"]
    assert b"\xffa," in (study / "results.csv.rejected").read_bytes()  # the unreadable line is kept, not lost


def test_a_torn_last_row_cannot_swallow_the_next_record(tmp_path):
    study = tmp_path / "study"
    table = study / "results.csv"
    ledger.add_record(study, _done(run_id="a", config_hash="ha"))
    ledger.add_record(study, _done(run_id="b", config_hash="hb", error='x "quoted", and\nmultiline'))
    data = table.read_bytes()
    table.write_bytes(data[: data.index(b"multiline")])  # cut inside run b's quoted field: no newline, open quote
    with pytest.warns(ledger.LedgerWarning, match=r"results.csv:3: .*row skipped"):
        assert [r["run_id"] for r in ledger.read_rows(table)] == ["a"]
    with pytest.warns(ledger.LedgerWarning, match=r"results.csv:3: .*row skipped"):
        ledger.add_record(study, _done(run_id="c", config_hash="hc"))
    rows = ledger.read_rows(table)
    assert [r["run_id"] for r in rows] == ["a", "b", "c"]  # re-derived from the records, whole
    assert ledger.find_completed(study, "hc")["run_id"] == "c"
    # a table torn mid-row, then appended to: the glued line is rejected, the row after it is read
    _table(table, [_done(run_id="d", config_hash="hd")])
    data = table.read_bytes()
    table.write_bytes(data[:-20])  # torn, no trailing newline
    with open(table, "ab") as f:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(
            [ledger._cell({**_done(run_id="e", config_hash="he"), "record_id": "rid-e"}.get(c)) for c in COLUMNS]
        )
        f.write(buf.getvalue().encode() * 2)  # glued onto the torn row, then once more on its own line
    with pytest.warns(ledger.LedgerWarning, match=r"fields where the header has"):
        rows = ledger.read_rows(table)
    assert [r["run_id"] for r in rows] == ["e"]


def test_a_malformed_last_record_does_not_hide_the_valid_completed_one(tmp_path):
    study = tmp_path / "study"
    ledger.add_record(study, _done(run_id="r", config_hash="h1", val_loss=1.5))
    garbled = study / "records" / "99999999T999999.999999Z_r_garbled.json"
    garbled.write_bytes(b'{"run_id": "r", "config_hash": "h1", "status": "compl\xff')  # torn and garbled
    bad_status = study / "records" / "99999999T999999.999999Z_r_x.json"
    bad_status.write_text(json.dumps({**_done(run_id="r", config_hash="h1"), "status": "complet"}))
    with pytest.warns(ledger.LedgerWarning) as caught:
        done = ledger.find_completed(study, "h1")
    assert done is not None
    assert done["val_loss"] == 1.5
    messages = " ".join(str(w.message) for w in caught)
    assert str(garbled) in messages
    assert str(bad_status) in messages
    assert "'complet' is not one of" in messages


def test_rebuild_derives_the_table_from_the_records(tmp_path):
    study = tmp_path / "study"
    for i in range(3):
        ledger.add_record(study, _done(run_id=f"r{i}", config_hash=f"h{i}"))
    table = study / "results.csv"
    table.write_bytes(b"garbage\xff\n")
    out = subprocess.run(
        [sys.executable, "-m", "experiments.records", "rebuild", str(study)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.returncode == 0, out.stderr
    assert [r["run_id"] for r in ledger.read_rows(table)] == ["r0", "r1", "r2"]
    assert all(r["record_id"] for r in ledger.read_rows(table))


def _old_table(path: Path, recs: list[dict]) -> None:
    """A results.csv as attnres wrote it before records/ existed (header + appended rows, no record_id)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = list(COLUMNS[: COLUMNS.index("health") + 1])
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        for r in recs:
            w.writerow([ledger._cell(r.get(c)) for c in header])


def test_a_table_from_before_records_is_reported_on_one_line_and_left_for_the_migration(tmp_path):
    """Rows without a record_id (an older layout) are not read: one line names the table, the rows and the
    migration command. The table is not rewritten (the migration imports it), and new runs are written and found."""
    study = tmp_path / "study"
    table = study / "results.csv"
    _old_table(
        table,
        [
            ledger.make_record(run_id="a", config_hash="ha", status="failed", finished_at="2026-01-01T00:00:00+00:00"),
            _done(run_id="a", config_hash="ha", finished_at="2026-01-01T00:05:00+00:00"),
            _done(run_id="b", config_hash="hb", finished_at="2026-01-01T00:03:00+00:00"),
        ],
    )
    before = table.read_bytes()
    with pytest.warns(ledger.LedgerWarning) as caught:
        assert ledger.find_completed(study, "ha") is None
    (message,) = [str(w.message) for w in caught]
    assert "\n" not in message
    assert message.startswith(f"{table}: 3 row(s) without a record_id (lines 2-4)")
    assert f":scripts/migrate_records.py | python - {study}`" in message
    with pytest.warns(ledger.LedgerWarning, match="without a record_id"):
        ledger.add_record(study, _done(run_id="c", config_hash="hc"))
    with pytest.warns(ledger.LedgerWarning, match="without a record_id"):
        assert ledger.find_completed(study, "hc")["run_id"] == "c"
    assert table.read_bytes() == before


def test_a_record_file_of_an_older_layout_is_reported_on_one_line_and_the_others_load(tmp_path):
    """A record file without the newer fields is skipped with one line naming it, the missing fields and the
    migration command; the study's other records are read, tabled and analysed."""
    from analysis.io.runs import AnalysisWarning, load_results

    study = tmp_path / "study"
    ledger.add_record(study, _done(run_id="a", config_hash="ha", study="ablations", study_kind="ablations"))
    old = {c: v for c, v in _done(run_id="b", config_hash="hb").items() if c in COLUMNS[: COLUMNS.index("health")]}
    old_file = study / "records" / "20260101T000000.000000Z_b_old.json"
    old_file.write_text(json.dumps(old))
    with pytest.warns(ledger.LedgerWarning) as caught:
        ledger.rebuild_table(study)
    (message,) = [str(w.message) for w in caught]
    assert "\n" not in message
    assert message.startswith(f"{old_file}: an older record layout without the field(s) health, dataset,")
    assert f":scripts/migrate_records.py | python - {study}`" in message
    assert message.endswith("; record skipped")
    assert [r["run_id"] for r in ledger.read_rows(study / "results.csv")] == ["a"]
    with pytest.warns(AnalysisWarning, match=str(old_file)):
        df = load_results(study)
    assert list(df["run_id"]) == ["a"]
    assert list(df["study_kind"]) == ["ablations"]


def test_the_migration_commit_holds_the_migration_script():
    """The one-line error names a commit and a script in it: that commit must exist in this history and hold the
    script (a rebase that changes the hash must update results.record.MIGRATION_COMMIT)."""
    from results.record import MIGRATION_COMMIT

    repo = Path(__file__).resolve().parents[1]
    shallow = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    if shallow != "false":  # not a git checkout, or a shallow clone without the history
        pytest.skip(f"no full git history at {repo}")
    out = subprocess.run(
        ["git", "cat-file", "-e", f"{MIGRATION_COMMIT}:scripts/migrate_records.py"], cwd=repo, capture_output=True
    )
    assert out.returncode == 0, out.stderr
