"""Downstream evaluation of a harness checkpoint with EleutherAI's lm-evaluation-harness (the paper's Table 3).

    pip install -e '.[eval]'        # lm-eval >= 0.4, < 0.5
    python -m experiments.lm_eval_adapter --checkpoint runs/<study>/<run_id> --tasks mmlu,gsm8k \\
        --device cuda --dtype bfloat16 --batch-size 32 --output table3.json

The registered lm-eval model ``attnres`` (:class:`AttnResLM`) loads a run's checkpoint (``checkpoints/last.ckpt``,
the Lightning checkpoint experiments/train.py writes) and rebuilds the model from the run's resolved
``config.yaml`` beside it (its ``model`` node is the ``attnres.ModelConfig``). It answers lm-eval's three request
types: ``loglikelihood`` (batched, right-padded forwards, contexts truncated from the left to the model's
``max_seq_len`` as lm-eval's HF model does), ``loglikelihood_rolling`` (lm-eval's rolling windows of
``max_seq_len`` tokens) and ``generate_until`` (the model's KV-cache decoding: one prefill, then one token per
forward, stopped at a stop string or at the document separator).

Tokenizer (:class:`ByteTokenizer`): the byte-level corpus (experiments/data/format.py) stores each document's
UTF-8 bytes as token ids 0..255, id = byte value, with no offset, followed by the separator id 0 (the NUL byte).
So ``text -> list(text.encode("utf-8"))`` and ids -> ``bytes(ids).decode("utf-8", errors="replace")``; id 0 is
the end of a document (lm-eval's end-of-text token) and, since every training document starts right after one,
also the prefix a scored or generated text is conditioned on (``add_bos_token=True``, the default, puts it in
front of every context). A NUL byte inside a text reads as a document boundary, as in training. Ids from 256 up
(a model whose ``vocab_size`` is larger than the corpus') are never produced by the tokenizer. Runs trained on
BPE shards are refused (their tokenizer.json lives with the dataset; not supported here).

lm-eval is imported only in this module (attnres/ stays pure torch); without it the module's import fails with
a message naming the extra.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "experiments.lm_eval_adapter needs lm-eval (`pip install -e '.[eval]'`, i.e. lm-eval>=0.4,<0.5)"
    ) from e

from attnres import ModelConfig, Transformer

SEPARATOR = 0  # experiments.data.format.SEPARATOR: the id written after every document (kept equal by the test)
MODEL_PREFIX = "model."  # LMModule keeps the Transformer as `self.model`: the Lightning state_dict's key prefix


class ByteTokenizer:
    """The byte-level corpus' mapping: a text's UTF-8 bytes are its ids (0..255, no offset); id 0 (the NUL byte)
    is the document separator."""

    vocab_size = 256
    eot_token_id = SEPARATOR

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``; an incomplete or invalid UTF-8 sequence becomes U+FFFD. ValueError for an id that
        is not a byte (>= 256)."""
        bad = [i for i in ids if not 0 <= int(i) < 256]
        if bad:
            raise ValueError(f"token id {bad[0]} is not a byte: the byte-level tokenizer has ids 0..255")
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def _checkpoint_paths(checkpoint: str | Path, config: str | Path | None) -> tuple[Path, Path]:
    path = Path(checkpoint).expanduser()
    ckpt = path / "checkpoints" / "last.ckpt" if path.is_dir() else path
    if not ckpt.is_file():
        raise FileNotFoundError(f"no checkpoint at {ckpt} (give a run directory or a .ckpt file)")
    if config is None:
        candidates = [ckpt.parent.parent / "config.yaml", ckpt.parent / "config.yaml"]
        found = [c for c in candidates if c.is_file()]
        if not found:
            raise FileNotFoundError(
                f"no config.yaml beside {ckpt} (looked for {', '.join(map(str, candidates))}); pass config=<path>"
            )
        config = found[0]
    return ckpt, Path(config).expanduser()


