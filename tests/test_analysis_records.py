"""Reading result records (analysis.io.runs, results.ledger) and the input errors of the analysis."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from synthetic_records import synthetic_ladder, write_study

from analysis.io.runs import AnalysisWarning, load_results, load_wandb, scaling_runs, select_completed, study_kinds
from analysis.laws.fit_options import FitOptions
from analysis.laws.scaling_ladder import analyse_scaling, check_ladder

REPO = Path(__file__).resolve().parents[1]


def test_missing_columns_are_listed_together() -> None:
    df = synthetic_ladder().drop(columns=["pflops_days", "val_loss"])
    df.attrs["source"] = "results.csv"
    with pytest.raises(
        ValueError, match=r"results.csv lacks column\(s\) needed for a scaling fit: pflops_days, val_loss"
    ):
        select_completed(df)


def test_unfinished_runs_are_excluded_and_named() -> None:
    df = synthetic_ladder({"full_attnres": 1.25}, seeds=(0, 1))
    df.loc[0, ["status", "val_loss", "error"]] = ["failed", float("nan"), "CUDA error"]
    df.loc[3, ["status", "val_loss"]] = ["diverged", float("nan")]
    dup = df.iloc[[5]].assign(val_loss=9.0)  # an older record of run 5, appended again
    df = pd.concat([dup, df], ignore_index=True)
    with pytest.warns(AnalysisWarning, match="excluded 3 run") as rec:
        kept, excluded = select_completed(df)
    msg = str(rec[0].message)
    for i in (1, 4):  # rows shifted by the prepended duplicate
        assert df.loc[i, "run_id"] in msg
    assert "status='failed': CUDA error" in msg
    assert "duplicate run_id" in msg
    assert len(kept) == len(df) - 3
    assert (kept["status"] == "completed").all()
    assert 9.0 not in kept["val_loss"].to_numpy()  # the last record of a duplicated run wins
    assert {e["reason"].split(":")[0] for e in excluded} >= {"status='failed'", "status='diverged'"}


def test_too_few_sizes_is_a_clear_error() -> None:
    df = synthetic_ladder({"full_attnres": 1.25}, seeds=(0,))
    short = df[~((df["variant"] == "full_attnres") & ~df["size"].isin(["cpu_xs", "cpu_s"]))]
    with pytest.raises(
        ValueError, match=r"variant 'full_attnres' has completed runs at only 2 size\(s\) \(cpu_xs, cpu_s\)"
    ):
        check_ladder(short, "baseline")
    with pytest.warns(AnalysisWarning, match="skipped"):
        assert check_ladder(short, "baseline", skip_incomplete=True) == ["baseline"]
    single = synthetic_ladder({"full_attnres": 1.25}, n_sizes=1)
    with pytest.raises(ValueError, match="only 1 size"):
        analyse_scaling(single, FitOptions(B=10))
    with pytest.raises(ValueError, match=r"no completed runs of the baseline 'base'.*--baseline"):
        check_ladder(df, "base")


def test_several_ladder_studies_need_a_choice() -> None:
    df = pd.concat([synthetic_ladder(study="a"), synthetic_ladder(study="b")], ignore_index=True)
    with pytest.raises(ValueError, match=r"several scaling studies \(a, b\).*--study"):
        scaling_runs(df)
    assert set(scaling_runs(df, "b")["study"]) == {"b"}
    with pytest.raises(ValueError, match="study == 'c'"):
        scaling_runs(df, "c")


def test_load_results_from_table_directory_and_run_files(tmp_path: Path) -> None:
    path = write_study(tmp_path / "study", curves=False, diagnostics=False, extra_studies=False)
    from_csv = load_results(path)
    from_dir = load_results(path.parent)
    assert len(from_csv) == len(from_dir) == 31  # 5 sizes x 3 variants x 2 seeds + 1 diverged run
    path.unlink()  # no results.csv: fall back to every run's results.json
    from_json = load_results(path.parent)
    cols = ["run_id", "variant", "size", "seed", "status", "pflops_days"]
    a = from_csv[cols].sort_values("run_id").reset_index(drop=True)
    b = from_json[cols].sort_values("run_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_dtype=False)
    one = load_results(path.parent / from_csv["run_dir"].iloc[0] / "results.json")
    assert len(one) == 1
    assert one.attrs["base_dir"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_results(tmp_path / "missing.csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"neither results\.csv nor any results\.json"):
        load_results(tmp_path / "empty")


def test_load_wandb_maps_summary_and_state() -> None:
    """W&B is read through wandb.Api(); here a stand-in API (no network) checks the field mapping."""
    recs = synthetic_ladder(seeds=(0,)).head(3).to_dict("records")

    def run(rec: dict, state: str, in_config: bool = False) -> SimpleNamespace:
        summary = {f"results/{k}": v for k, v in rec.items() if k not in ("status", "study")}
        config = {}
        if in_config:  # identity fields only in the logged Hydra config: nested, and flattened with "/"
            config = {"n_layers": rec["n_layers"], "model": {"variant": rec["variant"]}, "size/name": rec["size"]}
            for k in ("n_layers", "variant", "size"):
                summary.pop(f"results/{k}")
        return SimpleNamespace(summary=summary, config=config, name=rec["run_id"], group="cpu_ladder", state=state)

    class FakeApi:
        def __init__(self) -> None:
            self.calls: list = []

        def runs(self, path: str, filters: dict | None = None) -> list:
            self.calls.append((path, filters))
            return [run(recs[0], "finished"), run(recs[1], "crashed"), run(recs[2], "finished", in_config=True)]

    api = FakeApi()
    df = load_wandb("me/attnres", "cpu_ladder", api=api)
    assert api.calls == [("me/attnres", {"group": "cpu_ladder"})]
    assert list(df["status"]) == ["completed", "failed", "completed"]
    assert set(df["study"]) == {"cpu_ladder"}
    for key in ("n_layers", "variant", "size"):
        assert df[key].tolist() == [r[key] for r in recs]
    assert df["val_loss"].tolist() == pytest.approx([r["val_loss"] for r in recs])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AnalysisWarning)
        kept, excluded = select_completed(df)
    assert len(kept) == 2
    assert excluded[0]["run_id"] == recs[1]["run_id"]


def test_analysis_never_imports_the_training_stack() -> None:
    code = (
        "import sys; import analysis.studies.pipeline, analysis.studies.paper, analysis.render.figures; "
        "import analysis.__main__; "
        "bad = [m for m in ('torch', 'lightning', 'hydra', 'wandb') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def _documented_columns() -> list[tuple[str, str]]:
    """(column, documented type) of each row of the table in docs/results_schema.md §1."""
    import re

    doc = (REPO / "docs" / "results_schema.md").read_text()
    section = doc.split("## 1.", 1)[1].split("## 2.", 1)[0]
    table = section.split("| column | type | meaning |", 1)[1].split("\n\n", 1)[0]
    return [
        (c, line.split("|")[2].split()[0])
        for line in table.splitlines()
        if line.startswith("| `")
        for c in re.findall(r"`([a-z_0-9]+)`", line.split("|")[1])
    ]


def test_the_record_schema_is_the_documented_table():
    """One definition (results.record.RunRecord): its fields, in order and with their types, are the table of
    docs/results_schema.md §1, and the writer's columns are its fields."""
    from results import ledger
    from results import record as schema

    assert [c for c, _ in _documented_columns()] == list(schema.COLUMNS)
    assert {c: t for c, t in _documented_columns()} == {c: schema.COLUMN_TYPES[c].__name__ for c in schema.COLUMNS}
    assert list(ledger.make_record(run_id="r", status="completed")) == list(schema.COLUMNS)
    assert set(schema.NUMERIC_COLUMNS) | set(schema.STR_COLUMNS) == set(schema.COLUMNS)
    # new fields are appended, never inserted: the newest, in the order they were added
    assert schema.COLUMNS[-8:] == (
        "study_kind",
        "train_path",
        "cpu_time_s",
        "optimizer",
        "lr_schedule",
        "step_cpu_s",
        "budget",
        "trunk_id",
    )
    assert set(schema.REQUIRED + schema.REQUIRED_IF_COMPLETED) <= set(schema.COLUMNS)


