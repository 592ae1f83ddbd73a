"""The fit document (``fit.json``) of ``python -m analysis fit`` and ``paper``: :class:`FitDocument`, typed wherever a
reader (figures, CLI, sweeps.study) looks inside; open-ended parts stay dicts. docs/analysis.md describes every part.
Keys a part does not know are kept in its ``extra`` and written back, so a document from a newer writer loads and
round-trips. Pure standard library, so sweeps.study reads it cheaply. The records it is fitted from: results.record.
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
    """A part of the fit document, a dataclass whose fields a subclass lists in ``_fields``: ``name:type`` items (a
    type over this module's names, without spaces). A ``list[...]`` or ``dict[...]`` field defaults to empty, any
    other to None (its type then ``type | None``); a field named in ``_omit`` is left out of ``to_dict`` while None.
    ``from_dict`` tolerates missing keys and keeps unknown ones in ``extra``; ``to_dict`` writes the fields in order,
    then ``extra``."""

    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        omit = set(cls.__dict__.get("_omit", "").split())
        cls.__annotations__ = {}
        for item in cls.__dict__.get("_fields", "").split():
            name, hint = item.split(":")
            if hint.startswith(("list[", "dict[")) and not hint.endswith("|None"):
                setattr(cls, name, field(default_factory=list if hint.startswith("list[") else dict))
            else:
                hint = hint if hint.endswith("|None") else f"{hint}|None"
                setattr(cls, name, field(default=None, metadata={"omit_if_none": True} if name in omit else {}))
            cls.__annotations__[name] = hint
        dataclass(cls)

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


class BootstrapInfo(_Part):
    """How the intervals were resampled (analysis.laws.bootstrap.ResamplePlan and the interval's level)."""

    _fields = """mode:str B:int seed:int sigma:float rho:float sigma_source:str seeds_per_size:dict[str,int]
        scale:float ci_level:float interval:str"""


class VariantLaw(_Part):
    """One arm's paper-form law L = A C^-alpha (C in PFLOP/s-days) with bootstrap intervals."""

    _fields = """A:float A_ci95:Interval alpha:float alpha_ci95:Interval E:float law:str sizes:list[str] n_runs:int
        C_min:float C_max:float rmse_log:float"""


class MultiplierCurve(_Part):
    """The paper-form multiplier M(C) on a grid of compute C, with its pointwise 95% band."""

    _fields = "C:list[float] M:list[float] ci95_lo:list[float|None] ci95_hi:list[float|None]"


class JointLaw(_Part):
    """The joint fit L = E + A_arm C^-alpha of baseline and variant (E and alpha shared; E = 0 for power_law);
    ``*_at_bound``: [lo, hi], that end set by a search bound (analysis.laws.bootstrap.ends_at_bound)."""

    _fields = """form:str E:float A_base:float A_variant:float alpha:float m:float objective:float C_ref:float
        fallback:str saturating_attempt:dict[str,Any]|None alpha_ci95:Interval E_ci95:Interval
        alpha_ci95_at_bound:list[bool]|None E_ci95_at_bound:list[bool]|None draws_at_bound:int huber_delta:float"""
    _omit = "alpha_ci95_at_bound E_ci95_at_bound draws_at_bound"


class Exponents(_Part):
    """The arms' own exponents under the joint fit's E, and whether they differ significantly."""

    _fields = """E_used:float alpha_base:float alpha_variant:float diff:float diff_ci95:Interval
        diff_ci95_at_bound:list[bool]|None significant:bool"""
    _omit = "diff_ci95_at_bound"


class SizeMultiplier(_Part):
    """m_s at one size: the baseline curve inverted at the variant's loss there."""

    _fields = "m:float m_ci95:Interval C:float L_variant:float n_runs:int"


class Multiplier(_Part):
    """A variant's compute multiplier vs the baseline, by every estimator (docs/analysis.md)."""

    _fields = """baseline:str paper_M:float paper_M_ci95:Interval paper_M_at_C:float paper_M_curve:MultiplierCurve
        m:float m_ci95:Interval m_ci95_at_bound:list[bool]|None p_m_le_1:float joint:JointLaw exponents:Exponents
        headline:str per_size:dict[str,SizeMultiplier] per_size_geomean:float per_size_geomean_ci95:Interval
        headline_gap:dict[str,Any]|None paired:dict[str,Any]|None bootstrap_failed:int"""
    _omit = "m_ci95_at_bound headline_gap"


class ProtocolComparison(_Part):
    """A variant's multiplier at the baseline's lr and at its own tuned lr, and their ratio."""

    _fields = "shared_lr:dict[str,Any] own_lr:dict[str,Any] ratio_own_over_shared:float ratio_ci95:Interval"


class OutlierReport(_Part):
    """The outlier rule's verdict (analysis.health): flagged runs, disagreeing cells, the rule's constants."""

    _fields = "mode:str flagged:list[dict[str,Any]] cells_disagreeing:list[dict[str,Any]] rule:dict[str,Any]"


class LossReference(_Part):
    """Mean final val loss of a group of runs (a reference arm), and its same-seed difference from the baseline."""

    _fields = """val_loss:float val_loss_sd:float n_runs:int size:str val_loss_ci95:Interval seeds:list[int]|None
        vs_baseline:dict[str,Any]|None"""
    _omit = "size val_loss_ci95 seeds vs_baseline"


class BlockSizePoint(_Part):
    """One block size S: the mean loss over seeds and, for a measured sweep, its t interval and its same-seed
    differences from the references (analysis.laws.fixed_shape; each a dict of analysis.laws.paired.paired_delta)."""

    _fields = """block_size:int val_loss:float val_loss_sd:float n_runs:int val_loss_ci95:Interval
        seeds:list[int]|None vs_baseline:dict[str,Any]|None vs_full:dict[str,Any]|None"""
    _omit = "val_loss_ci95 seeds vs_baseline vs_full"


class BlockSizeSweep(_Part):
    """Fig. 6: Block AttnRes loss per block size S at one model size, with the baseline and Full as references."""

    _fields = """size:str variant:str lr_protocol:str n_sublayers:int d_model:int tokens_per_param:float
        points:list[BlockSizePoint] baseline:LossReference full:LossReference"""
    _omit = "variant lr_protocol n_sublayers d_model tokens_per_param"


class ArchBest(_Part):
    """A variant's best cell of the grid."""

    _fields = "val_loss:float d_over_lb:float heads_over_lb:float"


class ArchGrid(_Part):
    """Fig. 7: final val loss per variant on the (H/L_b rows, largest first; d/L_b columns) grid at fixed compute."""

    _fields = """study:str baseline:str flops_budget:float d_over_lb:list[float] heads_over_lb:list[float]
        variants:list[str] val_loss:dict[str,list[list[float|None]]] val_loss_sd:dict[str,list[list[float|None]]]
        n_runs:dict[str,list[list[int]]] delta_vs_baseline:dict[str,list[list[float|None]]]|None
        best:dict[str,ArchBest] cells:list[dict[str,Any]]"""


class FitDocument(_Part):
    """``fit.json`` of ``python -m analysis fit`` (and ``paper``); docs/analysis.md describes every part. Every
    top-level key is written (null, or empty, where a part does not apply) except those in ``_omit``, present only
    when they apply: ``without_flagged``, ``paper`` and the sections a flag of ``fit`` asks for. ``compute``: the
    compute column fitted (pflops_days or pflops_days_6nd)."""

    _fields = """schema_version:int created:str source:str study:str baseline:str compute:str compute_units:str
        n_runs:int sizes:list[str] excluded_runs:list[dict[str,Any]] bootstrap:BootstrapInfo
        variants:dict[str,VariantLaw] multipliers:dict[str,Multiplier] losses:list[dict[str,Any]]
        paired_deltas:list[dict[str,Any]] outliers:OutlierReport protocols:dict[str,ProtocolComparison]
        without_flagged:dict[str,Any]|None precision:dict[str,Any]|None paper:dict[str,Any]|None
        block_size_sweep:BlockSizeSweep ablations:list[dict[str,Any]]|None arch_grid:ArchGrid
        wallclock:dict[str,Any]|None rollout:dict[str,Any]|None e_sensitivity:dict[str,Any]|None
        nd_fit:dict[str,Any]|None files:list[str]"""
    _omit = "without_flagged paper wallclock rollout e_sensitivity nd_fit"

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> FitDocument:
        """Load a fit.json file (any version: missing keys take their defaults, unknown ones are kept)."""
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))
