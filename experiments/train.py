"""Train one model: ``python -m experiments.train [overrides]`` (console script ``attnres-train``).

    python -m experiments.train experiment=cpu_ladder size=cpu_xs                 # the README's main command
    python -m experiments.train experiment=smoke model=full_attnres               # seconds
    python -m experiments.train -m experiment=cpu_ladder model=baseline,full_attnres,block_attnres seed=0,1

The config is checked first (experiments/validation.py). A run is identified by ``config_hash`` = sha256 of the
resolved config minus the keys in HASH_EXCLUDE (experiments/identity.py: where files go, loggers, callbacks,
device/launch settings, fault injection; the seed is included). Its directory is
``<paths.runs_root>/<study>/<variant>_<size>_s<seed>_<hash8>``, so relaunching the same config finds it: training
resumes from ``checkpoints/last.ckpt``, and a run already ``completed`` in the study's results.csv is skipped
(``force=true`` re-runs it, moving the old directory aside). Every run that started training, failed and
interrupted ones included, writes ``results.json`` and one record to the study's ledger
(``<paths.runs_root>/<study>/records/``, from which ``results.csv`` is derived; experiments/records.py). A config
or data error found before training writes nothing. One process trains a run at a time (a lock under
``<study>/.locks/``, experiments/locks.py); SIGINT / SIGTERM / SIGUSR1 save a checkpoint at the current step and
stop.

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

from . import records, resolvers
from .errors import RunBusy, RunInterrupted, SetupError
from .identity import resolved_container, run_identity
from .locks import acquire_run_lock
from .validation import build_model_config, check_config, planned_steps

# Before @hydra.main composes: the attnres_* resolvers the configs use (hydra.run.dir, derived sizes, tuned lr).
resolvers.register()


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
    lock = acquire_run_lock(study_dir, run_id) if rank_zero else None
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
