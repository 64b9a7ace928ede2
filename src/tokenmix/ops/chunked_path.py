"""PaTH logits, chunked (UT/WY form, a two-level walk over blocks) and the token-by-token reference.

PaTH attention (mixers/path_attention.py) reads key j from query i through the product of the
Householder-like transforms of the tokens between them, per head:

    H_t = I - beta_t w_t w_tᵀ   (w_t unit [K], beta_t a scalar),
    s_{i,j} = scale · q_iᵀ H_i H_{i-1} ... H_{j+1} k_j        (s_{i,i} = scale · q_i·k_i),

over the P cached keys (already transformed to the last cached position, so they count as keys
j < 0 whose products stop at token 0) and the segment's T keys. The softmax, the forget gate and
the padding mask stay in the mixer: this module computes the logits s and the keys transformed to
the segment's last position (the next decode cache).

Reference (``sequential_path_scores``): apply H_t to every earlier key one token at a time
(``householder_step``), append k_t, read the row q_t·k~_j. O(T (P + T) K) with a Python step per token.

Chunked form (``ChunkedPath``). Split time into N = ceil(T / C) blocks of C tokens (the last one
padded with inert tokens: w = 0, so H = I). Inside a block, with W [C, K] its rows w_t and
beta = diag(beta_t), the block product has the UT/WY form

    P_c = H_{end} ... H_{start} = I - Wᵀ U (beta W),     U = (I + strict_lower(beta W Wᵀ))^{-1}

(one unit-triangular solve for all blocks at once; ``complement`` below is Wᵀ U beta W = I - P_c,
[B, H, N, K, K]). Its leading rows give every partial product too, so per block, in matmuls:
    in-block logits   q_iᵀ H_i ... H_{j+1} k_j = q_i·k_j - sum_{l<=i} (q_i·w_l) (U strict_lower(beta W Kᵀ))_{l,j}
                      [B, H, N, C, C], j <= i;
    queries at the block start   q_iᵀ H_i ... H_{start}          [B, H, N, C, K];
    keys at the block end        H_{end} ... H_{j+1} k_j         [B, H, N, C, K].
A query in block c then reads a key of an earlier block c' < c as
(query at the start of c)ᵀ P_{c-1} ... P_{c'+1} (key at the end of c'). Multiplying each query
block by one block product per earlier key block (fla's naive walk) costs ~N² / 2 tiny steps; two
levels bring that to O(N + (N / G)²) Python steps, with G blocks per row group (``group_blocks``:
a power of two near sqrt(N), G C <= ``GROUP_TOKENS``):
  1. group level, once for all groups at once (G batched steps): the keys brought to their group's
     end, P_{group end} ... P_{c'+1} (key at the end of c') [B, H, G C, K] per group, and the group
     products SP_s = P_{end} ... P_{start} [B, H, K, K];
  2. per row group s (``rows``, queries [G C]):
       * inside the group, a walk along the diagonals: step d = 1 .. G - 1 moves the queries of
         blocks d .. G - 1 one block back in one batched matmul ([G - d, C, K] x [G - d, K, K]) and
         reads key blocks 0 .. G - 1 - d ([G - d, C, C] logits), leaving every block's queries at
         the group start;
       * the s earlier groups (and the cache) through keys brought to the group start by the suffix
         product SP_{s-1} ... SP_{s'+1} (s steps of [G C, K] x [K, K]), then ONE matmul
         [G C, K] x [K, P + s G C] for all the group's queries.
The rows come back per block of C queries over exactly its P + j1 keys, so the caller's softmax
never touches a masked upper half of a [G C, G C] tile. ``keys`` brings every group's keys to the
segment end through the remaining group products (the cache through all of them).

Cost per token: O((P + T) K) for the logits, O(C K) for the UT form, O((G + N / G) K²) for the
transforms. The reference and the chunked form multiply the same transforms in a different order,
so they agree up to rounding (float64 ~1e-15 relative), in values and in gradients (autograd through
both; the caller may checkpoint ``rows`` per row group, it reads only the tensors built once here).
Half precision solves U in float32 (there is no bf16 / fp16 triangular solve).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

GROUP_TOKENS = 512  # queries per row group (G C): the caller's memory per checkpointed group is O(G C n)


def group_blocks(t: int, chunk: int) -> int:
    """G, the blocks of C = ``chunk`` queries per row group, for a segment of t tokens (N = ceil(t / C)
    blocks): the power of two at or below ceil(sqrt(N)) (so groups tile the usual lengths), which
    balances the query transforms inside a group (~G K² per token) against the key transforms across
    groups (~N / G K² per token); at least 2 (from N = 2 on both levels of the walk run), at most
    ``GROUP_TOKENS`` / C."""
    n_blocks = -(-t // chunk)
    root = 1 << (math.isqrt(max(n_blocks - 1, 0)) + 1).bit_length() - 1  # power of two <= ceil(sqrt(N))
    return max(1, min(max(root, 2), GROUP_TOKENS // chunk, n_blocks))


def householder_step(keys: Tensor, w: Tensor, beta: Tensor) -> Tensor:
    """H keys for H = I - beta w wᵀ: keys [B, P, H, K], w [B, H, K], beta [B, H] -> [B, P, H, K]."""
    proj = torch.einsum("bphk,bhk->bph", keys, w)
    return keys - (beta[:, None] * proj)[..., None] * w[:, None]


def sequential_path_scores(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, cached: Tensor) -> tuple[Tensor, Tensor]:
    """Reference logits: the transforms applied one token at a time to every earlier key.

    Args:
        q, k, w: [B, T, H, K] queries, keys, transform vectors.
        beta: [B, T, H] transform strengths.
        cached: [B, P, H, K] keys already transformed to the last cached position.
    Returns:
        scores [B, H, T, P + T]: q_iᵀ H_i ... H_{j+1} k_j (unscaled; 0 above the diagonal), and
        keys [B, P + T, H, K]: every key transformed to the segment's last position.
    """
    t = q.shape[1]
    keys, rows = cached, []
    for s in range(t):
        # 1. bring every earlier key past token s, then append k_s (its own product is empty)
        keys = torch.cat([householder_step(keys, w[:, s], beta[:, s]), k[:, s : s + 1]], 1)
        # 2. row s of the logits: q_s against the P + s + 1 keys, zero-padded to P + T
        rows.append(F.pad(torch.einsum("bhk,bshk->bhs", q[:, s], keys), (0, t - 1 - s)))
    return torch.stack(rows, 2), keys


@dataclass(frozen=True)
class ChunkedPath:
    """The blocked transforms of one segment, read by row groups (module docstring).

    Built once per segment by ``ChunkedPath.build``; every tensor is split per row group (a tuple of
    Ns = ceil(N / G) entries, the last group padded with whole inert blocks: P_c = I). Shapes with
    G blocks per group, C tokens per block:

    Attributes:
        chunk_size: C.
        group_size: G, blocks per row group.
        length: T, the segment's tokens.
        scale: factor on every logit.
        cached_keys: [B, H, P, K] the cache, transformed to the last cached position.
        in_block_logits: Ns x [B, H, G, C, C] q_iᵀ H_i ... H_{j+1} k_j inside each block, 0 above the diagonal.
        queries_at_block_start: Ns x [B, H, G, C, K] q_iᵀ H_i ... H_{block start}.
        keys_at_block_end: Ns x [B, H, G, C, K] H_{block end} ... H_{j+1} k_j.
        complements: Ns x [B, H, G, K, K] I - P_c of each block.
        keys_at_group_end: Ns x [B, H, G C, K] P_{group end} ... P_{c+1} (key at the end of its block c).
        group_products: Ns x [B, H, K, K] SP_s = P_{group end} ... P_{group start}.
    """

    chunk_size: int
    group_size: int
    length: int
    scale: float
    cached_keys: Tensor
    in_block_logits: tuple[Tensor, ...]
    queries_at_block_start: tuple[Tensor, ...]
    keys_at_block_end: tuple[Tensor, ...]
    complements: tuple[Tensor, ...]
    keys_at_group_end: tuple[Tensor, ...]
    group_products: tuple[Tensor, ...]

    @classmethod
    def build(
        cls,
        q: Tensor,
        k: Tensor,
        w: Tensor,
        beta: Tensor,
        cached: Tensor,
        chunk_size: int,
        scale: float = 1.0,
        group_size: int | None = None,
    ) -> ChunkedPath:
        """UT/WY form of every block and the group level of the walk.

        Args:
            q, k, w: [B, T, H, K] queries, keys, transform vectors (unit in PaTH, though any w defines
                H = I - beta w wᵀ; w = 0 or beta = 0: H = I).
            beta: [B, T, H] transform strengths.
            cached: [B, P, H, K] keys already transformed to the last cached position.
            chunk_size: C, tokens per block.
            scale: factor on every logit (1 / sqrt(K) for attention).
            group_size: G, blocks per row group; ``group_blocks(T, C)`` when None.
        """
        b, t, h, kd = q.shape
        c = chunk_size
        g = group_blocks(t, c) if group_size is None else group_size
        n_blocks = -(-t // c)
        n_groups = -(-n_blocks // g)
        pad = n_blocks * c - t

        def blocks(z: Tensor) -> Tensor:  # [B, T, H, .] -> [B, H, N, C, .]; padded tokens are inert (w = 0)
            z = F.pad(z, (0, 0, 0, 0, 0, pad))
            return z.view(b, n_blocks, c, h, z.shape[-1]).permute(0, 3, 1, 2, 4).contiguous()

        qb, kb, wb = blocks(q), blocks(k), blocks(w)
        wbeta = wb * blocks(beta[..., None])  # beta W    [B, H, N, C, K]
        eye_c = torch.eye(c, dtype=q.dtype, device=q.device)
        strict = torch.ones(c, c, dtype=torch.bool, device=q.device).tril(-1)
        lower = strict | eye_c.bool()
        wt, kt = wb.transpose(-1, -2), kb.transpose(-1, -2)
        # 1. U = (I + strict_lower(beta W Wᵀ))^{-1}, all blocks at once
        work = torch.float32 if q.dtype in (torch.bfloat16, torch.float16) else q.dtype
        ut = torch.linalg.solve_triangular(
            (eye_c + (wbeta @ wt).masked_fill(~strict, 0.0)).to(work),
            eye_c.to(work).expand(b, h, n_blocks, c, c),
            upper=False,
            unitriangular=True,
        ).to(q.dtype)
        u_wbeta = ut @ wbeta  # U beta W  [B, H, N, C, K]
        u_wbeta_k = ut @ (wbeta @ kt).masked_fill(~strict, 0.0)  # U strict_lower(beta W Kᵀ)  [B, H, N, C, C]
        qw = (qb @ wt).masked_fill(~lower, 0.0)  # q_i·w_l, l <= i
        # 2. per block: in-block logits, queries down to the block start, keys up to the block end, I - P_c
        in_block = (qb @ kt).masked_fill(~lower, 0.0) - qw @ u_wbeta_k  # [B, H, N, C, C]
        q_start = qb - qw @ u_wbeta  # [B, H, N, C, K]
        k_end = kb - u_wbeta_k.transpose(-1, -2) @ wb  # [B, H, N, C, K]
        complement = wt @ u_wbeta  # Wᵀ U beta W = I - P_c  [B, H, N, K, K]

        # whole inert blocks up to Ns G (P_c = I: complement = 0, keys and queries 0)
        q_start, k_end, complement, in_block = (
            F.pad(z, (0, 0, 0, 0, 0, n_groups * g - n_blocks)) for z in (q_start, k_end, complement, in_block)
        )

        def per_group(z: Tensor) -> tuple[Tensor, ...]:  # [B, H, Ns G, ...] -> Ns x [B, H, G, ...]
            return z.unflatten(2, (n_groups, g)).unbind(2)

        # 3. group level, all groups at once (G steps, last block first): keys to their group's end,
        # and suffix = P_{group end} ... P_{block}, which ends as the group products SP
        eye_k = torch.eye(kd, dtype=q.dtype, device=q.device)
        suffix = eye_k.expand(b, h, n_groups, kd, kd)
        to_group_end = [None] * g
        k_end_by_block = k_end.unflatten(2, (n_groups, g)).unbind(3)  # G x [B, H, Ns, C, K]
        complement_by_block = complement.unflatten(2, (n_groups, g)).unbind(3)  # G x [B, H, Ns, K, K]
        for blk in range(g - 1, -1, -1):
            to_group_end[blk] = k_end_by_block[blk] @ suffix.transpose(-1, -2)  # [B, H, Ns, C, K]
            suffix = suffix - suffix @ complement_by_block[blk]
        keys_at_group_end = torch.stack(to_group_end, 3).flatten(3, 4).unbind(2)  # Ns x [B, H, G C, K]
        return cls(
            chunk_size=c,
            group_size=g,
            length=t,
            scale=scale,
            cached_keys=cached.transpose(1, 2),
            in_block_logits=per_group(in_block),
            queries_at_block_start=per_group(q_start),
            keys_at_block_end=per_group(k_end),
            complements=per_group(complement),
            keys_at_group_end=keys_at_group_end,
            group_products=suffix.unbind(2),
        )

    @property
    def group_tokens(self) -> int:
        """G C, the queries of one row group: the block size the caller reads ``rows`` by."""
        return self.group_size * self.chunk_size

    def rows(self, i0: int, i1: int) -> list[tuple[int, Tensor]]:
        """Logits of the segment queries i0 .. i1 - 1 of one row group, block by block.

        Args:
            i0, i1: i0 a multiple of ``group_tokens``, i0 < i1 <= min(i0 + group_tokens, T).
        Returns:
            per block of C queries j0 .. j1 - 1 in [i0, i1): (j0, logits [B, H, j1 - j0, P + j1]),
            scaled, -inf above the diagonal (keys after the query), over the cache then the segment.
        """
        c, scale = self.chunk_size, self.scale
        s, n = i0 // self.group_tokens, -(-(i1 - i0) // c)  # group, its blocks (< G only in a ragged last group)
        lower = torch.ones(c, c, dtype=torch.bool, device=self.in_block_logits[s].device).tril()
        queries = self.queries_at_block_start[s][:, :, :n] * scale
        keys, complements = self.keys_at_block_end[s][:, :, :n], self.complements[s][:, :, :n]
        # 1. inside the group, along the diagonals: step d moves the queries of blocks d .. n - 1 one
        # block further back (one batched matmul) and reads key blocks 0 .. n - 1 - d;
        # diagonals[d][j] = logits of query block j + d over key block j, [B, H, C, C]
        diagonals = [(self.in_block_logits[s][:, :, :n] * scale).masked_fill(~lower, float("-inf")).unbind(2)]
        at_group_start, moving = [queries[:, :, 0]], queries[:, :, 1:]
        for d in range(1, n):
            diagonals.append((moving @ keys[:, :, : n - d].transpose(-1, -2)).unbind(2))
            moving = moving - moving @ complements[:, :, : n - d]
            at_group_start.append(moving[:, :, 0])  # block d now sits at the group start
            moving = moving[:, :, 1:]
        # 2. the earlier groups and the cache, through keys brought to the group start:
        # suffix = SP_{s-1} ... SP_{s'+1} as the walk reaches group s'
        suffix, earlier = None, [None] * s
        for prev in range(s - 1, -1, -1):
            earlier[prev] = (
                self.keys_at_group_end[prev]
                if suffix is None
                else self.keys_at_group_end[prev] @ suffix.transpose(-1, -2)
            )
            suffix = self.group_products[prev] if suffix is None else suffix @ self.group_products[prev]
        if self.cached_keys.shape[2]:
            earlier.insert(0, self.cached_keys if suffix is None else self.cached_keys @ suffix.transpose(-1, -2))
        if earlier:  # [B, H, n C, P + s G C]: one matmul for all the group's queries
            outer = (torch.stack(at_group_start, 2).flatten(2, 3) @ torch.cat(earlier, 2).transpose(-1, -2)).split(c, 2)
        # 3. each query block: the earlier keys, then its group's key blocks 0 .. itself
        p, out = self.cached_keys.shape[2], []
        for blk in range(n):
            j0 = i0 + blk * c
            j1 = min(j0 + c, i1)
            row = ([outer[blk]] if earlier else []) + [diagonals[blk - j][j] for j in range(blk + 1)]
            out.append((j0, torch.cat(row, -1)[:, :, : j1 - j0, : p + j1]))
        return out

    def keys(self) -> Tensor:
        """Every key transformed to the segment's last position: [B, P + T, H, K] (the next cache)."""
        b, h, _, kd = self.cached_keys.shape
        like = self.queries_at_block_start[0]  # the dtype and device of the segment's inputs
        suffix = torch.eye(kd, dtype=like.dtype, device=like.device).expand(b, h, kd, kd)
        out = [None] * len(self.group_products)
        for s in range(len(out) - 1, -1, -1):  # suffix = SP_{Ns-1} ... SP_{s+1}
            out[s] = self.keys_at_group_end[s] @ suffix.transpose(-1, -2)
            suffix = suffix @ self.group_products[s]
        segment = torch.cat(out, 2)[:, :, : self.length]
        return torch.cat([self.cached_keys @ suffix.transpose(-1, -2), segment], 2).transpose(1, 2)
