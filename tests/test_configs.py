"""conf/ composes, follows its stated rules, and bad configs fail with messages that name the key.

No Lightning import here (fast): composition, meta-device model builds, config checks, hashing, optimizer groups.
"""

from __future__ import annotations

import math
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from conftest import CONF, compose
from omegaconf import OmegaConf

from experiments.config.config_schema import build_model_config
from experiments.config.validation import check_config
from experiments.run.identity import experiment_config, resolved_container, run_identity
from experiments.sizes import baseline_non_embedding, solve_d_ff, steps_for
from experiments.training.optim import param_groups, warmup_cosine

torch.set_num_threads(1)

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
VARIANTS = ("baseline", "full_attnres", "block_attnres")
PAPER_SIZES = ("paper_194m", "paper_241m", "paper_296m", "paper_436m", "paper_528m")
CPU_SIZES = ("cpu_xs", "cpu_s", "cpu_m", "cpu_l", "cpu_xl")
# Table 2 (paper.md §3.2): activated params (non-embedding), tokens, L_b, d_model, lr, batch.
TABLE2 = {
    "paper_194m": (194e6, 38.7e9, 12, 896, 2.99e-3, 192),
    "paper_241m": (241e6, 45.4e9, 13, 960, 2.80e-3, 256),
    "paper_296m": (296e6, 62.1e9, 14, 1024, 2.50e-3, 320),
    "paper_436m": (436e6, 87.9e9, 16, 1168, 2.20e-3, 384),
    "paper_528m": (528e6, 119.0e9, 17, 1264, 2.02e-3, 432),
}


