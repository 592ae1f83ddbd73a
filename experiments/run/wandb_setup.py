"""What W&B needs beyond Lightning's WandbLogger: a run id that a resumed launch
reuses (:func:`wandb_run_id`), curves plotted against FLOPs (:func:`log_hyperparameters`) and the result record
mirrored into the W&B run summary when the run ends (:func:`finish_wandb`).
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

from results.io import atomic_write_text

WANDB_ID_FILE = "wandb_id.txt"


def wandb_run_id(run_dir: Path, resuming: bool) -> str:
    """A W&B run id that a resumed launch reuses (its curves continue), and a fresh launch renews."""
    path = run_dir / WANDB_ID_FILE
    if resuming and path.is_file():
        return path.read_text().strip()
    wid = uuid.uuid4().hex[:12]
    atomic_write_text(path, wid + "\n")
    return wid


def log_hyperparameters(loggers: list[Any], params: dict[str, Any], rank_zero: bool) -> None:
    """``params`` to every logger; in W&B, the train/, val/ and diag/ curves are plotted against FLOPs."""
    for lg in loggers:
        lg.log_hyperparams(params)
        if type(lg).__name__ == "WandbLogger" and rank_zero:
            exp = lg.experiment
            if hasattr(exp, "define_metric"):
                exp.define_metric("train/*", step_metric="train/flops")
                exp.define_metric("val/*", step_metric="val/flops")
                exp.define_metric("diag/*", step_metric="val/flops")


def finish_wandb(exit_code: int, record: dict[str, Any] | None = None) -> None:
    """End the W&B run of this process, if there is one; ``record`` goes into its summary as ``results/<key>``
    (``python -m analysis --wandb`` reads it back)."""
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            if record is not None:
                wandb.run.summary.update({f"results/{k}": v for k, v in record.items() if v is not None})
            wandb.finish(exit_code=exit_code)