def load_checkpoint(
    checkpoint: str | Path, config: str | Path | None = None, device: str | torch.device = "cpu"
) -> tuple[Transformer, dict[str, Any]]:
    """(model in eval mode on ``device``, the run's resolved config as a dict) from a harness checkpoint: a run
    directory (its checkpoints/last.ckpt) or a .ckpt file, and the run's config.yaml (default: the run directory's,
    i.e. two levels above the .ckpt). The model is ``Transformer(build_model_config(cfg))`` with the Lightning
    state_dict's ``model.*`` tensors loaded strictly; a run trained on BPE shards is a ValueError."""
    from omegaconf import OmegaConf

    from .config.config_schema import build_model_config

    ckpt_path, config_path = _checkpoint_paths(checkpoint, config)
    cfg = OmegaConf.load(config_path)
    tokenizer = str(OmegaConf.select(cfg, "data.tokenizer", default="bytes"))
    if tokenizer != "bytes":
        raise ValueError(
            f"{config_path}: the run was trained with data.tokenizer={tokenizer}; the lm-eval adapter supports the "
            "byte-level tokenizer only"
        )
    model_config: ModelConfig = build_model_config(cfg)
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False, mmap=True)
    state = ckpt["state_dict"] if isinstance(ckpt, dict) and "state_dict" in ckpt else ckpt
    weights = {k[len(MODEL_PREFIX) :]: v for k, v in state.items() if k.startswith(MODEL_PREFIX)}
    if not weights:
        raise ValueError(f"{ckpt_path} holds no `model.*` tensors: not a checkpoint of experiments.train")
    model = Transformer(model_config)
    model.load_state_dict(weights, strict=True)
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    return model.to(device).eval(), container  # type: ignore[return-value]


