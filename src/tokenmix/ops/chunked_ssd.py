"""Mamba-2 SSD with one group (B_t, C_t shared by every head), chunkwise, with a hand-written backward.

Recurrence per head h (reference: ops/recurrent_gla.py with q = C, k = B broadcast over the heads
and a per-head log decay), state S_h [N, P]:

    S_{h,t} = exp(g_{t,h}) S_{h,t-1} + B_t x_{t,h}ᵀ,        o_{t,h} = scale · S_{h,t}ᵀ C_t.

Why a kernel of its own: with a per-head scalar decay, the intra-chunk decay mask factors as
exp(G_i - G_j) = exp(G_i - r) exp(r - G_j) for any reference r, and these factors are row scalings,
so they commute with the head-independent score matrix M = tril(C Bᵀ):

    o_h = e^{G_h - r_h} ⊙ ( M (e^{r_h - G_h} ⊙ x_h) + C (e^{r_h} S_h) ),
    write_h = e^{Gamma_h - r_h} ⊙ Bᵀ (e^{r_h - G_h} ⊙ x_h).

So every head shares one M per chunk, and each matmul runs over all heads at once ([C, C] x [C, H P],
[C, N] x [N, H P], [N, C] x [C, H P]) instead of H narrow ones. r_h is the midpoint of G_h's range on
the chunk, so both factors stay within e^{±span/2}; each product of factors is the exact term with two
roundings (not a reassociation that loses precision) as long as they neither overflow nor underflow,
which holds when every chunk's span max G - min G <= ln(max float) (88 in float32, 709 in float64).
Chunks beyond that (decays stronger than e^-88 inside one chunk: a head with dt·exp(A_log) ~ 1.5
per token spans that in 64 tokens, so trained and even freshly initialised Mamba-2 layers have some)
are computed, on those chunk rows only, by chunked_gla's safe per-head form (scores with exponents
<= 0 only, exact for any decay): the factored rows run as usual with placeholder factors of 1 on
the safe rows, whose writes, outputs, reads and gradients then replace the placeholders' (one
index_copy each). Only when every chunk is that wide does the whole call go to ``chunked_gla``, and
off the CPU, where counting the wide chunks on the host would stall the device every call: there
every call goes to ``chunked_gla``, whose safe form (all rows, off the CPU) is exact for any span. The
carry through the chunks (``carry_states_`` / ``carry_gradients_``, the one chunk recurrence) and the
checks of the initial state and packed rows are chunked_gla's.

r is a function of G, but the output does not depend on r (it cancels exactly), so the backward
treats it as a constant. Backward, with Z = M x̃ + C S̃ (x̃ = e^{r - G} ⊙ x, S̃ = e^{r} S, o = e^{G - r} ⊙ Z):
    dZ = e^{G - r} ⊙ dO;   dM = tril(dZ x̃ᵀ) (summed over heads);   dx̃ = Mᵀ dZ + B dS̃';
    dC = dM B + dZ S̃ᵀ;     dB = dMᵀ C + x̃ dS̃'ᵀ;   read of the entering state = e^{r} ⊙ Cᵀ dZ;
    dG = rowsum_P(dO ⊙ o) - rowsum_P(dx̃ ⊙ x̃), plus rowsum(S' ⊙ dS') at the chunk end; dg = reverse cumsum,
where dS̃' = e^{Gamma - r} ⊙ dS' is the gradient of the state leaving the chunk, rescaled.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from tokenmix.core.errors import InputError
from tokenmix.ops.chunk_boundaries import chunk_boundaries
from tokenmix.ops.chunked_gla import (
    _PER_HEAD,
    _RowMasks,
    _safe_backward,
    _safe_forward,
    carry_gradients_,
    carry_states_,
    check_chunked_inputs,
    chunked_gla,
    factored_bound,
    on_host,
)


def _rows(x: Tensor, n: int, c: int, mult: Tensor | None = None) -> Tensor:
    """[B, T, F] -> [N * B, C, F], chunk-major rows, zero-padded at the end of time (one pass).

    With ``mult`` [N * B, C, M] (F = M P), each row's M groups of P channels are multiplied by it
    while copying: the per-head decay factors of the SSD are applied in the same pass as the layout
    change, so no second [R, C, H P] tensor is allocated and written.
    """
    b, t, f = x.shape
    full = t // c
    out = x.new_empty(n, b, c, f)
    if full:
        _copy(
            out[:full],
            x[:, : full * c].view(b, full, c, f).transpose(0, 1),
            None if mult is None else mult.view(n, b, c, -1)[:full],
        )
    if full < n:  # padded tokens have B = C = x = g = 0: they neither write, read nor decay the state
        out[full].zero_()
        _copy(
            out[full, :, : t - full * c],
            x[:, full * c :],
            None if mult is None else mult.view(n, b, c, -1)[full, :, : t - full * c],
        )
    return out.view(n * b, c, f)


def _unrows(x: Tensor, b: int, t: int, mult: Tensor | None = None) -> Tensor:
    """[N * B, C, F] chunk-major rows -> [B, T, F] (padding dropped, one pass, contiguous), times
    ``mult`` [N * B, C, M] per group of F / M channels if given (as in ``_rows``)."""
    r, c, f = x.shape
    n = r // b
    full = t // c
    src = x.view(n, b, c, f)
    mv = None if mult is None else mult.view(n, b, c, -1)
    out = x.new_empty(b, t, f)
    if full:
        _copy(out[:, : full * c].view(b, full, c, f).transpose(0, 1), src[:full], None if mv is None else mv[:full])
    if full < n:
        _copy(out[:, full * c :], src[full, :, : t - full * c], None if mv is None else mv[full, :, : t - full * c])
    return out


def _copy(dst: Tensor, src: Tensor, mult: Tensor | None) -> None:
    """dst = src (times mult [.., M] broadcast over the F / M channels of each group)."""
    if mult is None:
        dst.copy_(src)
    else:
        m = mult.shape[-1]
        torch.mul(src.unflatten(-1, (m, -1)), mult[..., None], out=dst.unflatten(-1, (m, -1)))


def _chunk_log_decay(g: Tensor, n: int, c: int) -> Tensor:
    """G = cumsum of g inside each chunk: [B, T, H] -> [N * B, C, H]."""
    return _rows(g, n, c).cumsum_(1)


def _per_head(x: Tensor, h: int) -> Tensor:
    """SSD rows [r, A, H P] -> chunked_gla's per-head rows [r H, A, P]."""
    r, a, hp = x.shape
    return x.view(r, a, h, hp // h).transpose(1, 2).reshape(r * h, a, hp // h)


def _from_heads(x: Tensor, h: int) -> Tensor:
    """chunked_gla's per-head rows [r H, A, P] -> SSD rows [r, A, H P]."""
    rh, a, p = x.shape
    return x.view(rh // h, h, a, p).transpose(1, 2).reshape(rh // h, a, h * p)


def _shared(x: Tensor, h: int) -> Tensor:
    """C or B rows [r, C, N] broadcast to every head: [r H, C, N]."""
    r, c, nd = x.shape
    return x[:, None].expand(r, h, c, nd).reshape(r * h, c, nd)


class _ChunkedSSD(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cq, bk, x, g, s0, scale, chunk, safe_rows, doc_starts):
        bsz, t, nd = cq.shape
        h, p = x.shape[2], x.shape[3]
        hp = h * p
        n = -(-t // chunk)
        rows = n * bsz
        masks = None
        if doc_starts is not None:  # packed rows: one mask row per chunk row, shared by the heads
            bounds = chunk_boundaries(doc_starts, n, chunk, cq.dtype)
            masks = _RowMasks.of(bounds, 1)
        qs = _rows(cq, n, chunk)
        if scale != 1.0:
            qs.mul_(scale)  # scale folded into C once
        kb = _rows(bk, n, chunk)  # [R, C, N]
        gc = _chunk_log_decay(g, n, chunk)  # [R, C, H]
        gmin, gmax = torch.aminmax(gc, dim=1)  # [R, H]
        ref = (gmin + gmax).mul_(0.5)[:, None, :]  # midpoint of each head's range, [R, 1, H]
        shift = gc - ref
        if safe_rows is not None:  # factors 1 there: finite placeholders, replaced by the safe form's results
            shift.index_fill_(0, safe_rows, 0.0)
        e_q = shift.exp_()  # [R, C, H], within e^{±span/2}
        e_k = e_q.reciprocal()
        xt = _rows(x.reshape(bsz, t, hp), n, chunk, e_k)  # e^{r - G} ⊙ x [R, C, H P], in the layout copy
        m = torch.bmm(qs, kb.transpose(1, 2)).tril_()  # [R, C, C], shared by the heads
        kb_w, qs_r = kb, qs  # the keys that write the leaving state, the queries that read the entering one
        if masks is not None:
            masks.same_(m)
            kb_w, qs_r = masks.written(kb), masks.read(qs)
        gamma = gc[:, -1, :]  # [R, H]
        w_out = (gamma - ref[:, 0]).exp_()  # e^{Gamma - r}: x̃ written to the chunk end
        if safe_rows is not None:
            w_out.index_fill_(0, safe_rows, 1.0)
        # sbuf[i] = state entering chunk i as [B, N, H P] (heads side by side), sbuf[N] = final state
        sbuf = cq.new_empty(n + 1, bsz, nd, hp)
        sbuf[0] = 0 if s0 is None else s0.permute(0, 2, 1, 3).reshape(bsz, nd, hp)
        torch.bmm(kb_w.transpose(1, 2), xt, out=sbuf[1:].view(rows, nd, hp))
        sbuf[1:].view(rows, nd, h, p).mul_(w_out[:, None, :, None])
        safe = None
        if safe_rows is not None:
            # the safe rows' masks: one mask row covers the H per-head rows of one chunk row
            masks_s = None if masks is None else _RowMasks(*(z.index_select(0, safe_rows) for z in masks.rows()), h)
            # rows whose span the factors cannot carry: chunked_gla's safe per-head form (exponents <= 0),
            # on these rows only; their writes replace the placeholders before the carry
            v_s = _per_head(xt.index_select(0, safe_rows), h)  # plain x there (e_k = 1)
            g_s = gc.index_select(0, safe_rows).transpose(1, 2).reshape(-1, chunk, 1)
            a_s, q_in_s, delta_s, saved_s = _safe_forward(
                _shared(qs.index_select(0, safe_rows), h),
                _shared(kb.index_select(0, safe_rows), h),
                v_s,
                g_s,
                _PER_HEAD,
                masks_s,
            )
            sbuf[1:].view(rows, nd, hp).index_copy_(0, safe_rows, _from_heads(delta_s, h))
            safe = (safe_rows, v_s, a_s, q_in_s, saved_s, masks_s)
        decay = gamma.exp().view(n, bsz, 1, h, 1)
        if masks is not None:  # a chunk in which a document begins carries nothing through
            decay.mul_(bounds.carry.view(n, bsz, 1, 1, 1))
        carry_states_(sbuf.view(n + 1, bsz, nd, h, p), decay)  # the only sequential part: T / C steps on [N, H P]
        e_ref = ref[:, 0].exp()  # [R, H]
        st = (sbuf[:n].view(rows, nd, h, p) * e_ref[:, None, :, None]).view(rows, nd, hp)  # e^{r} S
        z = torch.bmm(m, xt).baddbmm_(qs_r, st)  # [R, C, H P]
        if safe is not None:  # their outputs o themselves (e_q = 1 there)
            starts_s = _per_head(sbuf[:n].view(rows, nd, hp).index_select(0, safe_rows), h)
            if masks_s is None:
                z_s = torch.bmm(a_s, v_s).baddbmm_(q_in_s, starts_s)
            else:
                z_s = masks_s.reads_(torch.bmm(q_in_s, starts_s)).baddbmm_(a_s, v_s)
            z.index_copy_(0, safe_rows, _from_heads(z_s, h))
            safe = (*safe, starts_s)  # the backward reads the same entering states
        # z, not o = e^{G - r} ⊙ z, is saved: the backward's rowsum_P(dO ⊙ o) equals rowsum_P(dZ ⊙ z),
        # so o only exists in the output layout, scaled during the copy
        ctx.save_for_backward(qs, kb, xt, m, st, z, sbuf, e_q, e_k, e_ref, w_out, decay)
        ctx.safe = safe
        ctx.masks = masks
        ctx.meta = (scale, bsz, t, h, p, s0 is not None)
        final = sbuf[n].view(bsz, nd, h, p).permute(0, 2, 1, 3).contiguous()
        return _unrows(z, bsz, t, e_q).view(bsz, t, h, p), final

    @staticmethod
    @once_differentiable
    def backward(ctx, d_o, d_s):
        qs, kb, xt, m, st, z, sbuf, e_q, e_k, e_ref, w_out, decay = ctx.saved_tensors
        scale, bsz, t, h, p, has_s0 = ctx.meta
        rows, chunk, nd = qs.shape
        hp = h * p
        n = rows // bsz
        dz = _rows(d_o.reshape(bsz, t, hp), n, chunk, e_q)  # dZ = e^{G - r} ⊙ dO, in the layout copy
        # rowsum_P(dO ⊙ o) = rowsum_P(dZ ⊙ z) [R, C, H]; einsum contracts without a [R, C, H P] temporary
        dgq = torch.einsum("rchp,rchp->rch", dz.view(rows, chunk, h, p), z.view(rows, chunk, h, p))
        # reverse carry over [N, H P] states: dbuf[i] = dL/dS_i (dbuf[N] = dS_T)
        dbuf = torch.empty_like(sbuf)
        dbuf[n] = 0 if d_s is None else d_s.permute(0, 2, 1, 3).reshape(bsz, nd, hp)
        masks = ctx.masks
        kb_w, qs_r = (kb, qs) if masks is None else (masks.written(kb), masks.read(qs))
        torch.bmm(qs_r.transpose(1, 2), dz, out=dbuf[:n].view(rows, nd, hp))
        dbuf[:n].view(rows, nd, h, p).mul_(e_ref[:, None, :, None])
        safe = ctx.safe
        if safe is not None:  # the safe rows' reads: (C ⊙ e^G)ᵀ dO per head (dZ = dO there)
            safe_rows, v_s, a_s, q_in_s, saved_s, masks_s, starts_s = safe
            do_s = _per_head(dz.index_select(0, safe_rows), h)
            do_s_read = do_s if masks_s is None else masks_s.read(do_s)
            dbuf[:n].view(rows, nd, hp).index_copy_(
                0, safe_rows, _from_heads(torch.bmm(q_in_s.transpose(1, 2), do_s_read), h)
            )
        carry_gradients_(dbuf.view(n + 1, bsz, nd, h, p), decay)
        d_next = dbuf[1:].view(rows, nd, hp)
        dn = (d_next.view(rows, nd, h, p) * w_out[:, None, :, None]).view(rows, nd, hp)
        dm = torch.bmm(dz, xt.transpose(1, 2)).tril_()  # [R, C, C]
        if masks is None:
            dxt = torch.bmm(m.transpose(1, 2), dz).baddbmm_(kb, dn)  # [R, C, H P]
            dq = torch.bmm(dm, kb).baddbmm_(dz, st.transpose(1, 2))  # [R, C, N]
            dk = torch.bmm(dm.transpose(1, 2), qs).baddbmm_(xt, dn.transpose(1, 2))
        else:  # reads and writes of the masked rows only
            masks.same_(dm)
            dxt = torch.bmm(m.transpose(1, 2), dz).baddbmm_(kb_w, dn)
            dq = masks.reads_(torch.bmm(dz, st.transpose(1, 2))).baddbmm_(dm, kb)
            dk = masks.writes_(torch.bmm(xt, dn.transpose(1, 2))).baddbmm_(dm.transpose(1, 2), qs)
        if safe is not None:
            d_next_s = _per_head(d_next.index_select(0, safe_rows), h)
            packed = {} if masks_s is None else {"masks": masks_s, "do_read": do_s_read}
            dq_s, dk_s, dv_s, dg_s = _safe_backward(
                do_s, v_s, a_s, d_next_s, starts_s, saved_s, _PER_HEAD, True, **packed
            )
            dq.index_copy_(0, safe_rows, dq_s.view(-1, h, chunk, nd).sum(1))  # C, B shared: summed over heads
            dk.index_copy_(0, safe_rows, dk_s.view(-1, h, chunk, nd).sum(1))
            dxt.index_copy_(0, safe_rows, _from_heads(dv_s, h))  # dx itself (e_k = 1 there)
        dg = None
        if ctx.needs_input_grad[3]:
            dgc = dgq.sub_(torch.einsum("rchp,rchp->rch", dxt.view(rows, chunk, h, p), xt.view(rows, chunk, h, p)))
            if safe is not None:  # their dG = q ⊙ dq - k ⊙ dk summed over N, before the chunk-end term
                dgc.index_copy_(0, safe_rows, dg_s.sum(-1).view(-1, h, chunk).transpose(1, 2))
            dgc[:, -1, :] += (sbuf[1:] * dbuf[1:]).view(rows, nd, h, p).sum((1, 3))  # rowsum(S' ⊙ dS')
            dg = _unrows(dgc.flip(1).cumsum_(1).flip(1), bsz, t)  # G = cumsum(g) inside the chunk
        if scale != 1.0:
            dq.mul_(scale)
        ds0 = dbuf[0].view(bsz, nd, h, p).permute(0, 2, 1, 3) if has_s0 else None
        return (
            _unrows(dq, bsz, t),
            _unrows(dk, bsz, t),
            _unrows(dxt, bsz, t, e_k).view(bsz, t, h, p),
            dg,
            ds0,
            None,
            None,
            None,
            None,
        )


def chunked_ssd(
    c: Tensor,
    b: Tensor,
    x: Tensor,
    g: Tensor,
    scale: float = 1.0,
    initial_state: Tensor | None = None,
    chunk_size: int = 64,
    doc_starts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Mamba-2 SSD with one group, chunkwise: ``chunked_gla(C, B, x, g)`` with C, B shared by the heads.

    Packed rows (``doc_starts``) as in ``chunked_gla``: each document runs as if alone, its state
    reset at the boundary; the document masks of a chunk (zeros in the shared score matrix C Bᵀ
    between documents, the reads of the entering state and the writes of the leaving one) are shared
    by the heads.

    Args:
        c: [B, T, N] readout (C_t, the queries), shared by the heads.
        b: [B, T, N] input map (B_t, the keys), shared by the heads.
        x: [B, T, H, P] values (Mamba-2's dt·x).
        g: [B, T, H] log decay per head (log a_t = -dt·exp(A_log) <= 0).
        scale: readout scale (Mamba-2: 1).
        initial_state: [B, H, N, P] or None (zeros).
        chunk_size: C.
        doc_starts: [B, T] long (``Packing.starts``: where each position's document begins), or None
            for one document per row.
    Returns:
        o: [B, T, H, P];  final state S_T: [B, H, N, P] (of each row's last document).

    Examples:
        >>> c, b, x = torch.randn(1, 10, 4), torch.randn(1, 10, 4), torch.randn(1, 10, 2, 3)
        >>> g = -torch.rand(1, 10, 2)
        >>> o, s = chunked_ssd(c, b, x, g, chunk_size=4)
        >>> o.shape, s.shape
        (torch.Size([1, 10, 2, 3]), torch.Size([1, 2, 4, 3]))
    """
    if c.dim() != 3 or b.shape != c.shape or x.dim() != 4 or x.shape[:2] != c.shape[:2]:
        raise InputError(
            f"expected c, b [B, T, N] and x [B, T, H, P]; got c {tuple(c.shape)}, "
            f"b {tuple(b.shape)}, x {tuple(x.shape)}"
        )
    bsz, t, nd = c.shape
    h, p = x.shape[2], x.shape[3]
    if g.shape != (bsz, t, h):
        raise InputError(f"g must be [B, T, H] = {(bsz, t, h)}, got {tuple(g.shape)}")
    check_chunked_inputs(chunk_size, initial_state, (bsz, h, nd, p), "B, H, N, P", doc_starts, bsz, t)
    n_wide = n_rows = 0
    if on_host(g):  # the wide chunks counted on the host: free on the CPU, a stall per call elsewhere
        with torch.no_grad():
            gc = _chunk_log_decay(g.detach(), -(-t // chunk_size), chunk_size)
            spans = (gc.amax(1) - gc.amin(1)).amax(1) if gc.numel() else gc.new_zeros(0)  # [N * B]
            wide = spans > 2 * factored_bound(g.dtype)  # some head decays by more than e^-88 (float32) in the chunk
            n_wide, n_rows = int(wide.sum()), wide.numel()
    if not on_host(g) or (n_wide and n_wide == n_rows):  # the exact safe form for all (module docstring)
        return chunked_gla(
            c[:, :, None].expand(bsz, t, h, nd),
            b[:, :, None].expand(bsz, t, h, nd),
            x,
            g,
            scale,
            initial_state,
            chunk_size,
            doc_starts,
        )
    safe_rows = wide.nonzero()[:, 0] if n_wide else None
    return _ChunkedSSD.apply(c, b, x, g, initial_state, float(scale), int(chunk_size), safe_rows, doc_starts)
