"""The benchmark's plumbing: it runs end to end and writes the documented JSON (speed is never asserted here;
docs/performance.md holds the measured numbers). About 35 s: `--quick` (~15 s) and the GPU script's
`--dry-run` on the CPU (~15 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, TEST_MAX_BYTES

from experiments.bench import cli, memory, sample_stats, settings, shapes
from experiments.bench.runner import build_runner


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
    }


def _check_ratio(r: dict) -> None:
    assert set(r) >= {"median", "q1", "q3", "min", "max", "n", "samples"}
    assert r["q1"] <= r["median"] <= r["q3"]
    assert r["n"] == len(r["samples"]) > 0


def _check_size(res: dict, schemes: list[str], repeats: int) -> None:
    assert set(res) >= {
        "size",
        "device",
        "threads",
        "tokens_per_step",
        "schemes",
        "ratios",
        "checks",
        "other_cores_busy",
    }
    assert list(res["schemes"]) == schemes
    tokens = res["size"]["batch_size"] * res["size"]["seq_len"]
    assert res["tokens_per_step"] == tokens
    for name, e in res["schemes"].items():
        assert e["train_step_s"]["n"] == repeats
        assert len(e["train_step_s"]["samples"]) == repeats
        assert e["prefill_s"]["n"] == repeats
        assert e["tokens_per_s"] == pytest.approx(tokens / e["train_step_s"]["median"])
        assert e["flop_per_s"] == pytest.approx(e["flops_per_token"] * e["tokens_per_s"])
        assert e["mfu"] is None  # no peak is known for a CPU
        assert e["saved_activation_bytes"] > 0
        assert e["peak_step_bytes"] is not None
        assert e["peak_tensor_step_bytes"] > e["saved_activation_bytes"] / 2  # saved tensors are allocated in the step
        assert e["peak_bytes"] >= e["rss_before_bytes"] > 0
        r = res["ratios"][name]
        for key in ("train_step", "train_step_cpu", "prefill", "decode"):
            _check_ratio(r[key])
        assert e["decode_token_s"]["n"] == repeats
        assert e["decode"] == {
            "tokens": 4,
            "batch": 1,
            "context": res["size"]["seq_len"],
        }
        if name == "baseline":  # ratios of the baseline to itself, round by round
            assert r["train_step"]["samples"] == [1.0] * repeats
            assert r["saved_activation_bytes"] == 1.0
    assert res["schemes"]["block"]["n_blocks"] == res["size"]["n_blocks"]
    names = [c["name"] for c in res["checks"]]
    assert {"saved activations", "peak step tensor memory"} <= {n.split(" - ")[0][6:] for n in names}
    for c in res["checks"]:
        assert set(c) >= {"name", "value", "limit", "pass"}
        assert c["pass"] == (c["value"] <= c["limit"])


def test_quick_benchmark_writes_the_documented_json(tmp_path, data_cache):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.bench",
            "--quick",
            "--threads",
            "1",
            "--out",
            str(out),
            "--data-cache",
            str(data_cache),
            "--data-max-bytes",
            str(TEST_MAX_BYTES),
        ],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ratios to baseline" in proc.stdout
    assert "harness vs plain" in proc.stdout
    res = json.loads(out.read_text())
    assert res["schema_version"] == cli.SCHEMA_VERSION
    assert res["meta"]["quick"] is True
    assert res["meta"]["threads"] == 1
    assert res["meta"]["device"] == "cpu"
    assert res["meta"]["torch"]
    assert res["meta"]["wall_time_s"] > 0
    assert res["meta"]["cpu_kernels"].startswith(("on", "off", "unavailable"))
    assert res["meta"]["gpu_kernels"].startswith(("on", "off", "unavailable"))
    assert res["meta"]["decode_tokens"] == 4
    (size,) = res["sizes"]
    assert size["size"]["name"] == "tiny"
    _check_size(size, ["baseline", "full", "block"], repeats=3)
    (h,) = res["harness"]
    assert h["size"]["name"] == "tiny"
    assert h["rounds"] == 1
    assert h["steps_per_run"] == 5
    assert h["harness_step_s"]["n"] == h["plain_step_s"]["n"] == 5 - 1 - h["warmup_steps"]
    _check_ratio(h["ratio"])
    assert h["check"]["limit"] == 1.03
    assert h["check"]["value"] == h["ratio"]["median"]
    assert res["options"] is None


def test_statistics_and_memory_bound():
    s = sample_stats.summarize([3.0, 1.0, 2.0, 4.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.5, 1.0, 4.0, 4)
    assert s["samples"] == [3.0, 1.0, 2.0, 4.0]
    assert s["q1"] == 1.75
    assert s["q3"] == 3.25
    r = sample_stats.paired_ratios({"baseline": [2.0, 4.0], "block": [2.2, 4.0]}, "baseline")
    assert r["block"]["samples"] == pytest.approx([1.1, 1.0])
    assert r["baseline"]["median"] == 1.0
    # (N + 1) * B * T * d * bytes + 5% of the baseline: TARGET has N = 8 blocks of S = 4 sublayers
    b = memory.block_memory_bound(shapes.TARGET, baseline_bytes=1000.0, element_bytes=4)
    assert b["n_blocks"] == 8
    assert b["block_sums_bytes"] == 9 * 8 * 256 * 256 * 4
    assert b["limit_extra_bytes"] == b["block_sums_bytes"] + 50.0


def test_saved_activation_bytes_is_deterministic_and_excludes_parameters():
    import torch

    torch.set_num_threads(1)
    size = shapes.TINY
    runner = build_runner(size, "baseline", torch.device("cpu"), 0, False, False, False, "auto")
    a, b = memory.saved_activation_bytes(runner), memory.saved_activation_bytes(runner)
    assert a == b > 0
    params = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    btd = size.batch_size * size.seq_len * size.d_model * 4
    assert btd < a < params + 100 * size.n_layers * btd  # activations, not weights, dominate at this size
    ckpt = build_runner(size, "baseline", torch.device("cpu"), 0, False, False, True, "auto")
    assert memory.saved_activation_bytes(ckpt) < a  # checkpointed sublayers keep only their inputs


def test_block_attnres_saved_activations_fit_the_issue_allowance():
    """Deterministic memory bounds (bytes autograd keeps, and the peak of live tensors in a step; not timings):
    Block AttnRes uses at most the N + 1 block sums' worth of [B, T, d] more than the baseline, plus 5% of the
    baseline. Before the read was fused with the PreNorm normalisation, every read's output was kept as well
    (+L [B, T, d])."""
    import torch

    torch.set_num_threads(1)
    # 32 sublayers, N = 8 blocks of 4; 512 tokens, so that activations, not weight gradients, make the peak
    size = shapes.resolve_size("attnres16x256", batch_size=4, seq_len=128)
    runners = {
        s: build_runner(size, s, torch.device("cpu"), 0, False, False, False, "auto") for s in ("baseline", "block")
    }
    for r in runners.values():
        r.train_step()  # optimizer state exists before the measured step
    for measure in (memory.saved_activation_bytes, memory.peak_tensor_step_bytes):  # the peak: of live tensors
        used = {s: measure(r) for s, r in runners.items()}
        bound = memory.block_memory_bound(size, used["baseline"], element_bytes=4)
        assert bound["n_blocks"] == 8
        assert used["block"] - used["baseline"] <= bound["limit_extra_bytes"], measure.__name__


def test_full_attnres_peak_memory_stays_near_its_saved_activations():
    """Full AttnRes' gradient sinks (one [B, T, d] per source) must not all be allocated at the final read's
    backward, before any activation is freed: that put its peak at +40 B*T*d over the baseline (33 sinks) at
    this size, against +9 when the sinks defer their first terms (the saved activations are +7)."""
    import torch

    torch.set_num_threads(1)
    size = shapes.resolve_size("attnres16x256", batch_size=4, seq_len=128)
    runners = {
        s: build_runner(size, s, torch.device("cpu"), 0, False, False, False, "auto") for s in ("baseline", "full")
    }
    for r in runners.values():
        r.train_step()
    btd = size.batch_size * size.seq_len * size.d_model * 4
    peak = {s: memory.peak_tensor_step_bytes(r) for s, r in runners.items()}
    assert (peak["full"] - peak["baseline"]) / btd <= 16


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--schemes", "baseline,nope"], "unknown"),
        (["--option-variants", "eager,turbo"], "unknown"),
        (["--device", "tpu"], "allowed values: cpu, cuda"),
        (["--harness-steps", "3"], ">= 4"),
        (["--decode-tokens", "-1"], ">= 0"),
        (["--moe-pairs", "cpu_moe"], "--moe-pairs.*<moe size>:<dense size>"),
        (["--moe-pairs", "cpu_moe:cpu_zz"], "--moe-pairs: unknown size 'cpu_zz'.*cpu_xs"),
        (["--moe-pairs", "cpu_xs:cpu_moe"], "--moe-pairs: cpu_xs:cpu_moe must name an MoE size, then a dense one"),
    ],
)
def test_bad_arguments_say_what_is_allowed(argv, match):
    with pytest.raises(SystemExit, match=match):
        settings.parse_args(argv)


@pytest.mark.parametrize("argv", [["--ladder"], ["--quick", "--ladder-fraction", "0.2"], ["--ladder-seeds=2"]])
def test_the_retired_ladder_flags_fail_with_one_line_naming_the_frozen_note(argv):
    with pytest.raises(SystemExit) as e:
        settings.parse_args(argv)
    message = str(e.value)
    assert "\n" not in message
    assert "is retired" in message
    assert "docs/results/bench/2026-12-02_ladder/" in message
    assert (REPO / "docs/results/bench/2026-12-02_ladder/README.md").is_file()


def test_unknown_size_lists_the_sizes():
    with pytest.raises(ValueError, match=r"attnres16x256.*cpu_xl"):
        shapes.resolve_size("huge")
    xl = shapes.resolve_size("cpu_xl")
    assert (xl.n_layers, xl.d_model, xl.n_blocks, xl.batch_size) == (8, 32, 4, 4)
    paper = shapes.resolve_size("paper_194m", seq_len=8192)
    assert (paper.n_layers, paper.d_model, paper.head_dim, paper.n_blocks) == (12, 896, 128, 8)


def test_an_moe_size_benchmarks_an_moe_model():
    """A conf/size with ffn: moe builds MoE MLPs in the bench (its options as in the size file), a dense one none."""
    from attnres import Transformer
    from attnres.moe import moe_layers

    moe = shapes.resolve_size("cpu_moe")
    cfg = moe.model_config("block")
    assert cfg.ffn == "moe"
    assert cfg.moe.n_experts == 8
    assert cfg.moe.top_k == 2
    assert cfg.moe.shared_d_ff == 48
    assert len(moe_layers(Transformer(cfg))) == 4
    assert shapes.resolve_size("cpu_xs").model_config("baseline").ffn == "dense"


def test_the_moe_section_times_moe_against_dense_per_scheme(tmp_path):
    """--moe-pairs alone: no per-size or harness section; per scheme the dense and MoE steps, their activated N
    (matched within 3%: cpu_moe is sized to cpu_xs's), and the per-round MoE / dense ratio. The MoE runner's step
    updates the balancing bias as the trainer's does."""
    import torch

    from experiments.bench import moe_section

    out = tmp_path / "moe.json"
    argv = ["--moe-pairs", "cpu_moe:cpu_xs", "--schemes", "baseline,block", "--threads", "1", "--repeats", "2"]
    s = settings.parse_args([*argv, "--warmup", "0", "--out", str(out)])
    assert s.sizes == ()
    assert not s.harness
    doc = cli.run(s, log=lambda _: None)
    assert json.loads(out.read_text())["moe"] == doc["moe"]
    assert doc["sizes"] == []
    assert doc["harness"] is None
    (pair,) = doc["moe"]
    assert pair["moe_size"]["name"] == "cpu_moe"
    assert pair["dense_size"]["name"] == "cpu_xs"
    assert list(pair["schemes"]) == ["baseline", "block"]
    for e in pair["schemes"].values():
        assert set(e) == {"dense", "moe", "moe_over_dense"}  # no loop-vs-grouped entry off CUDA
        _check_ratio(e["moe_over_dense"])
        assert e["moe_over_dense"]["n"] == 2
        dense_n, moe_n = (e[v]["params_activated_non_embedding"] for v in ("dense", "moe"))
        assert moe_n == pytest.approx(dense_n, rel=0.03)
        assert e["moe"]["params_total_non_embedding"] > 1.5 * moe_n
        assert e["dense"]["params_total_non_embedding"] == dense_n
    moe, dense = shapes.resolve_size("cpu_moe"), shapes.resolve_size("cpu_xs")
    with pytest.raises(ValueError, match="must name an MoE size, then a dense one"):
        moe_section.bench_moe_pair(dense, moe, ["baseline"], s, torch.device("cpu"))
    runners = moe_section.pair_runners(moe, dense, ["baseline"], s, torch.device("cpu"))
    (runner,) = [r for r in runners if r.name.endswith("/moe")]
    runner.train_step()
    assert all(m.step_load is not None and int(m.step_load.sum()) == 4 * 128 * 2 for m in runner.model.moe)


def test_gpu_suite_script_parses():
    """scripts/gpu_suite.sh runs only where a GPU is lent; here its syntax is checked (its --dry-run takes ~2 min)."""
    import subprocess

    proc = subprocess.run(["bash", "-n", str(REPO / "scripts" / "gpu_suite.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_torch_path_option_runs_without_the_cpu_kernels(monkeypatch):
    """--options torch-path times the depth mixing's torch path in the same process as the kernels."""
    import torch

    from attnres import cpu_kernels

    torch.set_num_threads(1)
    calls = []

    def counted(f, n):
        return lambda *a: calls.append(n) or f(*a)

    for name in ("mix_forward", "mix_backward", "merge_forward", "merge_backward"):
        monkeypatch.setattr(cpu_kernels, name, counted(getattr(cpu_kernels, name), name))
    assert "torch-path" in settings.OPTION_VARIANTS
    monkeypatch.setenv(cpu_kernels.ENV_SWITCH, "0")  # the environment decides unless the runner says otherwise
    runner = build_runner(shapes.TINY, "block", torch.device("cpu"), 0, False, False, False, "auto")
    runner.train_step()
    assert not calls
    monkeypatch.setenv(cpu_kernels.ENV_SWITCH, "1")
    for use in (False, True):
        calls.clear()
        runner = build_runner(
            shapes.TINY, "block", torch.device("cpu"), 0, False, False, False, "auto", cpu_kernels=use
        )
        runner.train_step()
        assert bool(calls) == (use and cpu_kernels.library() is not None)
        assert not use or not cpu_kernels.library() or {"merge_backward", "mix_backward"} <= set(calls)


def test_the_plain_loop_gets_the_trainer_and_data_of_experiments_train(train_cfg, monkeypatch):
    """The harness benchmark compares like with like only while its plain loop runs with what experiments.train
    trains with: the trainer settings (accumulation, clipping, precision, steps, evaluation) of the trainer that
    train() fits, and a datamodule with the same batch geometry; under accumulation it steps once per micro-batches."""
    import lightning.pytorch as pl
    import torch

    from experiments.bench import harness as bench_harness
    from experiments.run.run_plan import plan_run
    from experiments.train import train

    fitted = []
    real_fit = pl.Trainer.fit

    def spy(self, model, *args, datamodule=None, **kwargs):
        fitted.append((self, datamodule))
        return real_fit(self, model, *args, datamodule=datamodule, **kwargs)

    monkeypatch.setattr(pl.Trainer, "fit", spy)
    overrides = (
        "size.tokens=16384",
        "train.eval_count=1",
        "trainer.accumulate_grad_batches=2",
        "trainer.gradient_clip_val=0.5",
        "callbacks=none",
    )
    assert train(train_cfg(*overrides))["status"] == "completed"
    ((trained, train_data),) = fitted
    assert trained.accumulate_grad_batches == 2
    assert trained.gradient_clip_val == 0.5
    cfg = train_cfg(*overrides)
    plan = plan_run(cfg, progress=False)
    plain = bench_harness.plain_trainer(cfg, plan)
    for key in (
        "max_steps",
        "accumulate_grad_batches",
        "gradient_clip_val",
        "gradient_clip_algorithm",
        "precision",
        "val_check_interval",
        "check_val_every_n_epoch",
        "log_every_n_steps",
    ):
        assert getattr(plain, key) == getattr(trained, key), key
    for key in ("name", "batch_size", "seq_len", "seed", "accumulate", "val_sequences", "val_batch_size"):
        assert getattr(plan.datamodule, key) == getattr(train_data, key), key
    torch.set_num_threads(1)
    gaps = bench_harness.plain_run(cfg, torch.device("cpu"))
    assert len(gaps) == trained.max_steps * 2 - 1 - bench_harness.WARMUP_STEPS  # one stamp per micro-batch
