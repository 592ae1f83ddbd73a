"""Load and validate result records (docs/results_schema.md) from a results table, a study/run directory or W&B,
as one tidy DataFrame with one row per run. No torch; W&B is imported by :func:`load_wandb` only."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from results import ledger, record

# The columns a scaling fit cannot do without; the schema has many more (tolerated, some used by figures).
FIT_COLUMNS = ("run_id", "variant", "size", "seed", "status", "pflops_days", "val_loss")
# What makes two runs the same cell of a study (beyond data and seed noise): a second run of one cell is not a seed.
CELL_COLUMNS = ("study", "variant", "size", "seed", "lr_protocol", "block_size", "d_over_lb", "heads_over_lb")
CELL_COLUMNS += ("seq_len", "optimizer", "lr_schedule", "budget")


class AnalysisWarning(UserWarning):
    """Something was skipped or assumed; the message says what."""


def _frame(rows: list[dict[str, Any]], source: str, base_dir: str) -> pd.DataFrame:
    """The records as a DataFrame, typed by results.record's columns; ``attrs`` remember its source and base_dir."""
    df = pd.DataFrame(rows)
    for col in record.STR_COLUMNS:
        if col in df.columns:
            df[col] = df[col].map(lambda v: "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v))
    for col in record.NUMERIC_COLUMNS:
        if col in df.columns and col != "seed":
            df[col] = pd.to_numeric(df[col], errors="coerce")
    if "seed" in df.columns:  # integers where they are integers (a garbled seed stays, and is reported as malformed)
        num = pd.to_numeric(df["seed"], errors="coerce")
        if num.notna().all() and (num == num.round()).all():
            df["seed"] = num.astype("int64")
    df.attrs["source"] = source
    df.attrs["base_dir"] = base_dir
    return df


def load_results(path: str | Path) -> pd.DataFrame:
    """Result records from a study directory or its results.csv (through results.ledger: ``records/`` is the
    truth), a results.json, a tree of run directories (every ``results.json`` below), or a table on its own.
    Unreadable, malformed or outdated records are skipped with an AnalysisWarning naming the file (an outdated
    one's, the migration command). ``df.attrs['base_dir']`` is where relative ``run_dir`` values resolve from."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"results path {path} does not exist")
    if path.is_dir() and not ((path / ledger.RESULTS_TABLE).is_file() or (path / ledger.RECORDS_DIR).is_dir()):
        files = sorted(path.rglob("results.json"))
        if not files:
            raise FileNotFoundError(f"{path} holds neither results.csv nor any results.json (docs/results_schema.md)")
        rows = []
        for f in files:
            try:
                rec = json.loads(f.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                warnings.warn(f"{f}: unreadable record ({e}); skipped", AnalysisWarning, stacklevel=2)
                continue
            if not isinstance(rec, dict):
                raise ValueError(f"{f} is not a JSON object (one run's result record)")
            old = record.outdated(rec)
            if old is not None:
                warnings.warn(f"{f}: {old}; {record.migration_hint(path)}; skipped", AnalysisWarning, stacklevel=2)
                continue
            rec.setdefault("run_dir", str(f.parent))
            rows.append(rec)
        return _frame(rows, str(path), str(path))
    if path.suffix == ".json":
        rec = json.loads(path.read_text(encoding="utf-8"))
        rows = rec if isinstance(rec, list) else [rec]
        if len(rows) == 1 and "run_dir" not in rows[0]:
            rows[0] = {**rows[0], "run_dir": str(path.parent)}
        return _frame(rows, str(path), str(path.parent))
    if path.is_dir() or (path.name == ledger.RESULTS_TABLE and (path.parent / ledger.RECORDS_DIR).is_dir()):
        study_dir = path if path.is_dir() else path.parent
        rows, problems = ledger.read_study(study_dir)
        source = str(study_dir / ledger.RESULTS_TABLE) if path.is_dir() else str(path)
    else:  # a table on its own (e.g. copied off the cluster): every readable row
        _, numbered, problems = ledger.read_table(path)
        rows, source, study_dir = [r for _, r in numbered], str(path), path.parent
    for p in problems:
        warnings.warn(p, AnalysisWarning, stacklevel=2)
    return _frame(rows, source, str(study_dir))


def load_wandb(project: str, group: str | None = None, *, api: Any = None) -> pd.DataFrame:
    """The same result-record fields from a W&B project (``entity/project``): each run's summary (where training
    writes its record), the config as a fallback for static fields, ``status`` from the run state when missing."""
    if api is None:
        try:
            import wandb  # lazy: W&B is optional for analysis
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("reading from W&B needs the wandb package (pip install wandb)") from e
        api = wandb.Api()
    rows = []
    for run in api.runs(project, filters={"group": group} if group else None):
        summary = getattr(run.summary, "_json_dict", None)
        summary = dict(summary if summary is not None else run.summary)
        config = dict(getattr(run, "config", {}) or {})
        nested = summary.get("results") if isinstance(summary.get("results"), dict) else {}
        prefixed = {k.split("/", 1)[1]: v for k, v in summary.items() if k.startswith("results/")}
        rec: dict[str, Any] = {}
        for key in record.COLUMNS:
            values = [src.get(key) for src in (nested, prefixed, summary, config)]
            values.append(_config_get(config, _CONFIG_PATHS[key]) if key in _CONFIG_PATHS else None)
            value = next((v for v in values if v is not None), None)
            if value is not None:
                rec[key] = value
        rec.setdefault("run_id", getattr(run, "name", None) or getattr(run, "id", ""))
        rec.setdefault("study", getattr(run, "group", None) or "")
        if "status" not in rec:
            state = getattr(run, "state", "")
            rec["status"] = {"finished": "completed", "crashed": "failed", "failed": "failed"}.get(state, state)
        rows.append(rec)
    if not rows:
        raise ValueError(f"W&B project {project!r} (group={group!r}) has no runs")
    return _frame(rows, f"wandb:{project}" + (f"/{group}" if group else ""), ".")


# Where identity fields sit in the logged Hydra config (nested, or flattened with "/" or ".").
_CONFIG_PATHS = {
    "variant": "model.variant",
    "residual": "model.residual",
    "size": "size.name",
    "config_hash": "derived.config_hash",
    "flops_per_token": "derived.flops_per_token",
    "flops_budget": "train.flops_budget",
    "d_over_lb": "size.d_over_lb",
    "heads_over_lb": "size.heads_over_lb",
}


def _config_get(config: dict[str, Any], path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return next((config[flat] for flat in (path, path.replace(".", "/")) if flat in config), node)


PFLOPS_DAY = 1e15 * 86400  # FLOPs in one PFLOP/s-day
PLAIN_STUDY = "table"  # the study name of a plain table that names none


def as_plain_scaling(df: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """A plain results table (no ``study_kind`` column: written by hand or by another harness) read as one scaling
    study: ``study_kind`` scaling, ``study`` PLAIN_STUDY where none, ``pflops_days`` from ``flops`` where missing,
    else from 6 N tokens, and ``pflops_days_6nd`` from 6 N tokens (N: ``params_non_embedding``, else ``params``).
    Returns (the table, the one line that says so), or (``df``, None) for a table with ``study_kind``."""
    if "study_kind" in df.columns or df.empty:
        return df, None
    out = df.copy()
    out.attrs = dict(df.attrs)
    out["study_kind"] = "scaling"
    if "study" not in out.columns:
        out["study"] = PLAIN_STUDY
    n_col = "params_non_embedding" if "params_non_embedding" in out.columns else "params"
    nd6 = None
    if n_col in out.columns and "tokens" in out.columns:
        nd6 = 6.0 * pd.to_numeric(out[n_col], errors="coerce") * pd.to_numeric(out["tokens"], errors="coerce")
    how = "pflops_days given"
    if "pflops_days" not in out.columns:
        if "flops" in out.columns:
            out["pflops_days"] = pd.to_numeric(out["flops"], errors="coerce") / PFLOPS_DAY
            how = "compute = flops"
        elif nd6 is not None:
            out["pflops_days"] = nd6 / PFLOPS_DAY
            how = f"compute = 6 x {n_col} x tokens"
    if "pflops_days_6nd" not in out.columns and nd6 is not None:
        out["pflops_days_6nd"] = nd6 / PFLOPS_DAY
    studies = sorted(set(out["study"].astype(str)))
    note = (
        f"{df.attrs.get('source', 'the results table')} has no study_kind column: read as one scaling study "
        f"({len(out)} rows, study {', '.join(studies)}, {how})"
    )
    return out, note


def require_columns(df: pd.DataFrame, columns: Iterable[str], what: str = "a scaling fit") -> None:
    """Raise a ValueError that lists every missing column at once."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        src = df.attrs.get("source", "the results table")
        raise ValueError(
            f"{src} lacks column(s) needed for {what}: {', '.join(missing)} "
            f"(present: {', '.join(map(str, df.columns)) or 'none'}; contract: docs/results_schema.md)"
        )


