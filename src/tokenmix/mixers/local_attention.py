"""Sliding-window (local) causal softmax attention: a banded A, B = 0.

Per head, with window w (positions attended, the current one included):

    y_t = sum_{t - w < j <= t} p_{t,j} v_j,     p_{t,.} = softmax over the window of q_t . k_j / sqrt(K)

(A, B) form: A = banded causal softmax (bandwidth w), B = 0. Decoding keeps the keys and values of
the last w - 1 positions, so cost and cache per token are O(w) whatever the sequence length.

Modes: ``banded`` (training default: blocks of w queries each read a 2w-key slab, the previous
block and their own, through one fused attention call (``fused_attention``) with a banded mask;
memory O(T w), never O(T^2)), ``dense`` (reference solver on the materialised banded A),
``recurrent`` (token by token with a w - 1 position KV cache).

Left padding (mixers/base.py), masked as in full attention (mixers/attention.py): padding keys are
masked out of the band until they leave the window; a padding query reads only its own key.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.mixers.attention import KVCache, SoftmaxAttention, allowed_keys, fused_attention
from tokenmix.mixers.base import MixerConfig
from tokenmix.mixers.registry import register_mixer


@dataclass(frozen=True)
class LocalAttentionConfig(MixerConfig):
    window: int = 128  # w, positions attended including the current one

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("window")


def banded_attention(q: Tensor, kbuf: Tensor, vbuf: Tensor, window: int, key_start: Tensor | None = None) -> Tensor:
    """Sliding-window attention of the segment queries, by blocks of w queries.

    Args:
        q: [B, T, H, K] segment queries.
        kbuf, vbuf: [B, P + T, H, K] / [B, P + T, H, V], the P <= w - 1 cached positions then the segment.
        window: w.
        key_start: [B] leading padding keys of each row's buffer, or None (``attention.allowed_keys``).
    Returns:
        y: [B, T, H, V].

    Segments longer than w: the key buffer is left-padded to w + T positions (query i then sits at
    padded position w + i and reads padded positions i + 1 .. i + w) and right-padded to a whole
    number of blocks. Block c of w queries reads exactly padded blocks c and c + 1, so every block
    sees a [w, 2w] slab with the same band, and only block 0 additionally masks the left padding.
    """
    b, t, h, k = q.shape
    p, dv, w = kbuf.shape[1] - t, vbuf.shape[-1], window
    if p > w - 1:
        raise InputError(f"cache holds {p} positions but a window of {w} reads at most {w - 1}")
    if t <= w:
        # a single block: the [T, P + T] band mask is already O(T w), and padding a short segment
        # to a whole [w, 2w] block would waste work when w is large
        mask = allowed_keys(p, t, w, q.device, key_start)
        y = fused_attention(q.transpose(1, 2), kbuf.transpose(1, 2), vbuf.transpose(1, 2), mask)
        return y.transpose(1, 2)
    nb = -(-t // w)  # number of query blocks
    left, right = w - p, nb * w - t

    def slabs(buf: Tensor) -> Tensor:  # [B, P + T, H, .] -> [B * nb, H, 2w, .]
        padded = F.pad(buf, (0, 0, 0, 0, left, right)).view(b, nb + 1, w, h, buf.shape[-1])
        slab = torch.cat([padded[:, :-1], padded[:, 1:]], 2)  # [B, nb, 2w, H, .]
        return slab.transpose(2, 3).reshape(b * nb, h, 2 * w, buf.shape[-1])

    qb = F.pad(q, (0, 0, 0, 0, 0, right)).view(b, nb, w, h, k).transpose(2, 3).reshape(b * nb, h, w, k)
    r = torch.arange(w, device=q.device)[:, None]
    j = torch.arange(2 * w, device=q.device)[None, :]
    band = (j > r) & (j <= r + w)  # [w, 2w]: the w positions ending at the query itself
    buf_pos = torch.arange(nb, device=q.device)[:, None] * w + j - left  # [nb, 2w]: buffer position of slab key j
    mask = (band[None] & (buf_pos >= 0)[:, None, :])[:, None]  # [nb, 1, w, 2w]: no slab padding
    if key_start is None:
        mask = mask.expand(b, nb, 1, w, 2 * w).reshape(b * nb, 1, w, 2 * w)
    else:
        # row padding: key j of block c is padding if its buffer position is < key_start[b], unless it
        # is the query's own key (slab column w + r for query r)
        real = (buf_pos[None] >= key_start[:, None, None])[:, :, None, :] | (j == r + w)  # [B, nb, w, 2w]
        mask = (mask[None, :, 0] & real)[:, :, None].reshape(b * nb, 1, w, 2 * w)
    y = fused_attention(qb, slabs(kbuf), slabs(vbuf), mask)  # [B * nb, H, w, V]
    return y.view(b, nb, h, w, dv).transpose(2, 3).reshape(b, nb * w, h, dv)[:, :t]


class LocalAttention(SoftmaxAttention):
    """Multi-head sliding-window causal softmax attention."""

    modes = ("banded", "dense", "recurrent")
    packing_modes = ()  # the banded kernel has no document masks: packed rows run piece by piece (exact)
    time_complexity = "O(w)"
    cache_complexity = "O(w)"
    test_overrides = {"window": 3}

    @property
    def window(self) -> int:  # type: ignore[override]
        return self.config.window

    def forward_banded(self, x: Tensor, state: KVCache | None) -> tuple[Tensor, KVCache]:
        state, q, grown = self._start(x, state)
        key_start = state.padded_keys(state.cached_positions())
        return self._finish(grown, banded_attention(q, grown.keys, grown.values, self.window, key_start))


register_mixer(
    "local_attention", LocalAttentionConfig, family="attention", ab_form="A = banded causal softmax (window w), B = 0"
)(LocalAttention)
