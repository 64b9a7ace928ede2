"""Channel-wise gated delta rule (KDA, Gated DeltaNet-2): chunkwise UT transform and its token-by-token reference.

Recurrence per head, state S [K, V] (fla's layout), with a log decay per key channel g_t [K] <= 0,
an erase key e_t [K] and a write value w_t [V]:

    S_t = (I - k_t e_tᵀ) Diag(exp(g_t)) S_{t-1} + k_t w_tᵀ,        o_t = scale · S_tᵀ q_t.

Instances: the gated delta rule (ops/chunked_delta.py) is e = beta k, w = beta v, g = scalar per head;
KDA (Kimi Delta Attention) is e = beta k, w = beta v with g per channel; Gated DeltaNet-2 is
e = b ⊙ k (a channel-wise erase gate b [K]) and w = w_gate ⊙ v (a channel-wise write gate [V]).

Token view. With G_t = sum_{i<=t} g_i [K] and S_t = exp(G_t) ⊙ S_0 + sum_{j<=t} (exp(G_t - G_j) ⊙ k_j) u_jᵀ
(⊙ scales the K rows), the pseudo-values u_t [V] solve

    u_t + sum_{j<t} [sum_d e_td k_jd exp(G_td - G_jd)] u_j = w_t - S_0ᵀ (exp(G_t) ⊙ e_t),

i.e. U = (I - B)^{-1} (W + offset) with B[t, j] = -sum_d e_td k_jd exp(G_td - G_jd) (j < t): one scalar
per (t, j) and head, so the mixing stays a T x T matrix per head although the decay is per channel
(the channel sum sits inside each entry, as in GLA). The read-out is
O = R U + scale (Q ⊙ exp(G)) S_0 with R[t, j] = scale sum_d q_td k_jd exp(G_td - G_jd) (j <= t).

Chunked form: the same identity inside each chunk of C tokens, G restarted at the chunk start,

    U = U0 - W S,  U0 = T Wv,  W = T (e ⊙ exp(G)),  T = (I + A_kk)^{-1},  A_kk = -B restricted to the chunk,
    O = scale (Q ⊙ exp(G)) S + (Q Kᵀ ⊙ Gamma) U,    S' = exp(G_C) ⊙ S + (exp(G_C - G) ⊙ K)ᵀ U.

The intra-chunk scores sum_d a_id k_jd exp(G_id - G_jd) (a = e for A_kk, a = q for the read-out) come from
``decayed_scores``: binary splitting of the chunk, one matmul per pair of sibling blocks through the
second block's first position, so every exponent is <= 0 (g <= 0: strong gates cannot overflow) and
the per-channel decay costs O(K log C) elementwise work per token. fla's naive_chunk_kda forms the
full [C, C, K] products instead. The UT transform is ``unit_lower_inverse`` of ops/chunked_delta.py.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.ops.chunked_delta import chunk_state_recurrence, time_chunks, unit_lower_inverse


def _check(q: Tensor, k: Tensor, v: Tensor, e: Tensor, g: Tensor | None) -> None:
    b, t, h, _ = q.shape
    if k.shape != q.shape or e.shape != q.shape or v.shape[:3] != (b, t, h):
        raise InputError(
            f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, e {tuple(e.shape)}, v {tuple(v.shape)}"
        )
    if g is not None and g.shape != q.shape:
        raise InputError(f"g must be [B, T, H, K] = {tuple(q.shape)}, got {tuple(g.shape)}")


def _pair_decay(gc: Tensor, causal: Tensor) -> Tensor:
    """exp(G_i - G_j) per channel for j <= i, 0 above: gc [..., C, K] -> [..., C, C, K]."""
    diff = gc[..., :, None, :] - gc[..., None, :, :]
    return diff.masked_fill(~causal[..., None], float("-inf")).exp()


def decayed_scores(queries: tuple[Tensor, ...], b: Tensor, gc: Tensor) -> tuple[Tensor, ...]:
    """S[i, j] = sum_d a_id b_jd exp(G_id - G_jd) for j <= i, 0 above, inside each chunk, for every a in
    ``queries`` (the decays are formed once and shared).

    Args:
        queries: tensors a [..., C, K];  b: [..., C, K];  gc: [..., C, K] cumulative log decay from the
            chunk start (non-increasing).
    Returns:
        one [..., C, C] per query.

    Binary splitting (C padded to a power of two with inert positions). Every pair j < i splits at
    exactly one level: the smallest aligned block of 2s positions holding both has j in its first
    half and i in its second. With r the first position of that second half, j < r <= i, so

        exp(G_i - G_j) = exp(G_i - G_r) exp(G_r - G_j),   both exponents <= 0 (G non-increasing),

    and the whole [s, s] block of such pairs is one matmul (a_i exp(G_i - G_r)) (b_j exp(G_r - G_j))ᵀ.
    Level s = 1, 2, 4, ..., C/2 touches every position once (as a row of a second half or a column
    of a first half): O(K) elementwise work per position and level, O(C K log C) per chunk in all,
    instead of the O(C^2 K) per-channel products of fla's naive_chunk_kda; nothing can overflow,
    since no exponent is positive. The blocks are assembled like ``unit_lower_inverse``'s
    (diagonal a_i·b_i first, then [[M_first, 0], [off, M_second]] per level).
    """
    c, dk = b.shape[-2:]
    lead = b.shape[:-2]
    p2 = 1 << (c - 1).bit_length()
    if p2 != c:  # pad with inert positions: a = b = 0, G held at its last value (still non-increasing)
        pad = p2 - c
        queries = tuple(torch.cat([a, a.new_zeros(*lead, pad, dk)], -2) for a in queries)
        b = torch.cat([b, b.new_zeros(*lead, pad, dk)], -2)
        gc = torch.cat([gc, gc[..., -1:, :].expand(*lead, pad, dk)], -2)
    scores = [(a * b).sum(-1)[..., :, None, None] for a in queries]  # [..., C, 1, 1]: the diagonal
    s = 1
    while s < p2:
        nb = p2 // (2 * s)
        g5 = gc.reshape(*lead, nb, 2, s, dk)
        ref = g5[..., 1, :1, :]  # [..., nb, 1, K]: G at the first position r of each second half
        to_ref = (g5[..., 1, :, :] - ref).exp()  # [..., nb, s, K]: exp(G_i - G_r), i in the second half
        from_ref = (ref - g5[..., 0, :, :]).exp()  # [..., nb, s, K]: exp(G_r - G_j), j in the first half
        b_t = (b.reshape(*lead, nb, 2, s, dk)[..., 0, :, :] * from_ref).transpose(-1, -2)  # [..., nb, K, s]
        new = []
        for a, m in zip(queries, scores):
            off = (a.reshape(*lead, nb, 2, s, dk)[..., 1, :, :] * to_ref) @ b_t  # [..., nb, s, s]
            pair = m.reshape(*lead, nb, 2, s, s)
            top = torch.cat([pair[..., 0, :, :], torch.zeros_like(off)], -1)
            new.append(torch.cat([top, torch.cat([off, pair[..., 1, :, :]], -1)], -2))
        scores = new
        s *= 2
    return tuple(m.reshape(*lead, p2, p2)[..., :c, :c] for m in scores)


def chunked_channel_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    e: Tensor,
    g: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    chunk_size: int = 32,
) -> tuple[Tensor, Tensor]:
    """Channel-wise gated delta rule, chunkwise.

    Args:
        q, k: [B, T, H, K] queries and keys (the caller L2-normalises k).
        v: [B, T, H, V] write values w_t (beta v for KDA, w ⊙ v for GDN-2).
        e: [B, T, H, K] erase keys (beta k for KDA, b ⊙ k for GDN-2).
        g: [B, T, H, K] per-channel log decays (<= 0), or None for no decay.
        scale: readout scale; None means K^-1/2.
        initial_state: [B, H, K, V] or None (zeros).
        chunk_size: C.
    Returns:
        o: [B, T, H, V];  final state S_T: [B, H, K, V].

    Examples:
        >>> q, k = torch.randn(1, 10, 2, 4), torch.nn.functional.normalize(torch.randn(1, 10, 2, 4), dim=-1)
        >>> o, s = chunked_channel_delta_rule(q, k, torch.randn(1, 10, 2, 3), 0.5 * k, -torch.rand(1, 10, 2, 4),
        ...                                   chunk_size=4)
        >>> o.shape, s.shape
        (torch.Size([1, 10, 2, 3]), torch.Size([1, 2, 4, 3]))
    """
    if chunk_size <= 0:
        raise InputError(f"chunk_size must be > 0, got {chunk_size}")
    _check(q, k, v, e, g)
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    scale = dk**-0.5 if scale is None else scale
    c = chunk_size
    n = -(-t // c)
    # padded tokens have k = e = v = g = 0: they neither write, erase nor decay the state
    chunks = lambda x: time_chunks(x, n, c)  # noqa: E731  [B, T, H, ...] -> [B, H, N, C, ...]
    qc, kc, vc, ec = chunks(q), chunks(k), chunks(v), chunks(e)  # [B,H,N,C,K|V]
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    eye = torch.eye(c, dtype=q.dtype, device=q.device)
    if g is None:
        gc = None
        a_kk = (ec @ kc.transpose(-1, -2)).tril(-1)
        qk = (qc @ kc.transpose(-1, -2)) * causal.to(q.dtype) * scale
        ew, q_state, k_state, chunk_decay = ec, qc * scale, kc, None
    else:
        gc = chunks(g).cumsum(-2)  # [B,H,N,C,K], G restarted at every chunk start
        a_kk, qk = decayed_scores((ec, qc), kc, gc)  # [B,H,N,C,C] each
        a_kk, qk = a_kk.tril(-1), qk * scale
        ew = ec * gc.exp()
        q_state = qc * gc.exp() * scale
        g_last = gc[..., -1:, :]  # [B,H,N,1,K]
        k_state = kc * (g_last - gc).exp()
        chunk_decay = g_last.exp().transpose(-1, -2)  # [B,H,N,K,1]: decays the rows of S
    t_ut = unit_lower_inverse(eye + a_kk)  # the UT transform T
    u0, w = t_ut @ vc, t_ut @ ew  # [B,H,N,C,V], [B,H,N,C,K]

    u, starts, s = chunk_state_recurrence(u0, w, k_state, chunk_decay, initial_state)
    o = q_state @ starts + qk @ u  # [B,H,N,C,V]
    o = o.movedim(1, 3).reshape(b, n * c, h, dv)[:, :t]
    return o, s


def channel_delta_step(
    state: Tensor, q_t: Tensor, k_t: Tensor, v_t: Tensor, e_t: Tensor, g_t: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    """One token of the channel-wise gated delta rule, the reference the chunked form is tested against.

    Args:
        state: [B, H, K, V];  q_t, k_t, e_t: [B, H, K];  v_t: [B, H, V] (the write value);
        g_t: [B, H, K] log decay or None.
    Returns:
        o_t [B, H, V], next state [B, H, K, V].
    """
    if g_t is not None:
        state = state * g_t.exp()[..., None]  # 1. per-channel decay of the K rows
    erase = torch.einsum("bhk,bhkv->bhv", e_t, state)  # 2. what the erase key reads
    state = state + k_t[..., :, None] * (v_t - erase)[..., None, :]  # 3. rank-1 delta write
    return scale * torch.einsum("bhk,bhkv->bhv", q_t, state), state  # 4. read out


def recurrent_channel_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    e: Tensor,
    g: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Token-by-token reference with the signature of ``chunked_channel_delta_rule`` (no chunk size)."""
    _check(q, k, v, e, g)
    b, t, h, dk = q.shape
    scale = dk**-0.5 if scale is None else scale
    s = q.new_zeros(b, h, dk, v.shape[-1]) if initial_state is None else initial_state
    outs = []
    for i in range(t):
        o_t, s = channel_delta_step(s, q[:, i], k[:, i], v[:, i], e[:, i], None if g is None else g[:, i], scale)
        outs.append(o_t)
    return torch.stack(outs, 1), s


