"""Decode cache of pattern recurrences: the positions later tokens will read, with their keys and outputs.

The held entries live in preallocated storage that grows by doubling, so appending a token costs
O(H (K + V)) amortised: a decode step of an exact pattern (whose cache is every earlier position,
O(n)) never re-copies the cache. Eviction of a contiguous prefix (exact patterns, windows) only
advances a start offset; other patterns (the lattice, whose cache is O(log n) scattered positions)
keep exactly the needed positions in fresh storage each step, O(|cache|).

Each call returns a new ``PatternCache``; several may share one storage. A cache appends in place
only if it is the latest one on its storage (nothing was written after its entries); extending an
older one (a branch) copies its entries first, so every cache returned stays valid; so does an
append that autograd records (training through states), whose inputs a backward may still need.

Single-token decode of a contiguous cache (``next_slot`` / ``advanced``): a caller that knows the
storage slots its token reads (fixed distances back from the new slot) writes the token's entry
straight into the storage and gathers from it, with no position lookup and no per-step tensors
beyond the entry itself; ``extend`` stays the general path and both keep the same invariants.

Lattice decode (``lattice_storage`` / ``lattice_appended``): a cache whose positions are scattered
(the lattice, Fenwick) lives on slot-stable storage, keys and values in one [2, B, cap, H, K]
tensor written once per slot in order; the cache is the list of its (position, slot) pairs. A step
writes its token into the next never-used slot and the next cache keeps other pairs, so no entry
moves; when the storage is full, or an older cache is stepped again, the live entries are copied
into fresh storage of twice their number first. The general paths read such a cache through
``keys`` / ``values`` gathered in position order.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.mixers.base import MixerState

_MIN_CAPACITY = 16

#: How a decode step reads a cache, chosen once when the cache is made (``StructuredRecurrence.
#: decode_strategy``) and kept by every cache that follows from it:
#:     fixed_distance  translation-invariant patterns with score softmaxes: the cache is the contiguous
#:                     suffix of positions, a token reads fixed distances back in the storage (one
#:                     compiled call); row padding is a per-row mask of that read
#:     neighbor_set    patterns whose cache is their neighbour set (the lattices, Fenwick) with score
#:                     softmaxes: slot-stable storage, one compiled call finds, reads and writes
#:     general         anything else (gate-based coefficients): the table lookup and tensor ops
#: Whatever the strategy, a step that autograd records (parameters or a cache that require grad)
#: runs the general step's differentiable arithmetic; the compiled reads never record.
STRATEGIES = ("fixed_distance", "neighbor_set", "general")


def _records_grad(store: "_Storage", *new: Tensor) -> bool:
    """Whether an append of ``new`` tensors to ``store`` would be recorded by autograd: then it goes
    to fresh storage, since the held views may be saved for a backward that an in-place write would
    invalidate."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in (*new, store.keys, store.values))


