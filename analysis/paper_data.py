"""The paper's published numbers, transcribed (analysis/data/paper.json: Table 2, the fitted laws, the headline,
Table 4, Fig. 6 and Fig. 7). A leaf module: every study kind that prints the paper's numbers beside its own reads
them here, so none of them imports another kind's module for them."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any


def load_paper() -> dict[str, Any]:
    """analysis/data/paper.json as a dict (its ``source`` names where each number comes from)."""
    data: dict[str, Any] = json.loads(resources.files("analysis").joinpath("data/paper.json").read_text())
    return data
