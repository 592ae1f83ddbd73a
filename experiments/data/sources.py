"""Where datasets come from: the corpus sources, each turned into token shards by the same writer (writers.py),
and :func:`load_dataset`, which opens one by name.

  * ``stdlib`` (:func:`prepare_stdlib`), the default: the running interpreter's standard-library .py files.
    Nothing is downloaded; it is prepared once into :func:`default_cache_dir` and reused, ~1% of files held out
    by a hash of their path.
  * text files or directories of them (:func:`prepare_text_files`): held out by a hash of each file's path, or,
    with a single file (or too few files for `val_fraction`), at its tail: the last ~val_fraction of its bytes,
    cut at a line break.
  * a Hugging Face dataset (:func:`prepare_hf_dataset`; needs the optional `datasets` package), held out by a
    hash of each document's index.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from . import options
from .format import HINT_ANY
from .publish import build_and_publish, corpus_lock, remove_leftovers
from .reader import TokenShards
from .writers import SPLIT_RULE, assign_splits, require_tokenizer, split_hash

STDLIB_VAL_FRACTION = 0.01
_STDLIB_EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def default_cache_dir() -> Path:
    """$ATTNRES_DATA_DIR, else data/cache/ in the repository (git-ignored), else ~/.cache/attnres/data."""
    env = os.environ.get("ATTNRES_DATA_DIR")
    if env:
        return Path(env).expanduser()
    repo = Path(__file__).resolve().parents[2]
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
        h.update(f"{rel}\0{path.stat().st_size}\n".encode())
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
    require_tokenizer(tokenizer, bpe_vocab_size)
    options.check_positive_or_none(max_bytes, "max_bytes")
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
    with corpus_lock(final) as locked:
        if not force and _cached(final, tokenizer, want):  # another process finished it while we waited
            return final
        if locked:  # any tmp dir of this dataset is then a leftover of a killed run, not a live writer's
            remove_leftovers(final)
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

        # Without a working lock a racing process may have published meanwhile: keep a valid copy.
        build_and_publish(
            final,
            docs(),
            lambda: force or not _cached(final, tokenizer, want),
            tokenizer=tokenizer,
            bpe_vocab_size=bpe_vocab_size,
            val_fraction=STDLIB_VAL_FRACTION,
            source={
                **want,
                "python": f"{platform.python_implementation()} {platform.python_version()}",
                "split": "file-hash",
                "n_files_listed": len(files),
            },
            record_files=True,
            manifest_extra={
                "kind": "stdlib",
                "python": f"{platform.python_implementation()} {platform.python_version()}",
                "split_rule": SPLIT_RULE,
            },
            progress=progress,
        )
    return final


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
    foreign = out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "header.json").is_file()
    if foreign:
        raise ValueError(f"--out {out_dir} exists, is not empty and is not a token-shard directory; choose another")


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
    require_tokenizer(tokenizer, bpe_vocab_size)
    options.check_val_fraction(val_fraction)
    options.check_choice(split, "split", options.SPLITS)
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

    build_and_publish(
        out_dir,
        docs(),
        lambda: True,
        tokenizer=tokenizer,
        bpe_vocab_size=bpe_vocab_size,
        val_fraction=val_fraction,
        source={"kind": "files", "split": "file-hash" if split == "file" else "tail"},
        record_files=True,
        manifest_extra={"kind": "files", "split_rule": SPLIT_RULE if split == "file" else "tail of each file"},
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
    require_tokenizer(tokenizer, bpe_vocab_size)
    options.check_val_fraction(val_fraction)
    options.check_positive_or_none(max_docs, "max_docs")
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
                raise ValueError(f"text_field={text_field!r} is not a column of {name!r}; columns: {', '.join(record)}")
            key = f"{split}/{i}"
            yield key, str(record[text_field]).encode("utf-8"), "val" if split_hash(key) < val_fraction else "train"

    build_and_publish(
        out_dir,
        docs(),
        lambda: True,
        tokenizer=tokenizer,
        bpe_vocab_size=bpe_vocab_size,
        val_fraction=val_fraction,
        source={
            "kind": "hf",
            "name": name,
            "config": config,
            "hf_split": split,
            "text_field": text_field,
            "max_docs": max_docs,
            "split": "doc-index-hash",
        },
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
    """``"stdlib"`` -> the cached default corpus (prepared on first use); otherwise a prepared shard directory.

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
