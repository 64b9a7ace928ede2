"""Triton kernels for the pattern solve and the neighbour scores, forward and backward (GPU; the CPU
runs them under Triton's interpreter, ``TRITON_INTERPRET=1``, for the tests).

Contract (the backend seam swaps these for the numba pair, ``numba.compiled_pattern_solve`` /
``numba.compiled_pattern_scores``, so the signatures, shapes and semantics are theirs):

    triton_pattern_solve(alpha, beta, idx, x, y_prefix=None, chunk_size=64, plan=None) -> y
        alpha [B, T, H], beta [B, T, H, W], x [B, T, H, V], y_prefix [B, P, H, V] or None,
        idx [T, W] (shared) or [B, T, W] (per-row, ``plan.packed_table``) long buffer positions,
        -1 = none, idx[t] < P + t; y [B, T, H, V] with
            y_t = alpha_t x_t + sum_w beta_{t,w} y_{idx[t,w]}         (I - B) Y = diag(alpha) X
    triton_pattern_scores(q, kbuf, idx, plan=None) -> s
        q [B, T, H, K], kbuf [B, P + T, H, K]; s [B, T, H, W] = q_t . kbuf[idx[t, w]] (0 where idx < 0)

Both are differentiable in every floating input (once: ``once_differentiable``); ``chunk_size`` and
``plan`` are unused (the torch path's, kept so the backends share one signature). Tensors the
kernels cannot take (triton missing; not float32 / float64 CUDA tensors of one dtype -- CPU ones
under the interpreter) are refused in one InputError line (``check_tensors``; ``supported`` asks
without raising): ``backend.choose_backend`` picks the backend, nothing here falls back. The
softmax of the scores and the gate coefficients stay torch elementwise ops between the two kernels
(not fused). Left padding and packed rows are the caller's, as for the torch path: zeroed
coefficients on a shared table, or per-row tables.

The solve, one program per (b h, block of BV value columns), chunks of C = 16 positions in order:
    * rhs = alpha x, plus every read of a position before the chunk, gathered from the output
      buffer the program has already written (a barrier after each chunk's store makes it
      visible to all the program's threads);
    * the reads inside the chunk form a dense C x C strictly lower tile N (one-hot over the
      index table's columns), and the chunk is Y_c = (I - N)^{-1} rhs with
      (I - N)^{-1} = (I + N)(I + N^2)(I + N^4)(I + N^8)        (N^16 = 0)
      applied as 4 + 3 ``tl.dot``s: log-depth, no per-row loop. Equal to the substitution up to
      rounding (the torch path inverts the same tile with a triangular solve).
Backward, G = (I - B)^{-T} dY in reverse chunk order: a chunk's G gathers beta_{t,w} G_t from its
readers in later chunks through the transposed table (``plan.transposed_table``: for each buffer
position, which (t, w) read it, CSR, sorted) -- a gather again, so no atomics and a fixed order --
then G_c = (I - N^T)^{-1} (dY_c + that), the same product with N^T. On the spot:
    d alpha_t = G_t . x_t,  d x_t = alpha_t G_t,  d beta_{t,w} = G_t . y_{idx[t,w]}
(the first and last as per-block partial sums, added in torch: deterministic), and after the last
chunk d y_prefix_j = sum over its readers of beta G_t.
Scores: s gathered per (b h, block of rows); dq gathers ds kbuf[idx]; dkbuf gathers ds q over the
transposed table.

Tables: idx as int32 and its transposed table are made on the tensors' device on first use and
kept for that idx tensor object, prefix and device (``_tables``): later calls upload nothing and
read nothing back. Causality is checked then, once per table (the kernels trust it: a later read
would see an unwritten row); that check is a host sync, so a table made afresh for every call (the
per-row tables of a packed batch) pays one per call.

GPU notes (unchecked here, no GPU: the interpreter proves the arithmetic only): float32 dots use
``input_precision="ieee"`` (tf32 would miss the 1e-5 tolerance); every dot is >= 16 on a side;
BV = min(64, next power of two >= max(V, 16)); a program reads back rows it wrote itself, after
``tl.debug_barrier`` (bar.sync orders a block's global memory accesses); never timed.
Reference: ``reference.recurrent_pattern_solve``, ``reference.pattern_scores_reference``.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.utils.weak import WeakIdKeyDictionary

from tokenmix.core.errors import InputError
from tokenmix.ops.pattern.plan import check_causal, check_solve_shapes, table_fits, transposed_table

try:  # optional: the module imports without it (``available()`` false, every call refused)
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - not installed, or an install that fails to import
    triton = None

_CHUNK, _LOG_CHUNK = 16, 4  # C and log2 C of the solve's tiles
_MAX_BLOCK_V = 64  # value (and key) columns per program
_BLOCK_ROWS = 16  # rows per program of the score kernels
_NUM_WARPS = 4
_DTYPES = (torch.float32, torch.float64)
# the kernels below are made for the interpreter iff TRITON_INTERPRET=1 when this module is imported
# (triton decides at decoration; setting it later changes nothing here)
_KNOBS = getattr(getattr(triton, "knobs", None), "runtime", None)  # triton >= 3.4; else the variable itself
_INTERPRETED = triton is not None and bool(
    _KNOBS.interpret if _KNOBS is not None else os.environ.get("TRITON_INTERPRET") == "1"
)


def available() -> bool:
    """Whether triton imports."""
    return triton is not None


def interpreted() -> bool:
    """Whether the kernels run under Triton's interpreter (on CPU tensors) rather than on CUDA."""
    return _INTERPRETED


