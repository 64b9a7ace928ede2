"""Chunk-local document masks of a packed batch, for the chunked first-order recurrences with a matrix
state (ops/chunked_gla.py, ops/chunked_ssd.py, ops/chunked_delta.py).

A packed row (core/packing.py) holds documents back to back; ``doc_starts`` [B, T] gives, for every
position, where its document begins. At a boundary the state resets: the first document of a row
continues from the state the call is given, every later one starts from zero. Inside a chunk of C
tokens (positions nC .. nC + C - 1) that is four masks, all 0 / 1 and built once per call in
O(T C):

    same[i, j]   i and j belong to the same document: the chunk-local scores / decays between two
                 tokens of different documents are zero (and the delta rule's UT matrix with them);
    reads[i]     i's document began before the chunk (or is the row's first document): only these
                 queries read the state entering the chunk;
    writes[j]    j belongs to the chunk's last document: only these keys write into the state leaving
                 the chunk;
    carry        no document begins inside the chunk: the entering state is carried through it
                 (otherwise the state leaving it holds the last document's writes alone).

The masks multiply exact intermediate products (never a large negative log decay added to an
exponent), so a chunk without a boundary computes exactly what the unpacked kernel computes.
Positions past the end of time (the padding of the last chunk) belong to the last document; the
kernels make them inert anyway.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from tokenmix.core.errors import InputError


class ChunkBoundaries(NamedTuple):
    """The masks of one call, chunk-major [N, B, ...] in the compute dtype (module docstring).

    same: [N, B, C, C];  reads: [N, B, C, 1];  writes: [N, B, C, 1];  carry: [N, B].
    """

    same: Tensor
    reads: Tensor
    writes: Tensor
    carry: Tensor


def check_doc_starts(doc_starts: Tensor, batch_size: int, length: int) -> None:
    """``doc_starts`` must be a [B, T] integer tensor (``Packing.starts``, validated there)."""
    if not isinstance(doc_starts, Tensor) or tuple(doc_starts.shape) != (batch_size, length):
        shape = tuple(doc_starts.shape) if isinstance(doc_starts, Tensor) else type(doc_starts).__name__
        raise InputError(f"doc_starts must be [B, T] = {(batch_size, length)} (Packing.starts), got {shape}")
    if doc_starts.dtype not in (torch.int32, torch.int64):
        raise InputError(f"doc_starts must be an integer tensor (Packing.starts), got {doc_starts.dtype}")


def chunk_boundaries(doc_starts: Tensor, n: int, c: int, dtype: torch.dtype) -> ChunkBoundaries:
    """The masks of ``doc_starts`` [B, T] (``Packing.starts``) over N chunks of C tokens."""
    b, t = doc_starts.shape
    s = doc_starts.to(torch.long)
    if n * c > t:  # the padding of the last chunk continues the last document
        s = torch.cat([s, s[:, -1:].expand(b, n * c - t)], 1)
    s = s.view(b, n, c).transpose(0, 1).contiguous()  # [N, B, C]
    # a document read from the entering state began before the chunk; in chunk 0 that is the row's
    # first document (start 0), which continues from the initial state
    first = (torch.arange(n, device=s.device) * c).clamp_(min=1)[:, None, None]
    reads = s < first
    same = s[..., :, None] == s[..., None, :]
    writes = s == s[..., -1:]
    carry = reads[..., -1]
    return ChunkBoundaries(same.to(dtype), reads.to(dtype)[..., None], writes.to(dtype)[..., None], carry.to(dtype))
