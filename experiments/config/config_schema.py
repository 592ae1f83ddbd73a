"""Structured configs (Hydra ConfigStore) of the ``train`` node and the ``optimizer`` and ``scheduler`` groups, and
the model node built as what types it, an ``attnres.ModelConfig`` (:func:`build_model_config`).

Each dataclass types its node, so a value of the wrong type (``train.batch_size=abc``) fails when the config is
composed, with the key named. The YAML files keep every default: conf/optimizer/*.yaml and conf/scheduler/*.yaml
pull their schema in through their defaults list (``/schema/<group>/<name>@_here_``, before ``_self_``),
conf/train.yaml pulls ``/schema/train@train`` in after ``_self_`` (so the node keeps its place in the printed
config); every field here is MISSING (but ``_target_``, ``_partial_``) and the fields are exactly the YAML's
keys, so the composed tree, and with it every config_hash, is what the YAML alone gives. Range checks live in
``__post_init__`` and run when :func:`experiments.config.validation.check_config` builds the node's object
(``OmegaConf.to_object``): a ValueError naming the key and what is allowed.

``train.tokens`` and ``train.flops_budget`` are typed ``Any``: a size gives an integer or a float (a float type
would turn 540000 into 540000.0 and move the config_hash), and a bad value must fail with the check's message.

Importing this module registers the schemas (experiments.config.validation imports it, and experiments.train that).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

if TYPE_CHECKING:
    from attnres import ModelConfig


def positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{key}={value!r} must be a positive integer")
    return value


def number(value: Any, key: str, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> float:
    """``value`` as a float when it is a finite number in the interval, else ValueError naming ``key``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        lb, rb = "(" if lo_open else "[", ")" if hi_open else "]"
        raise ValueError(f"{key}={value!r} must be a number in {lb}{lo}, {hi}{rb}")
    return float(value)


def check_budgets(budgets: Any, flops_budget: Any) -> None:
    """``train.budgets``: a list of tokens per parameter, each positive, strictly increasing (so none twice), and
    no ``train.flops_budget`` beside it; a ValueError naming the key otherwise. The checks that need the step counts
    (each decay after the warm-up) are experiments.run.budgets.plan_budgets'."""
    key = "train.budgets"
    if isinstance(budgets, (str, bytes)) or not hasattr(budgets, "__len__") or len(budgets) == 0:
        raise ValueError(f"{key}={budgets!r} must be a non-empty list of tokens per parameter, e.g. [8,32,128]")
    values = list(budgets)
    for i, b in enumerate(values):
        number(b, f"{key}[{i}]", 0, float("inf"), lo_open=True)
    for i in range(1, len(values)):
        if values[i] == values[i - 1]:
            raise ValueError(f"{key}={values!r} holds {values[i]!r} twice: each budget is one branch")
        if values[i] < values[i - 1]:
            raise ValueError(f"{key}={values!r} is not sorted: list the budgets in increasing order")
    if flops_budget is not None:
        raise ValueError(
            f"{key} and train.flops_budget={flops_budget!r} are both set: budgets give each branch its token count; "
            "set train.flops_budget=null"
        )


def check_adamw_settings(node: Any) -> None:
    """The AdamW settings ``optimizer=adamw`` and ``optimizer=muon`` (its AdamW part) share: betas, eps, weight
    decays, the residual scheme's lr scale (in [0, 100])."""
    if len(node.betas) != 2:
        raise ValueError(f"optimizer.betas={list(node.betas)!r} must be two numbers in [0, 1)")
    for i, b in enumerate(node.betas):
        number(b, f"optimizer.betas[{i}]", 0, 1, hi_open=True)
    for key in ("weight_decay", "connection_weight_decay", "eps"):
        number(getattr(node, key), f"optimizer.{key}", 0, float("inf"))
    number(node.connection_lr_scale, "optimizer.connection_lr_scale", 0, 100)


def check_warmup(node: Any) -> None:
    """The warm-up settings every schedule shares: ``warmup_fraction`` in [0, 1), ``warmup_steps`` >= 0 or null."""
    number(node.warmup_fraction, "scheduler.warmup_fraction", 0, 1, hi_open=True)
    if node.warmup_steps is not None and node.warmup_steps < 0:
        raise ValueError(f"scheduler.warmup_steps={node.warmup_steps!r} must be an integer >= 0 or null")


@dataclass
class TrainSchema:
    """``train``: how long a run trains and how it is evaluated (conf/train.yaml)."""

    tokens: Any = MISSING  # int | float | None: size.tokens
    flops_budget: Any = MISSING  # int | float | None: size.flops_budget
    batch_size: int = MISSING
    seq_len: int = MISSING
    log_every: int = MISSING
    eval_count: int = MISSING
    val_sequences: int = MISSING
    val_batch_size: int = MISSING
    # list[int | float] | None: tokens per parameter of each decay branch (experiments.run.budgets)
    budgets: Any = MISSING

    def __post_init__(self) -> None:
        if self.budgets is not None:
            check_budgets(self.budgets, self.flops_budget)
        if self.flops_budget is not None:
            number(self.flops_budget, "train.flops_budget (size.flops_budget)", 0, float("inf"), lo_open=True)
        if self.tokens is not None:
            number(self.tokens, "train.tokens (size.tokens)", 0, float("inf"), lo_open=True)
        elif self.flops_budget is None:
            raise ValueError(
                "train.tokens (size.tokens) and train.flops_budget are both null: set a token count "
                "(train.tokens=...) or a compute budget in FLOPs (train.flops_budget=...)"
            )
        for key in ("batch_size", "seq_len", "log_every", "eval_count", "val_sequences", "val_batch_size"):
            positive_int(getattr(self, key), f"train.{key}")


