"""The cell formats every Markdown table of the reports shares (summary.md and each study kind's section)."""

from __future__ import annotations

import math
from typing import Any


def fmt(x: Any, digits: int = 4) -> str:
    """A number to ``digits`` significant digits; "–" for a missing or non-finite one."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


AT_BOUND = "(at bound)"  # marks an interval end set by a search bound (fit.json's ``*_ci95_at_bound``)


def ci(interval: list[float] | None, digits: int = 3, at_bound: list[bool] | None = None) -> str:
    """An interval as "[lo, hi]"; "–" when either end is missing or not finite. An end that ``at_bound`` flags
    (fit.json's ``*_ci95_at_bound``: a bootstrap replicate on a search bound reaches it) is unbounded and prints as
    "≤lo (at bound)" / "≥hi (at bound)": the end is at least that far out, and how far the data do not say."""
    if not interval or interval[0] is None or not all(isinstance(c, float) and math.isfinite(c) for c in interval):
        return "–"
    lo_b, hi_b = (bool(at_bound[0]), bool(at_bound[1])) if at_bound else (False, False)
    lo = f"≤{interval[0]:.{digits}g} {AT_BOUND}" if lo_b else f"{interval[0]:.{digits}g}"
    hi = f"≥{interval[1]:.{digits}g} {AT_BOUND}" if hi_b else f"{interval[1]:.{digits}g}"
    return f"[{lo}, {hi}]"


def loss_cell(r: dict[str, Any]) -> str:
    """A group's mean val loss, ± its sd over seeds when there is one."""
    s = f"{r['val_loss']:.4f}"
    if r.get("val_loss_sd") is not None:
        s += f" ± {r['val_loss_sd']:.4f}"
    return s


def loss_ci_cell(r: dict[str, Any]) -> str:
    """A group's mean val loss with its 95% interval over seeds ("1.4406 [1.4299, 1.4513]"), the mean alone without
    one (a single run, or the paper's number)."""
    lo_hi = r.get("val_loss_ci95")
    return f"{r['val_loss']:.4f} [{lo_hi[0]:.4f}, {lo_hi[1]:.4f}]" if lo_hi else f"{r['val_loss']:.4f}"


def paper_cell(x: float | None, sign: str = "") -> str:
    """A transcribed paper number (3 decimals, as printed there; ``sign`` "+" for a difference); "–" when absent."""
    return "–" if x is None else f"{x:{sign}.3f}"


def num(x: float) -> str:
    """A grid coordinate, as short as it reads."""
    return f"{x:g}"