def test_groups_present():
    for group in ("model", "size", "data", "optimizer", "scheduler", "trainer", "logger", "experiment"):
        assert (CONF / group).is_dir(), group
    assert {"baseline", "full_attnres", "block_attnres"} <= {p.stem for p in (CONF / "model").glob("*.yaml")}
    assert {"cpu", "gpu", "ddp", "fsdp"} <= {p.stem for p in (CONF / "trainer").glob("*.yaml")}
    assert {"wandb", "csv", "none"} <= {p.stem for p in (CONF / "logger").glob("*.yaml")}
    assert {"paper_scaling", "cpu_ladder", "smoke"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_resolves(experiment):
    cfg = compose([f"experiment={experiment}", "data.name=/some/prepared/shards"])
    container = resolved_container(cfg)  # every interpolation resolves
    assert container["model"]["variant"] in VARIANTS
    assert container["study"] == experiment
    if cfg.trainer.accelerator == "cpu":  # GPU presets fail the CUDA check here, by design
        check_config(cfg)
    build_model_config(OmegaConf.merge(cfg, {"data": {"vocab_size": 256}}))


def test_variant_and_size_names_are_their_file_names():
    # `variant` / `size.name` go into result records; a copied yaml that forgot to rename would mislabel runs.
    for path in (CONF / "model").glob("*.yaml"):
        assert OmegaConf.load(path).variant == path.stem, path
    for path in (CONF / "size").glob("*.yaml"):
        s = OmegaConf.load(path)
        if path.stem == "cpu_deep":  # a rung of the deep ladder: deep_L<L_b>
            assert s.name == f"deep_L{s.n_layers}", path
        elif path.stem == "cpu_deep_moe":  # a rung of the deep MoE ladder: deep_moe_L<L_b>
            assert OmegaConf.to_container(s)["name"] == "deep_moe_L${.n_layers}", path
        elif "d_over_lb" in s:  # a derived size names its grid cell: <file name>_d<d/L_b>_h<H/L_b>
            assert s.name == f"{path.stem}_d{s.d_over_lb}_h{s.heads_over_lb}", path
        elif "tokens_per_param" in s:  # a map cell (cpu_map.yaml): map_L<L_b>_d<d_model>
            assert s.name == f"map_L{s.n_layers}_d{s.d_model}", path
        else:
            assert s.name == path.stem, path


@pytest.mark.parametrize("size", PAPER_SIZES)
def test_paper_sizes_match_table2_on_meta(size):
    """Every (variant x paper size) builds on the meta device with non-embedding params within 2% of Table 2,
    context 8192, heads = L_b with head_dim 128, and the row's lr / batch / tokens."""
    target, tokens, n_layers, d_model, lr, batch = TABLE2[size]
    from attnres import Transformer

    for variant in VARIANTS:
        cfg = compose(
            ["experiment=paper_scaling", f"size={size}", f"model={variant}", "data.name=/x", "data.vocab_size=163840"]
        )
        mc = build_model_config(cfg)
        assert (mc.n_layers, mc.d_model, mc.n_heads, mc.head_dim) == (n_layers, d_model, n_layers, 128)
        assert mc.max_seq_len == 8192
        assert cfg.train.seq_len == 8192
        assert cfg.size.seq_len == 8192
        assert cfg.optimizer.lr == pytest.approx(lr)
        assert cfg.train.batch_size == batch
        assert cfg.train.tokens == pytest.approx(tokens)
        with torch.device("meta"):
            n = Transformer(mc).num_params(non_embedding=True)
        assert abs(n / target - 1) < 0.02, (variant, size, n, target)
        if variant == "block_attnres":
            # "≈ 8 blocks": S = ceil(2 L_b / 8) gives 8 blocks for L_b = 12, 14, 16 and 7 for L_b = 13, 17
            assert mc.n_blocks == 8
            assert mc.effective_n_blocks in (7, 8)


@pytest.mark.parametrize("size", PAPER_SIZES + CPU_SIZES)
def test_size_rules(size):
    """d_ff is the solution of the stated parameter equation; CPU token budgets are 9 x the target, in batches of
    512 tokens, and every ladder size reads its lr from the generated tuned-lr table."""
    s = OmegaConf.load(CONF / "size" / f"{size}.yaml")
    attn = s.n_heads * s.head_dim
    multiple = 16 if size.startswith("paper") else 8
    assert s.d_ff == solve_d_ff(s.n_layers, s.d_model, attn, s.target_params, multiple)
    n = baseline_non_embedding(s.n_layers, s.d_model, attn, s.d_ff)
    assert abs(n / s.target_params - 1) < 0.02
    if size.startswith("cpu"):
        assert s.tokens == 9 * s.target_params
        assert s.seq_len == 128
        assert s.head_dim == 16
        assert s.batch_size * s.seq_len == 512
    assert OmegaConf.to_container(s)["lr"] == "${attnres_lr:${.name}}"


def test_cpu_ladder_is_a_geometric_depth_ladder_with_four_blocks():
    targets, depths = [], []
    for size in CPU_SIZES:
        cfg = compose(["experiment=cpu_ladder", f"size={size}", "model=block_attnres", "data.vocab_size=256"])
        mc = build_model_config(cfg)
        assert mc.effective_n_blocks == 4, size  # n_blocks 4 in the preset: S = 2..4 sublayers per block
        targets.append(cfg.size.target_params)
        depths.append(mc.n_layers)
        assert cfg.data.name == "stdlib"
        assert cfg.study == "cpu_ladder"
    assert depths == [4, 5, 6, 7, 8]
    ratios = [b / a for a, b in pairwise(targets)]
    assert all(r == pytest.approx(1.25, rel=1e-4) for r in ratios)
    sweep = compose(["+sweep=cpu_ladder"], return_hydra_config=True).hydra.sweeper.params
    assert sweep.size == "cpu_xs,cpu_s,cpu_m,cpu_l"
    assert sweep.seed == "0,1,2"
    lr_sweep = compose(["+sweep=cpu_lr"], return_hydra_config=True).hydra.sweeper.params
    assert lr_sweep.size == ",".join(CPU_SIZES)
    assert not set(lr_sweep.seed.split(",")) & {"0", "1", "2"}


def test_readme_command_composes_to_the_smallest_cpu_size_on_the_default_corpus():
    cfg = compose(["experiment=cpu_ladder", "size=cpu_xs"])
    assert cfg.size.name == "cpu_xs"
    assert cfg.data.name == "stdlib"
    assert cfg.data.max_bytes is None
    assert cfg.model.variant == "baseline"
    assert cfg.trainer.accelerator == "cpu"
    steps = steps_for(cfg.train.tokens, cfg.train.batch_size, cfg.train.seq_len)
    assert steps == round(cfg.size.tokens / 512) >= 800  # a real training run, not a smoke test


def test_variants_share_every_hyperparameter_of_a_size():
    def identity(variant):
        ident = experiment_config(
            resolved_container(compose(["experiment=cpu_ladder", "size=cpu_m", f"model={variant}"]))
        )
        for key in ("variant", "residual", "n_blocks", "block_size", "residual_options"):
            ident["model"].pop(key)
        return ident

    assert identity("baseline") == identity("full_attnres") == identity("block_attnres")


def test_hydra_output_dirs_cannot_collide():
    text = (CONF / "hydra" / "default.yaml").read_text()
    raw = OmegaConf.to_container(OmegaConf.load(CONF / "hydra" / "default.yaml"), resolve=False)
    for key in ("run", "sweep"):
        d = raw[key]["dir"]
        assert "%f" in d, d
        assert "attnres_pid" in d, d
    assert "hydra.job.num" in text


def test_moved_targets_keep_their_recorded_names_in_the_identity():
    """results.config_hash.HASH_TARGET_NAMES: each key is where a hashed ``_target_`` lives now (it imports), each
    value the name the committed runs recorded, and a composed run's identity holds the recorded names. The recipe
    names records carry (experiments.run.record_builder.RECIPE_NAMES) are keyed by targets that import too."""
    from hydra.utils import get_object

    from experiments.run.record_builder import RECIPE_NAMES
    from results.config_hash import HASH_TARGET_NAMES

    for target in (*HASH_TARGET_NAMES, *RECIPE_NAMES):
        assert callable(get_object(target)), target
    assert not set(HASH_TARGET_NAMES) & set(HASH_TARGET_NAMES.values())
    for overrides in ([], ["optimizer=muon", "scheduler=wsd"]):
        cfg = compose(["experiment=cpu_ladder", *overrides])
        ident = experiment_config(resolved_container(cfg))
        for node in ("data", "optimizer", "scheduler"):
            assert ident[node]["_target_"] == HASH_TARGET_NAMES[cfg[node]._target_]


def test_config_hash_covers_results_not_paths():
    def chash(*o):
        return run_identity(compose(["experiment=cpu_ladder", *o]))[0]

    base = chash()
    assert base == chash(
        "paths.runs_root=/elsewhere",
        "logger=csv",
        "threads=1",
        "trainer.devices=1",
        "callbacks.model_checkpoint.every_n_train_steps=7",
        "train.log_every=3",
        "activation_checkpointing=true",
        "study=other",
        "fault.kill_at_step=3",
    )
    for change in (
        "seed=1",
        "size.lr=1.0e-3",
        "model=full_attnres",
        "trainer.precision=bf16-mixed",
        "optimizer.weight_decay=0.0",
        "size=cpu_s",
        "data.name=/other",
        "compile=true",
    ):
        assert chash(change) != base, change
    chash_, run_id, run_dir, study_dir = run_identity(
        compose(["experiment=cpu_ladder", "seed=3", "paths.runs_root=/r"])
    )
    assert run_id == f"baseline_cpu_xs_s3_{chash_[:8]}"
    assert len(chash_) == 16
    assert run_dir == Path("/r/cpu_ladder") / run_id
    assert study_dir == Path("/r/cpu_ladder")


# ---- bad configs: a ValueError naming the key and the allowed values, before training ------------------
@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("trainer.accelerator=tpu9", r"trainer\.accelerator='tpu9'.*allowed values: cpu, gpu"),
        ("trainer.precision=8-bit", r"trainer\.precision='8-bit'.*allowed values: 32-true"),
        ("trainer.strategy=magic", r"trainer\.strategy='magic'.*allowed values: auto, ddp"),
        ("size.lr=-1.0", r"optimizer\.lr.*must be a number in \(0"),
        ("optimizer.betas=[0.9,1.5]", r"optimizer\.betas\[1\]=1\.5"),
        ("scheduler.min_lr_ratio=2.0", r"scheduler\.min_lr_ratio=2\.0 must be a number in \[0, 1\]"),
        ("scheduler.warmup_fraction=1.0", r"scheduler\.warmup_fraction"),
        ("data.tokenizer=sentencepiece", r"data\.tokenizer='sentencepiece'; allowed values: bytes, bpe"),
        ("size.batch_size=0", r"train\.batch_size=0 must be a positive integer"),
        ("seed=-1", r"seed=-1 must be an integer >= 0"),
        ("trainer.accumulate_grad_batches=0", r"trainer\.accumulate_grad_batches=0"),
    ],
)
def test_bad_config_is_named(override, pattern):
    cfg = compose(["experiment=cpu_ladder", override])
    with pytest.raises(ValueError, match=pattern):
        check_config(cfg)


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        (["model.residual=dense"], r"residual='dense' is unknown; allowed values: baseline, full, block"),
        (["model=block_attnres", "model.n_blocks=99"], r"n_blocks=99 must be an integer in \[1, 8\]"),
        (["size.d_model=33", "size.head_dim=null"], r"d_model=33 is not divisible by n_heads=2"),
        (["+model.n_block=4"], r"model\.n_block is not a model setting; allowed keys: .*n_blocks"),
        (["model=block_attnres", "+model.residual_options.foo=1"], r"does not accept; allowed options: .*two_phase"),
    ],
)
def test_bad_model_config_is_named(overrides, pattern):
    from attnres import Transformer

    cfg = compose(["experiment=cpu_ladder", "data.vocab_size=256", *overrides])
    with pytest.raises(ValueError, match=pattern), torch.device("meta"):
        Transformer(build_model_config(cfg))  # residual options are checked by the scheme itself