@register_model("attnres")
class AttnResLM(TemplateLM):
    """lm-eval model over a harness checkpoint (byte-level tokenizer, see the module docstring).

    Arguments (also as lm-eval ``model_args``): ``checkpoint`` (run directory or .ckpt), ``config`` (its
    config.yaml, default found beside it), ``device`` (default cuda when available), ``dtype`` (float32, or
    bfloat16 / float16: autocast around the forwards; log-softmax in fp32), ``batch_size`` (sequences per
    loglikelihood forward; lm-eval's "auto" means 16 here, and its ``max_batch_size`` is accepted and unused),
    ``max_length`` (default the model's max_seq_len), ``max_gen_toks`` (default 256 bytes), ``add_bos_token``
    (prefix contexts with the separator id 0; default True). Or pass a built ``model``
    instead of ``checkpoint`` (tests)."""

    def __init__(
        self,
        checkpoint: str | None = None,
        config: str | None = None,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int | str = 16,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        add_bos_token: bool | str = True,
        model: Transformer | None = None,
        max_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if model is None:
            if checkpoint is None:
                raise ValueError("AttnResLM needs checkpoint=<run dir or .ckpt> (or a model)")
            model, _cfg = load_checkpoint(checkpoint, config, dev)
        self.model = model.to(dev).eval()
        self._device = dev
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[str(dtype)]
        self.tokenizer = ByteTokenizer()  # type: ignore[assignment]
        self.batch_size = 16 if str(batch_size).startswith("auto") else int(batch_size)
        self._max_length = int(max_length or model.config.max_seq_len)
        if self._max_length > model.config.max_seq_len:
            raise ValueError(f"max_length {self._max_length} > the model's max_seq_len {model.config.max_seq_len}")
        self.max_gen_toks = int(max_gen_toks)
        self.add_bos_token = str(add_bos_token).lower() in ("true", "1", "yes")

    # ---- properties lm-eval reads -------------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return SEPARATOR

    @property
    def prefix_token_id(self) -> int:
        return SEPARATOR

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return "attnres-bytes"

    # ---- tokenization -------------------------------------------------------------------------------------------
    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """The text's bytes, preceded by the separator when ``add_special_tokens`` (None: ``add_bos_token``)."""
        ids = self.tokenizer.encode(string)  # type: ignore[union-attr]
        bos = self.add_bos_token if add_special_tokens is None else add_special_tokens
        return [SEPARATOR, *ids] if bos else ids

    def tok_decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)  # type: ignore[union-attr]

    # ---- forwards -----------------------------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self._device.type, dtype=self.dtype)

    @torch.inference_mode()
    def _log_probs(self, batch: list[list[int]]) -> torch.Tensor:
        """log_softmax of the model's logits (fp32) for the right-padded sequences of ``batch``: [B, T_max, V].
        Right padding cannot change an earlier position's logits: attention is causal and every residual scheme
        works token by token (attnres/model.py)."""
        width = max(len(s) for s in batch)
        idx = torch.full((len(batch), width), SEPARATOR, dtype=torch.long)
        for i, s in enumerate(batch):
            idx[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        with self._autocast():
            logits = self.model(idx.to(self._device))
        return F.log_softmax(logits.float(), dim=-1)

    def _score(self, windows: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of log p(continuation | context), whether greedy decoding gives the continuation) per (context,
        continuation) pair of token lists. The input is (context + continuation)[:-1], cut from the left to
        max_length; batches of ``batch_size`` sequences, longest first (similar lengths share a batch)."""
        L = self.max_length
        inputs, conts = [], []
        for context, continuation in windows:
            if not continuation:
                raise ValueError("an empty continuation has no log-likelihood")
            if len(continuation) > L:
                raise ValueError(f"a continuation of {len(continuation)} tokens does not fit max_length {L}")
            inputs.append((context + continuation)[-(L + 1) :][:-1])
            conts.append(continuation)
        order = sorted(range(len(inputs)), key=lambda i: -len(inputs[i]))
        results: list[tuple[float, bool]] = [(0.0, False)] * len(inputs)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            logp = self._log_probs([inputs[i] for i in chunk])
            for row, i in enumerate(chunk):
                n, c = len(inputs[i]), len(conts[i])
                lp = logp[row, n - c : n]  # [c, V]: the positions that predict the continuation
                target = torch.tensor(conts[i], dtype=torch.long, device=lp.device)
                total = float(lp.gather(-1, target[:, None]).sum())
                greedy = bool((lp.argmax(-1) == target).all())
                results[i] = (total, greedy)
        return results

    def _loglikelihood_tokens(
        self, requests: list[tuple[tuple[str, str], list[int], list[int]]], disable_tqdm: bool = False, **_: Any
    ) -> list[tuple[float, bool]]:
        answers = self._score([(ctx, cont) for _, ctx, cont in requests])
        for (key, _, _), answer in zip(requests, answers):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return answers

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of each whole text (conditioned on the separator), in lm-eval's disjoint rolling windows
        of max_length tokens: every byte scored once, each window with as much context as fits."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        out = []
        for (string,) in (req.args for req in requests):
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    token_list=self.tok_encode(string, add_special_tokens=False),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            total = sum(lp for lp, _ in self._score(windows))
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
            out.append(total)
        return out

    # ---- generation ---------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def _decode(
        self, prompt: list[int], max_new: int, until: list[str], temperature: float, generator: torch.Generator | None
    ) -> list[int]:
        """New ids after ``prompt`` by the model's KV-cache decoding (as Transformer.generate: one prefill, then one
        token per forward), greedy at temperature 0; stops after max_new ids, at the separator (not returned) or
        once the decoded text holds a stop string."""
        cache = self.model.new_cache(len(prompt) + max_new)
        with self._autocast():
            logits = self.model(torch.tensor([prompt], device=self._device), cache=cache)
        new: list[int] = []
        for _ in range(max_new):
            last = logits[:, -1].float()
            if temperature > 0:
                nxt = torch.multinomial((last / temperature).softmax(-1), 1, generator=generator)
            else:
                nxt = last.argmax(-1, keepdim=True)
            token = int(nxt)
            if token == SEPARATOR:
                break
            new.append(token)
            if until and any(s in self.tok_decode(new) for s in until):
                break
            if len(new) < max_new:
                with self._autocast():
                    logits = self.model(nxt, cache=cache)
        return new

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Per request (context, gen_kwargs): the continuation up to the first stop string of ``until`` (cut
        there), at most ``max_gen_toks`` bytes; the context is cut from the left to max_length - max_gen_toks
        tokens. Greedy unless do_sample with a temperature > 0."""
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

        out = []
        for context, gen_kwargs in (req.args for req in requests):
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            until = [s for s in handle_stop_sequences(kwargs.pop("until", None), eos=None) if s]
            max_new = int(kwargs.pop("max_gen_toks"))
            temperature = float(kwargs.pop("temperature", 0.0) or 0.0) if kwargs.pop("do_sample", False) else 0.0
            max_ctx = self.max_length - max_new
            if max_ctx <= 0:
                raise ValueError(f"max_gen_toks {max_new} leaves no room for a context in max_length {self.max_length}")
            prompt = self.tok_encode(context)[-max_ctx:]
            seed = kwargs.pop("seed", None)
            generator = None
            if temperature > 0 and seed is not None:
                generator = torch.Generator(self._device).manual_seed(int(seed))
            text = self.tok_decode(self._decode(prompt, max_new, until, temperature, generator))
            for s in until:
                text = text.split(s)[0]
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            out.append(text)
        return out


