"""Sparsity patterns of the recurrent part B: for every position t, the set N(t) of past positions
whose outputs y_j the state y_t reads.

Positions are 0-indexed (t = 0 is the first token). The paper's formulas are 1-indexed
(i = t + 1); each pattern converts in one place.

A pattern reports, all derived from its definition:
    neighbors(t)           N(t), a list of positions j < t, one per *level* slot (deduplicated)
    neighbor_table(t0, t1) LongTensor [t1 - t0, W] of N(t) for t in [t0, t1), -1 = no neighbour;
                           column w is level slot w (gate-based coefficients index levels)
    needed(t)              positions j < t that some token t' >= t reads: exactly the decode cache
                           held while token t is processed
    needed_from(t)         s if needed(t) is the contiguous range [s, t) (exact translation-invariant
                           patterns), else None: lets a decode cache evict in O(1) without listing
                           an O(n) set
    cache_size(n)          max over t < n of |needed(t)|: the peak decode cache of an n-token decode
    nnz(n)                 number of nonzeros of B for an n-token sequence
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch
from torch import Tensor

from tokenmix.core.errors import InputError


class Pattern(ABC):
    name: str

    @abstractmethod
    def n_levels(self, n: int) -> int:
        """Number of level slots W needed for positions t < n."""

    @abstractmethod
    def _table_np(self, t: np.ndarray) -> np.ndarray:
        """[len(t), W] int64 table for positions t (W = n_levels(max(t) + 1)); -1 = none."""

    @abstractmethod
    def needed(self, t: int) -> list[int]:
        """Sorted positions j < t read by some token t' >= t."""

    def needed_from(self, t: int) -> int | None:
        return None

    #: every level slot reads a different position (no deduplication needed), e.g. distinct distances
    distinct_levels: bool = False

    #: needed(t) is exactly sorted(N(t)) (the lattice, Fenwick): the decode cache while token t is
    #: processed is its own neighbour set, so a decode step can read and rebuild it from two table rows
    cache_is_neighbors: bool = False

    def neighbor_table(self, t0: int, t1: int) -> Tensor:
        if t0 < 0 or t1 <= t0:
            raise InputError(f"invalid position range [{t0}, {t1})")
        return torch.from_numpy(self._dedupe(self._table_np(np.arange(t0, t1, dtype=np.int64))))

    def neighbors(self, t: int) -> list[int]:
        row = self._dedupe(self._table_np(np.array([t], dtype=np.int64)))[0]
        return [int(j) for j in row if j >= 0]

    def _dedupe(self, table: np.ndarray) -> np.ndarray:
        # Several levels may round to the same lattice point; N(t) is a set, so keep the first slot.
        # Built-in patterns list positions non-increasing along levels (proved for the lattice in
        # translation.py), so duplicates are adjacent; the general loop is kept for other patterns.
        if table.shape[1] <= 1 or self.distinct_levels:
            return table
        out = table.copy()
        adjacent = (table[:, 1:] == table[:, :-1]) & (table[:, 1:] >= 0)
        out[:, 1:][adjacent] = -1
        srt = np.sort(out, axis=1)
        if ((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any():
            for w in range(1, table.shape[1]):
                dup = (out[:, w : w + 1] == out[:, :w]).any(axis=1) & (out[:, w] >= 0)
                out[dup, w] = -1
        return out

    def cache_size(self, n: int) -> int:
        if self.cache_is_neighbors and n > 1:
            # needed(t) = sorted(N(t)): the peak is the largest row of the deduplicated neighbour table,
            # one vectorised pass instead of n calls of needed()
            return int((self.neighbor_table(0, n) >= 0).sum(dim=1).max())
        return max((len(self.needed(t)) for t in range(n)), default=0)

    def nnz(self, n: int) -> int:
        return int((self.neighbor_table(0, n) >= 0).sum()) if n > 0 else 0

    def neighbors_per_token(self, n: int) -> int:
        """|N(n - 1)|: neighbours of the last token of an n-token sequence."""
        return len(self.neighbors(n - 1))

    def __repr__(self) -> str:
        return f"Pattern({self.name})"