def supported(*tensors: Tensor) -> bool:
    """Whether the kernels take ``tensors``: triton importable, one dtype of float32 / float64,
    all on CUDA (or all on the CPU under the interpreter)."""
    if triton is None or not tensors or len({z.dtype for z in tensors}) != 1 or tensors[0].dtype not in _DTYPES:
        return False
    want = "cpu" if _INTERPRETED else "cuda"
    return all(z.device.type == want for z in tensors)


def check_tensors(tensors) -> None:
    """Refuse, in one InputError line, tensors the kernels cannot take (or triton missing)."""
    if supported(*tensors):
        return
    if triton is None:
        raise InputError("backend 'triton' is unavailable (triton not importable)")
    got = sorted({f"{z.dtype} on {z.device}" for z in tensors})
    where = "CPU (TRITON_INTERPRET=1)" if _INTERPRETED else "CUDA"
    raise InputError(f"backend 'triton' takes float32 or float64 {where} tensors of one dtype, got {got}")


class _Tables:
    """One index table on one device: idx [R, T, W] int32 (R = 1 shared, B per row) and its
    transposed table (``plan.transposed_table``: starts [R (P + T) + 1], entries [R T W])."""

    def __init__(self, idx: Tensor, prefix: int, device: torch.device) -> None:
        check_causal(idx, prefix)  # once per table (one host sync, with the upload)
        tab = idx.to(device=device, dtype=torch.long)
        self.per_row = int(tab.dim() == 3)
        self.idx = (tab if self.per_row else tab[None]).to(torch.int32).contiguous()
        self.starts, self.entries = transposed_table(tab, prefix)


_TABLES: WeakIdKeyDictionary = WeakIdKeyDictionary()  # idx tensor -> {(P, device, version): _Tables}


@torch.inference_mode(False)  # kept across calls: never inference tensors
def _tables(idx: Tensor, prefix: int, device: torch.device) -> _Tables:
    """The device tables of ``idx`` for this prefix, made on first use and kept while idx lives."""
    per = _TABLES.setdefault(idx, {})
    key = (prefix, str(device), idx._version)  # an in-place edit of idx makes new tables
    if key not in per:
        per[key] = _Tables(idx, prefix, device)
    return per[key]


def _block(n: int) -> int:
    return min(_MAX_BLOCK_V, max(16, triton.next_power_of_2(n)))