def test_the_writer_builds_records_through_the_schema():
    from results.ledger import make_record
    from results.record import COLUMNS

    rec = make_record(run_id="r", status="completed", study="s", study_kind="ablations", seed=3)
    assert list(rec) == list(COLUMNS)
    assert rec["study_kind"] == "ablations"
    assert rec["val_loss"] is None
    with pytest.raises(KeyError, match="not result-record columns: \\['colour'\\]"):
        make_record(run_id="r", colour="red")
    with pytest.raises(ValueError, match="status='done'; allowed values: completed, failed"):
        make_record(run_id="r", status="done")
    with pytest.raises(ValueError, match="study_kind='ladder'; allowed values: scaling, lr, block_size"):
        make_record(run_id="r", status="completed", study_kind="ladder")


def test_malformed_names_what_breaks_the_schema():
    from results.record import malformed

    ok = {"run_id": "r", "status": "completed", "val_loss": "2.5", "pflops_days": "1e-9", "seed": "1"}
    assert malformed(ok) is None
    assert malformed({**ok, "study_kind": ""}) is None
    assert malformed({**ok, "study_kind": "lr"}) is None
    assert malformed({**ok, "run_id": " "}) == "no run_id"
    assert malformed({**ok, "status": "ok"}).startswith("status='ok' is not one of")
    assert malformed({**ok, "study_kind": "ladder"}).startswith("study_kind='ladder' is not one of scaling")
    assert malformed({**ok, "tokens": "12x"}) == "tokens='12x' is not a number"
    assert malformed({**ok, "seed": "1.5"}) == "seed='1.5' is not an integer"
    assert malformed({**ok, "val_loss": ""}).startswith("status='completed' but val_loss=''")
    assert malformed({**ok, "status": "failed", "val_loss": ""}) is None


