"""A run's training budget in tokens per parameter, the key of every multi-budget table (studies.training_length,
laws.frontier, laws.lr_check). Plain functions on tidy DataFrames; no torch."""

from __future__ import annotations

import numpy as np
import pandas as pd


def tokens_per_param(df: pd.DataFrame) -> pd.Series:
    """Each run's budget in tokens per parameter: its ``budget`` where set, else tokens / params_non_embedding
    (rounded to 3 significant digits, so that the runs of one budget share a value)."""
    ratio = pd.to_numeric(df["tokens"], errors="coerce") / pd.to_numeric(df["params_non_embedding"], errors="coerce")
    ratio = ratio.map(lambda x: float(f"{x:.3g}") if np.isfinite(x) else np.nan)
    if "budget" in df.columns:
        budget = pd.to_numeric(df["budget"], errors="coerce")
        return budget.where(budget > 0, ratio)
    return ratio