if triton is not None:

    @triton.jit
    def _load_rows(ptr, b, n_rows, h, j, ok, cols, cmask, H, D):
        """Rows j (where ok) of a contiguous [B, n_rows, H, D] tensor at columns cols: [len(j),
        len(cols)], 0 elsewhere (masked lanes point at row 0: never out of bounds)."""
        off = ((b * n_rows + tl.where(ok, j, 0)) * H + h) * D
        return tl.load(ptr + off[:, None] + cols[None, :], mask=ok[:, None] & cmask[None, :], other=0.0)

    @triton.jit
    def _store_rows(ptr, val, b, n_rows, h, j, ok, cols, cmask, H, D):
        off = ((b * n_rows + j) * H + h) * D
        tl.store(ptr + off[:, None] + cols[None, :], val, mask=ok[:, None] & cmask[None, :])

    @triton.jit
    def _load_buffer(yp, y, b, h, j, ok, cols, cmask, T, P, H, V):
        """Buffer rows j: the prefix y_prefix [B, P, H, V] below P, the outputs y [B, T, H, V] above."""
        pre = _load_rows(yp, b, P, h, j, ok & (j < P), cols, cmask, H, V)
        return pre + _load_rows(y, b, T, h, j - P, ok & (j >= P), cols, cmask, H, V)

    @triton.jit
    def _coef_ptrs(ptr, b, T, h, t, w, H, W):
        """Pointers to entry (t, w) of a contiguous [B, T, H, W] tensor (beta, ds, scores)."""
        return ptr + ((b * T + t) * H + h) * W + w

    @triton.jit
    def _chunk_reads(
        idx, beta, yp, y, b, ib, h, t, tmask, base, cols, cmask, T, P, H, W, V, C: tl.constexpr, BV: tl.constexpr
    ):
        """For rows t of a chunk starting at buffer position base: far [C, BV], the sum of the reads
        before the chunk gathered from the buffer (zeros if yp is None: the backward's tile only),
        and N [C, C], the reads inside the chunk (N[r, c] = beta of row r on position base + c)."""
        inside = tl.arange(0, C)
        far = tl.zeros((C, BV), dtype=beta.dtype.element_ty)
        n = tl.zeros((C, C), dtype=beta.dtype.element_ty)
        for w in range(W):
            j = tl.load(idx + (ib * T + t) * W + w, mask=tmask, other=-1)
            cf = tl.load(_coef_ptrs(beta, b, T, h, t, w, H, W), mask=tmask, other=0.0)
            if yp is not None:
                before = (j >= 0) & (j < base)
                far += cf[:, None] * _load_buffer(yp, y, b, h, j, before, cols, cmask, T, P, H, V)
            hit = ((j - base)[:, None] == inside[None, :]) & (j >= base)[:, None]
            n += tl.where(hit, cf[:, None], 0.0)
        return far, n

    @triton.jit
    def _unit_lower_solve(n, z, LOG_C: tl.constexpr):
        """(I - n)^{-1} z for a nilpotent n [C, C] (n^C = 0, C = 2^LOG_C): prod_k (I + n^(2^k)) z,
        the factors commuting (powers of one matrix)."""
        pw = n
        for k in tl.static_range(LOG_C):
            z += tl.dot(pw, z, input_precision="ieee")
            if k + 1 < LOG_C:
                pw = tl.dot(pw, pw, input_precision="ieee")
        return z

    @triton.jit
    def _readers_sum(
        starts, entries, coef, rows, b, ib, h, j, jmask, t_min, cols, cmask, T, N, H, W, D,
        BJ: tl.constexpr, BD: tl.constexpr,
    ):  # fmt: skip
        """sum over the readers (t, w) of buffer positions j with t >= t_min of coef[b, t, h, w]
        rows[b, t, h, cols]: [BJ, BD] (coef [B, T, H, W], rows [B, T, H, D]; the transposed table,
        readers in ascending t: a fixed order)."""
        s0 = tl.load(starts + ib * N + j, mask=jmask, other=0)
        cnt = tl.load(starts + ib * N + j + 1, mask=jmask, other=0) - s0
        acc = tl.zeros((BJ, BD), dtype=rows.dtype.element_ty)
        for m in range(0, tl.max(cnt, axis=0)):
            e = tl.load(entries + s0 + m, mask=m < cnt, other=0)
            tr, wr = e // W, e % W
            ok = (m < cnt) & (tr >= t_min)
            cf = tl.load(_coef_ptrs(coef, b, T, h, tr, wr, H, W), mask=ok, other=0.0)
            acc += cf[:, None] * _load_rows(rows, b, T, h, tr, ok, cols, cmask, H, D)
        return acc

    @triton.jit
    def _solve_forward_kernel(
        alpha, beta, x, yp, y, idx, T, P, H, W, V, per_row, C: tl.constexpr, LOG_C: tl.constexpr, BV: tl.constexpr
    ):
        bh = tl.program_id(0).to(tl.int64)
        b, h = bh // H, bh % H
        ib = b * per_row
        cols = tl.program_id(1) * BV + tl.arange(0, BV)
        cmask = cols < V
        for c0 in range(0, T, C):
            t = c0 + tl.arange(0, C)
            tmask = t < T
            a = tl.load(alpha + (b * T + t) * H + h, mask=tmask, other=0.0)
            z = a[:, None] * _load_rows(x, b, T, h, t, tmask, cols, cmask, H, V)
            far, n = _chunk_reads(idx, beta, yp, y, b, ib, h, t, tmask, P + c0, cols, cmask, T, P, H, W, V, C, BV)
            _store_rows(y, _unit_lower_solve(n, z + far, LOG_C), b, T, h, t, tmask, cols, cmask, H, V)
            tl.debug_barrier()  # the next chunks gather these rows

    @triton.jit
    def _solve_backward_kernel(
        alpha, beta, x, yp, y, idx, starts, entries, gy, g, gx, galpha, gbeta, gp,
        B, T, P, H, W, V, per_row, C: tl.constexpr, LOG_C: tl.constexpr, BV: tl.constexpr,
    ):  # fmt: skip
        # g [B, T, H, V] receives G (read back by earlier chunks); galpha [NV, B, T, H] and gbeta
        # [NV, B, T, H, W] this block's partial sums over its BV columns
        bh = tl.program_id(0).to(tl.int64)
        b, h = bh // H, bh % H
        ib = b * per_row
        vb = tl.program_id(1)
        cols = vb * BV + tl.arange(0, BV)
        cmask = cols < V
        n_chunks = tl.cdiv(T, C)
        part = vb * B + b
        for ci in range(0, n_chunks):
            c0 = (n_chunks - 1 - ci) * C
            t = c0 + tl.arange(0, C)
            tmask = t < T
            z = _load_rows(gy, b, T, h, t, tmask, cols, cmask, H, V)
            # reads of these rows by rows of later chunks (their G is final)
            later = _readers_sum(
                starts, entries, beta, g, b, ib, h, P + t, tmask, c0 + C, cols, cmask, T, P + T, H, W, V, C, BV
            )
            z += later
            _, n = _chunk_reads(idx, beta, None, y, b, ib, h, t, tmask, P + c0, cols, cmask, T, P, H, W, V, C, BV)
            z = _unit_lower_solve(tl.trans(n), z, LOG_C)
            _store_rows(g, z, b, T, h, t, tmask, cols, cmask, H, V)
            a = tl.load(alpha + (b * T + t) * H + h, mask=tmask, other=0.0)
            _store_rows(gx, a[:, None] * z, b, T, h, t, tmask, cols, cmask, H, V)
            xr = _load_rows(x, b, T, h, t, tmask, cols, cmask, H, V)
            tl.store(galpha + (part * T + t) * H + h, tl.sum(z * xr, axis=1), mask=tmask)
            for w in range(W):
                j = tl.load(idx + (ib * T + t) * W + w, mask=tmask, other=-1)
                yr = _load_buffer(yp, y, b, h, j, j >= 0, cols, cmask, T, P, H, V)
                tl.store(_coef_ptrs(gbeta, part, T, h, t, w, H, W), tl.sum(z * yr, axis=1), mask=tmask)
            tl.debug_barrier()  # earlier chunks gather these rows of G
        for p0 in range(0, P, C):  # every G is final: the prefix positions sum their readers
            j = p0 + tl.arange(0, C)
            jmask = j < P
            acc = _readers_sum(starts, entries, beta, g, b, ib, h, j, jmask, 0, cols, cmask, T, P + T, H, W, V, C, BV)
            _store_rows(gp, acc, b, P, h, j, jmask, cols, cmask, H, V)

    @triton.jit
    def _scores_forward_kernel(
        q, kbuf, idx, s, T, N, H, W, K, per_row, BT: tl.constexpr, BW: tl.constexpr, BK: tl.constexpr
    ):
        bh = tl.program_id(0).to(tl.int64)
        b, h = bh // H, bh % H
        ib = b * per_row
        t = tl.program_id(1) * BT + tl.arange(0, BT)
        tmask = t < T
        level = tl.arange(0, BW)
        acc = tl.zeros((BT, BW), dtype=q.dtype.element_ty)
        for k0 in range(0, K, BK):
            cols = k0 + tl.arange(0, BK)
            cmask = cols < K
            qr = _load_rows(q, b, T, h, t, tmask, cols, cmask, H, K)
            for w in range(W):
                j = tl.load(idx + (ib * T + t) * W + w, mask=tmask, other=-1)
                dot = tl.sum(qr * _load_rows(kbuf, b, N, h, j, j >= 0, cols, cmask, H, K), axis=1)
                acc += tl.where(level[None, :] == w, dot[:, None], 0.0)
        written = tmask[:, None] & (level < W)[None, :]
        tl.store(_coef_ptrs(s, b, T, h, t[:, None], level[None, :], H, W), acc, mask=written)

    @triton.jit
    def _scores_dq_kernel(kbuf, idx, ds, dq, T, N, H, W, K, per_row, BT: tl.constexpr, BK: tl.constexpr):
        bh = tl.program_id(0).to(tl.int64)
        b, h = bh // H, bh % H
        ib = b * per_row
        t = tl.program_id(1) * BT + tl.arange(0, BT)
        tmask = t < T
        cols = tl.program_id(2) * BK + tl.arange(0, BK)
        cmask = cols < K
        acc = tl.zeros((BT, BK), dtype=dq.dtype.element_ty)
        for w in range(W):
            j = tl.load(idx + (ib * T + t) * W + w, mask=tmask, other=-1)
            d = tl.load(_coef_ptrs(ds, b, T, h, t, w, H, W), mask=j >= 0, other=0.0)
            acc += d[:, None] * _load_rows(kbuf, b, N, h, j, j >= 0, cols, cmask, H, K)
        _store_rows(dq, acc, b, T, h, t, tmask, cols, cmask, H, K)

    @triton.jit
    def _scores_dk_kernel(q, ds, starts, entries, dk, T, N, H, W, K, per_row, BT: tl.constexpr, BK: tl.constexpr):
        bh = tl.program_id(0).to(tl.int64)
        b, h = bh // H, bh % H
        j = tl.program_id(1) * BT + tl.arange(0, BT)
        jmask = j < N
        cols = tl.program_id(2) * BK + tl.arange(0, BK)
        cmask = cols < K
        acc = _readers_sum(starts, entries, ds, q, b, b * per_row, h, j, jmask, 0, cols, cmask, T, N, H, W, K, BT, BK)
        _store_rows(dk, acc, b, N, h, j, jmask, cols, cmask, H, K)