def channel_delta_operator(
    q: Tensor, k: Tensor, e: Tensor, g: Tensor | None, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Dense token-view matrices of the channel-wise gated delta rule over one segment.

    Args:
        q, k, e: [B, T, H, K];  g: [B, T, H, K] or None.
    Returns:
        mix_b [B, H, T, T], strictly lower: -sum_d e_td k_jd exp(G_td - G_jd);
        readout [B, H, T, T], lower: scale sum_d q_td k_jd exp(G_td - G_jd);
        decay [B, H, T, K] = exp(G_t), the per-channel weight of the initial state at t (G = cumsum of g).
    The write side (A and the values) is the caller's: U = (I - B)^{-1} (A X + offset).
    """
    b, t, h, dk = q.shape
    qh, kh, eh = q.transpose(1, 2), k.transpose(1, 2), e.transpose(1, 2)  # [B,H,T,K]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    if g is None:
        mask = causal.to(q.dtype)
        mix_b = -(eh @ kh.transpose(-1, -2)).tril(-1)
        readout = (qh @ kh.transpose(-1, -2)) * mask * scale
        decay = q.new_ones(b, h, t, dk)
    else:
        cum = g.transpose(1, 2).cumsum(-2)  # [B,H,T,K]
        gamma = _pair_decay(cum, causal)  # [B,H,T,T,K]
        mix_b = -(eh[..., :, None, :] * gamma * kh[..., None, :, :]).sum(-1).tril(-1)
        readout = (qh[..., :, None, :] * gamma * kh[..., None, :, :]).sum(-1) * scale
        decay = cum.exp()
    return mix_b, readout, decay


__all__ = ["chunked_channel_delta_rule", "channel_delta_step", "recurrent_channel_delta_rule", "channel_delta_operator"]
