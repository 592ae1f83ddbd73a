"""The cell formats every Markdown table of the reports shares (summary.md and each study kind's section)."""

from __future__ import annotations

import math
from typing import Any


def fmt(x: Any, digits: int = 4) -> str:
    """A number to ``digits`` significant digits; "–" for a missing or non-finite one."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def ci(interval: list[float] | None, digits: int = 3) -> str:
    """An interval as "[lo, hi]"; "–" when either end is missing or not finite."""
    if not interval or interval[0] is None or not all(isinstance(c, float) and math.isfinite(c) for c in interval):
        return "–"
    return f"[{interval[0]:.{digits}g}, {interval[1]:.{digits}g}]"


def loss_cell(r: dict[str, Any]) -> str:
    """A group's mean val loss, ± its sd over seeds when there is one."""
    s = f"{r['val_loss']:.4f}"
    if r.get("val_loss_sd") is not None:
        s += f" ± {r['val_loss_sd']:.4f}"
    return s


def num(x: float) -> str:
    """A grid coordinate, as short as it reads."""
    return f"{x:g}"
