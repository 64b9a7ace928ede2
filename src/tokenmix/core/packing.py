"""Packed rows: several documents concatenated in one batch row, no state and no attention crossing a
document boundary.

One representation inside tokenmix, ``Packing``: for every position of a [B, T] batch, the position
its document starts at,

    starts[b, t] = the largest s <= t with a document starting at s in row b        [B, T] long

so t belongs to the document [starts[b, t], ...] and j may be read from t iff starts[b, t] <= j <= t.
The first document of every row continues from the state the segment is given (none: a fresh one,
as for an unpacked row, whose starts are 0 everywhere); every later document starts fresh. Every mixer's
semantics follow from the dense
reference: a packed row equals its documents run one by one, each from a fresh state, and
concatenated; in (A, B) terms both are block-diagonal over the documents.

The conventions of other libraries convert at the edges:
    cu_seqlens      fla / flash-attention: cumulative document lengths over the flattened batch
                    (``from_cu_seqlens``; documents may not cross a row end)
    position_ids    transformers: positions restarting at 0 at each document (``from_position_ids``)
    lengths         per row, the documents' lengths in order (``from_lengths``)
    document ids    per token, any id that changes at a boundary (``from_document_ids``)
Bad boundaries (not increasing, not covering the row, a shape that does not match the batch), sizes
that are not integers (2.5, NaN, a string, None) or flags that are not bool, and a batch whose packing
would not fit in memory are an ``InputError`` naming what is wrong.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tokenmix.core.errors import InputError, shown
from tokenmix.core.memory import available_memory

# bytes a position of a [B, T] packing costs while it is built and checked (the long starts, the
# position and cummax temporaries, the checks' masks): an upper estimate, so that a request for a
# packing larger than memory is one line instead of an allocation failure
BYTES_PER_POSITION = 64


@dataclass(frozen=True)
class Packing:
    """Document starts of a packed batch (module docstring).

    Attributes:
        starts: [B, T] long, starts[b, t] <= t, non-decreasing along t, starts[b, t] = t at a start.
    """

    starts: Tensor

    def __post_init__(self) -> None:
        s = self.starts
        if not isinstance(s, Tensor) or s.dim() != 2 or s.dtype != torch.long:
            raise InputError(
                f"packing starts must be a [B, T] long tensor, got "
                f"{tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__}"
                f"{'' if not isinstance(s, Tensor) else f' {s.dtype}'}"
            )
        t = torch.arange(s.shape[1], device=s.device)
        if bool((s > t).any()) or bool((s < 0).any()):
            raise InputError("packing starts must lie in [0, t] at every position t")
        if s.shape[1] > 1 and bool((s[:, 1:] < s[:, :-1]).any()):
            raise InputError("packing starts must not decrease along a row (documents are contiguous)")
        # a start that is not t must be the start of t - 1 (no jump into the middle of a document)
        jumped = (s[:, 1:] != s[:, :-1]) & (s[:, 1:] != t[1:])
        if bool(jumped.any()):
            raise InputError("packing starts may change only where a document starts (starts[b, t] = t)")

    # ------------------------------------------------------------------------------------ views
    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.starts.shape)  # type: ignore[return-value]

    @functools.cached_property  # (read by every layer of a packed batch)
    def boundaries(self) -> Tensor:
        """[B, T] bool: a later document starts here (t > 0 and starts[b, t] = t): the state resets."""
        t = torch.arange(self.starts.shape[1], device=self.starts.device)
        return (self.starts == t) & (t > 0)

    @property
    def positions(self) -> Tensor:
        """[B, T] long: the position within the document (t - starts[b, t])."""
        return torch.arange(self.starts.shape[1], device=self.starts.device) - self.starts

    @functools.cached_property
    def trivial(self) -> bool:
        """One document per row from position 0: the unpacked batch."""
        return not bool(self.starts.any())

    def begins(self, position: int, start: Tensor | None = None) -> Tensor:
        """[B, T] long: where each token's document begins on the clock of a state at ``position``
        (the segment's first token is there); a row's first document continues that state, whose
        rows begin at ``start`` [B] (left padding or an earlier document; None: 0)."""
        first = 0 if start is None else start[:, None]
        return torch.where(self.starts > 0, position + self.starts, first)

    def visible(self, keys: Tensor | None = None) -> Tensor:
        """[B, T, T] bool: query t may read key j (same document, j <= t); with ``keys`` [T'] absolute
        positions of the keys (default 0 .. T - 1)."""
        t = torch.arange(self.starts.shape[1], device=self.starts.device)
        j = t if keys is None else keys
        return (j[None, None, :] >= self.starts[:, :, None]) & (j[None, None, :] <= t[None, :, None])

    def documents(self, row: int) -> list[tuple[int, int]]:
        """The documents of row ``row`` as [begin, end) position ranges, in order (the first begins at 0)."""
        begins = [0] + torch.nonzero(self.boundaries[row])[:, 0].tolist()
        ends = begins[1:] + [self.starts.shape[1]]
        return list(zip(begins, ends))

    def segment(self, t0: int, t1: int) -> "Packing":
        """The packing of positions t0 .. t1 - 1 as a segment of its own (starts before t0 clamp to 0:
        the document that began earlier continues from the state the segment starts with)."""
        return Packing((self.starts[:, t0:t1] - t0).clamp(min=0))

    def row_documents(self) -> Iterator[tuple[int, int, int]]:
        """Every (row, begin, end) document of the batch."""
        for b in range(self.starts.shape[0]):
            for begin, end in self.documents(b):
                yield b, begin, end

    def to(self, device) -> "Packing":
        return Packing(self.starts.to(device))

    def check(self, batch_size: int, length: int) -> None:
        if self.shape != (batch_size, length):
            raise InputError(f"packing covers [B, T] = {list(self.shape)} but the batch is [{batch_size}, {length}]")

    # ------------------------------------------------------------------------------- conversions
    @classmethod
    def from_resets(cls, resets: Tensor) -> "Packing":
        """From [B, T] bool flags, True where a document starts (position 0 always begins the first one)."""
        if not isinstance(resets, Tensor) or resets.dim() != 2 or resets.dtype != torch.bool:
            got = f"{tuple(resets.shape)} {resets.dtype}" if isinstance(resets, Tensor) else type(resets).__name__
            raise InputError(f"document start flags must be a [B, T] bool tensor, got {got}")
        b, t = resets.shape
        pos = torch.arange(t, device=resets.device).expand(b, t)
        marked = torch.where(resets, pos, torch.zeros_like(pos))
        return cls(torch.cummax(marked, dim=1).values)

    @classmethod
    def from_lengths(cls, lengths: Sequence[Sequence[int]], length: int | None = None) -> "Packing":
        """From the documents' lengths of each row (each row's lengths must sum to the row length)."""
        rows = _length_rows(lengths)
        if length is not None and not _is_count(length):
            raise InputError(f"the row length must be an integer, got {shown(length)}")
        t = length if length is not None else max(sum(r) for r in rows)
        for i, r in enumerate(rows):
            if not r or any(n <= 0 for n in r):
                raise InputError(f"row {i}: document lengths must be positive integers, got {shown(r)}")
            if sum(r) != t:
                raise InputError(f"row {i}: document lengths {shown(r)} sum to {sum(r)}, not the row length {t}")
        check_packing_size(len(rows), t)
        resets = torch.zeros(len(rows), t, dtype=torch.bool)
        for i, r in enumerate(rows):
            begin = 0
            for n in r:
                resets[i, begin] = True
                begin += n
        return cls.from_resets(resets)

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: Tensor | Sequence[int], batch_size: int, length: int) -> "Packing":
        """From cumulative document lengths over the flattened [B * T] batch (fla's ``cu_seqlens``:
        0 first, B * T last, increasing); a document may not cross the end of a row."""
        cu = torch.as_tensor(cu_seqlens, dtype=torch.long).flatten()
        n = batch_size * length
        if cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != n:
            raise InputError(
                f"cu_seqlens must start at 0 and end at B x T = {n}, got "
                f"{cu.tolist() if cu.numel() <= 8 else cu[:4].tolist() + ['...']}"
            )
        if bool((cu[1:] <= cu[:-1]).any()):
            raise InputError("cu_seqlens must be strictly increasing (documents of at least one token)")
        for begin, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
            if (end - 1) // length != begin // length:
                raise InputError(f"a document [{begin}, {end}) of cu_seqlens crosses the end of row {begin // length}")
        resets = torch.zeros(n, dtype=torch.bool)
        resets[cu[:-1]] = True
        return cls.from_resets(resets.view(batch_size, length))

    @classmethod
    def from_position_ids(cls, position_ids: Tensor) -> "Packing":
        """From transformers' ``position_ids`` [B, T] restarting at 0 at each document (and counting up
        by one inside it)."""
        p = torch.as_tensor(position_ids)
        if p.dim() != 2 or p.dtype not in (torch.int32, torch.int64):
            raise InputError("position_ids must be a [B, T] integer tensor")
        p = p.long()
        t = torch.arange(p.shape[1], device=p.device)
        if bool((p < 0).any()) or bool((p > t).any()):
            raise InputError("position_ids must lie in [0, t] at every position t")
        if p.shape[1] > 1 and bool(((p[:, 1:] != p[:, :-1] + 1) & (p[:, 1:] != 0)).any()):
            raise InputError("position_ids must count up by one inside a document and restart at 0 at the next")
        return cls(t - p)

    @classmethod
    def from_document_ids(cls, ids: Tensor) -> "Packing":
        """From per-token document ids [B, T] (any values; a change marks a boundary)."""
        ids = torch.as_tensor(ids)
        if ids.dim() != 2:
            raise InputError("document ids must be a [B, T] tensor")
        resets = torch.ones_like(ids, dtype=torch.bool)
        resets[:, 1:] = ids[:, 1:] != ids[:, :-1]
        return cls.from_resets(resets)

    def cu_seqlens(self) -> Tensor:
        """[D + 1] long: fla's cumulative lengths over the flattened batch (D documents)."""
        b, t = self.shape
        first = torch.zeros_like(self.boundaries)
        first[:, 0] = True
        begins = torch.nonzero((self.boundaries | first).flatten())[:, 0]
        return torch.cat([begins, torch.tensor([b * t], device=begins.device)])

    def position_ids(self) -> Tensor:
        """[B, T] long: positions restarting at 0 at each document (transformers' convention)."""
        return self.positions


