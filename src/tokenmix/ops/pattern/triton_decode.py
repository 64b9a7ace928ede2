"""Triton decode reads of the score-softmax pattern mixers: one decoded token, one kernel launch.

Contract (what a backend seam calls, by these names; nothing here picks a backend):

    available() -> bool
        whether ``triton`` imports. Off the interpreter the tensors must be CUDA tensors. The
        interpreter (``TRITON_INTERPRET=1``: the kernels run on CPU tensors) must be switched on
        before triton is first imported -- triton jits its own ``tl.sum`` / ``tl.max`` then -- so
        before anything imports this module.
    triton_step_read(qkv, keys, values, slots, scale, out, visible=None) -> out
        ``numba.step_read``'s contract: out = alpha v + sum_w beta_w values[slots[w]], (alpha, beta)
        = softmax of scale * (q . k, q . keys[slots[w]]) over the self slot and the visible cached
        neighbours. ``slots`` (int64 [W], -1 = none) and ``visible`` (bool / uint8 [B, W], None =
        all) may be numpy (uploaded once per call) or tensors on the tensors' device (no upload: a
        GPU step reads them where they are). Inference only, no autograd. Keyword-only extras:
        ``key_out`` ([B, H, K], the same launch also writes the token's key there) and the tile
        sizes ``block_h`` / ``block_w`` (None: from the shapes).
    triton_lattice_step(qkv, kv, step, scale) -> (keep, slots) | None
        ``numba.lattice_step``'s contract without ``kv_np``: the neighbour-set cache's bookkeeping
        (``step``, a ``lattice_step.LatticeStep``: sorted positions ``held`` at storage slots
        ``hslot``, host numpy by design) is looked up on the host, then one launch reads the
        neighbours, writes the output to kv[1, :, end] and the token's key to kv[0, :, end]. Returns
        None, with nothing written, where ``lattice_step`` does.

The kernel. One program per (batch row b, block of BLOCK_H heads); shapes in its tiles:

    q, k [BH, BK], v [BH, BV]                      the token's own q, k, v (any strides: a view of
                                                   the step's [B, T, 3, H, K] projection)
    m = scale q . k, l = 1, acc = v                the self slot starts the softmax (always finite)
    for each block of BLOCK_W neighbours:          (online softmax, flash-decoding's recurrence)
        j [BW] = slots; ok = j >= 0 & visible[b]   (-1 slots and a row's padding read nothing)
        s [BW, BH] = scale sum_k q keys[b, j]      (gather: one row of keys per (neighbour, head))
        m' = max(m, max_w s); c = exp(m - m'); p = exp(s - m')   (p = 0 where not ok)
        l = c l + sum_w p; acc = c acc + sum_w p values[b, j]
    out[b, heads] = acc / l

Why this shape. A decode read is a matrix-vector product per head over |N(t)| scattered cache rows
(|N(t)| ~ log n for pow2, ~ sqrt n for sq1): no operand has 16 rows that share a vector, so there is
no ``tl.dot`` to make; the work is the gather, which is memory-bound, and a program reads each of
its neighbours' rows for BLOCK_H heads at once (contiguous H K runs in the [B, S, H, K] storage). The
neighbour loop keeps the tile at BLOCK_W x BLOCK_H x BK registers whatever W is (sq1 at long context
reads hundreds), and the softmax is the online one, so scores are never written out. Accumulation
is float32 (float64 for float64 tensors): the same numbers as ``step_read_reference`` up to the
order of the additions (the reference normalises first, then sums; here the sum is normalised).
``out`` may be a view into ``values`` (the slot the token's output goes to, which no neighbour
reads): a program writes its own (b, heads) after all its reads, and reads no other row b.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.ops.pattern.lattice_step import LatticeStep

try:  # optional (the ``gpu`` extra); everything else in tokenmix runs without it
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - not installed, or an install that fails to import (no CUDA libraries)
    triton = None

_TILE = 4096  # elements of the BLOCK_W x BLOCK_H x max(BK, BV) gather tile (~32 fp32 registers a thread at 4 warps)
_BLOCK_W = 16  # neighbours read per loop iteration


def available() -> bool:
    """Whether triton imports (the kernels here need it; off ``TRITON_INTERPRET=1``, CUDA tensors)."""
    return triton is not None


if triton is not None:

    @triton.jit
    def _read_kernel(
        qkv_ptr,
        keys_ptr,
        values_ptr,
        slots_ptr,
        vis_ptr,
        out_ptr,
        kout_ptr,
        n_heads,
        n_w,
        k_dim,
        v_dim,
        scale,
        s_qb,
        s_q3,
        s_qh,
        s_qk,
        s_kb,
        s_ks,
        s_kh,
        s_kk,
        s_vb,
        s_vs,
        s_vh,
        s_vv,
        s_visb,
        s_visw,
        s_ob,
        s_oh,
        s_ov,
        s_kob,
        s_koh,
        s_kok,
        HAS_VIS: tl.constexpr,
        WRITE_KEY: tl.constexpr,
        ACC_F64: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_W: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):  # pragma: no cover - traced by triton (the interpreter runs it in the tests)
        acc_ty = tl.float64 if ACC_F64 else tl.float32
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BH]
        kk = tl.arange(0, BLOCK_K)
        vv = tl.arange(0, BLOCK_V)
        hm = h < n_heads
        km = kk < k_dim
        vm = vv < v_dim
        # the token's own q, k, v: [BH, BK], [BH, BK], [BH, BV]
        tok = qkv_ptr + b * s_qb + h[:, None] * s_qh
        hk = hm[:, None] & km[None, :]
        hv = hm[:, None] & vm[None, :]
        q = tl.load(tok + kk[None, :] * s_qk, mask=hk, other=0.0).to(acc_ty)
        k_raw = tl.load(tok + s_q3 + kk[None, :] * s_qk, mask=hk, other=0.0)
        acc = tl.load(tok + 2 * s_q3 + vv[None, :] * s_qk, mask=hv, other=0.0).to(acc_ty)  # weight 1 = exp(m - m)
        m = tl.sum(q * k_raw.to(acc_ty), axis=1) * scale  # [BH] the self logit, the running max
        l = tl.full([BLOCK_H], 1.0, acc_ty)  # [BH] the running sum of exp(logit - m)
        for w0 in range(0, n_w, BLOCK_W):
            w = w0 + tl.arange(0, BLOCK_W)  # [BW]
            wm = w < n_w
            j = tl.load(slots_ptr + w, mask=wm, other=-1)
            ok = wm & (j >= 0)
            if HAS_VIS:
                ok = ok & (tl.load(vis_ptr + b * s_visb + w * s_visw, mask=wm, other=0) != 0)
            j = tl.where(ok, j, 0).to(tl.int64)
            # gather [BW, BH, BK] keys and [BW, BH, BV] values of the neighbours
            hk3 = ok[:, None, None] & hk[None, :, :]
            kp = keys_ptr + b * s_kb + j[:, None, None] * s_ks + h[None, :, None] * s_kh + kk[None, None, :] * s_kk
            kn = tl.load(kp, mask=hk3, other=0.0).to(acc_ty)
            s = tl.sum(kn * q[None, :, :], axis=2) * scale  # [BW, BH]
            s = tl.where(ok[:, None], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=0))  # finite: m is
            c = tl.exp(m - m_new)
            p = tl.exp(s - m_new[None, :])  # [BW, BH], 0 where not ok
            hv3 = ok[:, None, None] & hv[None, :, :]
            vp = values_ptr + b * s_vb + j[:, None, None] * s_vs + h[None, :, None] * s_vh + vv[None, None, :] * s_vv
            vn = tl.load(vp, mask=hv3, other=0.0).to(acc_ty)
            l = l * c + tl.sum(p, axis=0)
            acc = acc * c[:, None] + tl.sum(p[:, :, None] * vn, axis=0)
            m = m_new
        y = acc / l[:, None]
        tl.store(out_ptr + b * s_ob + h[:, None] * s_oh + vv[None, :] * s_ov, y.to(out_ptr.dtype.element_ty), mask=hv)
        if WRITE_KEY:
            tl.store(kout_ptr + b * s_kob + h[:, None] * s_koh + kk[None, :] * s_kok, k_raw, mask=hk)


def _on(device: torch.device, x: np.ndarray | Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` as a ``dtype`` tensor on ``device``: a device tensor as it is (a bool one viewed as
    uint8, no copy), numpy uploaded once."""
    if isinstance(x, Tensor):
        x = x.to(device)  # a no-op where it already is (the GPU step's case)
        return x.view(torch.uint8) if x.dtype == torch.bool else x.to(dtype)
    host = torch.from_numpy(np.ascontiguousarray(x, dtype=np.dtype(str(dtype).removeprefix("torch."))))
    return host.to(device, non_blocking=True)  # from pageable memory: staged at once, no stream sync


