"""Stick-breaking attention (Tan et al., "Scaling Stick-Breaking Attention", ICLR 2025).

Per head, with q_t, k_t, v_t [K] projections of the layer input, z_{i,j} = q_i . k_j / sqrt(K) and
beta_{i,j} = sigmoid(z_{i,j}), query i breaks a unit stick starting from its nearest key:

    a_{i,j} = beta_{i,j} * prod_{j < l < i'} (1 - beta_{i,l}),      y_i = sum_j a_{i,j} v_j,

over the visible keys j < i (``attend_current`` False, the default, as in fla and the paper's
kernel) or j <= i (``attend_current`` True, then i' = i + 1). The weights of a row sum to at most 1
(the rest of the stick, 1 - sum_j a_{i,j}, is dropped); there is no softmax normalisation and no
position encoding: recency comes from the order in which the stick is broken. Computed in log
space: log a_{i,j} = logsigmoid(z_{i,j}) + sum_{j < l} logsigmoid(-z_{i,l}) over the visible l.

(A, B) form: A = [a_{i,j}], [B, H, T, T], causal (strictly lower triangular without
``attend_current``), rows summing to <= 1; B = 0. No recurrence or solve: the stick-breaking
product sits inside each row of A.

Modes: ``chunked`` (training default: blocks of C queries each reading the keys up to its end,
checkpointed in training: memory O(C n)), ``dense`` (materialise A, the reference solver),
``recurrent`` (token by token over a KV cache: keys [B, P, H, K] and values [B, P, H, K]; while
token n - 1 is decoded the cache holds n - 1 positions, 2 H K scalars each).

Left padding (mixers/base.py), masked: padding keys get weight 0 and leave the stick unchanged
(they all precede the real keys, so no real weight's product spans them anyway); a padding query
reads no key at all (its output is 0), which needs no normalisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.mixers.attention import KVCache, decode_tokens
from tokenmix.mixers.base import Linear, MixerConfig
from tokenmix.mixers.registry import register_mixer
from tokenmix.mixers.row_attention import RowAttention, Segment, exclusive_reverse_cumsum


@dataclass(frozen=True)
class StickBreakingAttentionConfig(MixerConfig):
    chunk_size: int = 64  # C, queries per block of the chunked mode
    attend_current: bool = False  # whether query i also reads key i (fla's ``attend_current``)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("chunk_size")


def stick_breaking_weights(z: Tensor, visible: Tensor) -> Tensor:
    """Stick-breaking weights of score rows.

    Args:
        z: [..., S] scaled logits q_i . k_j / sqrt(K) of each row over its S buffer keys, oldest first.
        visible: bool, broadcastable to z: the keys the row reads.
    Returns:
        a: [..., S], a_j = sigmoid(z_j) prod_{l > j, visible} (1 - sigmoid(z_l)); 0 where not visible.
    """
    log_rest = F.logsigmoid(-z).masked_fill(~visible, 0.0)  # invisible keys leave the stick unchanged
    log_a = F.logsigmoid(z) + exclusive_reverse_cumsum(log_rest, -1)
    return log_a.masked_fill(~visible, float("-inf")).exp()


class StickBreakingAttention(RowAttention):
    """Multi-head causal stick-breaking attention."""

    # the generic matrix checks that y_t depends on x_t: with attend_current False, y_0 reads no key
    # (it is 0 whatever x_0); tests/mixers/test_row_attention.py covers attend_current False
    test_overrides = {"attend_current": True}

    def __init__(self, config: StickBreakingAttentionConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, k = self.n_heads, self.head_dim
        self.qkv = Linear(d_model, 3 * h * k, bias=False)
        self.out = Linear(h * k, d_model, bias=False)

    def _visible(self, p: int, t: int, s: int, key_start: Tensor | None, device) -> Tensor:
        """Keys read by queries at buffer positions p .. p + t - 1 among buffer keys 0 .. s - 1:
        [t, s], or [B, 1, t, s] with key_start (padding keys, buffer positions < key_start[b], hidden)."""
        rows = torch.arange(t, device=device)[:, None] + p
        cols = torch.arange(s, device=device)[None, :]
        vis = cols <= rows if self.config.attend_current else cols < rows
        if key_start is not None:
            vis = (vis[None] & (cols >= key_start[:, None])[:, None, :])[:, None]
        return vis

    def _segment(self, x: Tensor, state: KVCache | None, mode: str) -> Segment:
        if state is None:
            state = self.empty_state(x.shape[0], x.device, x.dtype)
        q, k, v = self._project(x)
        grown = state.appended(k, v)
        kbuf, vbuf = grown.keys, grown.values  # [B, P + T, H, K]
        p, t = state.cached_positions(), x.shape[1]
        key_start = state.padded_keys(p)

        def rows(i0: int, i1: int) -> Tensor:
            z = torch.einsum("bthk,bshk->bhts", q[:, i0:i1], kbuf[:, : p + i1]) / math.sqrt(self.head_dim)
            return stick_breaking_weights(z, self._visible(p + i0, i1 - i0, p + i1, key_start, x.device))

        return Segment(p, t, rows, vbuf, lambda: grown)

    def forward_recurrent(self, x: Tensor, state: KVCache | None) -> tuple[Tensor, KVCache]:
        """Token by token: append k_t, v_t to the cache, break the stick over the cached keys from
        the newest back, read the values."""
        if state is None:
            state = self.empty_state(x.shape[0], x.device, x.dtype)

        def weights(q_t: Tensor, keys: Tensor, before: KVCache) -> Tensor:
            p = before.cached_positions()
            z = torch.einsum("bhk,bshk->bhs", q_t, keys) / math.sqrt(self.head_dim)
            vis = self._visible(p, 1, p + 1, before.padded_keys(p), x.device)[..., 0, :]  # [1, P+1] / [B, 1, P+1]
            return stick_breaking_weights(z, vis)

        y, state = decode_tokens(*self._project(x), state, weights, lambda grown: grown)  # nothing evicted
        return self.out(y.flatten(2)), state

    # ---------------------------------------------------------------- surface
    def empty_state(self, batch_size: int, device="cpu", dtype=torch.float32) -> KVCache:
        return KVCache.empty(self.owner, batch_size, self.n_heads, self.head_dim, self.head_dim, device, dtype)

    def state_size(self, n: int) -> int:
        return self.cache_positions(n) * self.n_heads * 2 * self.head_dim  # a key and a value per position

    def flops_per_token(self, n: int) -> int:
        read = self.cache_positions(n) + 1
        return self.n_heads * read * (2 * self.head_dim + 1)  # q.k_j, the stick cumsum, the sum of v_j


register_mixer(
    "stickbreaking_attention",
    StickBreakingAttentionConfig,
    family="attention",
    ab_form="A = stick-breaking sigmoid(z_ij) prod_{j<l<i}(1 - sigmoid(z_il)), B = 0",
)(StickBreakingAttention)
