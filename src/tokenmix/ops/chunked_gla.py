"""Gated linear attention, chunkwise, with a hand-written backward: the fast path of the family.

Recurrence per head (reference: ops/recurrent_gla.py), state S [K, V]:

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ,        o_t = scale · S_tᵀ q_t,

with a log decay g per key channel [B, T, H, K] (GLA), per head [B, T, H] (RetNet, Mamba-2:
broadcast over K) or none (linear attention).

Chunked form. Split time into chunks of C tokens; inside a chunk let G_i = sum_{s<=i} g_s (restarted
at the chunk start, so G <= 0 and decreasing when g <= 0), Gamma = G_{C-1} and S the state entering
the chunk. Then, for i, j in the chunk,

    o_i = scale (sum_{j<=i} sum_c q_ic k_jc exp(G_ic - G_jc) v_j  +  (q_i ⊙ exp(G_i))ᵀ S)    intra + inter
    S'  = diag(exp(Gamma)) S + sum_j (k_j ⊙ exp(Gamma - G_j)) v_jᵀ                          carry

Every chunk-level step is one batched matmul over all chunks at once ([N B H, C, .] rows, chunk-major
so that chunk i's states are one contiguous block): intra scores, A @ V, the chunk writes and the
reads q_in @ S. Only the carry S -> S' is sequential (T / C small steps on [K, V] states).

Intra-chunk scores, two exact forms chosen per chunk:
  * factored (fast): A = tril((q ⊙ exp(G)) (k ⊙ exp(-G))ᵀ), one matmul for any decay kind. Each
    product (q_ic e^{G_ic}) (k_jc e^{-G_jc}) is the term q_ic k_jc e^{G_ic - G_jc} with two roundings,
    so it is as accurate as the direct form as long as neither factor over- or underflows; that holds
    when |G| <= ln(max float) / 2 on the whole chunk (44 in float32, 354 in float64). The chunk's
    write uses the same factor: k ⊙ exp(Gamma - G) = (k ⊙ exp(-G)) ⊙ exp(Gamma).
  * safe (chunks whose |G| exceeds that bound: decays stronger than e^-44 inside one chunk in float32),
    using exponents G_i - G_j <= 0 only, so nothing overflows however strong the decay:
        per head:  (Q Kᵀ) ⊙ exp(G_i - G_j), masked to j <= i before the exp;
        per key:   no [C, C, K] tensor is ever formed. Halve the chunk recursively (blocks of 2s tokens,
                   s = C/2, C/4, ... down to a base block of <= 4 tokens): between the two halves of a
                   block, with m the last token of the left half, exp(G_i - G_j) = exp(G_i - G_m) ·
                   exp(G_m - G_j), both factors <= 1, so those scores are one matmul of decayed q and k.
                   Inside a base block the scores at each offset d = i - j are one elementwise pass
                   sum_c q_{i,c} k_{i-d,c} exp(G_{i,c} - G_{i-d,c}).
Ordinary gates (GLA's logsigmoid / 16, RetNet's fixed decays) keep every chunk on the factored form;
only saturated gates reach the safe one, and a call with both kinds of chunks computes each row set
with its own form (gathered, then scattered back).

Backward (closed form; autograd through the loops would store a copy of every slice). With dO the
output gradient and dS_T the final-state gradient:
    reverse carry:  dS_n = diag(exp(Gamma_n)) dS_{n+1} + scale (Q ⊙ exp(G))_nᵀ dO_n   (dS_N = dS_T)
    scores:         dA = scale dO Vᵀ (lower), dV = scale Aᵀ dO + k_out dS_{n+1}
    decay:          every q_i enters as q_i exp(+G_i) and every k_j as k_j exp(-G_j), so
                    dG = q ⊙ dq - k ⊙ dk, plus at the chunk end dGamma = rowsum(S_{n+1} ⊙ dS_{n+1})
                    (the state leaving the chunk times its gradient: both the write k_out and the
                    decay of S depend on Gamma through exp(Gamma));  dg = reverse cumsum of dG.
Reassociated with respect to the recurrence (exp(G_i - G_j) instead of a product of exp(g)), so it
equals ``recurrent_gla`` up to rounding (float64 ~1e-15 relative).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from tokenmix.core.errors import InputError
from tokenmix.core.threads import one_thread
from tokenmix.ops.chunk_boundaries import ChunkBoundaries, check_doc_starts, chunk_boundaries

_NONE, _PER_HEAD, _PER_KEY = "none", "per_head", "per_key"
_BASE_BLOCK = 4  # safe per-key scores: pairs inside blocks of at most this many tokens are built elementwise


# ---------------------------------------------------------------- layout
def _to_rows(x: Tensor, n: int, c: int, scale: float = 1.0) -> Tensor:
    """scale · x: [B, T, H, F] -> [N * B * H, C, F], chunk-major rows, zero-padded at the end of time
    (one pass: the scale is applied while copying)."""
    b, t, h, f = x.shape
    full = t // c
    out = x.new_empty(n, b, h, c, f)
    if full:
        _scaled_copy(out[:full], x[:, : full * c].view(b, full, c, h, f).permute(1, 0, 3, 2, 4), scale)
    if full < n:  # the partial last chunk; padded tokens have q = k = v = g = 0
        out[full].zero_()
        _scaled_copy(out[full, :, :, : t - full * c], x[:, full * c :].transpose(1, 2), scale)
    return out.view(n * b * h, c, f)


def _from_rows(x: Tensor, b: int, t: int, h: int, scale: float = 1.0) -> Tensor:
    """scale · x: [N * B * H, C, F] chunk-major rows -> [B, T, H, F] (padding dropped, one pass, contiguous)."""
    r, c, f = x.shape
    n = r // (b * h)
    full = t // c
    src = x.view(n, b, h, c, f)
    out = x.new_empty(b, t, h, f)
    if full:
        _scaled_copy(out[:, : full * c].view(b, full, c, h, f), src[:full].permute(1, 0, 3, 2, 4), scale)
    if full < n:
        _scaled_copy(out[:, full * c :], src[full, :, :, : t - full * c].transpose(1, 2), scale)
    return out


def _scaled_copy(dst: Tensor, src: Tensor, scale: float) -> None:
    if scale == 1.0:
        dst.copy_(src)
    else:
        torch.mul(src, scale, out=dst)


# ---------------------------------------------------------------- the chunk recurrence
# Shared with ops/chunked_ssd.py: both carry a state through the chunks as S' = diag(e^Gamma) S + write
# (GLA per key or per head on [K, V], the SSD per head on [N, H P]); only the layouts differ.
def carry_states_(sbuf: Tensor, decay: Tensor | None) -> None:
    """In place, sbuf[i + 1] += decay[i] ⊙ sbuf[i] for i = 0..N-1: the only sequential part, T / C steps.

    sbuf [N + 1, ...]: sbuf[0] the state entering the first chunk, sbuf[i + 1] chunk i's own write,
    then the state leaving it; decay [N, ...] broadcast against one state (None: no decay). A loop of
    small adds is much faster than a cumulative sum along the outer axis."""
    for i in range(sbuf.shape[0] - 1):
        if decay is None:
            sbuf[i + 1].add_(sbuf[i])
        else:
            sbuf[i + 1].addcmul_(decay[i], sbuf[i])


def carry_gradients_(dbuf: Tensor, decay: Tensor | None) -> None:
    """The reverse carry, in place: dbuf[i] += decay[i] ⊙ dbuf[i + 1] for i = N-1..0 (dbuf[N] = dS_T,
    dbuf[i] each chunk's read gradient on the way in, dL/dS_i on the way out)."""
    for i in reversed(range(dbuf.shape[0] - 1)):
        if decay is None:
            dbuf[i].add_(dbuf[i + 1])
        else:
            dbuf[i].addcmul_(decay[i], dbuf[i + 1])


def check_chunked_inputs(
    chunk_size: int,
    initial_state: Tensor | None,
    state_shape: tuple[int, ...],
    dims: str,
    doc_starts: Tensor | None,
    b: int,
    t: int,
) -> None:
    """A chunked call's chunk size, initial state ([``dims``] = ``state_shape`` or None) and packed
    rows' ``doc_starts`` [B, T] (this op's and ops/chunked_ssd.py's)."""
    if chunk_size <= 0:
        raise InputError(f"chunk_size must be > 0, got {chunk_size}")
    if initial_state is not None and initial_state.shape != state_shape:
        raise InputError(f"initial_state must be [{dims}] = {state_shape}, got {tuple(initial_state.shape)}")
    if doc_starts is not None:
        check_doc_starts(doc_starts, b, t)


def on_host(x: Tensor) -> bool:
    """Whether x is in host memory, where reading a value of it back (``bool``, ``int``) costs
    nothing; on another device the read waits until the device has caught up (a stall per call)."""
    return x.device.type == "cpu"


def factored_bound(dtype: torch.dtype) -> float:
    """Largest |G| for which exp(G) and exp(-G) both stay normal with room for |q|, |k| up to e^bound."""
    return 0.5 * math.log(torch.finfo(dtype).max)


# ---------------------------------------------------------------- safe intra-chunk scores
def _causal_decay(gc: Tensor) -> Tensor:
    """exp(G_i - G_j) for j <= i, 0 above: gc [.., C, 1] -> [.., C, C]. Masked before exp."""
    c = gc.shape[-2]
    diff = gc[..., :, 0, None] - gc[..., None, :, 0]
    upper = torch.ones(c, c, dtype=torch.bool, device=gc.device).triu(1)
    return diff.masked_fill_(upper, float("-inf")).exp_()


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


def _safe_scores(q: Tensor, k: Tensor, gc: Tensor, kind: str) -> tuple[Tensor, list]:
    """A [R, C, C]: A_ij = sum_c q_ic k_jc exp(G_ic - G_jc) for j <= i, 0 above (no scale), computed
    with exponents <= 0 only. Also returns the decay factors it computed, for ``_safe_score_grads``."""
    if kind == _PER_HEAD:
        decay = _causal_decay(gc)
        return torch.bmm(q, k.transpose(1, 2)).mul_(decay), [decay]
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


def _safe_score_grads(da: Tensor, q: Tensor, k: Tensor, decays: list, kind: str) -> tuple[Tensor, Tensor]:
    """Gradients of ``_safe_scores`` w.r.t. q and k, for the score gradient da [R, C, C]."""
    if kind == _PER_HEAD:
        w = da * decays[0]
        return torch.bmm(w, k), torch.bmm(w.transpose(1, 2), q)
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


# ---------------------------------------------------------------- per-chunk local parts
# The readout scale is folded into q once (qs = scale · q on the way in, dq = scale · dqs on the way
# out), so that no matmul or pass carries it. Each part works on a set of chunk rows [r, C, .]:
#   forward:  A (intra scores of qs, lower triangular), q_in = qs ⊙ exp(G) (what reads the entering
#             state), delta = the chunk's own write decayed to the chunk end [r, K, V], saved tensors;
#   backward: dqs, dk, dv (and dG = qs ⊙ dqs - k ⊙ dk) of the rows, given dO, the gradient d_next of
#             the state leaving each chunk and the state entering it.
def _fast_forward(qs, k, v, gc, own=False, delta_out=None, masks=None):
    """Factored form; |G| <= factored_bound on these rows.

    ``own``: qs and k are this call's own row copies, not needed afterwards, so they are scaled in
    place into q_in and k_t (saving two [r, C, K] allocations); ``delta_out`` [r, K, V]: where the
    chunk writes go (the state buffer), instead of a new tensor; ``masks``: the rows' document masks
    (packed rows, ``_RowMasks``).
    """
    e_g = gc.exp()  # [r, C, K|1]
    e_ng = e_g.reciprocal()  # exp(-G), normal by the bound
    if own:
        q_in, k_t = qs.mul_(e_g), k.mul_(e_ng)
    else:
        q_in, k_t = qs * e_g, k * e_ng  # qs ⊙ e^G, k ⊙ e^-G
    a = torch.bmm(q_in, k_t.transpose(1, 2)).tril_()
    e_gamma = e_g[:, -1:, :].transpose(1, 2)  # [r, K|1, 1]: decay across the whole chunk
    k_w = k_t if masks is None else masks.written(k_t)
    if masks is not None:
        masks.same_(a)
    delta = torch.bmm(k_w.transpose(1, 2), v, out=delta_out).mul_(e_gamma)  # (k ⊙ e^(Gamma - G))ᵀ v
    return a, q_in, delta, (q_in, k_t, e_g, e_ng, e_gamma)


def _fast_backward(do, v, a, d_next, starts, saved, want_dg, masks=None, do_read=None):
    """``do_read``: the output gradient of the queries that read the entering state (packed rows;
    None: ``do``)."""
    q_in, k_t, e_g, e_ng, e_gamma = saved
    # the plain form's backward on q_in = qs ⊙ e^G and k_t = k ⊙ e^-G, whose write k_out = k_t ⊙
    # e^Gamma folds e^Gamma into dS'; it returns d(qs ⊙ e^G) and d(k ⊙ e^-G)
    dq_t, dk_t, dv = _plain_backward(do, q_in, k_t, v, a, d_next * e_gamma, starts, masks, do_read)
    dg = (q_in * dq_t).addcmul_(k_t, dk_t, value=-1) if want_dg else None  # qs⊙dqs - k⊙dk
    return dq_t.mul_(e_g), dk_t.mul_(e_ng), dv, dg


def _safe_forward(qs, k, v, gc, kind, masks=None):
    """Exponents <= 0 only; any decay strength."""
    a, decays = _safe_scores(qs, k, gc, kind)
    e_in = gc.exp()
    e_out = (gc[:, -1:, :] - gc).exp_()  # token j's write decayed to the chunk end
    q_in, k_out = qs * e_in, k * e_out
    if masks is not None:
        masks.same_(a)
        masks.writes_(k_out)
    delta = torch.bmm(k_out.transpose(1, 2), v)
    return a, q_in, delta, (qs, k, decays, e_in, e_out, k_out)


def _safe_backward(do, v, a, d_next, starts, saved, kind, want_dg, masks=None, do_read=None):
    qs, k, decays, e_in, e_out, k_out = saved  # k_out: the writing keys only (packed rows)
    da = torch.bmm(do, v.transpose(1, 2))
    if masks is not None:
        masks.same_(da)
    dv = torch.bmm(a.transpose(1, 2), do).baddbmm_(k_out, d_next)
    dq, dk = _safe_score_grads(da, qs, k, decays, kind)
    dq.addcmul_(torch.bmm(do if do_read is None else do_read, starts.transpose(1, 2)), e_in)
    d_write = torch.bmm(v, d_next.transpose(1, 2))
    dk.addcmul_(d_write if masks is None else masks.writes_(d_write), e_out)
    dg = (qs * dq).addcmul_(k, dk, value=-1) if want_dg else None
    return dq, dk, dv, dg


def _none_forward(qs, k, v, delta_out=None, masks=None):
    a = torch.bmm(qs, k.transpose(1, 2)).tril_()
    if masks is None:
        return a, qs, torch.bmm(k.transpose(1, 2), v, out=delta_out)
    masks.same_(a)
    return a, qs, torch.bmm(masks.written(k).transpose(1, 2), v, out=delta_out)


def _plain_backward(do, qs, k, v, a, d_next, starts, masks=None, do_read=None):
    """Backward of o = tril(qs kᵀ) v + qs S, S' = kᵀ v: the form without decay, and the factored one
    on its decayed q and k. Returns dqs, dk, dv."""
    da = torch.bmm(do, v.transpose(1, 2)).tril_()
    k_w, v_w, do_read = k, v, do if do_read is None else do_read
    if masks is not None:
        masks.same_(da)
        k_w, v_w = masks.written(k), masks.written(v)
    dv = torch.bmm(a.transpose(1, 2), do).baddbmm_(k_w, d_next)
    dq = torch.bmm(da, k).baddbmm_(do_read, starts.transpose(1, 2))
    dk = torch.bmm(da.transpose(1, 2), qs).baddbmm_(v_w, d_next.transpose(1, 2))
    return dq, dk, dv


def _split_rows(gc: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """Indices of the chunk rows for the factored and the safe form (None: every row).

    The split counts the rows over the bound on the host. Off the CPU that count would stall the
    device every call, so there every row takes the safe form, exact for any decay (the factored
    form is its faster twin where it applies); the CPU keeps the split, where the count is free.
    """
    if not on_host(gc):
        return gc.new_empty(0, dtype=torch.long), None
    # amax and amin: two passes without a |G| temporary, together ~4x faster than aminmax on CPU
    flat = gc.view(gc.shape[0], -1)
    lo, hi = flat.amin(1), flat.amax(1)
    bad = torch.maximum(hi, -lo) > factored_bound(gc.dtype)  # [R]
    n_bad = int(bad.sum())
    if n_bad == 0:
        return None, gc.new_empty(0, dtype=torch.long)
    if n_bad == bad.numel():
        return gc.new_empty(0, dtype=torch.long), None
    return (~bad).nonzero()[:, 0], bad.nonzero()[:, 0]


def _reverse_cumsum_(x: Tensor) -> Tensor:
    """In place, x_j <- sum_{i >= j} x_i along dim 1 of x [R, C, F]: C - 1 slice adds, which is ~3x
    faster on CPU than flip / cumsum / flip (two [R, C, F] copies)."""
    for j in range(x.shape[1] - 2, -1, -1):
        x[:, j].add_(x[:, j + 1])
    return x


def _rows(x: Tensor, idx: Tensor | None) -> Tensor:
    return x if idx is None else x.index_select(0, idx)


class _RowMasks:
    """The document masks of packed chunk rows (ops/chunk_boundaries.py): ``same`` [M, C, C],
    ``reads`` and ``writes`` [M, C, 1], each mask row covering ``h`` consecutive chunk rows (the heads
    of one chunk of one batch row). Applied by multiplication, in place (``*_``) or into a new tensor."""

    def __init__(self, same: Tensor, reads: Tensor, writes: Tensor, h: int) -> None:
        self.same, self.reads, self.writes, self.h = same, reads, writes, h

    @classmethod
    def of(cls, bounds: ChunkBoundaries, h: int) -> "_RowMasks":
        n, b, c = bounds.reads.shape[:3]
        return cls(bounds.same.view(n * b, c, c), bounds.reads.view(n * b, c, 1), bounds.writes.view(n * b, c, 1), h)

    def rows(self) -> tuple[Tensor, Tensor, Tensor]:
        return self.same, self.reads, self.writes

    def select(self, idx: Tensor | None) -> "_RowMasks":
        """The masks of chunk rows ``idx`` (None: all), one mask row per chunk row."""
        if idx is None:
            return self
        m = idx // self.h
        return _RowMasks(self.same.index_select(0, m), self.reads.index_select(0, m), self.writes.index_select(0, m), 1)

    def _mul(self, x: Tensor, m: Tensor, out: Tensor | None = None) -> Tensor:
        out = torch.empty_like(x) if out is None else out
        if self.h == 1:
            return torch.mul(x, m, out=out)
        torch.mul(x.view(-1, self.h, *x.shape[1:]), m[:, None], out=out.view(-1, self.h, *x.shape[1:]))
        return out

    def same_(self, x: Tensor) -> Tensor:
        return self._mul(x, self.same, x)

    def reads_(self, x: Tensor) -> Tensor:
        return self._mul(x, self.reads, x)

    def writes_(self, x: Tensor) -> Tensor:
        return self._mul(x, self.writes, x)

    def read(self, x: Tensor) -> Tensor:
        """x [r, C, .] with the rows of the queries that do not read the entering state zeroed (a new tensor)."""
        return self._mul(x, self.reads)

    def written(self, x: Tensor) -> Tensor:
        """x [r, C, .] with the rows of the keys that do not write the leaving state zeroed (a new tensor)."""
        return self._mul(x, self.writes)


class _ChunkedGLA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, s0, scale, chunk, doc_starts):
        b, t, h, dk = q.shape
        dv = v.shape[-1]
        n = -(-t // chunk)
        kind = _NONE if g is None else (_PER_HEAD if g.dim() == 3 else _PER_KEY)
        masks = carry = None
        if doc_starts is not None:
            bounds = chunk_boundaries(doc_starts, n, chunk, q.dtype)
            masks = _RowMasks.of(bounds, h)
            carry = bounds.carry[:, :, None].expand(n, b, h).reshape(n, b * h, 1, 1)  # [N, BH, 1, 1]
        qs, kc, vc = _to_rows(q, n, chunk, scale), _to_rows(k, n, chunk), _to_rows(v, n, chunk)  # [R, C, .]
        rows = n * b * h
        # sbuf[i] = state entering chunk i (i < N), sbuf[N] = final state; chunk-major, so that
        # sbuf[1:] is the batched-matmul output of every chunk's write
        sbuf = q.new_empty(n + 1, b * h, dk, dv)
        sbuf[0] = 0 if s0 is None else s0.reshape(b * h, dk, dv)
        decay = None
        # the chunk writes go straight into sbuf[1:] where one form covers every row
        writes = sbuf[1:].view(rows, dk, dv)
        if kind == _NONE:
            a, q_in, delta = _none_forward(qs, kc, vc, writes, masks)
            saved = ()
        else:
            gl = g if kind == _PER_KEY else g[..., None]
            gc = _to_rows(gl, n, chunk).cumsum_(1)  # [R, C, K|1], G inside each chunk
            fast, safe = _split_rows(gc)
            parts = []
            if fast is None:  # every row factored: qs and kc become q_in and k_t in place
                parts.append(("fast", None, _fast_forward(qs, kc, vc, gc, own=True, delta_out=writes, masks=masks)))
            elif fast.numel():
                rows_in = (_rows(qs, fast), _rows(kc, fast), _rows(vc, fast), _rows(gc, fast))
                parts.append(("fast", fast, _fast_forward(*rows_in, masks=masks and masks.select(fast))))
            if safe is None or safe.numel():
                rows_in = (_rows(qs, safe), _rows(kc, safe), _rows(vc, safe), _rows(gc, safe))
                parts.append(("safe", safe, _safe_forward(*rows_in, kind, masks=masks and masks.select(safe))))
            if len(parts) == 1:
                _, _, (a, q_in, delta, _) = parts[0]
            else:  # mixed: assemble the rows of both forms
                a = qs.new_empty(rows, chunk, chunk)
                q_in, delta = torch.empty_like(qs), qs.new_empty(rows, dk, dv)
                for _, idx, (a_p, q_p, d_p, _) in parts:
                    a.index_copy_(0, idx, a_p)
                    q_in.index_copy_(0, idx, q_p)
                    delta.index_copy_(0, idx, d_p)
            saved = tuple((name, idx, p[3]) for name, idx, p in parts)
            decay = gc[:, -1, :].exp().view(n, b * h, -1, 1)  # [N, BH, K|1, 1]
        if carry is not None:  # a chunk in which a document begins carries nothing through
            decay = carry if decay is None else decay.mul_(carry)
        if delta.data_ptr() != writes.data_ptr():
            writes.copy_(delta)
        with one_thread():  # [K, V]-sized steps: a second thread's wake-up costs more than it saves
            carry_states_(sbuf, decay)
        starts = sbuf[:n].view(rows, dk, dv)
        if masks is None:
            o = torch.bmm(a, vc).baddbmm_(q_in, starts)
        else:  # only the queries whose document began before the chunk read its entering state
            o = masks.reads_(torch.bmm(q_in, starts)).baddbmm_(a, vc)
        ctx.save_for_backward(qs, kc, vc, a, q_in, sbuf)
        # intermediates (not inputs or outputs) may live on ctx; keeping them saves their exps
        ctx.parts = (saved, decay, masks)
        ctx.meta = (kind, scale, b, t, h, s0 is not None)
        return _from_rows(o, b, t, h), sbuf[n].view(b, h, dk, dv).clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, d_o, d_s):
        qs, kc, vc, a, q_in, sbuf = ctx.saved_tensors
        saved, decay, masks = ctx.parts
        kind, scale, b, t, h, has_s0 = ctx.meta
        rows, c, dk = qs.shape
        dv_dim = vc.shape[-1]
        n = rows // (b * h)
        do = _to_rows(d_o, n, c)
        do_read = None if masks is None else masks.read(do)  # the output gradient of the reading queries
        # reverse carry: dbuf[i] = dL/dS_i, the gradient of the state entering chunk i (dbuf[N] = dS_T)
        dbuf = torch.empty_like(sbuf)
        dbuf[n] = 0 if d_s is None else d_s.reshape(b * h, dk, dv_dim)
        read_grad = do if masks is None else do_read
        torch.bmm(q_in.transpose(1, 2), read_grad, out=dbuf[:n].view(rows, dk, dv_dim))  # each chunk's read
        with one_thread():
            carry_gradients_(dbuf, decay)
        starts, d_next = sbuf[:n].view(rows, dk, dv_dim), dbuf[1:].view(rows, dk, dv_dim)
        want_dg = kind != _NONE and ctx.needs_input_grad[3]  # RetNet's constant decays need no gradient
        dg = None
        if kind == _NONE:
            dq, dk_, dv = _plain_backward(do, qs, kc, vc, a, d_next, starts, masks, do_read)
        else:
            results = []
            for name, idx, part in saved:
                args = (_rows(do, idx), _rows(vc, idx), _rows(a, idx), _rows(d_next, idx), _rows(starts, idx), part)
                packed = {} if masks is None else {"masks": masks.select(idx), "do_read": _rows(do_read, idx)}
                if name == "fast":
                    res = _fast_backward(*args, want_dg, **packed)
                else:
                    res = _safe_backward(*args, kind, want_dg, **packed)
                results.append((idx, res))
            if len(results) == 1:
                dq, dk_, dv, dgc = results[0][1]
            else:
                dq, dk_, dv = torch.empty_like(qs), torch.empty_like(kc), torch.empty_like(vc)
                dgc = torch.empty_like(qs) if want_dg else None
                for idx, res in results:
                    for full, part in zip((dq, dk_, dv, dgc), res):
                        if full is not None:
                            full.index_copy_(0, idx, part)
            if want_dg:
                # chunk end: dGamma = rowsum(S_{n+1} ⊙ dS_{n+1}) (write and state decay both scale by e^Gamma)
                dgamma = torch.einsum("...kv,...kv->...k", sbuf[1:], dbuf[1:]).reshape(rows, dk)  # [R, K]
                if kind == _PER_HEAD:
                    dgc, dgamma = dgc.sum(-1, keepdim=True), dgamma.sum(-1, keepdim=True)
                dgc[:, -1, :] += dgamma
                # G = cumsum(g) inside the chunk: dg_j = sum_{i >= j} dG_i
                _reverse_cumsum_(dgc)
                dg = _from_rows(dgc, b, t, h)
                if kind == _PER_HEAD:
                    dg = dg[..., 0]
        ds0 = dbuf[0].view(b, h, dk, dv_dim) if has_s0 else None
        return (
            _from_rows(dq, b, t, h, scale),
            _from_rows(dk_, b, t, h),
            _from_rows(dv, b, t, h),
            dg,
            ds0,
            None,
            None,
            None,
        )


def chunked_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    scale: float = 1.0,
    initial_state: Tensor | None = None,
    chunk_size: int = 64,
    doc_starts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Gated linear attention, chunkwise (same results as ``recurrent_gla`` up to rounding).

    Packed rows (``doc_starts``): the state resets at every document boundary, as if each document
    ran alone (the first of a row from ``initial_state``, the others from zero). Inside a chunk the
    scores between tokens of different documents are zero, a query whose document begins inside the
    chunk does not read the state entering it, and the state leaving a chunk with a boundary holds
    the writes of the chunk's last document alone (ops/chunk_boundaries.py: 0 / 1 masks of O(T C)).

    Args:
        q, k: [B, T, H, K] queries and keys.
        v: [B, T, H, V] values.
        g: log decay, [B, T, H, K] per key channel, [B, T, H] per head, or None (decay 1). Any real
            values are accepted; the overflow-free guarantee holds for g <= 0 (decays in (0, 1]).
        scale: readout scale.
        initial_state: [B, H, K, V] or None (zeros).
        chunk_size: C (any positive size; powers of two use the most matmuls in the safe per-key form).
        doc_starts: [B, T] long (``Packing.starts``: where each position's document begins), or None
            for one document per row.
    Returns:
        o: [B, T, H, V];  final state S_T: [B, H, K, V] (of each row's last document).

    Examples:
        >>> q, k, v = torch.randn(1, 10, 2, 4), torch.randn(1, 10, 2, 4), torch.randn(1, 10, 2, 3)
        >>> g = torch.nn.functional.logsigmoid(torch.randn(1, 10, 2, 4))
        >>> o, s = chunked_gla(q, k, v, g, scale=0.5, chunk_size=4)
        >>> o.shape, s.shape
        (torch.Size([1, 10, 2, 3]), torch.Size([1, 2, 4, 3]))
    """
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise InputError(
            f"expected q, k [B, T, H, K] and v [B, T, H, V]; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    b, t, h, dk = q.shape
    if g is not None and g.shape not in ((b, t, h), (b, t, h, dk)):
        raise InputError(f"g must be [B, T, H] = {(b, t, h)} or [B, T, H, K] = {(b, t, h, dk)}, got {tuple(g.shape)}")
    check_chunked_inputs(chunk_size, initial_state, (b, h, dk, v.shape[-1]), "B, H, K, V", doc_starts, b, t)
    return _ChunkedGLA.apply(q, k, v, g, initial_state, float(scale), int(chunk_size), doc_starts)
