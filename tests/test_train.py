"""End-to-end training on CPU: smoke runs of every variant, learning below the unigram entropy, kill-and-resume
equals an uninterrupted run, W&B offline files, result records, skip/force, divergence, bad data and configs.

Runs are in-process (one Lightning import) except the two that need a real process: the SIGKILL resume test
and the CLI exit-code test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import TEST_MAX_BYTES, cli_overrides, run_cli

from attnres import RESIDUAL_SCHEMES
from experiments.train import train
from experiments.training.callbacks import METRIC_COLUMNS, read_metrics
from results import ledger
from results.record import COLUMNS

torch.set_num_threads(1)


def _run_dir(record) -> Path:
    return Path(record["run_dir"])


def _assert_valid_record(rec: dict, status: str = "completed") -> None:
    assert list(rec) == list(COLUMNS)
    assert rec["status"] == status
    for key in (
        "run_id",
        "study",
        "variant",
        "residual",
        "size",
        "config_hash",
        "run_dir",
        "started_at",
        "finished_at",
    ):
        assert rec[key], key
    if status == "completed":
        assert rec["error"] == ""
        assert math.isfinite(rec["val_loss"])
        assert math.isfinite(rec["train_loss"])
        assert rec["tokens"] == rec["steps"] * rec["batch_size"] * rec["seq_len"] > 0
        assert rec["flops"] == pytest.approx(rec["flops_per_token"] * rec["tokens"])
        assert rec["pflops_days"] == pytest.approx(rec["flops"] / 8.64e19)
        assert rec["flops_6nd"] == pytest.approx(6 * rec["params_non_embedding"] * rec["tokens"])
        assert rec["params"] > rec["params_non_embedding"] > 0
        assert rec["wall_time_s"] > 0


def test_the_record_carries_the_study_kind_of_its_sweep(train_cfg):
    assert train(train_cfg())["study_kind"] == "scaling"  # the default: a run outside any sweep
    assert train(train_cfg("study_kind=block_size", "seed=1"))["study_kind"] == "block_size"
    with pytest.raises(Exception, match=r"study_kind='ladder'; allowed values: scaling, lr"):
        train(train_cfg("study_kind=ladder"))


@pytest.mark.parametrize("variant", ["baseline", "full_attnres", "block_attnres"])
def test_smoke_run_each_variant(train_cfg, variant):
    rec = train(train_cfg(f"model={variant}"))
    _assert_valid_record(rec)
    run_dir = _run_dir(rec)
    assert rec["variant"] == variant
    assert rec["steps"] == 12
    assert rec["run_id"] == run_dir.name
    # the record, twice: results.json and one row of the study's table
    assert json.loads((run_dir / "results.json").read_text())["config_hash"] == rec["config_hash"]
    rows = ledger.read_rows(run_dir.parent / "results.csv")
    assert len(rows) == 1
    assert rows[0]["run_id"] == rec["run_id"]
    assert list(rows[0]) == list(COLUMNS)
    assert (run_dir / "config.yaml").is_file()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    env = json.loads((run_dir / "environment.json").read_text())  # what else the result depends on
    assert env["torch"]
    assert env["dataset"]["checksum"]
    assert env["cpu_kernels"].startswith(("on", "off", "unavailable"))
    # metrics.csv: the schema's columns, one row per logged step, val loss at evaluations (incl. the last step)
    metrics = read_metrics(run_dir / "metrics.csv")
    assert (run_dir / "metrics.csv").read_text().splitlines()[0] == ",".join(METRIC_COLUMNS)
    assert [m["step"] for m in metrics] == [2, 4, 6, 8, 10, 12]
    assert [m["step"] for m in metrics if m["val_loss"] is not None] == [6, 12]
    assert metrics[-1]["val_loss"] == pytest.approx(rec["val_loss"])
    assert all(m["grad_norm"] > 0 and m["tokens_per_s"] > 0 and m["lr"] > 0 for m in metrics)
    assert metrics[-1]["flops"] == pytest.approx(rec["flops"])
    # diagnostics.json (Fig. 5b/c, Fig. 8)
    diag = json.loads((run_dir / "diagnostics.json").read_text())
    assert diag["step"] == 12
    assert diag["variant"] == variant
    n_layers = rec["n_layers"]
    assert len(diag["block_output_rms"]) == len(diag["block_grad_norm"]) == n_layers
    assert len(diag["sublayer_output_rms"]) == 2 * n_layers
    assert all(v > 0 for v in diag["block_output_rms"] + diag["block_grad_norm"])
    if variant == "baseline":
        assert "depth_weights" not in diag
    else:
        w = diag["depth_weights"]
        assert len(w) == len(diag["read_kinds"]) == 2 * n_layers + 1
        assert diag["read_kinds"][-1] == "final"
        assert len(w[0]) == len(diag["source_labels"])
        assert w[0][0] == pytest.approx(1.0)
        assert all(v is None for v in w[0][1:])
        for row in w:
            assert sum(v for v in row if v is not None) == pytest.approx(1.0, abs=1e-4)
    if variant == "block_attnres":
        assert (rec["n_blocks"], rec["block_size"]) == (4, 2)  # smoke, like cpu_ladder: n_blocks 4


def test_short_run_learns_below_unigram_entropy(train_cfg, data_cache):
    from experiments.data import load_dataset

    entropy = load_dataset("stdlib", cache_dir=data_cache, max_bytes=TEST_MAX_BYTES, progress=False).unigram_entropy(
        "val"
    )
    rec = train(train_cfg("size.tokens=327680", "size.lr=1.0e-2", "train.eval_count=1", "train.val_sequences=32"))
    assert rec["steps"] == 80
    # unigram entropy = the best context-free model (~3.0 nats/byte here); 80 steps reach ~2.5
    assert rec["val_loss"] < entropy - 0.4, (rec["val_loss"], entropy)


def test_kill_and_resume_matches_uninterrupted(tmp_path, data_cache):
    """A real SIGKILL after a checkpoint, a relaunch of the same command, and the per-step train losses of
    the resumed run equal those of an uninterrupted run."""
    common = cli_overrides(tmp_path, data_cache)
    killed = run_cli([*common, f"paths.runs_root={tmp_path / 'a'}", "fault.kill_at_step=8"])
    assert killed.returncode == -9, killed.stderr[-2000:]  # SIGKILL at step 8 (last checkpoint: step 5)
    (run_dir,) = (tmp_path / "a" / "smoke").glob("baseline_*")
    assert not (run_dir / "results.json").exists()
    assert {r["step"] for r in read_metrics(run_dir / "metrics.csv")} <= set(range(1, 9))

    # Relaunch (in-process; the kill injection is not part of the run's identity, so the same run resumes).
    from conftest import compose

    resumed = train(compose([*common, f"paths.runs_root={tmp_path / 'a'}"]))
    assert resumed["status"] == "completed"
    assert resumed["run_dir"] == str(run_dir)
    reference = train(compose([*common, f"paths.runs_root={tmp_path / 'b'}"]))
    assert reference["config_hash"] == resumed["config_hash"]

    got = read_metrics(run_dir / "metrics.csv")
    want = read_metrics(Path(reference["run_dir"]) / "metrics.csv")
    assert [r["step"] for r in got] == list(range(1, 13))  # continued, no duplicated or missing step
    for g, w in zip(got, want):
        assert g["train_loss"] == pytest.approx(w["train_loss"], rel=1e-6, abs=1e-6), g["step"]
        assert g["lr"] == pytest.approx(w["lr"], rel=1e-9)
        if w["val_loss"] is not None:
            assert g["val_loss"] == pytest.approx(w["val_loss"], rel=1e-6)
    assert resumed["val_loss"] == pytest.approx(reference["val_loss"], rel=1e-6)
    assert len(ledger.read_rows(tmp_path / "a" / "smoke" / "results.csv")) == 1


@pytest.mark.parametrize("residual", sorted(RESIDUAL_SCHEMES))
def test_training_and_evaluation_draw_no_random_numbers(residual):
    """Resume restores no RNG state: after the model's initialisation (which a resumed run replaces by the
    checkpoint's weights) nothing may draw from the global RNGs. A training step (forward, backward, AdamW) and an
    evaluation forward with diagnostics leave torch's, numpy's and Python's generators where they were."""
    import random

    import numpy as np

    from attnres import ModelConfig, Transformer
    from experiments.training.optim import adamw

    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(vocab_size=64, n_layers=2, d_model=32, n_heads=2, max_seq_len=16, residual=residual, n_blocks=2)
    )
    optimizer = adamw(model, lr=1e-3)
    x = torch.randint(0, 64, (2, 16))
    y = torch.randint(0, 64, (2, 16))
    states = (
        torch.get_rng_state(),
        np.random.get_state()[1].copy(),  # noqa: NPY002 -- the global RNG on purpose: training must not touch it
        random.getstate(),
    )
    model.train()
    _, loss = model(x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    model.record_diagnostics = True
    with torch.no_grad():
        model(x, y)
    assert model.diagnostics
    assert torch.isfinite(loss)
    assert torch.equal(torch.get_rng_state(), states[0])
    assert (np.random.get_state()[1] == states[1]).all()  # noqa: NPY002 -- the global RNG must be untouched
    assert random.getstate() == states[2]


def test_wandb_offline_run_dir_and_record(train_cfg, monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc: nothing to authenticate with
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir_env_unused"))
    rec = train(train_cfg("logger=wandb", "model=block_attnres", "size.tokens=16384", "train.eval_count=1"))
    _assert_valid_record(rec)
    offline = list((_run_dir(rec) / "wandb").glob("offline-run-*"))
    assert len(offline) == 1, list((_run_dir(rec) / "wandb").iterdir())
    assert list(offline[0].glob("run-*.wandb")), list((_run_dir(rec) / "wandb").iterdir())


def test_skip_completed_and_force(train_cfg, capsys):
    first = train(train_cfg("size.tokens=8192", "train.eval_count=1"))
    second = train(train_cfg("size.tokens=8192", "train.eval_count=1"))
    assert "skipping" in capsys.readouterr().out
    assert second["config_hash"] == first["config_hash"]
    assert second["status"] == "completed"
    table = _run_dir(first).parent / "results.csv"
    assert len(ledger.read_rows(table)) == 1
    third = train(train_cfg("size.tokens=8192", "train.eval_count=1", "force=true"))
    assert third["status"] == "completed"
    assert len(ledger.read_rows(table)) == 2
    assert list(_run_dir(first).parent.glob(f"{first['run_id']}.replaced-*"))  # the old run kept, moved aside


def test_nan_loss_is_recorded_as_diverged(train_cfg):
    from experiments.run.errors import DivergedError

    cfg = train_cfg("fault.nan_at_step=3")
    with pytest.raises(DivergedError, match="at step 3"):
        train(cfg)
    (rec,) = ledger.read_rows(Path(cfg.paths.runs_root) / "smoke" / "results.csv")
    assert rec["status"] == "diverged"
    assert "DivergedError" in rec["error"]
    assert rec["val_loss"] == ""
    assert rec["steps"] == "2"


def test_a_diverged_run_is_one_line_and_a_relaunch_skips_it_unless_forced(train_cfg, capsys):
    """Issue 23 #11: a NaN loss ends a single run with one line and exit status 1 (it was a 93-line traceback), and
    a relaunch skips the diverged run (docs/results_schema.md, the skip rule) instead of training it again."""
    from experiments.run.job import run_job

    cfg = train_cfg("fault.nan_at_step=3")
    with pytest.raises(SystemExit) as exit_:
        run_job(train, cfg)
    assert exit_.value.code == 1
    out = capsys.readouterr()
    lines = [ln for ln in (out.out + out.err).splitlines() if ": diverged" in ln]
    assert len(lines) == 1, out
    line = lines[0]
    assert ": diverged at step 3 (training loss is nan at step 3" in line
    assert "a relaunch skips it (force=true re-runs it)" in line
    study = Path(cfg.paths.runs_root) / "smoke"
    assert [r["status"] for r in ledger.read_records(study)] == ["diverged"]

    assert run_job(train, train_cfg("fault.nan_at_step=3")) is None  # skipped: no new record, exit status 0
    assert "already holds this config" in capsys.readouterr().out
    assert [r["status"] for r in ledger.read_records(study)] == ["diverged"]

    with pytest.raises(SystemExit):
        run_job(train, train_cfg("fault.nan_at_step=3", "force=true"))
    assert [r["status"] for r in ledger.read_records(study)] == ["diverged", "diverged"]
    assert len(list(study.glob("baseline_*.replaced-*"))) == 1  # the first attempt's directory, kept aside


# ---- bad data and bad configs: a clear error before training, and no trace (issue 15 #7) -----------------------
def _no_trace(cfg) -> None:
    """A config that never trained leaves no run directory and no record."""
    study = Path(cfg.paths.runs_root) / str(cfg.study)
    assert not study.exists() or not [p for p in study.iterdir() if not p.name.startswith(".")], list(study.iterdir())


def test_missing_dataset(train_cfg, tmp_path):
    from experiments.run.errors import SetupError

    cfg = train_cfg(f"data.name={tmp_path / 'nope'}")
    with pytest.raises(SetupError, match=r"FileNotFoundError: dataset .* is neither a built-in name.*prepare_data"):
        train(cfg)
    _no_trace(cfg)


def test_vocab_larger_than_model(train_cfg):
    cfg = train_cfg("data.vocab_size=100")
    with pytest.raises(ValueError, match=r"uses 256 token ids.*model's vocab_size is 100.*model.vocab_size=256"):
        train(cfg)
    _no_trace(cfg)


def test_corrupt_shards(train_cfg, data_cache, tmp_path):
    import shutil

    from experiments.data import stdlib_dataset_name

    bad = tmp_path / "bad_shards"
    shutil.copytree(data_cache / stdlib_dataset_name(max_bytes=TEST_MAX_BYTES), bad)
    with open(bad / "train.bin", "ab") as f:
        f.write(b"\0" * 7)  # size no longer matches the header
    cfg = train_cfg(f"data.name={bad}")
    with pytest.raises(ValueError, match=r"train.bin holds .* bytes but header.json says"):
        train(cfg)
    _no_trace(cfg)


def test_fewer_tokens_than_one_batch(train_cfg, tmp_path):
    from experiments.data import prepare_text_files

    tiny = tmp_path / "tiny.txt"
    tiny.write_text("def f(x):\n    return x\n" * 10)  # 240 bytes: less than one batch
    shards = prepare_text_files([tiny], tmp_path / "tiny_shards", progress=False)
    cfg = train_cfg(f"data.name={shards}")
    with pytest.raises(ValueError, match=r"fewer than one batch"):
        train(cfg)
    _no_trace(cfg)


def test_bad_config_fails_before_training_without_a_trace(train_cfg):
    cfg = train_cfg("trainer.accelerator=quantum")
    with pytest.raises(ValueError, match=r"trainer\.accelerator='quantum'; allowed values"):
        train(cfg)
    _no_trace(cfg)


def test_cli_bad_config_is_fast_one_line_and_leaves_no_debris(tmp_path, data_cache):
    """Config errors: found before Lightning loads (what made the command take 6-10 s; torch does load, for
    attnres.registry's names), checked by the imports themselves (PYTHONPROFILEIMPORTTIME), not by a wall clock that
    a loaded machine stretches; one line, exit status 2, no run directory, no record (issue 15 #7)."""
    base = [
        "experiment=smoke",
        f"paths.runs_root={tmp_path / 'runs'}",
        f"paths.hydra_root={tmp_path / 'outputs'}",
        f"data.cache_dir={data_cache}",
        f"data.max_bytes={TEST_MAX_BYTES}",
    ]
    proc = run_cli([*base, "trainer.accelerator=quantum"], env_extra={"PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "config error: trainer.accelerator='quantum'; allowed values" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "hydra" in imported  # the profile is there
    assert not imported & {"lightning", "pytorch_lightning", "lightning.pytorch"}
    proc = run_cli([*base, "model.residual=dense"])  # found by attnres.ModelConfig (torch, but no Lightning)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "residual='dense' is unknown; allowed values: baseline, full, block" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_records_name_the_data_and_a_study_of_other_data_is_flagged(train_cfg, tmp_path, capsys):
    """Issue 15 #4: every record says which data it was trained on (dataset, data_fingerprint); launching a run
    of other data into a study warns, and the analysis refuses to pool the two."""
    from analysis.io.runs import load_results, select_completed
    from experiments.data import TokenShards, prepare_text_files
    from results.config_hash import data_fingerprint

    std = train(train_cfg("size.tokens=8192", "train.eval_count=1"))
    shards = TokenShards(Path(std["dataset"]))
    assert std["data_fingerprint"] == data_fingerprint(shards.header.checksum)
    assert len(std["data_fingerprint"]) == 16
    text = tmp_path / "mine.txt"
    text.write_text("".join(f"def g{i}(y):\n    return y * {i}\n" for i in range(6000)))
    mine = prepare_text_files([text], tmp_path / "mine", progress=False)
    capsys.readouterr()
    other = train(train_cfg(f"data.name={mine}", "size.tokens=8192", "train.eval_count=1"))
    assert other["data_fingerprint"] != std["data_fingerprint"]
    assert other["dataset"] == str(mine)
    err = capsys.readouterr().err
    assert "already holds completed runs of other data" in err
    assert std["data_fingerprint"] in err
    with pytest.raises(ValueError, match="2 different data sets"):
        select_completed(load_results(Path(std["run_dir"]).parent))


# ---- speed switches --------------------------------------------------------------------------------------
def test_activation_checkpointing_recomputes_the_same_numbers(train_cfg, tmp_path):
    common = ("model=block_attnres", "size.tokens=16384", "train.eval_count=1", "train.log_every=1")
    plain = train(train_cfg(*common, runs_root=tmp_path / "plain"))
    ckpt = train(train_cfg(*common, "activation_checkpointing=true", runs_root=tmp_path / "ckpt"))
    assert plain["config_hash"] == ckpt["config_hash"]  # a memory switch, not part of the experiment
    a, b = (read_metrics(Path(r["run_dir"]) / "metrics.csv") for r in (plain, ckpt))
    assert [r["train_loss"] for r in a] == pytest.approx([r["train_loss"] for r in b], rel=1e-6)
    assert [r["grad_norm"] for r in a] == pytest.approx([r["grad_norm"] for r in b], rel=1e-5)


def test_bf16_mixed_precision_runs_on_cpu(train_cfg):
    rec = train(
        train_cfg("trainer.precision=bf16-mixed", "model=full_attnres", "size.tokens=16384", "train.eval_count=1")
    )
    _assert_valid_record(rec)


def test_fused_adamw_with_mixed_precision_clipping(train_cfg):
    """Lightning's mixed-precision plugin refuses to clip a fused optimizer's gradients (found on an H200: every
    trainer=gpu run crashed at step 1). Auto (fused=null) picks foreach there; fused=true says why it cannot."""
    from experiments.training.optim import adamw

    model = torch.nn.Linear(4, 4)
    assert adamw(model, lr=1e-3, fused=None, amp_clipping=True).defaults["fused"] is None
    with pytest.raises(ValueError, match=r"optimizer\.fused=true.*trainer\.precision.*gradient_clip_val"):
        adamw(model, lr=1e-3, fused=True, amp_clipping=True)
    # the CPU has a fused AdamW too, so the GPU case runs here through the real trainer: our message, not
    # Lightning's RuntimeError at the first clipping, and the run is recorded as failed
    cfg = train_cfg("trainer.precision=bf16-mixed", "optimizer.fused=true", "size.tokens=8192", "train.eval_count=1")
    with pytest.raises(ValueError, match=r"optimizer\.fused=true"):
        train(cfg)
    rows = ledger.read_rows(Path(cfg.paths.runs_root) / "smoke" / "results.csv")
    assert rows[-1]["status"] == "failed"
    assert "optimizer.fused=true" in rows[-1]["error"]
    # and Lightning itself would refuse: its plugin sees a fused optimizer as one that unscales by itself
    from lightning.pytorch.plugins.precision.amp import _optimizer_handles_unscaling

    assert _optimizer_handles_unscaling(torch.optim.AdamW(model.parameters(), fused=True))


def test_dead_gradient_at_first_step_fails_the_run(train_cfg, monkeypatch):
    """A parameter that gets no gradient at step 1 (as torch.compile of Full AttnRes did to the embedding on an
    H200) stops the run with the parameter's name, instead of training a model whose embedding never moves."""
    from experiments.training.module import DeadGradientError, LMModule, dead_gradients

    setup = LMModule.setup

    def broken_setup(self, stage):
        setup(self, stage)
        self.model.tok_emb.weight.register_hook(torch.zeros_like)  # what the compiled graph returned

    monkeypatch.setattr(LMModule, "setup", broken_setup)
    cfg = train_cfg("model=full_attnres", "size.tokens=8192", "train.eval_count=1")
    with pytest.raises(DeadGradientError, match=r"tok_emb\.weight at step 1"):
        train(cfg)
    rows = ledger.read_rows(Path(cfg.paths.runs_root) / "smoke" / "results.csv")
    assert rows[-1]["status"] == "failed"
    assert "tok_emb.weight" in rows[-1]["error"]
    # the check itself: the residual scheme's zero-initialised parameters are not flagged
    from attnres import ModelConfig, Transformer

    model = Transformer(ModelConfig(vocab_size=61, n_layers=2, d_model=32, n_heads=4, max_seq_len=16, residual="full"))
    idx = torch.randint(0, 61, (2, 16))
    model(idx, idx)[1].backward()
    assert not model.residual.key_norm_weight.grad.any()
    assert dead_gradients(model) == []
    model.lm_head.weight.grad.zero_()
    assert dead_gradients(model) == ["lm_head.weight"]


def test_fsdp_strategy_wraps_each_transformer_block():
    from conftest import compose
    from hydra.utils import instantiate
    from lightning.pytorch.strategies import FSDPStrategy

    from attnres.model import TransformerBlock

    strategy = instantiate(compose(["trainer=fsdp"]).trainer.strategy)
    assert isinstance(strategy, FSDPStrategy)
    policy = strategy.kwargs["auto_wrap_policy"]
    assert TransformerBlock in getattr(policy, "_module_classes", ())


def test_compile_true_compiles_whole_or_regional(monkeypatch):
    """compile=true: the whole model or its sublayers (ATTNRES_COMPILE; default regional on CUDA, whole elsewhere);
    a bad value names the allowed ones. Nothing is compiled until the first forward."""
    from attnres import ModelConfig
    from experiments.training.module import COMPILE_ENV, LMModule, compile_mode

    monkeypatch.delenv(COMPILE_ENV, raising=False)
    assert compile_mode("cuda") == "regional"
    assert compile_mode("cpu") == "whole"
    monkeypatch.setenv(COMPILE_ENV, "whole")
    assert compile_mode("cuda") == "whole"
    monkeypatch.setenv(COMPILE_ENV, "fast")
    with pytest.raises(ValueError, match="whole, regional"):
        compile_mode("cpu")
    for mode in ("regional", "whole"):
        monkeypatch.setenv(COMPILE_ENV, mode)
        module = LMModule(
            ModelConfig(vocab_size=32, n_layers=2, d_model=16, n_heads=2, max_seq_len=8),
            None,
            None,
            total_steps=1,
            log_every=1,
            eval_every=1,
            compile=True,
        )
        module.setup("fit")
        forward = module.__dict__["_train_forward"]
        assert module.compile_mode == mode
        assert (forward is module.model) == (mode == "regional")
        assert all((b.compiled is not None) == (mode == "regional") for b in module.model.blocks)
