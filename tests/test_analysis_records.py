"""Reading result records (analysis.records) and the input errors of the analysis."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from analysis.records import AnalysisWarning, load_results, load_wandb, scaling_runs, select_completed
from analysis.report import analyse_scaling, check_ladder
from analysis.synthetic import synthetic_ladder, write_study

REPO = Path(__file__).resolve().parents[1]


def test_missing_columns_are_listed_together() -> None:
    df = synthetic_ladder().drop(columns=["pflops_days", "val_loss"])
    df.attrs["source"] = "results.csv"
    with pytest.raises(ValueError, match=r"results.csv lacks column\(s\) needed for a scaling fit: pflops_days, val_loss"):
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
    assert "status='failed': CUDA error" in msg and "duplicate run_id" in msg
    assert len(kept) == len(df) - 3 and (kept["status"] == "completed").all()
    assert 9.0 not in kept["val_loss"].to_numpy()  # the last record of a duplicated run wins
    assert {e["reason"].split(":")[0] for e in excluded} >= {"status='failed'", "status='diverged'"}


def test_too_few_sizes_is_a_clear_error() -> None:
    df = synthetic_ladder({"full_attnres": 1.25}, seeds=(0,))
    short = df[~((df["variant"] == "full_attnres") & ~df["size"].isin(["cpu_xs", "cpu_s"]))]
    with pytest.raises(ValueError, match=r"variant 'full_attnres' has completed runs at only 2 size\(s\) \(cpu_xs, cpu_s\)"):
        check_ladder(short, "baseline")
    with pytest.warns(AnalysisWarning, match="skipped"):
        assert check_ladder(short, "baseline", skip_incomplete=True) == ["baseline"]
    single = synthetic_ladder({"full_attnres": 1.25}, n_sizes=1)
    with pytest.raises(ValueError, match="only 1 size"):
        analyse_scaling(single, B=10)
    with pytest.raises(ValueError, match="no completed runs of the baseline 'base'.*--baseline"):
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
    assert len(one) == 1 and one.attrs["base_dir"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_results(tmp_path / "missing.csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither results.csv nor any results.json"):
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
    assert len(kept) == 2 and excluded[0]["run_id"] == recs[1]["run_id"]


def test_analysis_never_imports_the_training_stack() -> None:
    code = (
        "import sys; import analysis.pipeline, analysis.paper, analysis.figures, analysis.__main__; "
        "bad = [m for m in ('torch', 'lightning', 'hydra', 'wandb') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_schema_columns_match_the_writer():
    """analysis restates the record schema (it does not import the training package); both lists must agree."""
    from analysis.records import SCHEMA_COLUMNS
    from experiments.records import COLUMNS

    assert SCHEMA_COLUMNS == COLUMNS


def test_select_completed_order_does_not_depend_on_the_table_order():
    """Bootstrap draws follow row order; the order runs finished in must not change the intervals."""
    import pandas as pd

    from analysis.records import select_completed

    rows = [dict(run_id=f"{v}_{s}_s{k}", variant=v, size=s, seed=k, status="completed", pflops_days=1e-9 * (i + 1),
                 val_loss=3.0 - 0.01 * i) for i, (v, s, k) in enumerate(
                [(v, s, k) for v in ("baseline", "block_attnres") for s in ("cpu_xs", "cpu_s") for k in (0, 1)])]
    df = pd.DataFrame(rows)
    a, _ = select_completed(df)
    b, _ = select_completed(df.sample(frac=1.0, random_state=3))
    pd.testing.assert_frame_equal(a, b)
