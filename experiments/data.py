"""Token shards: the data layer of the training harness (pure numpy + torch, no Lightning).

On-disk format (one directory per prepared dataset)::

    <dir>/header.json     ShardHeader: tokenizer, vocab_size, dtype, n_tokens, checksums, source summary
    <dir>/train.bin       flat token ids, numpy memmap of `dtype` (no header bytes)
    <dir>/val.bin         same, held-out documents only
    <dir>/manifest.json   per-file path + sha256 + split (stdlib and text files; not for HF datasets)
    <dir>/tokenizer.json  the `tokenizers` BPE model, only when tokenizer == "bpe"

dtype is uint8 for the byte-level tokenizer (vocab 256), uint16 for BPE vocabularies up to 65,536 and
uint32 above. Documents are concatenated with the separator token 0 after each one: for bytes that is the
NUL byte (which no stdlib source contains); for BPE it is the special token "\\x00", id 0. A NUL byte inside
a document therefore reads as a document boundary in both encodings.

Corpus rules (the same for every source, so byte- and BPE-level runs see the same text):
  * Files that are not valid UTF-8 are skipped, listed under "skipped" in the manifest and warned about.
    (The stdlib has 4 such latin-1 test fixtures.) Byte-level would not need decoding, but skipping keeps
    the byte corpus and the BPE corpus identical and makes every shard decodable as text.
  * Train/val is split by a hash of the file's path (sha256, ~`val_fraction` of files held out), so it is
    deterministic and independent of file order; at least one file lands on each side. A single input file
    (or too few files for `val_fraction`) is split at its tail instead: the last ~`val_fraction` of its
    bytes, cut at a line break.

The default corpus is the running interpreter's standard library (`prepare_stdlib`): nothing is downloaded,
it is prepared once into `default_cache_dir()` and reused. Batches are a pure function of (seed, step), so
a resumed run sees exactly the data of an uninterrupted one, and the global batch does not depend on the
number of DDP ranks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import sysconfig
import tempfile
import uuid
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info
from tqdm import tqdm

FORMAT_VERSION = 1
SEPARATOR = 0  # token id written after every document
DTYPE_CAPACITY = {"uint8": 2**8, "uint16": 2**16, "uint32": 2**32}  # largest vocab each dtype can hold
TOKENIZERS = ("bytes", "bpe")
STDLIB_VAL_FRACTION = 0.01
_STDLIB_EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}
_BPE_SEP_TOKEN = "\x00"  # never occurs inside a document: documents are split at NUL before encoding
_BLOCK = 1 << 24  # bytes per read when hashing / scanning files

HINT_STDLIB = "run `python -m experiments.prepare_data stdlib`"
HINT_ANY = (
    "prepare shards with `python -m experiments.prepare_data stdlib` (the built-in default corpus), "
    "`python -m experiments.prepare_data files <paths...> --out DIR` or `... hf <name> --out DIR`"
)


# ----------------------------------------------------------------------------------------------------------
# Header


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
        if not _is_int(vocab) or not 2 <= vocab <= DTYPE_CAPACITY[raw["dtype"]]:
            raise ValueError(
                f"{hint}: vocab_size={vocab!r} does not fit dtype {raw['dtype']} "
                f"(at most {DTYPE_CAPACITY[raw['dtype']]} ids)"
            )
        n_tokens = raw["n_tokens"]
        if not isinstance(n_tokens, dict) or not all(_is_int(n_tokens.get(s)) and n_tokens[s] >= 0 for s in ("train", "val")):
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


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _fix_hint(path: Path, source: dict[str, Any] | None = None) -> str:
    """How to rebuild the shards at `path`, phrased for the command that made them."""
    kind = (source or {}).get("kind")
    if kind == "stdlib":
        return f"delete {path} (it is rebuilt on next use) or {HINT_STDLIB} --force"
    if kind == "files":
        return f"re-run `python -m experiments.prepare_data files <paths...> --out {path}`"
    if kind == "hf":
        return f"re-run `python -m experiments.prepare_data hf {source.get('name', '<name>')} --out {path}`"
    return HINT_ANY


# ----------------------------------------------------------------------------------------------------------
# Reading


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
            raise FileNotFoundError(
                f"{self.path} is not a token-shard directory (no header.json); {HINT_ANY}"
            )
        try:
            raw = json.loads(header_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{header_path} is not valid JSON ({e}); delete {self.path} and re-prepare it ({HINT_ANY})") from e
        self.header = ShardHeader.from_dict(raw, where=header_path)
        self.train = self._open("train")
        self.val = self._open("val")
        if self.header.tokenizer == "bpe" and not (self.path / "tokenizer.json").is_file():
            raise FileNotFoundError(
                f"{self.path} was prepared with tokenizer='bpe' but tokenizer.json is missing; "
                f"{_fix_hint(self.path, self.header.source)}"
            )
        self._entropy: dict[str, float] = {}
        if verify:
            self.verify()

    def _open(self, split: str) -> np.memmap:
        file = self.path / f"{split}.bin"
        hint = _fix_hint(self.path, self.header.source)
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
        hint = _fix_hint(self.path, self.header.source)
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
            top = max(int(arr[i : i + _BLOCK].max()) for i in range(0, len(arr), _BLOCK))
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
        want = {"checksum": self.header.checksum,
                "files": {k: _stat_key(f) for k, f in self._files().items()}}
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
                stamp.parent.mkdir(parents=True, exist_ok=True)
                tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}")
                tmp.write_text(json.dumps(want, sort_keys=True), encoding="utf-8")
                os.replace(tmp, stamp)
                break
            except OSError:
                continue
        return "sha256"

    def check_compatible(self, vocab_size: int, seq_len: int, batch_size: int) -> None:
        """Fail before training when the data cannot feed a model/batch of this shape."""
        for name, value in (("vocab_size", vocab_size), ("seq_len", seq_len), ("batch_size", batch_size)):
            if not _is_int(value) or value <= 0:
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
            for i in range(0, len(arr), _BLOCK):  # chunked: bincount upcasts to int64 (8x the memory)
                counts += np.bincount(arr[i : i + _BLOCK], minlength=self.header.vocab_size)[: self.header.vocab_size]
            p = counts[counts > 0] / counts.sum()
            self._entropy[split] = float(-(p * np.log(p)).sum())
        return self._entropy[split]

    def decode(self, ids: Sequence[int] | np.ndarray | torch.Tensor) -> str:
        """Token ids back to text (separators appear as "\\x00")."""
        ids = np.asarray(ids.cpu() if isinstance(ids, torch.Tensor) else ids, dtype=np.int64).ravel()
        if self.header.tokenizer == "bytes":
            return bytes(ids.astype(np.uint8)).decode("utf-8", errors="replace")
        tok = _import_tokenizers().Tokenizer.from_file(str(self.path / "tokenizer.json"))
        return tok.decode(ids.tolist(), skip_special_tokens=False)


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _stamp_paths(shard_dir: Path) -> list[Path]:
    """Where a verification stamp may live: in the shard directory, else in the user's cache."""
    cache = Path(os.environ.get("ATTNRES_CACHE_DIR") or Path.home() / ".cache" / "attnres").expanduser()
    key = hashlib.sha256(str(shard_dir.resolve()).encode("utf-8")).hexdigest()[:16]
    return [shard_dir / ".attnres-verified.json", cache / "verified" / f"{key}.json"]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_BLOCK):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------------------
