"""What every report writes the same way: the document version and the JSON writer (fit.json of
``python -m analysis fit`` and ``paper``, map.json of ``python -m analysis map``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA_VERSION = 1


def _clean(obj: Any) -> Any:
    """JSON-safe: numpy scalars to Python, NaN/inf to null."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    return obj


def write_json(doc: dict[str, Any], path: Path) -> None:
    """Write a document as indented JSON: numpy scalars as Python numbers, NaN and inf as null."""
    path.write_text(json.dumps(_clean(doc), indent=2, allow_nan=False) + "\n")
