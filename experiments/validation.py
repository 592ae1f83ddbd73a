"""Config checks before anything heavy runs: :func:`check_config` (every setting the harness reads, failing with
a message naming the key and what is allowed), :func:`planned_steps` (a run's step count from its token count or
FLOP budget, conflicts named) and :func:`build_model_config` (``cfg.model`` as an ``attnres.ModelConfig``).

Light on purpose: omegaconf and experiments.sizes at import, torch only where a check needs it (a CUDA device,
the model config), so ``experiments.train`` runs these before Lightning or torch is imported.
"""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .sizes import steps_for, steps_for_budget

ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "auto")
PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true", "64")
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_find_unused_parameters_true", "fsdp", "single_device")
TOKENIZERS = ("bytes", "bpe")  # experiments.data.TOKENIZERS, restated so the checks run before torch is imported


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{key}={value!r} must be a positive integer")
    return value


def _number(value: Any, key: str, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        lb, rb = "(" if lo_open else "[", ")" if hi_open else "]"
        raise ValueError(f"{key}={value!r} must be a number in {lb}{lo}, {hi}{rb}")
    return float(value)


def check_config(cfg: DictConfig) -> None:
    """Fail before training with a message naming the key and what is allowed (the model's own fields are
    checked by attnres.ModelConfig, the data by experiments.data)."""
    if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool) or cfg.seed < 0:
        raise ValueError(f"seed={cfg.seed!r} must be an integer >= 0")
    if cfg.threads is not None:
        _positive_int(cfg.threads, "threads")
    for key in ("compile", "activation_checkpointing", "force"):
        if not isinstance(cfg[key], bool):
            raise ValueError(f"{key}={cfg[key]!r} must be true or false")
    if not cfg.model.get("variant") or not isinstance(cfg.model.variant, str):
        raise ValueError("model.variant must be a non-empty name (the model config's file name)")
    # train
    t = cfg.train
    budget = t.get("flops_budget")
    if budget is not None:
        _number(budget, "train.flops_budget (size.flops_budget)", 0, float("inf"), lo_open=True)
    if t.tokens is not None:
        _number(t.tokens, "train.tokens (size.tokens)", 0, float("inf"), lo_open=True)
    elif budget is None:
        raise ValueError("train.tokens (size.tokens) and train.flops_budget are both null: set a token count "
                         "(train.tokens=...) or a compute budget in FLOPs (train.flops_budget=...)")
    for key in ("batch_size", "seq_len", "log_every", "eval_count", "val_sequences", "val_batch_size"):
        _positive_int(t[key], f"train.{key}")
    # optimizer
    o = cfg.optimizer
    if "_target_" not in o:
        raise ValueError("optimizer needs a _target_ (e.g. optimizer=adamw)")
    if "lr" in o:
        _number(o.lr, "optimizer.lr (size.lr)", 0, 10, lo_open=True)
    if "betas" in o:
        if len(o.betas) != 2:
            raise ValueError(f"optimizer.betas={list(o.betas)!r} must be two numbers in [0, 1)")
        for i, b in enumerate(o.betas):
            _number(b, f"optimizer.betas[{i}]", 0, 1, hi_open=True)
    for key in ("weight_decay", "connection_weight_decay", "eps"):
        if key in o:
            _number(o[key], f"optimizer.{key}", 0, float("inf"))
    # scheduler
    s = cfg.scheduler
    if "_target_" not in s:
        raise ValueError("scheduler needs a _target_ (e.g. scheduler=cosine)")
    if "warmup_fraction" in s:
        _number(s.warmup_fraction, "scheduler.warmup_fraction", 0, 1, hi_open=True)
    if s.get("warmup_steps") is not None:
        if isinstance(s.warmup_steps, bool) or not isinstance(s.warmup_steps, int) or s.warmup_steps < 0:
            raise ValueError(f"scheduler.warmup_steps={s.warmup_steps!r} must be an integer >= 0 or null")
    if "min_lr_ratio" in s:
        _number(s.min_lr_ratio, "scheduler.min_lr_ratio", 0, 1)
    # trainer
    tr = cfg.trainer
    if tr.get("accelerator") not in ACCELERATORS:
        raise ValueError(f"trainer.accelerator={tr.get('accelerator')!r}; allowed values: {', '.join(ACCELERATORS)}")
    if str(tr.get("precision")) not in PRECISIONS:
        raise ValueError(f"trainer.precision={tr.get('precision')!r}; allowed values: {', '.join(PRECISIONS)}")
    strategy = tr.get("strategy")
    if not (isinstance(strategy, DictConfig) and "_target_" in strategy) and strategy not in STRATEGIES:
        raise ValueError(f"trainer.strategy={strategy!r}; allowed values: {', '.join(STRATEGIES)} or a node with "
                         "a _target_ (see trainer/fsdp.yaml)")
    if tr.get("accelerator") in ("gpu", "cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"trainer.accelerator={tr.accelerator!r} but torch sees no CUDA device; use trainer=cpu "
                             "(or install a CUDA build of torch on a GPU machine)")
    _positive_int(tr.get("accumulate_grad_batches", 1), "trainer.accumulate_grad_batches")
    if tr.get("gradient_clip_val") is not None:
        _number(tr.gradient_clip_val, "trainer.gradient_clip_val", 0, float("inf"))
    # data
    d = cfg.data
    if not d.get("name"):
        raise ValueError("data.name must be 'stdlib' or the directory of prepared token shards")
    if d.get("tokenizer") not in TOKENIZERS:
        raise ValueError(f"data.tokenizer={d.get('tokenizer')!r}; allowed values: {', '.join(TOKENIZERS)}")
    if d.get("vocab_size") is not None:
        _positive_int(d.vocab_size, "data.vocab_size")
    if d.get("num_workers", 0) < 0:
        raise ValueError(f"data.num_workers={d.num_workers!r} must be >= 0")