# ---- command line ---------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m experiments.lm_eval_adapter",
        description="Evaluate a harness checkpoint on lm-eval tasks (byte-level model; see the module docstring).",
    )
    p.add_argument("--checkpoint", required=True, help="a run directory (its checkpoints/last.ckpt) or a .ckpt file")
    p.add_argument("--config", default=None, help="the run's config.yaml (default: the run directory's)")
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task or group names (e.g. mmlu,gsm8k)")
    p.add_argument("--include-path", default=None, help="a directory of extra task YAMLs (lm-eval's include_path)")
    p.add_argument("--num-fewshot", type=int, default=None)
    p.add_argument("--limit", type=float, default=None, help="examples per task (a fraction when < 1)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--max-gen-toks", type=int, default=256, help="bytes a generation task may produce at most")
    p.add_argument("--gen-kwargs", default=None, help="lm-eval gen_kwargs, e.g. max_gen_toks=512")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--confirm-run-unsafe-code", action="store_true", help="needed by code tasks (humaneval, mbpp)")
    p.add_argument("--output", default=None, help="write lm-eval's results (without samples) to this JSON file")
    return p


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """lm_eval.simple_evaluate over the checkpoint: its results dict (samples left out)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    lm = AttnResLM(
        checkpoint=args.checkpoint,
        config=args.config,
        device=args.device,
        dtype=args.dtype,
        batch_size=args.batch_size,
        max_gen_toks=args.max_gen_toks,
    )
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=[t for t in args.tasks.split(",") if t],
        num_fewshot=args.num_fewshot,
        limit=args.limit,
        gen_kwargs=args.gen_kwargs,
        task_manager=TaskManager(include_path=args.include_path),
        log_samples=False,
        random_seed=args.seed,
        numpy_random_seed=args.seed,
        torch_random_seed=args.seed,
        fewshot_random_seed=args.seed,
        confirm_run_unsafe_code=args.confirm_run_unsafe_code,
    )
    assert results is not None  # rank 0 of one process
    return dict(results)


def _rows(results: dict[str, Any]) -> Iterator[str]:
    for task, metrics in sorted(results.get("results", {}).items()):
        shown = ", ".join(
            f"{k.split(',')[0]}={v:.4f}" for k, v in metrics.items() if isinstance(v, float) and "stderr" not in k
        )
        yield f"{task}: {shown}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    results = evaluate(args)
    for row in _rows(results):
        print(row)
    if args.output:
        from results.io import atomic_write_text

        kept = {k: results[k] for k in ("results", "versions", "n-shot", "config") if k in results}
        atomic_write_text(Path(args.output), json.dumps(kept, indent=2, sort_keys=True, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
