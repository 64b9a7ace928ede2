"""Log-linear Gated DeltaNet (Guo et al. 2025, "Log-Linear Attention" §3.2): the Fenwick hierarchy of
ops/chunked_log_linear.py on the gated delta rule of ops/chunked_delta.py.

Gated DeltaNet per head (state S [K, V]): S_t = alpha_t (I - beta_t k_t k_tᵀ) S_{t-1} + beta_t k_t v_tᵀ,
o_t = scale S_tᵀ q_t, alpha_t = exp(g_t). Its mixing matrix over the values (mixers/delta_rule.py)

    M = R (I - B)^{-1} A,   A = diag(beta),  B[t,j] = -beta_t exp(G_t - G_j) k_t·k_j (j < t),
                            R[t,j] = scale exp(G_t - G_j) q_t·k_j (j <= t),
    M[t,s] = scale q_tᵀ [prod_{i=s+1..t} alpha_i (I - beta_i k_i k_iᵀ)] k_s beta_s.

The log-linear version weights every entry by the level scale of its Fenwick level l(t,s) =
bit_length(t XOR s) (absolute positions):

    O = (M ⊙ M^H) V,    M^H[t,s] = lambda_t^(l(t,s)).

State view: before token t the prefix splits into the Fenwick buckets of t (ops/chunked_log_linear.py);
each bucket keeps its own S^(l) [K, V], and since the transition is linear every bucket evolves by the
same alpha_t (I - beta_t k_t k_tᵀ) (the erase acts on every bucket), the write beta_t k_t v_tᵀ enters
the sentinel level 0, o_t = scale sum_l lambda_t^(l) S^(l)ᵀ q_t, and buckets merge (add) by the lssb
rule. Summing the buckets gives Gated DeltaNet's S_t; with all lambda equal it *is* Gated DeltaNet.
State layout as log_linear's: ``levels [B, H, bit_length(n), K, V]``.

(A, B, R) form with one recurrence per level (the G axis of MixOperator), M ⊙ M^H = sum_l R_l (I - B_l)^{-1} A_l:
    level l >= 1:  B_l = B ⊙ [t >> l == s >> l]   (the delta recurrence restarted at aligned 2^l blocks),
                   A_l = diag(beta_s [bit l-1 of s = 0]),
                   R_l = diag(lambda_t^(l) [bit l-1 of t = 1]) (R ⊙ [t >> l == s >> l]);
    level 0:       B_0 = 0, A_0 = diag(beta), R_0 = diag(lambda_t^(0) scale q_t·k_t).
(Inside an aligned block the restarted recurrence gives M's entries exactly, since M[t,s] depends
only on tokens s..t; the row/column bit selections pick the pairs with l(t,s) = l.) The solve sits in
each (I - B_l)^{-1}, the hierarchy in the block masks and the lambda rows.

Chunked form (``chunked_log_linear_delta``), aligned chunks of C = 2^c tokens (front-padded with
start mod C inert tokens: k = v = beta = g = 0, the identity transition):
  1. inside a chunk, the chunkwise UT transform of ops/chunked_delta.py: M_chunk = (Q Kᵀ ⊙ Gamma)·scale
     · T · diag(beta), weighted by the fixed C x C level table (levels 0..c), all chunks at once;
  2. across chunks, a chunk-granular Fenwick recurrence: the bucket states at the chunk start p are
     read by token t through the chunk's transition (q_eff = scale exp(G) Q - (Q Kᵀ ⊙ Gamma)·scale W)
     at level max(l, bit_length(t XOR p)), then every bucket goes through the chunk transition
     S <- exp(G_C) S - K_endᵀ (W S), the chunk's own state K_endᵀ U0 enters its level and the buckets
     merge. Only the live buckets (the set bits of p, at most log2(T / C) + 1 once p is aligned)
     are read and carried: O(T log(T / C) · K V) in all, T / C sequential steps of batched matmuls (like
     chunked_delta's carry), every exponent <= 0.
``recurrent_log_linear_delta`` (token by token) and ``log_linear_delta_operator`` (the G-axis (A, B, R)
above) are the references.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from tokenmix.core.operator import MixOperator, solve_unit_lower
from tokenmix.ops.chunked_delta import delta_rule_operator, unit_lower_inverse
from tokenmix.ops.chunked_log_linear import check_log_linear_inputs
from tokenmix.ops.fenwick_levels import (
    AlignedChunks,
    bit_length,
    causal_chunk_decay,
    initial_level_map,
    n_levels,
    read_and_merge,
    run_steps,
)


# ---------------------------------------------------------------- token-by-token reference
def log_linear_delta_step(
    levels: Tensor,
    position: int,
    q_t: Tensor,
    k_t: Tensor,
    v_t: Tensor,
    beta_t: Tensor,
    g_t: Tensor,
    lam_t: Tensor,
    scale: float,
) -> tuple[Tensor, Tensor]:
    """One decode step on the Fenwick states.

    Args:
        levels: [B, H, bit_length(position), K, V] (slot l-1 = bucket l of ``position``);
        q_t, k_t: [B, H, K];  v_t: [B, H, V];  beta_t, g_t: [B, H];  lam_t: [B, H, L], L > bit_length(t).
    Returns:
        o_t [B, H, V];  levels of position t + 1, [B, H, bit_length(t + 1), K, V].
    """
    levels = levels * g_t.exp()[..., None, None, None]  # 1. decay every bucket
    pred = torch.einsum("bhk,bhlkv->bhlv", k_t, levels)  # 2. erase k_t from each
    levels = levels - k_t[:, :, None, :, None] * (beta_t[..., None, None] * pred)[..., None, :]
    sentinel = (beta_t[..., None] * k_t)[..., :, None] * v_t[..., None, :]  # 3. write, level 0 = {t}
    buckets = torch.cat([sentinel[:, :, None], levels], 2)
    return read_and_merge(buckets, position, q_t, lam_t, scale)  # 4. read each level, 5. merge for t + 1


def recurrent_log_linear_delta(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor,
    level_scales: Tensor,
    scale: float,
    initial_levels: Tensor | None = None,
    start: int = 0,
) -> tuple[Tensor, Tensor]:
    """Token-by-token reference with the signature of ``chunked_log_linear_delta`` (no chunk size)."""
    check_log_linear_inputs(q, k, v, g, level_scales, start, initial_levels, beta)
    return run_steps(log_linear_delta_step, (q, k, v, beta, g, level_scales), scale, initial_levels, start)


# ---------------------------------------------------------------- dense (A, B, R) reference
def log_linear_delta_operator(
    q: Tensor, k: Tensor, beta: Tensor, g: Tensor, level_scales: Tensor, scale: float, start: int = 0
) -> MixOperator:
    """The G-axis (A_l, B_l, R_l) of a segment, l = 0..bit_length(start + T - 1): [B, H, L, T, T] each.

    Args:
        q, k: [B, T, H, K];  beta, g: [B, T, H];  level_scales: [B, T, H, >= n_levels(start + T)];
        start: absolute position of the segment's first token (fixes the level map).
    """
    b, t, h, _ = q.shape
    mix_a, mix_b, readout, _ = delta_rule_operator(q, k, beta, g, scale)  # [B, H, T, T]
    n_lv = n_levels(start + t)
    pos = torch.arange(start, start + t, device=q.device)
    lam = level_scales.transpose(1, 2)[..., :n_lv]  # [B, H, T, L]
    a_s, b_s, r_s = (
        [mix_a],
        [torch.zeros_like(mix_b)],
        [torch.diag_embed(torch.diagonal(readout, 0, -2, -1) * lam[..., 0])],
    )
    for lvl in range(1, n_lv):
        block = ((pos[:, None] >> lvl) == (pos[None, :] >> lvl)).to(q.dtype)  # [T, T]
        row = ((pos >> (lvl - 1)) & 1).to(q.dtype)  # bit l-1 of t is 1
        col = 1.0 - ((pos >> (lvl - 1)) & 1).to(q.dtype)  # bit l-1 of s is 0
        a_s.append(mix_a * col)
        b_s.append(mix_b * block)
        r_s.append((lam[..., lvl] * row)[..., None] * (readout * block))
    return MixOperator(torch.stack(a_s, 2), torch.stack(b_s, 2), torch.stack(r_s, 2))


def initial_levels_readout(
    q: Tensor,
    k: Tensor,
    beta: Tensor,
    g: Tensor,
    level_scales: Tensor,
    scale: float,
    start: int,
    initial_levels: Tensor,
) -> Tensor:
    """What the Fenwick states before ``start`` add to each output of the segment, [B, T, H, V], dense.

    Bucket l' goes through the segment's transitions (the delta rule with zero values started from
    S^(l'), a known right-hand side of the G = 1 solve) and reaches token t at level
    max(l', bit_length(t XOR start)).
    """
    b, t, h, dk = q.shape
    l0, dv = initial_levels.shape[2], initial_levels.shape[-1]
    mix_a, mix_b, readout, decay = delta_rule_operator(q, k, beta, g, scale)
    s0 = initial_levels.permute(0, 1, 3, 2, 4).reshape(b, h, dk, l0 * dv)  # levels side by side along V
    kh = k.transpose(1, 2)
    rhs = -(beta.transpose(1, 2) * decay)[..., None] * (kh @ s0)  # [B, H, T, L0*V]
    u = solve_unit_lower(mix_b, rhs)
    read = readout @ u + scale * decay[..., None] * (q.transpose(1, 2) @ s0)  # [B, H, T, L0*V]
    read = read.reshape(b, h, t, l0, dv)
    lvl = initial_level_map(start, t, l0, q.device)  # [T, L0]
    w = level_scales.transpose(1, 2).gather(-1, lvl.expand(b, h, t, l0))  # [B, H, T, L0]
    return torch.einsum("bhtl,bhtlv->bthv", w, read)


def final_levels(k: Tensor, v: Tensor, beta: Tensor, g: Tensor, start: int, initial_levels: Tensor | None) -> Tensor:
    """Canonical Fenwick state after the segment, [B, H, bit_length(start + T), K, V], dense.

    Bucket l of n = start + T gathers the writes of its block of positions, carried to the end through
    the transitions of every later token: one masked delta-rule solve per level; an initial bucket goes
    through all the segment's transitions and lands in level max(l', bit_length(n XOR start)).
    """
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    n = start + t
    h_n = (n ^ start).bit_length()
    q0 = torch.zeros_like(k)
    _, mix_b, _, decay = delta_rule_operator(q0, k, beta, g, 1.0)
    cum = g.transpose(1, 2).cumsum(-1)  # [B, H, T]
    k_end = k.transpose(1, 2) * (cum[..., -1:] - cum).exp()[..., None]  # [B, H, T, K]
    pos = torch.arange(start, n, device=k.device)
    own_lvl = bit_length(pos ^ n, n.bit_length())  # the bucket of n that holds position s
    n_lv = n.bit_length()
    sel = (own_lvl[None, :] == torch.arange(1, n_lv + 1, device=k.device)[:, None]).to(k.dtype)  # [L, T]
    rhs = (beta.transpose(1, 2)[:, :, None, :] * sel)[..., None] * v.transpose(1, 2)[:, :, None]  # [B,H,L,T,V]
    u = solve_unit_lower(mix_b[:, :, None], rhs)
    levels = torch.einsum("bhtk,bhltv->bhlkv", k_end, u)
    if initial_levels is not None and initial_levels.shape[2]:
        l0 = initial_levels.shape[2]
        s0 = initial_levels.permute(0, 1, 3, 2, 4).reshape(b, h, dk, l0 * dv)
        kh = k.transpose(1, 2)
        u0 = solve_unit_lower(mix_b, -(beta.transpose(1, 2) * decay)[..., None] * (kh @ s0))
        carried = decay[..., -1, None, None] * s0 + k_end.transpose(-1, -2) @ u0  # [B, H, K, L0*V]
        carried = carried.reshape(b, h, dk, l0, dv).permute(0, 1, 3, 2, 4)  # [B, H, L0, K, V]
        dest = torch.clamp(torch.arange(1, l0 + 1, device=k.device), min=h_n) - 1  # slot of each initial bucket
        onto = (dest[:, None] == torch.arange(n_lv, device=k.device)[None, :]).to(k.dtype)  # [L0, L]
        levels = levels + torch.einsum("ml,bhmkv->bhlkv", onto, carried)
    return levels


# ---------------------------------------------------------------- chunked fast path
def chunked_log_linear_delta(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor,
    level_scales: Tensor,
    scale: float,
    initial_levels: Tensor | None = None,
    start: int = 0,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Log-linear Gated DeltaNet, chunkwise, O(T log T).

    Args:
        q, k: [B, T, H, K] (the caller L2-normalises k);  v: [B, T, H, V];  beta, g: [B, T, H];
        level_scales: [B, T, H, L] with L >= n_levels(start + T);  scale: readout scale;
        initial_levels: [B, H, bit_length(start), K, V] (None if start = 0);
        start: absolute position of the first token;  chunk_size: C, a power of two.
    Returns:
        o [B, T, H, V];  final levels [B, H, bit_length(start + T), K, V].

    Examples:
        >>> q, v = torch.randn(2, 1, 12, 2, 4).unbind(0)
        >>> k = torch.nn.functional.normalize(torch.randn(1, 12, 2, 4), dim=-1)
        >>> o, lv = chunked_log_linear_delta(q, k, v, torch.rand(1, 12, 2), -torch.rand(1, 12, 2),
        ...                                  torch.rand(1, 12, 2, 5), 0.5, chunk_size=4)
        >>> o.shape, lv.shape
        (torch.Size([1, 12, 2, 4]), torch.Size([1, 2, 4, 4, 4]))
    """
    check_log_linear_inputs(q, k, v, g, level_scales, start, initial_levels, beta)
    chunks = AlignedChunks(start, q.shape[1], chunk_size)
    b, t, h, dk = q.shape
    dv, end = v.shape[-1], start + q.shape[1]

    qc, kc, vc = chunks.split(q), chunks.split(k), chunks.split(v)
    bc, lam = chunks.split(beta), chunks.split(level_scales)
    gc = chunks.split(g).cumsum(-1)  # [B, H, N, C], restarted at each chunk start
    parts = _chunk_parts(qc, kc, vc, bc, gc, scale)

    # 1. levels 0..c inside each chunk: M_chunk = qk T diag(beta) weighted by the level table
    lam_in = chunks.level_scales_inside(lam)
    o = (((parts.qk @ parts.t_ut) * bc[..., None, :]) * lam_in) @ vc  # [B, H, N, C, V]

    # 2. chunk-granular Fenwick recurrence over the bucket states [B, H, L, K, V]
    reads, levels = _fenwick_chunk_recurrence(parts, vc, bc, lam, start, end, initial_levels)
    zero = q.new_zeros(b, h, dk, dv)
    levels = torch.stack([zero if st is None else st for st in levels], 2) if levels else q.new_zeros(b, h, 0, dk, dv)
    return chunks.join(o + reads), levels


class _ChunkParts(NamedTuple):
    """A chunk's own pieces of the gated delta rule (the UT transform of ops/chunked_delta.py), all chunks at once."""

    t_ut: Tensor  # [B, H, N, C, C] the UT transform T
    w: Tensor  # [B, H, N, C, K] T (beta exp(G) K)
    u0: Tensor  # [B, H, N, C, V] T (beta V)
    qk: Tensor  # [B, H, N, C, C] (Q Kᵀ ⊙ Gamma)·scale, lower incl. the diagonal
    q_eff: Tensor  # [B, H, N, C, K] reads a chunk-start state: q_eff S
    k_end: Tensor  # [B, H, N, C, K] each token's key decayed to the chunk end
    own: Tensor  # [B, H, N, K, V] the chunk's own writes
    decay: Tensor  # [B, H, N, 1, 1, 1] the chunk's decay exp(G_C)


def _chunk_parts(qc: Tensor, kc: Tensor, vc: Tensor, bc: Tensor, gc: Tensor, scale: float) -> _ChunkParts:
    """The pieces of every chunk from its queries, keys, values [B, H, N, C, K|V], beta and G [B, H, N, C]."""
    c = kc.shape[-2]
    gamma = causal_chunk_decay(gc)
    kb = kc * bc[..., None]
    eye = torch.eye(c, dtype=qc.dtype, device=qc.device)
    t_ut = unit_lower_inverse(eye + ((kb @ kc.transpose(-1, -2)) * gamma).tril(-1))  # UT transform
    w = t_ut @ (kb * gc.exp()[..., None])  # [B, H, N, C, K]
    u0 = t_ut @ (vc * bc[..., None])  # [B, H, N, C, V]
    qk = (qc @ kc.transpose(-1, -2)) * gamma * scale  # lower incl. the diagonal
    q_eff = qc * (gc.exp() * scale)[..., None] - qk @ w  # reads a chunk-start state: q_eff S
    g_last = gc[..., -1]
    k_end = kc * (g_last[..., None] - gc).exp()[..., None]  # decay of each token to the chunk end
    own = k_end.transpose(-1, -2) @ u0  # [B, H, N, K, V] chunk's own writes
    decay = g_last.exp()[..., None, None, None]  # [B, H, N, 1, 1, 1]
    return _ChunkParts(t_ut, w, u0, qk, q_eff, k_end, own, decay)


def _fenwick_chunk_recurrence(
    parts: _ChunkParts, vc: Tensor, bc: Tensor, lam: Tensor, start: int, end: int, initial_levels: Tensor | None
) -> tuple[Tensor, list[Tensor | None]]:
    """Step 2 of the chunked form: each chunk reads the live buckets at its start p, carries them
    through its transition, and its writes join the buckets of its end p2 (T / C sequential steps).

    Returns:
        the reads [B, H, N, C, V];  the buckets after the segment, bit_length(end) slots (None = empty).
    """
    b, h, n_chunks, c, dv = vc.shape
    n_slots, j0 = end.bit_length(), start // c
    tok, w_read = _level_read_weights(lam, start, n_slots, j0)

    # The buckets as a list of slots, None while a bucket is empty: at a chunk boundary p only the
    # buckets of p's set bits hold anything (about half of the log2(T / C) chunk levels, none of the
    # levels <= c once p is aligned), so reading and transforming only the live ones does a quarter of
    # the work of all bit_length(T) slots at 8k, exactly (an empty bucket stays empty and reads 0).
    levels: list[Tensor | None] = [None] * n_slots
    if initial_levels is not None:
        levels[: initial_levels.shape[2]] = list(initial_levels.unbind(2))
    reads = []
    pieces = zip(
        parts.q_eff.unbind(2),
        parts.w.unbind(2),
        parts.k_end.transpose(-1, -2).unbind(2),
        parts.own.unbind(2),
        parts.decay.unbind(2),
        w_read.unbind(2),
    )
    for i, (q_i, w_i, kt_i, own_i, d_i, wr_i) in enumerate(pieces):
        p = max(start, (j0 + i) * c)
        p2 = min(end, (j0 + i + 1) * c)
        live = [lvl for lvl, st in enumerate(levels) if st is not None]
        if live:
            stacked = torch.stack([levels[lvl] for lvl in live], 2)  # [B, H, L_live, K, V]
            # token t reads sum_l lambda_t^(l) q_eff_t S_l: one [C, L_live K] x [L_live K, V] matmul
            weighted = wr_i[..., live, None] * q_i[:, :, :, None, :]  # [B, H, C, L_live, K]
            reads.append(weighted.flatten(-2) @ stacked.flatten(2, 3))
            stacked = d_i * stacked - kt_i[:, :, None] @ (w_i[:, :, None] @ stacked)  # the chunk's transition
            for lvl, st in zip(live, stacked.unbind(2)):
                levels[lvl] = st
        else:
            reads.append(q_i.new_zeros(b, h, c, dv))
        top = (p2 ^ p).bit_length()  # levels <= top of p have merged into top at p2
        low = ((p2 - 1) ^ p2).bit_length()  # the lowest bucket of p2 the chunk writes to
        adds = {top: own_i} if top == low else _partial_chunk_writes(parts, vc, bc, i, tok[i], p, p2, q_i.dtype)
        parts_top = [st for st in levels[:top] if st is not None] + ([adds.pop(top)] if top in adds else [])
        merged = None if not parts_top else parts_top[0] if len(parts_top) == 1 else torch.stack(parts_top, 0).sum(0)
        levels = [adds.get(lvl) for lvl in range(1, top)] + [merged] + levels[top:]
    return torch.stack(reads, 2), levels


def _level_read_weights(lam: Tensor, start: int, n_slots: int, j0: int) -> tuple[Tensor, Tensor]:
    """Absolute positions of the chunks' tokens tok [N, C] and the scale w_read [B, H, N, C, L] with which
    token t reads bucket l of its chunk's start p: lambda_t at level max(l, bit_length(t XOR p))."""
    b, h, n_chunks, c, n_lam = lam.shape
    device = lam.device
    chunk_start = (j0 + torch.arange(n_chunks, device=device)) * c  # [N]
    piece_start = chunk_start.clamp(min=start)  # p of each chunk
    tok = chunk_start[:, None] + torch.arange(c, device=device)[None, :]  # [N, C] absolute
    reach = bit_length(tok ^ piece_start[:, None], ((j0 + n_chunks) * c - 1).bit_length())  # [N, C]
    read_lvl = torch.maximum(torch.arange(1, n_slots + 1, device=device)[None, None, :], reach[..., None])
    w_read = lam.gather(-1, read_lvl.clamp(max=n_lam - 1).expand(b, h, n_chunks, c, n_slots))  # [B,H,N,C,L]
    return tok, w_read


def _partial_chunk_writes(
    parts: _ChunkParts, vc: Tensor, bc: Tensor, i: int, rel: Tensor, p: int, p2: int, dtype: torch.dtype
) -> dict[int, Tensor]:
    """The writes of chunk i, a last, partial piece p..p2 whose tokens land in several buckets of p2,
    split by bucket: {level: [B, H, K, V]}.

    ``rel`` [C]: the absolute positions of the chunk's tokens (a device tensor). Which buckets the
    piece writes follows from the host ints p and p2 alone, so an empty one is skipped without
    reading the device."""
    low, top = ((p2 - 1) ^ p2).bit_length(), (p2 ^ p).bit_length()
    kt_i = parts.k_end[:, :, i].transpose(-1, -2)
    c = rel.shape[0]
    lv = bit_length(rel ^ p2, ((p // c + 1) * c).bit_length())  # rel < the chunk's end, p2 <= it
    written = {(s ^ p2).bit_length() for s in range(p, p2)}  # at most C host ints
    adds = {}
    for lvl in range(low, top + 1):
        if lvl in written:
            sel = ((lv == lvl) & (rel >= p) & (rel < p2)).to(dtype)
            u_l = parts.t_ut[:, :, i] @ (vc[:, :, i] * (bc[:, :, i] * sel)[..., None])
            adds[lvl] = kt_i @ u_l
    return adds


__all__ = [
    "chunked_log_linear_delta",
    "recurrent_log_linear_delta",
    "log_linear_delta_step",
    "log_linear_delta_operator",
    "initial_levels_readout",
    "final_levels",
]
