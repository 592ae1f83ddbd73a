"""The fit document (``fit.json``) of ``python -m analysis fit`` and ``paper``: :class:`FitDocument`, with typed
top-level fields and typed parts wherever a reader (figures, CLI, sweeps.study) looks inside; open-ended parts stay
dicts. Keys a part does not know are kept in its ``extra`` and written back, so a document from a newer writer
loads and round-trips. docs/analysis.md describes every part.

Pure standard library (no pandas, no numpy, no torch), so sweeps.study reads it cheaply. The run records the
document is fitted from: results.record.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

# The fit document: typed parts, loaded from and written to plain JSON-ready dicts

_P = TypeVar("_P", bound="_Part")


def _load(hint: Any, value: Any) -> Any:
    """A JSON value as the type ``hint`` names: parts from dicts, dicts and lists of parts element-wise."""
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _load(inner[0], value) if len(inner) == 1 else value
    if isinstance(hint, type) and issubclass(hint, _Part):
        return hint.from_dict(value) if isinstance(value, Mapping) else value
    if origin is dict and len(args) == 2 and isinstance(value, Mapping):
        return {k: _load(args[1], v) for k, v in value.items()}
    if origin is list and args and isinstance(value, list):
        return [_load(args[0], v) for v in value]
    return value


def _dump(value: Any) -> Any:
    if isinstance(value, _Part):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return value


@dataclass
class _Part:
    """A part of the fit document. ``from_dict`` tolerates missing keys (they take the field's default) and keeps
    unknown ones in ``extra``; ``to_dict`` writes the fields in order, then ``extra``. A field with metadata
    ``omit_if_none`` is left out of ``to_dict`` while it is None."""

    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False)

    @classmethod
    def from_dict(cls: type[_P], data: Mapping[str, Any]) -> _P:
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls) if f.name != "extra"]
        known = {n: _load(hints[n], data[n]) for n in names if n in data}
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (value is None and f.metadata.get("omit_if_none")):
                continue
            out[f.name] = _dump(value)
        return out | _dump(self.extra)


Interval = list  # [lo, hi]: a 95% interval, either end None when undefined


@dataclass
class BootstrapInfo(_Part):
    """How the intervals were resampled (analysis.laws.bootstrap.ResamplePlan and the interval's level)."""

    mode: str | None = None  # "paired_cluster" or "parametric"
    B: int | None = None
    seed: int | None = None
    sigma: float | None = None
    rho: float | None = None
    sigma_source: str | None = None
    seeds_per_size: dict[str, int] = field(default_factory=dict)
    scale: float | None = None
    ci_level: float | None = None
    interval: str | None = None


@dataclass
class VariantLaw(_Part):
    """One arm's paper-form law L = A C^-alpha (C in PFLOP/s-days) with bootstrap intervals."""

    A: float | None = None
    A_ci95: Interval | None = None
    alpha: float | None = None
    alpha_ci95: Interval | None = None
    E: float | None = None
    law: str | None = None
    sizes: list[str] = field(default_factory=list)
    n_runs: int | None = None
    C_min: float | None = None
    C_max: float | None = None
    rmse_log: float | None = None


@dataclass
class MultiplierCurve(_Part):
    """The paper-form multiplier M(C) on a grid of compute C, with its pointwise 95% band."""

    C: list[float] = field(default_factory=list)
    M: list[float] = field(default_factory=list)
    ci95_lo: list[float | None] = field(default_factory=list)
    ci95_hi: list[float | None] = field(default_factory=list)


@dataclass
class JointLaw(_Part):
    """The joint fit L = E + A_arm C^-alpha of baseline and variant (E and alpha shared; E = 0 for power_law)."""

    form: str | None = None  # "saturating" or "power_law"
    E: float | None = None
    A_base: float | None = None
    A_variant: float | None = None
    alpha: float | None = None
    m: float | None = None
    objective: float | None = None
    C_ref: float | None = None
    fallback: str | None = None
    saturating_attempt: dict[str, Any] | None = None
    alpha_ci95: Interval | None = None
    E_ci95: Interval | None = None
    # [lo, hi]: that end of the interval is set by a search bound (analysis.laws.bootstrap.ends_at_bound): unbounded.
    # Absent from documents written before the flags existed (and E's for the E = 0 form).
    alpha_ci95_at_bound: list[bool] | None = field(default=None, metadata={"omit_if_none": True})
    E_ci95_at_bound: list[bool] | None = field(default=None, metadata={"omit_if_none": True})
    # replicates whose fit ended on a bound (analysis.laws.fit.joint_draws_at_bound)
    draws_at_bound: int | None = field(default=None, metadata={"omit_if_none": True})
    huber_delta: float | None = None


@dataclass
class Exponents(_Part):
    """The arms' own exponents under the joint fit's E, and whether they differ significantly."""

    E_used: float | None = None
    alpha_base: float | None = None
    alpha_variant: float | None = None
    diff: float | None = None
    diff_ci95: Interval | None = None
    diff_ci95_at_bound: list[bool] | None = field(default=None, metadata={"omit_if_none": True})
    significant: bool | None = None


@dataclass
class SizeMultiplier(_Part):
    """m_s at one size: the baseline curve inverted at the variant's loss there."""

    m: float | None = None
    m_ci95: Interval | None = None
    C: float | None = None
    L_variant: float | None = None
    n_runs: int | None = None


@dataclass
class Multiplier(_Part):
    """A variant's compute multiplier vs the baseline, by every estimator (docs/analysis.md)."""

    baseline: str | None = None
    paper_M: float | None = None
    paper_M_ci95: Interval | None = None
    paper_M_at_C: float | None = None
    paper_M_curve: MultiplierCurve | None = None
    m: float | None = None
    m_ci95: Interval | None = None
    m_ci95_at_bound: list[bool] | None = field(default=None, metadata={"omit_if_none": True})
    p_m_le_1: float | None = None
    joint: JointLaw | None = None
    exponents: Exponents | None = None
    headline: str | None = None  # "m" (one multiplier), or "curve" (the exponents differ: read M(C))
    per_size: dict[str, SizeMultiplier] = field(default_factory=dict)
    per_size_geomean: float | None = None
    per_size_geomean_ci95: Interval | None = None
    # why m lies outside the m_s' range, where it does (analysis.laws.multipliers.headline_gap); absent otherwise
    headline_gap: dict[str, Any] | None = field(default=None, metadata={"omit_if_none": True})
    paired: dict[str, Any] | None = None  # the same-seed paired multiplier: m, m_ci95, per_size, heterogeneity
    bootstrap_failed: int | None = None


@dataclass
class ProtocolComparison(_Part):
    """A variant's multiplier at the baseline's lr and at its own tuned lr, and their ratio."""

    shared_lr: dict[str, Any] = field(default_factory=dict)
    own_lr: dict[str, Any] = field(default_factory=dict)
    ratio_own_over_shared: float | None = None
    ratio_ci95: Interval | None = None


@dataclass
class OutlierReport(_Part):
    """The outlier rule's verdict (analysis.health): flagged runs, disagreeing cells, the rule's constants."""

    mode: str | None = None  # "keep" or "exclude"
    flagged: list[dict[str, Any]] = field(default_factory=list)
    cells_disagreeing: list[dict[str, Any]] = field(default_factory=list)
    # spikes shared by runs of other trajectories on the same batches (analysis.health.data_events): not flags
    data_spikes: list[dict[str, Any]] | None = field(default=None, metadata={"omit_if_none": True})
    rule: dict[str, Any] = field(default_factory=dict)


@dataclass
class LossReference(_Part):
    """Mean final val loss of a group of runs (a sweep point, a reference arm)."""

    val_loss: float | None = None
    val_loss_sd: float | None = None
    n_runs: int | None = None
    size: str | None = field(default=None, metadata={"omit_if_none": True})
    val_loss_ci95: Interval | None = field(default=None, metadata={"omit_if_none": True})  # t interval over seeds
    seeds: list[int] | None = field(default=None, metadata={"omit_if_none": True})
    # Same-seed difference from the baseline (analysis.laws.paired.paired_delta), for a reference arm that is not it.
    vs_baseline: dict[str, Any] | None = field(default=None, metadata={"omit_if_none": True})


@dataclass
class BlockSizePoint(_Part):
    """One block size S: the mean loss over seeds and, for a measured sweep, its t interval and its same-seed
    differences from the references (analysis.laws.fixed_shape; each a dict of analysis.laws.paired.paired_delta)."""

    block_size: int | None = None
    val_loss: float | None = None
    val_loss_sd: float | None = None
    n_runs: int | None = None
    val_loss_ci95: Interval | None = field(default=None, metadata={"omit_if_none": True})
    seeds: list[int] | None = field(default=None, metadata={"omit_if_none": True})
    vs_baseline: dict[str, Any] | None = field(default=None, metadata={"omit_if_none": True})  # arm - baseline
    vs_full: dict[str, Any] | None = field(default=None, metadata={"omit_if_none": True})


@dataclass
class BlockSizeSweep(_Part):
    """Fig. 6: Block AttnRes loss per block size S at one model size, with the baseline and Full as references."""

    size: str | None = None
    variant: str | None = field(default=None, metadata={"omit_if_none": True})
    lr_protocol: str | None = field(default=None, metadata={"omit_if_none": True})
    n_sublayers: int | None = field(default=None, metadata={"omit_if_none": True})
    d_model: int | None = field(default=None, metadata={"omit_if_none": True})
    tokens_per_param: float | None = field(default=None, metadata={"omit_if_none": True})
    points: list[BlockSizePoint] = field(default_factory=list)
    baseline: LossReference | None = None
    full: LossReference | None = None


@dataclass
class ArchBest(_Part):
    val_loss: float | None = None
    d_over_lb: float | None = None
    heads_over_lb: float | None = None


@dataclass
class ArchGrid(_Part):
    """Fig. 7: final val loss per variant on the (H/L_b rows, largest first; d/L_b columns) grid at fixed compute."""

    study: str | None = None
    baseline: str | None = None
    flops_budget: float | None = None
    d_over_lb: list[float] = field(default_factory=list)
    heads_over_lb: list[float] = field(default_factory=list)
    variants: list[str] = field(default_factory=list)
    val_loss: dict[str, list[list[float | None]]] = field(default_factory=dict)
    val_loss_sd: dict[str, list[list[float | None]]] = field(default_factory=dict)
    n_runs: dict[str, list[list[int]]] = field(default_factory=dict)
    delta_vs_baseline: dict[str, list[list[float | None]]] | None = None
    best: dict[str, ArchBest] = field(default_factory=dict)
    cells: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class FitDocument(_Part):
    """``fit.json`` of ``python -m analysis fit`` (and ``paper``); docs/analysis.md describes every part.

    Every top-level key is written (null, or an empty list/dict, where a part does not apply: e.g. the scaling
    parts of a study that holds only an ablation table), except ``without_flagged`` and ``paper``, which are
    present only when they apply."""

    schema_version: int | None = None
    created: str | None = None
    source: str | None = None
    study: str | None = None
    baseline: str | None = None
    compute: str | None = None  # the compute column fitted: pflops_days or pflops_days_6nd
    compute_units: str | None = None
    n_runs: int | None = None
    sizes: list[str] = field(default_factory=list)
    excluded_runs: list[dict[str, Any]] = field(default_factory=list)
    bootstrap: BootstrapInfo | None = None
    variants: dict[str, VariantLaw] = field(default_factory=dict)
    multipliers: dict[str, Multiplier] = field(default_factory=dict)
    losses: list[dict[str, Any]] = field(default_factory=list)
    paired_deltas: list[dict[str, Any]] = field(default_factory=list)
    outliers: OutlierReport | None = None
    protocols: dict[str, ProtocolComparison] = field(default_factory=dict)
    # The multipliers refitted without the runs the outlier rule flagged (or {"error": ...}); only when it flagged any.
    without_flagged: dict[str, Any] | None = field(default=None, metadata={"omit_if_none": True})
    precision: dict[str, Any] | None = None
    # `python -m analysis paper` only: the refit vs the paper's published laws.
    paper: dict[str, Any] | None = field(default=None, metadata={"omit_if_none": True})
    block_size_sweep: BlockSizeSweep | None = None
    ablations: list[dict[str, Any]] | None = None
    arch_grid: ArchGrid | None = None
    # Sections `python -m analysis fit` writes only when a flag asks (docs/analysis.md), absent otherwise, so that
    # a document without them stays byte-identical: --wallclock (analysis.laws.wallclock.ladder_wallclock), --rollout
    # (analysis.laws.rollout), --e-sensitivity (analysis.laws.asymptote), --nd (analysis.laws.nd_fit).
    wallclock: dict[str, Any] | None = field(default=None, metadata={"omit_if_none": True})
    rollout: dict[str, Any] | None = field(default=None, metadata={"omit_if_none": True})
    e_sensitivity: dict[str, Any] | None = field(default=None, metadata={"omit_if_none": True})
    nd_fit: dict[str, Any] | None = field(default=None, metadata={"omit_if_none": True})
    files: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> FitDocument:
        """Load a fit.json file (any version: missing keys take their defaults, unknown ones are kept)."""
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))
