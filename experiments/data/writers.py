"""Writing a dataset: documents in, a complete shard directory (format.py) out, in a directory that publish.py
then renames into place.

Every source yields (key, bytes, split) documents, split being "train", "val" or "tail" (the last
~val_fraction of the document is held out, cut at a line break). The same rules hold for every source, so byte-
and BPE-level runs see the same text:

  * A document that is not valid UTF-8 is skipped, listed under "skipped" in the manifest and warned about
    (the stdlib has 4 such latin-1 test fixtures). Byte-level would not need decoding, but skipping keeps the
    byte corpus and the BPE corpus identical and makes every shard decodable as text. Empty documents are
    skipped too.
  * :func:`assign_splits` holds out ~val_fraction of the keys by a hash of the key (sha256, so it is
    deterministic, the same on every machine and independent of file order); at least one key lands on each
    side.

Documents are first streamed into train.raw / val.raw (bytes + separator: the byte-level shards as they are).
For tokenizer="bpe" a byte-level BPE (the `tokenizers` package) is then trained on train.raw only, so nothing
of the validation text leaks into the vocabulary, and both splits are encoded with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from tqdm import tqdm

from . import options
from .format import BLOCK, DTYPE_CAPACITY, SEPARATOR, ShardHeader, import_tokenizers, sha256_file

SPLIT_RULE = "val iff int.from_bytes(sha256(b'attnres-split\\0' + path.encode())[:8], 'big') / 2**64 < val_fraction"
_BPE_SEP_TOKEN = "\x00"  # never occurs inside a document: documents are split at NUL before encoding


def split_hash(key: str) -> float:
    """Uniform in [0, 1), a function of the document key alone (sha256, so stable across machines)."""
    digest = hashlib.sha256(b"attnres-split\0" + key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_splits(keys: Sequence[str], val_fraction: float) -> list[str]:
    """'val' for keys whose hash falls below val_fraction, else 'train'; at least one of each when >= 2 keys."""
    u = [split_hash(k) for k in keys]
    splits = ["val" if x < val_fraction else "train" for x in u]
    if len(keys) >= 2:
        if "val" not in splits:  # tiny corpora: hold out the file with the smallest hash
            splits[int(np.argmin(u))] = "val"
        if "train" not in splits:
            splits[int(np.argmax(u))] = "train"
    return splits


def _tail_cut(data: bytes, val_fraction: float) -> int:
    """Where the held-out tail of one document starts: ~val_fraction of its bytes, at a line break."""
    tail = max(1, round(len(data) * val_fraction))
    cut = len(data) - tail
    newline = data.rfind(b"\n", 0, cut)
    if newline >= 0 and len(data) - (newline + 1) <= 2 * tail:  # a nearby line break, not one far back
        return newline + 1
    while 0 < cut < len(data) and (data[cut] & 0xC0) == 0x80:  # do not split a UTF-8 character
        cut -= 1
    return max(cut, 1)


class _RawWriter:
    """Streams documents into train.raw / val.raw (bytes + separator); these are the byte-level shards."""

    def __init__(self, out: Path, val_fraction: float, record_files: bool) -> None:
        self.val_fraction = val_fraction
        self.paths = {s: out / f"{s}.raw" for s in ("train", "val")}
        self.files: dict[str, BinaryIO] = {s: open(p, "wb") for s, p in self.paths.items()}  # noqa: SIM115 - open across add() calls; close() (build_shards' finally) shuts them
        self.hash = {s: hashlib.sha256() for s in self.paths}
        self.n_tokens = dict.fromkeys(self.paths, 0)
        self.n_docs = {"train": 0, "val": 0, "tail": 0}
        self.corpus = hashlib.sha256()  # sha256 of the whole concatenation, documents in order
        self.n_bytes = 0
        self.record_files = record_files
        self.manifest: list[dict[str, Any]] = []
        self.skipped: list[dict[str, str]] = []

    def add(self, key: str, data: bytes, split: str) -> None:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            self.skipped.append({"path": key, "reason": f"not valid UTF-8 ({e.reason} at byte {e.start})"})
            return
        if not data:  # e.g. empty __init__.py: it would only add a separator
            self.skipped.append({"path": key, "reason": "empty"})
            return
        self.corpus.update(data + bytes([SEPARATOR]))
        self.n_bytes += len(data)
        self.n_docs[split] += 1
        if split == "tail":
            cut = _tail_cut(data, self.val_fraction)
            for part_split, part in (("train", data[:cut]), ("val", data[cut:])):
                if part:
                    self._write(part_split, part)
        else:
            self._write(split, data)
        if self.record_files:
            self.manifest.append(
                {"path": key, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "split": split}
            )

    def _write(self, split: str, data: bytes) -> None:
        chunk = data + bytes([SEPARATOR])
        self.files[split].write(chunk)
        self.hash[split].update(chunk)
        self.n_tokens[split] += len(chunk)

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def _iter_raw_docs(path: Path) -> Iterator[bytes]:
    """Documents of a .raw stream (split at the separator), read in blocks."""
    rest = b""
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            parts = (rest + block).split(bytes([SEPARATOR]))
            rest = parts.pop()
            yield from (p for p in parts if p)
    if rest:
        yield rest


def require_tokenizer(tokenizer: str, bpe_vocab_size: int) -> None:
    """Valid tokenizer options and, for "bpe", the `tokenizers` package importable: checked before any data is
    read."""
    options.check_tokenizer(tokenizer, bpe_vocab_size)
    if tokenizer == "bpe":
        import_tokenizers()


def _bpe_encode_split(tok: Any, raw: Path, dest: Path, dtype: str, desc: str, progress: bool) -> tuple[int, str]:
    """Encode the documents of one .raw stream with `tok` into `dest`: (tokens written, sha256 of its bytes)."""
    h, n = hashlib.sha256(), 0
    with (
        open(dest, "wb") as out,
        tqdm(total=raw.stat().st_size, unit="B", unit_scale=True, desc=desc, disable=not progress) as bar,
    ):
        batch: list[str] = []
        size = 0

        def flush() -> None:
            nonlocal n, size
            for enc in tok.encode_batch(batch):  # batched: parallel in Rust, far faster than one string
                ids = np.asarray([*enc.ids, SEPARATOR], dtype=dtype)
                out.write(ids.tobytes())
                h.update(ids.tobytes())
                n += len(ids)
            bar.update(size)
            batch.clear()
            size = 0

        for doc in _iter_raw_docs(raw):
            batch.append(doc.decode("utf-8"))
            size += len(doc) + 1
            if size >= 1 << 22:
                flush()
        if batch:
            flush()
    return n, h.hexdigest()


def _train_and_encode_bpe(
    tmp: Path, bpe_vocab_size: int, progress: bool
) -> tuple[int, dict[str, int], dict[str, str], str]:
    """Train a byte-level BPE on train.raw only (no val leakage), then encode both splits into .bin files."""
    tk = import_tokenizers()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=bpe_vocab_size,
        special_tokens=[_BPE_SEP_TOKEN],  # first special token -> id 0 == SEPARATOR
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no unknown tokens
        show_progress=False,
    )
    tok.train_from_iterator((d.decode("utf-8") for d in _iter_raw_docs(tmp / "train.raw")), trainer=trainer)
    if tok.token_to_id(_BPE_SEP_TOKEN) != SEPARATOR:
        raise RuntimeError("BPE training did not put the separator at id 0")  # invariant of tokenizers' trainer
    vocab = tok.get_vocab_size()
    dtype = "uint16" if vocab <= DTYPE_CAPACITY["uint16"] else "uint32"
    n_tokens, checksum = {}, {}
    for split in ("train", "val"):
        raw = tmp / f"{split}.raw"
        n, digest = _bpe_encode_split(tok, raw, tmp / f"{split}.bin", dtype, f"bpe encode {split}", progress)
        raw.unlink()
        n_tokens[split], checksum[split] = n, digest
    tok.save(str(tmp / "tokenizer.json"))
    checksum["tokenizer"] = sha256_file(tmp / "tokenizer.json")
    return vocab, n_tokens, checksum, dtype


def build_shards(
    tmp: Path,
    docs: Iterable[tuple[str, bytes, str]],
    *,
    tokenizer: str,
    bpe_vocab_size: int,
    val_fraction: float,
    source: dict[str, Any],
    record_files: bool,
    manifest_extra: dict[str, Any] | None = None,
    progress: bool = True,
) -> ShardHeader:
    """Write a complete shard directory into `tmp` from (key, bytes, split) documents; split in train|val|tail."""
    writer = _RawWriter(tmp, val_fraction, record_files)
    try:
        for key, data, split in docs:
            writer.add(key, data, split)
    finally:
        writer.close()
    hint = "check the inputs" if source.get("kind") != "hf" else "check --text-field / --max-docs"
    not_utf8 = [s["path"] for s in writer.skipped if s["reason"] != "empty"]
    if not_utf8:
        shown = ", ".join(not_utf8[:5]) + (" ..." if len(not_utf8) > 5 else "")
        warnings.warn(f"skipped {len(not_utf8)} non-UTF-8 file(s) (listed in manifest.json): {shown}", stacklevel=3)
    usable = sum(writer.n_docs.values())
    if usable == 0:
        empty = [s["path"] for s in writer.skipped if s["reason"] == "empty"]
        shown = ", ".join((empty or not_utf8)[:5]) + (" ..." if len(empty or not_utf8) > 5 else "")
        what = (
            (f"{len(empty)} empty" if empty else "")
            + (" and " if empty and not_utf8 else "")
            + (f"{len(not_utf8)} not UTF-8" if not_utf8 else "")
        )
        raise ValueError(
            f"the input is empty: no document with text to prepare ({what or 'no'} input(s): {shown}); {hint}"
        )
    for split in ("train", "val"):
        if writer.n_tokens[split] == 0:
            advice = f"raise val_fraction (now {val_fraction})" if split == "val" else "lower val_fraction"
            raise ValueError(
                f"the {split} split came out empty ({usable} usable documents, {len(writer.skipped)} skipped); "
                f"{hint}, or {advice}"
            )
    summary = dict(source)
    summary.update(
        n_docs=sum(writer.n_docs.values()),
        n_docs_train=writer.n_docs["train"],
        n_docs_val=writer.n_docs["val"],
        n_docs_tail_split=writer.n_docs["tail"],
        n_skipped=len(writer.skipped),
        n_bytes=writer.n_bytes,
        corpus_sha256=writer.corpus.hexdigest(),
        val_fraction=val_fraction,
    )
    if record_files:
        manifest = dict(manifest_extra or {})
        manifest.update(corpus_sha256=summary["corpus_sha256"], files=writer.manifest, skipped=writer.skipped)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        summary["manifest_sha256"] = sha256_file(tmp / "manifest.json")
    if tokenizer == "bytes":
        for split in ("train", "val"):
            os.replace(tmp / f"{split}.raw", tmp / f"{split}.bin")
        vocab, dtype = 256, "uint8"
        n_tokens = dict(writer.n_tokens)
        checksum = {s: writer.hash[s].hexdigest() for s in ("train", "val")}
    else:
        summary["bpe_vocab_size_requested"] = bpe_vocab_size
        vocab, n_tokens, checksum, dtype = _train_and_encode_bpe(tmp, bpe_vocab_size, progress)
    header = ShardHeader(
        tokenizer=tokenizer,
        vocab_size=vocab,
        dtype=dtype,
        n_tokens=n_tokens,
        checksum={"algorithm": "sha256", **checksum},
        source=summary,
    )
    # header.json last: a directory with a header is complete (the atomic rename is the real guarantee).
    (tmp / "header.json").write_text(header.to_json(), encoding="utf-8")
    return header