def as_packing(value, batch_size: int, length: int, device: torch.device | str | None = None) -> Packing | None:
    """``value`` (a Packing, document start flags, or None) as a checked Packing for a [B, T] batch on
    ``device`` (the batch's; None: where it is); None for None or a trivial packing (one document per
    row: the unpacked path)."""
    if value is None:
        return None
    packing = value if isinstance(value, Packing) else Packing.from_resets(as_flags(value, "packing"))
    packing.check(batch_size, length)
    if packing.trivial:
        return None
    return packing if device is None or packing.starts.device == torch.device(device) else packing.to(device)


def as_flags(value: object, what: str) -> Tensor:
    """``value`` (a tensor, or nested lists / an array of bools) as a bool tensor; InputError for a
    value torch cannot take as one (ragged lists, strings, None) or flags of another dtype (0.5 is
    no start flag)."""
    if not isinstance(value, Tensor):
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise InputError(f"{what} must be bool flags (a tensor or nested lists), got {shown(value)}") from None
    if value.dtype != torch.bool:
        raise InputError(f"{what} must be bool flags, got {tuple(value.shape)} {value.dtype}")
    return value


def _is_count(n: object) -> bool:
    """An integer (Python's, numpy's or a 0-d integer tensor's), not a bool: a size or a length."""
    if isinstance(n, Tensor):
        return n.dim() == 0 and not n.is_floating_point() and not n.is_complex() and n.dtype != torch.bool
    return isinstance(n, numbers.Integral) and not isinstance(n, bool)


