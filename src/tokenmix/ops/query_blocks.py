"""Row-blocked evaluation of an attention-like layer: O(C n) memory in training, not O(n^2).

An attention-like mixer whose output rows are ``y_i = sum_j a_{i,j} v_j`` with weights that depend
on the whole causal row (softmax, stick-breaking, PaTH's transformed logits) can be evaluated one
block of C queries at a time: block [i0, i1) reads only the keys before i1. ``by_query_blocks``
concatenates the blocks; when autograd records the computation each block runs under activation
checkpointing, so the forward keeps no [C, n] weights alive (only the inputs the blocks share,
O(n)) and the backward recomputes one block at a time: peak memory O(C n) over the whole sequence.

``rows_reference`` is the plain reference beside it: the same row function on all rows at once.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from tokenmix.core.errors import InputError

RowFn = Callable[[int, int], Tensor]  # (i0, i1) -> output rows [B, i1 - i0, ...]


def by_query_blocks(rows: RowFn, t: int, chunk: int, records_grad: bool) -> Tensor:
    """cat over query blocks [i0, i0 + chunk) of ``rows(i0, i1)`` along dim 1.

    Args:
        rows: the row function; it must read only keys before i1 and may close over shared tensors.
        t: number of query rows.
        chunk: block size C.
        records_grad: whether autograd records the blocks (then each block is checkpointed).
    Returns:
        [B, t, ...] the rows of all blocks.
    """
    if chunk <= 0:
        raise InputError(f"chunk_size must be > 0, got {chunk}")
    out = []
    for i0 in range(0, t, chunk):
        i1 = min(i0 + chunk, t)
        if records_grad:
            out.append(checkpoint(rows, i0, i1, use_reentrant=False))
        else:
            out.append(rows(i0, i1))
    return out[0] if len(out) == 1 else torch.cat(out, 1)


def rows_reference(rows: RowFn, t: int) -> Tensor:
    """The plain reference of ``by_query_blocks``: every row in one call."""
    return rows(0, t)
