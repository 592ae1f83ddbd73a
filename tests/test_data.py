"""Tests of the data layer (experiments/data/, experiments/prepare_data.py). Small slices, a few seconds."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import threading
import types
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments import data
from experiments.data import (
    ShardHeader,
    TokenShards,
    TrainBatches,
    default_cache_dir,
    load_dataset,
    prepare_hf_dataset,
    prepare_stdlib,
    prepare_text_files,
    publish,
    reader,
    val_windows,
)

REPO = Path(__file__).resolve().parents[1]
SMALL = 300_000  # bytes of stdlib for the shared fixture


def independent_hash(key: str) -> float:
    """Transcription of the documented rule: sha256(b'attnres-split\\0' + path)[:8] / 2**64, val if < fraction."""
    return int.from_bytes(hashlib.sha256(b"attnres-split\0" + key.encode()).digest()[:8], "big") / 2**64


def independent_split(keys: list[str], fraction: float) -> list[str]:
    """The rule plus its documented fallback: with no file below `fraction`, the smallest hash is held out."""
    u = [independent_hash(k) for k in keys]
    out = ["val" if x < fraction else "train" for x in u]
    if "val" not in out:
        out[min(range(len(u)), key=u.__getitem__)] = "val"
    return out


def _no_flock(fd, operation):
    """fcntl.flock on a file system that has none (some network file systems)."""
    raise OSError(errno.ENOSYS, "Function not implemented")


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> TokenShards:
    cache = tmp_path_factory.mktemp("cache")
    return TokenShards(prepare_stdlib(cache, max_bytes=SMALL, progress=False))


@pytest.fixture
def shard_copy(small: TokenShards, tmp_path: Path) -> Path:
    """A private copy of the small shards that a test may damage."""
    return Path(shutil.copytree(small.path, tmp_path / "shards"))


# ---------------------------------------------------------------------------------------------- stdlib corpus


def test_stdlib_small_matches_sources_and_manifest(small: TokenShards) -> None:
    h = small.header
    assert (h.tokenizer, h.vocab_size, h.dtype, h.separator) == ("bytes", 256, "uint8", 0)
    assert small.path.name.startswith("stdlib-py")
    assert small.path.name.endswith(f"-bytes-max{SMALL}")
    manifest = json.loads((small.path / "manifest.json").read_text())
    root = Path(data.stdlib_root())
    files = manifest["files"]
    paths = [f["path"] for f in files]
    assert paths == sorted(paths)
    assert len(paths) >= 5
    assert not any("site-packages" in p or "dist-packages" in p for p in paths)
    # every entry is the real file, hashed
    contents = {}
    for f in files:
        raw = (root / f["path"]).read_bytes()
        assert hashlib.sha256(raw).hexdigest() == f["sha256"]
        assert len(raw) == f["bytes"]
        contents[f["path"]] = raw
    # the documented hash split, with at least one held-out file
    assert [f["split"] for f in files] == independent_split(paths, 0.01)
    # train.bin / val.bin are exactly the files of each split, each followed by a 0 byte
    for split in ("train", "val"):
        expected = b"".join(contents[f["path"]] + b"\0" for f in files if f["split"] == split)
        assert bytes(small.split(split)) == expected
        assert h.n_tokens[split] == len(expected) > 0
    # the whole-corpus hash two machines compare
    corpus = hashlib.sha256(b"".join(contents[p] + b"\0" for p in paths)).hexdigest()
    assert h.source["corpus_sha256"] == manifest["corpus_sha256"] == corpus
    assert h.source["manifest_sha256"] == hashlib.sha256((small.path / "manifest.json").read_bytes()).hexdigest()
    assert sum(f["bytes"] for f in files) <= SMALL
    TokenShards(small.path, verify=True)  # checksums in the header are right


def test_full_stdlib_corpus(tmp_path: Path) -> None:
    """The real default: ~31 MB, ~1% held out, Python version recorded, non-UTF-8 fixtures skipped."""
    with pytest.warns(UserWarning, match="non-UTF-8") if _has_non_utf8_stdlib() else contextlib.nullcontext():
        shards = TokenShards(prepare_stdlib(tmp_path, progress=False))
    h, s = shards.header, shards.header.source
    assert s["kind"] == "stdlib"
    assert s["python_version"] == __import__("platform").python_version()
    assert s["n_docs"] > 500
    assert s["n_docs_val"] >= 1
    assert 0.002 < h.n_tokens["val"] / (h.n_tokens["train"] + h.n_tokens["val"]) < 0.05
    assert 1.0 < shards.unigram_entropy() < np.log(256)
    manifest = json.loads((shards.path / "manifest.json").read_text())
    assert all(not f["path"].startswith(("site-packages/", "dist-packages/")) for f in manifest["files"])
    assert all(x["reason"] == "empty" or x["reason"].startswith("not valid UTF-8") for x in manifest["skipped"])


def _has_non_utf8_stdlib() -> bool:
    for _, path in data.stdlib_files():
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            return True
    return False


def test_cache_is_reused_and_rebuilt_when_damaged(small: TokenShards, tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "c"
    path = prepare_stdlib(cache, max_bytes=60_000, progress=False)
    header = (path / "header.json").read_text()
    stale = cache / f".tmp-{path.name}-999999-dead"  # left behind by a killed run
    stale.mkdir()

    calls = []
    real_build = publish.build_shards
    monkeypatch.setattr(publish, "build_shards", lambda *a, **k: calls.append(1) or real_build(*a, **k))
    assert prepare_stdlib(cache, max_bytes=60_000, progress=False) == path
    assert calls == []
    assert stale.exists()

    with open(path / "train.bin", "r+b") as f:  # truncate: the size check catches it
        f.truncate(10)
    with pytest.raises(ValueError, match="prepare_data stdlib"):
        TokenShards(path)
    assert prepare_stdlib(cache, max_bytes=60_000, progress=False) == path
    assert calls == [1]
    assert not stale.exists()
    assert (path / "header.json").read_text() == header  # same corpus -> byte-identical header
    assert prepare_stdlib(cache, max_bytes=60_000, force=True, progress=False) == path
    assert calls == [1, 1]
    assert [p.name for p in cache.iterdir() if p.name.startswith((".tmp-", ".trash-"))] == []


def test_without_flock_a_tmp_dir_beside_the_cache_is_left_alone(tmp_path: Path, monkeypatch) -> None:
    """Unlocked, a .tmp-* directory may be a live writer's: a rebuild keeps it (with the lock it is removed, above)."""
    monkeypatch.setattr(pytest.importorskip("fcntl"), "flock", _no_flock)
    cache = tmp_path / "c"
    path = prepare_stdlib(cache, max_bytes=60_000, progress=False)
    live = cache / f".tmp-{path.name}-12345-live"
    live.mkdir()
    (path / "header.json").unlink()  # the cached copy is incomplete: rebuilt
    assert prepare_stdlib(cache, max_bytes=60_000, progress=False) == path
    assert live.is_dir()
    TokenShards(path, verify=True)


