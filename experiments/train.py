"""Train one model: ``python -m experiments.train [overrides]`` (console script ``attnres-train``).

    python -m experiments.train experiment=cpu_ladder size=cpu_xs                 # the README's main command
    python -m experiments.train experiment=smoke model=full_attnres               # seconds
    python -m experiments.train -m experiment=cpu_ladder model=baseline,full_attnres,block_attnres seed=0,1

A run is identified by ``config_hash`` = sha256 of the resolved config minus the keys in HASH_EXCLUDE (where
files go, loggers, callbacks, device/launch settings, fault injection; the seed is included). Its directory
is ``<paths.runs_root>/<study>/<variant>_<size>_s<seed>_<hash8>``, so relaunching the same config finds it:
training resumes from ``checkpoints/last.ckpt``, and a run already ``completed`` in the study's results.csv
is skipped (``force=true`` re-runs it, moving the old directory aside). Every run that started training, failed
and interrupted ones included, writes ``results.json`` and one record to the study's ledger
(``<paths.runs_root>/<study>/records/``, from which ``results.csv`` is derived; experiments/records.py). A config
or data error found before training writes nothing. One process trains a run at a time (a lock under
``<study>/.locks/``); SIGINT / SIGTERM / SIGUSR1 save a checkpoint at the current step and stop.

Run directory: results.json, config.yaml (resolved), environment.json (exact dataset, versions), metrics.csv,
diagnostics.json(+l), checkpoints/last.ckpt, and the loggers' files (wandb/, csv_logs/).

Lightning is imported only inside :func:`train`, so ``--help`` and config composition stay fast.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from . import records, resolvers
from .errors import RunBusy, RunInterrupted, SetupError
from .sizes import steps_for, steps_for_budget

# Before @hydra.main composes: the attnres_* resolvers the configs use (hydra.run.dir, derived sizes, tuned lr).
resolvers.register()

# Keys that do not change a run's results: where files go, what mirrors them, how/where it runs. Everything
# else (model, size, data, optimizer, scheduler, train, seed, precision, clipping, accumulation, compile)
# is part of the run's identity.
HASH_EXCLUDE = (
    "paths", "logger", "callbacks", "hydra", "run_id", "study", "project", "tags", "threads", "force", "fault",
    "tuned_lr",
    "activation_checkpointing", "train.log_every",
    "data.num_workers", "data.cache_dir",
    "trainer.accelerator", "trainer.devices", "trainer.num_nodes", "trainer.strategy",
    "trainer.enable_progress_bar", "trainer.enable_model_summary", "trainer.num_sanity_val_steps",
    "trainer.use_distributed_sampler", "trainer.deterministic", "trainer.plugins",
)
# Settings added after runs were recorded: left out of the hash while unset (null), so that every run recorded
# before they existed keeps its config_hash (and is still found completed on relaunch).
HASH_DROP_IF_NULL = ("train.flops_budget",)
# Likewise left out while they hold their default: lr_protocol=baseline is what every run did before it existed
# (the resolved lr itself is always in the hash).
HASH_DROP_IF_DEFAULT = (("lr_protocol", "baseline"),)
ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "auto")
PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true", "64")
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_find_unused_parameters_true", "fsdp", "single_device")
MODEL_NON_FIELDS = ("_target_", "variant")
TOKENIZERS = ("bytes", "bpe")  # experiments.data.TOKENIZERS, restated so the checks run before torch is imported


# ---------------------------------------------------------------------------------------------------------
# Configuration: checks, identity


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


def _drop(tree: dict[str, Any], dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        tree = tree.get(p)
        if not isinstance(tree, dict):
            return
    tree.pop(leaf, None)


def resolved_container(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain Python, every interpolation resolved (a clear error for missing mandatory keys)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]
    except MissingMandatoryValue as e:
        key = getattr(e, "full_key", None) or str(e)
        hint = " (data=shards needs data.name=<dir of prepared shards>)" if "data.name" in str(key) else ""
        raise ValueError(f"config key {key} has no value (???); set it on the command line, e.g. {key}=...{hint}") from None
    except OmegaConfBaseException as e:
        raise ValueError(f"the config does not resolve: {e}") from None


def identity_config(container: dict[str, Any]) -> dict[str, Any]:
    """The part of the resolved config that defines the experiment (what config_hash covers)."""
    ident = copy.deepcopy(container)
    for key in HASH_EXCLUDE:
        _drop(ident, key)
    for key in HASH_DROP_IF_NULL:
        parent, _, leaf = key.rpartition(".")
        node = ident.get(parent) if parent else ident
        if isinstance(node, dict) and leaf in node and node[leaf] is None:
            del node[leaf]
    for key, default in HASH_DROP_IF_DEFAULT:
        if ident.get(key) == default:
            del ident[key]
    return ident


def run_identity(cfg: DictConfig) -> tuple[str, str, Path, Path]:
    """(config_hash, run_id, run_dir, study directory) of a composed config."""
    container = resolved_container(cfg)
    chash = records.config_hash(identity_config(container))
    run_id = f"{cfg.model.variant}_{cfg.size.name}_s{cfg.seed}_{chash[:8]}"
    study_dir = Path(cfg.paths.runs_root).expanduser().resolve() / str(cfg.study)
    return chash, run_id, study_dir / run_id, study_dir


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


def _is_rank_zero() -> bool:
    """Whether this process is global rank zero, decided before a Trainer exists the way the Trainer will decide
    it: the cluster environment Lightning detects (SLURM: SLURM_PROCID under srun; torchelastic: RANK) gives the
    global rank; otherwise Lightning's own launcher's LOCAL_RANK and NODE_RANK (both 0 for rank zero)."""
    from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment, TorchElasticEnvironment

    for env_type in (SLURMEnvironment, TorchElasticEnvironment):  # the order of Lightning's accelerator connector
        if env_type.detect():
            return env_type().global_rank() == 0
    env = LightningEnvironment()
    return env.local_rank() == 0 and env.node_rank() == 0


# Run lock (issue 15 #5). filelock's SoftFileLease: a marker file created exclusively (safe on NFS), holding host,
# pid, process start time and a token, refreshed by a heartbeat thread. A marker whose owner is a dead process on
# this host is taken over at once; one from another host only after it stayed unchanged for LOCK_LEASE_S on the
# contender's own monotonic clock (no clock sync needed). LOCK_LEASE_S is far above NFS attribute caching
# (acregmax, 60 s by default), so a live holder's heartbeat is never missed. Every contender must agree on it.
LOCK_LEASE_S = float(os.environ.get("ATTNRES_LOCK_LEASE_S", 300))
LOCK_HEARTBEAT_S = LOCK_LEASE_S / 10


def _acquire_run_lock(study_dir: Path, run_id: str):
    """The run's lock, acquired; RunBusy (with the holder's host and pid) when a live process holds it."""
    import filelock

    path = study_dir / ".locks" / f"{run_id}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.SoftFileLease(str(path), lease_duration=LOCK_LEASE_S, heartbeat_interval=LOCK_HEARTBEAT_S,
                                  thread_local=False)
    try:
        lock.acquire(timeout=0)
        return lock
    except filelock.Timeout:
        pass
    owner = lock.owner
    import socket

    here = socket.gethostname()  # filelock writes it, plus "?pidns-<n>" inside a PID namespace
    if owner is not None and owner.hostname != here and not owner.hostname.startswith(here + "?"):
        # Another node: alive only if its heartbeat moves. Watch it for one lease (a crashed node's marker is then
        # taken over); a live holder keeps it.
        print(f"[attnres] {run_id}: locked by {owner.hostname} pid {owner.pid}; waiting up to {LOCK_LEASE_S:.0f} s "
              f"for its heartbeat ({path})", flush=True)
        try:
            lock.acquire(timeout=LOCK_LEASE_S + 2 * LOCK_HEARTBEAT_S, poll_interval=min(5.0, LOCK_HEARTBEAT_S))
            return lock
        except filelock.Timeout:
            owner = lock.owner or owner
    who = f"{owner.hostname} pid {owner.pid}" if owner is not None else "another process"
    raise RunBusy(f"{run_id} is being trained right now by {who} (lock {path}, heartbeat every "
                  f"{LOCK_HEARTBEAT_S:.0f} s); not starting a second copy. It is released when that run ends; a "
                  f"holder that died is taken over at once on its own host, after {LOCK_LEASE_S:.0f} s elsewhere")


# ---------------------------------------------------------------------------------------------------------
# The run


class _Run:
    """Everything a result record is made of, filled in as the run progresses (so a failure records what it had)."""

    def __init__(self, cfg: DictConfig, chash: str, run_id: str, run_dir: Path, study_dir: Path,
                 setup: "_Setup") -> None:
        self.cfg, self.chash, self.run_id, self.run_dir, self.study_dir = cfg, chash, run_id, run_dir, study_dir
        self.table = study_dir / records.RESULTS_TABLE
        self.setup = setup
        self.started_at = records.utc_now()
        self.t0 = time.time()
        self.model_config = setup.model_config
        self.module = None
        self.trainer = None
        self.recorder = None
        self.steps_total: int | None = setup.steps
        self.completed = False  # set once the completed record is written; nothing may overwrite it after
        self.tokens_per_step = int(cfg.train.batch_size) * int(cfg.train.seq_len)

    def record(self, status: str, error: str = "") -> dict[str, Any]:
        from attnres import flops_per_token

        cfg, mc = self.cfg, self.model_config
        rec: dict[str, Any] = dict(
            run_id=self.run_id, study=str(cfg.study), variant=str(cfg.model.variant), residual=str(cfg.model.residual),
            size=str(cfg.size.name), seed=int(cfg.seed), status=status, seq_len=int(cfg.train.seq_len),
            batch_size=int(cfg.train.batch_size), lr=float(cfg.optimizer.lr) if "lr" in cfg.optimizer else None,
            git_commit=records.git_commit(), config_hash=self.chash, run_dir=str(self.run_dir), error=error,
            started_at=self.started_at, finished_at=records.utc_now(), wall_time_s=round(time.time() - self.t0, 3),
            flops_budget=_float_or_none(cfg.train.get("flops_budget")),
            d_over_lb=_float_or_none(cfg.size.get("d_over_lb")), heads_over_lb=_float_or_none(cfg.size.get("heads_over_lb")),
            lr_protocol=str(cfg.get("lr_protocol") or ""),
            dataset=self.setup.dataset, data_fingerprint=self.setup.data_fingerprint, threads=_threads(),
        )
        if mc is not None:
            import torch

            from attnres import Transformer

            if self.module is not None:
                params, non_emb = self.module.num_params(), self.module.num_params(non_embedding=True)
            else:
                with torch.device("meta"):
                    m = Transformer(mc)
                params, non_emb = m.num_params(), m.num_params(non_embedding=True)
            fpt = flops_per_token(mc, int(cfg.train.seq_len)).total
            steps = int(self.trainer.global_step) if self.trainer is not None else 0
            tokens = steps * self.tokens_per_step
            rec.update(
                n_layers=mc.n_layers, d_model=mc.d_model, n_heads=mc.n_heads, d_ff=mc.d_ff,
                block_size=mc.sublayers_per_block if mc.residual == "block" else None,
                n_blocks=mc.effective_n_blocks if mc.residual == "block" else None,
                params=params, params_non_embedding=non_emb, tokens=tokens, flops_per_token=fpt,
                flops=fpt * tokens, pflops_days=fpt * tokens / (1e15 * 86400), flops_6nd=6.0 * non_emb * tokens,
                pflops_days_6nd=6.0 * non_emb * tokens / (1e15 * 86400), steps=steps,
            )
        if self.recorder is not None:
            rec["started_at"] = self.recorder.started_at  # first launch of a resumed run
            rec["wall_time_s"] = round(self.recorder.wall_time_s(), 3)
            rec["train_loss"] = self.recorder.last_train_loss
            ev = self.recorder.last_eval
            if status == "completed" and ev is not None and ev["step"] == rec.get("steps"):
                rec["val_loss"] = ev["val_loss"]
            if status == "completed":
                rec["health"] = ",".join(self.recorder.health_flags(self.steps_total or rec.get("steps") or 0)) or "ok"
        return records.make_record(**rec)

    def write(self, record: dict[str, Any]) -> None:
        record["record_id"] = records.add_record(self.study_dir, record)
        records.write_json(self.run_dir / records.RESULTS_JSON, record)


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _float_or_none(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):  # an invalid setting is recorded as missing; check_config names it
        return None


def _instantiate_loggers(cfg: DictConfig, wandb_id: str) -> list[Any]:
    from hydra.utils import instantiate

    loggers = []
    for name, node in (cfg.get("logger") or {}).items():
        if isinstance(node, DictConfig) and "_target_" in node:
            extra = {"id": wandb_id} if node._target_.endswith("wandb_logger") else {}
            loggers.append(instantiate(node, **extra))
    return loggers


def _instantiate_callbacks(cfg: DictConfig) -> list[Any]:
    from hydra.utils import instantiate

    bar = cfg.trainer.get("enable_progress_bar", True)  # a progress-bar callback with the bar off is an error
    return [instantiate(node) for node in (cfg.get("callbacks") or {}).values()
            if isinstance(node, DictConfig) and "_target_" in node and (bar or "ProgressBar" not in node._target_)]


def _wandb_id(run_dir: Path, resuming: bool) -> str:
    """A W&B run id that a resumed launch reuses (its curves continue), and a fresh launch renews."""
    path = run_dir / "wandb_id.txt"
    if resuming and path.is_file():
        return path.read_text().strip()
    wid = uuid.uuid4().hex[:12]
    records.atomic_write_text(path, wid + "\n")
    return wid


def _environment(datamodule) -> dict[str, Any]:
    """What else a result depends on beyond config.yaml: the exact data and the software."""
    import platform

    import lightning
    import torch

    from attnres import cpu_kernels

    header = datamodule.load().header
    return {
        "dataset": {"path": str(datamodule.load().path), "tokenizer": header.tokenizer, "vocab_size": header.vocab_size,
                    "n_tokens": header.n_tokens, "checksum": header.checksum, "source": header.source,
                    "fingerprint": records.ledger.data_fingerprint(header.checksum),
                    "verified": datamodule.verified},  # the files hashed against the checksums, or a valid stamp
        "python": platform.python_version(), "torch": torch.__version__, "lightning": lightning.__version__,
        "git_commit": records.git_commit(), "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None, "host": platform.node(),
        "cpu_kernels": cpu_kernels.status(),  # CPU fp32 depth mixing: compiled kernels or the torch path
        "argv": sys.argv,
    }


def _quiet_lightning() -> None:
    """One copy of each Lightning message (under Hydra the root logger already prints them) and no ads."""
    import logging

    if logging.getLogger().handlers:
        lightning_logger = logging.getLogger("lightning")
        for handler in list(lightning_logger.handlers):
            lightning_logger.removeHandler(handler)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(getattr(f, "attnres", False) for f in rank_zero.filters):
        class _NoTips(logging.Filter):
            attnres = True

            def filter(self, record: logging.LogRecord) -> bool:
                return "Tip:" not in record.getMessage()

        rank_zero.addFilter(_NoTips())
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")


def _finish_wandb(exit_code: int, record: dict[str, Any] | None = None) -> None:
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            if record is not None:  # the result record mirrored into the run summary (analysis --wandb reads it)
                wandb.run.summary.update({f"results/{k}": v for k, v in record.items() if v is not None})
            wandb.finish(exit_code=exit_code)


class _Setup:
    """What the checks before training found: the data, the model config and the schedule (nothing written yet)."""

    def __init__(self, datamodule: Any, model_config: Any, steps: int, fpt: float, eval_every: int) -> None:
        self.datamodule, self.model_config, self.steps, self.fpt, self.eval_every = (
            datamodule, model_config, steps, fpt, eval_every)
        shards = datamodule.load()
        self.dataset = str(shards.path)
        self.data_fingerprint = records.ledger.data_fingerprint(shards.header.checksum)


def _prepare(cfg: DictConfig) -> _Setup:
    """Load and check the data, build the model config, plan the steps (torch, no Lightning; writes nothing
    except the dataset cache). Data first: bad data fails before a model is built."""
    from hydra.utils import instantiate

    from attnres import flops_per_token

    datamodule = instantiate(
        cfg.data, seq_len=int(cfg.train.seq_len), batch_size=int(cfg.train.batch_size), seed=int(cfg.seed),
        val_sequences=int(cfg.train.val_sequences), val_batch_size=int(cfg.train.val_batch_size),
        accumulate_grad_batches=int(cfg.trainer.get("accumulate_grad_batches", 1)), _recursive_=False,
    )
    datamodule.load()
    with open_dict(cfg):
        if cfg.data.vocab_size is None:
            cfg.data.vocab_size = datamodule.dataset_vocab_size  # model.vocab_size interpolates it
    model_config = build_model_config(cfg)
    datamodule.check(model_config.vocab_size)
    fpt = flops_per_token(model_config, int(cfg.train.seq_len)).total
    total = planned_steps(cfg.train, fpt)  # a token count, or a FLOP budget's tokens; conflicts fail here
    return _Setup(datamodule, model_config, total, fpt, math.ceil(total / int(cfg.train.eval_count)))


def _setup_error(e: BaseException) -> SetupError:
    text = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
    return SetupError(text)


def train(cfg: DictConfig) -> dict[str, Any]:
    """Run (or resume, or skip) one training run; returns its result record.

    Before training (nothing written, Lightning not imported): the config checks, the run's identity and the skip
    check, then the data and model checks. Any problem there raises SetupError and leaves no trace. Then the
    run's lock (RunBusy when another process is training it), the run directory, and training: from here every
    way the run ends is recorded (completed, failed, diverged; interrupted by a signal, after a checkpoint at
    that step: RunInterrupted).
    """
    cfg = copy.deepcopy(cfg)
    try:
        check_config(cfg)
        chash, run_id, run_dir, study_dir = run_identity(cfg)
    except ValueError as e:
        raise _setup_error(e) from e
    if not cfg.force:  # every rank checks, so all of a multi-device run skip together
        done = _completed(study_dir, chash, run_id)
        if done is not None:
            return done
    if cfg.get("threads"):
        import torch

        torch.set_num_threads(int(cfg.threads))
    try:
        setup = _prepare(cfg)
    except (ValueError, FileNotFoundError, ImportError) as e:
        raise _setup_error(e) from e
    rank_zero = _is_rank_zero()
    if rank_zero:
        _warn_other_data(study_dir, setup)
    lock = _acquire_run_lock(study_dir, run_id) if rank_zero else None
    try:
        if not cfg.force:  # completed by another process while this one was getting ready
            done = _completed(study_dir, chash, run_id)
            if done is not None:
                return done
        if rank_zero and cfg.force and (run_dir / records.RESULTS_JSON).is_file() and records.find_completed(study_dir, chash):
            aside = run_dir.with_name(f"{run_dir.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
            shutil.move(str(run_dir), str(aside))
            print(f"[attnres] force=true: moved the completed run's directory to {aside}")
        run_dir.mkdir(parents=True, exist_ok=True)
        with open_dict(cfg):
            cfg.run_id = run_id
            cfg.paths.run_dir = str(run_dir)
        run = _Run(cfg, chash, run_id, run_dir, study_dir, setup)
        return _train_and_record(cfg, run, rank_zero)
    finally:
        if lock is not None:
            lock.release()


def _warn_other_data(study_dir: Path, setup: _Setup) -> None:
    """Say so when the study already holds completed runs of other data: the analysis will not pool them."""
    other: dict[str, str] = {}
    for rec in records.read_records(study_dir):
        fp = rec.get("data_fingerprint") or ""
        if rec.get("status") == "completed" and fp and fp != setup.data_fingerprint:
            other[fp] = str(rec.get("dataset") or "?")
    if other:
        print(f"[attnres] warning: study {study_dir.name} already holds completed runs of other data "
              f"({', '.join(f'{fp} = {name}' for fp, name in sorted(other.items()))}); this run's data is "
              f"{setup.data_fingerprint} = {setup.dataset}. The analysis never pools data sets: give each its own "
              f"study (study=<name>)", file=sys.stderr, flush=True)


def _completed(study_dir: Path, chash: str, run_id: str) -> dict[str, Any] | None:
    done = records.find_completed(study_dir, chash)
    if done is None:
        return None
    print(f"[attnres] skipping {run_id}: {study_dir / records.RESULTS_TABLE} already holds a completed run with "
          f"config_hash {chash} (val_loss {done.get('val_loss')}); pass force=true to re-run it")
    return {**done, "skipped": True}


def _train_and_record(cfg: DictConfig, run: _Run, rank_zero: bool) -> dict[str, Any]:
    from .callbacks import GracefulInterrupt

    interrupt = GracefulInterrupt(run.run_dir / "checkpoints" / "last.ckpt")
    try:
        with interrupt.installed():
            record = _fit(cfg, run, rank_zero, interrupt)
    except BaseException as e:  # noqa: BLE001 - record every way a run can end, then re-raise
        from .module import DivergedError

        if run.completed:  # e.g. a closed stdout after the completed record was written: keep that record
            _finish_wandb(exit_code=0)
            raise
        if isinstance(e, (KeyboardInterrupt, SystemExit)) and interrupt.received and not isinstance(e, RunInterrupted):
            # a second Ctrl-C: stopped at once, without a checkpoint at this step (the last periodic one stands)
            e = RunInterrupted(interrupt.received, int(run.trainer.global_step) if run.trainer else 0, None)
        if isinstance(e, RunInterrupted):
            status, message = "interrupted", f"interrupted by {e.signame} at step {e.step}"
        else:
            status = "diverged" if isinstance(e, DivergedError) else "failed"
            message = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if rank_zero:
            try:
                run.write(run.record(status, error=message))
            except Exception as write_error:  # noqa: BLE001 - never mask the original error
                warnings.warn(f"could not write the {status} record of {run.run_id}: {write_error}")
        _finish_wandb(exit_code=1)
        if isinstance(e, RunInterrupted):
            if rank_zero:
                saved = f"checkpoint {e.checkpoint} saved at that step" if e.checkpoint else "no checkpoint at that step"
                print(f"[attnres] {run.run_id}: {message}; {saved}; recorded as interrupted. Relaunch the same "
                      "command to resume.", flush=True)
            raise e from None
        raise
    _finish_wandb(exit_code=0, record=record)
    return record


def _fit(cfg: DictConfig, run: _Run, rank_zero: bool, interrupt: Any) -> dict[str, Any]:
    from hydra.utils import instantiate

    from .callbacks import KillAtStep, NaNAtStep, RaiseAtStep, RunRecorder, SignalAtStep
    from .module import LMModule

    setup = run.setup
    datamodule, model_config, total, fpt, eval_every = (setup.datamodule, setup.model_config, setup.steps, setup.fpt,
                                                        setup.eval_every)
    container = resolved_container(cfg)
    if rank_zero:
        records.atomic_write_text(run.run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(container)))
        records.write_json(run.run_dir / "environment.json", _environment(datamodule))

    import lightning.pytorch as pl

    _quiet_lightning()
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    module = LMModule(
        model_config, optimizer=instantiate(cfg.optimizer), scheduler=instantiate(cfg.scheduler),
        total_steps=total, log_every=int(cfg.train.log_every), eval_every=eval_every, compile=bool(cfg.compile),
        activation_checkpointing=bool(cfg.activation_checkpointing),
    )
    run.module = module
    recorder = RunRecorder(run.run_dir, run.tokens_per_step, fpt, str(cfg.model.variant), model_config.residual)
    recorder.session_start = run.t0  # this launch's wall time includes data and model setup
    run.recorder = recorder
    callbacks = [recorder, *_instantiate_callbacks(cfg), interrupt]
    fault = cfg.fault
    if fault.get("kill_at_step") is not None:
        callbacks.append(KillAtStep(int(fault.kill_at_step)))
    if fault.get("nan_at_step") is not None:
        callbacks.append(NaNAtStep(int(fault.nan_at_step)))
    if fault.get("signal_at_step") is not None:
        callbacks.append(SignalAtStep(int(fault.signal_at_step), str(fault.get("signal", "SIGTERM"))))
    if fault.get("raise_at_step") is not None:
        callbacks.append(RaiseAtStep(int(fault.raise_at_step)))

    ckpt = run.run_dir / "checkpoints" / "last.ckpt"
    resuming = ckpt.is_file()
    loggers = _instantiate_loggers(cfg, _wandb_id(run.run_dir, resuming) if rank_zero else "")
    trainer = instantiate(
        cfg.trainer, max_steps=total, val_check_interval=eval_every, check_val_every_n_epoch=None,
        log_every_n_steps=int(cfg.train.log_every), callbacks=callbacks, logger=loggers or False,
        default_root_dir=str(run.run_dir),
    )
    run.trainer = trainer
    derived = {
        "derived/params": module.num_params(), "derived/params_non_embedding": module.num_params(non_embedding=True),
        "derived/flops_per_token": fpt, "derived/steps": total, "derived/tokens": total * run.tokens_per_step,
        "derived/flops": fpt * total * run.tokens_per_step, "derived/flops_budget": cfg.train.get("flops_budget"),
        "derived/config_hash": run.chash,
        "derived/dataset": datamodule.describe()["path"], "derived/data_fingerprint": setup.data_fingerprint,
    }
    for lg in loggers:
        lg.log_hyperparams({**container, **derived})
        if type(lg).__name__ == "WandbLogger" and rank_zero:
            exp = lg.experiment
            if hasattr(exp, "define_metric"):
                exp.define_metric("train/*", step_metric="train/flops")
                exp.define_metric("val/*", step_metric="val/flops")
                exp.define_metric("diag/*", step_metric="val/flops")
    if rank_zero:
        state = "resuming from " + str(ckpt) if resuming else "starting"
        print(f"[attnres] {run.run_id}: {state}; {total} steps x {run.tokens_per_step} tokens, "
              f"N={derived['derived/params_non_embedding']:,}, C={derived['derived/flops']:.3g} FLOPs -> {run.run_dir}")

    trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt) if resuming else None)
    recorder.ensure_loaded(trainer)  # fit returns at once when the checkpoint was already at the last step
    if trainer.global_step < total:
        raise RuntimeError(f"training stopped at step {trainer.global_step} of {total}")
    last = recorder.last_eval
    if last is None or last["step"] != total:  # the schedule's end is not an eval step: evaluate once more
        trainer.validate(module, datamodule=datamodule, verbose=False)
    if trainer.is_global_zero:
        recorder.flush()
    record = run.record("completed")
    if rank_zero:
        run.write(record)
    run.completed = True
    if rank_zero:
        print(f"[attnres] {run.run_id}: completed, val_loss {record['val_loss']:.4f} after {record['steps']} steps "
              f"({record['wall_time_s']:.0f} s) -> {run.table}")
    return record


def _write_job_summary(cfg: DictConfig, summary: dict[str, Any]) -> None:
    """attnres_job.json in this job's Hydra output dir: the sweep summary (sweeps.callbacks) reads it back."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    if "lightning" in sys.modules and not _is_rank_zero():  # a run got as far as training: one rank writes
        return
    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
    summary = {"job_num": hc.job.get("num", 0), "pid": os.getpid(), "threads": threads, **summary}
    records.atomic_write_text(out / "attnres_job.json", json.dumps(summary, default=str) + "\n")


