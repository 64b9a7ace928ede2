"""The references of the pattern ops: plain autograd, one position at a time, for tests (fla's
``naive.py``). Same arguments as the fast paths they check (no chunk size, no plan):
``recurrent_pattern_solve`` for ``chunked.chunked_pattern_solve`` and the numba solve,
``pattern_scores_reference`` for ``scores.pattern_scores`` and the numba scores,
``window_softmax_reference`` for ``window_softmax.chunked_window_softmax``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def recurrent_pattern_solve(
    alpha: Tensor, beta: Tensor, idx: Tensor, x: Tensor, y_prefix: Tensor | None = None
) -> Tensor:
    """Reference for ``chunked_pattern_solve``: forward substitution one position at a time, plain
    autograd. Same arguments (no chunking; per-row tables [B, T, W] row by row); O(T W V) time,
    for tests."""
    b, t, h, v = x.shape
    if idx.dim() == 3:
        yp = y_prefix if y_prefix is not None else x.new_zeros(b, 0, h, v)
        rows = [slice(i, i + 1) for i in range(b)]
        return torch.cat([recurrent_pattern_solve(alpha[r], beta[r], idx[r][0], x[r], yp[r]) for r in rows])
    ys = list((y_prefix if y_prefix is not None else x.new_zeros(b, 0, h, v)).unbind(1))
    p = len(ys)
    for s in range(t):
        y = alpha[:, s, :, None] * x[:, s]
        for w, j in enumerate(idx[s].tolist()):
            if j >= 0:
                y = y + beta[:, s, :, w, None] * ys[j]
        ys.append(y)
    return torch.stack(ys[p:], 1)


def pattern_scores_reference(q: Tensor, kbuf: Tensor, idx: Tensor) -> Tensor:
    """Reference for ``pattern_scores``: gather every neighbour key, plain autograd. [B, T, H, W]
    (idx [T, W] or per-row [B, T, W])."""
    b, t, h, k = q.shape
    w = idx.shape[-1]
    if idx.dim() == 3:
        nb = kbuf[torch.arange(b)[:, None, None], idx.clamp(min=0)]  # [B, T, W, H, K]
        return torch.einsum("bthk,btwhk->bthw", q, nb) * (idx >= 0)[:, :, None, :]
    nb = kbuf.index_select(1, idx.clamp(min=0).reshape(-1)).view(b, t, w, h, k)  # [B, T, W, H, K]
    return torch.einsum("bthk,btwhk->bthw", q, nb) * (idx >= 0)[None, :, None, :]


def window_softmax_reference(
    q: Tensor, kbuf: Tensor, x: Tensor, y_prefix: Tensor | None, window: int, scale: float | None = None
) -> Tensor:
    """Reference for ``chunked_window_softmax``: the dense [T, P + T] scores, masked softmax, and a
    forward substitution one position at a time (plain autograd). Same arguments."""
    b, t, h, k = q.shape
    p = kbuf.shape[1] - t
    scale = 1.0 / math.sqrt(k) if scale is None else scale
    sc = torch.einsum("bthk,bshk->bths", q, kbuf) * scale
    own = p + torch.arange(t)[:, None]
    pos = torch.arange(p + t)[None, :]
    outside = ((pos > own) | (pos < own - window))[:, None, :]  # [T, 1, P + T]
    coef = torch.softmax(sc.masked_fill(outside, float("-inf")), -1)
    ys = list((y_prefix if y_prefix is not None else x.new_zeros(b, 0, h, x.shape[-1])).unbind(1))
    for s in range(t):
        y = coef[:, s, :, p + s, None] * x[:, s]
        for j in range(max(0, p + s - window), p + s):
            y = y + coef[:, s, :, j, None] * ys[j]
        ys.append(y)
    return torch.stack(ys[p:], 1)
