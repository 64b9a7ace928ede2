"""Log-linear attention over Mamba-2 (Guo et al. 2025): level-wise chunked fast path and references.

Per head, with log decays g_t <= 0 (G = cumsum g) and per-level scales lambda_t^(l) >= 0:

    o_t = scale · sum_{s <= t} lambda_t^(l(t,s)) exp(G_t - G_s) (q_t·k_s) v_s,
    l(t, s) = bit_length(t XOR s)  (0 for s = t; tokenmix.patterns.fenwick_level),

positions absolute (a segment starting at ``start`` keeps the level map of the whole sequence).
Token view: O = (Q Kᵀ ⊙ M^S ⊙ M^H) V · scale, one lower-triangular A and B = 0.

State view (decode, ``log_linear_step``): before token t the prefix [0, t) splits into the Fenwick
buckets {s : l(t, s) = l}, l = 1..bit_length(t); bucket l is the aligned block of 2^(l-1) positions
selected by set bit l-1 of t. Each bucket keeps S^(l) = sum_s exp(G_{t-1} - G_s) k_s v_sᵀ [K, V].
Token t decays every bucket, adds the sentinel S^(0) = k_t v_tᵀ, reads
o_t = scale sum_l lambda_t^(l) q_tᵀ S^(l), then merges levels 0..lssb(t+1) into level lssb(t+1)+1
(the buckets of t+1; §6.1's update). Canonical state layout (every mode returns it):
``levels [B, H, bit_length(n), K, V]``, slot l-1 = bucket l of position n (zeros where bit l-1 of n
is 0), decayed through token n-1. Its size grows like log2 n.

Chunked form (``chunked_log_linear_attention``), chunks of C = 2^c tokens aligned to absolute
positions (the segment is front-padded with start mod C inert tokens):
  1. levels 0..c never leave an aligned chunk: one dense C x C block per chunk, weighted by
     lambda_t^(l(t,s)) with a fixed C x C level table;
  2. level c+m (m >= 1) of a token in chunk j is the aligned block of 2^(m-1) chunks left of j's
     half at chunk-level m (bit m-1 of j set): one tree pass builds every block state from the
     chunk states (pairs merged with their decays), and each chunk reads its level-m block decayed
     to its start. Each level is an O(T K V) scaled semiseparable pass; log2(T / C) of them give
     O(T log T), and every exponent is a difference G_i - G_j <= 0 (no overflow);
  3. the Fenwick states of an initial state (positions < start) reach token t at level
     max(l, bit_length(t XOR start)): the levels <= that one have merged by then.
Everything is tensor algebra over all chunks at once (a Python loop only over the log2(T / C)
levels), differentiated by autograd in O(T (C + K log T)) memory. The level map, the aligned chunks
and the step's read-and-merge are ops/fenwick_levels.py's, shared with ops/chunked_log_linear_delta.py.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.ops.fenwick_levels import (
    AlignedChunks,
    causal_chunk_decay,
    fenwick_level_matrix,
    initial_level_map,
    n_levels,
    read_and_merge,
    run_steps,
)


def check_log_linear_inputs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    level_scales: Tensor,
    start: int,
    initial_levels: Tensor | None,
    beta: Tensor | None = None,
) -> None:
    """Shapes of a log-linear op's inputs (``beta`` [B, T, H]: the delta rule's, when it has one)."""
    b, t, h, dk = q.shape
    if beta is not None and beta.shape != q.shape[:3]:
        raise InputError(f"shape mismatch: q {tuple(q.shape)}, beta {tuple(beta.shape)}")
    if k.shape != q.shape or v.shape[:3] != (b, t, h) or g.shape != (b, t, h) or level_scales.shape[:3] != (b, t, h):
        raise InputError(
            f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
            f"g {tuple(g.shape)}, level_scales {tuple(level_scales.shape)}"
        )
    if start < 0:
        raise InputError(f"start must be >= 0, got {start}")
    need = n_levels(start + t)
    if level_scales.shape[-1] < need:
        raise InputError(
            f"level_scales has {level_scales.shape[-1]} levels but positions up to {start + t - 1} need {need}"
        )
    want = (b, h, start.bit_length(), dk, v.shape[-1])
    if start > 0 and (initial_levels is None or tuple(initial_levels.shape) != want):
        got = None if initial_levels is None else tuple(initial_levels.shape)
        raise InputError(f"a segment starting at {start} needs initial_levels of shape {want}, got {got}")


def log_linear_operator(q: Tensor, k: Tensor, g: Tensor, level_scales: Tensor, scale: float, start: int = 0) -> Tensor:
    """Dense token-view matrix A = scale (Q Kᵀ ⊙ M^S ⊙ M^H) of a segment, [B, H, T, T].

    Args:
        q, k: [B, T, H, K];  g: [B, T, H] log decays;  level_scales: [B, T, H, L];
        start: absolute position of the segment's first token (fixes the level map).
    """
    b, t, h, _ = q.shape
    lvl = fenwick_level_matrix(start, t, q.device)
    causal = lvl >= 0
    lam = level_scales.transpose(1, 2)  # [B,H,T,L]
    lam_ts = lam.gather(-1, lvl.clamp(min=0).expand(b, h, t, t))  # lambda_t^(l(t,s))
    cum = g.transpose(1, 2).cumsum(-1)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # M^S
    qk = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)
    return qk * decay * lam_ts * scale


def initial_levels_readout(
    q: Tensor, g: Tensor, level_scales: Tensor, scale: float, start: int, initial_levels: Tensor
) -> Tensor:
    """What the Fenwick states of positions < start add to each output of the segment, [B, T, H, V].

    Initial level l reaches token t at level max(l, bit_length(t XOR start)), decayed by exp(G_t).
    """
    b, t, h, _ = q.shape
    l0 = initial_levels.shape[2]
    lvl = initial_level_map(start, t, l0, q.device)  # [T, L0]
    w = level_scales.gather(-1, lvl[None, :, None, :].expand(b, t, h, l0))  # [B,T,H,L0]
    w = w * (g.cumsum(1).exp() * scale)[..., None]
    return torch.einsum("bthk,bthl,bhlkv->bthv", q, w, initial_levels)


def final_levels(k: Tensor, v: Tensor, g: Tensor, start: int, initial_levels: Tensor | None) -> Tensor:
    """Canonical Fenwick state after the segment, [B, H, bit_length(start + T), K, V].

    Bucket l of position n = start + T is a contiguous block of positions, so each level is one
    K x V product over its slice: O(T K V) in all.
    """
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    n = start + t
    h_n = (n ^ start).bit_length()  # initial levels <= h_n have merged into level h_n
    cum = g.cumsum(1)  # [B,T,H]
    total = cum[:, -1]  # [B,H]
    kw = k * (total[:, None] - cum).exp()[..., None]  # decay of each token to the segment end
    carried = total.exp()[..., None, None]  # [B,H,1,1]
    l0 = 0 if initial_levels is None else initial_levels.shape[2]
    levels = []
    for lvl in range(1, n.bit_length() + 1):
        s = k.new_zeros(b, h, dk, dv)
        if lvl <= h_n and (n >> (lvl - 1)) & 1:
            base = (n >> lvl) << lvl
            lo, hi = max(base, start) - start, base + (1 << (lvl - 1)) - start
            s = s + torch.einsum("bthk,bthv->bhkv", kw[:, lo:hi], v[:, lo:hi])
        if l0:
            if lvl == h_n:
                s = s + carried * initial_levels[:, :, : min(h_n, l0)].sum(2)
            elif h_n < lvl <= l0:
                s = s + carried * initial_levels[:, :, lvl - 1]
        levels.append(s)
    return torch.stack(levels, 2)


def chunked_log_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    level_scales: Tensor,
    scale: float,
    initial_levels: Tensor | None = None,
    start: int = 0,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Log-linear Mamba-2 attention, level-wise chunked, O(T log T).

    Args:
        q, k: [B, T, H, K];  v: [B, T, H, V];  g: [B, T, H] log decays (<= 0);
        level_scales: [B, T, H, L] with L >= n_levels(start + T) (lambda_t^(l), any sign works);
        scale: readout scale (fla's naive reference defaults to 1.0, not K^-1/2);
        initial_levels: [B, H, bit_length(start), K, V] Fenwick state before ``start`` (None if start = 0);
        start: absolute position of the first token;
        chunk_size: C, a power of two.
    Returns:
        o [B, T, H, V];  final levels [B, H, bit_length(start + T), K, V].

    Examples:
        >>> q, k, v = torch.randn(3, 1, 12, 2, 4).unbind(0)
        >>> o, lv = chunked_log_linear_attention(q, k, v, -torch.rand(1, 12, 2), torch.rand(1, 12, 2, 5), 0.5,
        ...                                      chunk_size=4)
        >>> o.shape, lv.shape
        (torch.Size([1, 12, 2, 4]), torch.Size([1, 2, 4, 4, 4]))
    """
    check_log_linear_inputs(q, k, v, g, level_scales, start, initial_levels)
    chunks = AlignedChunks(start, q.shape[1], chunk_size)  # the level structure is every chunk's
    b, t, h, dk = q.shape
    dv, n_lam = v.shape[-1], level_scales.shape[-1]
    c, n_chunks = chunk_size, chunks.n
    c_bits = c.bit_length() - 1

    qc, kc, vc, lam = chunks.split(q), chunks.split(k), chunks.split(v), chunks.split(level_scales)
    gc = chunks.split(g).cumsum(-1)  # [B,H,N,C], restarted at each chunk start

    # 1. levels 0..c: dense blocks inside each chunk
    decay_in = causal_chunk_decay(gc)
    lam_in = chunks.level_scales_inside(lam)
    o = ((qc @ kc.transpose(-1, -2)) * decay_in * lam_in * scale) @ vc  # [B,H,N,C,V]

    # 2. levels c+1..: chunk states, merged pairwise into aligned blocks of 2^(m-1) chunks.
    j0 = start // c
    n_coarse = ((j0 + n_chunks - 1) ^ j0).bit_length()  # chunk-levels reached inside the segment
    if n_coarse:
        g_last = gc[..., -1]  # [B,H,N] log decay across each chunk
        blocks = (kc * (g_last[..., None] - gc).exp()[..., None]).transpose(-1, -2) @ vc  # [B,H,N,K,V]
        block_decay = g_last
        cum_end = g_last.cumsum(-1)  # log decay from the segment start to each chunk end
        cum_before = torch.cat([torch.zeros_like(cum_end[..., :1]), cum_end[..., :-1]], -1)  # ... to its start
        jj = torch.arange(j0, j0 + n_chunks, device=q.device)
        first_block = j0  # absolute id of blocks[..., 0, :, :] at the current block size
        reads = []
        for m in range(1, n_coarse + 1):
            blk = jj >> (m - 1)
            src = blk - 1  # the left sibling block, which ends right where j's half starts
            valid = ((blk & 1) == 1) & (src >= first_block)
            src_local = (src - first_block).clamp(min=0)
            src_end = ((blk << (m - 1)) - 1 - j0).clamp(min=0)  # local chunk ending the source block
            gap = cum_before - cum_end[..., src_end]  # decay from the block end to chunk j's start
            weight = torch.where(valid, gap, torch.full_like(gap, float("-inf"))).exp()
            reads.append(blocks[:, :, src_local] * weight[..., None, None])
            if m < n_coarse:  # merge aligned pairs into the next block size
                if first_block % 2:
                    blocks = torch.cat([torch.zeros_like(blocks[:, :, :1]), blocks], 2)
                    block_decay = torch.cat([torch.zeros_like(block_decay[..., :1]), block_decay], -1)
                    first_block -= 1
                if blocks.shape[2] % 2:
                    blocks = torch.cat([blocks, torch.zeros_like(blocks[:, :, :1])], 2)
                    block_decay = torch.cat([block_decay, torch.zeros_like(block_decay[..., :1])], -1)
                pairs = blocks.reshape(b, h, -1, 2, dk, dv)
                pair_decay = block_decay.reshape(b, h, -1, 2)
                blocks = pair_decay[..., 1, None, None].exp() * pairs[:, :, :, 0] + pairs[:, :, :, 1]
                block_decay = pair_decay.sum(-1)
                first_block //= 2
        states = torch.stack(reads, 3).reshape(b, h, n_chunks, n_coarse * dk, dv)  # [B,H,N,M*K,V]
        lvl_out = torch.arange(c_bits + 1, c_bits + n_coarse + 1, device=q.device).clamp(max=n_lam - 1)
        lam_out = lam[..., lvl_out]  # [B,H,N,C,M]
        q_out = (qc * (gc.exp() * scale)[..., None])[..., None, :] * lam_out[..., None]  # [B,H,N,C,M,K]
        o = o + q_out.reshape(b, h, n_chunks, c, n_coarse * dk) @ states

    o = chunks.join(o)
    # 3. the Fenwick states before the segment
    if start > 0:
        o = o + initial_levels_readout(q, g, level_scales, scale, start, initial_levels)
    return o, final_levels(k, v, g, start, initial_levels)


