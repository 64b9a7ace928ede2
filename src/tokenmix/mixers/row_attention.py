"""Shared machinery of the row-attention mixers (FoX, stick-breaking attention, PaTH): mixers
y_i = sum_{j <= i} a_{i,j} v_j with B = 0, whose weight rows a_{i,.} depend on the whole causal row
(a softmax, a stick-breaking product, transformed logits) but can be computed one block of queries
at a time. A member says how it builds its rows for one segment (``_segment`` -> ``Segment``) and
how it decodes (``forward_recurrent``); the rest lives here (a member may replace the chunked
driver with its own, as PaTH does with ops/chunked_path.py):

    ``chunked``  rows by blocks of C = chunk_size queries, each reading the keys up to its own end,
                 checkpointed in training (ops/query_blocks.py: memory O(C n), not O(n^2));
    ``dense``    all rows at once, A = the weight matrix [B, H, T, T], B = 0, through the reference
                 solver (core.operator.solve_dense); cached positions enter as a known right-hand
                 side read through the prefix columns of A;
    ``materialize``, ``values`` (the mixed inputs X = v), the q, k, v projection and the decode
    cache size (every earlier position: n - 1 while token n - 1 is decoded).

Also the forget-gate pieces FoX and PaTH-FoX share: ``gate_bias`` (G_i - G_j from the cumulative
log gates of a segment) and ``exclusive_reverse_cumsum`` (the same bias for one decoded query over
the cached gates; stick-breaking uses it for the remaining stick).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.mixers.base import Mixer, MixerState
from tokenmix.ops.query_blocks import by_query_blocks


@dataclass
class Segment:
    """What the modes of a ``RowAttention`` share for one segment of T tokens after P cached ones.

    Attributes:
        p, t: cached positions P and segment length T.
        rows: (i0, i1) -> weights [B, H, i1 - i0, P + i1] of segment queries i0 .. i1 - 1 over the
            buffer (cache then segment) keys before P + i1; zero outside the causal, real keys.
        values: [B, P + T, H, V] the buffer values.
        state: () -> the decode state after the segment.
    """

    p: int
    t: int
    rows: Callable[[int, int], Tensor]
    values: Tensor
    state: Callable[[], MixerState]


def exclusive_reverse_cumsum(g: Tensor, dim: int) -> Tensor:
    """out_j = sum_{s > j} g_s along ``dim`` (0 at the last position), summed from the end."""
    rc = g.flip(dim).cumsum(dim).flip(dim)
    return torch.cat([rc.narrow(dim, 1, g.shape[dim] - 1), torch.zeros_like(g.narrow(dim, 0, 1))], dim)


def gate_bias(gsum: Tensor, p: int, i0: int, i1: int) -> Tensor:
    """The forget gates' logit bias of queries i0 .. i1 - 1 over keys 0 .. P + i1 - 1: sum of log f
    over (j, i], i.e. gsum_i - gsum_j with gsum [B, P + T, H] the cumulative log gates -> [B, H, i1 - i0, P + i1]."""
    return gsum[:, p + i0 : p + i1].transpose(1, 2)[..., None] - gsum[:, : p + i1].transpose(1, 2)[:, :, None, :]


class RowAttention(Mixer):
    """Attention-like mixer y_i = sum_j a_{i,j} v_j whose weight rows a_{i,.} can be computed one query
    block at a time. Subclasses provide ``_segment`` (and ``forward_recurrent``, the decode)."""

    modes = ("chunked", "dense", "recurrent")
    time_complexity = "O(n)"
    cache_complexity = "O(n)"

    # ---------------------------------------------------------------- subclass hooks
    @abstractmethod
    def _segment(self, x: Tensor, state: MixerState | None, mode: str) -> Segment:
        """The segment's weight rows, values and next state (see ``Segment``) for ``mode``."""

    # ---------------------------------------------------------------- modes
    def forward_chunked(self, x: Tensor, state: MixerState | None) -> tuple[Tensor, MixerState]:
        seg = self._segment(x, state, "chunked")
        p, vbuf = seg.p, seg.values

        def block(i0: int, i1: int) -> Tensor:
            return torch.einsum("bhts,bshv->bthv", seg.rows(i0, i1), vbuf[:, : p + i1])

        records = torch.is_grad_enabled() and (x.requires_grad or any(q.requires_grad for q in self.parameters()))
        y = by_query_blocks(block, seg.t, self.config.chunk_size, records)
        return self.out(y.flatten(2)), seg.state()

    def forward_dense(self, x: Tensor, state: MixerState | None) -> tuple[Tensor, MixerState]:
        seg = self._segment(x, state, "dense")
        p, vbuf = seg.p, seg.values
        probs = seg.rows(0, seg.t)  # [B, H, T, P + T]
        mix_a = probs[..., p:]
        # cached positions are not part of the segment's operator: their values enter as a known
        # right-hand side, read through the prefix columns of A
        offset = torch.einsum("bhts,bshv->bthv", probs[..., :p], vbuf[:, :p]) if p else None
        y = solve_dense(MixOperator(mix_a, torch.zeros_like(mix_a)), vbuf[:, p:], offset=offset)
        return self.out(y.flatten(2)), seg.state()

    # ---------------------------------------------------------------- surface
    def materialize(self, x: Tensor) -> MixOperator:
        seg = self._segment(x, None, "dense")
        mix_a = seg.rows(0, seg.t)
        return MixOperator(mix_a, torch.zeros_like(mix_a))

    def values(self, x: Tensor) -> Tensor:
        """The inputs X the operator mixes: v [B, T, H, K]."""
        return self._project(x)[2]

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        return q, k, v  # each [B, T, H, K]

    def cache_positions(self, n: int) -> int:
        return max(n - 1, 0)  # while the last token is processed the cache holds every earlier position