def test_missing_mandatory_value_is_named():
    with pytest.raises(ValueError, match=r"data\.name has no value.*data\.name=<dir of prepared shards>"):
        run_identity(compose(["experiment=paper_scaling"]))


# ---- optimizer groups and schedule ----------------------------------------------------------------------
def test_weight_decay_groups():
    from attnres import ModelConfig, Transformer

    model = Transformer(ModelConfig(n_layers=2, d_model=32, n_heads=2, residual="block", n_blocks=2))
    groups = {g["name"]: g for g in param_groups(model, weight_decay=0.1, connection_weight_decay=0.0)}
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {names[id(p)] for p in groups["decay"]["params"]}
    no_decay = {names[id(p)] for p in groups["no_decay"]["params"]}
    connection = {names[id(p)] for p in groups["connection"]["params"]}
    assert connection == {"residual.queries", "residual.key_norm_weight"}  # 2-D, but never decayed by default
    assert "tok_emb.weight" in no_decay
    assert all(n.endswith("norm.weight") or n == "tok_emb.weight" for n in no_decay)
    assert "lm_head.weight" in decay
    assert all(p.dim() == 2 for p in groups["decay"]["params"])
    assert groups["decay"]["weight_decay"] == 0.1
    assert groups["no_decay"]["weight_decay"] == 0.0
    assert groups["connection"]["weight_decay"] == 0.0
    assert len(decay | no_decay | connection) == len(list(model.parameters()))


