"""The Fenwick levels the log-linear ops share (Guo et al. 2025): level arithmetic, the aligned chunk
layout, and the decode step's read-and-merge with its token loop.

Both log-linear ops, over Mamba-2 (ops/chunked_log_linear.py, which derives the state view and the
chunked form) and over Gated DeltaNet (ops/chunked_log_linear_delta.py), weight the pair (t, s) by
lambda_t^(l(t,s)), l(t, s) = bit_length(t XOR s) on absolute positions, and keep the canonical state
``levels [B, H, bit_length(n), K, V]`` (slot l-1 = bucket l of position n). What differs is only how
a bucket evolves between tokens (a decay; a decay and the delta rule's erase), so each op writes its
transition and everything in this file is written once:

* ``bit_length``, ``fenwick_level_matrix``, ``intra_chunk_levels``, ``n_levels``, ``initial_level_map``:
  the level map;
* ``AlignedChunks``: chunks of C = 2^c tokens aligned to absolute positions (the segment front-padded
  with start mod C inert zero tokens), so that every chunk has the same level table;
* ``read_and_merge`` (a decode step's read of every level and the lssb merge) and ``run_steps`` (the
  token-by-token reference around a step).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import torch
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.patterns import fenwick_level


def bit_length(x: Tensor, bits: int) -> Tensor:
    """Elementwise int.bit_length of a non-negative integer tensor (exact, no float log2).

    ``bits``: a bound known on the host, every value of x < 2**bits (positions up to n: n.bit_length();
    the XOR of two of them as well). The loop runs ``bits`` times, a count from Python ints, never a
    check of the data: on a GPU a data-dependent stop would wait for the device once per bit.
    """
    out = torch.zeros_like(x)
    y = x.clone()
    for _ in range(bits):
        out += (y > 0).to(out.dtype)
        y = y >> 1
    return out


def fenwick_level_matrix(start: int, t: int, device: torch.device | str = "cpu") -> Tensor:
    """[T, T] long: l(start + i, start + j) for j <= i, -1 above the diagonal."""
    pos = torch.arange(start, start + t, device=device)
    lvl = bit_length(pos[:, None] ^ pos[None, :], max(start + t - 1, 0).bit_length())
    return lvl.masked_fill(pos[None, :] > pos[:, None], -1)


@lru_cache(maxsize=16)
def intra_chunk_levels(c: int) -> Tensor:
    """[C, C] long: the level map inside any aligned chunk (same for all of them), 0 above the diagonal."""
    return torch.tensor([[fenwick_level(i, j) if j <= i else 0 for j in range(c)] for i in range(c)])


def n_levels(n: int) -> int:
    """Level scales a length-n sequence uses: levels 0..bit_length(n - 1)."""
    return max(n - 1, 0).bit_length() + 1


def initial_level_map(start: int, t: int, l0: int, device: torch.device | str = "cpu") -> Tensor:
    """[T, L0] long: the level at which initial bucket l' (1..L0) reaches token start + i,
    max(l', bit_length((start + i) XOR start)) (the levels up to that one have merged by then)."""
    pos = torch.arange(start, start + t, device=device)
    reach = bit_length(pos ^ start, max(start + t - 1, 0).bit_length())  # [T]
    return torch.maximum(torch.arange(1, l0 + 1, device=device)[None, :], reach[:, None])


class AlignedChunks:
    """Chunks of C tokens (a power of two) aligned to absolute multiples of C: a segment of T tokens
    starting at ``start`` is front-padded with start mod C and back-padded to whole chunks with inert
    zero tokens, so the level structure inside every chunk is ``intra_chunk_levels(C)``."""

    def __init__(self, start: int, t: int, chunk_size: int) -> None:
        if chunk_size <= 0 or chunk_size & (chunk_size - 1):
            raise InputError(f"chunk_size must be a power of two, got {chunk_size}")
        self.size, self.t = chunk_size, t
        self.front = start % chunk_size
        self.n = -(-(self.front + t) // chunk_size)
        self.back = self.n * chunk_size - self.front - t

    def split(self, x: Tensor) -> Tensor:
        """[B, T, H, ...] -> [B, H, N, C, ...], zero padding at both ends."""
        b, h = x.shape[0], x.shape[2]
        pads = [x.new_zeros(b, self.front, *x.shape[2:]), x, x.new_zeros(b, self.back, *x.shape[2:])]
        return torch.cat(pads, 1).reshape(b, self.n, self.size, h, *x.shape[3:]).movedim(3, 1)

    def join(self, o: Tensor) -> Tensor:
        """[B, H, N, C, V] -> [B, T, H, V], padding dropped."""
        b, h, _, c, dv = o.shape
        return o.movedim(1, 3).reshape(b, self.n * c, h, dv)[:, self.front : self.front + self.t]

    def level_scales_inside(self, lam: Tensor) -> Tensor:
        """lambda_t^(l(t,s)) inside every chunk, [B, H, N, C, C], from the chunked scales lam [B, H, N, C, L].

        Level indices beyond L only occur on padded rows (a real token t never sees a level above
        bit_length(t)), so clamping is harmless."""
        b, h, n, c, n_lam = lam.shape
        lvl_in = intra_chunk_levels(c).to(lam.device).clamp(max=n_lam - 1)
        return lam.gather(-1, lvl_in.expand(b, h, n, c, c))


def causal_chunk_decay(gc: Tensor) -> Tensor:
    """exp(G_i - G_j) for j <= i inside each chunk, 0 above (masked before the exp): gc [.., C] -> [.., C, C]."""
    c = gc.shape[-1]
    causal = torch.ones(c, c, dtype=torch.bool, device=gc.device).tril()
    return (gc[..., :, None] - gc[..., None, :]).masked_fill(~causal, float("-inf")).exp()


def read_and_merge(buckets: Tensor, position: int, q_t: Tensor, lam_t: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """The end of a decode step, once every bucket has gone through token t's transition.

    Args:
        buckets: [B, H, 1 + bit_length(t), K, V], index = level (0: the sentinel {t}, holding t's write).
        position: t;  q_t: [B, H, K];  lam_t: [B, H, L] with L > bit_length(t).
    Returns:
        o_t = scale sum_l lambda_t^(l) q_tᵀ S^(l) [B, H, V];  levels of position t + 1, levels 0..lssb(t+1)
        merged into level lssb(t+1) + 1 (§6.1's update), [B, H, bit_length(t + 1), K, V].
    """
    reads = torch.einsum("bhk,bhlkv->bhlv", q_t, buckets)  # read each level
    o_t = scale * torch.einsum("bhl,bhlv->bhv", lam_t[..., : buckets.shape[2]], reads)
    nxt = position + 1
    low = (nxt & -nxt).bit_length() - 1  # lssb(t + 1): levels 0..low become level low + 1
    # Level low + 1 is empty here (bit low of t is 0); summing it too changes no value but makes
    # the step the same linear map of an initial state as the closed forms, slot by slot (gradients).
    merged = buckets[:, :, : low + 2].sum(2, keepdim=True)
    emptied = torch.zeros_like(buckets[:, :, :low])
    return o_t, torch.cat([emptied, merged, buckets[:, :, low + 2 :]], 2)


def run_steps(
    step: Callable[..., tuple[Tensor, Tensor]],
    per_token: tuple[Tensor, ...],
    scale: float,
    initial_levels: Tensor | None,
    start: int,
) -> tuple[Tensor, Tensor]:
    """Token-by-token reference: ``step(levels, t, *(x[:, i] for x in per_token), scale)`` for every token.

    Args:
        per_token: the op's [B, T, H, ...] inputs in the step's order, q first and v third.
        initial_levels: [B, H, bit_length(start), K, V], or None when start = 0.
    Returns:
        o [B, T, H, V];  the levels after the segment.
    """
    q, v = per_token[0], per_token[2]
    b, t, h, dk = q.shape
    levels = q.new_zeros(b, h, 0, dk, v.shape[-1]) if start == 0 else initial_levels
    outs = []
    for i in range(t):
        o_t, levels = step(levels, start + i, *(x[:, i] for x in per_token), scale)
        outs.append(o_t)
    return torch.stack(outs, 1), levels
