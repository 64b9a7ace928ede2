"""Gated linear attention, chunkwise, with a hand-written backward: the fast path of the family.

Recurrence per head (reference: ops/recurrent_gla.py), state S [K, V]:

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ,        o_t = scale · S_tᵀ q_t,

with a log decay g per key channel [B, T, H, K] (GLA, diagonal SSMs), per head [B, T, H]
(RetNet, Mamba-2: broadcast over K) or none (linear attention).

Chunked form. Split time into chunks of C tokens; inside a chunk let G_i = sum_{s<=i} g_s (restarted
at the chunk start, so G <= 0 and decreasing when g <= 0), Gamma = G_{C-1} and S the state entering
the chunk. Then, for i, j in the chunk,

    o_i = scale (sum_{j<=i} sum_c q_ic k_jc exp(G_ic - G_jc) v_j  +  (q_i ⊙ exp(G_i))ᵀ S)    intra + inter
    S'  = diag(exp(Gamma)) S + sum_j (k_j ⊙ exp(Gamma - G_j)) v_jᵀ                          carry

Every exponent is a difference G_i - G_j with j <= i, or G_i, or Gamma - G_j: all <= 0 for g <= 0, so
nothing overflows however strong the decay (the factored form exp(G_i) · exp(-G_j) would overflow
as soon as a chunk decays by more than e^-88 in float32). The intra-chunk scores are
    none:      (Q Kᵀ) ⊙ L                           L = lower ones incl. the diagonal
    per head:  (Q Kᵀ) ⊙ exp(G_i - G_j) masked to j <= i  (the mask is applied before exp)
    per key:   no [C, C, K] tensor is ever formed. Halve the chunk recursively (blocks of 2s tokens,
               s = C/2, C/4, ... down to a base block of <= 4 tokens): between the two halves of a
               block, with m the last token of the left half, exp(G_i - G_j) = exp(G_i - G_m) ·
               exp(G_m - G_j), both factors <= 1, so those scores are one matmul of decayed q and k
               (O(T K) elementwise per level). Inside a base block the scores at each offset
               d = i - j are one elementwise pass sum_c q_{i,c} k_{i-d,c} exp(G_{i,c} - G_{i-d,c}).
Only the carry is sequential (T / C steps on [K, V] states).

Backward (closed form; autograd through the loops would store a copy of every slice). With dO the
output gradient and dS_T the final-state gradient:
    reverse carry:  dS_n = diag(exp(Gamma_n)) dS_{n+1} + scale (Q ⊙ exp(G))_nᵀ dO_n   (dS_N = dS_T)
    scores:         dA = scale dO Vᵀ (lower), dV = scale Aᵀ dO + (K ⊙ exp(Gamma - G)) dS_{n+1}
    decay:          every q_i enters as q_i exp(+G_i) and every k_j as k_j exp(-G_j), so
                    dG = q ⊙ dq - k ⊙ dk, plus at the chunk end dGamma = sum_j k_j ⊙ dk^carry_j +
                    exp(Gamma) ⊙ rowsum(S ⊙ dS_{n+1});  dg = reverse cumsum of dG inside the chunk.
Reassociated with respect to the recurrence (exp(G_i - G_j) instead of a product of exp(g)), so it
equals ``recurrent_gla`` up to rounding (float64 ~1e-15 relative).
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

_NONE, _PER_HEAD, _PER_KEY = "none", "per_head", "per_key"
_BASE_BLOCK = 4  # per-key scores: pairs inside blocks of at most this many tokens are built elementwise


def _chunks(x: Tensor, n: int, c: int) -> Tensor:
    """[B, T, H, ...] -> [B, H, N, C, ...] contiguous; zero-padded at the end of time."""
    b, t, h = x.shape[:3]
    if n * c != t:
        x = torch.cat([x, x.new_zeros(b, n * c - t, *x.shape[2:])], 1)
    return x.reshape(b, n, c, h, *x.shape[3:]).movedim(3, 1).contiguous()


def _unchunk(x: Tensor, t: int) -> Tensor:
    """[B, H, N, C, ...] -> [B, T, H, ...] (padding dropped)."""
    b, h, n, c = x.shape[:4]
    return x.movedim(1, 3).reshape(b, n * c, h, *x.shape[4:])[:, :t]


def _matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b for [.., m, k] x [.., k, n]; with V = 1 (one channel per head: the diagonal SSM) the
    products degenerate to matrix-vector and outer products, done as broadcasts because a batched
    matmul of very many tiny matrices is several times slower on CPU."""
    if b.shape[-1] == 1:
        return (a * b.transpose(-1, -2)).sum(-1, keepdim=True)
    if a.shape[-1] == 1:
        return a * b
    return a @ b


