"""`python -m sweeps.study <name> --from-records DIR`: records committed under docs/results/ are restored into a runs
root, so that a relaunched study skips every run they hold as completed (a lost machine loses nothing committed)."""

from __future__ import annotations

import shutil

from experiments.train import train
from results import ledger
from sweeps.study import restore_records


def test_restored_records_make_a_relaunch_skip_the_completed_runs(train_cfg, tmp_path):
    done = train(train_cfg(runs_root=tmp_path / "machine_a"))
    assert done["status"] == "completed"
    committed = tmp_path / "docs_results" / "smoke"
    shutil.copytree(tmp_path / "machine_a" / "smoke" / "records", committed / "records")
    (committed / "records" / "torn.json").write_text('{"run_id": "x", "sta')  # a torn file: reported, not copied

    study_b = tmp_path / "machine_b" / "smoke"
    copied, problems = restore_records(committed, study_b)
    assert copied == 1
    assert len(problems) == 1
    assert "torn.json" in problems[0]
    assert [r["config_hash"] for r in ledger.read_records(study_b)] == [done["config_hash"]]
    assert (study_b / "results.csv").is_file()

    again = train(train_cfg(runs_root=tmp_path / "machine_b"))
    assert again.get("skipped") is True
    assert again["val_loss"] == done["val_loss"]
    assert not any(p.is_dir() and p.name.startswith("baseline_") for p in study_b.iterdir())  # nothing retrained
    assert restore_records(committed / "records", study_b) == (0, problems)  # idempotent; the records dir works too