@pytest.mark.parametrize("with_lock", [True, False])
def test_concurrent_preparation_is_safe(tmp_path: Path, monkeypatch, with_lock: bool) -> None:
    if not with_lock:  # a file system without flock: every thread builds, the atomic rename decides
        monkeypatch.setattr(pytest.importorskip("fcntl"), "flock", _no_flock)
    results, errors = [], []
    barrier = threading.Barrier(3)

    def worker() -> None:
        try:
            barrier.wait()
            results.append(TokenShards(prepare_stdlib(tmp_path, max_bytes=80_000, progress=False), verify=True))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len({(r.path, r.header.checksum["train"]) for r in results}) == 1
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == [results[0].path.name]


def test_default_cache_dir(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ATTNRES_DATA_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("ATTNRES_DATA_DIR")
    assert default_cache_dir() == REPO / "data" / "cache"


def test_load_dataset(small: TokenShards, tmp_path: Path) -> None:
    assert load_dataset(str(small.path)).header == small.header
    cache = small.path.parent
    assert load_dataset("stdlib", cache_dir=cache, max_bytes=SMALL).path == small.path
    with pytest.raises(FileNotFoundError, match="stdlib"):
        load_dataset(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="allowed values: bytes, bpe"):
        load_dataset("stdlib", cache_dir=cache, tokenizer="chars")


# -------------------------------------------------------------------------------------------- data options

GOOD_DATA = {
    "name": "stdlib",
    "tokenizer": "bytes",
    "bpe_vocab_size": 8192,
    "max_bytes": None,
    "cache_dir": None,
    "vocab_size": None,
    "num_workers": 0,
}


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"name": ""}, r"data\.name must be 'stdlib' or the directory of prepared token shards"),
        ({"tokenizer": "sentencepiece"}, r"data\.tokenizer='sentencepiece'; allowed values: bytes, bpe$"),
        ({"tokenizer": "bpe", "bpe_vocab_size": 256}, r"data\.bpe_vocab_size=256 must be an integer >= 257"),
        ({"tokenizer": "bpe", "bpe_vocab_size": "8k"}, r"data\.bpe_vocab_size='8k' must be an integer"),
        ({"max_bytes": 0}, r"data\.max_bytes=0 must be a positive integer or None"),
        ({"max_bytes": True}, r"data\.max_bytes=True must be a positive integer or None"),
        ({"vocab_size": -5}, r"data\.vocab_size=-5 must be a positive integer or None"),
        ({"num_workers": -1}, r"data\.num_workers=-1 must be an integer >= 0"),
        ({"num_workers": 1.5}, r"data\.num_workers=1.5 must be an integer >= 0"),
    ],
)
def test_check_data_config_names_the_key_and_what_is_allowed(change: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        data.check_data_config({**GOOD_DATA, **change})


def test_check_data_config_accepts_the_shipped_configs() -> None:
    from omegaconf import OmegaConf

    data.check_data_config(GOOD_DATA)
    data.check_data_config({**GOOD_DATA, "tokenizer": "bpe", "max_bytes": 100_000, "vocab_size": 300})
    data.check_data_config({**GOOD_DATA, "name": "/some/shards", "tokenizer": "bpe", "bpe_vocab_size": 257})
    data.check_data_config(OmegaConf.load(REPO / "conf" / "data" / "stdlib.yaml"))  # cache_dir is never resolved


def test_the_preparation_functions_check_their_options_the_same_way(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello\n")
    with pytest.raises(ValueError, match=r"^max_bytes=0 must be a positive integer or None$"):
        prepare_stdlib(tmp_path / "c", max_bytes=0, progress=False)
    with pytest.raises(ValueError, match=r"^tokenizer='chars'; allowed values: bytes, bpe$"):
        prepare_stdlib(tmp_path / "c", tokenizer="chars", progress=False)
    with pytest.raises(ValueError, match=r"^bpe_vocab_size=100 must be an integer >= 257"):
        prepare_text_files([tmp_path / "a.txt"], tmp_path / "o", tokenizer="bpe", bpe_vocab_size=100, progress=False)
    with pytest.raises(ValueError, match=r"^split='lines'; allowed values: auto, file, tail$"):
        prepare_text_files([tmp_path / "a.txt"], tmp_path / "o", split="lines", progress=False)
    with pytest.raises(ValueError, match=r"^val_fraction=0.7 must be in \(0, 0.5\)$"):
        prepare_text_files([tmp_path / "a.txt"], tmp_path / "o", val_fraction=0.7, progress=False)
    with pytest.raises(ValueError, match=r"^max_docs=-1 must be a positive integer or None$"):
        prepare_hf_dataset("any/name", tmp_path / "o", max_docs=-1, progress=False)
    assert not (tmp_path / "c").exists()
    assert not (tmp_path / "o").exists()


def test_the_options_and_format_modules_load_without_numpy_or_torch() -> None:
    code = (
        "import sys\n"
        "from experiments.data import TOKENIZERS, check_data_config, ShardHeader\n"
        "import experiments.data.options, experiments.data.format\n"
        "heavy = [m for m in ('numpy', 'torch', 'lightning') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_every_exported_name_resolves() -> None:
    for name in data.__all__:
        value = getattr(data, name)
        assert getattr(value, "__module__", data.__name__).startswith("experiments.data"), name
    assert {"TokenShards", "TrainBatches", "load_dataset", "val_windows", "check_data_config"} <= set(dir(data))
    with pytest.raises(AttributeError, match="no attribute 'prepare'"):
        data.prepare  # noqa: B018 - the attribute access is the test


# --------------------------------------------------------------------------------------------------- bad data


def _rewrite_header(path: Path, **changes) -> None:
    raw = json.loads((path / "header.json").read_text())
    raw.update(changes)
    (path / "header.json").write_text(json.dumps(raw))


def test_missing_files(shard_copy: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="prepare_data"):
        TokenShards(tmp_path / "nothing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"header\.json"):
        TokenShards(empty)
    (shard_copy / "val.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"val\.bin"):
        TokenShards(shard_copy)


def test_wrong_header(shard_copy: Path) -> None:
    n = json.loads((shard_copy / "header.json").read_text())["n_tokens"]
    _rewrite_header(shard_copy, dtype="int16")
    with pytest.raises(ValueError, match=r"dtype='int16'.*allowed values: uint8, uint16, uint32"):
        TokenShards(shard_copy)
    _rewrite_header(shard_copy, dtype="uint16")  # file size now disagrees: 2 bytes per token
    with pytest.raises(ValueError, match="another dtype"):
        TokenShards(shard_copy)
    _rewrite_header(shard_copy, dtype="uint8", n_tokens={"train": n["train"] + 1, "val": n["val"]})
    with pytest.raises(ValueError, match="truncated"):
        TokenShards(shard_copy)
    _rewrite_header(shard_copy, n_tokens=n, vocab_size=300)
    with pytest.raises(ValueError, match="does not fit dtype uint8"):
        TokenShards(shard_copy)
    _rewrite_header(shard_copy, vocab_size=256, format_version=99)
    with pytest.raises(ValueError, match="format_version"):
        TokenShards(shard_copy)
    _rewrite_header(shard_copy, format_version=1)
    with open(shard_copy / "val.bin", "ab") as f:  # longer than the header says
        f.write(b"x")
    with pytest.raises(ValueError, match=r"val\.bin holds"):
        TokenShards(shard_copy)
    (shard_copy / "header.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        TokenShards(shard_copy)


def test_checksum_and_token_range_verified(shard_copy: Path) -> None:
    with open(shard_copy / "train.bin", "r+b") as f:  # same size, one byte changed
        first = f.read(1)
        f.seek(0)
        f.write(bytes([(first[0] + 1) % 256]))
    TokenShards(shard_copy)  # size is fine: opening without verify works
    with pytest.raises(ValueError, match=r"checksum mismatch for .*train\.bin") as err:
        TokenShards(shard_copy, verify=True)
    # the fix, as a command that can be pasted whole (issue 23 #14: the backtick stood before --force)
    assert str(err.value).endswith("or run `python -m experiments.prepare_data stdlib --force`"), str(err.value)
    # token ids beyond the header's vocabulary, with consistent checksums
    _rewrite_header(
        shard_copy,
        vocab_size=40,
        checksum={
            "algorithm": "sha256",
            "train": data.sha256_file(shard_copy / "train.bin"),
            "val": data.sha256_file(shard_copy / "val.bin"),
        },
    )
    with pytest.raises(ValueError, match=r"token id .* >= header vocab_size 40"):
        TokenShards(shard_copy, verify=True)


def test_check_compatible(small: TokenShards) -> None:
    small.check_compatible(vocab_size=256, seq_len=64, batch_size=8)
    small.check_compatible(vocab_size=8192, seq_len=64, batch_size=8)  # a bigger model vocab is fine
    with pytest.raises(ValueError, match="vocab_size to at least 256"):
        small.check_compatible(vocab_size=128, seq_len=64, batch_size=8)
    n = small.header.n_tokens["train"]
    with pytest.raises(ValueError, match="fewer than one batch"):
        small.check_compatible(vocab_size=256, seq_len=1024, batch_size=n // 1024 + 1)
    with pytest.raises(ValueError, match="validation tokens"):
        small.check_compatible(vocab_size=256, seq_len=small.header.n_tokens["val"], batch_size=1)
    with pytest.raises(ValueError, match="seq_len"):
        small.check_compatible(vocab_size=256, seq_len=0, batch_size=1)


# ------------------------------------------------------------------------------------------ windows, batches


def test_val_windows_fixed_and_evenly_spaced(small: TokenShards) -> None:
    seq, n = 32, 7
    np.random.seed(1)  # noqa: NPY002 -- the global numpy RNG on purpose: val_windows must not depend on it
    torch.manual_seed(1)
    a = val_windows(small, seq, n)
    np.random.seed(2)  # noqa: NPY002 -- the global numpy RNG on purpose, as above
    torch.manual_seed(2)
    b = val_windows(small, seq, n)
    assert a.dtype == torch.int64
    assert a.shape == (n, seq + 1)
    assert torch.equal(a, b)
    val = np.asarray(small.val, dtype=np.int64)
    span = len(val) - (seq + 1)
    for i in range(n):
        start = i * span // (n - 1)
        assert a[i].tolist() == val[start : start + seq + 1].tolist()
    assert a[-1].tolist() == val[-(seq + 1) :].tolist()
    every = val_windows(small, seq, None)
    assert every.shape == (len(val) // (seq + 1), seq + 1)
    assert every.flatten().tolist() == val[: every.numel()].tolist()
    with pytest.raises(ValueError, match="fewer than one window"):
        val_windows(small, len(val), 1)


def test_train_batches_deterministic_resumable(small: TokenShards) -> None:
    seq, bs, seed = 16, 8, 1234
    ds = TrainBatches(small, seq, bs, seed)
    it = iter(ds)
    stream = [next(it) for _ in range(6)]
    train = np.asarray(small.train, dtype=np.int64)
    for step, (x, y) in enumerate(stream):
        assert x.shape == y.shape == (bs, seq)
        assert x.dtype == y.dtype == torch.int64
        offsets = np.random.default_rng([seed, step]).integers(0, len(train) - seq, size=bs)
        windows = np.stack([train[o : o + seq + 1] for o in offsets])
        assert x.tolist() == windows[:, :-1].tolist()
        assert y.tolist() == windows[:, 1:].tolist()
    # resume at step 4: exactly the batches an uninterrupted run sees
    resumed = iter(TrainBatches(small, seq, bs, seed, start_step=4))
    for step in (4, 5):
        x, y = next(resumed)
        assert torch.equal(x, stream[step][0])
        assert torch.equal(y, stream[step][1])
    # a different seed gives different data
    assert not torch.equal(TrainBatches(small, seq, bs, seed + 1).batch(0)[0], stream[0][0])


@pytest.mark.parametrize("world_size", [2, 4])
def test_train_batches_ddp_slices_global_batch(small: TokenShards, world_size: int) -> None:
    seq, bs, seed = 16, 8, 7
    for step in (0, 3):
        full_x, full_y = TrainBatches(small, seq, bs, seed).batch(step)
        parts = [
            TrainBatches(small, seq, bs, seed, rank=r, world_size=world_size).batch(step) for r in range(world_size)
        ]
        assert all(p[0].shape == (bs // world_size, seq) for p in parts)
        assert torch.equal(torch.cat([p[0] for p in parts]), full_x)
        assert torch.equal(torch.cat([p[1] for p in parts]), full_y)


def test_train_batches_bad_arguments(small: TokenShards) -> None:
    with pytest.raises(ValueError, match="not divisible by world_size=4"):
        TrainBatches(small, 16, 6, 0, world_size=4)
    with pytest.raises(ValueError, match="rank=2 must be < world_size=2"):
        TrainBatches(small, 16, 8, 0, rank=2, world_size=2)
    with pytest.raises(ValueError, match="seed"):
        TrainBatches(small, 16, 8, -1)
    with pytest.raises(ValueError, match="fewer than one batch"):
        TrainBatches(small, 1024, small.header.n_tokens["train"] // 1024 + 1, 0)


def test_train_batches_dataloader_workers_and_pickle(small: TokenShards) -> None:
    ds = TrainBatches(small, 16, 4, 3, start_step=10)
    clone = pickle.loads(pickle.dumps(ds))  # spawn-started workers get a reopened memmap, not a copy
    assert torch.equal(clone.batch(10)[0], ds.batch(10)[0])
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    got = []
    for i, (x, _) in enumerate(loader):
        got.append(x)
        if i == 4:
            break
    for i, x in enumerate(got):  # worker striding + round-robin = step order
        assert torch.equal(x, ds.batch(10 + i)[0])


def test_unigram_entropy(small: TokenShards) -> None:
    counts = np.array(list(Counter(bytes(small.train)).values()), dtype=np.float64)
    p = counts / counts.sum()
    assert small.unigram_entropy("train") == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-12)
    assert 0 < small.unigram_entropy("val") < np.log(256)
    with pytest.raises(ValueError, match="split"):
        small.unigram_entropy("test")


# ---------------------------------------------------------------------------------------------- text files, HF


def test_text_file_single_tail_split(tmp_path: Path) -> None:
    text = "".join(f"line {i}: the quick brown fox é\n" for i in range(400)).encode()
    (tmp_path / "book.txt").write_bytes(text)
    shards = TokenShards(
        prepare_text_files([tmp_path / "book.txt"], tmp_path / "out", val_fraction=0.05, progress=False)
    )
    train, val = bytes(shards.train), bytes(shards.val)
    assert train[-1] == 0
    assert val[-1] == 0
    assert train[:-1] + val[:-1] == text
    assert train[-2:-1] == b"\n"
    assert 0.03 < len(val) / len(text) < 0.1
    assert shards.header.source["split"] == "tail"
    assert shards.decode(shards.val[:-1]) == val[:-1].decode()


def test_text_directory_file_split_skip_and_overwrite(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    for i in range(150):
        (corpus / ("sub" if i % 2 else "") / f"f{i:03d}.txt").write_text(f"document {i}\n" * 5)
    (corpus / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="non-UTF-8.*latin1.txt"):
        shards = TokenShards(prepare_text_files([corpus], out, val_fraction=0.02, progress=False))
    manifest = json.loads((out / "manifest.json").read_text())
    keys = [f["path"] for f in manifest["files"]]
    assert all(k.startswith("corpus/") for k in keys)
    assert "corpus/sub/f001.txt" in keys
    assert [f["split"] for f in manifest["files"]] == independent_split(keys, 0.02)
    assert manifest["skipped"][0]["path"] == "corpus/latin1.txt"
    assert shards.header.source["n_docs_val"] == sum(f["split"] == "val" for f in manifest["files"]) >= 1
    # re-preparing into a shard dir replaces it; a foreign non-empty dir is refused
    prepare_text_files([corpus / "f000.txt", corpus / "f002.txt"], out, progress=False)
    assert TokenShards(out).header.source["n_docs"] == 2
    with pytest.raises(ValueError, match="not a token-shard directory"):
        prepare_text_files([corpus / "f000.txt"], corpus, progress=False)
    with pytest.raises(ValueError, match="not a directory"):
        prepare_text_files([corpus / "f000.txt"], corpus / "f004.txt", progress=False)
    assert (corpus / "f004.txt").read_text() == "document 4\n" * 5
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prepare_text_files([tmp_path / "missing.txt"], tmp_path / "o2", progress=False)


def test_bpe_needs_tokenizers(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails as if not installed
    (tmp_path / "a.txt").write_text("hello\n")
    with pytest.raises(ImportError, match=r"pip install 'attnres\[bpe\]'"):
        prepare_text_files([tmp_path / "a.txt"], tmp_path / "out", tokenizer="bpe", progress=False)
    with pytest.raises(ValueError, match="allowed values: bytes, bpe"):
        prepare_text_files([tmp_path / "a.txt"], tmp_path / "out", tokenizer="gpt2", progress=False)


def test_bpe_round_trip(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    root = data.stdlib_root()
    sources = [root / n for n in ("textwrap.py", "glob.py", "fnmatch.py", "bisect.py", "colorsys.py")]
    out = prepare_text_files(
        sources, tmp_path / "bpe", tokenizer="bpe", bpe_vocab_size=500, val_fraction=0.3, progress=False
    )
    shards = TokenShards(out, verify=True)
    h = shards.header
    assert (h.tokenizer, h.dtype, h.separator) == ("bpe", "uint16", 0)
    assert 257 <= h.vocab_size <= 500
    manifest = json.loads((out / "manifest.json").read_text())
    for split in ("train", "val"):
        expected = "".join(p.read_text() + "\x00" for p, f in zip(sources, manifest["files"]) if f["split"] == split)
        assert shards.decode(shards.split(split)) == expected
        assert int((np.asarray(shards.split(split)) == 0).sum()) == sum(f["split"] == split for f in manifest["files"])
    assert h.n_tokens["train"] < 0.6 * sum(len(p.read_bytes()) for p in sources)  # BPE actually compresses
    # the same corpus gives the same tokenizer and shards
    again = TokenShards(
        prepare_text_files(
            sources, tmp_path / "bpe2", tokenizer="bpe", bpe_vocab_size=500, val_fraction=0.3, progress=False
        )
    )
    assert again.header.checksum == h.checksum


def _fake_datasets(records: list[dict]) -> types.ModuleType:
    module = types.ModuleType("datasets")
    module.load_dataset = lambda name, config=None, split="train", streaming=True: iter(records)  # type: ignore[attr-defined]
    return module


def test_hf_dataset_with_fake_datasets(tmp_path: Path, monkeypatch) -> None:
    records = [{"text": f"story {i}: once upon a time\n", "id": i} for i in range(400)]
    monkeypatch.setitem(sys.modules, "datasets", _fake_datasets(records))
    out = prepare_hf_dataset("fake/stories", tmp_path / "hf", val_fraction=0.05, max_docs=300, progress=False)
    shards = TokenShards(out, verify=True)
    s = shards.header.source
    assert (s["kind"], s["name"], s["n_docs"]) == ("hf", "fake/stories", 300)
    held = [i for i in range(300) if independent_hash(f"train/{i}") < 0.05]
    assert s["n_docs_val"] == len(held) >= 1
    assert bytes(shards.val) == b"".join(records[i]["text"].encode() + b"\0" for i in held)
    monkeypatch.setitem(sys.modules, "datasets", _fake_datasets(records))
    with pytest.raises(ValueError, match=r"text_field='body'.*columns: text, id"):
        prepare_hf_dataset("fake/stories", tmp_path / "hf2", text_field="body", progress=False)


def test_hf_dataset_errors(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match=r"pip install 'attnres\[hf\]'"):
        prepare_hf_dataset("any/name", tmp_path / "o", progress=False)
    broken = types.ModuleType("datasets")

    def offline(*_a, **_k):
        raise ConnectionError("no route to host")

    broken.load_dataset = offline  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", broken)
    with pytest.raises(RuntimeError, match=r"no route to host.*network access"):
        prepare_hf_dataset("any/name", tmp_path / "o", progress=False)


# ------------------------------------------------------------------------------------------------------ CLI


def test_cli_help_is_light() -> None:
    code = (
        "import runpy, sys\n"
        "sys.argv = ['prepare_data', '--help']\n"
        "try:\n    runpy.run_module('experiments.prepare_data', run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0\n"
        "heavy = [m for m in ('torch', 'lightning', 'numpy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "stdlib" in result.stdout
    assert "files" in result.stdout
    assert "hf" in result.stdout


def test_cli_files_and_info(tmp_path: Path, capsys) -> None:
    from experiments.prepare_data import main

    (tmp_path / "a.txt").write_text("alpha beta gamma\n" * 50)
    assert main(["--no-progress", "files", str(tmp_path / "a.txt"), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    shards = TokenShards(tmp_path / "out")
    assert str(tmp_path / "out") in printed
    assert f"train {shards.header.n_tokens['train']:,}" in printed
    assert main(["info", str(tmp_path / "out"), "--verify"]) == 0
    assert main(["info", str(tmp_path / "nope")]) == 2
    assert "prepare_data stdlib" in capsys.readouterr().err


def test_header_round_trip() -> None:
    h = ShardHeader(
        "bytes",
        256,
        "uint8",
        {"train": 10, "val": 2},
        {"algorithm": "sha256", "train": "a", "val": "b"},
        {"kind": "files"},
    )
    assert ShardHeader.from_dict(json.loads(h.to_json())) == h


# ---- issue 15, items 9-11 --------------------------------------------------------------------------------------
def _one_file_shards(tmp_path: Path) -> Path:
    text = tmp_path / "corpus.txt"
    text.write_text("".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(4000)))
    return data.prepare_text_files([text], tmp_path / "shards", progress=False)


def test_a_same_size_bit_flip_is_caught_at_load_and_a_stamp_spares_rehashing(tmp_path, monkeypatch):
    from experiments.training.datamodule import TokenDataModule

    monkeypatch.setenv("ATTNRES_CACHE_DIR", str(tmp_path / "cache"))
    shards = _one_file_shards(tmp_path)

    def load() -> TokenDataModule:
        dm = TokenDataModule(name=str(shards), seq_len=32, batch_size=2, seed=0, val_sequences=2)
        dm.load(progress=False)
        return dm

    assert load().verified == "sha256"  # first load: hashed, stamp written
    calls = []
    real = reader.sha256_file
    monkeypatch.setattr(reader, "sha256_file", lambda p: calls.append(p) or real(p))
    assert load().verified == "stamp"
    assert calls == []
    train_bin = shards / "train.bin"
    st = train_bin.stat()
    raw = bytearray(train_bin.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one bit, same size
    train_bin.write_bytes(bytes(raw))
    os.utime(train_bin, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with the old mtime put back
    with pytest.raises(ValueError, match=r"checksum mismatch for .*train.bin"):
        load()


def test_a_bit_flip_stops_training_before_it_starts(train_cfg, tmp_path, monkeypatch):
    from experiments.run.errors import SetupError
    from experiments.train import train

    monkeypatch.setenv("ATTNRES_CACHE_DIR", str(tmp_path / "cache"))
    shards = _one_file_shards(tmp_path)
    raw = bytearray((shards / "val.bin").read_bytes())
    raw[10] ^= 0x40
    (shards / "val.bin").write_bytes(bytes(raw))
    cfg = train_cfg(f"data.name={shards}")
    with pytest.raises(SetupError, match=r"checksum mismatch for .*val\.bin"):
        train(cfg)


def test_prepare_on_an_empty_input_says_it_is_empty(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"the input is empty: .*1 empty input\(s\): empty.txt") as err:
        data.prepare_text_files([empty], tmp_path / "out", progress=False)
    assert "val_fraction" not in str(err.value)


def test_describe_a_tail_split_does_not_say_nothing_is_held_out(tmp_path):
    shards = data.TokenShards(_one_file_shards(tmp_path))
    assert shards.header.n_tokens["val"] > 0
    text = data.describe(shards)
    assert "0 held out" not in text
    assert "of each of 1 held out, split tail" in text


def test_the_readmes_own_data_directory_is_ignored_by_git():
    repo = Path(__file__).resolve().parents[1]
    if not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    for path in ("data/mine/header.json", "data/mine/train.bin", "data/cache/x/header.json"):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=repo).returncode == 0, path