def planned_steps(train_cfg: DictConfig, flops_per_token: float) -> int:
    """Optimizer steps of a run: from train.tokens, or from train.flops_budget C as D = C / flops_per_token
    (attnres.flops_per_token(model, seq_len).total), each rounded to whole batches of batch_size x seq_len.

    Both may be set only when they agree on the step count; otherwise this names both keys and what each gives.
    """
    batch, seq = int(train_cfg.batch_size), int(train_cfg.seq_len)
    tokens, budget = train_cfg.tokens, train_cfg.get("flops_budget")
    by_tokens = steps_for(float(tokens), batch, seq) if tokens is not None else None
    if budget is None:
        if by_tokens is None:
            raise ValueError("train.tokens and train.flops_budget are both null: set one of them")
        return by_tokens
    by_budget = steps_for_budget(float(budget), flops_per_token, batch, seq)
    if by_tokens is not None and by_tokens != by_budget:
        raise ValueError(
            f"train.tokens (size.tokens)={tokens!r} gives {by_tokens} steps but train.flops_budget={budget!r} gives "
            f"{by_budget} steps ({by_budget * batch * seq:,} tokens at {flops_per_token:.4g} FLOPs/token): they "
            "conflict. Set one of them to null (train.tokens=null to train for the budget, or "
            "train.flops_budget=null to train for the token count)"
        )
    return by_budget



MODEL_NON_FIELDS = ("_target_", "variant")  # keys of cfg.model that are not ModelConfig fields


def build_model_config(cfg: DictConfig):
    """attnres.ModelConfig from cfg.model (its `variant` name is a label, not a field)."""
    import dataclasses

    from hydra.utils import get_class

    node = OmegaConf.to_container(cfg.model, resolve=True)
    target = get_class(node.get("_target_", "attnres.ModelConfig"))
    kwargs = {k: v for k, v in node.items() if k not in MODEL_NON_FIELDS}
    fields = [f.name for f in dataclasses.fields(target)]
    unknown = sorted(set(kwargs) - set(fields))
    if unknown:
        raise ValueError(f"model.{unknown[0]} is not a model setting; allowed keys: {', '.join(fields)} (and variant)")
    return target(**kwargs)

