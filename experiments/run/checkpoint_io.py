"""Checkpoints that survive a crash, a full disk and a damaged file.

* :class:`AtomicCheckpointIO` — Lightning's ``TorchCheckpointIO`` (the Trainer's ``plugins``; experiments/
  instantiators.py installs it) with an atomic save: the checkpoint is written to a temporary file in its own
  directory, fsynced, and renamed over the target, so ``last.ckpt`` is always a whole checkpoint or absent, never a
  prefix (Lightning's own save goes through the system temp dir and is then *copied* when that is another file
  system: a full disk left half a checkpoint). The checkpoint it replaces is kept as ``last.prev.ckpt``: the last
  two checkpoints of a run, at two different steps.
* :func:`resume_checkpoint` — before a run resumes, the newest of the two that is readable (a zip archive whose
  every member matches its CRC-32 and holds a Lightning checkpoint). A damaged one is reported in one line naming
  the file and what is wrong, and moved aside (``<name>.corrupt-<time>``, kept for inspection); the run resumes
  from the older one, or starts over when none is left, and says which.

Peak disk use during a save is three checkpoints (the two kept and the one being written). Decisions:
docs/results_schema.md, "Checkpoints".
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from results.io import remove_dead_writers_files, writer_id

REQUIRED_KEYS = ("global_step", "state_dict", "loops")  # what a Lightning resume reads


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a quota, an I/O error); the one before it is intact."""


def previous_path(path: str | Path) -> Path:
    """Where the checkpoint before ``path`` is kept: ``last.ckpt`` -> ``last.prev.ckpt``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every file system lets a directory be fsynced
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` to ``.<name>.tmp-<host>-<pid>-<nonce>`` beside the target, fsync, then rename (first removing
    the temporary files of dead writers on this host: results.io.remove_dead_writers_files); the replaced checkpoint
    becomes :func:`previous_path` (unless it was saved at the same step by this process: two callbacks saving one
    step keep the older step as the previous one). A failed write removes its temporary file, keeps both earlier
    checkpoints, and raises CheckpointWriteError naming the file and the free space."""

    def __init__(self) -> None:
        super().__init__()
        self.saved_steps: dict[str, int | None] = {}  # path -> global_step of the last save by this process

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        step = checkpoint.get("global_step")
        remove_dead_writers_files(path)  # a killed save's temporary file (another process's, gone)
        tmp = path.with_name(f".{path.name}.tmp-{writer_id()}")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
        except Exception as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            free = shutil.disk_usage(path.parent).free
            raise CheckpointWriteError(
                f"could not write the checkpoint {path} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                f"); {free:,} bytes free on its file system; the checkpoints before it are kept"
            ) from e
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        if path.exists() and (str(path) not in self.saved_steps or self.saved_steps[str(path)] != step):
            os.replace(path, previous_path(path))  # a crash right here leaves the previous one: resume takes it
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        self.saved_steps[str(path)] = step

    def saved_at(self, path: str | Path) -> int | None:
        """The global step this process last saved ``path`` at (None: not saved by this process)."""
        return self.saved_steps.get(str(Path(path)))


def inspect_checkpoint(path: str | Path) -> tuple[int | None, str | None]:
    """(global step, None) for a checkpoint a resume can read, else (None, what is wrong with it): not a whole zip
    archive (truncated, overwritten), a member whose bytes fail its CRC-32 (a bit flip), or not a Lightning
    checkpoint. Reads the whole file once; the tensors are memory-mapped, not loaded."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
        if bad is not None:
            return None, f"member {bad} fails its CRC-32 check: the file was damaged after it was written"
    except zipfile.BadZipFile as e:
        return None, f"not a whole checkpoint ({e}: truncated, or not written by torch.save)"
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:  # noqa: BLE001 - whatever torch refuses, the run must not resume from it
        return None, f"torch.load refuses it ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    missing = [k for k in REQUIRED_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        return None, f"not a Lightning checkpoint (no {', '.join(missing)})"
    return int(ckpt["global_step"]), None


def resume_checkpoint(last: str | Path, run_id: str, rank_zero: bool = True) -> Path | None:
    """The checkpoint a relaunch of the run resumes from: ``last`` when it is readable, else the previous one kept
    beside it, else None (the run starts over). On rank zero each damaged one is reported in one line on stderr
    (the file, what is wrong, where it was moved; the last line also what the run does instead) and moved aside;
    other ranks only choose, and choose the same."""
    last = Path(last)
    damaged: list[tuple[Path, str]] = []
    chosen, chosen_step = None, None
    for path in (last, previous_path(last)):
        if not path.is_file():
            continue
        step, problem = inspect_checkpoint(path)
        if problem is None:
            chosen, chosen_step = path, step
            break
        damaged.append((path, problem))
    if rank_zero:
        for i, (path, problem) in enumerate(damaged):
            aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            with contextlib.suppress(OSError):
                os.replace(path, aside)
            then = ""
            if i == len(damaged) - 1:
                then = (
                    f"; resuming from {chosen.name} (step {chosen_step})"
                    if chosen is not None
                    else "; no readable checkpoint is left: the run starts over from step 0"
                )
            print(
                f"[attnres] {run_id}: checkpoint {path} is damaged ({problem}); moved aside to {aside.name}{then}",
                file=sys.stderr,
                flush=True,
            )
    return chosen
