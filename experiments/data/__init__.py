"""Token shards: the data layer of the training harness (numpy + torch, no Lightning). One module per concern:

    options.py   the data options and their checks (check_data_config); pure stdlib
    format.py    the on-disk format: header.json (ShardHeader), the .bin files, checksums; pure stdlib
    reader.py    TokenShards: a prepared directory opened as memmaps, verified, described
    sampling.py  val_windows (fixed, no RNG) and TrainBatches (a pure function of (seed, step))
    writers.py   documents -> train/val shards: the hash split, UTF-8 rules, byte and BPE tokenisation
    publish.py   build in a temporary directory, rename into place; the lock that prepares a corpus once
    sources.py   the corpora (stdlib, text files, Hugging Face datasets) and load_dataset

``from experiments.data import X`` works for every name below. A submodule is imported on first use of one of
its names, so ``experiments.data.options`` (and the config checks that use it) costs no numpy or torch import.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the submodule that defines it
_EXPORTS = {
    "TOKENIZERS": "options",
    "check_data_config": "options",
    "DTYPE_CAPACITY": "format",
    "FORMAT_VERSION": "format",
    "SEPARATOR": "format",
    "ShardHeader": "format",
    "sha256_file": "format",
    "TokenShards": "reader",
    "describe": "reader",
    "TrainBatches": "sampling",
    "val_windows": "sampling",
    "assign_splits": "writers",
    "STDLIB_VAL_FRACTION": "sources",
    "default_cache_dir": "sources",
    "load_dataset": "sources",
    "prepare_hf_dataset": "sources",
    "prepare_stdlib": "sources",
    "prepare_text_files": "sources",
    "stdlib_dataset_name": "sources",
    "stdlib_files": "sources",
    "stdlib_root": "sources",
}
__all__ = sorted(_EXPORTS)  # noqa: PLE0605 - computed from _EXPORTS (a list); its names resolve lazily via __getattr__


def __getattr__(name: str) -> Any:
    """The exported `name`, its submodule imported on first use (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
