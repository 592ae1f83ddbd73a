"""What every report writes the same way: the document version, the JSON writer (fit.json of ``python -m analysis
fit`` and ``paper``) and :func:`write_report`, the one writer of a study's document, Markdown and figures."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
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
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    return obj


def write_json(doc: dict[str, Any], path: Path) -> None:
    """Write a document as indented JSON: numpy scalars as Python numbers, NaN and inf as null."""
    path.write_text(json.dumps(_clean(doc), indent=2, allow_nan=False) + "\n")


def write_report(
    out: Path, doc: dict[str, Any], json_name: str, markdown: Mapping[str, str], written: Iterable[Path] = ()
) -> dict[str, Any]:
    """Write each Markdown file (name -> text) and ``doc`` (as ``json_name``) under ``out``, with ``doc["files"]``
    the sorted names of everything the report holds, ``written`` (what the study already wrote under ``out``; a
    folder with a trailing ``/``) included. Returns ``doc``."""
    out.mkdir(parents=True, exist_ok=True)
    for name, text in markdown.items():
        (out / name).write_text(text)
    drawn = [p.relative_to(out).as_posix() + ("/" if p.is_dir() else "") for p in map(Path, written)]
    doc["files"] = sorted([*drawn, json_name, *markdown])
    write_json(doc, out / json_name)
    return doc