def test_the_study_kind_is_the_records_field_and_a_record_without_one_is_an_error():
    """The field decides; a record without one (an older layout) is an error naming the migration command."""
    from results.record import study_kind

    assert study_kind({"study": "ablations", "study_kind": "scaling"}) == "scaling"
    assert study_kind({"study": "my_grid", "study_kind": "arch_grid"}) == "arch_grid"
    for empty in ({"study": "ablations"}, {"study": "ablations", "study_kind": ""}, {"study_kind": float("nan")}):
        with pytest.raises(ValueError, match=r"has no study_kind \(records from before commit \w+ are migrated by"):
            study_kind(empty)
    with pytest.raises(ValueError, match=r"lacks column\(s\) needed for choosing each study's analysis: study_kind"):
        study_kinds(synthetic_ladder(seeds=(0,)).drop(columns=["study_kind"]))


def _kinds_table() -> pd.DataFrame:
    """A ladder, a block-size sweep and an ablation study (each record with its study_kind)."""
    from synthetic_records import ablation_records, block_size_sweep_records

    return pd.concat(
        [synthetic_ladder({"full_attnres": 1.25}, seeds=(0, 1)), block_size_sweep_records(), ablation_records()],
        ignore_index=True,
    )


def test_a_renamed_sweep_is_analysed_by_its_study_kind(tmp_path: Path) -> None:
    """Renamed studies give the same analysis as the original names: the study_kind decides, not the name; renamed
    studies all labelled ``scaling`` would be fitted as three scaling ladders."""
    from analysis.render.fit_report import run_fit

    named = _kinds_table()
    renamed = named.copy()
    renamed["study"] = renamed["study"].map(
        {"cpu_ladder": "ladder_v2", "block_size": "fig6_cpu", "ablations": "table4_cpu"}
    )
    docs = []
    for name, df in (("named", named), ("renamed", renamed)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AnalysisWarning)
            docs.append(run_fit(df, tmp_path / name, FitOptions(B=50), make_figures=False))
    a, b = docs
    assert b.study == "ladder_v2"
    assert a.study == "cpu_ladder"
    assert b.multipliers["full_attnres"].m == a.multipliers["full_attnres"].m
    assert b.n_runs == a.n_runs == 20  # the ladder alone: no ablation or block-size run is fitted as a rung
    assert [p.block_size for p in b.block_size_sweep.points] == [1, 2, 4, 8]
    assert b.block_size_sweep.to_dict() == a.block_size_sweep.to_dict()
    assert b.ablations == a.ablations
    assert len(b.ablations) == 12
    unlabelled = renamed.assign(study_kind="scaling")  # every study labelled a ladder
    with pytest.raises(ValueError, match=r"several scaling studies \(fig6_cpu, ladder_v2, table4_cpu\)"):
        run_fit(unlabelled, tmp_path / "unlabelled", FitOptions(B=50), make_figures=False)


