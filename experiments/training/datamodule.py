"""LightningDataModule around experiments.data (token shards, fixed validation windows, step-indexed batches).

Resume: the training stream is a pure function of (seed, step), and ``train_dataloader`` starts it at the
trainer's (restored) global step, so a resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from ..data import TokenShards, TrainBatches, load_dataset, val_windows


class TokenDataModule(pl.LightningDataModule):
    def __init__(
        self,
        name: str = "stdlib",
        tokenizer: str = "bytes",
        bpe_vocab_size: int = 8192,
        max_bytes: int | None = None,
        cache_dir: str | None = None,
        vocab_size: int | None = None,
        num_workers: int = 0,
        *,
        seq_len: int,
        batch_size: int,
        seed: int,
        val_sequences: int = 256,
        val_batch_size: int = 32,
        accumulate_grad_batches: int = 1,
    ) -> None:
        super().__init__()
        if accumulate_grad_batches < 1 or batch_size % accumulate_grad_batches:
            raise ValueError(
                f"trainer.accumulate_grad_batches={accumulate_grad_batches} must be >= 1 and divide the global "
                f"batch_size={batch_size}"
            )
        self.name, self.tokenizer, self.bpe_vocab_size = str(name), tokenizer, bpe_vocab_size
        self.max_bytes = max_bytes
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.vocab_size = vocab_size
        self.num_workers = num_workers
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.val_sequences, self.val_batch_size = val_sequences, val_batch_size
        self.accumulate = accumulate_grad_batches
        self.shards: TokenShards | None = None
        self.verified: str | None = None  # how the shard files were checked at load: "sha256" or "stamp"
        self._val: torch.Tensor | None = None

    # ---- loading (called by experiments.train before any model is built, so bad data fails first) --------
    def load(self, progress: bool = True) -> TokenShards:
        if self.shards is None:
            shards = load_dataset(
                self.name,
                cache_dir=self.cache_dir,
                tokenizer=self.tokenizer,
                bpe_vocab_size=self.bpe_vocab_size,
                max_bytes=self.max_bytes,
                progress=progress,
            )
            self.verified = shards.verify_cached()  # the files are the header's (a bit flip fails here)
            self.shards = shards
        return self.shards

    @property
    def dataset_vocab_size(self) -> int:
        return self.load().header.vocab_size

    def check(self, model_vocab_size: int) -> None:
        """Raise a ValueError that says what to change when the data cannot feed this model/batch."""
        shards = self.load()
        shards.check_compatible(model_vocab_size, self.seq_len, self.batch_size)
        self.val_set()  # validation windows must be buildable too

    def val_set(self) -> torch.Tensor:
        """The fixed held-out windows, int64 [val_sequences, seq_len + 1] (deterministic, no RNG)."""
        if self._val is None:
            self._val = val_windows(self.load(), self.seq_len, self.val_sequences)
        return self._val

    # ---- Lightning hooks ------------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        self.load(progress=False)  # rank 0 prepares the stdlib cache once (the others wait on its file lock)

    def setup(self, stage: str | None = None) -> None:
        self.load(progress=False)

    def train_batches(self) -> TrainBatches:
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        step = trainer.global_step if trainer is not None else 0
        # One TrainBatches "step" is one micro-batch; an optimizer step consumes `accumulate` of them.
        return TrainBatches(
            self.load(),
            self.seq_len,
            self.batch_size // self.accumulate,
            self.seed,
            start_step=step * self.accumulate,
            rank=rank,
            world_size=world,
        )

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_batches(), batch_size=None, num_workers=self.num_workers, persistent_workers=False)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.val_set()), batch_size=self.val_batch_size, shuffle=False)

    def describe(self) -> dict[str, Any]:
        h = self.load().header
        return {
            "path": str(self.load().path),
            "tokenizer": h.tokenizer,
            "vocab_size": h.vocab_size,
            "train_tokens": h.n_tokens["train"],
            "val_tokens": h.n_tokens["val"],
        }