def select_completed(df: pd.DataFrame, compute: str = "pflops_days") -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """The runs that can be fitted, and the excluded ones (each named once in a warning, with why): in this order,
    malformed records (results.record.malformed), all but the last record of a run_id, runs whose last record is
    not ``completed`` or lacks a positive val_loss or compute. More than one data set is an error
    (:func:`check_one_dataset`); two runs of one cell (CELL_COLUMNS) get a warning (:func:`warn_duplicate_cells`)."""
    require_columns(df, [c if c != "pflops_days" else compute for c in FIT_COLUMNS])
    excluded: list[dict[str, Any]] = []

    def exclude(mask: pd.Series, reason_of: Callable[[pd.Series], str]) -> pd.DataFrame:
        for _, row in df[mask].iterrows():
            ids = {k: row[k] for k in ("run_id", "variant", "size", "seed", "status")}
            excluded.append({**ids, "seed": _int(row["seed"]), "reason": reason_of(row)})
        return df[~mask]

    reasons = df.apply(lambda r: record.malformed(r.to_dict()), axis=1) if len(df) else pd.Series([], dtype=object)
    df = exclude(reasons.notna(), lambda row: f"malformed record ({reasons[row.name]})")
    df = exclude(
        df.duplicated("run_id", keep="last"), lambda row: "duplicate run_id (an earlier record of the same run)"
    )

    def status_reason(row: pd.Series) -> str:
        error = str(row.get("error", "") or "")
        return f"status={row['status']!r}" + (f": {error}" if error else "")

    df = exclude(df["status"].astype(str) != "completed", status_reason)
    df = exclude(~((df["val_loss"] > 0) & (df[compute] > 0)), lambda row: f"val_loss or {compute} missing or <= 0")
    df = df.copy()
    if excluded:
        names = "; ".join(
            f"{e['run_id']} ({e['variant']}/{e['size']}/seed {e['seed']}): {e['reason']}" for e in excluded
        )
        warnings.warn(f"excluded {len(excluded)} run(s) from the analysis: {names}", AnalysisWarning, stacklevel=2)
    check_one_dataset(df)
    warn_duplicate_cells(df)
    df["seed"] = df["seed"].map(_int)
    # One canonical row order: bootstrap draws depend on it, and a table's order is only the order runs finished
    # (the same runs appended in another order must give the same intervals).
    df = df.sort_values(["variant", "size", "seed", "run_id"], kind="stable")
    return df.reset_index(drop=True), excluded