def test_an_lr_study_is_not_a_scaling_ladder() -> None:
    from analysis.io.runs import runs_of_kind, study_kinds

    ladder = synthetic_ladder(seeds=(0,))
    grid = synthetic_ladder(seeds=(10,), study="cpu_lr").assign(study_kind="lr")
    both = pd.concat([ladder, grid], ignore_index=True)
    assert set(scaling_runs(both)["study"]) == {"cpu_ladder"}
    assert list(study_kinds(both).unique()) == ["scaling", "lr"]
    assert set(runs_of_kind(both, "lr")["run_id"]) == set(grid["run_id"])


def test_two_studies_of_one_kind_use_the_larger_with_a_warning() -> None:
    from synthetic_records import ablation_records

    from analysis.laws.fixed_shape import ablation_table

    big = ablation_records(seeds=(0, 1))
    small = ablation_records(seeds=(5,)).assign(study="ablations_old", study_kind="ablations")
    with pytest.warns(
        AnalysisWarning, match=r"several ablations studies \(ablations, ablations_old\); using 'ablations'"
    ):
        table = ablation_table(pd.concat([small, big], ignore_index=True))
    assert table == ablation_table(big)
    assert table[0]["n_runs"] == 2


def test_keep_most_common_keeps_the_majority_and_warns_at_its_callers_caller() -> None:
    from analysis.io.runs import keep_most_common

    rows = pd.DataFrame({"variant": ["b", "a", "a", "b", "c"], "x": range(5)})
    with pytest.warns(AnalysisWarning, match=r"^sweeps several \(a, b, c\); using 'a'$") as caught:
        kept = keep_most_common(rows, "variant", "sweeps several", stacklevel=1)  # a tie: the first name in order
    assert list(kept["x"]) == [1, 2]
    assert caught[0].filename == __file__  # stacklevel=1: the line that called keep_most_common
    one = rows[rows["variant"] == "c"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert keep_most_common(one, "variant", "never said").equals(one)


# ---- issue 15, items 1, 3, 4 -----------------------------------------------------------------------------------
def _table(path: Path, df: pd.DataFrame) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)
    return path


def test_a_non_utf8_line_is_skipped_with_file_and_line(tmp_path: Path) -> None:
    """In a table on its own the line is skipped and named; in a study the records are the truth, so a bad line
    of its derived table is named and hides no run."""
    from analysis.__main__ import main

    df = synthetic_ladder({"full_attnres": 1.25}, seeds=(0, 1))
    path = _table(tmp_path / "copied" / "ladder.csv", df)
    lines = path.read_bytes().split(b"\n")
    lines[5] = b"\xff" + lines[5]
    path.write_bytes(b"\n".join(lines))
    with pytest.warns(AnalysisWarning, match=rf"{path}:6: not valid UTF-8 \(byte 0xff at column 1\)"):
        assert len(load_results(path)) == len(df) - 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert (
            main(["fit", "--results", str(path), "--out", str(tmp_path / "out"), "--bootstrap", "20", "--no-figures"])
            == 0
        )
    table = write_study(tmp_path / "study", df, curves=False, diagnostics=False, failed=False)
    lines = table.read_bytes().split(b"\n")
    lines[5] = b"\xff" + lines[5]
    table.write_bytes(b"\n".join(lines))
    with pytest.warns(AnalysisWarning, match=rf"{table}:6: not valid UTF-8"):
        assert len(load_results(table.parent)) == len(df)


