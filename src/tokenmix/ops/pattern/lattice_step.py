"""The host bookkeeping of one neighbour-set decode step, shared by every backend's ``lattice_step``.

A pattern whose decode cache is its neighbour set (the lattice, Fenwick: ``cache_is_neighbors``)
keeps, beside its slot-stable key/value storage, the sorted positions it holds and their storage
slots as host numpy arrays. One decoded token at position ``pos`` reads the positions of its table
row, writes its key and output to the never-used slot ``end``, and leaves a cache holding the
positions of the next row. The numba kernel, the Triton launch and the torch reference each take
the storage tensors, the score scale and this one record: which positions are held where, which
are read and which are kept is one idea, so it travels as one argument.

Why host numpy. The lookups are a few binary searches over ~log n (pow2) to ~sqrt n (sq1) sorted
positions; on the host they cost less than one device round trip, and the numba kernel reads the
arrays in place.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class LatticeStep(NamedTuple):
    """One token's bookkeeping on a neighbour-set cache. A NamedTuple rather than a frozen dataclass:
    one is made per decoded token, and it costs ~0.15 us to make where the dataclass costs ~0.45 us
    (of a ~30 us step); the numba kernel takes its fields unpacked, in this order.

    Attributes:
        held, hslot: int64 numpy [S], the sorted positions the cache holds and their storage slots.
        end: the storage slot (< cap) the token's key and output go to; never written before.
        row, nxt: int64 numpy table rows of ``pos`` and ``pos + 1`` (absolute positions, -1 = none).
        pos: the token's position.
    """

    held: np.ndarray
    hslot: np.ndarray
    end: int
    row: np.ndarray
    nxt: np.ndarray
    pos: int

    def slots(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The lookups in numpy: (read [W] the storage slots of ``row``, -1 kept; keep [S'] the next
        cache's sorted positions; their slots [S'], ``end`` for pos), or None if a position the rows
        name is not held or pos + 1 does not read pos."""
        keep = np.sort(self.nxt[self.nxt >= 0])
        others = keep[keep != self.pos]  # held already; pos itself is the token, going to slot end
        if len(others) == len(keep):
            return None
        wanted = np.concatenate([self.row, others])
        named = wanted >= 0
        at = np.searchsorted(self.held, wanted[named])
        if (at >= len(self.held)).any() or (self.held[at.clip(max=len(self.held) - 1)] != wanted[named]).any():
            return None
        slot = np.full(len(wanted), -1, np.int64)
        slot[named] = self.hslot[at]
        new_slots = np.full(len(keep), self.end, np.int64)
        new_slots[keep != self.pos] = slot[len(self.row) :]
        return slot[: len(self.row)], keep, new_slots


__all__ = ["LatticeStep"]
