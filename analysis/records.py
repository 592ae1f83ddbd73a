"""Load and validate result records (docs/results_schema.md): a results table, a study/run directory, or W&B.

Everything downstream works on one tidy DataFrame with one row per run.  Nothing here imports torch; W&B is
imported lazily inside :func:`load_wandb` only.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

# The columns a scaling fit cannot do without; the schema has many more (tolerated, some used by figures).
FIT_COLUMNS = ("run_id", "variant", "size", "seed", "status", "pflops_days", "val_loss")
# The writer's list is experiments.records.COLUMNS; analysis does not import the training package (it must run
# without it), so the schema is restated here and tests/test_analysis_records.py keeps the two identical.
SCHEMA_COLUMNS = (
    "run_id", "study", "variant", "residual", "size", "seed", "status", "n_layers", "d_model", "n_heads", "d_ff",
    "block_size", "n_blocks", "seq_len", "batch_size", "params", "params_non_embedding", "tokens",
    "flops_per_token", "flops", "pflops_days", "flops_6nd", "pflops_days_6nd", "val_loss", "train_loss", "steps",
    "lr", "wall_time_s", "git_commit", "config_hash", "run_dir", "error", "started_at", "finished_at",
    "flops_budget", "d_over_lb", "heads_over_lb", "lr_protocol", "health",
)  # fmt: skip
_STR_COLUMNS = ("run_id", "study", "variant", "residual", "size", "status", "git_commit", "config_hash", "run_dir", "error",
                "lr_protocol", "health")
# Studies that are not compute ladders: they are summarised as a sweep / table, never fitted as a scaling law.
NON_SCALING_STUDIES = ("block_size", "ablations", "arch_grid")


class AnalysisWarning(UserWarning):
    """Something was skipped or assumed; the message says what."""


def _normalise(df: pd.DataFrame, source: str) -> pd.DataFrame:
    df = df.copy()
    for col in _STR_COLUMNS:
        if col in df.columns:
            df[col] = df[col].map(lambda v: "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v))
    for col in ("pflops_days", "val_loss", "flops", "tokens", "pflops_days_6nd", "block_size", "n_blocks", "params",
                "flops_budget", "d_over_lb", "heads_over_lb", "n_layers", "d_model", "n_heads"):
        if col in df.columns:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    df.attrs["source"] = source
    return df


def load_results(path: str | Path) -> pd.DataFrame:
    """Read result records from a results.csv, a results.json, or a directory.

    A directory is read through its ``results.csv`` when it has one, else every ``results.json`` below it
    (a single run directory or a tree of them).  ``df.attrs['base_dir']`` remembers where relative
    ``run_dir`` values are resolved from.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"results path {path} does not exist")
    if path.is_dir():
        if (path / "results.csv").is_file():
            return load_results(path / "results.csv")
        files = sorted(path.rglob("results.json"))
        if not files:
            raise FileNotFoundError(f"{path} holds neither results.csv nor any results.json (docs/results_schema.md)")
        rows = []
        for f in files:
            rec = json.loads(f.read_text())
            if not isinstance(rec, dict):
                raise ValueError(f"{f} is not a JSON object (one run's result record)")
            rec.setdefault("run_dir", str(f.parent))
            rows.append(rec)
        df = _normalise(pd.DataFrame(rows), str(path))
        df.attrs["base_dir"] = str(path)
        return df
    if path.suffix == ".json":
        rec = json.loads(path.read_text())
        rows = rec if isinstance(rec, list) else [rec]
        df = pd.DataFrame(rows)
        if len(rows) == 1 and "run_dir" not in df.columns:
            df["run_dir"] = str(path.parent)
    else:
        df = pd.read_csv(path, dtype={c: str for c in _STR_COLUMNS}, keep_default_na=True)
    df = _normalise(df, str(path))
    df.attrs["base_dir"] = str(path.parent)
    return df


def load_wandb(project: str, group: str | None = None, *, api: Any = None) -> pd.DataFrame:
    """Read the same result-record fields from a W&B project (``entity/project``) through ``wandb.Api()``.

    Each run's record is taken from its summary (the training code writes the results record there), with the
    config as a fallback for static fields; missing ``status`` is derived from the W&B run state.
    """
    if api is None:
        try:
            import wandb  # lazy: W&B is optional for analysis
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("reading from W&B needs the wandb package (pip install wandb)") from e
        api = wandb.Api()
    filters = {"group": group} if group else None
    rows = []
    for run in api.runs(project, filters=filters):
        summary = getattr(run.summary, "_json_dict", None)
        summary = dict(summary if summary is not None else run.summary)
        config = dict(getattr(run, "config", {}) or {})
        nested = summary.get("results") if isinstance(summary.get("results"), dict) else {}
        prefixed = {k.split("/", 1)[1]: v for k, v in summary.items() if k.startswith("results/")}
        rec: dict[str, Any] = {}
        for key in SCHEMA_COLUMNS:
            for src in (nested, prefixed, summary, config):
                if key in src and src[key] is not None:
                    rec[key] = src[key]
                    break
            else:
                # Identity fields also live in the logged Hydra config (nested, or flattened with "/" or ".").
                for path in _CONFIG_PATHS.get(key, ()):
                    value = _config_get(config, path)
                    if value is not None:
                        rec[key] = value
                        break
        rec.setdefault("run_id", getattr(run, "name", None) or getattr(run, "id", ""))
        rec.setdefault("study", getattr(run, "group", None) or "")
        if "status" not in rec:
            state = getattr(run, "state", "")
            rec["status"] = {"finished": "completed", "crashed": "failed", "failed": "failed"}.get(state, state)
        rows.append(rec)
    if not rows:
        raise ValueError(f"W&B project {project!r} (group={group!r}) has no runs")
    df = _normalise(pd.DataFrame(rows), f"wandb:{project}" + (f"/{group}" if group else ""))
    df.attrs["base_dir"] = "."
    return df


