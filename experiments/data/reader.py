"""Reading a prepared dataset: :class:`TokenShards` opens a directory (format.py) as read-only numpy memmaps,
checks that its files are the ones its header describes and that it can feed a model, and decodes token ids.

Opening checks the header and the file sizes; :meth:`TokenShards.verify` re-hashes every file against the
header's sha256; :meth:`TokenShards.verify_cached` does so once per version of the files, remembered in a stamp
(size, mtime, ctime and inode of each file), so a large corpus is hashed once, not at every run.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from results.io import atomic_write_text

from .format import BLOCK, HINT_ANY, ShardHeader, fix_hint, import_tokenizers, sha256_file
from .options import is_int


class TokenShards:
    """A prepared dataset directory, opened read-only as numpy memmaps (nothing is loaded into RAM)."""

    header: ShardHeader
    train: np.memmap
    val: np.memmap

    def __init__(self, path: Path | str, verify: bool = False) -> None:
        self.path = Path(path).expanduser()
        if not self.path.is_dir():
            raise FileNotFoundError(f"no token shards at {self.path} (directory does not exist): {HINT_ANY}")
        header_path = self.path / "header.json"
        if not header_path.is_file():
            raise FileNotFoundError(f"{self.path} is not a token-shard directory (no header.json); {HINT_ANY}")
        try:
            raw = json.loads(header_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(
                f"{header_path} is not valid JSON ({e}); delete {self.path} and re-prepare it ({HINT_ANY})"
            ) from e
        self.header = ShardHeader.from_dict(raw, where=header_path)
        self.train = self._open("train")
        self.val = self._open("val")
        if self.header.tokenizer == "bpe" and not (self.path / "tokenizer.json").is_file():
            raise FileNotFoundError(
                f"{self.path} was prepared with tokenizer='bpe' but tokenizer.json is missing; "
                f"{fix_hint(self.path, self.header.source)}"
            )
        self._entropy: dict[str, float] = {}
        if verify:
            self.verify()

    def _open(self, split: str) -> np.memmap:
        file = self.path / f"{split}.bin"
        hint = fix_hint(self.path, self.header.source)
        if not file.is_file():
            raise FileNotFoundError(f"{file} is missing; {hint}")
        n = self.header.n_tokens[split]
        itemsize = np.dtype(self.header.dtype).itemsize
        size = file.stat().st_size
        if size != n * itemsize:
            raise ValueError(
                f"{file} holds {size} bytes but header.json says {n} tokens of {self.header.dtype} "
                f"({n * itemsize} bytes): the file is truncated, was written with another dtype, or belongs to "
                f"another preparation; {hint}"
            )
        if n == 0:  # np.memmap cannot map an empty file, and an empty split is useless anyway
            raise ValueError(f"{file} holds no tokens: the {split} split is empty; {hint}")
        return np.memmap(file, dtype=self.header.dtype, mode="r", shape=(n,))

    # Pickling (DataLoader workers under the spawn start method): reopen the memmaps instead of copying them.
    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]

    def __repr__(self) -> str:
        h = self.header
        return (
            f"TokenShards({str(self.path)!r}, tokenizer={h.tokenizer}, vocab={h.vocab_size}, dtype={h.dtype}, "
            f"train={h.n_tokens['train']:,}, val={h.n_tokens['val']:,})"
        )

    def split(self, name: str) -> np.memmap:
        if name not in ("train", "val"):
            raise ValueError(f"split={name!r}; allowed values: train, val")
        return self.train if name == "train" else self.val

    def verify(self) -> None:
        """Recompute the checksums (and the largest token id) and compare them with the header."""
        hint = fix_hint(self.path, self.header.source)
        for key, file in self._files().items():
            want = self.header.checksum.get(key)
            got = sha256_file(file)
            if want != got:
                raise ValueError(
                    f"checksum mismatch for {file}: header.json says sha256 {want}, the file has {got}; "
                    f"the file was modified or corrupted; {hint}"
                )
        for name in ("train", "val"):
            arr = self.split(name)
            top = max(int(arr[i : i + BLOCK].max()) for i in range(0, len(arr), BLOCK))
            if top >= self.header.vocab_size:
                raise ValueError(
                    f"{name}.bin contains token id {top} >= header vocab_size {self.header.vocab_size}; {hint}"
                )

    def _files(self) -> dict[str, Path]:
        files = {"train": self.path / "train.bin", "val": self.path / "val.bin"}
        if self.header.tokenizer == "bpe":
            files["tokenizer"] = self.path / "tokenizer.json"
        return files

    def verify_cached(self) -> str:
        """:meth:`verify`, unless an earlier verification of exactly these files still holds; returns "stamp" or
        "sha256" (what was done).

        After a full verification a stamp records each file's size, mtime, ctime and inode beside the header's
        checksums (``<dir>/.attnres-verified.json``, or under ``$ATTNRES_CACHE_DIR`` / ``~/.cache/attnres/verified``
        when the directory is read-only). Any write to a file changes its ctime (which no user can set back), so
        a stamp never vouches for modified data; a large corpus is hashed once, not at every run. What no stamp
        can see is decay below the file system (a bit flip with no write): ``prepare_data info --verify``
        re-hashes."""
        want = {"checksum": self.header.checksum, "files": {k: _stat_key(f) for k, f in self._files().items()}}
        for stamp in _stamp_paths(self.path):
            try:
                if json.loads(stamp.read_text(encoding="utf-8")) == want:
                    return "stamp"
            except (OSError, ValueError):
                continue
        self.verify()
        want["files"] = {k: _stat_key(f) for k, f in self._files().items()}
        for stamp in _stamp_paths(self.path):
            try:
                atomic_write_text(stamp, json.dumps(want, sort_keys=True))
                break
            except OSError:
                continue
        return "sha256"

    def check_compatible(self, vocab_size: int, seq_len: int, batch_size: int) -> None:
        """Fail before training when the data cannot feed a model/batch of this shape."""
        for name, value in (("vocab_size", vocab_size), ("seq_len", seq_len), ("batch_size", batch_size)):
            if not is_int(value) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        h = self.header
        if h.vocab_size > vocab_size:
            raise ValueError(
                f"dataset {self.path} uses {h.vocab_size} token ids (tokenizer={h.tokenizer}) but the model's "
                f"vocab_size is {vocab_size}: ids up to {h.vocab_size - 1} would index past the embedding; set the "
                f"model's vocab_size to at least {h.vocab_size} (e.g. model.vocab_size={h.vocab_size})"
            )
        need = batch_size * seq_len + 1
        if h.n_tokens["train"] < need:
            raise ValueError(
                f"dataset {self.path} has {h.n_tokens['train']:,} train tokens, fewer than one batch "
                f"(batch_size * seq_len + 1 = {batch_size} * {seq_len} + 1 = {need:,}); use a larger corpus "
                f"(e.g. without --max-bytes) or a smaller batch_size / seq_len"
            )
        if h.n_tokens["val"] < seq_len + 1:
            raise ValueError(
                f"dataset {self.path} has {h.n_tokens['val']:,} validation tokens, fewer than one window of "
                f"seq_len + 1 = {seq_len + 1}; re-prepare with a larger val_fraction or use a smaller seq_len"
            )

    def unigram_entropy(self, split: str = "train") -> float:
        """Entropy of the token frequency distribution in nats/token: the loss of the best context-free model."""
        if split not in self._entropy:
            arr = self.split(split)
            counts = np.zeros(self.header.vocab_size, dtype=np.int64)
            for i in range(0, len(arr), BLOCK):  # chunked: bincount upcasts to int64 (8x the memory)
                counts += np.bincount(arr[i : i + BLOCK], minlength=self.header.vocab_size)[: self.header.vocab_size]
            p = counts[counts > 0] / counts.sum()
            self._entropy[split] = float(-(p * np.log(p)).sum())
        return self._entropy[split]

    def decode(self, ids: Sequence[int] | np.ndarray | torch.Tensor) -> str:
        """Token ids back to text (separators appear as "\\x00")."""
        ids = np.asarray(ids.cpu() if isinstance(ids, torch.Tensor) else ids, dtype=np.int64).ravel()
        if self.header.tokenizer == "bytes":
            return bytes(ids.astype(np.uint8)).decode("utf-8", errors="replace")
        tok = import_tokenizers().Tokenizer.from_file(str(self.path / "tokenizer.json"))
        return tok.decode(ids.tolist(), skip_special_tokens=False)


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _stamp_paths(shard_dir: Path) -> list[Path]:
    """Where a verification stamp may live: in the shard directory, else in the user's cache."""
    cache = Path(os.environ.get("ATTNRES_CACHE_DIR") or Path.home() / ".cache" / "attnres").expanduser()
    key = hashlib.sha256(str(shard_dir.resolve()).encode("utf-8")).hexdigest()[:16]
    return [shard_dir / ".attnres-verified.json", cache / "verified" / f"{key}.json"]