def conf_dir() -> str:
    """Where the Hydra configs are: the repository's ``conf/`` when this module runs from a checkout (also an
    editable install: edits to conf/ take effect), else the copy a built wheel ships as the package
    ``attnres_conf`` (pyproject.toml). An absolute path either way, so the working directory never matters."""
    import importlib.util

    repo_conf = Path(__file__).resolve().parents[1] / "conf"
    if (repo_conf / "train.yaml").is_file():
        return str(repo_conf)
    spec = importlib.util.find_spec("attnres_conf")  # a directory of YAML files, no __init__.py: a namespace package
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(location) / "train.yaml").is_file():
            return str(Path(location))
    raise RuntimeError(f"no Hydra configs: neither {repo_conf} nor an installed attnres_conf package has train.yaml "
                       "(reinstall attnres)")


@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="train")
def hydra_main(cfg: DictConfig) -> float | None:
    """One run. In a multirun a failed run is recorded and reported, not raised, so the sweep goes on and
    ends with a summary (sweeps.callbacks.SweepSummary) whose exit status says whether every run was fine.
    A config or data error (SetupError) prints one line (exit status 2 for a single run); a run another process
    is training (RunBusy) is skipped with a message (exit status 3 for a single run); an interrupt stops the
    run and, in a multirun, the sweep (exit status 128 + the signal number)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        record = train(cfg)
    except RunInterrupted as e:
        _write_job_summary(cfg, {"status": "interrupted", "run_id": _run_id_or_guess(cfg), "error": str(e)})
        raise SystemExit(e.exit_code) from None
    except (SetupError, RunBusy) as e:
        kind = "config error" if isinstance(e, SetupError) else "busy"
        print(f"[attnres] {_run_id_or_guess(cfg)}: {kind}: {e}", file=sys.stderr, flush=True)
        status = "failed" if isinstance(e, SetupError) else "skipped"
        _write_job_summary(cfg, {"status": status, "run_id": _run_id_or_guess(cfg), "error": f"{kind}: {e}"})
        if not multirun:
            raise SystemExit(2 if isinstance(e, SetupError) else 3) from None
        return None
    except Exception as e:  # noqa: BLE001 - train() already wrote the failed/diverged record
        if not multirun:
            raise
        from .module import DivergedError

        status = "diverged" if isinstance(e, DivergedError) else "failed"
        run_id = _run_id_or_guess(cfg)
        print(f"[attnres] {run_id}: {status}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        _write_job_summary(cfg, {"status": status, "run_id": run_id, "error": f"{type(e).__name__}: {e}"})
        return None
    status = "skipped" if record.get("skipped") else str(record.get("status", "completed"))
    _write_job_summary(cfg, {"status": status, "run_id": record.get("run_id"), "val_loss": record.get("val_loss")})
    val = record.get("val_loss")
    try:
        return float(val) if val not in (None, "") else None  # the optimized metric for Hydra sweepers
    except (TypeError, ValueError):
        return None


def _run_id_or_guess(cfg: DictConfig) -> str:
    try:
        return run_identity(cfg)[1]
    except Exception:  # noqa: BLE001 - a config that does not even resolve
        return f"{cfg.model.get('variant', '?')}_{cfg.size.get('name', '?')}_s{cfg.get('seed')}"


def main() -> None:
    """``python -m experiments.train`` and the console script ``attnres-train`` (any working directory): the
    Hydra app, with a Ctrl-C outside training (composing, preparing data) ending in one line, not a traceback."""
    try:
        hydra_main()
    except KeyboardInterrupt:
        print("[attnres] interrupted: a run in training saves a checkpoint and is recorded as interrupted (relaunch "
              "to resume); one that had not started training leaves nothing", file=sys.stderr, flush=True)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