_CONFIG_PATHS = {
    "variant": ("model.variant",), "residual": ("model.residual",), "size": ("size.name",), "study": ("study",),
    "seed": ("seed",), "config_hash": ("derived.config_hash",), "flops_per_token": ("derived.flops_per_token",),
    "flops_budget": ("train.flops_budget",), "d_over_lb": ("size.d_over_lb",), "heads_over_lb": ("size.heads_over_lb",),
}  # fmt: skip


def _config_get(config: dict[str, Any], path: str) -> Any:
    for flat in (path, path.replace(".", "/")):
        if flat in config:
            return config[flat]
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


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
    """Keep only runs that can be fitted; warn once, naming every excluded run and why.

    Excluded: status other than ``completed``, a missing/non-positive val_loss or compute, and all but the last
    row of a duplicated run_id (a re-appended record).
    """
    require_columns(df, [c if c != "pflops_days" else compute for c in FIT_COLUMNS])
    df = df.copy()
    excluded: list[dict[str, Any]] = []
    dup = df.duplicated("run_id", keep="last")
    for _, row in df[dup].iterrows():
        excluded.append({"run_id": row["run_id"], "variant": row["variant"], "size": row["size"], "seed": _int(row["seed"]),
                         "status": row["status"], "reason": "duplicate run_id (an earlier record of the same run)"})  # fmt: skip
    df = df[~dup]
    bad_status = df["status"].astype(str) != "completed"
    bad_value = ~bad_status & ~((df["val_loss"] > 0) & (df[compute] > 0))
    for mask, why in ((bad_status, "status is not completed"), (bad_value, f"val_loss or {compute} missing or <= 0")):
        for _, row in df[mask].iterrows():
            reason = f"status={row['status']!r}" if why.startswith("status") else why
            if why.startswith("status") and str(row.get("error", "") or ""):
                reason += f": {row['error']}"
            excluded.append({"run_id": row["run_id"], "variant": row["variant"], "size": row["size"],
                             "seed": _int(row["seed"]), "status": row["status"], "reason": reason})  # fmt: skip
    df = df[~bad_status & ~bad_value]
    if excluded:
        names = "; ".join(f"{e['run_id']} ({e['variant']}/{e['size']}/seed {e['seed']}): {e['reason']}" for e in excluded)
        warnings.warn(f"excluded {len(excluded)} run(s) from the analysis: {names}", AnalysisWarning, stacklevel=2)
    df["seed"] = df["seed"].map(_int)
    # One canonical row order: bootstrap draws depend on it, and a table's order is only the order runs finished
    # (the same runs appended in another order must give the same intervals).
    df = df.sort_values(["variant", "size", "seed", "run_id"], kind="stable")
    return df.reset_index(drop=True), excluded


def _int(v: Any) -> Any:
    try:
        return int(v)
    except (TypeError, ValueError):
        return v


def scaling_runs(df: pd.DataFrame, study: str | None = None) -> pd.DataFrame:
    """The rows of one compute ladder: ``study`` when given, else every study except block-size/ablation sweeps.

    Several ladder studies in one table are ambiguous (which one is "the" scaling law?), so that is an error.
    """
    if "study" not in df.columns:
        if study is not None:
            raise ValueError(f"--study {study!r} given but the results table has no 'study' column")
        return df
    if study is not None:
        out = df[df["study"] == study]
        if out.empty:
            raise ValueError(f"no completed runs with study == {study!r}; studies present: {', '.join(sorted(set(df['study'])))}")
        return out
    out = df[~df["study"].isin(NON_SCALING_STUDIES)]
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
    candidates = []
    if raw:
        p = Path(raw)
        candidates.append(p)
        if not p.is_absolute() and base_dir is not None:
            candidates.append(Path(base_dir) / p)
    if base_dir is not None and str(row.get("run_id", "")):
        candidates.append(Path(base_dir) / str(row["run_id"]))  # run directories are named by run_id
    for c in candidates:
        if c.is_dir():
            return c
    return None
