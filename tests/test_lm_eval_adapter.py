"""The lm-eval adapter (experiments/lm_eval_adapter.py): a tiny seeded Block AttnRes model saved as a harness
checkpoint (run directory: config.yaml + checkpoints/last.ckpt), evaluated through lm-eval's evaluator on two
local tasks written here (a multiple-choice task and a generation task over jsonl files; nothing downloaded). Its
answers are checked against plain forwards of the model: log-likelihoods to 1e-5 and is_greedy, a rolling
log-likelihood over a text longer than the context, and a generation cut at a stop string against
Transformer.generate's greedy decode. Skipped without lm-eval (the `eval` extra)."""

from __future__ import annotations

import json
import textwrap

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install -e '.[eval]')")

import torch
import torch.nn.functional as F

from tests.conftest import compose

SEQ_LEN = 32  # the tiny model's context: the long example and the rolling text exceed it


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """A harness run directory holding a random-init (seeded) model, saved as experiments.train saves one: the
    resolved config.yaml and a Lightning checkpoint of LMModule's state_dict (keys `model.*`) written by
    AtomicCheckpointIO. The LM head's rows of the non-ASCII bytes and of the separator are zero, so that the
    model's greedy choices are ASCII text (a random model otherwise emits bytes that are not UTF-8)."""
    from omegaconf import OmegaConf

    from experiments.config.config_schema import build_model_config
    from experiments.run.checkpoint_io import AtomicCheckpointIO
    from experiments.run.identity import resolved_container
    from experiments.training.module import LMModule

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    cfg = compose(["experiment=smoke", "model=block_attnres", "data.vocab_size=256", f"size.seq_len={SEQ_LEN}"])
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(resolved_container(cfg))))
    torch.manual_seed(0)
    module = LMModule(build_model_config(cfg), None, None, total_steps=1, log_every=1, eval_every=1)
    with torch.no_grad():
        module.model.lm_head.weight[128:] = 0.0
        module.model.lm_head.weight[0] = 0.0
        module.model.lm_head.weight.mul_(20.0)  # peaked distributions: greedy matters
    ckpt = {"state_dict": module.state_dict(), "global_step": 1, "loops": {}, "epoch": 0}
    AtomicCheckpointIO().save_checkpoint(ckpt, run / "checkpoints" / "last.ckpt")
    return run, module.model.eval()


def ids(text: str) -> list[int]:
    """The training corpus' mapping, spelled out: UTF-8 bytes, id = byte value."""
    return list(text.encode("utf-8"))


def hand_loglikelihood(model, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """One plain forward over (context + continuation)[:-1], cut from the left to max_seq_len; the sum of the
    continuation tokens' log_softmax entries; and whether each is the argmax."""
    full = (context + continuation)[-(model.config.max_seq_len + 1) :]
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([full[:-1]])).float(), -1)[0, -len(continuation) :]
    target = torch.tensor(continuation)
    return float(logp.gather(-1, target[:, None]).sum()), bool((logp.argmax(-1) == target).all())


def greedy_text(model, prompt: list[int], n: int) -> str:
    out = model.generate(torch.tensor([prompt]), n)[0, len(prompt) :].tolist()
    return bytes(out).decode("ascii")


def test_the_tokenizer_is_the_corpus_mapping(tmp_path):
    """A text file prepared by the data pipeline (experiments.prepare_data files) holds exactly the shim's ids,
    with the separator the adapter uses after the document."""
    import numpy as np

    from experiments.data import prepare_text_files
    from experiments.data.format import SEPARATOR
    from experiments.lm_eval_adapter import SEPARATOR as ADAPTER_SEPARATOR
    from experiments.lm_eval_adapter import ByteTokenizer

    text = "".join(f"line {i}: héllo ∑ → ✓\n" for i in range(50))
    src = tmp_path / "doc.txt"
    src.write_text(text, encoding="utf-8")
    out = prepare_text_files([src], tmp_path / "shards", split="tail", val_fraction=0.2, progress=False)
    train = np.fromfile(out / "train.bin", dtype=np.uint8).tolist()
    tok = ByteTokenizer()
    assert ADAPTER_SEPARATOR == SEPARATOR
    assert train[-1] == SEPARATOR
    assert train[:-1] == tok.encode(text)[: len(train) - 1]
    assert tok.decode(train[:-1]) == text[: len(tok.decode(train[:-1]))]