def test_warmup_cosine_schedule():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_cosine(opt, total_steps=100, warmup_fraction=0.1, min_lr_ratio=0.1)
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[9] == pytest.approx(1.0)
    assert lrs[-1] == pytest.approx(0.1)  # cosine to 10% of peak at the last step
    assert all(a >= b for a, b in pairwise(lrs[9:]))
    assert lrs[54] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 44 / 89)))


def test_model_node_spells_out_every_model_setting():
    """Every ModelConfig field is in conf (so config.yaml and config_hash record it), and the settings that no
    size or variant overrides equal the library's defaults."""
    import dataclasses

    from attnres import ModelConfig

    cfg = compose(["experiment=cpu_ladder"])
    fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    assert set(fields) <= set(cfg.model)
    assert set(cfg.model) - set(fields) == {"_target_", "variant"}
    for name in ("tie_embeddings", "rope_theta", "norm_eps", "init_std"):
        assert cfg.model[name] == fields[name].default, name
    # the block geometry (which cpu_ladder sets) is the library's default wherever no preset sets it
    for model in ("baseline", "block_attnres", "block_multihead", "block_no_key_norm"):
        plain = compose([f"model={model}"])
        for name in ("n_blocks", "block_size"):
            assert plain.model[name] == fields[name].default, (model, name)


@pytest.mark.parametrize("preset", ["gpu", "ddp", "fsdp"])
def test_gpu_trainer_presets_default_to_bf16_mixed(preset):
    """The GPU presets train in bf16-mixed (measured faster on an H200, docs/performance.md); CPU stays fp32."""
    assert compose([f"trainer={preset}"]).trainer.precision == "bf16-mixed"
    assert compose(["trainer=cpu"]).trainer.precision == "32-true"


