"""The paper's published numbers, transcribed (analysis/data/paper.json: Table 2, the fitted laws, the headline,
Table 4, Fig. 6 and Fig. 7). A leaf module: every study kind that prints the paper's numbers beside its own reads
them here, so none of them imports another kind's module for them."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from .fit_document import BlockSizeSweep


def load_paper() -> dict[str, Any]:
    """analysis/data/paper.json as a dict (its ``source`` names where each number comes from)."""
    data: dict[str, Any] = json.loads(resources.files("analysis").joinpath("data/paper.json").read_text())
    return data


def paper_sweep() -> BlockSizeSweep:
    """The paper's Fig. 6 (analysis/data/paper.json: one model, no seeds), as a sweep."""
    f6 = load_paper()["fig6"]
    points = [{"block_size": s, "val_loss": loss, "n_runs": 1} for s, loss in zip(f6["block_size"], f6["loss"])]
    baseline = {"val_loss": f6["baseline"], "n_runs": 1}
    return BlockSizeSweep.from_dict({"size": f6["size"], "n_sublayers": 32, "points": points, "baseline": baseline})