def test_lm_eval_answers_match_plain_forwards(run_dir, tmp_path):
    import lm_eval
    from lm_eval.api.instance import Instance
    from lm_eval.tasks import TaskManager

    from experiments.lm_eval_adapter import SEPARATOR, AttnResLM

    run, model = run_dir
    lm = AttnResLM(checkpoint=str(run), device="cpu", batch_size=2, max_gen_toks=12)
    assert lm.max_length == SEQ_LEN
    for name, p in model.state_dict().items():  # the checkpoint round trip: the same weights
        assert torch.equal(lm.model.state_dict()[name], p), name

    # tasks: three multiple-choice questions, one context longer than the model's context, one choice the
    # model's own greedy continuation; and a generation task whose stop string occurs in the greedy output
    long_q = "Q: " + "the quick brown fox jumps over the lazy dog " * 2 + "?\nA:"
    own = greedy_text(model, [SEPARATOR, *ids("Q: 2+2?\nA:")], 4)
    mc = [  # target_delimiter "" (below): the choices carry their own space
        {"question": "Q: 2+2?\nA:", "choices": [" 4", " five", own], "answer": 0},
        {"question": "Q: capital of France?\nA:", "choices": [" Paris", " Rome"], "answer": 0},
        {"question": long_q, "choices": [" yes", " no", " maybe"], "answer": 1},
    ]
    prompt = "def f(x):\n"
    greedy = greedy_text(model, [SEPARATOR, *ids(prompt)], 12)
    stop = greedy[5:7]
    gen = [{"prompt": prompt, "target": ""}]
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name, docs in (("mc", mc), ("gen", gen)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    common = "dataset_path: json\ntest_split: test\n"
    (tasks / "tiny_mc.yaml").write_text(
        f"task: attnres_tiny_mc\n{common}dataset_kwargs:\n  data_files:\n    test: {tmp_path / 'mc.jsonl'}\n"
        + textwrap.dedent("""\
            output_type: multiple_choice
            doc_to_text: "{{question}}"
            doc_to_choice: choices
            target_delimiter: ""
            doc_to_target: answer
            metric_list:
              - metric: acc
            """)
    )
    (tasks / "tiny_gen.yaml").write_text(
        f"task: attnres_tiny_gen\n{common}dataset_kwargs:\n  data_files:\n    test: {tmp_path / 'gen.jsonl'}\n"
        + textwrap.dedent(f"""\
            output_type: generate_until
            doc_to_text: "{{{{prompt}}}}"
            doc_to_target: "{{{{target}}}}"
            generation_kwargs:
              until: [{json.dumps(stop)}]
              do_sample: false
            metric_list:
              - metric: exact_match
            """)
    )
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=["attnres_tiny_mc", "attnres_tiny_gen"],
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),  # no index of the built-ins
        log_samples=True,
        bootstrap_iters=0,
    )
    assert results is not None
    samples = {name: sorted(s, key=lambda x: x["doc_id"]) for name, s in results["samples"].items()}

    greedy_seen = False
    assert [s["doc_id"] for s in samples["attnres_tiny_mc"]] == [0, 1, 2]
    for sample, doc in zip(samples["attnres_tiny_mc"], mc):
        assert len(sample["resps"]) == len(doc["choices"])
        for args, resp, choice in zip(sample["arguments"], sample["resps"], doc["choices"]):
            context, continuation = args
            assert (context, continuation) == (doc["question"], choice)
            want_ll, want_greedy = hand_loglikelihood(model, [SEPARATOR, *ids(context)], ids(continuation))
            got_ll, got_greedy = resp[0]
            assert got_ll == pytest.approx(want_ll, abs=1e-5)
            assert got_greedy == want_greedy
            greedy_seen |= want_greedy
    assert greedy_seen  # the model's own continuation is greedy: both answers of is_greedy were checked
    assert len([SEPARATOR, *ids(long_q)]) > SEQ_LEN  # the long context was cut from the left

    (gen_sample,) = samples["attnres_tiny_gen"]
    assert stop in greedy
    assert gen_sample["resps"][0][0] == greedy.split(stop)[0]

    # rolling: every byte of a text 3.5 contexts long scored once, each window with as much context as fits
    text = "import os\nimport sys\n" * 5 + "x"
    stream = [SEPARATOR, *ids(text)]
    n, L = len(stream) - 1, SEQ_LEN
    assert n > 3 * L
    want = 0.0
    for a in range(0, n, L):  # predicts tokens stream[a + 1 .. b]
        b = min(a + L, n)
        window = stream[max(0, b - L) : b + 1]
        with torch.no_grad():
            logp = F.log_softmax(model(torch.tensor([window[:-1]])).float(), -1)[0]
        targets = torch.tensor(window[1:])
        want += float(logp.gather(-1, targets[:, None])[-(b - a) :].sum())
    (got,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert got == pytest.approx(want, abs=1e-4)  # a sum of ~110 float32 terms
