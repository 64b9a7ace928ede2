"""Compiled (numba) pattern solve and neighbour scores: the structured recurrence at memory speed.

The recurrence, per batch element b and head h (buffer positions as in the package docstring: the P
cached outputs first, then the T new ones):

    y_t = alpha_t x_t + sum_w beta_{t,w} y_{idx[t,w]}            (idx[t,w] < P + t, -1 = none)
    s_{t,w} = q_t . k_{idx[t,w]}                                 (the scores the softmax reads)

Why compiled, and why this form. The pure-PyTorch kernels (``chunked.chunked_pattern_solve``)
must express a sequential solve as tensor operations: dense band blocks per chunk, slice operations
per run of a level, a batched C x C inverse -- about thirty memory-bound passes over [B, T, H, V]
plus small matmuls, each paying an operator dispatch. Compiled code can do what the derivation
says: one forward sweep over t per (b, h), reading |N(t)| earlier rows of an output buffer that
stays in cache (T V values per head: 2 MB at T = 8192, V = 64, fp32), and one reverse sweep for
the transposed solve G = (I - B)^{-T} dY with every gradient of the row produced on the spot:

    d alpha_t = G_t . x_t,  d x_t = alpha_t G_t,  d beta_{t,w} = G_t . y_{idx[t,w]},
    G_{idx[t,w]} += beta_{t,w} G_t                       (rows are final when the sweep reaches them)

That is O(T |N| V) work per head with no band, no chunk inverse and no index plan, for *every*
table (exact patterns, lattices, Fenwick, reads of a sparse cache) alike. (b, h) pairs are
independent, so the sweeps run in parallel over B H with ``prange`` (both cores busy); within a
row the V- and K-loops are contiguous and vectorise.

Availability and threads (``ops/numba_runtime.py``): numba runs where it imports and
``TOKENMIX_NO_COMPILED`` is not set (``kernel_available()``), on float32 / float64 CPU tensors of
one dtype. Whether a call runs here or on another backend is ``backend.choose_backend``'s answer,
the one place that decides it; the functions here run numba or refuse the tensors (``check_tensors``,
one InputError line), they do not fall back. The generic mixer matrix checks them against the dense
reference in float64 (the ``compiled`` mode, numba, beside the ``chunked`` mode on the torch backend).
Reference for the tests: ``reference.recurrent_pattern_solve`` and
``reference.pattern_scores_reference``.

Packed rows (documents back to back, ``core/packing.py``). The table may be per row, idx [B, T, W]
(``plan.packed_table``): row b's sweeps read row b's table, so a row's tokens read the
neighbours of their own document (the document's own neighbour set, shifted by its start; -1 for
the ones before the start) and nothing else, and no gradient crosses a boundary; the cost is that
of the shared table. Exact-distance patterns may keep the shared table instead and give the
neighbours before a token's document start a zero coefficient (their outputs are read and
multiplied by 0; d beta there is computed and discarded by the masked normalisation).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.ops.numba_runtime import PARALLEL_JIT as _JIT
from tokenmix.ops.numba_runtime import as_numpy as _np
from tokenmix.ops.numba_runtime import kernel_available, launch, numba, supported
from tokenmix.ops.pattern.lattice_step import LatticeStep
from tokenmix.ops.pattern.plan import check_causal, check_solve_shapes, table_fits

if numba is not None:
    from numba import njit, prange


if numba is not None:
    # Each (b, h) sweep keeps the row it works on in a local vector (acc / gt): the output buffer is
    # read and written through one array, and with the row in a separate vector LLVM can vectorise
    # the V-loops (it cannot prove that y[t] and y[j] do not overlap).
    @njit(**_JIT)
    def _solve_forward(alpha, beta, idx, x, yp, y):  # pragma: no cover - compiled
        # alpha [B,T,H], beta [B,T,H,W], idx [1 or B,T,W], x [B,T,H,V], yp [B,P,H,V] -> y [B,T,H,V] (written)
        nb, nt, nh, nv = x.shape
        nw = idx.shape[2]
        p = yp.shape[1]
        for bh in prange(nb * nh):
            b, h = bh // nh, bh % nh
            ib = b if idx.shape[0] > 1 else 0  # the row's own table, or the one all rows share
            acc = np.empty(nv, dtype=y.dtype)
            for t in range(nt):
                a = alpha[b, t, h]
                for v in range(nv):
                    acc[v] = a * x[b, t, h, v]
                for w in range(nw):
                    j = idx[ib, t, w]
                    if j < 0:
                        continue
                    c = beta[b, t, h, w]
                    if j < p:
                        for v in range(nv):
                            acc[v] += c * yp[b, j, h, v]
                    else:
                        for v in range(nv):
                            acc[v] += c * y[b, j - p, h, v]
                for v in range(nv):
                    y[b, t, h, v] = acc[v]

    @njit(**_JIT)
    def _solve_backward(alpha, beta, idx, x, yp, y, g, galpha, gbeta, gx, gp):  # pragma: no cover
        # g [B,T,H,V] holds dY on entry and G = (I - B)^{-T} dY on exit (accumulated in place);
        # galpha [B,T,H], gbeta [B,T,H,W], gx [B,T,H,V], gp [B,P,H,V] (zeros) are written
        nb, nt, nh, nv = x.shape
        nw = idx.shape[2]
        p = yp.shape[1]
        for bh in prange(nb * nh):
            b, h = bh // nh, bh % nh
            ib = b if idx.shape[0] > 1 else 0
            gt = np.empty(nv, dtype=g.dtype)
            for t in range(nt - 1, -1, -1):
                a = alpha[b, t, h]
                acc = 0.0
                for v in range(nv):
                    gt[v] = g[b, t, h, v]
                    acc += gt[v] * x[b, t, h, v]
                    gx[b, t, h, v] = a * gt[v]
                galpha[b, t, h] = acc
                for w in range(nw):
                    j = idx[ib, t, w]
                    if j < 0:
                        gbeta[b, t, h, w] = 0.0
                        continue
                    c = beta[b, t, h, w]
                    acc = 0.0
                    if j < p:
                        for v in range(nv):
                            acc += gt[v] * yp[b, j, h, v]
                            gp[b, j, h, v] += c * gt[v]
                    else:
                        for v in range(nv):
                            acc += gt[v] * y[b, j - p, h, v]
                            g[b, j - p, h, v] += c * gt[v]
                    gbeta[b, t, h, w] = acc

    @njit(**_JIT)
    def _scores_forward(q, kb, idx, s):  # pragma: no cover - compiled
        # q [B,T,H,K], kb [B,P+T,H,K], idx [1 or B,T,W] -> s [B,T,H,W] (written; 0 where idx < 0)
        nb, nt, nh, nk = q.shape
        nw = idx.shape[2]
        for bh in prange(nb * nh):
            b, h = bh // nh, bh % nh
            ib = b if idx.shape[0] > 1 else 0
            for t in range(nt):
                for w in range(nw):
                    j = idx[ib, t, w]
                    acc = 0.0
                    if j >= 0:
                        for k in range(nk):
                            acc += q[b, t, h, k] * kb[b, j, h, k]
                    s[b, t, h, w] = acc

    @njit(**_JIT)
    def _scores_backward(q, kb, idx, ds, dq, dkb):  # pragma: no cover - compiled
        # ds [B,T,H,W] -> dq [B,T,H,K] (written), dkb [B,P+T,H,K] (zeros on entry, accumulated)
        nb, nt, nh, nk = q.shape
        nw = idx.shape[2]
        for bh in prange(nb * nh):
            b, h = bh // nh, bh % nh
            ib = b if idx.shape[0] > 1 else 0
            qt = np.empty(nk, dtype=q.dtype)
            dqt = np.empty(nk, dtype=q.dtype)
            for t in range(nt):
                for k in range(nk):
                    qt[k] = q[b, t, h, k]
                    dqt[k] = 0.0
                for w in range(nw):
                    j = idx[ib, t, w]
                    if j < 0:
                        continue
                    d = ds[b, t, h, w]
                    for k in range(nk):
                        dqt[k] += d * kb[b, j, h, k]
                        dkb[b, j, h, k] += d * qt[k]
                for k in range(nk):
                    dq[b, t, h, k] = dqt[k]

    # One decoded token: a few hundred multiply-adds per head, so no threads (their wake-up would
    # cost more than the work) -- one call instead of a dozen tensor operations.
    @njit(fastmath=True, cache=True, nogil=True)
    def _read(qkv, keys, values, slots, visible, scale, y):  # pragma: no cover - compiled
        # qkv [B,3,H,K] the token's q, k, v; keys [B,S,H,K], values [B,S,H,V]; slots [W] (-1 = none);
        # visible [B,W] uint8 (0: that row does not read that neighbour, e.g. its padding); y [B,H,V]
        # written after every read (it may alias a slot no neighbour reads)
        nb, _, nh, nk = qkv.shape
        nv = values.shape[3]
        nw = slots.shape[0]
        logit = np.empty(nw + 1, dtype=np.float64)
        for b in range(nb):
            for h in range(nh):
                acc = 0.0
                for i in range(nk):
                    acc += qkv[b, 0, h, i] * qkv[b, 1, h, i]
                logit[0] = acc * scale
                top = logit[0]
                for w in range(nw):
                    j = slots[w]
                    if j < 0 or not visible[b, w]:
                        continue
                    acc = 0.0
                    for i in range(nk):
                        acc += qkv[b, 0, h, i] * keys[b, j, h, i]
                    logit[w + 1] = acc * scale
                    top = max(top, logit[w + 1])
                total = np.exp(logit[0] - top)
                logit[0] = total
                for w in range(nw):
                    if slots[w] >= 0 and visible[b, w]:
                        logit[w + 1] = np.exp(logit[w + 1] - top)
                        total += logit[w + 1]
                c = logit[0] / total
                for i in range(nv):
                    y[b, h, i] = c * qkv[b, 2, h, i]
                for w in range(nw):
                    j = slots[w]
                    if j < 0 or not visible[b, w]:
                        continue
                    c = logit[w + 1] / total
                    for i in range(nv):
                        y[b, h, i] += c * values[b, j, h, i]

    @njit(cache=True, nogil=True)
    def _find(held, wanted, out):  # pragma: no cover - compiled
        # out[i] = slot of position wanted[i] in the sorted held positions (-1 stays -1); False if absent
        for i in range(wanted.shape[0]):
            p = wanted[i]
            if p < 0:
                out[i] = -1
                continue
            j = np.searchsorted(held, p)
            if j >= held.shape[0] or held[j] != p:
                return False
            out[i] = j
        return True

    @njit(cache=True, nogil=True)
    def _lattice_step(qkv, kv, held, hslot, end, row, nxt, pos, scale, keep, new_slots):  # pragma: no cover
        # kv [2,B,cap,H,K]: keys kv[0], values kv[1]; the cache holds the sorted positions ``held``
        # at storage slots ``hslot``. The token at pos reads its table row, its key and output go
        # to the never-used slot ``end``; the next cache -- the sorted positions of the next row --
        # is written to keep / new_slots (no entry moves). Returns their count, or -1 if a position
        # the rows name is not held (or pos + 1 does not read pos).
        slots = np.empty(row.shape[0], np.int64)
        if not _find(held, row, slots):
            return -1
        for w in range(row.shape[0]):
            if slots[w] >= 0:
                slots[w] = hslot[slots[w]]
        m = 0
        for w in range(nxt.shape[0]):
            if nxt[w] >= 0:
                keep[m] = nxt[w]
                m += 1
        keep[:m].sort()
        at = -1
        for i in range(m):
            if keep[i] == pos:
                at = i
                keep[i] = -1  # found below as "none", then set to the token's slot
        if at < 0 or not _find(held, keep[:m], new_slots[:m]):
            return -1
        keep[at] = pos
        for i in range(m):
            new_slots[i] = end if i == at else hslot[new_slots[i]]
        _read(qkv, kv[0], kv[1], slots, np.ones((qkv.shape[0], slots.shape[0]), np.uint8), scale, kv[1, :, end])
        for b in range(qkv.shape[0]):
            kv[0, b, end] = qkv[b, 1]
        return m


class _CompiledSolve(torch.autograd.Function):
    @staticmethod
    def forward(ctx, alpha, beta, idx, x, y_prefix):
        alpha, beta, x, y_prefix = (z.contiguous() for z in (alpha, beta, x, y_prefix))
        y = torch.empty_like(x)
        with launch():
            _solve_forward(_np(alpha), _np(beta), _np(idx), _np(x), _np(y_prefix), _np(y))
        ctx.save_for_backward(alpha, beta, idx, x, y_prefix, y)
        return y

    @staticmethod
    def backward(ctx, gy):
        alpha, beta, idx, x, y_prefix, y = ctx.saved_tensors
        g = gy.contiguous().clone()
        galpha, gbeta = torch.empty_like(alpha), torch.empty_like(beta)
        gx, gp = torch.empty_like(x), torch.zeros_like(y_prefix)
        with launch():
            _solve_backward(
                _np(alpha),
                _np(beta),
                _np(idx),
                _np(x),
                _np(y_prefix),
                _np(y),
                _np(g),
                _np(galpha),
                _np(gbeta),
                _np(gx),
                _np(gp),
            )
        return galpha, gbeta, None, gx, gp


class _CompiledScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, kbuf, idx):
        q, kbuf = q.contiguous(), kbuf.contiguous()
        s = q.new_empty(*q.shape[:3], idx.shape[-1])
        with launch():
            _scores_forward(_np(q), _np(kbuf), _np(idx), _np(s))
        ctx.save_for_backward(q, kbuf, idx)
        return s

    @staticmethod
    def backward(ctx, ds):
        q, kbuf, idx = ctx.saved_tensors
        dq, dk = torch.empty_like(q), torch.zeros_like(kbuf)
        with launch():
            _scores_backward(_np(q), _np(kbuf), _np(idx), _np(ds.contiguous()), _np(dq), _np(dk))
        return dq, dk, None


def check_tensors(tensors) -> None:
    """Refuse, in one InputError line, tensors the numba kernels cannot read (or numba missing)."""
    if supported(*tensors):
        return
    if not kernel_available():
        raise InputError("backend 'numba' is unavailable (numba not importable or TOKENMIX_NO_COMPILED set)")
    got = sorted({f"{z.dtype} on {z.device}" for z in tensors})
    raise InputError(f"backend 'numba' takes float32 or float64 CPU tensors of one dtype, got {got}")


@functools.cache
def all_visible(rows: int, width: int) -> np.ndarray:
    """[rows, width] uint8 ones, made once per shape: a decode step whose rows read every neighbour
    (nothing writes it)."""
    return np.ones((rows, width), np.uint8)


def step_read(
    qkv: Tensor,
    keys: Tensor,
    values: Tensor,
    slots: np.ndarray,
    scale: float,
    out: Tensor,
    visible: np.ndarray | None = None,
) -> Tensor:
    """One decoded token of a score-softmax pattern: out = alpha v + sum_w beta_w values[slots[w]],
    (alpha, beta) the softmax of scale * (q . k, q . keys[slots[w]]) over the self slot and the
    cached neighbours. Inference only (no autograd). By the compiled kernel; ``step_read_reference``
    is the definition (the torch backend's read), against which the kernel is tested.

    Args:
        qkv: [B, 3, H, K] the token's q, k, v.
        keys, values: [B, S, H, K], [B, S, H, V] cache storage.
        slots: [W] int64 numpy, the storage slots of the token's neighbours, -1 = none.
        out: [B, H, V], written (may be a view into ``values``: it is written after every read).
        visible: [B, W] bool / uint8 numpy: whether row b reads neighbour w (False: e.g. a position in
            the row's left padding, left out of its softmax); None = every row reads every neighbour.
    Returns:
        out.
    """
    if visible is None:
        visible = all_visible(qkv.shape[0], slots.shape[0])
    # no check_tensors here: a decoded token costs ~40 us and the check ~1 us; the caller asked
    # backend.choose_backend once for the call (numba reads a non-CPU tensor's .numpy() and raises)
    _read(_np(qkv), _np(keys), _np(values), slots, visible.astype(np.uint8, copy=False), scale, _np(out))
    return out


def step_read_reference(
    qkv: Tensor, keys: Tensor, values: Tensor, slots: np.ndarray, scale: float, out: Tensor, visible: np.ndarray
) -> Tensor:
    """``step_read`` in tensor operations (any dtype and device): gather, masked softmax, weighted sum."""
    q, k, v = qkv.unbind(1)
    read = torch.from_numpy(slots.clip(min=0)).to(keys.device)
    mask = torch.from_numpy((slots >= 0)[None, :] & visible.astype(bool)).to(keys.device)  # [B, W]
    scores = torch.einsum("bhk,bwhk->bhw", q, keys[:, read]).masked_fill(~mask[:, None, :], float("-inf"))
    logits = torch.cat([(q * k).sum(-1, keepdim=True), scores], -1) * scale
    coef = torch.softmax(logits, -1, dtype=torch.promote_types(logits.dtype, torch.float32)).to(values.dtype)
    out.copy_(coef[..., :1] * v + torch.einsum("bhw,bwhv->bhv", coef[..., 1:], values[:, read]))
    return out


def lattice_step(
    qkv: Tensor, kv: Tensor, kv_np: np.ndarray | None, step: LatticeStep, scale: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """One decoded token whose cache is a neighbour set (a lattice), on slot-stable storage, by the
    compiled kernel; ``lattice_step_reference`` is the definition (the torch backend's step),
    against which the kernel is tested.

    Args:
        qkv: [B, 3, H, K] the token's q, k, v (at position ``step.pos``).
        kv: [2, B, cap, H, K] cache storage (keys kv[0], values kv[1]); ``kv_np`` its numpy view
            (None: made here). Slot ``step.end`` < cap has never been written.
        step: the cache's host bookkeeping (sorted positions ``held`` at storage slots ``hslot``)
            and the table rows ``row``, ``nxt`` of pos and pos + 1 (``lattice_step.LatticeStep``).
        scale: the score scale (1 / sqrt(K)).
    Returns:
        (keep [S'], slots [S']) the next cache's sorted positions (those of ``nxt``, pos among them)
        and their storage slots -- the token's key and output written to slot ``end`` (its output
        y = kv[1, :, end]); or None, with nothing written, if a position the rows name is not held
        (or pos + 1 does not read pos).
    """
    width = step.nxt.shape[0]  # (tensors checked by the caller's choose_backend, as in step_read)
    keep, new_slots = np.empty(width, np.int64), np.empty(width, np.int64)
    kv_np = _np(kv) if kv_np is None else kv_np
    m = _lattice_step(_np(qkv), kv_np, *step, scale, keep, new_slots)  # held, hslot, end, row, nxt, pos
    return None if m < 0 else (keep[:m], new_slots[:m])


def lattice_step_reference(
    qkv: Tensor, kv: Tensor, step: LatticeStep, scale: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """``lattice_step`` in numpy lookups and ``step_read_reference`` (any dtype and device)."""
    held, hslot, end, row, nxt, pos = step
    keep = np.sort(nxt[nxt >= 0])
    wanted = np.concatenate([row, np.where(keep == pos, -1, keep)])
    j = np.searchsorted(held, np.maximum(wanted, 0)).clip(max=max(len(held) - 1, 0))
    found = wanted < 0
    if len(held):
        found |= held[j] == wanted
    if pos not in keep or not found.all():
        return None
    slot = np.where(wanted >= 0, hslot[j] if len(held) else -1, -1)
    step_read_reference(
        qkv, kv[0], kv[1], slot[: len(row)], scale, kv[1, :, end], np.ones((qkv.shape[0], len(row)), np.uint8)
    )
    kv[0, :, end] = qkv[:, 1]
    new_slots = np.where(keep == pos, end, slot[len(row) :])
    return keep, new_slots


def _check_causal(idx: Tensor, prefix: int) -> Tensor:
    """idx [T, W] or per row [B, T, W] as a contiguous int64 CPU table [1 or B, T, W] after the
    causality check (the kernels trust it)."""
    tab = idx.detach().to("cpu", torch.int64)
    tab = (tab[None] if tab.dim() == 2 else tab).contiguous()
    check_causal(tab, prefix)
    return tab


def compiled_pattern_solve(
    alpha: Tensor, beta: Tensor, idx: Tensor, x: Tensor, y_prefix: Tensor | None = None, chunk_size: int = 64, plan=None
) -> Tensor:
    """``chunked_pattern_solve`` with the same arguments, by the compiled sweeps (module docstring);
    tensors numba cannot read are refused (``check_tensors``: ``backend.choose_backend`` picks).

    Args:
        alpha: [B, T, H]; beta: [B, T, H, W]; idx: [T, W] long buffer positions (-1 = none,
            idx[t] < P + t), or per-row tables [B, T, W] (packed rows); x: [B, T, H, V];
            y_prefix: [B, P, H, V] or None.
        chunk_size, plan: unused (the torch path's; kept so the backends share one signature).
    Returns:
        y: [B, T, H, V].
    """
    b, t, h, v = x.shape
    if y_prefix is None:
        y_prefix = x.new_zeros(b, 0, h, v)
    check_tensors((alpha, beta, x, y_prefix))
    check_solve_shapes(alpha, beta, idx, x, y_prefix)
    return _CompiledSolve.apply(alpha, beta, _check_causal(idx, y_prefix.shape[1]), x, y_prefix)


def compiled_pattern_scores(q: Tensor, kbuf: Tensor, idx: Tensor, plan=None) -> Tensor:
    """``pattern_scores`` with the same arguments, compiled: s[t, w] = q_t . kbuf[idx[t, w]] (0
    where idx < 0), [B, T, H, W]; idx [T, W] or per-row [B, T, W]. ``plan`` is unused (the torch
    path's). Tensors numba cannot read are refused (``check_tensors``)."""
    b, t, h, k = q.shape
    p = kbuf.shape[1] - t
    check_tensors((q, kbuf))
    if kbuf.shape[0] != b or kbuf.shape[2:] != (h, k) or p < 0 or not table_fits(idx, b, t):
        raise InputError(f"shape mismatch: q {tuple(q.shape)}, kbuf {tuple(kbuf.shape)}, idx {tuple(idx.shape)}")
    return _CompiledScores.apply(q, kbuf, _check_causal(idx, p))


__all__ = [
    "all_visible",
    "check_tensors",
    "compiled_pattern_scores",
    "compiled_pattern_solve",
    "kernel_available",
    "lattice_step",
    "lattice_step_reference",
    "step_read",
    "step_read_reference",
]