def log_linear_step(
    levels: Tensor, position: int, q_t: Tensor, k_t: Tensor, v_t: Tensor, g_t: Tensor, lam_t: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    """One decode step on the Fenwick states (the reference of the chunked form).

    Args:
        levels: [B, H, bit_length(position), K, V], canonical layout (slot l-1 = level l).
        position: absolute index t of this token.
        q_t, k_t: [B, H, K];  v_t: [B, H, V];  g_t: [B, H];  lam_t: [B, H, L] with L > bit_length(t).
    Returns:
        o_t [B, H, V];  levels of position t + 1, [B, H, bit_length(t + 1), K, V].
    """
    levels = levels * g_t.exp()[..., None, None, None]  # 1. decay every bucket
    sentinel = k_t[..., :, None] * v_t[..., None, :]  # 2. level 0 = {t}
    buckets = torch.cat([sentinel[:, :, None], levels], 2)  # [B,H,1+n_lv,K,V], index = level
    return read_and_merge(buckets, position, q_t, lam_t, scale)  # 3. read each level, 4. merge for t + 1


def recurrent_log_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    level_scales: Tensor,
    scale: float,
    initial_levels: Tensor | None = None,
    start: int = 0,
) -> tuple[Tensor, Tensor]:
    """Token-by-token reference with the signature of ``chunked_log_linear_attention`` (no chunk size)."""
    check_log_linear_inputs(q, k, v, g, level_scales, start, initial_levels)
    return run_steps(log_linear_step, (q, k, v, g, level_scales), scale, initial_levels, start)