def check_one_dataset(df: pd.DataFrame) -> None:
    """Raise a ValueError when the runs come from more than one data set (by ``data_fingerprint``): a fit never
    pools them. Runs with an empty fingerprint (data prepared without shard checksums) are not compared."""
    fps = df["data_fingerprint"] if "data_fingerprint" in df.columns else pd.Series("", index=df.index)
    groups = {fp: g for fp, g in df[fps.astype(str) != ""].groupby(fps)}
    if len(groups) <= 1:
        return
    parts = []
    for fp, g in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        names = sorted({str(n) for n in g.get("dataset", pd.Series(dtype=str)) if str(n)})
        parts.append(f"{fp} ({len(g)} run(s){', ' + ', '.join(names) if names else ''})")
    raise ValueError(
        f"the results hold runs of {len(groups)} different data sets: {'; '.join(parts)}. A fit never "
        "pools data sets: choose one with --dataset <fingerprint or dataset>, or keep each data set in "
        "its own study (study=<name>)"
    )


def completed_runs(df: pd.DataFrame, statuses: Sequence[str] = ("completed",)) -> pd.DataFrame:
    """The rows whose ``status`` is one of ``statuses`` (every row of a table without a status column), unchecked:
    :func:`select_completed` is the filter of a fit."""
    return df[df["status"].isin(list(statuses))] if "status" in df.columns else df