# Validation windows and training batches


def val_windows(shards: TokenShards, seq_len: int, n_sequences: int | None) -> torch.Tensor:
    """The fixed validation set: `n_sequences` windows of seq_len+1 tokens at evenly spaced offsets of val.bin.

    Returns int64 [n_sequences, seq_len + 1] (inputs = [:, :-1], targets = [:, 1:]). No RNG is involved, so
    every run with the same (dataset, seq_len, n_sequences) is scored on exactly the same tokens. The first
    window starts at 0 and the last ends at the last val token; windows overlap when n_sequences exceeds
    len(val) // (seq_len + 1). n_sequences=None takes all non-overlapping windows.
    """
    if not _is_int(seq_len) or seq_len <= 0:
        raise ValueError(f"seq_len={seq_len!r} must be a positive integer")
    length = seq_len + 1
    n_val = len(shards.val)
    if n_val < length:
        raise ValueError(
            f"dataset {shards.path} has {n_val:,} validation tokens, fewer than one window of seq_len + 1 = "
            f"{length}; use a smaller seq_len or re-prepare with a larger val_fraction"
        )
    if n_sequences is None:
        offsets = np.arange(n_val // length, dtype=np.int64) * length
    else:
        if not _is_int(n_sequences) or n_sequences <= 0:
            raise ValueError(f"n_sequences={n_sequences!r} must be a positive integer (or None for all windows)")
        span = n_val - length  # last valid start
        offsets = (np.arange(n_sequences, dtype=np.int64) * span) // max(n_sequences - 1, 1)
    windows = np.asarray(shards.val[offsets[:, None] + np.arange(length)])
    return torch.from_numpy(windows.astype(np.int64))


class TrainBatches(IterableDataset):
    """Endless training batches, a pure function of (seed, step).

    Step s draws the global batch's window offsets from `numpy.random.default_rng([seed, s])` (uniform over
    all start positions of train.bin, with replacement). Rank r of `world_size` takes the contiguous slice
    [r*b, (r+1)*b) of those batch_size windows (b = batch_size // world_size), so the global batch is the
    same for any world size. Iteration starts at `start_step` (set it to the number of batches already
    consumed when resuming; with gradient accumulation that is optimizer steps * accumulation) and yields
    (x, y), int64 [b, seq_len] each, y = x shifted by one token.

    Use with `DataLoader(ds, batch_size=None, num_workers=k)`: worker w yields steps start_step + w,
    + w + k, ..., and the DataLoader's round-robin over workers restores the step order.
    Bit-exact reproducibility holds for a given numpy version (numpy does not promise identical streams
    across major versions).
    """

    def __init__(
        self,
        shards: TokenShards,
        seq_len: int,
        batch_size: int,
        seed: int,
        start_step: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        super().__init__()
        for name, value, low in (("seq_len", seq_len, 1), ("batch_size", batch_size, 1), ("seed", seed, 0),
                                 ("start_step", start_step, 0), ("world_size", world_size, 1), ("rank", rank, 0)):
            if not _is_int(value) or value < low:
                raise ValueError(f"TrainBatches: {name}={value!r} must be an integer >= {low}")
        if rank >= world_size:
            raise ValueError(f"TrainBatches: rank={rank} must be < world_size={world_size}")
        if batch_size % world_size:
            raise ValueError(
                f"TrainBatches: the global batch_size={batch_size} is not divisible by world_size={world_size}; "
                f"choose a batch_size that is a multiple of the number of devices"
            )
        n_train = len(shards.train)
        if n_train < batch_size * seq_len + 1:
            raise ValueError(
                f"dataset {shards.path} has {n_train:,} train tokens, fewer than one batch "
                f"(batch_size * seq_len + 1 = {batch_size * seq_len + 1:,}); use a larger corpus or smaller batch"
            )
        self.shards = shards
        self.seq_len = seq_len
        self.batch_size = batch_size  # global, across ranks
        self.local_batch_size = batch_size // world_size
        self.seed = seed
        self.start_step = start_step  # read when iteration starts, so a trainer may set it after construction
        self.rank = rank
        self.world_size = world_size

    def global_offsets(self, step: int) -> np.ndarray:
        """Start positions of the batch_size windows of `step` (all ranks), int64 [batch_size]."""
        n_starts = len(self.shards.train) - self.seq_len  # starts 0 .. n - (seq_len + 1)
        rng = np.random.default_rng([self.seed, step])
        return rng.integers(0, n_starts, size=self.batch_size, dtype=np.int64)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (x, y) for `step`; random access, no state."""
        b = self.local_batch_size
        offsets = self.global_offsets(step)[self.rank * b : (self.rank + 1) * b]
        windows = np.asarray(self.shards.train[offsets[:, None] + np.arange(self.seq_len + 1)])
        tokens = torch.from_numpy(windows.astype(np.int64))  # [b, seq_len + 1]
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker, n_workers = (0, 1) if info is None else (info.id, info.num_workers)
        step = self.start_step + worker
        while True:
            yield self.batch(step)
            step += n_workers


# ----------------------------------------------------------------------------------------------------------
# Writing: documents -> raw byte streams -> (bytes | BPE) token shards


def _split_hash(key: str) -> float:
    """Uniform in [0, 1), a function of the document key alone (sha256, so stable across machines)."""
    digest = hashlib.sha256(b"attnres-split\0" + key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_splits(keys: Sequence[str], val_fraction: float) -> list[str]:
    """'val' for keys whose hash falls below val_fraction, else 'train'; at least one of each when >= 2 keys."""
    u = [_split_hash(k) for k in keys]
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
        self.files: dict[str, BinaryIO] = {s: open(p, "wb") for s, p in self.paths.items()}
        self.hash = {s: hashlib.sha256() for s in self.paths}
        self.n_tokens = {s: 0 for s in self.paths}
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
        while block := f.read(_BLOCK):
            parts = (rest + block).split(bytes([SEPARATOR]))
            rest = parts.pop()
            yield from (p for p in parts if p)
    if rest:
        yield rest


def _import_tokenizers() -> Any:
    try:
        import tokenizers  # lazy: optional extra
    except ImportError as e:
        raise ImportError(
            "tokenizer='bpe' needs the `tokenizers` package: pip install 'attnres[bpe]' (or pip install tokenizers); "
            "the default tokenizer='bytes' needs nothing extra"
        ) from e
    return tokenizers


def _check_tokenizer(tokenizer: str, bpe_vocab_size: int) -> None:
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer={tokenizer!r} is unknown; allowed values: {', '.join(TOKENIZERS)}")
    if tokenizer == "bpe":
        if not _is_int(bpe_vocab_size) or not 257 <= bpe_vocab_size <= DTYPE_CAPACITY["uint32"]:
            raise ValueError(f"bpe_vocab_size={bpe_vocab_size!r} must be an integer >= 257 (256 bytes + separator)")
        _import_tokenizers()  # fail before reading any data


def _train_and_encode_bpe(
    tmp: Path, bpe_vocab_size: int, progress: bool
) -> tuple[int, dict[str, int], dict[str, str], str]:
    """Train a byte-level BPE on train.raw only (no val leakage), then encode both splits into .bin files."""
    tk = _import_tokenizers()
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
        h, n = hashlib.sha256(), 0
        with open(tmp / f"{split}.bin", "wb") as out, tqdm(
            total=raw.stat().st_size, unit="B", unit_scale=True, desc=f"bpe encode {split}", disable=not progress
        ) as bar:
            batch: list[str] = []
            size = 0

            def flush() -> None:
                nonlocal n, size
                for enc in tok.encode_batch(batch):  # batched: parallel in Rust, far faster than one string
                    ids = np.asarray(enc.ids + [SEPARATOR], dtype=dtype)
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
        raw.unlink()
        n_tokens[split], checksum[split] = n, h.hexdigest()
    tok.save(str(tmp / "tokenizer.json"))
    checksum["tokenizer"] = sha256_file(tmp / "tokenizer.json")
    return vocab, n_tokens, checksum, dtype


def _build_shards(
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
        what = (f"{len(empty)} empty" if empty else "") + (" and " if empty and not_utf8 else "") + (
            f"{len(not_utf8)} not UTF-8" if not_utf8 else "")
        raise ValueError(f"the input is empty: no document with text to prepare ({what or 'no'} input(s): {shown}); "
                         f"{hint}")
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


def _make_tmp(final: Path) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-{os.getpid()}-", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp makes it 0700; the published dataset should be readable like any other dir
    return tmp


def _build_and_publish(final: Path, docs: Iterable[tuple[str, bytes, str]], replace_existing: Callable[[], bool],
                       **build: Any) -> None:
    """_build_shards into a fresh tmp dir beside `final`, then _publish it; the tmp dir never outlives the call.
    `replace_existing` is asked only once the build is done (another process may have published meanwhile)."""
    tmp = _make_tmp(final)
    try:
        _build_shards(tmp, docs, **build)
        _publish(tmp, final, replace_existing=replace_existing())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # no-op after a successful rename


def _publish(tmp: Path, final: Path, replace_existing: bool) -> None:
    """Move a finished tmp dir to `final` atomically; readers never see a half-written dataset."""
    try:
        os.rename(tmp, final)  # atomic; fails if `final` exists and is not empty
        return
    except OSError:
        if not final.exists():
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    if not replace_existing:  # a concurrent process published the same dataset first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
        return
    trash = final.parent / f".trash-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.rename(final, trash)
    os.rename(tmp, final)
    shutil.rmtree(trash, ignore_errors=True)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[bool]:
    """Exclusive advisory lock so that racing processes prepare a dataset once (the others wait and reuse).

    Yields whether the lock is really held. Without one (no fcntl: Windows) the tmp-dir + atomic rename
    still keeps the result consistent; racing processes merely duplicate the work.
    """
    try:
        import fcntl
    except ImportError:
        yield False
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------------------------------------
# Sources


def default_cache_dir() -> Path:
    """$ATTNRES_DATA_DIR, else data/cache/ in the repository (git-ignored), else ~/.cache/attnres/data."""
    env = os.environ.get("ATTNRES_DATA_DIR")
    if env:
        return Path(env).expanduser()
    repo = Path(__file__).resolve().parents[1]
    if (repo / "pyproject.toml").is_file():  # running from a checkout (editable install included)
        return repo / "data" / "cache"
    return Path.home() / ".cache" / "attnres" / "data"  # installed into site-packages: keep data out of it


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[tuple[str, Path]]:
    """(path relative to the stdlib as POSIX, absolute path) of every .py file, sorted; no site-/dist-packages."""
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise FileNotFoundError(f"the standard library directory {root} (sysconfig 'stdlib') does not exist")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _STDLIB_EXCLUDED_DIRS]
        for name in filenames:
            if name.endswith(".py"):
                path = Path(dirpath, name)
                found.append((path.relative_to(root).as_posix(), path))
    found.sort(key=lambda rp: rp[0])  # code-point order of relative paths: identical on every machine
    return found


def stdlib_dataset_name(tokenizer: str = "bytes", bpe_vocab_size: int = 8192, max_bytes: int | None = None) -> str:
    tok = "bytes" if tokenizer == "bytes" else f"bpe{bpe_vocab_size}"
    return f"stdlib-py{platform.python_version()}-{tok}" + (f"-max{max_bytes}" if max_bytes else "")


def _listing_sha256(files: list[tuple[str, Path]]) -> str:
    """Cheap fingerprint (paths and sizes, no reads) used to notice that a cached stdlib corpus is stale."""
    h = hashlib.sha256()
    for rel, path in files:
        h.update(f"{rel}\0{path.stat().st_size}\n".encode("utf-8"))
    return h.hexdigest()


def _cached(path: Path, tokenizer: str, want_source: dict[str, Any]) -> bool:
    try:
        shards = TokenShards(path)
    except (OSError, ValueError):
        return False
    source = shards.header.source
    return shards.header.tokenizer == tokenizer and all(source.get(k) == v for k, v in want_source.items())


def prepare_stdlib(
    cache_dir: Path | None = None,
    tokenizer: str = "bytes",
    bpe_vocab_size: int = 8192,
    max_bytes: int | None = None,
    *,
    force: bool = False,
    progress: bool = True,
) -> Path:
    """The embedded default corpus: this interpreter's standard-library .py files, prepared once and cached.

    Returns <cache_dir>/stdlib-py<version>-<bytes|bpeN>[-max<N>]. A cached directory is reused when its
    header matches (tokenizer, Python version, BPE size, max_bytes and a size listing of the stdlib files);
    otherwise it is rebuilt. max_bytes keeps only the first files in sorted order whose sizes sum to at most
    max_bytes (small test slices). 1% of files are held out for validation by a hash of their path.
    force=True rebuilds even a matching cache (e.g. after `TokenShards(..., verify=True)` found corruption).
    """
    _check_tokenizer(tokenizer, bpe_vocab_size)
    if max_bytes is not None and (not _is_int(max_bytes) or max_bytes <= 0):
        raise ValueError(f"max_bytes={max_bytes!r} must be a positive integer or None")
    cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    final = cache_dir / stdlib_dataset_name(tokenizer, bpe_vocab_size, max_bytes)
    files = stdlib_files()
    want = {
        "kind": "stdlib",
        "python_version": platform.python_version(),
        "listing_sha256": _listing_sha256(files),
        "max_bytes": max_bytes,
    }
    if tokenizer == "bpe":
        want["bpe_vocab_size_requested"] = bpe_vocab_size
    if not force and _cached(final, tokenizer, want):  # fast path, no lock
        return final
    with _file_lock(cache_dir / f".{final.name}.lock") as locked:
        if not force and _cached(final, tokenizer, want):  # another process finished it while we waited
            return final
        if locked:  # any tmp dir of this dataset is then a leftover of a killed run, not a live writer's
            for stale in cache_dir.glob(f".tmp-{final.name}-*"):
                shutil.rmtree(stale, ignore_errors=True)
        if max_bytes is not None:
            selected, total = [], 0
            for rel, path in files:
                size = path.stat().st_size
                if total + size > max_bytes:
                    break
                selected.append((rel, path))
                total += size
            if len(selected) < 2:
                raise ValueError(f"max_bytes={max_bytes} keeps {len(selected)} stdlib file(s); need >= 2 (try 100000)")
        else:
            selected = files
        splits = assign_splits([rel for rel, _ in selected], STDLIB_VAL_FRACTION)

        def docs() -> Iterator[tuple[str, bytes, str]]:
            for (rel, path), split in zip(tqdm(selected, unit="file", desc="stdlib", disable=not progress), splits):
                yield rel, path.read_bytes(), split

        # Without flock (Windows) a racing process may have published meanwhile: keep a valid copy.
        _build_and_publish(
            final, docs(), lambda: force or not _cached(final, tokenizer, want),
            tokenizer=tokenizer,
            bpe_vocab_size=bpe_vocab_size,
            val_fraction=STDLIB_VAL_FRACTION,
            source={**want, "python": f"{platform.python_implementation()} {platform.python_version()}",
                    "split": "file-hash", "n_files_listed": len(files)},
            record_files=True,
            manifest_extra={"kind": "stdlib", "python": f"{platform.python_implementation()} "
                            f"{platform.python_version()}", "split_rule": _SPLIT_RULE},
            progress=progress,
        )
    return final


_SPLIT_RULE = "val iff int.from_bytes(sha256(b'attnres-split\\0' + path.encode())[:8], 'big') / 2**64 < val_fraction"


def _expand_paths(paths: Sequence[Path | str], pattern: str) -> list[tuple[str, Path]]:
    """Files as (key, path); key = file name, or <dir name>/<relative path> for files found in a directory,
    so that the hash split does not depend on where the corpus sits on disk."""
    out: list[tuple[str, Path]] = []
    for p in map(Path, paths):
        p = p.expanduser()
        if p.is_dir():
            found = sorted(x for x in p.rglob(pattern) if x.is_file())
            out.extend(((Path(p.resolve().name) / x.relative_to(p)).as_posix(), x) for x in found)
        elif p.is_file():
            out.append((p.name, p))
        else:
            raise FileNotFoundError(f"input path {p} does not exist (pass text files or directories of them)")
    if not out:
        raise ValueError(f"no files matched {pattern!r} under {', '.join(map(str, paths))}")
    return out


def _check_out_dir(out_dir: Path) -> None:
    # Refuse to clobber anything that is not ours (replacing an older shard dir is fine).
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} exists and is not a directory; choose another")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "header.json").is_file():
        raise ValueError(f"--out {out_dir} exists, is not empty and is not a token-shard directory; choose another")


def _check_fraction(val_fraction: float) -> None:
    if not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 0.5:
        raise ValueError(f"val_fraction={val_fraction!r} must be in (0, 0.5)")


def prepare_text_files(
    paths: Sequence[Path | str],
    out_dir: Path | str,
    tokenizer: str = "bytes",
    bpe_vocab_size: int = 8192,
    val_fraction: float = 0.01,
    *,
    split: str = "auto",
    pattern: str = "*",
    progress: bool = True,
) -> Path:
    """Text files (or directories, recursively, files matching `pattern`) -> token shards in out_dir.

    split: "file" (hash of each file's key), "tail" (last val_fraction of every file) or "auto" = "file"
    when at least one file is expected in val (n_files * val_fraction >= 1), else "tail".
    """
    _check_tokenizer(tokenizer, bpe_vocab_size)
    _check_fraction(val_fraction)
    if split not in ("auto", "file", "tail"):
        raise ValueError(f"split={split!r}; allowed values: auto, file, tail")
    files = _expand_paths(paths, pattern)
    if split == "auto":
        split = "file" if len(files) * val_fraction >= 1 else "tail"
    if split == "file" and len(files) < 2:
        split = "tail"  # one file cannot be split by file
    out_dir = Path(out_dir).expanduser()
    _check_out_dir(out_dir)
    splits = assign_splits([k for k, _ in files], val_fraction) if split == "file" else ["tail"] * len(files)

    def docs() -> Iterator[tuple[str, bytes, str]]:
        for (key, path), s in zip(tqdm(files, unit="file", desc="files", disable=not progress), splits):
            yield key, path.read_bytes(), s

    _build_and_publish(
        out_dir, docs(), lambda: True,
        tokenizer=tokenizer,
        bpe_vocab_size=bpe_vocab_size,
        val_fraction=val_fraction,
        source={"kind": "files", "split": "file-hash" if split == "file" else "tail"},
        record_files=True,
        manifest_extra={"kind": "files", "split_rule": _SPLIT_RULE if split == "file" else "tail of each file"},
        progress=progress,
    )
    return out_dir


def prepare_hf_dataset(
    name: str,
    out_dir: Path | str,
    split: str = "train",
    text_field: str = "text",
    tokenizer: str = "bytes",
    bpe_vocab_size: int = 8192,
    val_fraction: float = 0.01,
    *,
    config: str | None = None,
    max_docs: int | None = None,
    streaming: bool = True,
    progress: bool = True,
) -> Path:
    """A Hugging Face dataset (needs `datasets` and, unless cached locally, the network) -> token shards.

    Documents are held out by a hash of their index in the split, so the split is deterministic for a given
    dataset revision. streaming=True reads records as they arrive (no full download when max_docs is set).
    """
    _check_tokenizer(tokenizer, bpe_vocab_size)
    _check_fraction(val_fraction)
    if max_docs is not None and (not _is_int(max_docs) or max_docs <= 0):
        raise ValueError(f"max_docs={max_docs!r} must be a positive integer or None")
    try:
        import datasets  # lazy: optional extra, heavy import
    except ImportError as e:
        raise ImportError(
            "preparing a Hugging Face dataset needs the `datasets` package: pip install 'attnres[hf]' "
            "(or pip install datasets), plus network access to the Hub; offline, use "
            "`python -m experiments.prepare_data stdlib` or `... files <paths...> --out DIR`"
        ) from e
    out_dir = Path(out_dir).expanduser()
    _check_out_dir(out_dir)
    try:
        ds = datasets.load_dataset(name, config, split=split, streaming=streaming)
    except Exception as e:  # network, auth, unknown name: all surface here
        raise RuntimeError(
            f"could not load Hugging Face dataset {name!r} (config={config!r}, split={split!r}): {e}. It needs "
            "network access to the Hub unless it is in the local HF cache; offline, use "
            "`python -m experiments.prepare_data stdlib` or `... files <paths...> --out DIR`"
        ) from e

    def docs() -> Iterator[tuple[str, bytes, str]]:
        for i, record in enumerate(tqdm(ds, unit="doc", desc=name, total=max_docs, disable=not progress)):
            if max_docs is not None and i >= max_docs:
                break
            if text_field not in record:
                raise ValueError(
                    f"text_field={text_field!r} is not a column of {name!r}; columns: {', '.join(record)}"
                )
            key = f"{split}/{i}"
            yield key, str(record[text_field]).encode("utf-8"), "val" if _split_hash(key) < val_fraction else "train"

    _build_and_publish(
        out_dir, docs(), lambda: True,
        tokenizer=tokenizer,
        bpe_vocab_size=bpe_vocab_size,
        val_fraction=val_fraction,
        source={"kind": "hf", "name": name, "config": config, "hf_split": split,
                "text_field": text_field, "max_docs": max_docs, "split": "doc-index-hash"},
        record_files=False,  # per-document manifests of web-scale data would dwarf the shards
        progress=progress,
    )
    return out_dir


def load_dataset(
    name_or_path: str | Path,
    cache_dir: Path | None = None,
    tokenizer: str = "bytes",
    *,
    bpe_vocab_size: int = 8192,
    max_bytes: int | None = None,
    verify: bool = False,
    progress: bool = True,
) -> TokenShards:
    """"stdlib" -> the cached default corpus (prepared on first use); otherwise a prepared shard directory.

    For a directory, `tokenizer`, `bpe_vocab_size` and `max_bytes` are ignored: the header says what it is.
    """
    if str(name_or_path) == "stdlib":
        path = prepare_stdlib(cache_dir, tokenizer, bpe_vocab_size, max_bytes, progress=progress)
    else:
        path = Path(name_or_path).expanduser()
        if not path.exists():
            raise FileNotFoundError(
                f"dataset {str(name_or_path)!r} is neither a built-in name ('stdlib') nor an existing directory; "
                f"{HINT_ANY}"
            )
    return TokenShards(path, verify=verify)


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
        f"documents: {s.get('n_docs', '?')} ({_held_out(s)}), "
        f"{s.get('n_skipped', 0)} skipped (empty or not UTF-8), {s.get('n_bytes', 0):,} bytes of text",
        f"corpus:    sha256 {s.get('corpus_sha256', '?')}",
        f"unigram entropy (train): {shards.unigram_entropy('train'):.4f} nats/token",
    ]
    return "\n".join(lines)


__all__ = [
    "ShardHeader",
    "TokenShards",
    "TrainBatches",
    "assign_splits",
    "default_cache_dir",
    "describe",
    "load_dataset",
    "prepare_hf_dataset",
    "prepare_stdlib",
    "prepare_text_files",
    "sha256_file",
    "stdlib_files",
    "stdlib_root",
    "val_windows",
]
