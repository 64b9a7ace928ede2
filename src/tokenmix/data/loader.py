"""Deterministic, resumable, rank-sharded batches of token windows.

Training: the train stream of N ids is cut into non-overlapping windows of ``seq_len + 1`` ids
(inputs and shifted targets) starting at a per-epoch random offset; the windows are visited in a
per-epoch random order. Both come from a generator seeded by (seed, epoch), so the whole sampling
order is a pure function of (seed, position) and the position (epoch, cursor) is all a checkpoint
has to store. One optimizer step takes the next ``batch_size`` windows (the global batch); micro-step
a of rank r reads its own contiguous slice, so N ranks with the same global batch see exactly the
windows one process would.

Evaluation: consecutive windows covering the split (or an evenly spread subset of them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tokenmix.core.errors import InputError


@dataclass
class DataPosition:
    epoch: int = 0
    cursor: int = 0  # index of the next window in this epoch's order

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}

    @classmethod
    def from_dict(cls, d: dict) -> "DataPosition":
        return cls(int(d["epoch"]), int(d["cursor"]))


class TokenBatches:
    """Global batches of training windows, [batch_size, seq_len + 1] int64.

    Args:
        ids: [N] token ids (a memory map is fine: windows are copied out on demand).
        seq_len: T, the model's input length.
        batch_size: windows per optimizer step, across ranks and accumulation micro-steps.
        seed: decides offsets and orders.
    """

    def __init__(
        self, ids: np.ndarray, seq_len: int, batch_size: int, seed: int, position: DataPosition | None = None
    ) -> None:
        if seq_len <= 0 or batch_size <= 0:
            raise InputError(f"seq_len and batch_size must be > 0, got {seq_len}, {batch_size}")
        if len(ids) < seq_len + 1 + seq_len:
            raise InputError(
                f"the train split has {len(ids)} tokens; train.seq_len={seq_len} needs at least "
                f"{2 * seq_len + 1}: use a larger corpus or a smaller train.seq_len"
            )
        self.ids, self.seq_len, self.batch_size, self.seed = ids, seq_len, batch_size, seed
        self.position = position or DataPosition()
        self._epoch_cache: tuple[int, np.ndarray] | None = None

    def _epoch_starts(self, epoch: int) -> np.ndarray:
        """Start offsets of the windows of ``epoch``, in visiting order."""
        if self._epoch_cache is not None and self._epoch_cache[0] == epoch:
            return self._epoch_cache[1]
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        offset = int(torch.randint(0, self.seq_len, (1,), generator=g))
        n_windows = (len(self.ids) - 1 - offset) // self.seq_len
        order = torch.randperm(n_windows, generator=g).numpy()
        starts = offset + order.astype(np.int64) * self.seq_len
        self._epoch_cache = (epoch, starts)
        return starts

    def next_batch(self) -> Tensor:
        """The next global batch [batch_size, seq_len + 1]; advances the position."""
        starts: list[int] = []
        pos = self.position
        while len(starts) < self.batch_size:
            epoch_starts = self._epoch_starts(pos.epoch)
            take = epoch_starts[pos.cursor : pos.cursor + self.batch_size - len(starts)]
            starts.extend(int(s) for s in take)
            pos.cursor += len(take)
            if pos.cursor >= len(epoch_starts):
                pos.epoch, pos.cursor = pos.epoch + 1, 0
        rows = np.stack([np.asarray(self.ids[s : s + self.seq_len + 1], dtype=np.int64) for s in starts])
        return torch.from_numpy(rows)

    def epoch_fraction(self) -> float:
        return self.position.epoch + self.position.cursor / max(len(self._epoch_starts(self.position.epoch)), 1)


def shard(batch: Tensor, micro_step: int, n_micro: int, rank: int, world: int) -> Tensor:
    """Rows of ``batch`` [G, T+1] for (micro_step, rank): contiguous slices of G / (n_micro * world)."""
    g = batch.shape[0]
    per = g // (n_micro * world)
    if per * n_micro * world != g:
        raise InputError(f"batch_size {g} is not divisible by grad_accum * world_size = {n_micro * world}")
    start = (micro_step * world + rank) * per
    return batch[start : start + per]


def eval_windows(ids: np.ndarray, seq_len: int, max_windows: int = 0) -> list[Tensor]:
    """Consecutive windows [L + 1] (L <= seq_len) covering the split, the last one possibly shorter.

    ``max_windows`` > 0 keeps that many, evenly spread over the split (so a partial evaluation
    samples every document of the split, not only the first).
    """
    starts = list(range(0, max(len(ids) - 1, 0), seq_len))
    if max_windows and len(starts) > max_windows:
        starts = [starts[(i * len(starts)) // max_windows] for i in range(max_windows)]
    return [torch.from_numpy(np.asarray(ids[s : s + seq_len + 1], dtype=np.int64)) for s in starts]