def load_one_dataset(
    path: str | Path, statuses: tuple[str, ...] = ("completed",), dataset: str | None = None
) -> pd.DataFrame:
    """``load_results(path)``, narrowed to ``dataset`` when given (:func:`select_dataset`), and checked to hold one
    data set among its runs of ``statuses`` (:func:`check_one_dataset`); other statuses are kept."""
    df = load_results(path)
    if dataset:
        df = select_dataset(df, dataset)
    check_one_dataset(completed_runs(df, statuses))
    return df


def select_dataset(df: pd.DataFrame, which: str) -> pd.DataFrame:
    """The runs of one data set, named by its fingerprint (or a unique prefix) or its ``dataset`` path/name."""
    fp = df.get("data_fingerprint", pd.Series("", index=df.index)).astype(str)
    name = df.get("dataset", pd.Series("", index=df.index)).astype(str)
    mask = (fp == which) | (name == which) | ((fp != "") & fp.str.startswith(which))
    if not mask.any():
        known = sorted({f"{f} ({n})" for f, n in zip(fp, name) if f})
        raise ValueError(
            f"--dataset {which!r} matches no run; data sets present: {', '.join(known) or 'none recorded'}"
        )
    return _rows(df, mask)


def select_seeds(df: pd.DataFrame, seeds: Sequence[int]) -> pd.DataFrame:
    """The runs whose ``seed`` is one of ``seeds`` (e.g. a study's held-out seeds, fitted apart from its design
    seeds); a seed that no run has is an error naming the seeds present."""
    wanted = {int(s) for s in seeds}
    present = sorted({int(s) for s in pd.to_numeric(df.get("seed"), errors="coerce").dropna()})
    missing = sorted(wanted - set(present))
    if missing:
        raise ValueError(
            f"--seeds {','.join(map(str, missing))}: no run has that seed; seeds present: "
            f"{','.join(map(str, present)) or 'none'}"
        )
    return _rows(df, pd.to_numeric(df["seed"], errors="coerce").isin(wanted))


def _rows(df: pd.DataFrame, mask: pd.Series) -> pd.DataFrame:
    out = df[mask].copy()
    out.attrs = dict(df.attrs)
    return out


def warn_duplicate_cells(df: pd.DataFrame) -> None:
    """Warn when two runs (different run_ids) share one cell (CELL_COLUMNS): the fit would average them as seeds."""
    cols = [c for c in CELL_COLUMNS if c in df.columns]
    if df.empty or not {"variant", "size", "seed"} <= set(cols):
        return
    key = pd.Series(["/".join(map(str, vals)) for vals in zip(*(df[c] for c in cols))], index=df.index)
    counts = df.groupby(key)["run_id"].nunique()
    dups = counts[counts > 1]
    if dups.empty:
        return
    lines = []
    for k in dups.index:
        ids = sorted(df.loc[key == k, "run_id"].astype(str))
        row = df[key == k].iloc[0]
        lines.append(f"{row['variant']}/{row['size']}/seed {_int(row['seed'])}: {', '.join(ids)}")
    warnings.warn(
        f"{len(dups)} cell(s) hold more than one run, which the fit would average as if they were seeds "
        f"(different configs or data with the same arm, size and seed): {'; '.join(lines)}",
        AnalysisWarning,
        stacklevel=3,
    )