def test_default_training_config_keeps_zero_init_equal_to_baseline():
    """paper.md §9 in the configuration that actually trains (not only in unit tests with eps 1e-12): at step 0
    Full and Block AttnRes give the baseline's loss. With norm_eps 1e-5 they did not (an AttnRes read at init has
    a mean square comparable to 1e-5): 5.546 / 5.549 vs 5.551 at cpu_l."""
    import torch

    from attnres import Transformer

    idx = torch.randint(0, 256, (4, 129), generator=torch.Generator().manual_seed(0))
    losses = {}
    for variant in ("baseline", "full_attnres", "block_attnres"):
        cfg = build_model_config(
            compose(["experiment=cpu_ladder", "size=cpu_l", f"model={variant}", "data.vocab_size=256"])
        )
        torch.manual_seed(0)
        model = Transformer(cfg)
        with torch.no_grad():
            losses[variant] = float(model(idx[:, :-1], idx[:, 1:])[1])
    assert losses["full_attnres"] == pytest.approx(losses["baseline"], abs=2e-4)
    assert losses["block_attnres"] == pytest.approx(losses["baseline"], abs=2e-4)


# ---- block geometry in a run's identity -----------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["baseline", "full_attnres", "hyper_static", "denseformer"])
def test_block_geometry_does_not_split_runs_of_schemes_that_ignore_it(variant):
    """A scheme that does not read n_blocks / block_size gets one run identity whatever they are set to (the
    committed cpu_ladder runs carry n_blocks 4, the canonical value, so their hashes stay)."""

    def chash(*o):
        return run_identity(compose(["experiment=cpu_ladder", f"model={variant}", *o]))[0]

    assert chash() == chash("model.n_blocks=8") == chash("model.n_blocks=null", "model.block_size=3")
    assert chash() != chash("seed=1")


def test_block_geometry_splits_block_attnres_runs():
    def chash(*o):
        return run_identity(compose(["experiment=cpu_ladder", "model=block_attnres", *o]))[0]

    assert len({chash(), chash("model.n_blocks=8"), chash("model.block_size=3")}) == 3


def test_canonical_block_geometry_is_what_ignoring_schemes_ignore():
    """attnres.registry.block_geometry_schemes says which registered schemes read the block geometry (the identity
    canonicalises it for the others); for every other scheme the model is the same whatever n_blocks / block_size
    say."""
    from attnres import RESIDUAL_SCHEMES, ModelConfig, Transformer
    from attnres.registry import block_geometry_schemes
    from results.config_hash import CANONICAL_BLOCK_GEOMETRY

    reading = block_geometry_schemes()
    assert reading == ("block",)
    assert set(CANONICAL_BLOCK_GEOMETRY) == {"n_blocks", "block_size"}
    idx = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    for name in set(RESIDUAL_SCHEMES) - set(reading):
        outputs = []
        for geometry in ({"n_blocks": 4}, {"n_blocks": 8}, {"n_blocks": None, "block_size": 3}, {"n_blocks": 99}):
            torch.manual_seed(0)
            model = Transformer(
                ModelConfig(vocab_size=64, n_layers=2, d_model=16, n_heads=2, max_seq_len=8, residual=name, **geometry)
            )
            with torch.no_grad():
                outputs.append(model(idx))
        assert all(torch.equal(outputs[0], o) for o in outputs[1:]), name


# ---- structured configs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("train.batch_size=abc", "train.batch_size"),
        ("optimizer.lr=fast", "optimizer.lr"),
        ("scheduler.warmup_steps=1.5", "scheduler.warmup_steps"),
        ("optimizer.fused=maybe", "optimizer.fused"),
        ("train.eval_count=2.5", "train.eval_count"),
        ("optimizer.betas=[0.9,high]", "optimizer.betas"),
    ],
)
def test_type_errors_fail_at_composition(override, key):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as info:
        compose(["experiment=cpu_ladder", override])
    assert key in f"{info.value} {info.value.__cause__}"


def test_schemas_type_exactly_the_yaml_keys():
    """A schema field the YAML lacks would add a key to the composed tree (and move every config_hash)."""
    import dataclasses

    from experiments.config.config_schema import SCHEMAS

    for path, schema in SCHEMAS.items():
        if path == "train":
            yaml_keys = set(OmegaConf.load(CONF / "train.yaml").train)
        else:
            yaml_keys = set(OmegaConf.load(CONF / f"{path}.yaml")) - {"defaults"}
        assert {f.name for f in dataclasses.fields(schema)} == yaml_keys, path
        # no defaults besides the target: a schema merged after the YAML must not replace its values
        assert all(f.default == "???" for f in dataclasses.fields(schema) if f.name not in ("_target_", "_partial_"))
    cfg = compose(["experiment=cpu_ladder"])
    for group in ("train", "optimizer", "scheduler"):
        assert dataclasses.is_dataclass(OmegaConf.get_type(cfg[group])), group