@dataclass
class AdamWSchema:
    """``optimizer=adamw``: experiments.training.optim.adamw, completed with the model in
    LMModule.configure_optimizers."""

    _target_: str = "experiments.training.optim.adamw"
    _partial_: bool = True
    lr: float = MISSING
    betas: list[float] = MISSING
    eps: float = MISSING
    weight_decay: float = MISSING
    connection_weight_decay: float = MISSING
    fused: bool | None = MISSING
    connection_lr_scale: float = MISSING

    def __post_init__(self) -> None:
        number(self.lr, "optimizer.lr (size.lr)", 0, 10, lo_open=True)
        check_adamw_settings(self)


@dataclass
class WarmupCosineSchema:
    """``scheduler=cosine``: experiments.training.optim.warmup_cosine, completed with the optimizer and the step
    count."""

    _target_: str = "experiments.training.optim.warmup_cosine"
    _partial_: bool = True
    warmup_fraction: float = MISSING
    warmup_steps: int | None = MISSING
    min_lr_ratio: float = MISSING

    def __post_init__(self) -> None:
        check_warmup(self)
        number(self.min_lr_ratio, "scheduler.min_lr_ratio", 0, 1)


# the values experiments.training.optim accepts (there: NS_DTYPES, WSD_SHAPES; tests/test_muon.py checks they agree):
# kept here too so that composing a config never imports torch
NS_DTYPES = (None, "bfloat16", "float32")
WSD_SHAPES = ("linear", "1-sqrt")


@dataclass
class MuonSchema:
    """``optimizer=muon``: experiments.training.optim.muon (Muon for the sublayer matrices, AdamW for the rest)."""

    _target_: str = "experiments.training.optim.muon"
    _partial_: bool = True
    lr: float = MISSING
    momentum: float = MISSING
    nesterov: bool = MISSING
    ns_steps: int = MISSING
    adjust_lr_fn: str = MISSING
    ns_dtype: str | None = MISSING
    weight_decay: float = MISSING
    betas: list[float] = MISSING
    eps: float = MISSING
    connection_weight_decay: float = MISSING
    fused: bool | None = MISSING
    connection_lr_scale: float = MISSING

    def __post_init__(self) -> None:
        number(self.lr, "optimizer.lr (size.lr)", 0, 10, lo_open=True)
        number(self.momentum, "optimizer.momentum", 0, 1, hi_open=True)
        positive_int(self.ns_steps, "optimizer.ns_steps")
        if self.adjust_lr_fn not in ("original", "match_rms_adamw"):
            raise ValueError(f"optimizer.adjust_lr_fn={self.adjust_lr_fn!r}; allowed values: original, match_rms_adamw")
        if self.ns_dtype not in NS_DTYPES:
            raise ValueError(f"optimizer.ns_dtype={self.ns_dtype!r}; allowed values: null, bfloat16, float32")
        check_adamw_settings(self)


@dataclass
class WSDSchema:
    """``scheduler=wsd``: experiments.training.optim.wsd, completed with the optimizer and the step count."""

    _target_: str = "experiments.training.optim.wsd"
    _partial_: bool = True
    warmup_fraction: float = MISSING
    warmup_steps: int | None = MISSING
    decay_fraction: float = MISSING
    min_lr_ratio: float = MISSING
    shape: str = MISSING

    def __post_init__(self) -> None:
        check_warmup(self)
        number(self.decay_fraction, "scheduler.decay_fraction", 0, 1)
        number(self.min_lr_ratio, "scheduler.min_lr_ratio", 0, 1)
        if self.shape not in WSD_SHAPES:
            raise ValueError(f"scheduler.shape={self.shape!r}; allowed values: {', '.join(WSD_SHAPES)}")


SCHEMAS = {
    "train": TrainSchema,
    "optimizer/adamw": AdamWSchema,
    "optimizer/muon": MuonSchema,
    "scheduler/cosine": WarmupCosineSchema,
    "scheduler/wsd": WSDSchema,
}


def register() -> None:
    """Store every schema as ``schema/<group>/<name>`` (``schema/train``) in Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    for path, node in SCHEMAS.items():
        group, _, name = f"schema/{path}".rpartition("/")
        cs.store(group=group, name=name, node=node)


MODEL_NON_FIELDS = ("_target_", "variant")  # keys of cfg.model that are not ModelConfig fields


def build_model_config(cfg: DictConfig) -> ModelConfig:
    """attnres.ModelConfig (the model node's ``_target_``) instantiated from cfg.model; its ``variant`` is a label,
    not a field. A key that is not a field, or a value ModelConfig refuses, raises ValueError naming it."""
    from hydra.errors import InstantiationException
    from hydra.utils import get_class, instantiate

    node = OmegaConf.to_container(cfg.model, resolve=True)
    node.pop("variant", None)
    node.setdefault("_target_", "attnres.ModelConfig")
    fields = [f.name for f in dataclasses.fields(get_class(node["_target_"]))]
    unknown = sorted(set(node) - set(fields) - set(MODEL_NON_FIELDS))
    if unknown:
        raise ValueError(f"model.{unknown[0]} is not a model setting; allowed keys: {', '.join(fields)} (and variant)")
    try:
        return instantiate(node, _convert_="all")
    except InstantiationException as e:  # Hydra wraps what the target raised: the ModelConfig check's own message
        if isinstance(e.__cause__, ValueError):
            raise e.__cause__ from None
        raise
