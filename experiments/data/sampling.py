"""What training reads from a prepared dataset: the fixed validation windows (:func:`val_windows`, no RNG) and
the training batches (:class:`TrainBatches`), a pure function of (seed, step).

So a resumed run sees exactly the data of an uninterrupted one, and the global batch does not depend on the
number of DDP ranks or DataLoader workers. The committed results depend on these streams bit for bit: any
change to how offsets are drawn or windows are cut changes every run's data.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .options import is_int
from .reader import TokenShards


def val_windows(shards: TokenShards, seq_len: int, n_sequences: int | None) -> torch.Tensor:
    """The fixed validation set: `n_sequences` windows of seq_len+1 tokens at evenly spaced offsets of val.bin.

    Returns int64 [n_sequences, seq_len + 1] (inputs = [:, :-1], targets = [:, 1:]). No RNG is involved, so
    every run with the same (dataset, seq_len, n_sequences) is scored on exactly the same tokens. The first
    window starts at 0 and the last ends at the last val token; windows overlap when n_sequences exceeds
    len(val) // (seq_len + 1). n_sequences=None takes all non-overlapping windows.
    """
    if not is_int(seq_len) or seq_len <= 0:
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
        if not is_int(n_sequences) or n_sequences <= 0:
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
        for name, value, low in (
            ("seq_len", seq_len, 1),
            ("batch_size", batch_size, 1),
            ("seed", seed, 0),
            ("start_step", start_step, 0),
            ("world_size", world_size, 1),
            ("rank", rank, 0),
        ):
            if not is_int(value) or value < low:
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