class _TritonSolve(torch.autograd.Function):
    @staticmethod
    def forward(ctx, alpha, beta, x, y_prefix, tables):
        alpha, beta, x, y_prefix = (z.contiguous() for z in (alpha, beta, x, y_prefix))
        b, t, h, v = x.shape
        p, bv = y_prefix.shape[1], _block(v)
        y = torch.empty_like(x)
        yp = y_prefix if p else y  # never read when P = 0 (a real pointer for the launch)
        _solve_forward_kernel[(b * h, triton.cdiv(v, bv))](
            alpha, beta, x, yp, y, tables.idx, t, p, h, beta.shape[3], v, tables.per_row,
            C=_CHUNK, LOG_C=_LOG_CHUNK, BV=bv, num_warps=_NUM_WARPS,
        )  # fmt: skip
        ctx.save_for_backward(alpha, beta, x, y_prefix, y)
        ctx.tables = tables
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        alpha, beta, x, y_prefix, y = ctx.saved_tensors
        tables = ctx.tables
        b, t, h, v = x.shape
        p, w, bv = y_prefix.shape[1], beta.shape[3], _block(v)
        nv = triton.cdiv(v, bv)
        g, gx, gp = torch.empty_like(x), torch.empty_like(x), torch.empty_like(y_prefix)
        galpha, gbeta = alpha.new_empty(nv, *alpha.shape), beta.new_empty(nv, *beta.shape)
        _solve_backward_kernel[(b * h, nv)](
            alpha, beta, x, y_prefix if p else y, y, tables.idx, tables.starts, tables.entries,
            gy.contiguous(), g, gx, galpha, gbeta, gp if p else g,
            b, t, p, h, w, v, tables.per_row, C=_CHUNK, LOG_C=_LOG_CHUNK, BV=bv, num_warps=_NUM_WARPS,
        )  # fmt: skip
        return galpha.sum(0), gbeta.sum(0), gx, gp, None


