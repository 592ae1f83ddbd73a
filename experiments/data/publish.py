"""Publishing a prepared dataset: it is built in a fresh temporary directory beside its final place and renamed
into place atomically, so a reader never sees a half-written dataset and a crash leaves only a ``.tmp-*``
directory behind.

A shared corpus (the stdlib cache) is prepared once however many processes want it at the same time:
:func:`corpus_lock` serialises them, and each one checks again, lock in hand, whether another already published
it. Without a working lock (a file system with no ``flock``) every contender builds its own copy and the
atomic rename decides; the result is the same, only the work is duplicated.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from results.io import exclusive_lock

from .writers import build_shards


@contextlib.contextmanager
def corpus_lock(final: Path) -> Iterator[bool]:
    """Hold the preparation lock of the dataset that is to be published at `final` (``.<name>.lock`` beside it).

    Yields whether the lock is really held. When it is, every ``.tmp-<name>-*`` directory beside `final` is a
    leftover of a killed preparation, not a live writer's (:func:`remove_leftovers`)."""
    with exclusive_lock(final.parent / f".{final.name}.lock") as held:
        yield held


def remove_leftovers(final: Path) -> None:
    """Delete the temporary directories that killed preparations of `final` left beside it. Only safe while
    :func:`corpus_lock` is held."""
    for stale in final.parent.glob(f".tmp-{final.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)


def make_tmp(final: Path) -> Path:
    """A new empty directory ``.tmp-<name>-<pid>-*`` beside `final` (its parent created if missing)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-{os.getpid()}-", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp makes it 0700; the published dataset should be readable like any other dir
    return tmp


def build_and_publish(
    final: Path, docs: Iterable[tuple[str, bytes, str]], replace_existing: Callable[[], bool], **build: Any
) -> None:
    """writers.build_shards into a fresh tmp dir beside `final`, then :func:`publish` it; the tmp dir never
    outlives the call. `replace_existing` is asked only once the build is done (another process may have
    published meanwhile)."""
    tmp = make_tmp(final)
    try:
        build_shards(tmp, docs, **build)
        publish(tmp, final, replace_existing=replace_existing())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # no-op after a successful rename


def publish(tmp: Path, final: Path, replace_existing: bool) -> None:
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