def test_model_config_is_instantiated_from_its_target():
    from attnres import ModelConfig

    mc = build_model_config(compose(["experiment=cpu_ladder", "model=full_sliding_window", "data.vocab_size=256"]))
    assert type(mc) is ModelConfig
    assert mc.residual == "full"
    assert mc.options.window == 8
    assert type(mc.residual_options) is dict  # plain containers, not OmegaConf nodes


# ---- import structure -----------------------------------------------------------------------------------------
def test_config_residual_and_peers_import_no_cycle():
    """attnres.config looks schemes up in attnres.registry (which imports nothing of attnres); residual does not
    import peers. No import cycle passes through the configuration, the registry or the schemes."""
    import ast

    pkg = CONF.parent / "attnres"
    graph = {}
    for path in pkg.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnres."):
                deps.add(node.module.split(".")[1])
        graph[path.stem] = deps - {"__init__"}

    def reaches(start, goal, seen=()):
        return any(d == goal or (d not in seen and reaches(d, goal, (*seen, d))) for d in graph.get(start, ()))

    assert graph["registry"] == set()
    assert "residual" not in graph["config"]
    assert "peers" not in graph["residual"]
    for module in ("config", "registry", "residual", "peers", "model"):
        assert not reaches(module, module), module


# ---------------------------------------------------------------------------------------------------------------
# MoE sizes (ffn: moe; attnres/moe.py, docs/moe.md)
TABLE2_EXPERT_D_FF = {"paper_194m": 400, "paper_241m": 432, "paper_296m": 464, "paper_436m": 528, "paper_528m": 560}


@pytest.mark.parametrize("size", PAPER_SIZES)
def test_paper_moe_sizes_match_table2_activated_params_on_meta(size):
    """Every (variant x paper MoE size) builds on the meta device with *activated* non-embedding parameters within
    1% of Table 2, the dense proxy's depth, width, heads, context, lr, batch and tokens, Table 2's d_ff as the routed
    experts' width, and shared_d_ff the solution of the stated equation; total parameters count all 64 experts."""
    from attnres import Transformer
    from attnres.flops import param_counts
    from attnres.moe import MoEFeedForward
    from experiments.sizes import moe_activated_non_embedding, solve_shared_d_ff

    target, tokens, n_layers, d_model, lr, batch = TABLE2[size]
    s = OmegaConf.load(CONF / "size" / f"{size}_moe.yaml")
    assert s.d_ff == TABLE2_EXPERT_D_FF[size]
    m = s.moe
    assert m.shared_d_ff == solve_shared_d_ff(
        s.n_layers, s.d_model, s.n_heads * s.head_dim, s.d_ff, m.n_experts, m.top_k, m.n_shared, s.target_params
    )
    for variant in VARIANTS:
        cfg = compose(
            [
                "experiment=paper_scaling",
                f"size={size}_moe",
                f"model={variant}",
                "data.name=/x",
                "data.vocab_size=163840",
            ]
        )
        mc = build_model_config(cfg)
        assert mc.ffn == "moe"
        assert (mc.n_layers, mc.d_model, mc.n_heads, mc.head_dim, mc.d_ff) == (
            n_layers,
            d_model,
            n_layers,
            128,
            TABLE2_EXPERT_D_FF[size],
        )
        assert (mc.max_seq_len, cfg.train.seq_len, cfg.train.batch_size) == (8192, 8192, batch)
        assert cfg.optimizer.lr == pytest.approx(lr)
        assert cfg.train.tokens == pytest.approx(tokens)
        counts = param_counts(mc)  # on the meta device
        assert abs(counts["activated_non_embedding"] / target - 1) < 0.01, (variant, size, counts)
        o = mc.moe_options
        expert = 3 * d_model * mc.d_ff
        assert counts["total"] - counts["activated"] == n_layers * (o.n_experts - o.top_k) * expert
        if variant == "baseline":
            assert counts["activated_non_embedding"] == moe_activated_non_embedding(
                n_layers, d_model, 128 * n_layers, mc.d_ff, o.n_experts, o.top_k, o.n_shared * mc.shared_d_ff
            )
        with torch.device("meta"):
            model = Transformer(mc)
        assert all(isinstance(b.mlp, MoEFeedForward) for b in model.blocks)