def test_a_malformed_last_record_does_not_exclude_the_runs_completed_one() -> None:
    df = synthetic_ladder({"full_attnres": 1.25}, seeds=(0, 1))
    good = df.iloc[0]
    torn = good.copy()
    torn["status"], torn["val_loss"] = "complet", float("nan")  # the last record of the run, cut short
    df = pd.concat([df, torn.to_frame().T], ignore_index=True)
    with pytest.warns(AnalysisWarning, match=r"malformed record \(status='complet'"):
        kept, _excluded = select_completed(df)
    assert good["run_id"] in set(kept["run_id"])
    assert float(kept.loc[kept["run_id"] == good["run_id"], "val_loss"].iloc[0]) == pytest.approx(good["val_loss"])


def test_runs_of_different_data_sets_are_never_pooled(tmp_path: Path) -> None:
    from analysis.__main__ import main

    df = synthetic_ladder({"full_attnres": 1.25}, seeds=(0, 1))
    df["dataset"], df["data_fingerprint"] = "stdlib-py3.11-bytes", "aaaaaaaaaaaaaaaa"
    mine = df[(df["variant"] == "baseline") & (df["size"] == "cpu_xs") & (df["seed"] == 0)].copy()
    mine["run_id"] += "-mine"
    mine["dataset"], mine["data_fingerprint"], mine["val_loss"] = "data/mine", "bbbbbbbbbbbbbbbb", 0.9
    both = pd.concat([df, mine], ignore_index=True)
    with pytest.raises(
        ValueError,
        match=r"runs of 2 different data sets: aaaaaaaaaaaaaaaa \(20 run\(s\), "
        r"stdlib-py3.11-bytes\); bbbbbbbbbbbbbbbb \(1 run\(s\), data/mine\).*--dataset",
    ):
        select_completed(both)
    path = _table(tmp_path / "study" / "results.csv", both)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert (
            main(["fit", "--results", str(path), "--out", str(tmp_path / "o"), "--no-figures", "--bootstrap", "20"])
            == 2
        )
        assert (
            main(
                [
                    "fit",
                    "--results",
                    str(path),
                    "--out",
                    str(tmp_path / "o"),
                    "--no-figures",
                    "--bootstrap",
                    "20",
                    "--dataset",
                    "aaaa",
                ]
            )
            == 0
        )
    # without fingerprints (older records): the two runs of one cell are not averaged silently
    legacy = both.drop(columns=["dataset", "data_fingerprint"])
    with pytest.warns(
        AnalysisWarning,
        match=r"1 cell\(s\) hold more than one run.*baseline/cpu_xs/seed 0: "
        r"cpu_ladder-baseline-cpu_xs-s0, cpu_ladder-baseline-cpu_xs-s0-mine",
    ):
        select_completed(legacy)


def test_an_older_record_is_reported_on_one_line_and_the_other_runs_still_load(tmp_path: Path) -> None:
    """A record of an older layout (a field missing: here data_fingerprint and every later one) is skipped with a
    one-line warning naming the file, the missing fields and the migration command, in a study directory and in a
    tree of run directories alike; every other run loads."""
    import json

    from results.record import COLUMNS

    df = synthetic_ladder({"full_attnres": 1.25}, seeds=(0,), n_sizes=2)
    table = write_study(tmp_path / "study", df, curves=False, diagnostics=False, failed=False)
    old_file = sorted((table.parent / "records").glob("*.json"))[0]
    rec = json.loads(old_file.read_text())
    old = {k: v for k, v in rec.items() if k not in COLUMNS[COLUMNS.index("data_fingerprint") :]}
    old_file.write_text(json.dumps(old))
    run_json = table.parent / rec["run_dir"] / "results.json"
    run_json.write_text(json.dumps(old))
    for where, bad in ((table.parent, old_file), (tmp_path / "study" / "runs", run_json)):
        with pytest.warns(AnalysisWarning) as caught:
            loaded = load_results(where)
        assert sorted(loaded["run_id"]) == sorted(set(df["run_id"]) - {rec["run_id"]})
        (message,) = [str(w.message) for w in caught if str(bad) in str(w.message)]
        assert "\n" not in message
        assert "without the field(s) data_fingerprint, threads, record_id, study_kind" in message
        assert re.search(r"git show \w+:scripts/migrate_records.py \| python - ", message)