def _int(v: Any) -> Any:
    try:
        return int(v)
    except (TypeError, ValueError):
        return v


def study_kinds(df: pd.DataFrame) -> pd.Series:
    """Each row's study kind, its ``study_kind`` (every loaded record has one; a table without the column is a
    ValueError naming it, :func:`require_columns`)."""
    require_columns(df, ["study_kind"], "choosing each study's analysis")
    kinds = [record.study_kind({"run_id": r, "study_kind": k}) for r, k in zip(df["run_id"], df["study_kind"])]
    return pd.Series(kinds, index=df.index, dtype=object)


def runs_of_kind(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The rows of one study of ``kind`` (docs/results_schema.md, "Study kinds"). Several studies of that kind in
    one table: the one with the most runs is used (ties: the first name), with a warning naming them all."""
    rows = df[study_kinds(df) == kind]
    if rows.empty or "study" not in rows.columns:
        return rows
    return keep_most_common(rows, "study", f"the results hold several {kind} studies", stacklevel=3)


def keep_most_common(rows: pd.DataFrame, column: str, what: str, stacklevel: int = 2) -> pd.DataFrame:
    """The rows holding ``column``'s most frequent value (ties: the first in sorted order), with a warning "<what>
    (<all values>); using <kept>" when there are several (``stacklevel``: as the caller's own warnings.warn)."""
    counts = rows[column].value_counts()
    if len(counts) <= 1:
        return rows
    keep = sorted(counts.index, key=lambda v: (-counts[v], v))[0]
    warnings.warn(
        f"{what} ({', '.join(sorted(counts.index))}); using {keep!r}", AnalysisWarning, stacklevel=stacklevel + 1
    )
    return rows[rows[column] == keep]


def scaling_runs(df: pd.DataFrame, study: str | None = None) -> pd.DataFrame:
    """The rows of one compute ladder: ``study`` when given, else the one study of kind ``scaling`` (several are an
    error: which one is "the" scaling law?)."""
    if "study" not in df.columns:
        if study is not None:
            raise ValueError(f"--study {study!r} given but the results table has no 'study' column")
        return df
    if study is not None:
        out = df[df["study"] == study]
        if out.empty:
            raise ValueError(
                f"no completed runs with study == {study!r}; studies present: {', '.join(sorted(set(df['study'])))}"
            )
        return out
    out = df[study_kinds(df) == "scaling"]
    studies = sorted(set(out["study"]))
    if len(studies) > 1:
        raise ValueError(f"the results hold several scaling studies ({', '.join(studies)}); choose one with --study")
    return out


def size_order(df: pd.DataFrame, compute: str = "pflops_days") -> list[str]:
    """Size names ordered by their median compute (names alone do not sort: cpu_xs < cpu_s is not alphabetical)."""
    if df.empty:
        return []
    return list(df.groupby("size")[compute].median().sort_values().index)


def resolve_run_dir(row: pd.Series, base_dir: str | Path | None) -> Path | None:
    """Locate a run's directory from its ``run_dir`` (absolute, or relative to the results table or the cwd)."""
    raw = str(row.get("run_dir", "") or "")
    candidates = [Path(raw)] if raw else []
    if base_dir is not None and raw and not Path(raw).is_absolute():
        candidates.append(Path(base_dir) / raw)
    if base_dir is not None and str(row.get("run_id", "")):
        candidates.append(Path(base_dir) / str(row["run_id"]))  # run directories are named by run_id
    return next((c for c in candidates if c.is_dir()), None)


OWN_LR = "@own_lr"  # arm-name suffix of runs trained at their own tuned lr (lr_protocol=per_arm)


def split_lr_protocols(df: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Runs of a non-baseline variant trained with ``lr_protocol=per_arm`` become the arm ``<variant>@own_lr``;
    everything else keeps its variant name (the baseline's lr is the same under both protocols)."""
    if "lr_protocol" not in df.columns:
        return df
    named = df["variant"].astype(str).str.endswith(OWN_LR)  # already split (a refit of an analysed frame)
    own = (df["lr_protocol"].astype(str) == "per_arm") & (df["variant"] != baseline) & ~named
    if not own.any():
        return df
    df = df.copy()
    df.loc[own, "variant"] = df.loc[own, "variant"].astype(str) + OWN_LR
    return df


def lr_text(lr: float) -> str:
    """An lr in mantissa-exponent form without padding, as the sweep files write them: ``4.553e-3``, ``2.2765e-3``
    (up to 10 significant digits, so that half or twice a grid lr, ``1.181375e-3``, is written exactly)."""
    mantissa, exponent = f"{float(lr):.9e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def cell_text(keys: Sequence[str], values: Sequence[Any]) -> str:
    """A cell's keys in words: a size or an arm as its name, a budget as ``@ <n> tokens/param`` (columns
    ``tokens_per_param``, ``tpp``, ``budget``), anything else as ``key=value``; e.g. ``deep_L16 @ 128 tokens/param``."""
    words = []
    for k, v in zip(keys, values):
        if k in ("tokens_per_param", "tpp", "budget"):
            words.append(f"@ {float(v):g} tokens/param")
        else:
            words.append(str(v) if k in ("size", "variant", "arm") else f"{k}={v}")
    return " ".join(words)


def _seed_list(seeds: Iterable[Any]) -> str:
    """``seed 104`` or ``seeds 0,1,2,20`` (ascending; a seed that is no integer after them)."""
    values = {_int(s) for s in seeds}
    ordered = sorted(v for v in values if isinstance(v, int)) + sorted(str(v) for v in values if not isinstance(v, int))
    return ("seed " if len(ordered) == 1 else "seeds ") + ",".join(map(str, ordered))


def check_one_lr_per_cell(df: pd.DataFrame, keys: Sequence[str], what: str = "the comparison") -> None:
    """Raise a one-line ValueError when one cell of ``df`` (one value of the ``keys`` columns, the arm's last) holds
    runs at more than one lr (equal to 6 significant digits: one lr), which ``what`` would pool as seeds of one run,
    e.g. ``deep_L16 @ 128 tokens/param, baseline: runs at 2 lrs (4.553e-3: seeds 0,1,2; 2.2765e-3: seed 104); ...``,
    the lr with the most runs first. Rows without an lr are not checked."""
    if "lr" not in df.columns or df.empty:
        return
    lr = pd.to_numeric(df["lr"], errors="coerce")
    rows = df.assign(_lr=lr.map(lambda x: float(f"{x:.6g}") if np.isfinite(x) else np.nan)).dropna(subset=["_lr"])
    keys = list(keys)
    for key, cell in rows.groupby(keys, sort=True) if keys else [((), rows)]:
        if cell["_lr"].nunique() < 2:
            continue
        values = key if isinstance(key, tuple) else (key,)
        where = ", ".join(p for p in (cell_text(keys[:-1], values[:-1]), str(values[-1]) if keys else "") if p)
        by_lr = sorted(cell.groupby("_lr"), key=lambda kv: (-len(kv[1]), -kv[0]))
        seeds = "; ".join(
            f"{lr_text(value)}: {_seed_list(g['seed'] if 'seed' in g.columns else [])}" for value, g in by_lr
        )
        raise ValueError(
            f"{where or 'the runs'}: runs at {len(by_lr)} lrs ({seeds}); select one lr (keep records of one lr) for "
            f"{what}, which would pool them as seeds of one run"
        )