def _blocks(h: int, w: int, k: int, v: int, block_h: int | None, block_w: int | None) -> tuple[int, int, int, int]:
    """(BLOCK_H, BLOCK_W, BLOCK_K, BLOCK_V): powers of two (the GPU's tile shapes); the head block as
    large as the gather tile allows, the neighbour block at most ``_BLOCK_W``."""
    bk, bv = triton.next_power_of_2(k), triton.next_power_of_2(v)
    bw = block_w or min(_BLOCK_W, triton.next_power_of_2(max(w, 1)))
    bh = block_h or max(1, min(triton.next_power_of_2(h), _TILE // (bw * max(bk, bv))))
    return bh, bw, bk, bv


def triton_step_read(
    qkv: Tensor,
    keys: Tensor,
    values: Tensor,
    slots: np.ndarray | Tensor,
    scale: float,
    out: Tensor,
    visible: np.ndarray | Tensor | None = None,
    *,
    key_out: Tensor | None = None,
    block_h: int | None = None,
    block_w: int | None = None,
) -> Tensor:
    """One decoded token of a score-softmax pattern, by one Triton launch (module docstring): out =
    alpha v + sum_w beta_w values[slots[w]], (alpha, beta) the softmax of scale * (q . k,
    q . keys[slots[w]]) over the self slot and the visible cached neighbours. Inference only.

    Args:
        qkv: [B, 3, H, K] the token's q, k, v (any strides).
        keys, values: [B, S, H, K], [B, S, H, V] cache storage (any strides).
        slots: [W] int64, the storage slots of the token's neighbours, -1 = none: a tensor on the
            tensors' device (read in place) or numpy (uploaded once).
        out: [B, H, V], written (may be a view into ``values``: it is written after every read).
        visible: [B, W] bool / uint8, tensor or numpy: whether row b reads neighbour w (False: e.g.
            a position in the row's left padding); None = every row reads every neighbour.
        key_out: [B, H, K] or None: where the same launch also writes the token's key (the lattice
            step's second write: one launch a token instead of two); a slot no neighbour reads.
        block_h, block_w: heads and neighbours per tile (powers of two); None = from the shapes
            (the tests set them small to run several head blocks and neighbour blocks).
    Returns:
        out.
    Raises:
        InputError: triton is not installed, or the shapes do not fit together.
    """
    if triton is None:
        raise InputError("the triton decode kernels need triton (pip install 'tokenmix[gpu]')")
    b, three, h, k = qkv.shape
    v = values.shape[3]
    bad = three != 3 or keys.shape[::2] != (b, h) or values.shape[:3] != keys.shape[:3] or out.shape != (b, h, v)
    if bad or v != k:  # the token's own value is read from qkv[:, 2], K wide
        raise InputError(
            f"shape mismatch: qkv {tuple(qkv.shape)}, keys {tuple(keys.shape)}, values {tuple(values.shape)}, "
            f"out {tuple(out.shape)}"
        )
    slot_t = _on(qkv.device, slots, torch.int64)
    w = slot_t.shape[0]
    vis = _on(qkv.device, visible, torch.uint8) if visible is not None else slot_t  # (unread without HAS_VIS)
    if visible is not None and tuple(vis.shape) != (b, w):
        raise InputError(f"visible {tuple(vis.shape)} for {b} rows and {w} neighbours")
    kout = key_out if key_out is not None else out  # (unwritten without WRITE_KEY)
    bh, bw, bk, bv = _blocks(h, w, k, v, block_h, block_w)
    _read_kernel[(b, triton.cdiv(h, bh))](
        qkv,
        keys,
        values,
        slot_t,
        vis,
        out,
        kout,
        h,
        w,
        k,
        v,
        float(scale),
        *qkv.stride(),
        *keys.stride(),
        *values.stride(),
        *(vis.stride() if visible is not None else (0, 0)),
        *out.stride(),
        *kout.stride(),
        HAS_VIS=visible is not None,
        WRITE_KEY=key_out is not None,
        ACC_F64=values.dtype == torch.float64,
        BLOCK_H=bh,
        BLOCK_W=bw,
        BLOCK_K=bk,
        BLOCK_V=bv,
    )
    return out


def triton_lattice_step(
    qkv: Tensor, kv: Tensor, step: LatticeStep, scale: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """One decoded token whose cache is a neighbour set (a lattice, Fenwick) on slot-stable storage:
    ``numba.lattice_step`` without ``kv_np``. The slots are found on the host (the cache's sorted
    numpy bookkeeping), uploaded as one [W] vector, and one launch reads, writes the output to
    kv[1, :, end] and the key to kv[0, :, end].

    Args:
        qkv: [B, 3, H, K] the token's q, k, v (at position ``step.pos``).
        kv: [2, B, cap, H, K] cache storage (keys kv[0], values kv[1]); slot ``step.end`` < cap has
            never been written.
        step: the cache's host bookkeeping and the token's table rows (``lattice_step.LatticeStep``).
        scale: the score scale (1 / sqrt(K)).
    Returns:
        (keep [S'], slots [S']) the next cache's sorted positions and their storage slots; or None,
        with nothing written, if a position the rows name is not held (or pos + 1 does not read pos).
    """
    found = step.slots()
    if found is None:
        return None
    read, keep, new_slots = found
    triton_step_read(qkv, kv[0], kv[1], read, scale, kv[1, :, step.end], key_out=kv[0, :, step.end])
    return keep, new_slots


__all__ = ["available", "triton_lattice_step", "triton_step_read"]
