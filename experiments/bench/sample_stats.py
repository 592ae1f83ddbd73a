"""Summary statistics of a sample of times (:func:`summarize`) and per-round ratios to a reference
(:func:`paired_ratios`). No torch."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def summarize(samples: Sequence[float]) -> dict[str, Any]:
    """Median, interquartile range (q1, q3), min and max of samples (and the samples themselves)."""
    xs = sorted(float(x) for x in samples)
    if not xs:
        return {"median": None, "q1": None, "q3": None, "min": None, "max": None, "n": 0, "samples": []}
    if len(xs) >= 2:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    else:
        q1 = q3 = xs[0]
    return {
        "median": statistics.median(xs),
        "q1": q1,
        "q3": q3,
        "min": xs[0],
        "max": xs[-1],
        "n": len(xs),
        "samples": [float(x) for x in samples],
    }


def paired_ratios(samples: dict[str, list[float]], reference: str) -> dict[str, dict[str, Any]]:
    """Per round: sample / reference's sample of the same round; summarised over rounds."""
    ref = samples[reference]
    return {n: summarize([a / b for a, b in zip(v, ref)]) for n, v in samples.items() if v and ref}
