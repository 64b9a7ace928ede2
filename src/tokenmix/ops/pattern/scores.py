"""Neighbour scores s[t, w] = q_t . k_{idx[t, w]} by the plan's runs (``plan.py``): shifted and
strided slices of the keys, the irregular entries gathered in blocks; no gathered keys are saved
for backward (the backward recomputes from the slices). Per-row tables (packed rows) gather the
keys in blocks of rows. Reference: ``reference.pattern_scores_reference``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.ops.pattern.plan import (
    PatternPlan,
    RowPatternPlan,
    _add_group_sums,
    _leftover_blocks,
    plan_pattern,
)


class _PatternScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, kbuf, plan):
        # q [B, T, H, K], kbuf [B, P + T, H, K] -> scores [W, B, T, H] (level-major: contiguous writes)
        b, t, h, k = q.shape
        out = q.new_zeros(plan.w, b, t, h)
        for pc in plan.pieces:
            kk = kbuf[:, pc.keys]  # [B, n, H, K], a strided view, no copy
            if pc.g == 1:
                out[pc.col, :, pc.rows] = torch.linalg.vecdot(q[:, pc.rows], kk)
            else:
                qq = q[:, pc.rows].reshape(b, pc.n, pc.g, h, k)
                out[pc.col, :, pc.rows] = torch.linalg.vecdot(qq, kk[:, :, None]).reshape(b, pc.n * pc.g, h)
        rows, cols = (plan.on(a, q.device) for a in plan.left)
        keys = plan.on(plan.left_keys, q.device)
        starts, step = _leftover_blocks(len(rows), b * h * k)
        for s in starts:
            r, c, j = rows[s : s + step], cols[s : s + step], keys[s : s + step]
            out[c, :, r] = torch.linalg.vecdot(q[:, r], kbuf[:, j]).transpose(0, 1)
        out *= plan.mask("valid", out).t()[:, None, :, None]
        ctx.save_for_backward(q, kbuf)
        ctx.plan = plan
        return out.permute(1, 2, 3, 0)

    @staticmethod
    def backward(ctx, ds):
        q, kbuf = ctx.saved_tensors
        plan = ctx.plan
        b, t, h, k = q.shape
        ds = (ds * plan.mask("valid", ds)[None, :, None, :]).permute(3, 0, 1, 2).contiguous()  # [W, B, T, H]
        dq, dk = torch.zeros_like(q), torch.zeros_like(kbuf)
        for pc in plan.pieces:
            d = ds[pc.col, :, pc.rows]  # [B, n g, H]
            if pc.g == 1:
                dq[:, pc.rows].addcmul_(d[..., None], kbuf[:, pc.keys])
                dk[:, pc.keys].addcmul_(d[..., None], q[:, pc.rows])
            else:
                d = d.reshape(b, pc.n, pc.g, h, 1)
                dq[:, pc.rows].view(b, pc.n, pc.g, h, k).addcmul_(d, kbuf[:, pc.keys][:, :, None])
                _add_group_sums(dk[:, pc.keys], d, q[:, pc.rows].reshape(b, pc.n, pc.g, h, k), 2)
        rows, cols = (plan.on(a, q.device) for a in plan.left)
        keys = plan.on(plan.left_keys, q.device)
        starts, step = _leftover_blocks(len(rows), b * h * k)
        for s in starts:
            r, c, j = rows[s : s + step], cols[s : s + step], keys[s : s + step]
            d = ds[c, :, r].transpose(0, 1)[..., None]  # [B, E, H, 1]
            dq.index_add_(1, r, d * kbuf[:, j])
            dk.index_add_(1, j, d * q[:, r])
        return dq, dk, None


def _gather_keys(kbuf: Tensor, flat: Tensor) -> Tensor:
    """kbuf [B, N, H, K] (contiguous) at flat row indices [B, n, W] (``RowPatternPlan.flat``) ->
    [B, n, W, H, K]."""
    h, k = kbuf.shape[2:]
    return kbuf.view(-1, h, k).index_select(0, flat.reshape(-1)).view(*flat.shape, h, k)


class _RowPatternScores(torch.autograd.Function):
    """``_PatternScores`` on per-row tables (``RowPatternPlan``): the keys gathered in blocks of rows."""

    @staticmethod
    def forward(ctx, q, kbuf, plan):
        b, t, h, k = q.shape
        keys = plan.flat("keys", None, q.device)
        out = q.new_empty(b, t, h, plan.w)
        _, step = _leftover_blocks(t, b * plan.w * h * k)
        for r0 in range(0, t, step):
            r1 = min(t, r0 + step)
            out[:, r0:r1] = torch.linalg.vecdot(_gather_keys(kbuf, keys[:, r0:r1]), q[:, r0:r1, None]).transpose(-1, -2)
        out *= plan.mask("valid", out)[:, :, None, :]
        ctx.save_for_backward(q, kbuf)
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx, ds):
        q, kbuf = ctx.saved_tensors
        plan = ctx.plan
        b, t, h, k = q.shape
        w = plan.w
        ds = ds * plan.mask("valid", ds)[:, :, None, :]
        keys = plan.flat("keys", None, q.device)
        dq, dk = torch.empty_like(q), torch.zeros_like(kbuf)
        _, step = _leftover_blocks(t, b * w * h * k)
        for r0 in range(0, t, step):
            r1 = min(t, r0 + step)
            d = ds[:, r0:r1].transpose(-1, -2)[..., None]  # [B, n, W, H, 1]
            dq[:, r0:r1] = (d * _gather_keys(kbuf, keys[:, r0:r1])).sum(2)
            dk.view(-1, h, k).index_add_(0, keys[:, r0:r1].reshape(-1), (d * q[:, r0:r1, None]).reshape(-1, h, k))
        return dq, dk, None


def pattern_scores(q: Tensor, kbuf: Tensor, idx: Tensor, plan: PatternPlan | None = None) -> Tensor:
    """Neighbour scores s[t, w] = q_t . kbuf[idx[t, w]] (0 where idx < 0).

    Args:
        q: [B, T, H, K] queries of the segment.
        kbuf: [B, P + T, H, K] keys of the P cached positions, then of the segment.
        idx: [T, W] long buffer positions, -1 for none; idx[t] < P + t; or per-row [B, T, W].
        plan: the table's ``PatternPlan`` (``RowPatternPlan`` for per-row tables; built here if None).
    Returns:
        [B, T, H, W].
    """
    b, t, h, k = q.shape
    p = kbuf.shape[1] - t
    if kbuf.shape[0] != b or kbuf.shape[2:] != (h, k) or p < 0:
        raise InputError(f"shape mismatch: q {tuple(q.shape)}, kbuf {tuple(kbuf.shape)}")
    plan = plan if plan is not None else plan_pattern(idx, p)
    if (plan.t, plan.w, plan.p) != (t, idx.shape[-1], p) or isinstance(plan, RowPatternPlan) != (idx.dim() == 3):
        raise InputError(f"plan for T={plan.t}, W={plan.w}, P={plan.p} used with idx {tuple(idx.shape)}, P={p}")
    # contiguous operands: the per-level slices are then dense blocks (strided q, e.g. a view of a
    # fused qkv projection, makes every level's product several times slower)
    scores = _RowPatternScores if isinstance(plan, RowPatternPlan) else _PatternScores
    return scores.apply(q.contiguous(), kbuf.contiguous(), plan)
