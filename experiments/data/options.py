"""The data options, checked in one place: :func:`check_data_config` for the ``data`` node of a run's config, and
the per-option checks that the preparation functions run on their own arguments. Every check raises a ValueError
that names the key and what is allowed.

Pure stdlib, so config checks can run before numpy and torch are imported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

TOKENIZERS = ("bytes", "bpe")
SPLITS = ("auto", "file", "tail")  # how prepare_text_files holds out validation text
BPE_MIN_VOCAB = 257  # 256 byte tokens + the separator
BPE_MAX_VOCAB = 2**32  # the widest shard dtype, uint32 (format.DTYPE_CAPACITY)


def is_int(x: Any) -> bool:
    """An int that is not a bool (True is an int to Python, not a count to us)."""
    return isinstance(x, int) and not isinstance(x, bool)


def check_choice(value: Any, key: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{key}={value!r}; allowed values: {', '.join(allowed)}")


def check_positive_or_none(value: Any, key: str) -> None:
    if value is not None and (not is_int(value) or value <= 0):
        raise ValueError(f"{key}={value!r} must be a positive integer or None")


def check_tokenizer(tokenizer: Any, bpe_vocab_size: Any, prefix: str = "") -> None:
    """tokenizer in TOKENIZERS; for "bpe", bpe_vocab_size an integer in [257, 2**32]."""
    check_choice(tokenizer, f"{prefix}tokenizer", TOKENIZERS)
    if tokenizer == "bpe" and (not is_int(bpe_vocab_size) or not BPE_MIN_VOCAB <= bpe_vocab_size <= BPE_MAX_VOCAB):
        raise ValueError(
            f"{prefix}bpe_vocab_size={bpe_vocab_size!r} must be an integer >= {BPE_MIN_VOCAB} (256 bytes + separator)"
        )


def check_val_fraction(val_fraction: Any, key: str = "val_fraction") -> None:
    if not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 0.5:
        raise ValueError(f"{key}={val_fraction!r} must be in (0, 0.5)")


def check_data_config(data: Mapping[str, Any], prefix: str = "data.") -> None:
    """The ``data`` node of a run's config (conf/data/*.yaml): name, tokenizer, bpe_vocab_size, max_bytes,
    vocab_size and num_workers. Whether the named shards exist and fit the model is checked when they load."""
    if not data.get("name"):
        raise ValueError(f"{prefix}name must be 'stdlib' or the directory of prepared token shards")
    check_tokenizer(data.get("tokenizer"), data.get("bpe_vocab_size"), prefix)
    check_positive_or_none(data.get("max_bytes"), f"{prefix}max_bytes")
    check_positive_or_none(data.get("vocab_size"), f"{prefix}vocab_size")
    workers = data.get("num_workers", 0)
    if not is_int(workers) or workers < 0:
        raise ValueError(f"{prefix}num_workers={workers!r} must be an integer >= 0")