def test_select_completed_order_does_not_depend_on_the_table_order():
    """Bootstrap draws follow row order; the order runs finished in must not change the intervals."""
    import pandas as pd

    from analysis.io.runs import select_completed

    rows = [
        {
            "run_id": f"{v}_{s}_s{k}",
            "variant": v,
            "size": s,
            "seed": k,
            "status": "completed",
            "pflops_days": 1e-9 * (i + 1),
            "val_loss": 3.0 - 0.01 * i,
        }
        for i, (v, s, k) in enumerate(
            [(v, s, k) for v in ("baseline", "block_attnres") for s in ("cpu_xs", "cpu_s") for k in (0, 1)]
        )
    ]
    df = pd.DataFrame(rows)
    a, _ = select_completed(df)
    b, _ = select_completed(df.sample(frac=1.0, random_state=3))
    pd.testing.assert_frame_equal(a, b)


def test_a_block_size_sweep_is_the_runs_with_a_block_size() -> None:
    """Not the variant's name: a sweep of another Block variant is found; two swept Block variants are one too many."""
    from synthetic_records import block_size_sweep_records

    from analysis.laws.fixed_shape import block_size_sweep

    df = block_size_sweep_records().assign(study="fig6", study_kind="block_size")
    renamed = df.assign(variant=df["variant"].replace({"block_attnres": "block_multihead"}))
    found = block_size_sweep(renamed)
    assert found is not None
    assert found.pop("variant") == "block_multihead"
    assert found == {k: v for k, v in block_size_sweep(df).items() if k != "variant"}
    assert len(block_size_sweep(df)["points"]) == 4
    other = df[df["variant"] == "block_attnres"].assign(variant="block_no_key_norm", val_loss=9.0)
    other = other[other["block_size"] <= 2]
    with pytest.warns(
        AnalysisWarning,
        match=r"sweeps several variants \(block_attnres, block_no_key_norm\); "
        r"using 'block_attnres'",
    ):
        assert block_size_sweep(pd.concat([df, other], ignore_index=True)) == block_size_sweep(df)


def test_a_seed_subset_is_fitted_apart_and_a_missing_seed_is_named(tmp_path: Path) -> None:
    """`analysis fit --seeds` fits a study's held-out seeds apart from its design seeds (one table, all seeds)."""
    import json

    from analysis.__main__ import main
    from analysis.io.runs import select_seeds

    df = synthetic_ladder({"block_attnres": 1.25}, seeds=(0, 1, 2, 20, 21, 22))
    held_out = select_seeds(df, [20, 21, 22])
    assert sorted(held_out["seed"].unique()) == [20, 21, 22]
    assert len(held_out) == len(df) // 2
    with pytest.raises(ValueError, match=r"--seeds 7: no run has that seed; seeds present: 0,1,2,20,21,22"):
        select_seeds(df, [0, 7])
    path = _table(tmp_path / "study" / "results.csv", df)
    out = tmp_path / "heldout"
    args = ["fit", "--results", str(path), "--out", str(out), "--no-figures", "--bootstrap", "20"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*args, "--seeds", "20,21,22"]) == 0
        assert main([*args, "--seeds", "7"]) == 2
    fit = json.loads((out / "fit.json").read_text())
    assert set(fit["bootstrap"]["seeds_per_size"].values()) == {3}