class _TritonScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, kbuf, tables):
        q, kbuf = q.contiguous(), kbuf.contiguous()
        b, t, h, k = q.shape
        w = tables.idx.shape[2]
        s = q.new_empty(b, t, h, w)
        _scores_forward_kernel[(b * h, triton.cdiv(t, _BLOCK_ROWS))](
            q, kbuf, tables.idx, s, t, kbuf.shape[1], h, w, k, tables.per_row,
            BT=_BLOCK_ROWS, BW=max(1, triton.next_power_of_2(w)), BK=_block(k), num_warps=_NUM_WARPS,
        )  # fmt: skip
        ctx.save_for_backward(q, kbuf)
        ctx.tables = tables
        return s

    @staticmethod
    @once_differentiable
    def backward(ctx, ds):
        q, kbuf = ctx.saved_tensors
        tables = ctx.tables
        b, t, h, k = q.shape
        n, w, bk = kbuf.shape[1], tables.idx.shape[2], _block(k)
        ds = ds.contiguous()
        dq, dk = torch.empty_like(q), torch.empty_like(kbuf)
        grid = (b * h, triton.cdiv(t, _BLOCK_ROWS), triton.cdiv(k, bk))
        _scores_dq_kernel[grid](
            kbuf, tables.idx, ds, dq, t, n, h, w, k, tables.per_row, BT=_BLOCK_ROWS, BK=bk, num_warps=_NUM_WARPS
        )
        grid = (b * h, triton.cdiv(n, _BLOCK_ROWS), triton.cdiv(k, bk))
        _scores_dk_kernel[grid](
            q, ds, tables.starts, tables.entries, dk, t, n, h, w, k, tables.per_row,
            BT=_BLOCK_ROWS, BK=bk, num_warps=_NUM_WARPS,
        )  # fmt: skip
        return dq, dk, None