@pytest.mark.parametrize("size", [*(f"{p}_moe" for p in PAPER_SIZES), "cpu_moe"])
def test_moe_sizes_spell_out_every_moe_setting(size):
    """A MoE size names every MoEConfig field (so config_hash records each, and a changed library default cannot
    silently change a recorded run), with the library's defaults for the routing and balancing settings."""
    import dataclasses

    from attnres.config import MoEConfig

    s = OmegaConf.load(CONF / "size" / f"{size}.yaml")
    assert s.ffn == "moe"
    fields = {f.name: f.default for f in dataclasses.fields(MoEConfig)}
    assert set(s.moe) == set(fields)
    for name in ("score", "renormalize", "routed_scaling", "bias_update_rate", "aux_loss_alpha", "dispatch"):
        assert s.moe[name] == fields[name], name
    assert s.name == size


def test_cpu_moe_size_composes_checks_and_has_its_own_identity():
    """cpu_moe on the CPU ladder: the config checks pass, its baseline's activated N is within 1% of cpu_xs's
    target, and its
    config_hash differs from the dense cpu_xs run's (whose hash test_identity_stable.py freezes)."""
    from attnres.flops import param_counts
    from experiments.sizes import solve_shared_d_ff

    cfg = compose(["experiment=cpu_ladder", "size=cpu_moe", "model=block_attnres", "data.vocab_size=256"])
    check_config(cfg)
    mc = build_model_config(cfg)
    s = cfg.size
    assert s.moe.shared_d_ff == solve_shared_d_ff(
        s.n_layers,
        s.d_model,
        s.n_heads * s.head_dim,
        s.d_ff,
        s.moe.n_experts,
        s.moe.top_k,
        s.moe.n_shared,
        s.target_params,
        8,
    )
    # Block AttnRes adds (4 L_b + 2) d = 576 parameters (1.2% at this size): the rule is the baseline's
    assert param_counts(mc)["activated_non_embedding"] == 48416 + 576
    base = compose(["experiment=cpu_ladder", "size=cpu_moe", "model=baseline", "data.vocab_size=256"])
    assert abs(param_counts(build_model_config(base))["activated_non_embedding"] / s.target_params - 1) < 0.01
    ident = experiment_config(resolved_container(cfg))
    assert ident["model"]["ffn"] == "moe"
    assert ident["model"]["moe"]["n_experts"] == 8
    dense = compose(["experiment=cpu_ladder", "size=cpu_xs", "model=block_attnres", "data.vocab_size=256"])
    assert "ffn" not in experiment_config(resolved_container(dense))["model"]
    assert "moe" not in experiment_config(resolved_container(dense))["model"]
    assert run_identity(cfg)[0] != run_identity(dense)[0]


@pytest.mark.parametrize("n_layers", [8, 10, 12, 16])
def test_deep_moe_rungs_match_the_dense_rungs(n_layers):
    """Each cpu_deep_moe rung (the cpu_deep_moe sweep) passes the config checks, has the dense rung's shape, steps
    and tuned lr, a baseline whose activated N is within 1% of the dense baseline's (the solved shared width), and
    an identity of its own."""
    from attnres.flops import param_counts

    common = ["+sweep=cpu_deep_moe", f"size.n_layers={n_layers}", "data.vocab_size=256"]
    moe = compose([*common, "model=baseline"])
    dense = compose(["+sweep=cpu_deep", f"size.n_layers={n_layers}", "data.vocab_size=256", "model=baseline"])
    check_config(moe)
    check_config(compose([*common, "model=block_attnres"]))
    for key in ("n_layers", "d_model", "n_heads", "head_dim", "seq_len", "batch_size", "lr", "target_params"):
        assert moe.size[key] == dense.size[key], key
    assert moe.size.name == f"deep_moe_L{n_layers}"
    assert moe.size.d_ff * 2 == moe.size.d_model
    assert abs(moe.size.tokens - dense.size.tokens) < moe.size.batch_size * moe.size.seq_len / 2  # same steps
    activated = param_counts(build_model_config(moe))["activated_non_embedding"]
    assert abs(activated / dense.size.target_params - 1) < 0.01
    assert run_identity(moe)[0] != run_identity(dense)[0]
