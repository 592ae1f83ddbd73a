"""How a scaling ladder is fitted: :class:`FitOptions`, the one typed set of options every fit of the analysis
takes (``python -m analysis fit``, the rollout, the E sensitivity, the recipe and training-length studies)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from . import bootstrap as bs
from .fit import HUBER_DELTA

MIN_SIZES = 3
OUTLIER_MODES = ("keep", "exclude")


@dataclass(frozen=True)
class FitOptions:
    """How a scaling ladder is fitted (``python -m analysis fit``'s options): ``study`` picks the ladder; ``B`` to
    ``seed_rho`` shape the resampling (bootstrap.plan_resampling), ``form`` and ``delta`` the joint fit;
    ``skip_incomplete`` drops a variant with too few sizes; ``outliers``: ``keep`` or ``exclude`` flagged runs."""

    baseline: str = "baseline"
    study: str | None = None
    compute: str = "pflops_days"
    B: int = bs.DEFAULT_B
    seed: int = 0
    bootstrap_mode: str = "auto"
    seed_sigma: float | None = None
    seed_rho: float = 0.0
    form: str = "auto"
    delta: float = HUBER_DELTA
    skip_incomplete: bool = False
    outliers: str = "keep"

    def replace(self, **changes: Any) -> FitOptions:
        return dataclasses.replace(self, **changes)

    def plan(self, df: Any, residual_sigma: float | None) -> bs.ResamplePlan:
        """The resampling of ``df`` these options ask for (bootstrap.plan_resampling)."""
        return bs.plan_resampling(
            df, B=self.B, seed=self.seed, mode=self.bootstrap_mode, sigma=self.seed_sigma, rho=self.seed_rho,
            residual_sigma=residual_sigma,
        )  # fmt: skip
