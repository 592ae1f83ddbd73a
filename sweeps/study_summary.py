"""A study's answer where W&B users look: one W&B run in the study's group (the group its training runs log to,
``${study}``), job type ``study_summary``, holding what its report wrote: every table (``*.csv``) as a W&B table,
every figure (``*.png``) as an image, every Markdown page as HTML, and the headline lines (a page, and the run's
summary). So
a W&B project shows a study's Δ and multiplier tables beside its runs.

Offline without an API key, as the runs are (experiments.training.instantiators.resolve_wandb_mode: files under
``<report>/wandb/``, ``wandb sync`` later); ``WANDB_MODE=disabled`` or a sweep whose ``logger`` has no W&B node
logs nothing. ``python -m sweeps.study`` calls :func:`log_study_summary` after the analysis.
"""

from __future__ import annotations

import html
import os
from pathlib import Path

SKIP_DIRS = ("wandb",)  # W&B's own files under the report
JOB_TYPE = "study_summary"


def report_files(report: Path) -> dict[str, list[Path]]:
    """The report's tables, figures and pages (``csv``, ``png``, ``md``), below ``report`` and outside W&B's own
    directory, each kind in path order."""
    files: dict[str, list[Path]] = {"csv": [], "png": [], "md": []}
    for path in sorted(report.rglob("*")):
        rel = path.relative_to(report)
        if path.is_file() and path.suffix[1:] in files and rel.parts[0] not in SKIP_DIRS:
            files[path.suffix[1:]].append(path)
    return files


def log_study_summary(report: Path, project: str, study: str, headline: list[str], mode: str = "auto") -> Path | None:
    """Log the report under ``report`` as one W&B run named ``<study>/summary`` in group ``study`` of ``project``;
    returns the run's local directory (None when W&B is disabled). A table W&B cannot read is logged as its text."""
    from experiments.training.instantiators import resolve_wandb_mode

    mode = resolve_wandb_mode(mode)
    if mode == "disabled":
        return None
    import pandas as pd
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    report.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=project,
        group=study,
        job_type=JOB_TYPE,
        name=f"{study}/summary",
        dir=str(report),
        mode=mode,
        settings=wandb.Settings(x_disable_stats=True, x_disable_machine_info=True),
    )
    try:
        files = report_files(report)
        logged: dict[str, object] = {}
        for path in files["csv"]:
            key = f"table/{path.relative_to(report).with_suffix('').as_posix()}"
            try:
                logged[key] = wandb.Table(dataframe=pd.read_csv(path).astype(str))
            except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
                logged[key] = wandb.Html(f"<pre>{html.escape(path.read_text(errors='replace'))}</pre>")
        for path in files["png"]:
            logged[f"figure/{path.relative_to(report).with_suffix('').as_posix()}"] = wandb.Image(str(path))
        for path in files["md"]:
            text = html.escape(path.read_text(encoding="utf-8", errors="replace"))
            logged[f"page/{path.relative_to(report).with_suffix('').as_posix()}"] = wandb.Html(f"<pre>{text}</pre>")
        logged["page/headline"] = wandb.Html(f"<pre>{html.escape(chr(10).join(headline))}</pre>")
        run.log(logged)
        run.summary["headline"] = "\n".join(headline)
        run.summary["files"] = sum(len(v) for v in files.values())
        return Path(run.dir)
    finally:
        run.finish()
