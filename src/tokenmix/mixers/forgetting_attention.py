"""Forgetting Transformer (FoX; Lin et al., ICLR 2025): softmax attention with a data-dependent forget gate.

Per head, with q_t, k_t, v_t [K] projections of the layer input, a scalar forget gate
f_t = sigmoid(w_f . x_t + b_f) in (0, 1) and its log-cumsum G_t = sum_{s <= t} log f_s:

    y_i = sum_{j <= i} a_{i,j} v_j,     a_{i,.} = softmax_j( q_i . k_j / sqrt(K) + G_i - G_j ),
    out_i = W_o [y_i]_heads.

G_i - G_j = sum_{j < s <= i} log f_s <= 0 is a data-dependent decay bias (ALiBi when f is constant);
f = 1 is exactly causal softmax attention.

(A, B) form: A = the forgetting softmax matrix over the values, [B, H, T, T], causal and
row-stochastic (a_{i,j} above); B = 0. No recurrence or solve: the gate sits inside A's logits.

Modes: ``chunked`` (training default: blocks of C = chunk_size queries, each reading the keys up to
its own end, checkpointed in training: memory O(C n), ops/query_blocks.py), ``dense`` (materialise
A, B = 0, the reference solver; cached positions enter as a known right-hand side), ``recurrent``
(token by token over a KV cache).

Decode cache: every past position j holds its key, its log forget gate and its value:
``keys`` [B, P, H, K + 1] (channel K is log f_j), ``values`` [B, P, H, K]. A decoded token t
reads the bias G_t - G_j = sum_{j < s <= t} log f_s as an exclusive reverse cumsum of the cached
gates (O(P H) per token, and exact for the nearby keys that matter), so the cache holds no running
sum. While token n - 1 is decoded: n - 1 positions, H (2K + 1) scalars each.

Left padding (mixers/base.py), masked as in attention (mixers/attention.py): padding keys are masked
out of every row, a padding query reads only its own key; padding tokens get log f = 0, so they add
nothing to any G_i - G_j (and no real pair spans a padding position anyway).

The modes other than the decode (rows by query blocks, the dense mode through the reference
solver, the materialised A) come from the base, mixers/row_attention.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.mixers.attention import KVCache, allowed_keys, mask_padding_keys
from tokenmix.mixers.base import Linear, MixerConfig, MixerState
from tokenmix.mixers.registry import register_mixer
from tokenmix.mixers.row_attention import RowAttention, Segment, exclusive_reverse_cumsum, gate_bias


@dataclass(frozen=True)
class ForgettingAttentionConfig(MixerConfig):
    chunk_size: int = 64  # C, queries per block of the chunked mode

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("chunk_size")


class ForgettingAttention(RowAttention):
    """Multi-head causal softmax attention with a per-head data-dependent forget gate (FoX)."""

    def __init__(self, config: ForgettingAttentionConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, k = self.n_heads, self.head_dim
        self.qkv = Linear(d_model, 3 * h * k, bias=False)
        self.fgate = Linear(d_model, h, bias=True)  # log f_t = logsigmoid(fgate(x_t)), per head
        self.out = Linear(h * k, d_model, bias=False)

    def log_forget(self, x: Tensor, state: MixerState | None = None) -> Tensor:
        """log f [B, T, H] of a segment; 0 at padding positions of ``state`` (inert)."""
        logf = F.logsigmoid(self.fgate(x))
        pad = state.padding(x.shape[1]) if state is not None else None
        return logf if pad is None else logf.masked_fill(pad[..., None], 0.0)

    def _segment(self, x: Tensor, state: KVCache | None, mode: str) -> Segment:
        if state is None:
            state = self.empty_state(x.shape[0], x.device, x.dtype)
        q, k, v = self._project(x)
        logf = self.log_forget(x, state)
        grown = state.appended(torch.cat([k, logf[..., None]], -1), v)
        kbuf, vbuf = grown.keys, grown.values  # [B, P + T, H, K + 1], [B, P + T, H, K]
        p, t, kdim = state.cached_positions(), x.shape[1], self.head_dim
        key_start = state.padded_keys(p)
        gsum = kbuf[..., kdim].cumsum(1)  # G over the buffer [B, P + T, H] (any constant offset cancels)

        def rows(i0: int, i1: int) -> Tensor:
            s = p + i1
            scores = torch.einsum("bthk,bshk->bhts", q[:, i0:i1], kbuf[:, :s, :, :kdim]) / math.sqrt(kdim)
            mask = allowed_keys(p + i0, i1 - i0, None, x.device, key_start)
            return torch.softmax((scores + gate_bias(gsum, p, i0, i1)).masked_fill(~mask, float("-inf")), dim=-1)

        return Segment(p, t, rows, vbuf, lambda: grown)

    def forward_recurrent(self, x: Tensor, state: KVCache | None) -> tuple[Tensor, KVCache]:
        """Token by token: append (k_t, log f_t), v_t to the cache, bias the scores by the exclusive
        reverse cumsum of the cached gates, softmax, read the values."""
        if state is None:
            state = self.empty_state(x.shape[0], x.device, x.dtype)
        q, k, v = self._project(x)
        logf = self.log_forget(x, state)
        kdim, ys = self.head_dim, []
        for s in range(x.shape[1]):
            state.observe()
            grown = state.appended(torch.cat([k[:, s : s + 1], logf[:, s : s + 1, :, None]], -1), v[:, s : s + 1])
            keys, values = grown.keys, grown.values  # [B, P + 1, H, K + 1], [B, P + 1, H, K]
            bias = exclusive_reverse_cumsum(keys[..., kdim], 1).transpose(1, 2)  # [B, H, P + 1]
            scores = torch.einsum("bhk,bshk->bhs", q[:, s], keys[..., :kdim]) / math.sqrt(kdim) + bias
            scores = mask_padding_keys(scores, state.padded_keys(keys.shape[1] - 1))
            ys.append(torch.einsum("bhs,bshv->bhv", torch.softmax(scores, -1), values))
            state = grown
        return self.out(torch.stack(ys, 1).flatten(2)), state

    # ---------------------------------------------------------------- surface
    def empty_state(self, batch_size: int, device="cpu", dtype=torch.float32) -> KVCache:
        return KVCache.empty(self.owner, batch_size, self.n_heads, self.head_dim + 1, self.head_dim, device, dtype)

    def state_size(self, n: int) -> int:
        return self.cache_positions(n) * self.n_heads * (2 * self.head_dim + 1)  # key, log f, value

    def flops_per_token(self, n: int) -> int:
        read = self.cache_positions(n) + 1  # cached positions plus the token itself
        return self.n_heads * read * (2 * self.head_dim + 1)  # q.k_j, the gate cumsum, the sum of v_j


register_mixer(
    "forgetting_attention",
    ForgettingAttentionConfig,
    family="attention",
    ab_form="A = causal softmax(QK^T / sqrt(K) + G_i - G_j), G = cumsum log f; B = 0",
)(ForgettingAttention)
