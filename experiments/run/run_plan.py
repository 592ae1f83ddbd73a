"""What a run will train, found before anything is written: the data loaded and checked, the model config, the
step count (:func:`planned_steps`) and the evaluation interval (:func:`plan_run`). Training (experiments.train) and the
harness benchmark's plain loop (experiments.bench.harness) both start from it, so they see the same data and the same
schedule.

Torch, no Lightning: the datamodule class is imported only when ``cfg.data`` is instantiated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, open_dict

from results.config_hash import data_fingerprint

from ..config.config_schema import build_model_config
from ..sizes import steps_for, steps_for_budget


@dataclass(frozen=True)
class RunPlan:
    """The checked inputs of one run; nothing of it is written anywhere yet."""

    datamodule: Any  # experiments.training.datamodule.TokenDataModule, loaded and checked against the model
    model_config: Any  # attnres.ModelConfig
    steps: int  # optimizer steps
    flops_per_token: float  # attnres.flops_per_token(model_config, seq_len).total
    eval_every: int  # optimizer steps between evaluations (the last step is always evaluated)
    dataset: str  # the shards' path
    data_fingerprint: str  # results.config_hash.data_fingerprint of the shards' checksums

    @property
    def tokens_per_step(self) -> int:
        return int(self.datamodule.batch_size) * int(self.datamodule.seq_len)


def instantiate_datamodule(cfg: DictConfig) -> Any:
    """``cfg.data`` with the batch geometry of ``cfg.train`` and the trainer's gradient accumulation (not loaded)."""
    from hydra.utils import instantiate

    return instantiate(
        cfg.data,
        seq_len=int(cfg.train.seq_len),
        batch_size=int(cfg.train.batch_size),
        seed=int(cfg.seed),
        val_sequences=int(cfg.train.val_sequences),
        val_batch_size=int(cfg.train.val_batch_size),
        accumulate_grad_batches=int(cfg.trainer.get("accumulate_grad_batches", 1)),
        _recursive_=False,
    )


def plan_run(cfg: DictConfig, progress: bool = True) -> RunPlan:
    """Load and check the data, build the model config, plan the steps; a ValueError names what to change.

    Data first, so bad data fails before a model config is built. Fills in ``cfg.data.vocab_size`` from the data
    when it is null (``model.vocab_size`` interpolates it). Writes nothing except the dataset cache.
    """
    from attnres import flops_per_token

    datamodule = instantiate_datamodule(cfg)
    shards = datamodule.load(progress=progress)
    with open_dict(cfg):
        if cfg.data.vocab_size is None:
            cfg.data.vocab_size = datamodule.dataset_vocab_size
    model_config = build_model_config(cfg)
    datamodule.check(model_config.vocab_size)
    fpt = flops_per_token(model_config, int(cfg.train.seq_len)).total
    steps = planned_steps(cfg.train, fpt)  # a token count, or a FLOP budget's tokens; conflicts fail here
    return RunPlan(
        datamodule,
        model_config,
        steps,
        fpt,
        math.ceil(steps / int(cfg.train.eval_count)),
        str(shards.path),
        data_fingerprint(shards.header.checksum),
    )


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