def _causal_decay(gc: Tensor) -> Tensor:
    """exp(G_i - G_j) for j <= i, 0 above: gc [.., C, 1] -> [.., C, C]. Masked before exp."""
    c = gc.shape[-2]
    diff = gc[..., :, 0, None] - gc[..., None, :, 0]
    upper = torch.ones(c, c, dtype=torch.bool, device=gc.device).triu(1)
    return diff.masked_fill(upper, float("-inf")).exp()


def _split_sizes(c: int) -> tuple[int, list[int]]:
    """Halving plan of a chunk: (base block size, half sizes s factored through a midpoint)."""
    sizes = []
    while c % 2 == 0 and c > _BASE_BLOCK:
        c //= 2
        sizes.append(c)
    return c, sizes


def _diag_blocks(a: Tensor, size: int) -> Tensor:
    """View of the diagonal blocks of a [.., C, C] (contiguous): [.., C / size, size, size]."""
    nb = a.shape[-1] // size
    return a.view(*a.shape[:-2], nb, size, nb, size).diagonal(dim1=-4, dim2=-2).movedim(-1, -3)


def _halves(x: Tensor, s: int) -> tuple[Tensor, Tensor]:
    """Views of the left and right halves of the blocks of 2s tokens: [.., C, K] -> 2 x [.., C / 2s, s, K]."""
    v = x.view(*x.shape[:-2], x.shape[-2] // (2 * s), 2, s, x.shape[-1])
    return v[..., 0, :, :], v[..., 1, :, :]


def _midpoint_decays(gc: Tensor, s: int) -> tuple[Tensor, Tensor]:
    """Decays of every 2s-token block to/from its midpoint m (the last token of the left half).

    exp(G_i - G_j) = exp(G_i - G_m) exp(G_m - G_j) for j <= m < i, both factors <= 1, so the scores
    between the two halves are one matmul (q_i ⊙ exp(G_i - G_m)) · (k_j ⊙ exp(G_m - G_j)).
    Returns e_right = exp(G_i - G_m), e_left = exp(G_m - G_j), each [.., C / 2s, s, K].
    """
    g_left, g_right = _halves(gc, s)
    g_mid = g_left[..., -1:, :]
    return (g_right - g_mid).exp(), (g_mid - g_left).exp()


def _band_view(x: Tensor, size: int) -> Tensor:
    """[.., C, K] -> [.., C / size, size, K]."""
    return x.view(*x.shape[:-2], x.shape[-2] // size, size, x.shape[-1])


def _intra_scores(q: Tensor, k: Tensor, gc: Tensor | None, kind: str) -> tuple[Tensor, list]:
    """A [B, H, N, C, C]: A_ij = sum_c q_ic k_jc exp(G_ic - G_jc) for j <= i, 0 above (no scale).

    Also returns the decay factors it computed, for ``_intra_grads`` (exp is the costly part).
    """
    if kind == _NONE:
        return (q @ k.transpose(-1, -2)).tril_(), []
    if kind == _PER_HEAD:
        decay = _causal_decay(gc)
        return (q @ k.transpose(-1, -2)) * decay, [decay]
    # per key channel: the blocks between the halves of 2s-token blocks are matmuls (s = C/2, C/4,
    # ... down to the base block), pairs inside a base block are built one diagonal offset at a time
    c = q.shape[-2]
    a = q.new_zeros(*q.shape[:-1], c)
    base, sizes = _split_sizes(c)
    levels, band = [], []
    for s in sizes:
        e_right, e_left = _midpoint_decays(gc, s)
        q_fac, k_fac = _halves(q, s)[1] * e_right, _halves(k, s)[0] * e_left
        levels.append((e_right, e_left, q_fac, k_fac))
        _diag_blocks(a, 2 * s)[..., s:, :s].copy_(q_fac @ k_fac.transpose(-1, -2))
    qb, kb, gb, ab = _band_view(q, base), _band_view(k, base), _band_view(gc, base), _diag_blocks(a, base)
    ab.diagonal(0, -2, -1).copy_((qb * kb).sum(-1))
    for d in range(1, base):
        e = (gb[..., d:, :] - gb[..., : base - d, :]).exp_()  # [.., C-d, K], exponents <= 0
        band.append(e)
        ab.diagonal(-d, -2, -1).copy_((e * qb[..., d:, :]).mul_(kb[..., : base - d, :]).sum(-1))
    return a, [levels, band]


def _intra_grads(da: Tensor, q: Tensor, k: Tensor, decays: list, kind: str) -> tuple[Tensor, Tensor]:
    """Gradients of ``_intra_scores`` w.r.t. q and k, for the score gradient da [.., C, C]."""
    if kind != _PER_KEY:
        w = da.tril() if kind == _NONE else da * decays[0]
        return w @ k, w.transpose(-1, -2) @ q
    levels, band = decays
    dq, dk = torch.zeros_like(q), torch.zeros_like(k)
    base, sizes = _split_sizes(q.shape[-2])
    for s, (e_right, e_left, q_fac, k_fac) in zip(sizes, levels):
        d_blk = _diag_blocks(da, 2 * s)[..., s:, :s]
        _halves(dq, s)[1].addcmul_(d_blk @ k_fac, e_right)
        _halves(dk, s)[0].addcmul_(d_blk.transpose(-1, -2) @ q_fac, e_left)
    qb, kb, dab = _band_view(q, base), _band_view(k, base), _diag_blocks(da, base)
    dqb, dkb = _band_view(dq, base), _band_view(dk, base)
    w0 = dab.diagonal(0, -2, -1)[..., None]
    dqb.addcmul_(w0, kb)
    dkb.addcmul_(w0, qb)
    for d, e in enumerate(band, start=1):
        w = e * dab.diagonal(-d, -2, -1)[..., None]
        dqb[..., d:, :].addcmul_(w, kb[..., : base - d, :])
        dkb[..., : base - d, :].addcmul_(w, qb[..., d:, :])
    return dq, dk


class _ChunkedGLA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, s0, scale, chunk):
        b, t, h, dk = q.shape
        dv = v.shape[-1]
        n = -(-t // chunk)
        kind = _NONE if g is None else (_PER_HEAD if g.dim() == 3 else _PER_KEY)
        # Padded tokens have q = k = v = g = 0: they neither write, read nor decay the state.
        qc, kc, vc = _chunks(q, n, chunk), _chunks(k, n, chunk), _chunks(v, n, chunk)
        gc = None
        if kind != _NONE:
            gc = _chunks(g if kind == _PER_KEY else g[..., None], n, chunk).cumsum(3)  # [B,H,N,C,K|1]
        a, intra_decays = _intra_scores(qc, kc, gc, kind)
        o = _matmul(a, vc)  # [B,H,N,C,V]
        if kind == _NONE:
            e_in = e_out = decay = None
            q_in, k_out = qc, kc
        else:
            e_in = gc.exp()                     # entering state decayed to token i
            e_out = (gc[..., -1:, :] - gc).exp_()  # token j's write decayed to the chunk end
            decay = gc[..., -1, :].exp()         # [B,H,N,K|1], decay across the whole chunk
            q_in, k_out = qc * e_in, kc * e_out
        delta = _matmul(k_out.transpose(-1, -2), vc)  # [B,H,N,K,V], the chunk's own write
        starts = torch.empty_like(delta)        # state entering each chunk
        s = q.new_zeros(b, h, dk, dv) if s0 is None else s0
        for i in range(n):  # the only sequential part: T / C steps on [K, V]
            starts[:, :, i] = s
            s = delta[:, :, i] + (s if decay is None else decay[:, :, i, :, None] * s)
        o.add_(_matmul(q_in, starts)).mul_(scale)
        ctx.save_for_backward(qc, kc, vc, a, starts)
        # intermediates (not inputs or outputs) may live on ctx; keeping the decays saves their exps
        ctx.decays = (intra_decays, e_in, e_out, decay, q_in, k_out)
        ctx.meta = (kind, scale, t, s0 is not None)
        return _unchunk(o, t), s

    @staticmethod
    @once_differentiable
    def backward(ctx, d_o, d_s):
        qc, kc, vc, a, starts = ctx.saved_tensors
        intra_decays, e_in, e_out, decay, q_in, k_out = ctx.decays
        kind, scale, t, has_s0 = ctx.meta
        n, c = qc.shape[2], qc.shape[3]
        do = _chunks(d_o, n, c) * scale  # scale folded in once (out of place: _chunks may alias d_o)
        # reverse carry: d_next[:, :, i] = dL/dS_{i+1}, the gradient of chunk i's write and decay
        read = _matmul(q_in.transpose(-1, -2), do)  # [B,H,N,K,V]
        d_next = torch.empty_like(starts)
        ds = d_s
        for i in reversed(range(n)):
            d_next[:, :, i] = ds
            ds = read[:, :, i] + (ds if decay is None else decay[:, :, i, :, None] * ds)
        dv = _matmul(a.transpose(-1, -2), do) + _matmul(k_out, d_next)
        dq, dk = _intra_grads(_matmul(do, vc.transpose(-1, -2)), qc, kc, intra_decays, kind)
        dq_in = _matmul(do, starts.transpose(-1, -2))   # [B,H,N,C,K]
        dk_out = _matmul(vc, d_next.transpose(-1, -2))  # [B,H,N,C,K]
        dg = None
        if kind == _NONE:
            dq += dq_in
            dk += dk_out
        else:
            dq.addcmul_(dq_in, e_in)
            dk.addcmul_(dk_out, e_out)
        if kind != _NONE and ctx.needs_input_grad[3]:  # RetNet's constant decays need no gradient
            dgc = (qc * dq).addcmul_(kc, dk, value=-1)                             # [B,H,N,C,K]
            dgamma = (k_out * dk_out).sum(-2) + decay * (starts * d_next).sum(-1)  # [B,H,N,K]
            if kind == _PER_HEAD:
                dgc, dgamma = dgc.sum(-1, keepdim=True), dgamma.sum(-1, keepdim=True)
            dgc[..., -1, :] += dgamma
            dgc = dgc.flip(3).cumsum(3).flip(3)  # G = cumsum(g) inside the chunk
            dg = _unchunk(dgc, t)
            if kind == _PER_HEAD:
                dg = dg[..., 0]
        return (_unchunk(dq, t), _unchunk(dk, t), _unchunk(dv, t), dg, ds if has_s0 else None, None, None)


def chunked_gla(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, scale: float = 1.0,
                initial_state: Tensor | None = None, chunk_size: int = 64) -> tuple[Tensor, Tensor]:
    """Gated linear attention, chunkwise (same results as ``recurrent_gla`` up to rounding).

    Args:
        q, k: [B, T, H, K] queries and keys.
        v: [B, T, H, V] values.
        g: log decay, [B, T, H, K] per key channel, [B, T, H] per head, or None (decay 1). Any real
            values are accepted; the overflow-free guarantee holds for g <= 0 (decays in (0, 1]).
        scale: readout scale.
        initial_state: [B, H, K, V] or None (zeros).
        chunk_size: C (any positive size; powers of two use the most matmuls for per-key decays).
            With V = 1 (the diagonal SSM) nothing is a real matmul and small chunks (4) are fastest.
    Returns:
        o: [B, T, H, V];  final state S_T: [B, H, K, V].

    Examples:
        >>> q, k, v = torch.randn(1, 10, 2, 4), torch.randn(1, 10, 2, 4), torch.randn(1, 10, 2, 3)
        >>> g = torch.nn.functional.logsigmoid(torch.randn(1, 10, 2, 4))
        >>> o, s = chunked_gla(q, k, v, g, scale=0.5, chunk_size=4)
        >>> o.shape, s.shape
        (torch.Size([1, 10, 2, 3]), torch.Size([1, 2, 4, 3]))
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"expected q, k [B, T, H, K] and v [B, T, H, V]; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    b, t, h, dk = q.shape
    if g is not None and g.shape not in ((b, t, h), (b, t, h, dk)):
        raise ValueError(f"g must be [B, T, H] = {(b, t, h)} or [B, T, H, K] = {(b, t, h, dk)}, "
                         f"got {tuple(g.shape)}")
    if initial_state is not None and initial_state.shape != (b, h, dk, v.shape[-1]):
        raise ValueError(f"initial_state must be [B, H, K, V] = {(b, h, dk, v.shape[-1])}, "
                         f"got {tuple(initial_state.shape)}")
    return _ChunkedGLA.apply(q, k, v, g, initial_state, float(scale), int(chunk_size))
