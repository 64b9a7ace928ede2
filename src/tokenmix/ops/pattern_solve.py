"""Chunked sparse triangular solve for pattern recurrences (§4.6), with a hand-written backward.

Solves, for every batch element and head, the recurrence

    y_t = alpha_t * x_t + sum_w beta_{t,w} * y_{idx[t,w]}          (idx[t,w] < t, -1 = none)

i.e. (I - B) Y = diag(alpha) X with B[t, idx[t,w]] = beta[t,w]. Positions are *buffer* positions:
the P cached outputs of an earlier call (``y_prefix``) come first, then the T new ones, so new
position t sits at buffer index P + t.

Forward, chunk by chunk (C positions): reads of outputs in earlier chunks are gathered from the
buffer (O(C |N| V)), reads inside the chunk form a dense C x C strictly lower block, and one
C x C unit-triangular solve finishes the chunk. Memory O(T V + C |N| V), never O(T^2).

Backward is the transposed solve run in reverse chunk order:
    G = (I - B)^{-T} dY        (gradient w.r.t. the right-hand side diag(alpha) X)
    d alpha_t = G_t . x_t,  d x_t = alpha_t G_t,  d beta_{t,w} = G_t . y_{idx[t,w]},
and G_t flows to an earlier chunk (or the prefix) through the same sparse entries, scattered with
index_add. Autograd through a Python loop of in-place buffer writes would either fail or keep
O(T^2 / C) copies; the closed-form backward keeps memory O(T V).
"""
from __future__ import annotations

import torch
from torch import Tensor

from tokenmix.core.operator import solve_unit_lower


def _chunk_plan(idx: Tensor, p: int, t: int, chunk: int):
    """Per chunk: (s, e, gather positions, earlier mask, in-chunk column, in-chunk mask)."""
    plans = []
    for s in range(0, t, chunk):
        e = min(s + chunk, t)
        ic = idx[s:e]  # [C, W]
        valid = ic >= 0
        earlier = valid & (ic < p + s)
        inside = valid & (ic >= p + s)
        col = torch.where(inside, ic - (p + s), torch.zeros_like(ic))
        plans.append((s, e, ic.clamp(min=0), earlier, col, inside))
    return plans


def _block(beta_c: Tensor, col: Tensor, inside: Tensor) -> Tensor:
    """Dense strictly lower C x C block of B for one chunk: [B, H, C, C]."""
    b, h, c, w = beta_c.shape
    blk = beta_c.new_zeros(b, h, c, c)
    src = beta_c * inside.to(beta_c.dtype)
    return blk.scatter_add_(-1, col.expand(b, h, c, w), src)


class _PatternSolve(torch.autograd.Function):
    @staticmethod
    def forward(ctx, alpha, beta, x, y_prefix, idx, chunk):
        # head-first inside: alpha [B,H,T], beta [B,H,T,W], x [B,H,T,V], y_prefix [B,H,P,V]
        b, h, t, v = x.shape
        p = y_prefix.shape[2]
        buf = x.new_zeros(b, h, p + t, v)
        buf[:, :, :p] = y_prefix
        plans = _chunk_plan(idx, p, t, chunk)
        for s, e, gpos, earlier, col, inside in plans:
            rhs = alpha[:, :, s:e, None] * x[:, :, s:e]
            if earlier.any():
                beta_e = beta[:, :, s:e] * earlier.to(beta.dtype)
                rhs = rhs + torch.einsum("bhcw,bhcwv->bhcv", beta_e, buf[:, :, gpos])
            if inside.any():
                rhs = solve_unit_lower(_block(beta[:, :, s:e], col, inside), rhs)
            buf[:, :, p + s : p + e] = rhs
        ctx.save_for_backward(alpha, beta, x, buf, idx)
        ctx.chunk, ctx.p = chunk, p
        return buf[:, :, p:].clone()

    @staticmethod
    def backward(ctx, gy):
        alpha, beta, x, buf, idx = ctx.saved_tensors
        p, chunk = ctx.p, ctx.chunk
        b, h, t, v = x.shape
        gacc = gy.new_zeros(b, h, p + t, v)  # gradient reaching each buffer position from later reads
        galpha = torch.zeros_like(alpha)
        gbeta = torch.zeros_like(beta)
        gx = torch.zeros_like(x)
        for s, e, gpos, earlier, col, inside in reversed(_chunk_plan(idx, p, t, chunk)):
            g = gy[:, :, s:e] + gacc[:, :, p + s : p + e]
            if inside.any():
                g = solve_unit_lower(_block(beta[:, :, s:e], col, inside), g, transpose=True)
            galpha[:, :, s:e] = (g * x[:, :, s:e]).sum(-1)
            gx[:, :, s:e] = alpha[:, :, s:e, None] * g
            valid = (earlier | inside).to(beta.dtype)
            gbeta[:, :, s:e] = torch.einsum("bhcv,bhcwv->bhcw", g, buf[:, :, gpos]) * valid
            if earlier.any():
                contrib = (beta[:, :, s:e] * earlier.to(beta.dtype))[..., None] * g[:, :, :, None, :]
                gacc.index_add_(2, gpos.reshape(-1), contrib.reshape(b, h, -1, v))
        return galpha, gbeta, gx, gacc[:, :, :p], None, None


def chunked_pattern_solve(alpha: Tensor, beta: Tensor, idx: Tensor, x: Tensor, y_prefix: Tensor | None = None,
                          chunk_size: int = 64) -> Tensor:
    """Solve the pattern recurrence chunk by chunk.

    Args:
        alpha: [B, T, H] self coefficients (the diagonal of A).
        beta: [B, T, H, W] neighbour coefficients; entries where idx < 0 are ignored.
        idx: [T, W] long, buffer position read by (t, w), -1 for none; must satisfy idx[t] < P + t.
        x: [B, T, H, V] inputs (values).
        y_prefix: [B, P, H, V] outputs of cached earlier positions (buffer positions 0..P-1), or None.
        chunk_size: C, the block size of the triangular solves.
    Returns:
        y: [B, T, H, V].
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
    b, t, h, v = x.shape
    if y_prefix is None:
        y_prefix = x.new_zeros(b, 0, h, v)
    if idx.shape[0] != t or beta.shape[:3] != (b, t, h) or beta.shape[3] != idx.shape[1]:
        raise ValueError(f"shape mismatch: x {tuple(x.shape)}, beta {tuple(beta.shape)}, idx {tuple(idx.shape)}")
    p = y_prefix.shape[1]
    if idx.numel() and (idx >= p + torch.arange(t, device=idx.device)[:, None]).any():
        raise ValueError("idx reads a position that is not strictly earlier (not causal)")
    y = _PatternSolve.apply(alpha.transpose(1, 2), beta.transpose(1, 2), x.transpose(1, 2),
                            y_prefix.transpose(1, 2), idx.to(x.device), chunk_size)
    return y.transpose(1, 2)
