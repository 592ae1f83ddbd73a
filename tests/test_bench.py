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


def test_gpu_script_dry_run_on_cpu(tmp_path):
    """scripts/gpu_bench.sh with --dry-run: the GPU flags (bf16 autocast, flash SDPA, no harness) on the CPU."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_bench.sh"), "--dry-run", "--no-memory"],
        cwd=REPO,
        env={**_env(), "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "gpu_bench.json").read_text())
    assert res["meta"]["bf16"] is True
    assert res["meta"]["sdpa"] == "flash"
    assert res["harness"] is None
    (size,) = res["sizes"]
    assert size["size"]["seq_len"] == 64
    assert size["size"]["batch_size"] == 2
    assert list(size["schemes"]) == ["baseline", "full", "block"]


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
        (["--ladder-sizes", "cpu_xs,cpu_zz"], "unknown.*cpu_xs"),
        (["--ladder-schemes", "nope"], "unknown.*block_attnres"),
        (["--ladder-paths", "jit"], "allowed values: compiled, eager"),
        (["--ladder-fraction", "0"], "> 0"),
        (["--ladder-seeds", "0"], ">= 1"),
        (["--moe-pairs", "cpu_moe"], "--moe-pairs.*<moe size>:<dense size>"),
        (["--moe-pairs", "cpu_moe:cpu_zz"], "--moe-pairs: unknown size 'cpu_zz'.*cpu_xs"),
        (["--moe-pairs", "cpu_xs:cpu_moe"], "--moe-pairs: cpu_xs:cpu_moe must name an MoE size, then a dense one"),
    ],
)
def test_bad_arguments_say_what_is_allowed(argv, match):
    with pytest.raises(SystemExit, match=match):
        settings.parse_args(argv)


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


# ---- the ladder section (experiments/bench/ladder.py) ------------------------------------------------------------


def test_ladder_section_writes_the_documented_json(tmp_path, data_cache):
    """--ladder trains real experiments.train runs (eager only here: compiling costs ~30 s a shape; the compiled
    path's numerics are tests/test_compiled_step.py's) and reports each against the GEMM floor timed in its round."""
    out = tmp_path / "ladder.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.bench",
            "--ladder",
            "--ladder-sizes",
            "cpu_xs",
            "--ladder-schemes",
            "baseline,block_attnres",
            "--ladder-paths",
            "eager",
            "--ladder-fraction",
            "0.02",
            "--ladder-override",
            "train.val_sequences=8",
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
    assert "step against the GEMM floor" in proc.stdout
    res = json.loads(out.read_text())
    assert res["sizes"] == []  # --ladder runs its section alone
    assert res["harness"] is None
    lad = res["ladder"]
    assert (lad["paths"], lad["seeds"], lad["fraction"]) == (["eager"], 2, 0.02)
    (size,) = lad["sizes"]
    steps = size["steps"]
    assert steps == round(432000 * 0.02 / 512)  # cpu_xs: train.tokens x the fraction, in 512-token steps
    assert len(size["rounds"]) == 2
    assert size["gemm_floor"]["calls"] == 18 * 4 + 3  # 4 transformer blocks: see the test below
    runs = size["runs"]
    assert sorted((r["scheme"], r["round"]) for r in runs) == [
        ("baseline", 0),
        ("baseline", 1),
        ("block_attnres", 0),
        ("block_attnres", 1),
    ]
    assert [r["scheme"] for r in runs[:2]] == ["baseline", "block_attnres"]  # the arms' order rotates per round
    assert [r["scheme"] for r in runs[2:]] == ["block_attnres", "baseline"]
    for r in runs:
        assert r["kind"] == r["train_path"] == "eager"
        assert r["steps"] == steps
        assert r["tokens"] == steps * 512
        assert r["tokens_per_cpu_s"] == pytest.approx(r["tokens"] / r["cpu_s"])
        assert 0 < r["steady_steps"] <= steps - 1 - 10  # warm-up gaps dropped
        assert r["dirty_gaps"] >= 1  # the in-loop evaluations
        assert r["steady"]["floor_fraction"] == pytest.approx(r["floor_s"] / r["steady_step_s"])
        assert r["whole"]["floor_fraction"] == pytest.approx(r["floor_s"] / r["cpu_s_per_step"])
        assert r["whole"]["floor_fraction"] < r["steady"]["floor_fraction"]  # the run is more than its steps
    ratio = size["step_ratios"]["block_attnres"]["eager"]["steady"]
    assert ratio["n"] == 2
    assert {a: size["arms"][a]["cold"] for a in size["arms"]} == {"baseline": None, "block_attnres": None}


def test_gemm_floor_counts_every_matmul_of_a_training_step():
    """The recorded matmuls of one step are all of it: 6 mm + 2 attention bmm per transformer block forward (SDPA
    on its math backend), the LM head, and twice / 4 bmm as many in backward, i.e. 3x the forward FLOPs."""
    import torch

    from attnres import ModelConfig
    from experiments.bench import gemm_floor

    torch.set_num_threads(1)
    B, T, L, d, H, hd, f, V = 2, 16, 2, 32, 2, 16, 48, 256
    cfg = ModelConfig(vocab_size=V, n_layers=L, d_model=d, n_heads=H, head_dim=hd, d_ff=f, max_seq_len=T)
    calls = gemm_floor.record_matmuls(cfg, B, T)
    counts: dict[str, int] = {}
    for c in calls:
        counts[c.op] = counts.get(c.op, 0) + c.count
    assert counts == {"mm": 12 * L + 3, "bmm": 6 * L}
    a = H * hd
    forward = 2 * B * T * (L * (d * 3 * a + a * d + d * 2 * f + f * d) + d * V) + L * 2 * (2 * B * H * T * T * hd)
    assert sum(c.flops * c.count for c in calls) == 3 * forward
    floor = gemm_floor.time_floor(calls, repeats=3)
    assert floor["calls"] == 18 * L + 3
    assert floor["flops"] == 3 * forward
    assert floor["floor_s"] == pytest.approx(sum(r["s_total"] for r in floor["matmuls"]))
    assert all(r["s_per_call"] > 0 for r in floor["matmuls"])
    assert 0 < floor["attention_share"] < 1


def _ladder_run(kind: str, rnd: int, tokens_per_cpu_s: float, cpu_s: float, steps: int = 100) -> dict:
    from experiments.bench import ladder as bench_ladder

    r = {
        "kind": kind,
        "round": rnd,
        "tokens": steps * 512,
        "steps": steps,
        "cpu_s": cpu_s,
        "cpu_s_per_step": cpu_s / steps,
        "tokens_per_cpu_s": tokens_per_cpu_s,
        "steady_step_s": 0.01,
        "first_step_s": 0.01,
        "first_step_wall_s": 0.01,
    }
    return bench_ladder.derive_run(r, floor_s=0.004, step_flops=2e8, peak=100.0)


def test_ladder_figures_pair_rounds_and_amortise_the_cold_compile():
    from experiments.bench import ladder as bench_ladder

    assert bench_ladder.steady_gaps([0, 1, 3, 6, 10, 15], dirty=[3], warmup=1) == [2, 3, 5]
    assert bench_ladder.amortised_cpu_s(cold=100.0, warm=10.0, k=3) == 40.0
    runs = [
        _ladder_run("eager", 0, 100.0, 512.0),
        _ladder_run("cold", 0, 20.0, 50.0),
        _ladder_run("warm", 1, 240.0, 5.0),
        _ladder_run("eager", 1, 120.0, 426.0),
    ]
    arm = bench_ladder.summarize_arm(runs, floor_s=0.004, step_flops=2e8, peak=100.0, steps=100)
    assert arm["eager"]["runs"] == 2
    assert arm["eager"]["tokens_per_cpu_s"] == 110.0
    assert arm["cold"]["vs_eager"] == pytest.approx(0.2)  # against the eager run of its own round
    assert arm["warm"]["vs_eager"] == pytest.approx(2.0)
    assert arm["disk"] is None
    assert arm["compile_cpu_s"]["cold"] == 45.0
    assert arm["amortised"]["1"]["tokens_per_cpu_s"] == pytest.approx(51200 / 50.0)
    assert arm["amortised"]["3"]["tokens_per_cpu_s"] == pytest.approx(51200 / 20.0)
    assert arm["amortised"]["3"]["floor_fraction"] == pytest.approx(0.004 / 0.2)
    assert arm["warm"]["steady"]["gflop_per_s"] == pytest.approx(2e8 / 0.01 / 1e9)
    assert arm["warm"]["steady"]["peak_fraction"] == pytest.approx(0.2)


def test_the_inductor_cache_directory_is_set_inside_and_restored_after(tmp_path, monkeypatch):
    from experiments.bench import ladder as bench_ladder
    from experiments.training.compiler import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "before"))
    with bench_ladder.inductor_cache(tmp_path / "fresh", fresh=True) as path:
        assert os.environ[CACHE_ENV] == str(path) == str(tmp_path / "fresh")
        assert path.is_dir()
    assert os.environ[CACHE_ENV] == str(tmp_path / "before")


def test_the_ladder_section_classifies_and_summarises_every_kind_of_run(monkeypatch):
    """bench_ladder end to end with its training runs and timings stubbed (speed is never asserted): round 0's
    compiled run of each shape is cold (a fresh inductor cache), round 1's warm, the disk round's in a new process;
    the order of the paths flips per round, and each figure is taken against the eager run of its round."""
    from experiments.bench import ladder as bench_ladder
    from experiments.bench import ladder_report
    from experiments.training.compiler import CACHE_ENV

    seen_caches: set[str] = set()
    order: list[tuple[str, str]] = []

    def fake_run(overrides, timer_path, cpu_s):
        model = next(o.split("=")[1] for o in overrides if o.startswith("model="))
        path = next(o.split("=")[1] for o in overrides if o.startswith("train_path="))
        order.append((model, path))
        steps = 50
        return {
            "steps": steps,
            "tokens": steps * 512,
            "wall_s": cpu_s,
            "cpu_s": cpu_s,
            "train_path": path,
            "tokens_per_cpu_s": steps * 512 / cpu_s,
            "cpu_s_per_step": cpu_s / steps,
            "first_step_s": 0.01,
            "first_step_wall_s": 0.01,
            "steady_step_s": 0.01 if path == "eager" else 0.005,
            "steady_steps": 30,
            "dirty_gaps": 5,
            "other_cores_busy": 0.5,
            "setup_cpu_s": 1.0,
            "eval_cpu_s": 2.0,
        }

    def train_once(overrides, timer_path):
        if "train_path=compiled" not in overrides:
            return fake_run(overrides, timer_path, 10.0)
        cold = os.environ[CACHE_ENV] not in seen_caches
        seen_caches.add(os.environ[CACHE_ENV])
        return fake_run(overrides, timer_path, 30.0 if cold else 4.0)

    monkeypatch.setattr(bench_ladder, "train_once", train_once)
    monkeypatch.setattr(bench_ladder, "child_run", lambda spec: fake_run(spec["overrides"], None, 6.0))
    monkeypatch.setattr(bench_ladder, "record_matmuls", lambda *a, **k: [])
    floor = {"floor_s": 0.002, "flops": 1e8, "gflop_per_s": 50.0, "calls": 75, "attention_share": 0.4, "matmuls": []}
    monkeypatch.setattr(bench_ladder, "time_floor", lambda calls: dict(floor))
    monkeypatch.setattr(bench_ladder, "matmul_peak", lambda: {"gflop_per_s": 100.0})
    args = settings.parse_args(
        [
            "--ladder",
            "--ladder-sizes",
            "cpu_xs",
            "--ladder-schemes",
            "baseline,block_attnres,full_attnres",
            "--ladder-paths",
            "eager,compiled",
            "--ladder-fraction",
            "0.5",
            "--ladder-seeds",
            "2",
            "--ladder-disk-warm",
            "--ladder-override",
            "train.val_sequences=8",
        ]
    )
    lines: list[str] = []
    res = bench_ladder.bench_ladder(args, log=lines.append)
    ladder_report.print_ladder(res, log=lines.append)
    assert order[:2] == [("baseline", "eager"), ("baseline", "compiled")]  # round 0: eager first
    assert order[6:8] == [("block_attnres", "compiled"), ("block_attnres", "eager")]  # round 1: rotated, flipped
    assert order[12:] == [("full_attnres", "compiled"), ("baseline", "compiled"), ("block_attnres", "compiled")]
    (size,) = res["sizes"]
    assert [r["kind"] for r in size["runs"] if r["scheme"] == "baseline"] == ["eager", "cold", "warm", "eager", "disk"]
    for arm in size["arms"].values():
        assert arm["cold"]["vs_eager"] == pytest.approx(10 / 30)
        assert arm["warm"]["vs_eager"] == pytest.approx(10 / 4)
        assert arm["disk"]["vs_eager"] == pytest.approx(10 / 6)
        assert arm["compile_cpu_s"] == {"cold": 26.0, "disk": 2.0}
        assert arm["amortised"]["3"]["vs_eager"] == pytest.approx(10 / ((30 + 2 * 4) / 3))
        assert arm["warm"]["steady"]["floor_fraction"] == pytest.approx(0.4)
        # the full cpu_xs run (844 steps): setup and evaluations as measured, the rest per step
        eager_full, warm_full = 3 + 844 * (10 - 3) / 50, 3 + 844 * (4 - 3) / 50
        assert arm["projected"]["steps"] == 844
        assert arm["projected"]["warm_vs_eager"] == pytest.approx(eager_full / warm_full)
        assert arm["projected"]["amortised"]["3"]["vs_eager"] == pytest.approx(
            eager_full / ((warm_full + 26 + 2 * warm_full) / 3)
        )
        assert arm["projected"]["disk_amortised"]["vs_eager"] == pytest.approx(
            eager_full / ((warm_full + 2 + 2 * warm_full) / 3)
        )
    assert size["step_ratios"]["full_attnres"]["compiled"]["steady"]["n"] == 3  # cold, warm, disk: by round
    names = [c["name"] for c in res["checks"]]
    assert "cpu_xs block_attnres: compiled steady step / baseline's" in names
    assert any(line.startswith("  [PASS]") for line in lines)
    assert any(line.startswith("  [FAIL]") for line in lines)  # 1 cold in 3 is 0.79x eager here
    tables = ladder_report.markdown(res)
    row = "| cpu_xs | full_attnres | 1.000 [1.000, 1.000] | 1.000 | - | 1.000 [1.000, 1.000] | 1.000 | 1.000 |"
    assert row in tables
    assert "| cpu_xs | baseline | 26.0 | 2.0 |" in tables