def _held_out(source: dict[str, Any]) -> str:
    """What the validation split is made of, in words (whole documents, or the tail of each)."""
    if source.get("split") == "tail":
        n = source.get("n_docs_tail_split", source.get("n_docs", "?"))
        return f"the last ~{source.get('val_fraction', '?')} of each of {n} held out, split tail"
    return f"{source.get('n_docs_val', '?')} held out, split {source.get('split', '?')}"


def describe(shards: TokenShards) -> str:
    """Human-readable summary (used by the CLI)."""
    h, s = shards.header, shards.header.source
    lines = [
        f"shards:    {shards.path}",
        f"tokenizer: {h.tokenizer} (vocab {h.vocab_size}, dtype {h.dtype}, separator id {h.separator})",
        f"tokens:    train {h.n_tokens['train']:,}   val {h.n_tokens['val']:,}",
        (
            f"documents: {s.get('n_docs', '?')} ({_held_out(s)}), "
            f"{s.get('n_skipped', 0)} skipped (empty or not UTF-8), {s.get('n_bytes', 0):,} bytes of text"
        ),
        f"corpus:    sha256 {s.get('corpus_sha256', '?')}",
        f"unigram entropy (train): {shards.unigram_entropy('train'):.4f} nats/token",
    ]
    return "\n".join(lines)
