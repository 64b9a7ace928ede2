"""Decode cache of pattern recurrences: the positions later tokens will read, with their keys and outputs.

The held entries live in preallocated storage that grows by doubling, so appending a token costs
O(H (K + V)) amortised: a decode step of an exact pattern (whose cache is every earlier position,
O(n)) never re-copies the cache. Eviction of a contiguous prefix (exact patterns, windows) only
advances a start offset; other patterns (the lattice, whose cache is O(log n) scattered positions)
keep exactly the needed positions in fresh storage each step, O(|cache|).

Each call returns a new ``PatternCache``; several may share one storage. A cache appends in place
only if it is the latest one on its storage (nothing was written after its entries); extending an
older one (a branch) copies its entries first, so every cache returned stays valid.
"""
from __future__ import annotations

import torch
from torch import Tensor

from tokenmix.mixers.base import MixerState

_MIN_CAPACITY = 16


class _Storage:
    """Shared buffers: keys [B, cap, H, K], values [B, cap, H, V], positions [cap]; ``end`` = slots written."""

    def __init__(self, keys: Tensor, values: Tensor, positions: Tensor, end: int) -> None:
        self.keys, self.values, self.positions, self.end = keys, values, positions, end

    @property
    def capacity(self) -> int:
        return self.positions.shape[0]

    @classmethod
    def holding(cls, parts: list[tuple[Tensor, Tensor, Tensor]], capacity: int) -> "_Storage":
        """New storage of ``capacity`` slots whose first entries are the (keys, values, positions) parts."""
        keys, values, _ = parts[0]
        b, _, h, k = keys.shape
        store = cls(keys.new_empty(b, capacity, h, k), values.new_empty(b, capacity, h, values.shape[-1]),
                    torch.empty(capacity, dtype=torch.long), 0)
        for part in parts:
            store.write(store.end, *part)
        return store

    def write(self, at: int, keys: Tensor, values: Tensor, positions: Tensor) -> None:
        n = positions.shape[0]
        self.keys[:, at : at + n] = keys
        self.values[:, at : at + n] = values
        self.positions[at : at + n] = positions
        self.end = at + n


class PatternCache(MixerState):
    """Cached positions of one layer.

    Attributes (views of the held entries):
        positions: [P] long, sorted absolute positions held.
        keys: [B, P, H, K] their keys (score-based coefficients read them).
        values: [B, P, H, V] their outputs y_j (read through B).
        position: number of tokens seen so far.
    """

    def __init__(self, owner: str, batch_size: int, position: int, store: _Storage, start: int, size: int) -> None:
        self.owner, self.batch_size, self.position = owner, batch_size, position
        self._store, self._start, self._size = store, start, size

    @classmethod
    def empty(cls, owner: str, batch_size: int, heads: int, key_dim: int, value_dim: int, device, dtype
              ) -> "PatternCache":
        store = _Storage(torch.zeros(batch_size, _MIN_CAPACITY, heads, key_dim, device=device, dtype=dtype),
                         torch.zeros(batch_size, _MIN_CAPACITY, heads, value_dim, device=device, dtype=dtype),
                         torch.zeros(_MIN_CAPACITY, dtype=torch.long), 0)
        return cls(owner, batch_size, 0, store, 0, 0)

    @property
    def positions(self) -> Tensor:
        return self._store.positions[self._start : self._start + self._size]

    @property
    def keys(self) -> Tensor:
        return self._store.keys[:, self._start : self._start + self._size]

    @property
    def values(self) -> Tensor:
        return self._store.values[:, self._start : self._start + self._size]

    def tensors(self) -> dict[str, Tensor]:
        return {"keys": self.keys, "values": self.values}

    def cached_positions(self) -> int:
        return self._size

    def slots(self, wanted: Tensor) -> Tensor:
        """Indices into the cache of absolute positions ``wanted`` (any shape, -1 kept as -1)."""
        held = self.positions
        ok = wanted >= 0
        slot = torch.searchsorted(held, wanted.clamp(min=0))
        slot = slot.clamp(max=max(self._size - 1, 0))
        found = ok & (held[slot] == wanted) if self._size else torch.zeros_like(ok)
        if (ok & ~found).any():
            missing = wanted[ok & ~found][0].item()
            raise ValueError(f"cache does not hold position {missing} that the pattern reads; was the "
                             "state produced with another pattern or sequence?")
        return torch.where(ok, slot, torch.full_like(slot, -1))

    def extend(self, keys: Tensor, values: Tensor, new_position: int, keep_from: int | None = None,
               keep: list[int] | None = None) -> "PatternCache":
        """The cache after the tokens self.position .. new_position - 1 (keys [B, n, H, K], values
        [B, n, H, V]) were produced, holding the positions >= ``keep_from`` (a contiguous suffix) or
        exactly the sorted positions ``keep``."""
        n = keys.shape[1]
        new_pos = torch.arange(self.position, new_position, dtype=torch.long)
        if n != new_pos.shape[0]:
            raise ValueError(f"{n} new entries for positions {self.position}..{new_position - 1}")
        if keep_from is None:
            return self._select(keys, values, new_pos, new_position, keep)
        # entries are sorted by position: evict the first `drop` of (held, then new)
        drop = int(torch.searchsorted(self.positions, torch.tensor(keep_from)).item()) if self._size else 0
        if n and keep_from > self.position:
            drop = self._size + min(n, keep_from - self.position)
        size = self._size + n - drop
        store, at = self._store, self._start + self._size
        if self._size == 0 and drop == 0:
            # a first segment (a training forward, a prefill): its tensors become the storage as they
            # are, no copy; the first append after it finds the storage full and doubles it
            store, start = _Storage(keys, values, new_pos, n), 0
        elif store.end == at and at + n <= store.capacity:
            store.write(at, keys, values, new_pos)  # the latest cache on this storage: append in place
            start = self._start + drop
        else:  # full, or an older cache being extended (a branch): fresh storage, doubled
            hold = slice(min(drop, self._size), self._size)
            new = slice(max(0, drop - self._size), n)
            store = _Storage.holding([(self.keys[:, hold], self.values[:, hold], self.positions[hold]),
                                      (keys[:, new], values[:, new], new_pos[new])], max(_MIN_CAPACITY, 2 * size))
            start = 0
        return PatternCache(self.owner, self.batch_size, new_position, store, start, size).carry_peaks(self)

    def _select(self, keys: Tensor, values: Tensor, new_pos: Tensor, new_position: int, keep: list[int]
                ) -> "PatternCache":
        all_pos = torch.cat([self.positions, new_pos])
        slot = torch.searchsorted(all_pos, torch.as_tensor(keep, dtype=torch.long))
        kept = (torch.cat([self.keys, keys], 1)[:, slot], torch.cat([self.values, values], 1)[:, slot], all_pos[slot])
        store = _Storage.holding([kept], max(_MIN_CAPACITY, len(keep)))
        return PatternCache(self.owner, self.batch_size, new_position, store, 0, len(keep)).carry_peaks(self)
