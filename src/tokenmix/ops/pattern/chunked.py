"""The chunked sparse triangular solve of the pattern recurrence in torch, and its autograd Function.

    y_t = alpha_t * x_t + sum_w beta_{t,w} * y_{idx[t,w]}          (idx[t,w] < P + t, -1 = none)

i.e. (I - B) Y = diag(alpha) X with B[t, idx[t,w]] = beta[t,w], on buffer positions (package
docstring), covered by the table's plan (``plan.py``).

The solve, chunk by chunk (C positions):
    * reads at distance <= R (the band's reach, m = R / C chunks: 1 for pow2, up to 4 for sq1-like
      patterns that have several levels per chunk of distance) land in the chunk or the m before
      it: they are scattered into one dense [C, R + C] band block per chunk, used as a matmul
      against the previous m chunks' outputs;
      the chunk's own C x C unit lower triangular block is inverted for all chunks in one batched
      solve before the loop, so a chunk costs two small matmuls (equal up to rounding);
    * reads at distance > R land in earlier chunks. A run whose reads are all at distance >= D
      contributes to a whole block of ~D rows at once -- every row of the block reads rows before
      the block -- so it is added when the block starts: one slice operation per run and block,
      O(T / D) operations for a level at distance ~D instead of one per chunk.
Backward is the transposed solve in reverse chunk order, G = (I - B)^{-T} dY, with the same
schedule transposed (a block's contributions to earlier rows are scattered once all its rows have
their G); then d alpha_t = G_t . x_t, d x_t = alpha_t G_t, d beta_{t,w} = G_t . y_{idx[t,w]} are
whole-sequence slice operations. Memory O(T (V + W) + T C), never O(T^2).

Packed rows, per-row tables (``RowPatternPlan``): each row's near reads are scattered into its band
blocks as above, and the far reads of a chunk are gathered from the rows already solved (one
gather per chunk, no runs: a run would end at every boundary), so a boundary costs nothing; no
read crosses it, so neither does a gradient.

Reference: ``reference.recurrent_pattern_solve``.
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
    table_fits,
)


def _band(beta: Tensor, plan: PatternPlan) -> Tensor:
    """[B, H, T, R + C]: row t's coefficients on buffer positions P + c C - R + j (c = t // C, the
    previous R / C chunks then its own), from the entries read at distance <= R."""
    b, h, t, _ = beta.shape
    band = beta.new_zeros(b, h, t, plan.reach + plan.chunk)
    col = plan.on(plan.band_col, beta.device)  # [T, Wn] over the near level slots ([B, T, Wn] per row)
    near = plan.mask("near_compact", beta)
    if col.dim() == 3:  # per-row tables
        col, near = col[:, None], near[:, None]
    src = beta.index_select(-1, plan.on(plan.near_cols, beta.device)) * near
    return band.scatter_add_(-1, col.expand(b, h, t, col.shape[-1]), src)


def _level_major(beta: Tensor, mask: Tensor) -> Tensor:
    """beta [B, H, T, W] * mask [T, W] as a contiguous [W, B, H, T] tensor, in one pass: a level's
    coefficients over a row range are then one dense slice (a strided beta[..., w] view makes every
    far piece's multiply-add about twice as slow)."""
    b, h, t, w = beta.shape
    out = beta.new_empty(w, b, h, t)
    return torch.mul(beta.permute(3, 0, 1, 2), mask.t()[:, None, None, :], out=out)


def _chunk_inverses(band: Tensor, plan: PatternPlan) -> Tensor:
    """(I - B_cc)^{-1} of every chunk's own C x C block, one batched solve: [B, H, nC, C, C].

    Applying the inverse is one matmul per chunk instead of a triangular solve; per-chunk solves
    dominate the loop for sparse patterns. Equivalent up to rounding (unit lower triangular blocks
    of bounded coefficients are well conditioned). Half precision is inverted in float32.
    """
    b, h, t, _ = band.shape
    c, nc = plan.chunk, len(plan.chunks)
    inside = band.new_zeros(b, h, nc * c, c)
    inside[:, :, :t] = band[..., plan.reach :]
    work = torch.float32 if band.dtype in (torch.bfloat16, torch.float16) else band.dtype
    eye = torch.eye(c, dtype=work, device=band.device)
    mats = eye - inside.to(work).view(b, h, nc, c, c)
    return torch.linalg.solve_triangular(mats, eye.expand_as(mats), upper=False, unitriangular=True)


class _RunFarReads:
    """The far reads (distance > R) of a shared table (``PatternPlan``) inside ``_PatternSolve``: a
    run's reads are added to a whole block of rows when the block starts (``far_blocks``, one slice
    operation per run and block), the irregular entries are gathered per chunk (``left_chunks``).

    Args:
        plan: the table's plan.
        beta: [B, H, T, W] head-first neighbour coefficients.
    """

    def __init__(self, plan: PatternPlan, beta: Tensor) -> None:
        self.plan, self.beta = plan, beta
        self.coef = _level_major(beta, plan.mask("run_far", beta))  # [W, B, H, T]: a level's rows one slice

    def add(self, rhs: Tensor, buf: Tensor, ci: int) -> None:
        """rhs [B, H, T, V] += the far reads from buf [B, H, P + T, V] that become due at chunk ci
        (every position they read is solved)."""
        plan, (b, h, _, v) = self.plan, rhs.shape
        for pc in plan.far_blocks.get(plan.chunks[ci][0], ()):
            ys = buf[:, :, pc.keys]  # [B, H, n, V]
            bw = self.coef[pc.col, :, :, pc.rows]
            if pc.g == 1:
                rhs[:, :, pc.rows].addcmul_(bw[..., None], ys)
            else:
                rhs[:, :, pc.rows].view(b, h, pc.n, pc.g, v).addcmul_(
                    bw.reshape(b, h, pc.n, pc.g, 1), ys[:, :, :, None]
                )
        left = plan.left_chunks[ci]
        if left is not None:
            r, cc, j = (plan.on(a, rhs.device) for a in left)
            rhs.index_add_(2, r, self.beta[:, :, r, cc][..., None] * buf[:, :, j])

    def pass_back(self, gacc: Tensor, g_all: Tensor, ci: int) -> None:
        """The transpose of ``add``: gacc [B, H, P + T, V] += what the far reads of the rows whose G
        (g_all [B, H, T, V]) is complete once chunk ci is solved pass back to the positions they read."""
        plan, (b, h, _, v) = self.plan, g_all.shape
        left = plan.left_chunks[ci]
        if left is not None:
            r, cc, j = (plan.on(a, g_all.device) for a in left)
            gacc.index_add_(2, j, self.beta[:, :, r, cc][..., None] * g_all[:, :, r])
        for pc in plan.far_blocks.get(plan.chunks[ci][0], ()):  # the blocks starting here are complete
            bw = self.coef[pc.col, :, :, pc.rows]
            gr = g_all[:, :, pc.rows]
            if pc.g == 1:
                gacc[:, :, pc.keys].addcmul_(bw[..., None], gr)
            else:
                _add_group_sums(gacc[:, :, pc.keys], bw.view(b, h, pc.n, pc.g, 1), gr.view(b, h, pc.n, pc.g, v), 3)

    def coefficient_grads(self, g_all: Tensor, buf: Tensor) -> Tensor:
        """d beta [B, H, T, W] = G_t . y_{idx[t, w]} for every read (near and far), by runs and
        then the irregular entries in blocks; 0 where idx < 0."""
        plan, (b, h, t, v) = self.plan, g_all.shape
        gbeta = g_all.new_zeros(plan.w, b, h, t)
        for pc in plan.pieces:
            ys = buf[:, :, pc.keys]
            if pc.g == 1:
                gbeta[pc.col, :, :, pc.rows] = torch.linalg.vecdot(g_all[:, :, pc.rows], ys)
            else:
                gr = g_all[:, :, pc.rows].reshape(b, h, pc.n, pc.g, v)
                gbeta[pc.col, :, :, pc.rows] = torch.linalg.vecdot(gr, ys[:, :, :, None]).reshape(b, h, -1)
        rows, cols = (plan.on(a, g_all.device) for a in plan.left)
        keys = plan.on(plan.left_keys, g_all.device)
        starts, step = _leftover_blocks(len(rows), b * h * v)
        for s in starts:
            r, cc, j = rows[s : s + step], cols[s : s + step], keys[s : s + step]
            gbeta[cc, :, :, r] = torch.linalg.vecdot(g_all[:, :, r], buf[:, :, j]).permute(2, 0, 1)
        return gbeta.permute(1, 2, 3, 0) * plan.mask("valid", gbeta)


def _gather_rows(buf: Tensor, flat: Tensor) -> Tensor:
    """buf [B, H, N, V] (contiguous) at flat row indices [B, H, n, W] (``RowPatternPlan.flat``) ->
    [B, H, n, W, V]."""
    v = buf.shape[-1]
    return buf.view(-1, v).index_select(0, flat.reshape(-1)).view(*flat.shape, v)


class _GatheredFarReads:
    """The far reads of per-row tables (``RowPatternPlan``) inside ``_PatternSolve``: a chunk's far
    reads gathered from the rows solved before it (one gather per chunk: in a packed row a run
    would end at every document boundary). Same methods as ``_RunFarReads``."""

    def __init__(self, plan: RowPatternPlan, beta: Tensor) -> None:
        self.plan = plan
        self.coef = beta.index_select(-1, plan.on(plan.far_cols, beta.device)) * plan.mask("far", beta)[:, None]
        self.rows = plan.flat("far_keys", beta.shape[1], beta.device)  # [B, H, T, Wf] into the flat buffer

    def add(self, rhs: Tensor, buf: Tensor, ci: int) -> None:
        s, e = self.plan.chunks[ci]
        if self.plan.has_far[ci]:  # far reads are at distance > R >= C: rows solved before this chunk
            rhs[:, :, s:e] += (self.coef[:, :, s:e, :, None] * _gather_rows(buf, self.rows[:, :, s:e])).sum(3)

    def pass_back(self, gacc: Tensor, g_all: Tensor, ci: int) -> None:
        s, e = self.plan.chunks[ci]
        if self.plan.has_far[ci]:
            v = g_all.shape[-1]
            src = self.coef[:, :, s:e, :, None] * g_all[:, :, s:e, None, :]  # [B, H, n, Wf, V]
            gacc.view(-1, v).index_add_(0, self.rows[:, :, s:e].reshape(-1), src.view(-1, v))

    def coefficient_grads(self, g_all: Tensor, buf: Tensor) -> Tensor:
        """d beta [B, H, T, W]: every read gathered, in blocks of rows."""
        plan, (b, h, t, v) = self.plan, g_all.shape
        gbeta = g_all.new_empty(b, h, t, plan.w)
        keys = plan.flat("keys", h, g_all.device)
        _, step = _leftover_blocks(t, b * h * plan.w * v)
        for r0 in range(0, t, step):
            r1 = min(t, r0 + step)
            gbeta[:, :, r0:r1] = torch.linalg.vecdot(_gather_rows(buf, keys[:, :, r0:r1]), g_all[:, :, r0:r1, None])
        return gbeta.mul_(plan.mask("valid", gbeta)[:, None])


def _far_reads(plan: PatternPlan | RowPatternPlan, beta: Tensor) -> _RunFarReads | _GatheredFarReads:
    return _GatheredFarReads(plan, beta) if isinstance(plan, RowPatternPlan) else _RunFarReads(plan, beta)


class _PatternSolve(torch.autograd.Function):
    """(I - B) Y = diag(alpha) X chunk by chunk, for a shared table or per-row tables (module
    docstring): the near reads through each chunk's band block and its inverse, the far reads by
    the plan's kind (``_RunFarReads``, ``_GatheredFarReads``)."""

    @staticmethod
    def forward(ctx, alpha, beta, x, y_prefix, plan):
        # head-first inside: alpha [B,H,T], beta [B,H,T,W], x [B,H,T,V], y_prefix [B,H,P,V]
        b, h, t, v = x.shape
        p, reach = plan.p, plan.reach
        band = _band(beta, plan)
        inv = _chunk_inverses(band, plan)
        far = _far_reads(plan, beta)
        # outputs by buffer position; zeros, as a lattice piece may read a not-yet-solved position
        # with a zero coefficient
        buf = x.new_zeros(b, h, p + t, v)
        buf[:, :, :p] = y_prefix
        rhs = alpha[..., None] * x  # accumulates every contribution a row receives before its solve
        for ci, (s, e) in enumerate(plan.chunks):
            far.add(rhs, buf, ci)
            r_c = rhs[:, :, s:e]
            lo = max(0, p + s - reach)
            if plan.has_prev[ci]:
                r_c = r_c + band[:, :, s:e, lo - (p + s - reach) : reach] @ buf[:, :, lo : p + s]
            buf[:, :, p + s : p + e] = (inv[:, :, ci, : e - s, : e - s] @ r_c.to(inv.dtype)).to(x.dtype)
        ctx.save_for_backward(alpha, beta, x, buf, band, inv)  # band and inv: O(T C), cheaper kept than rebuilt
        ctx.plan = plan
        return buf[:, :, p:].clone()

    @staticmethod
    def backward(ctx, gy):
        alpha, beta, x, buf, band, inv = ctx.saved_tensors
        plan = ctx.plan
        p, reach = plan.p, plan.reach
        b, h, t, v = x.shape
        inv_t = inv.transpose(-1, -2)  # (I - B_cc)^{-T}
        far = _far_reads(plan, beta)
        gacc = gy.new_zeros(b, h, p + t, v)  # gradient reaching each buffer position from later reads
        g_all = gy.new_empty(b, h, t, v)  # G = (I - B)^{-T} dY
        for ci in reversed(range(len(plan.chunks))):
            s, e = plan.chunks[ci]
            g = gy[:, :, s:e] + gacc[:, :, p + s : p + e]
            # (the transpose of a lower block's leading m x m inverse is the top-left of inv^T)
            g = (inv_t[:, :, ci, : e - s, : e - s] @ g.to(inv_t.dtype)).to(gy.dtype)
            g_all[:, :, s:e] = g
            lo = max(0, p + s - reach)
            if plan.has_prev[ci]:
                gacc[:, :, lo : p + s] += band[:, :, s:e, lo - (p + s - reach) : reach].transpose(-1, -2) @ g
            far.pass_back(gacc, g_all, ci)
        galpha = (g_all * x).sum(-1)
        gx = alpha[..., None] * g_all
        return galpha, far.coefficient_grads(g_all, buf), gx, gacc[:, :, :p], None


def chunked_pattern_solve(
    alpha: Tensor,
    beta: Tensor,
    idx: Tensor,
    x: Tensor,
    y_prefix: Tensor | None = None,
    chunk_size: int = 64,
    plan: PatternPlan | None = None,
) -> Tensor:
    """Solve the pattern recurrence chunk by chunk.

    Args:
        alpha: [B, T, H] self coefficients (the diagonal of A).
        beta: [B, T, H, W] neighbour coefficients; entries where idx < 0 are ignored.
        idx: [T, W] long, buffer position read by (t, w), -1 for none; must satisfy idx[t] < P + t.
            Or per-row tables [B, T, W] (packed rows, ``packed_table``; module docstring).
        x: [B, T, H, V] inputs (values).
        y_prefix: [B, P, H, V] outputs of cached earlier positions (buffer positions 0..P-1), or None.
        chunk_size: C, the block size of the triangular solves.
        plan: the table's ``PatternPlan`` for this P and C (built here if None).
    Returns:
        y: [B, T, H, V].
    """
    if chunk_size <= 0:
        raise InputError(f"chunk_size must be > 0, got {chunk_size}")
    b, t, h, v = x.shape
    if y_prefix is None:
        y_prefix = x.new_zeros(b, 0, h, v)
    if beta.dim() != 4 or beta.shape[:3] != (b, t, h) or not table_fits(idx, b, t, beta.shape[3]):
        raise InputError(f"shape mismatch: x {tuple(x.shape)}, beta {tuple(beta.shape)}, idx {tuple(idx.shape)}")
    p = y_prefix.shape[1]
    if plan is None:
        plan = plan_pattern(idx, p, chunk_size)
    elif (plan.t, plan.w, plan.p, plan.chunk) != (t, idx.shape[-1], p, chunk_size) or isinstance(
        plan, RowPatternPlan
    ) != (idx.dim() == 3):
        raise InputError(
            f"plan for T={plan.t}, W={plan.w}, P={plan.p}, C={plan.chunk} "
            f"({'per-row' if isinstance(plan, RowPatternPlan) else 'shared'} table) used with "
            f"idx {tuple(idx.shape)}, P={p}, C={chunk_size}"
        )
    y = _PatternSolve.apply(
        alpha.transpose(1, 2), beta.transpose(1, 2), x.transpose(1, 2), y_prefix.transpose(1, 2), plan
    )
    return y.transpose(1, 2)
