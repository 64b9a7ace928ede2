"""Delta-rule family: chunkwise UT-transform (WY) fast path and the token-by-token reference.

Recurrence (state S [K, V] per head, fla's layout; g = None is the ungated DeltaNet, g = 0):

    S_t = exp(g_t) (I - beta_t k_t k_tᵀ) S_{t-1} + beta_t k_t v_tᵀ,        o_t = scale · S_tᵀ q_t.

Token view (see mixers/delta_rule.py for the derivation): with G_t = sum_{i<=t} g_i and
S_t = exp(G_t) S_0 + sum_{j<=t} exp(G_t - G_j) k_j u_jᵀ, the pseudo-values u solve

    u_t + beta_t sum_{j<t} exp(G_t - G_j) (k_t·k_j) u_j = beta_t v_t - beta_t exp(G_t) S_0ᵀ k_t,

i.e. U = (I - B)^{-1} (A V + offset) with A = diag(beta), B[t,j] = -beta_t exp(G_t - G_j) k_t·k_j, and
O = R U + scale exp(G) Q S_0 with R[t,j] = scale exp(G_t - G_j) q_t·k_j (j <= t).

Chunked form (Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule"): the same
identity inside each chunk of C tokens, relative to the chunk's start state S (G restarted at the
chunk start, so every exponent is <= 0 and nothing overflows):

    (I + A_kk) U = beta V - (beta exp(G) K) S,   A_kk[i,j] = beta_i exp(G_i - G_j) k_i·k_j  (j < i)
    =>  U = U0 - W S,   U0 = T (beta V),   W = T (beta exp(G) K),   T = (I + A_kk)^{-1}  (UT transform)
    O = scale (exp(G) Q S + (Q Kᵀ ⊙ Gamma) U),   S' = exp(G_C) S + (exp(G_C - G) K)ᵀ U.

T is formed for all chunks at once (recursive block inversion, ``unit_lower_inverse``); only the
C x K by K x V products that carry S run sequentially (T / C steps). Gradients come from autograd: it keeps one
[K, V] state per chunk and O(T C) intra-chunk matrices, never O(T^2). The chunked form reorders the
sums and factors exp(G_i - G_j) through chunk boundaries, so it equals the recurrence up to rounding
(float64: ~1e-15 relative).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from tokenmix.core.errors import InputError
from tokenmix.core.threads import one_thread
from tokenmix.ops.chunk_boundaries import check_doc_starts, chunk_boundaries


def time_chunks(x: Tensor, n: int, c: int) -> Tensor:
    """[B, T, H, ...] -> [B, H, N, C, ...], zero-padded at the end of time to N C tokens (padding
    tokens are inert when their write strength and log decay are 0). Contiguous: one copy here, not
    one per matmul that reads the chunks (forward and backward)."""
    b, t, h = x.shape[:3]
    if n * c > t:
        x = torch.cat([x, x.new_zeros(b, n * c - t, *x.shape[2:])], 1)
    return x.reshape(b, n, c, h, *x.shape[3:]).movedim(3, 1).contiguous()


def unit_lower_inverse(m: Tensor) -> Tensor:
    """Inverse of unit lower-triangular matrices m [..., C, C] by recursive 2 x 2 blocking.

    inv([[M11, 0], [M21, M22]]) = [[X11, 0], [-X22 M21 X11, X22]], X = inverse of the diagonal
    blocks, doubling the block size from 1 to C (padded to a power of two with identity): log2 C
    rounds of batched matmuls. Same numerics as blocked forward substitution; an explicit T (as in
    fla's kernels) keeps the chunked form to plain matmuls. On the project CPUs it matches batched
    ``solve_triangular`` at 1 thread and was several times faster at 2 threads under load.
    """
    c = m.shape[-1]
    p2 = 1 << (c - 1).bit_length()
    lead = m.shape[:-2]
    if p2 != c:
        m = torch.cat([m, m.new_zeros(*lead, p2 - c, c)], -2)
        m = torch.cat([m, torch.eye(p2, dtype=m.dtype, device=m.device)[:, c:].expand(*lead, p2, p2 - c)], -1)
    inv = m.new_ones(*lead, p2, 1, 1)  # inverses of the 1 x 1 diagonal blocks
    s = 1
    while s < p2:
        nb = p2 // (2 * s)
        diag = torch.diagonal(m.reshape(*lead, nb, 2 * s, nb, 2 * s), dim1=-4, dim2=-2).movedim(-1, -3)
        pair = inv.reshape(*lead, nb, 2, s, s)
        x11, x22 = pair[..., 0, :, :], pair[..., 1, :, :]
        x21 = -(x22 @ diag[..., s:, :s] @ x11)  # [..., nb, s, s]
        inv = torch.cat([torch.cat([x11, torch.zeros_like(x11)], -1), torch.cat([x21, x22], -1)], -2)
        s *= 2
    return inv.reshape(*lead, p2, p2)[..., :c, :c]


def chunk_state_recurrence(
    u0: Tensor, w: Tensor, k_state: Tensor, chunk_decay: Tensor | None, initial_state: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """The only sequential part of a chunked delta rule: T / C steps over the chunks.

    Per chunk i, from the state S_i it starts with: pseudo-values u_i = u0_i - W_i S_i, then
    S_{i+1} = d_i ⊙ S_i + K_iᵀ u_i (K_i decayed to the chunk end, d_i the chunk's decay; None = 1).

    Args:
        u0, w: [B, H, N, C, V], [B, H, N, C, K] (the UT transform applied to the values and keys).
        k_state: [B, H, N, C, K]; chunk_decay: broadcastable to [B, H, N, K, V] per chunk, or None.
        initial_state: [B, H, K, V] or None (zeros).
    Returns:
        (u [B, H, N, C, V], starts [B, H, N, K, V] the state each chunk starts from, final S [B, H, K, V]).
    """
    b, h, n, c, dv = u0.shape
    dk = w.shape[-1]
    s = u0.new_zeros(b, h, dk, dv) if initial_state is None else initial_state
    if s.shape != (b, h, dk, dv):
        raise InputError(f"initial_state must be [B, H, K, V] = {(b, h, dk, dv)}, got {tuple(s.shape)}")

    def steps(x: Tensor) -> Tensor:  # [B, H, N, ...] -> [N, B H, ...] (a view: chunk i is x[i])
        return x.reshape(b * h, n, *x.shape[3:]).transpose(0, 1)

    decay = None if chunk_decay is None else steps(chunk_decay.expand(b, h, n, *chunk_decay.shape[3:]))
    u, starts, s = _ChunkRecurrence.apply(steps(u0), steps(w), steps(k_state).mT, decay, s.reshape(b * h, dk, dv))
    back = lambda x: x.transpose(0, 1).reshape(b, h, n, *x.shape[2:])  # noqa: E731
    return back(u), back(starts), s.view(b, h, dk, dv)


class _ChunkRecurrence(torch.autograd.Function):
    """``chunk_state_recurrence`` on [N, R = B H, ...] blocks with a hand-written backward.

    Forward, per chunk i:  u_i = u0_i - W_i S_i,  S_{i+1} = d_i ⊙ S_i + Kᵀ_i u_i   (two baddbmm; every
    S_i written once into the returned ``starts``). Backward, with dS_{i+1} the gradient reaching
    S_{i+1} (dS_N from the final state), in reverse:

        du_i = dU_i + K_i dS_{i+1},     dS_i = dStarts_i + d_i ⊙ dS_{i+1} - W_iᵀ du_i,

    two baddbmm and one addcmul per chunk, the only sequential part; then, for all chunks at once,
    du0 = du,  dW = -du Sᵀ,  dKᵀ = dS_{+1} uᵀ,  dd = sum(dS_{+1} ⊙ S) (to d's shape),  dS_0.
    Autograd through the plain loop ran ~10 operator nodes per chunk backward, each with its own
    dispatch and temporaries. The loops run on one thread (``one_thread``): their [R, C, K] x [K, V]
    products are ~1 MFLOP, where waking a second OpenMP thread costs more than it saves
    (docs/notes/design-measurements.md); the batched products after the loop keep every thread.
    Checked against autograd through the plain loop (``chunk_state_recurrence_reference``) in float64,
    forward and gradients.
    """

    @staticmethod
    def forward(ctx, u0: Tensor, w: Tensor, kt: Tensor, decay: Tensor | None, s0: Tensor):
        n, r = u0.shape[:2]
        u = u0.new_empty(r, n, *u0.shape[2:]).transpose(0, 1)  # [N, R, C, V], stored as [R, N, C, V]
        starts = u0.new_empty(r, n, *s0.shape[1:]).transpose(0, 1)  # [N, R, K, V], likewise
        starts[0] = s0
        s = starts[0]
        with one_thread():
            for i in range(n):
                # each product into a fresh contiguous result, copied into its slot after: torch's CPU
                # baddbmm takes the batched path only for a contiguous output, and the slots of the
                # [R, N] storage are not (it then loops over R with one small addmm each, which at
                # short lengths and B x H = 128 cost more than the products themselves)
                u_i = torch.baddbmm(u0[i], w[i], s, alpha=-1)  # u0 - W S
                u[i] = u_i
                carried = s if decay is None else decay[i] * s
                s = torch.baddbmm(carried, kt[i], u_i)
                if i + 1 < n:
                    starts[i + 1] = s
        ctx.save_for_backward(u, starts, w, kt, decay)
        return u, starts, s

    @staticmethod
    @once_differentiable
    def backward(ctx, du: Tensor | None, dstarts: Tensor | None, ds: Tensor | None):
        u, starts, w, kt, decay = ctx.saved_tensors
        n = u.shape[0]
        du = torch.zeros_like(u) if du is None else du
        dstarts = torch.zeros_like(starts) if dstarts is None else dstarts
        ds_next = torch.empty_like(starts)  # dS_{i+1} for every chunk i
        ds_next[n - 1] = 0.0 if ds is None else ds
        du_tot = torch.empty_like(u)
        with one_thread():
            ds_i = ds_next[n - 1]
            for i in range(n - 1, -1, -1):  # contiguous results copied into their slots (see forward)
                du_i = torch.baddbmm(du[i], kt[i].mT, ds_i)  # dU_i + K_i dS_{i+1}
                du_tot[i] = du_i
                carried = dstarts[i] + ds_i if decay is None else torch.addcmul(dstarts[i], decay[i], ds_i)
                ds_i = torch.baddbmm(carried, w[i].mT, du_i, alpha=-1)
                if i:
                    ds_next[i - 1] = ds_i
            ds0 = ds_i
        # batched over all chunks in the [R, N] storage order (contiguous: no copy before the bmm)
        rn = lambda x: x.transpose(0, 1)  # noqa: E731
        dw = rn(-(rn(du_tot) @ rn(starts).mT))  # [N, R, C, K]
        dkt = rn(rn(ds_next) @ rn(u).mT)  # [N, R, K, C]
        dd = None if decay is None else (ds_next * starts).sum_to_size(decay.shape)
        return du_tot, dw, dkt, dd, ds0


def chunk_state_recurrence_reference(
    u0: Tensor, w: Tensor, k_state: Tensor, chunk_decay: Tensor | None, initial_state: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """The plain loop of ``chunk_state_recurrence`` (same arguments and returns), differentiated by autograd."""
    b, h, n, _, dv = u0.shape
    s = u0.new_zeros(b, h, w.shape[-1], dv) if initial_state is None else initial_state
    starts, us = [], []
    for i in range(n):
        starts.append(s)
        us.append(u0[:, :, i] - w[:, :, i] @ s)
        s = (s if chunk_decay is None else chunk_decay[:, :, i] * s) + k_state[:, :, i].transpose(-1, -2) @ us[-1]
    return torch.stack(us, 2), torch.stack(starts, 2), s


def chunked_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    chunk_size: int = 64,
    read_every: int = 1,
    doc_starts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(Gated) delta rule, chunkwise.

    Packed rows (``doc_starts``): the state resets at every document boundary, as if each document
    ran alone (the first of a row from ``initial_state``, the others from zero). Inside a chunk the
    decays between tokens of different documents are zero, in the readout Q Kᵀ and in the UT
    transform's strictly lower matrix alike (so T is block-diagonal over the chunk's documents); a
    document that begins inside the chunk neither reads nor erases the state entering it (its rows of
    W and of the state readout are zero); the state leaving a chunk with a boundary holds the writes
    of the chunk's last document alone (ops/chunk_boundaries.py: 0 / 1 masks of O(T C)).

    Args:
        q, k: [B, T, H, K] queries and keys (the caller L2-normalises k; the rule assumes |k| <= 1
            for beta in (0, 2) to keep I - beta k kᵀ a contraction).
        v: [B, T, H, V] values.
        beta: [B, T, H] write strengths.
        g: [B, T, H] log decays (<= 0), or None for no decay.
        scale: readout scale; None means K^-1/2.
        initial_state: [B, H, K, V] or None (zeros).
        chunk_size: C (rounded down to a multiple of ``read_every``).
        read_every: r; only positions r - 1, 2r - 1, ... are read out (T must be a multiple of r):
            DeltaProduct's sub-step clock, where only a token's last sub-step has an output row.
            The other rows of q are ignored and their read-out is never formed.
        doc_starts: [B, T] long on the op's clock (``Packing.starts``; sub-steps included), or None
            for one document per row.
    Returns:
        o: [B, T / r, H, V];  final state S_T: [B, H, K, V] (of each row's last document).

    Examples:
        >>> q, k = torch.randn(1, 10, 2, 4), torch.nn.functional.normalize(torch.randn(1, 10, 2, 4), dim=-1)
        >>> o, s = chunked_delta_rule(q, k, torch.randn(1, 10, 2, 3), torch.rand(1, 10, 2), chunk_size=4)
        >>> o.shape, s.shape
        (torch.Size([1, 10, 2, 3]), torch.Size([1, 2, 4, 3]))
    """
    _check_delta_inputs(q, k, v, beta, g, chunk_size, read_every, doc_starts)
    b, t, h, dk = q.shape
    r, dv = read_every, v.shape[-1]
    scale = dk**-0.5 if scale is None else scale
    c = max(r, chunk_size - chunk_size % r)  # chunks hold whole groups of r, so the read rows sit at r-1::r in each
    n = -(-t // c)
    # Padded tokens have k = v = beta = g = 0: they neither write, erase nor decay the state.
    chunks = lambda x: time_chunks(x, n, c)  # noqa: E731  [B, T, H, ...] -> [B, H, N, C, ...]
    qc, kc, vc, bc = chunks(q), chunks(k), chunks(v), chunks(beta)  # [B,H,N,C,K|V], beta [B,H,N,C]
    causal, packed = _document_masks(doc_starts, n, c, q)
    gc = None if g is None else chunks(g).cumsum(-1)  # [B,H,N,C], G restarted at every chunk start
    gamma = _intra_chunk_decay(gc, causal, q.dtype)
    t_ut, u0, w = _ut_transform(kc, vc, bc, gc, gamma, packed)
    q_state, k_state, chunk_decay, qk = _readout_terms(qc, kc, gc, gamma, scale, r, packed)
    u, starts, s = chunk_state_recurrence(u0, w, k_state, chunk_decay, initial_state)
    o = q_state @ starts + qk @ u  # [B,H,N,C/r,V]
    o = o.movedim(1, 3).reshape(b, n * c // r, h, dv)[:, : t // r]
    return o, s


def _check_delta_inputs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None,
    chunk_size: int,
    read_every: int,
    doc_starts: Tensor | None,
) -> None:
    """The shapes ``chunked_delta_rule`` documents, or one InputError naming what is off."""
    if chunk_size <= 0:
        raise InputError(f"chunk_size must be > 0, got {chunk_size}")
    b, t, h, _ = q.shape
    if read_every <= 0 or t % read_every:
        raise InputError(f"read_every must be > 0 and divide T = {t}, got {read_every}")
    if k.shape != q.shape or v.shape[:3] != (b, t, h) or beta.shape != (b, t, h):
        raise InputError(
            f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, beta {tuple(beta.shape)}"
        )
    if g is not None and g.shape != (b, t, h):
        raise InputError(f"g must be [B, T, H] = {(b, t, h)}, got {tuple(g.shape)}")
    if doc_starts is not None:
        check_doc_starts(doc_starts, b, t)


class _PackedMasks(NamedTuple):
    """The 0 / 1 masks of packed rows (ops/chunk_boundaries.py) in the chunked layout."""

    reads: Tensor  # [B, 1, N, C]: i's document began before the chunk
    writes: Tensor  # [B, 1, N, C]: j belongs to the chunk's last document
    carry: Tensor  # [B, 1, N, 1, 1]: no document begins inside the chunk


def _document_masks(doc_starts: Tensor | None, n: int, c: int, q: Tensor) -> tuple[Tensor, _PackedMasks | None]:
    """Which j each i sees inside its chunk (causal [C, C], [B, 1, N, C, C] packed) and the packed masks."""
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    if doc_starts is None:
        return causal, None
    # packed rows: j is visible from i only inside i's document (so the UT matrix and its inverse
    # are block-diagonal over the documents of a chunk); [N, B, ...] masks -> [B, 1, N, ...]
    bounds = chunk_boundaries(doc_starts, n, c, torch.bool)
    causal = causal & bounds.same.transpose(0, 1)[:, None]  # [B, 1, N, C, C]
    reads, writes = (z.transpose(0, 1)[:, None, ..., 0].to(q.dtype) for z in (bounds.reads, bounds.writes))
    carry = bounds.carry.transpose(0, 1)[:, None, :, None, None].to(q.dtype)  # [B, 1, N, 1, 1]
    return causal, _PackedMasks(reads, writes, carry)


def _intra_chunk_decay(gc: Tensor | None, causal: Tensor, dtype: torch.dtype) -> Tensor:
    """Gamma[i, j] = exp(G_i - G_j) for the visible j <= i of a chunk, else 0: [B,H,N,C,C] (no decay:
    the causal mask itself, [C, C] or [B, 1, N, C, C] packed)."""
    if gc is None:
        return causal.to(dtype)
    # mask before exp: the upper triangle holds positive exponents that could overflow
    diff = (gc[..., :, None] - gc[..., None, :]).masked_fill(~causal, float("-inf"))
    return diff.exp()


def _ut_transform(
    kc: Tensor, vc: Tensor, bc: Tensor, gc: Tensor | None, gamma: Tensor, packed: _PackedMasks | None
) -> tuple[Tensor, Tensor, Tensor]:
    """T = (I + A_kk)^{-1} [B,H,N,C,C], U0 = T (beta V) [B,H,N,C,V], W = T (beta exp(G) K) [B,H,N,C,K]."""
    c = kc.shape[-2]
    kb = kc * bc[..., None]
    eye = torch.eye(c, dtype=kc.dtype, device=kc.device)
    a_kk = ((kb @ kc.transpose(-1, -2)) * gamma).tril(-1)  # strictly lower, [B,H,N,C,C]
    kw = kb if gc is None else kb * gc.exp()[..., None]
    if packed is not None:  # only the documents that began before the chunk read (and erase from) its entering state
        kw = kw * packed.reads[..., None]
    t_ut = unit_lower_inverse(eye + a_kk)  # the UT transform T, [B,H,N,C,C]
    return t_ut, t_ut @ (vc * bc[..., None]), t_ut @ kw


def _readout_terms(
    qc: Tensor, kc: Tensor, gc: Tensor | None, gamma: Tensor, scale: float, r: int, packed: _PackedMasks | None
) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """What the read-out rows take from the chunk's start state and its own pseudo-values.

    Returns:
        q_state [B,H,N,C/r,K] (reads the start state), k_state [B,H,N,C,K] (keys decayed to the chunk
        end), chunk_decay ([B,H,N,1,1] or None), qk [B,H,N,C/r,C] (scale Q Kᵀ ⊙ Gamma, lower incl. diagonal).
    """
    rows = slice(r - 1, None, r)  # the read-out rows of each chunk (all of them for r = 1)
    q_read = qc[..., rows, :]
    qk = (q_read @ kc.transpose(-1, -2)) * gamma[..., rows, :] * scale  # [B,H,N,C/r,C], lower incl. diagonal
    if gc is None:
        q_state, k_state, chunk_decay = q_read * scale, kc, None
    else:
        q_state = q_read * (gc[..., rows].exp() * scale)[..., None]
        g_last = gc[..., -1:]
        k_state = kc * (g_last - gc).exp()[..., None]  # decay from each token to the chunk end
        chunk_decay = g_last.exp()[..., None]  # [B,H,N,1,1]
    if packed is not None:  # packed: the masked reads, writes and carries (module docstring of chunk_boundaries)
        q_state = q_state * packed.reads[..., rows, None]
        k_state = k_state * packed.writes[..., None]
        chunk_decay = packed.carry if chunk_decay is None else chunk_decay * packed.carry
    return q_state, k_state, chunk_decay, qk


def delta_rule_step(
    state: Tensor, q_t: Tensor, k_t: Tensor, v_t: Tensor, beta_t: Tensor, g_t: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    """One token of the (gated) delta rule, the reference the chunked form is tested against.

    Args:
        state: [B, H, K, V];  q_t, k_t: [B, H, K];  v_t: [B, H, V];  beta_t: [B, H];
        g_t: [B, H] log decay or None.
    Returns:
        o_t [B, H, V], next state [B, H, K, V].
    """
    if g_t is not None:
        state = state * g_t.exp()[..., None, None]  # 1. decay
    pred = torch.einsum("bhk,bhkv->bhv", k_t, state)  # 2. what the memory returns for k_t
    u = beta_t[..., None] * (v_t - pred)  # 3. delta: move it toward v_t
    state = state + k_t[..., :, None] * u[..., None, :]  # 4. rank-1 write
    return scale * torch.einsum("bhk,bhkv->bhv", q_t, state), state  # 5. read out


def recurrent_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Token-by-token reference with the signature of ``chunked_delta_rule`` (no chunk size)."""
    b, t, h, dk = q.shape
    scale = dk**-0.5 if scale is None else scale
    s = q.new_zeros(b, h, dk, v.shape[-1]) if initial_state is None else initial_state
    outs = []
    for i in range(t):
        o_t, s = delta_rule_step(s, q[:, i], k[:, i], v[:, i], beta[:, i], None if g is None else g[:, i], scale)
        outs.append(o_t)
    return torch.stack(outs, 1), s


def delta_rule_operator(
    q: Tensor, k: Tensor, beta: Tensor, g: Tensor | None, scale: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Dense token-view matrices of the (gated) delta rule over one segment.

    Args:
        q, k: [B, T, H, K];  beta: [B, T, H];  g: [B, T, H] or None.
    Returns:
        mix_a [B, H, T, T] = diag(beta);
        mix_b [B, H, T, T], strictly lower: -beta_t exp(G_t - G_j) k_t·k_j;
        readout [B, H, T, T], lower: scale exp(G_t - G_j) q_t·k_j;
        decay [B, H, T] = exp(G_t), the weight of the initial state at t (G = cumsum of g).
    """
    b, t, h, _ = q.shape
    qh, kh, bh = q.transpose(1, 2), k.transpose(1, 2), beta.transpose(1, 2)  # [B,H,T,K], beta [B,H,T]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    if g is None:
        gamma = causal.to(q.dtype).expand(b, h, t, t)
        decay = q.new_ones(b, h, t)
    else:
        cum = g.transpose(1, 2).cumsum(-1)  # [B,H,T]
        gamma = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()
        decay = cum.exp()
    mix_a = torch.diag_embed(bh)
    mix_b = -(bh[..., None] * (kh @ kh.transpose(-1, -2)) * gamma).tril(-1)
    readout = (qh @ kh.transpose(-1, -2)) * gamma * scale
    return mix_a, mix_b, readout, decay


__all__ = ["unit_lower_inverse", "chunked_delta_rule", "recurrent_delta_rule", "delta_rule_step", "delta_rule_operator"]