def triton_pattern_solve(
    alpha: Tensor, beta: Tensor, idx: Tensor, x: Tensor, y_prefix: Tensor | None = None, chunk_size: int = 64, plan=None
) -> Tensor:
    """``chunked_pattern_solve`` with the same arguments, by the Triton kernels (module docstring).

    Args:
        alpha: [B, T, H]; beta: [B, T, H, W]; idx: [T, W] long buffer positions (-1 = none,
            idx[t] < P + t), or per-row tables [B, T, W] (packed rows), on any device (moved to
            the tensors' once, and kept); x: [B, T, H, V]; y_prefix: [B, P, H, V] or None.
        chunk_size, plan: unused (the torch path's; one signature for every backend).
    Returns:
        y: [B, T, H, V].
    Raises:
        InputError: tensors the kernels cannot take (``check_tensors``), shapes that do not fit,
            a table that is not causal.
    """
    if y_prefix is None:
        y_prefix = x.new_zeros(x.shape[0], 0, *x.shape[2:])
    check_tensors((alpha, beta, x, y_prefix))
    check_solve_shapes(alpha, beta, idx, x, y_prefix)
    return _TritonSolve.apply(alpha, beta, x, y_prefix, _tables(idx, y_prefix.shape[1], x.device))


def triton_pattern_scores(q: Tensor, kbuf: Tensor, idx: Tensor, plan=None) -> Tensor:
    """``pattern_scores`` with the same arguments, by the Triton kernels: s[t, w] = q_t .
    kbuf[idx[t, w]] (0 where idx < 0), [B, T, H, W]; q [B, T, H, K], kbuf [B, P + T, H, K], idx
    [T, W] or per-row [B, T, W]. ``plan`` is unused (the torch path's). Refuses what
    ``triton_pattern_solve`` refuses."""
    b, t, h, k = q.shape
    p = kbuf.shape[1] - t
    check_tensors((q, kbuf))
    if kbuf.shape[0] != b or kbuf.shape[2:] != (h, k) or p < 0 or not table_fits(idx, b, t):
        raise InputError(f"shape mismatch: q {tuple(q.shape)}, kbuf {tuple(kbuf.shape)}, idx {tuple(idx.shape)}")
    return _TritonScores.apply(q, kbuf, _tables(idx, p, q.device))


__all__ = ["available", "check_tensors", "interpreted", "supported", "triton_pattern_scores", "triton_pattern_solve"]
