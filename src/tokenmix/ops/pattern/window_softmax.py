"""The path for patterns whose neighbour set is every one of the previous M positions (M = all for
the dense pattern), with score-softmax coefficients: scores, softmax coefficients and the solve per
chunk as matmuls, recomputed in backward flash-style, memory O(T (K + V) + C T). No index table.
Left-padded batches pass the per-row key starts [B], packed rows the per-query ones [B, T]
(``key_start``). Reference: ``reference.window_softmax_reference``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.core.operator import solve_unit_lower


def _window_scores(
    q_c: Tensor, kwin: Tensor, s: int, p: int, lo: int, window: int, scale: float, key_start: Tensor | None = None
) -> Tensor:
    """Masked scores of rows s.. of the segment against buffer positions lo..: [B, H, C, L], -inf
    outside {t - window, ..., t} (the row's own position included: its self score) and, with
    ``key_start`` [B] (or per query [B, T]), at the positions < key_start[b] (key_start[b, t])
    other than the row's own."""
    sc = (q_c @ kwin.transpose(-1, -2)) * scale
    c = q_c.shape[2]
    own = p + s + torch.arange(c, device=q_c.device)[:, None]  # buffer position of each row
    pos = lo + torch.arange(kwin.shape[2], device=q_c.device)[None, :]
    out = (pos > own) | (pos < own - window)  # [C, L]
    if key_start is not None:
        first = key_start[:, None, None] if key_start.dim() == 1 else key_start[:, s : s + c, None]
        out = out | ((pos[None] < first) & (pos != own))[:, None]  # [B, 1, C, L]
    return sc.masked_fill_(out, float("-inf"))


class _WindowSoftmaxSolve(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, kbuf, x, y_prefix, window, chunk, scale, key_start):
        # head-first: q [B,H,T,K], kbuf [B,H,P+T,K], x [B,H,T,V], y_prefix [B,H,P,V]
        b, h, t, v = x.shape
        p = y_prefix.shape[2]
        buf = torch.cat([y_prefix, x.new_zeros(b, h, t, v)], 2)
        lse = x.new_empty(b, h, t)
        for s in range(0, t, chunk):
            e = min(s + chunk, t)
            lo = max(0, p + s - window)
            sc = _window_scores(q[:, :, s:e], kbuf[:, :, lo : p + e], s, p, lo, window, scale, key_start)
            lse[:, :, s:e] = torch.logsumexp(sc, -1)
            coef = torch.exp(sc - lse[:, :, s:e, None])  # softmax over {t} ∪ N(t): [B, H, C, L]
            inside = coef[..., p + s - lo :]  # the chunk's own C x C block; its diagonal is alpha
            alpha = inside.diagonal(dim1=-2, dim2=-1).clone()
            inside.diagonal(dim1=-2, dim2=-1).zero_()
            rhs = alpha[..., None] * x[:, :, s:e] + coef[..., : p + s - lo] @ buf[:, :, lo : p + s]
            buf[:, :, p + s : p + e] = solve_unit_lower(inside, rhs)
        ctx.save_for_backward(q, kbuf, x, buf, lse)
        ctx.window, ctx.chunk, ctx.scale, ctx.key_start = window, chunk, scale, key_start
        return buf[:, :, p:].clone()

    @staticmethod
    def backward(ctx, gy):
        q, kbuf, x, buf, lse = ctx.saved_tensors
        window, chunk, scale, key_start = ctx.window, ctx.chunk, ctx.scale, ctx.key_start
        b, h, t, v = x.shape
        p = buf.shape[2] - t
        gacc = gy.new_zeros(b, h, p + t, v)
        dq, dk, dx = torch.zeros_like(q), torch.zeros_like(kbuf), torch.empty_like(x)
        for s in reversed(range(0, t, chunk)):
            e = min(s + chunk, t)
            lo = max(0, p + s - window)
            kwin = kbuf[:, :, lo : p + e]
            coef = torch.exp(
                _window_scores(q[:, :, s:e], kwin, s, p, lo, window, scale, key_start) - lse[:, :, s:e, None]
            )
            inside = coef[..., p + s - lo :]
            alpha = inside.diagonal(dim1=-2, dim2=-1).clone()
            inside.diagonal(dim1=-2, dim2=-1).zero_()
            g = solve_unit_lower(inside, gy[:, :, s:e] + gacc[:, :, p + s : p + e], transpose=True)
            gacc[:, :, lo : p + s] += coef[..., : p + s - lo].transpose(-1, -2) @ g
            dx[:, :, s:e] = alpha[..., None] * g
            # d coef[t, j] = G_t . y_j for neighbours, G_t . x_t for the own (alpha) slot
            dcoef = g @ buf[:, :, lo : p + e].transpose(-1, -2)
            dcoef[..., p + s - lo :].diagonal(dim1=-2, dim2=-1).copy_((g * x[:, :, s:e]).sum(-1))
            inside.diagonal(dim1=-2, dim2=-1).copy_(alpha)  # coef is the full softmax again
            dsc = coef * (dcoef - (coef * dcoef).sum(-1, keepdim=True)) * scale
            dq[:, :, s:e] = dsc @ kwin
            dk[:, :, lo : p + e] += dsc.transpose(-1, -2) @ q[:, :, s:e]
        return dq, dk, dx, gacc[:, :, :p], None, None, None, None


def chunked_window_softmax(
    q: Tensor,
    kbuf: Tensor,
    x: Tensor,
    y_prefix: Tensor | None,
    window: int,
    chunk_size: int = 64,
    scale: float | None = None,
    key_start: Tensor | None = None,
) -> Tensor:
    """The structured recurrence with softmax coefficients on a window pattern, as matmuls.

    Every position t reads the previous ``window`` positions (all of them for the dense pattern:
    window >= P + T). Coefficients: softmax over {t} ∪ N(t) of the scores q_t . k_j * scale,
    alpha_t the self term; y_t = alpha_t x_t + sum_{j in N(t)} beta_{t,j} y_j. Per chunk of C rows
    the scores against the window, the softmax, the contribution of earlier chunks (one matmul) and
    a C x C solve; backward recomputes the scores from the saved log-sum-exp.

    Args:
        q: [B, T, H, K] queries of the segment.
        kbuf: [B, P + T, H, K] keys: the P cached positions (the P positions just before the
            segment, contiguous), then the segment's.
        x: [B, T, H, V] values.
        y_prefix: [B, P, H, V] outputs of the cached positions, or None (P = 0).
        window: M >= 1, the number of previous positions each row reads.
        chunk_size: C.
        scale: score scale, 1 / sqrt(K) if None.
        key_start: [B] long, leading padding positions of each row's buffer (left-padded batches):
            excluded from every row's neighbours but a padding row's own self term; or [B, T], the
            buffer position where each query's document begins (packed rows: a query reads no
            key before it); or None.
    Returns:
        y: [B, T, H, V].
    """
    if chunk_size <= 0:
        raise InputError(f"chunk_size must be > 0, got {chunk_size}")
    if window < 1:
        raise InputError(f"window must be >= 1, got {window}")
    b, t, h, k = q.shape
    if y_prefix is None:
        y_prefix = x.new_zeros(b, 0, h, x.shape[-1])
    p = y_prefix.shape[1]
    if kbuf.shape != (b, p + t, h, k) or x.shape[:3] != (b, t, h) or y_prefix.shape[0::2] != (b, h):
        raise InputError(
            f"shape mismatch: q {tuple(q.shape)}, kbuf {tuple(kbuf.shape)}, x {tuple(x.shape)}, "
            f"y_prefix {tuple(y_prefix.shape)}"
        )
    scale = 1.0 / math.sqrt(k) if scale is None else scale
    y = _WindowSoftmaxSolve.apply(
        q.transpose(1, 2),
        kbuf.transpose(1, 2),
        x.transpose(1, 2),
        y_prefix.transpose(1, 2),
        window,
        chunk_size,
        scale,
        key_start,
    )
    return y.transpose(1, 2)