class _Storage:
    """Shared buffers: keys [B, cap, H, K], values [B, cap, H, V], positions [cap]; ``end`` = slots written.

    ``positions`` is read only by caches that are not ``contiguous`` (a contiguous cache's positions
    follow from its position and size; ``advanced`` does not write them)."""

    def __init__(
        self, keys: Tensor, values: Tensor, positions: Tensor | None, end: int, kv: Tensor | None = None
    ) -> None:
        self.keys, self.values, self.positions, self.end = keys, values, positions, end
        # fixed with the buffers; read on every decode step (plain attributes: no shape lookups there)
        self.capacity = keys.shape[1]
        self.entry_numel = keys.shape[2] * keys.shape[3] + values.shape[2] * values.shape[3]  # scalars per position
        # slot-stable storage of the lattice decode: keys and values are kv[0] and kv[1] of one
        # [2, B, cap, H, K] tensor (with its numpy view, what the compiled step reads); its slots
        # are written once each, in order, and positions live in the caches, not here
        self.kv = kv
        self.kv_np = kv.numpy() if kv is not None and kv.device.type == "cpu" and not kv.requires_grad else None

    @classmethod
    def holding(cls, parts: list[tuple[Tensor, Tensor, Tensor]], capacity: int) -> "_Storage":
        """New storage of ``capacity`` slots whose first entries are the (keys, values, positions) parts."""
        keys, values, _ = parts[0]
        b, _, h, k = keys.shape
        store = cls(
            keys.new_empty(b, capacity, h, k),
            values.new_empty(b, capacity, h, values.shape[-1]),
            torch.empty(capacity, dtype=torch.long),
            0,
        )
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

    strategy: str = "general"  # one of STRATEGIES: how a decode step reads this cache

    def __init__(
        self,
        owner: str,
        batch_size: int,
        position: int,
        store: _Storage,
        start: int,
        size: int,
        contiguous: bool = True,
        slotted: tuple[np.ndarray, np.ndarray, int] | None = None,
    ) -> None:
        self.owner, self.batch_size, self.position = owner, batch_size, position
        self._store, self._start, self._size = store, start, size
        # True when the held positions are exactly position - size .. position - 1 (every cache
        # built by ``extend(keep_from=...)``): storage slot start + i then holds position - size + i
        self.contiguous = contiguous
        # a lattice decode cache on slot-stable storage: (sorted positions held, their storage slots,
        # the storage's end when this cache was made); see ``lattice_storage``
        self._slotted = slotted

    @classmethod
    def empty(
        cls,
        owner: str,
        batch_size: int,
        heads: int,
        key_dim: int,
        value_dim: int,
        device,
        dtype,
        strategy: str = "general",
    ) -> "PatternCache":
        if strategy not in STRATEGIES:
            raise InputError(f"unknown decode strategy '{strategy}'; known: {', '.join(STRATEGIES)}")
        store = _Storage(
            torch.zeros(batch_size, _MIN_CAPACITY, heads, key_dim, device=device, dtype=dtype),
            torch.zeros(batch_size, _MIN_CAPACITY, heads, value_dim, device=device, dtype=dtype),
            torch.zeros(_MIN_CAPACITY, dtype=torch.long),
            0,
        )
        cache = cls(owner, batch_size, 0, store, 0, 0)
        cache.strategy = strategy
        return cache

    @classmethod
    def holding(
        cls, like: "PatternCache", position: int, positions: Tensor, keys: Tensor, values: Tensor
    ) -> "PatternCache":
        """A cache at ``position`` holding exactly the sorted ``positions`` [n] (keys [B', n, H, K],
        values [B', n, H, V], B' rows of its own), with ``like``'s owner, decode strategy and
        measured peaks, and no row padding: e.g. a group of rows cut from a batch, on a clock of
        their own (the state after a packed segment of a pattern on the document's clock)."""
        n = positions.shape[0]
        store = _Storage.holding([(keys, values, positions.to(torch.long))], max(_MIN_CAPACITY, n))
        contiguous = n == 0 or (int(positions[0]) == position - n and int(positions[-1]) == position - 1)
        cache = cls(like.owner, keys.shape[0], position, store, 0, n, contiguous=contiguous).carry_over(like)
        cache.start, cache.max_start, cache.min_start = None, 0, 0
        return cache

    def carry_over(self, other: MixerState) -> "PatternCache":
        """``MixerState.carry_over`` and the decode strategy, which outlives every update."""
        MixerState.carry_over(self, other)
        self.strategy = other.strategy
        return self

    def __repr__(self) -> str:
        return (
            f"PatternCache(strategy={self.strategy}, position={self.position}, cached={self._size}, "
            f"batch={self.batch_size})"
        )

    @property
    def positions(self) -> Tensor:
        if self._slotted is not None:
            return torch.from_numpy(self._slotted[0])
        if self.contiguous:
            return torch.arange(self.position - self._size, self.position)
        return self._store.positions[self._start : self._start + self._size]

    def held_positions(self) -> np.ndarray:
        """``positions`` as a sorted int64 numpy array (what the compiled decode steps read)."""
        if self._slotted is not None:
            return self._slotted[0]
        if self.contiguous:
            return np.arange(self.position - self._size, self.position, dtype=np.int64)
        return self.positions.numpy()

    @property
    def keys(self) -> Tensor:
        if self._slotted is not None:  # gathered in position order (the general paths' view)
            return self._store.keys[:, torch.from_numpy(self._slotted[1]).to(self._store.keys.device)]
        return self._store.keys[:, self._start : self._start + self._size]

    @property
    def values(self) -> Tensor:
        if self._slotted is not None:
            return self._store.values[:, torch.from_numpy(self._slotted[1]).to(self._store.values.device)]
        return self._store.values[:, self._start : self._start + self._size]

    def tensors(self) -> dict[str, Tensor]:
        return {"keys": self.keys, "values": self.values}

    def cached_positions(self) -> int:
        return self._size

    def numel_per_batch(self) -> int:
        # from the storage's shapes: ``observe`` calls this before every decoded token, and building
        # the ``tensors()`` views there would cost more than an append
        return self._size * self._store.entry_numel

    def next_slot(self) -> tuple["PatternCache", int]:
        """(cache, at): this cache, or a copy of it in fresh doubled storage, whose storage slot
        ``at`` (right after its entries) the entry of position ``self.position`` may be written to
        in place: nothing else holds it and no recorded autograd op reads the storage.

        Only for a ``contiguous`` cache; with ``buffers`` and ``advanced`` it appends one token
        without ``extend``'s position arithmetic (the same storage rules: append in place only to
        the latest cache on its storage, else copy).
        """
        store, at = self._store, self._start + self._size
        if store.end == at and at < store.capacity and not _records_grad(store):
            return self, at
        fresh = _Storage.holding([(self.keys, self.values, self.positions)], max(_MIN_CAPACITY, 2 * (self._size + 1)))
        copy = type(self)(self.owner, self.batch_size, self.position, fresh, 0, self._size, self.contiguous)
        return copy.carry_over(self), self._size

    def buffers(self) -> tuple[Tensor, Tensor]:
        """The whole storage: keys [B, cap, H, K], values [B, cap, H, V]; slot start + i holds
        entry i of ``keys`` / ``values`` (``next_slot`` says which slot the next position takes)."""
        return self._store.keys, self._store.values

    def advanced(self, at: int, keep_from: int) -> "PatternCache":
        """The cache after the caller wrote position ``self.position``'s key and value into slot
        ``at`` of ``buffers()`` (``at`` from ``next_slot`` on this cache), holding the positions
        >= ``keep_from``, as ``extend`` would return it."""
        store = self._store
        store.end = at + 1
        drop = self._contiguous_drop(keep_from, self._size + 1)
        return type(self)(
            self.owner, self.batch_size, self.position + 1, store, self._start + drop, self._size + 1 - drop
        ).carry_over(self)

    def lattice_storage(self) -> tuple["PatternCache", Tensor, np.ndarray | None, np.ndarray, np.ndarray, int]:
        """Where a lattice decode step may write its token: (cache, kv, kv_np, held, slots, end).

        ``cache`` holds this cache's entries on slot-stable storage kv [2, B, cap, H, K] (numpy view
        kv_np), the sorted positions ``held`` at storage ``slots``, and slot ``end`` has never been
        written. That is this cache itself when it is the latest on its slot-stable storage and
        the storage has room; otherwise its entries are copied into fresh storage of twice their
        number (at least 16 slots), so a step costs O(|N(t)|) amortised and every cache returned
        earlier stays valid (nothing is overwritten, the same rule as ``next_slot``). Keys and values
        must have one width (one kv tensor holds both).
        """
        store = self._store
        if (
            self._slotted is not None
            and store.kv is not None
            and store.end == self._slotted[2]
            and store.end < store.capacity
            and not _records_grad(store)
        ):
            held, slots, end = self._slotted
            return self, store.kv, store.kv_np, held, slots, end
        keys, values = self.keys, self.values
        if keys.shape[-1] != values.shape[-1]:
            raise InputError(
                f"slot-stable storage holds keys and values of one width, got {keys.shape[-1]} and {values.shape[-1]}"
            )
        held, m = self.held_positions().copy(), self._size
        b, _, h, k = keys.shape
        kv = keys.new_empty(2, b, max(_MIN_CAPACITY, 2 * (m + 1)), h, k)
        kv[0, :, :m], kv[1, :, :m] = keys, values
        fresh = _Storage(kv[0], kv[1], None, m, kv=kv)
        cache = type(self)(
            self.owner,
            self.batch_size,
            self.position,
            fresh,
            0,
            m,
            contiguous=False,
            slotted=(held, np.arange(m, dtype=np.int64), m),
        ).carry_over(self)
        return cache, kv, fresh.kv_np, held, cache._slotted[1], m

    def lattice_appended(self, held: np.ndarray, slots: np.ndarray, new_position: int) -> "PatternCache":
        """The cache after a lattice step wrote position ``self.position`` into slot ``end`` of
        this cache's storage (from ``lattice_storage``), holding the sorted positions ``held`` at
        storage ``slots``."""
        store = self._store
        store.end = self._slotted[2] + 1
        return type(self)(
            self.owner,
            self.batch_size,
            new_position,
            store,
            0,
            len(held),
            contiguous=False,
            slotted=(held, slots, store.end),
        ).carry_over(self)

    def _contiguous_drop(self, keep_from: int, at_most: int) -> int:
        """Entries of a contiguous cache (positions position - size ..) before ``keep_from``, <= at_most."""
        return min(max(keep_from - (self.position - self._size), 0), at_most)

    def slots(self, wanted: Tensor) -> Tensor:
        """Indices into the cache of absolute positions ``wanted`` (any shape, -1 kept as -1)."""
        held = self.positions
        ok = wanted >= 0
        slot = torch.searchsorted(held, wanted.clamp(min=0))
        slot = slot.clamp(max=max(self._size - 1, 0))
        found = ok & (held[slot] == wanted) if self._size else torch.zeros_like(ok)
        if (ok & ~found).any():
            missing = wanted[ok & ~found][0].item()
            raise InputError(
                f"cache does not hold position {missing} that the pattern reads; was the "
                "state produced with another pattern or sequence?"
            )
        return torch.where(ok, slot, torch.full_like(slot, -1))

    def extend(
        self,
        keys: Tensor,
        values: Tensor,
        new_position: int,
        keep_from: int | None = None,
        keep: list[int] | None = None,
    ) -> "PatternCache":
        """The cache after the tokens self.position .. new_position - 1 (keys [B, n, H, K], values
        [B, n, H, V]) were produced, holding the positions >= ``keep_from`` (a contiguous suffix) or
        exactly the sorted positions ``keep``."""
        n = keys.shape[1]
        new_pos = torch.arange(self.position, new_position, dtype=torch.long)
        if n != new_pos.shape[0]:
            raise InputError(f"{n} new entries for positions {self.position}..{new_position - 1}")
        if keep_from is None:
            return self._select(keys, values, new_pos, new_position, keep)
        # entries are sorted by position: evict the first `drop` of (held, then new)
        if self.contiguous:  # held: position - size .. position - 1
            drop = self._contiguous_drop(keep_from, self._size)
        else:
            drop = int(torch.searchsorted(self.positions, torch.tensor(keep_from)).item()) if self._size else 0
        if n and keep_from > self.position:
            drop = self._size + min(n, keep_from - self.position)
        size = self._size + n - drop
        store, at = self._store, self._start + self._size
        if self._size == 0 and drop == 0:
            # a first segment (a training forward, a prefill): its tensors become the storage as they
            # are, no copy; the first append after it finds the storage full and doubles it
            store, start = _Storage(keys, values, new_pos, n), 0
        elif (
            self._slotted is None
            and store.end == at
            and at + n <= store.capacity
            and not _records_grad(store, keys, values)
        ):
            store.write(at, keys, values, new_pos)  # the latest cache on this storage: append in place
            start = self._start + drop
        else:  # full, or an older cache being extended (a branch): fresh storage, doubled
            hold = slice(min(drop, self._size), self._size)
            new = slice(max(0, drop - self._size), n)
            store = _Storage.holding(
                [
                    (self.keys[:, hold], self.values[:, hold], self.positions[hold]),
                    (keys[:, new], values[:, new], new_pos[new]),
                ],
                max(_MIN_CAPACITY, 2 * size),
            )
            start = 0
        return type(self)(
            self.owner, self.batch_size, new_position, store, start, size, contiguous=self.contiguous or self._size == 0
        ).carry_over(self)

    def _select(
        self, keys: Tensor, values: Tensor, new_pos: Tensor, new_position: int, keep: list[int]
    ) -> "PatternCache":
        all_pos = torch.cat([self.positions, new_pos])
        slot = torch.searchsorted(all_pos, torch.as_tensor(keep, dtype=torch.long))
        kept = (torch.cat([self.keys, keys], 1)[:, slot], torch.cat([self.values, values], 1)[:, slot], all_pos[slot])
        store = _Storage.holding([kept], max(_MIN_CAPACITY, len(keep)))
        return type(self)(self.owner, self.batch_size, new_position, store, 0, len(keep), contiguous=False).carry_over(
            self
        )
