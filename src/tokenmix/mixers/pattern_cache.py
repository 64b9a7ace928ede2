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

How the held positions sit in the storage is one of three layouts, a class each (the cache holds
one as ``entries``; every view and append asks it, nothing branches on the layout):

    SuffixEntries   the contiguous suffix position - size .. position - 1 in slots start .. start +
                    size (exact patterns, windows, a KV cache): positions follow from the slot, and
                    a single-token step writes its entry straight into the next slot
                    (``next_slot`` / ``advanced``)
    ListedEntries   sorted scattered positions, listed beside their slots (what a selection of
                    ``extend(keep=...)`` leaves)
    SlottedEntries  slot-stable storage of the neighbour-set decode (the lattice, Fenwick): keys and
                    values in one [2, B, cap, H, K] tensor written once per slot in order, the cache
                    a list of (position, slot) pairs, so a step moves no entry
                    (``lattice_storage`` / ``lattice_appended``); the general paths read it gathered
                    in position order

How a decode step reads a cache is its ``decode`` (a ``DecodeStrategy`` object, chosen once by the
mixer that makes the cache and kept by every cache that follows from it): the step calls it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.mixers.base import MixerState

_MIN_CAPACITY = 16


def _records_grad(store: "_Storage", *new: Tensor) -> bool:
    """Whether an append of ``new`` tensors to ``store`` would be recorded by autograd: then it goes
    to fresh storage, since the held views may be saved for a backward that an in-place write would
    invalidate."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in (*new, store.keys, store.values))


class _Storage:
    """Shared buffers: keys [B, cap, H, K], values [B, cap, H, V], positions [cap]; ``end`` = slots written.

    ``positions`` is read only by ``ListedEntries`` (a suffix's positions follow from its position
    and size; ``advanced`` does not write them)."""

    def __init__(
        self, keys: Tensor, values: Tensor, positions: Tensor | None, end: int, kv: Tensor | None = None
    ) -> None:
        self.keys, self.values, self.positions, self.end = keys, values, positions, end
        # fixed with the buffers; read on every decode step (plain attributes: no shape lookups there)
        self.capacity = keys.shape[1]
        self.entry_numel = keys.shape[2] * keys.shape[3] + values.shape[2] * values.shape[3]  # scalars per position
        # slot-stable storage (SlottedEntries): keys and values are kv[0] and kv[1] of one
        # [2, B, cap, H, K] tensor, with its numpy view, what the compiled step reads
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


class _Entries(ABC):
    """The entries a cache holds on its storage: ``size`` of them, in a layout of the subclass."""

    contiguous: ClassVar[bool] = False  # the held positions are exactly position - size .. position - 1

    def __init__(self, store: _Storage, size: int) -> None:
        self.store, self.size = store, size

    @abstractmethod
    def positions(self, position: int) -> Tensor:
        """[size] long: the sorted positions held by a cache at ``position``."""

    def held(self, position: int) -> np.ndarray:
        """``positions`` as a sorted int64 numpy array (what the compiled decode steps read)."""
        return self.positions(position).numpy()

    @property
    @abstractmethod
    def keys(self) -> Tensor:
        """[B, size, H, K] in position order."""

    @property
    @abstractmethod
    def values(self) -> Tensor:
        """[B, size, H, V] in position order."""

    def drop_before(self, keep_from: int, position: int) -> int:
        """How many held entries lie before position ``keep_from``."""
        return int(torch.searchsorted(self.positions(position), torch.tensor(keep_from)).item()) if self.size else 0

    def append_at(self, n: int) -> int | None:
        """The storage slot where ``n`` new entries may be written in place (right after these, the
        latest on their storage, with room); None: they go to fresh storage."""
        return None

    def kept(self, layout: type["_SlicedEntries"], drop: int, size: int) -> "_Entries":
        """These entries on the same storage after an in-place append at ``append_at``, ``drop``
        evicted from the front, ``size`` left, in ``layout``."""
        raise NotImplementedError(f"{type(self).__name__} does not append in place")


class _SlicedEntries(_Entries):
    """Entries in the storage slots start .. start + size (a suffix, or a listed selection)."""

    def __init__(self, store: _Storage, start: int, size: int) -> None:
        super().__init__(store, size)
        self.start = start

    @property
    def keys(self) -> Tensor:
        return self.store.keys[:, self.start : self.start + self.size]

    @property
    def values(self) -> Tensor:
        return self.store.values[:, self.start : self.start + self.size]

    def append_at(self, n: int) -> int | None:
        at = self.start + self.size
        return at if self.store.end == at and at + n <= self.store.capacity else None

    def kept(self, layout: type["_SlicedEntries"], drop: int, size: int) -> "_Entries":
        return layout(self.store, self.start + drop, size)


class SuffixEntries(_SlicedEntries):
    """The contiguous suffix of positions: slot start + i holds position position - size + i."""

    contiguous = True

    def positions(self, position: int) -> Tensor:
        return torch.arange(position - self.size, position)

    def held(self, position: int) -> np.ndarray:
        return np.arange(position - self.size, position, dtype=np.int64)

    def drop_before(self, keep_from: int, position: int, at_most: int | None = None) -> int:
        return min(max(keep_from - (position - self.size), 0), self.size if at_most is None else at_most)

    def next_slot(self, position: int) -> tuple["SuffixEntries", int]:
        """(entries, at): these entries, or a copy of them in fresh doubled storage, whose slot ``at``
        (right after them) the entry of ``position`` may be written to in place: nothing else holds
        it and no recorded autograd op reads the storage."""
        store, at = self.store, self.start + self.size
        if store.end == at and at < store.capacity and not _records_grad(store):
            return self, at
        parts = [(self.keys, self.values, self.positions(position))]
        return SuffixEntries(_Storage.holding(parts, max(_MIN_CAPACITY, 2 * (self.size + 1))), 0, self.size), self.size

    def advanced(self, at: int, keep_from: int, position: int) -> "SuffixEntries":
        """The entries after ``position``'s key and value were written into slot ``at`` (from
        ``next_slot``), holding the positions >= ``keep_from``."""
        self.store.end = at + 1
        drop = self.drop_before(keep_from, position, self.size + 1)
        return SuffixEntries(self.store, self.start + drop, self.size + 1 - drop)


class ListedEntries(_SlicedEntries):
    """Sorted scattered positions: slot start + i holds position store.positions[start + i]."""

    def positions(self, position: int) -> Tensor:
        return self.store.positions[self.start : self.start + self.size]


class SlottedEntries(_Entries):
    """Slot-stable storage: the sorted positions ``held_at`` in the storage ``slots``; slot ``end``
    (the storage's end when these entries were made) has never been written."""

    def __init__(self, store: _Storage, held: np.ndarray, slots: np.ndarray, end: int) -> None:
        super().__init__(store, len(held))
        self.held_at, self.slots, self.end = held, slots, end

    @classmethod
    def holding(cls, keys: Tensor, values: Tensor, held: np.ndarray) -> "SlottedEntries":
        """Fresh slot-stable storage of twice the entries' number (at least 16 slots) holding keys
        [B, m, H, K] and values [B, m, H, K] (one width: one kv tensor holds both) at ``held``."""
        if keys.shape[-1] != values.shape[-1]:
            raise InputError(
                f"slot-stable storage holds keys and values of one width, got {keys.shape[-1]} and {values.shape[-1]}"
            )
        b, m, h, k = keys.shape
        kv = keys.new_empty(2, b, max(_MIN_CAPACITY, 2 * (m + 1)), h, k)
        kv[0, :, :m], kv[1, :, :m] = keys, values
        return cls(_Storage(kv[0], kv[1], None, m, kv=kv), held, np.arange(m, dtype=np.int64), m)

    def positions(self, position: int) -> Tensor:
        return torch.from_numpy(self.held_at)

    def held(self, position: int) -> np.ndarray:
        return self.held_at

    @property
    def keys(self) -> Tensor:  # gathered in position order (the general paths' view)
        return self.store.keys[:, torch.from_numpy(self.slots).to(self.store.keys.device)]

    @property
    def values(self) -> Tensor:
        return self.store.values[:, torch.from_numpy(self.slots).to(self.store.values.device)]

    def writable(self) -> bool:
        """Whether a step may write slot ``end`` in place: these are the latest entries on their
        storage, it has room, and no recorded autograd op reads it."""
        store = self.store
        return store.end == self.end and store.end < store.capacity and not _records_grad(store)

    def appended(self, held: np.ndarray, slots: np.ndarray) -> "SlottedEntries":
        """The entries after a step wrote slot ``end``, holding the sorted positions ``held`` at ``slots``."""
        self.store.end = self.end + 1
        return SlottedEntries(self.store, held, slots, self.store.end)


class DecodeStrategy(ABC):
    """How a mixer's decode step reads and writes its cache: chosen once, by the mixer, when the
    cache is made (``PatternCache.empty``), and kept by every cache that follows from it."""

    name: ClassVar[str]

    @abstractmethod
    def step(
        self, mixer: Any, x_t: Tensor, qkv_t: Tensor, state: "PatternCache", backend: str = "torch"
    ) -> tuple[Tensor, "PatternCache"]:
        """One token: (y_t [B, H, V], next cache) from its layer input x_t [B, 1, D] and its q, k, v
        qkv_t [B, 3, H, K]; its reads run on ``backend`` (ops/pattern/backend.py, asked once per
        call by the mixer)."""


class PatternCache(MixerState):
    """Cached positions of one layer.

    Attributes (views of the held entries):
        positions: [P] long, sorted absolute positions held.
        keys: [B, P, H, K] their keys (score-based coefficients read them).
        values: [B, P, H, V] their outputs y_j (read through B).
        position: number of tokens seen so far.
        entries: the held entries in their storage layout (module docstring).
        decode: how a decode step reads this cache (``DecodeStrategy``); None for a cache that no
            strategy reads (attention's KV cache: its mixer's own step).
        backend: the backend of the call that made this cache (ops/pattern/backend.py: numba,
            torch, triton), recorded by the mixer; None before any call (an empty cache).
    """

    decode: DecodeStrategy | None = None
    backend: str | None = None

    def __init__(self, owner: str, batch_size: int, position: int, entries: _Entries) -> None:
        self.owner, self.batch_size, self.position, self.entries = owner, batch_size, position, entries

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
        decode: DecodeStrategy | None = None,
    ) -> "PatternCache":
        store = _Storage(
            torch.zeros(batch_size, _MIN_CAPACITY, heads, key_dim, device=device, dtype=dtype),
            torch.zeros(batch_size, _MIN_CAPACITY, heads, value_dim, device=device, dtype=dtype),
            torch.zeros(_MIN_CAPACITY, dtype=torch.long),
            0,
        )
        cache = cls(owner, batch_size, 0, SuffixEntries(store, 0, 0))
        cache.decode = decode
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
        entries = (SuffixEntries if contiguous else ListedEntries)(store, 0, n)
        cache = cls(like.owner, keys.shape[0], position, entries).carry_over(like)
        cache.start, cache.max_start, cache.min_start = None, 0, 0
        return cache

    def carry_over(self, other: MixerState) -> "PatternCache":
        """``MixerState.carry_over``, the decode strategy, which outlives every update, and the
        backend (until the next call records its own)."""
        MixerState.carry_over(self, other)
        self.decode, self.backend = other.decode, other.backend
        return self

    def _following(self, position: int, entries: _Entries) -> "PatternCache":
        """The cache that follows this one: at ``position``, holding ``entries``."""
        return type(self)(self.owner, self.batch_size, position, entries).carry_over(self)

    @property
    def strategy(self) -> str:
        """The decode strategy's name (what ``tokenmix bench decode`` reports)."""
        return "general" if self.decode is None else self.decode.name

    def __repr__(self) -> str:
        return (
            f"PatternCache(strategy={self.strategy}, backend={self.backend}, position={self.position}, "
            f"cached={self.entries.size}, batch={self.batch_size})"
        )

    @property
    def contiguous(self) -> bool:
        """True when the held positions are exactly position - size .. position - 1."""
        return self.entries.contiguous

    @property
    def positions(self) -> Tensor:
        return self.entries.positions(self.position)

    def held_positions(self) -> np.ndarray:
        """``positions`` as a sorted int64 numpy array (what the compiled decode steps read)."""
        return self.entries.held(self.position)

    @property
    def keys(self) -> Tensor:
        return self.entries.keys

    @property
    def values(self) -> Tensor:
        return self.entries.values

    def tensors(self) -> dict[str, Tensor]:
        return {"keys": self.keys, "values": self.values}

    def cached_positions(self) -> int:
        return self.entries.size

    def numel_per_batch(self) -> int:
        # from the storage's shapes: ``observe`` calls this before every decoded token, and building
        # the ``tensors()`` views there would cost more than an append
        return self.entries.size * self.entries.store.entry_numel

    def buffers(self) -> tuple[Tensor, Tensor]:
        """The whole storage: keys [B, cap, H, K], values [B, cap, H, V] (for a suffix, slot start + i
        holds entry i of ``keys`` / ``values``; ``next_slot`` says which slot the next position takes)."""
        return self.entries.store.keys, self.entries.store.values

    def next_slot(self) -> tuple["PatternCache", int]:
        """(cache, at): this cache, or a copy of it in fresh doubled storage, whose storage slot
        ``at`` (right after its entries) the entry of position ``self.position`` may be written to
        in place. Only for a ``contiguous`` cache; with ``buffers`` and ``advanced`` it appends one
        token without ``extend``'s position arithmetic (the same storage rules)."""
        entries, at = self.entries.next_slot(self.position)
        return (self if entries is self.entries else self._following(self.position, entries)), at

    def advanced(self, at: int, keep_from: int) -> "PatternCache":
        """The cache after the caller wrote position ``self.position``'s key and value into slot
        ``at`` of ``buffers()`` (``at`` from ``next_slot`` on this cache), holding the positions
        >= ``keep_from``, as ``extend`` would return it."""
        return self._following(self.position + 1, self.entries.advanced(at, keep_from, self.position))

    def lattice_storage(self) -> tuple["PatternCache", Tensor, np.ndarray | None, np.ndarray, np.ndarray, int]:
        """Where a neighbour-set decode step may write its token: (cache, kv, kv_np, held, slots, end).

        ``cache`` holds this cache's entries on slot-stable storage kv [2, B, cap, H, K] (numpy view
        kv_np), the sorted positions ``held`` at storage ``slots``, and slot ``end`` has never been
        written. That is this cache itself when its ``SlottedEntries`` may be written in place;
        otherwise its entries are copied into fresh storage of twice their number, so a step costs
        O(|N(t)|) amortised and every cache returned earlier stays valid (nothing is overwritten).
        """
        entries = self.entries
        cache = self
        if not (isinstance(entries, SlottedEntries) and entries.writable()):
            entries = SlottedEntries.holding(self.keys, self.values, self.held_positions().copy())
            cache = self._following(self.position, entries)
        return cache, entries.store.kv, entries.store.kv_np, entries.held_at, entries.slots, entries.end

    def lattice_appended(self, held: np.ndarray, slots: np.ndarray, new_position: int) -> "PatternCache":
        """The cache after a lattice step wrote position ``self.position`` into slot ``end`` of
        this cache's storage (from ``lattice_storage``), holding the sorted positions ``held`` at
        storage ``slots``."""
        return self._following(new_position, self.entries.appended(held, slots))

    def slots(self, wanted: Tensor) -> Tensor:
        """Indices into the cache of absolute positions ``wanted`` (any shape, -1 kept as -1)."""
        held, size = self.positions, self.entries.size
        ok = wanted >= 0
        slot = torch.searchsorted(held, wanted.clamp(min=0))
        slot = slot.clamp(max=max(size - 1, 0))
        found = ok & (held[slot] == wanted) if size else torch.zeros_like(ok)
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
        held = self.entries
        drop = held.drop_before(keep_from, self.position)
        if n and keep_from > self.position:
            drop = held.size + min(n, keep_from - self.position)
        size = held.size + n - drop
        # a suffix stays a suffix; an empty cache becomes one
        layout = SuffixEntries if held.contiguous or held.size == 0 else ListedEntries
        at = held.append_at(n)
        if held.size == 0 and drop == 0:
            # a first segment (a training forward, a prefill): its tensors become the storage as they
            # are, no copy; the first append after it finds the storage full and doubles it
            entries = layout(_Storage(keys, values, new_pos, n), 0, n)
        elif at is not None and not _records_grad(held.store, keys, values):
            held.store.write(at, keys, values, new_pos)  # the latest cache on this storage: append in place
            entries = held.kept(layout, drop, size)
        else:  # full, or an older cache being extended (a branch): fresh storage, doubled
            hold = slice(min(drop, held.size), held.size)
            new = slice(max(0, drop - held.size), n)
            store = _Storage.holding(
                [
                    (self.keys[:, hold], self.values[:, hold], self.positions[hold]),
                    (keys[:, new], values[:, new], new_pos[new]),
                ],
                max(_MIN_CAPACITY, 2 * size),
            )
            entries = layout(store, 0, size)
        return self._following(new_position, entries)

    def _select(
        self, keys: Tensor, values: Tensor, new_pos: Tensor, new_position: int, keep: list[int]
    ) -> "PatternCache":
        all_pos = torch.cat([self.positions, new_pos])
        slot = torch.searchsorted(all_pos, torch.as_tensor(keep, dtype=torch.long))
        kept = (torch.cat([self.keys, keys], 1)[:, slot], torch.cat([self.values, values], 1)[:, slot], all_pos[slot])
        store = _Storage.holding([kept], max(_MIN_CAPACITY, len(keep)))
        return self._following(new_position, ListedEntries(store, 0, len(keep)))