def _length_rows(lengths: object) -> list[list[int]]:
    """``from_lengths``' rows as lists of Python ints; InputError for anything else (a float size,
    NaN, a string, None, a dict, a row that is not a list)."""
    if isinstance(lengths, Tensor):
        if lengths.dim() != 2 or not _is_count(lengths.new_zeros(())):
            raise InputError(
                f"document lengths must be a [B, D] integer tensor, got {tuple(lengths.shape)} {lengths.dtype}"
            )
        lengths = lengths.tolist()
    if not isinstance(lengths, Sequence) or isinstance(lengths, (str, bytes)):
        raise InputError(f"document lengths must be a list of rows (lists of integers), got {shown(lengths)}")
    if not lengths:
        raise InputError("packing needs at least one row")
    rows = []
    for i, row in enumerate(lengths):
        if isinstance(row, Tensor):
            row = row.tolist() if row.dim() == 1 else row
        if not isinstance(row, Sequence) or isinstance(row, (str, bytes)):
            raise InputError(f"row {i}: document lengths must be a list of integers, got {shown(row)}")
        bad = [n for n in row if not _is_count(n)]
        if bad:
            raise InputError(f"row {i}: document lengths must be positive integers, got {shown(bad[0])}")
        rows.append([int(n) for n in row])
    return rows


def check_packing_size(batch_size: int, length: int) -> None:
    """Refuse (InputError) a [B, T] packing that would not fit in the memory available now."""
    need = float(batch_size) * float(length) * BYTES_PER_POSITION
    avail = available_memory()
    if avail is not None and need > avail:
        raise InputError(
            f"a packing of [B, T] = [{batch_size:,}, {length:,}] would need about {need / 2**30:,.1f} GiB, "
            f"more than the {avail / 2**30:,.1f} GiB of memory available"
        )


__all__ = ["Packing", "as_flags", "as_packing", "check_packing_size"]
