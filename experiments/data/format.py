"""The on-disk format of a prepared dataset (one directory each)::

    <dir>/header.json     ShardHeader: tokenizer, vocab_size, dtype, n_tokens, checksums, source summary
    <dir>/train.bin       flat token ids, numpy memmap of `dtype` (no header bytes)
    <dir>/val.bin         same, held-out documents only
    <dir>/manifest.json   per-file path + sha256 + split (stdlib and text files; not for HF datasets)
    <dir>/tokenizer.json  the `tokenizers` BPE model, only when tokenizer == "bpe"

dtype is uint8 for the byte-level tokenizer (vocab 256), uint16 for BPE vocabularies up to 65,536 and
uint32 above. Documents are concatenated with the separator token 0 after each one: for bytes that is the
NUL byte (which no stdlib source contains); for BPE it is the special token "\\x00", id 0. A NUL byte inside
a document therefore reads as a document boundary in both encodings.

A directory is complete once header.json exists: it is written last, and the directory is published by an
atomic rename (publish.py). The header's sha256 checksums are the dataset's fingerprint: the same corpus
prepared on two machines gives byte-identical headers. Pure stdlib.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .options import TOKENIZERS, is_int

FORMAT_VERSION = 1
SEPARATOR = 0  # token id written after every document
DTYPE_CAPACITY = {"uint8": 2**8, "uint16": 2**16, "uint32": 2**32}  # largest vocab each dtype can hold
BLOCK = 1 << 24  # bytes (or tokens) per read when hashing / scanning files

HINT_ANY = (
    "prepare shards with `python -m experiments.prepare_data stdlib` (the built-in default corpus), "
    "`python -m experiments.prepare_data files <paths...> --out DIR` or `... hf <name> --out DIR`"
)


@dataclass
class ShardHeader:
    tokenizer: str  # "bytes" | "bpe"
    vocab_size: int
    dtype: str  # "uint8" | "uint16" | "uint32"
    n_tokens: dict[str, int]  # {"train": int, "val": int}, separators included
    checksum: dict[str, str]  # {"algorithm": "sha256", "train": hex, "val": hex[, "tokenizer": hex]}
    source: dict[str, Any] = field(default_factory=dict)  # manifest summary (kind, corpus_sha256, ...)
    separator: int | None = SEPARATOR
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        # No timestamps or absolute paths: two machines that prepared the same corpus get identical headers.
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, raw: Any, where: Path | str = "header.json") -> ShardHeader:
        """A header from parsed header.json; ValueError naming the bad key when it is not one this code reads."""
        hint = f"the shard header {where} is invalid; delete its directory and re-prepare it ({HINT_ANY})"
        if not isinstance(raw, dict):
            raise ValueError(f"{hint}: expected a JSON object")
        missing = [k for k in ("tokenizer", "vocab_size", "dtype", "n_tokens", "checksum") if k not in raw]
        if missing:
            raise ValueError(f"{hint}: missing key(s) {', '.join(missing)}")
        version = raw.get("format_version", None)
        if version != FORMAT_VERSION:
            raise ValueError(f"{hint}: format_version={version!r}, this code reads version {FORMAT_VERSION}")
        if raw["tokenizer"] not in TOKENIZERS:
            raise ValueError(f"{hint}: tokenizer={raw['tokenizer']!r}; allowed values: {', '.join(TOKENIZERS)}")
        if raw["dtype"] not in DTYPE_CAPACITY:
            raise ValueError(f"{hint}: dtype={raw['dtype']!r}; allowed values: {', '.join(DTYPE_CAPACITY)}")
        vocab = raw["vocab_size"]
        if not is_int(vocab) or not 2 <= vocab <= DTYPE_CAPACITY[raw["dtype"]]:
            raise ValueError(
                f"{hint}: vocab_size={vocab!r} does not fit dtype {raw['dtype']} "
                f"(at most {DTYPE_CAPACITY[raw['dtype']]} ids)"
            )
        n_tokens = raw["n_tokens"]
        if not isinstance(n_tokens, dict) or not all(
            is_int(n_tokens.get(s)) and n_tokens[s] >= 0 for s in ("train", "val")
        ):
            raise ValueError(f"{hint}: n_tokens={n_tokens!r} must map 'train' and 'val' to token counts")
        checksum = raw["checksum"]
        if not isinstance(checksum, dict) or not all(isinstance(checksum.get(s), str) for s in ("train", "val")):
            raise ValueError(f"{hint}: checksum={checksum!r} must map 'train' and 'val' to sha256 hex digests")
        return cls(
            tokenizer=raw["tokenizer"],
            vocab_size=vocab,
            dtype=raw["dtype"],
            n_tokens={"train": n_tokens["train"], "val": n_tokens["val"]},
            checksum=dict(checksum),
            source=dict(raw.get("source") or {}),
            separator=raw.get("separator", SEPARATOR),
            format_version=version,
        )


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(BLOCK):
            h.update(chunk)
    return h.hexdigest()


def fix_hint(path: Path, source: dict[str, Any] | None = None) -> str:
    """How to rebuild the shards at `path`, phrased for the command that made them."""
    kind = (source or {}).get("kind")
    if kind == "stdlib":
        return f"delete {path} (it is rebuilt on next use) or run `python -m experiments.prepare_data stdlib --force`"
    if kind == "files":
        return f"re-run `python -m experiments.prepare_data files <paths...> --out {path}`"
    if kind == "hf":
        return f"re-run `python -m experiments.prepare_data hf {source.get('name', '<name>')} --out {path}`"
    return HINT_ANY


def import_tokenizers() -> Any:
    """The optional `tokenizers` package (tokenizer.json is its BPE model), or an ImportError saying how to get it."""
    try:
        import tokenizers  # lazy: optional extra
    except ImportError as e:
        raise ImportError(
            "tokenizer='bpe' needs the `tokenizers` package: pip install 'attnres[bpe]' (or pip install tokenizers); "
            "the default tokenizer='bytes' needs nothing extra"
        ) from e
    return tokenizers
