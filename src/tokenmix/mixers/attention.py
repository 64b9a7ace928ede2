"""Causal softmax attention as an (A, B) pair with B = 0.

Per head, with q_t, k_t, v_t projections of the layer input and K the head dimension:

    y_t = sum_{j <= t} p_{t,j} v_j,      p_{t,.} = softmax_j(q_t . k_j / sqrt(K)),      out_t = W_o [y_t]_heads

(A, B) form: A = P (causal, row-stochastic softmax matrix over the values), B = 0: attention mixes
inputs only, never its own past outputs.

Modes: ``sdpa`` (training default: torch's fused ``scaled_dot_product_attention``; with a KV-cache
prefix the causal mask is passed explicitly because the queries are offset from the keys),
``dense`` (materialise A, B = 0 and call the reference solver, prefix keys entering as a known
right-hand side), ``recurrent`` (token by token with a KV cache holding the key and value of every
past position, oldest first).

Left padding (mixers/base.py), masked: padding keys are masked out of every softmax row (they stay
in the cache, masked, for as long as the cache holds them); a padding query reads only its own key,
so its softmax row is never empty (no NaN) and reads no real key either.

Huge scores (``fused_attention``): the fused SDPA kernels (CPU flash attention; CUDA's memory-efficient
kernel has the same failure, pytorch/pytorch#125674) recompute the scores in their backward and
exponentiate s - lse against the forward's log-sum-exp. Once |s| is ~1e8 or more in float32 (inputs
scaled by ~1e5 and up), the two evaluations of s differ by many units of rounding, exp of the
difference overflows, and the gradients are NaN although the forward is finite. When a backward will
run and the scores can be that large, the same attention is computed by an explicit softmax instead,
whose autograd backward reads the saved probabilities (never above 1) and stays finite. That guard
runs on the CPU only: deciding it reads a bound back to the host, free on the CPU but a stall of the
stream every training forward on a GPU, so there the fused kernel always runs (as torch's own
attention does; a backward through scores beyond ``fused_score_limit`` can be NaN there).

The KV cache and the shared pieces here are reused by local (sliding-window) attention.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.core.packing import Packing
from tokenmix.mixers.base import Linear, Mixer, MixerConfig
from tokenmix.mixers.pattern_cache import PatternCache
from tokenmix.mixers.registry import register_mixer


@dataclass(frozen=True)
class AttentionConfig(MixerConfig):
    """Softmax attention has no fields beyond the shared ones (heads, head dimension)."""


class KVCache(PatternCache):
    """Keys and values of the cached past positions, oldest first, in storage that grows by doubling
    (``PatternCache``): a decode step appends its key and value in place, O(H K), instead of
    re-copying the whole O(n) cache, and a window's eviction only advances a start offset.

    Attributes (views of the held entries):
        keys: [B, P, H, K].
        values: [B, P, H, V].
        position: number of tokens seen so far (the cache holds positions position - P .. position - 1).
    """

    def appended(self, keys: Tensor, values: Tensor) -> "KVCache":
        """This cache with the next segment's keys [B, T, H, K] and values [B, T, H, V] after its
        own, nothing evicted: ``.keys`` / ``.values`` are the [B, P + T, .] buffers the segment reads."""
        return self.extend(keys, values, self.position + keys.shape[1], keep_from=0)

    def keeping(self, keep: int) -> "KVCache":
        """The cache holding only its last ``keep`` positions (a window's eviction)."""
        return self.extend(self.keys[:, :0], self.values[:, :0], self.position, keep_from=self.position - keep)


def allowed_keys(
    p: int,
    t: int,
    window: int | None,
    device: torch.device | str = "cpu",
    key_start: Tensor | None = None,
) -> Tensor:
    """Boolean mask: query i of the segment (buffer position P + i) may read buffer key j.

    Causal (j <= P + i) and, with a window w, within the last w positions (P + i - j < w). With
    ``key_start`` [B] (leading padding keys of each row's buffer, ``MixerState.padded_keys``) also
    not padding: j >= key_start[b], or j = P + i (a padding query reads only itself).

    Returns:
        [T, P + T], or [B, 1, T, P + T] with key_start (broadcasts over heads).
    """
    rows = torch.arange(t, device=device)[:, None] + p
    cols = torch.arange(p + t, device=device)[None, :]
    mask = cols <= rows
    if window is not None:
        mask = mask & (rows - cols < window)
    if key_start is not None:
        real = cols >= key_start[:, None]  # [B, P + T]
        return (mask & (real[:, None, :] | (cols == rows)))[:, None]  # [B, 1, T, P + T]
    return mask


def decode_tokens(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: KVCache,
    weights: Callable[[Tensor, Tensor, KVCache], Tensor],
    keep: Callable[[KVCache], KVCache],
) -> tuple[Tensor, KVCache]:
    """The recurrent mode of an attention over a KV cache, token by token: append k_t, v_t to the
    cache (in place, O(H K)), weigh its keys, read its values, keep what the next token reads.

    Args:
        q, k: [B, T, H, K];  v: [B, T, H, V], the segment's projections.
        state: the cache before the segment.
        weights: (q_t [B, H, K], keys [B, P + 1, H, K] with the token's own last, the cache before
            the token) -> the token's weights over those keys [B, H, P + 1].
        keep: the cache after the token, from the grown one (a window's eviction, or itself).
    Returns:
        y [B, T, H, V] (before the output projection);  the cache after the segment.
    """
    ys = []
    for s in range(q.shape[1]):
        state.observe()
        grown = state.appended(k[:, s : s + 1], v[:, s : s + 1])
        ys.append(torch.einsum("bhs,bshv->bhv", weights(q[:, s], grown.keys, state), grown.values))
        state = keep(grown)
    return torch.stack(ys, 1), state


def mask_padding_keys(scores: Tensor, key_start: Tensor | None) -> Tensor:
    """Scores [B, H, S] of one decoded token over a buffer of S keys (its own last), padding keys
    (buffer positions < key_start[b]) set to -inf; the own key always stays. None: unchanged."""
    if key_start is None:
        return scores
    cols = torch.arange(scores.shape[-1], device=scores.device)
    real = (cols[None, :] >= key_start[:, None]) | (cols == scores.shape[-1] - 1)  # [B, S]
    return scores.masked_fill(~real[:, None, :], float("-inf"))


def fused_score_limit(head_dim: int, dtype: torch.dtype) -> float:
    """Largest score bound |q| |k| / sqrt(K) at which a fused SDPA backward is sure to stay finite.

    The fused backward recomputes s = q . k / sqrt(K) and evaluates exp(s' - lse) with lse from the
    forward's evaluation. Two evaluations of a K-term dot product differ by at most 2 gamma_K sum_i
    |q_i k_i| <= 2 K u |q| |k| (any summation order; u the unit roundoff of the accumulation, float32
    for 16-bit inputs), and the scaling, max and log-sum-exp add a few u |s| more, so the exponent is
    off by at most (2 K + 8) u B for B = max |q| max |k| / sqrt(K). Keeping that <= 1 (a recomputed
    weight within a factor e of the forward's, at magnitudes where the forward's own rounding is of
    the same order) leaves a factor 88 to the overflow of exp in float32.
    """
    u = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps / 2
    return 1.0 / ((2 * head_dim + 8) * u)


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """``F.scaled_dot_product_attention`` (causal when ``mask`` is None), with a finite backward.

    Args:
        q: [B, H, T, K] queries; k, v: [B, H, S, K] / [B, H, S, V] keys and values (S = T when causal).
        mask: boolean, True where a query may read a key (``allowed_keys``), or None for the causal
            mask of T queries over their own T keys.
    Returns:
        [B, H, T, V].

    When autograd will differentiate through the call and the scores may exceed
    ``fused_score_limit`` (a bound from the row norms of q and k: O(T K)), the same attention is
    computed by an explicit masked softmax, O(T S) memory: the fused kernels' backward can return NaN
    there (module docstring). Scores that large saturate the softmax to one-hot rows, far from
    anything training means to do, so the explicit path is a guard, not a code path in use. The bound
    is compared on the host, so only CPU tensors are guarded (bool() costs nothing there); on another
    device the check would wait for the device every training forward, and the fused kernel runs.
    """
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if needs_grad and q.device.type == "cpu" and q.shape[-2] and k.shape[-2]:
        qn, kn = (
            torch.linalg.vector_norm(z.detach().float() if z.dtype != torch.float64 else z.detach(), dim=-1).amax()
            for z in (q, k)
        )
        bound = qn * kn / math.sqrt(q.shape[-1])
        if bool(bound > fused_score_limit(q.shape[-1], q.dtype)):
            if mask is None:
                mask = allowed_keys(0, q.shape[-2], None, q.device)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
            return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).to(v.dtype) @ v
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


#: grouped attention of a packed segment: documents whose lengths are within this factor of their
#: group's longest share one causal call; documents up to GROUP_SHORT positions long share one
GROUP_LENGTH_RATIO = 0.8
GROUP_SHORT = 64


def document_groups(packing: Packing, skip_first: bool) -> tuple[Tensor, list[tuple[int, int]], Tensor]:
    """How ``packed_attention`` batches the documents of a packed segment: by length.

    The documents (each row's first one too unless ``skip_first``) sorted by length form groups of
    similar lengths (``GROUP_LENGTH_RATIO``); a group of n documents, the longest L positions, is one
    [n, L] batch, each document right-padded with repeats of its first position (a causal query of
    the document never reads them, and their own outputs are dropped).

    Returns:
        gather: [N] long, flat positions b * T + t of the groups' padded batches, one after the other.
        shapes: (n, L) of each group, in that order.
        place: [B * T] long, each grouped token's row in the N gathered rows (-1 for skipped tokens).
    """
    b, t = packing.shape
    device = packing.starts.device
    flags = packing.boundaries.clone()
    flags[:, 0] = True
    begins = torch.nonzero(flags.flatten())[:, 0]  # [D] flat positions of the documents' first tokens
    lengths = torch.diff(begins, append=begins.new_tensor([b * t]))
    if skip_first:
        keep = begins % t != 0
        begins, lengths = begins[keep], lengths[keep]
    order = torch.argsort(lengths, descending=True, stable=True)
    sorted_lengths = lengths[order].tolist()
    gather, shapes, place = [], [], torch.full((b * t,), -1, dtype=torch.long, device=device)
    i, rows = 0, 0
    while i < len(sorted_lengths):
        lead, j = sorted_lengths[i], i + 1
        while j < len(sorted_lengths) and (sorted_lengths[j] >= GROUP_LENGTH_RATIO * lead or lead <= GROUP_SHORT):
            j += 1
        sel = order[i:j]
        first = begins[sel][:, None]  # [n, 1]
        offsets = torch.arange(lead, device=device)
        inside = offsets[None, :] < lengths[sel][:, None]  # [n, L]
        positions = first + offsets[None, :]
        gather.append(torch.where(inside, positions, first).flatten())
        place[positions[inside]] = rows + torch.nonzero(inside.flatten())[:, 0]
        shapes.append((j - i, lead))
        rows += (j - i) * lead
        i = j
    return torch.cat(gather), shapes, place


def packed_attention(
    qkv: Tensor, kbuf: Tensor, vbuf: Tensor, packing: Packing, key_start: Tensor | None = None
) -> Tensor:
    """Causal attention of a packed segment: query t reads key j iff j is in its document (j >=
    starts[b, t]) and j <= t; the cached keys before the segment only from the row's first document
    (which continues them), and of those only the keys at or after ``key_start``.

    Args:
        qkv: [B, T, 3, H, K] the segment's queries, keys and values.
        kbuf, vbuf: [B, P + T, H, K] the P cached keys / values followed by the segment's.
        packing: the segment's documents (non-trivial).
        key_start: [B] leading padding keys of each row's buffer (``MixerState.padded_keys``), or None.
    Returns:
        [B, T, H, K].

    Documents are batched by length (``document_groups``), each group one causal fused call
    (``fused_attention``): the work is that of the documents alone, sum_d L_d^2 / 2 plus the padding
    of a group to its longest, never a [T, T] mask. The rows' first documents read the cache when
    there is one (P > 0 or padding keys): those run as one [B, L_1] batch over the cache and their own
    keys with the explicit mask (``allowed_keys``), the same call an unpacked segment makes.
    """
    b, t, _, h, k = qkv.shape
    p = kbuf.shape[1] - t
    with_cache = p > 0 or key_start is not None
    gather, shapes, place = document_groups(packing, skip_first=with_cache)
    rows = qkv.reshape(b * t, 3 * h * k).index_select(0, gather)  # [N, 3 H K]
    outs, at = [], 0
    for n, length in shapes:
        group = rows[at : at + n * length].view(n, length, 3, h, k).permute(2, 0, 3, 1, 4)  # [3, n, H, L, K]
        outs.append(fused_attention(group[0], group[1], group[2]).transpose(1, 2).reshape(n * length, h * k))
        at += n * length
    if with_cache:
        # the first documents: queries 0 .. L_1 - 1 of every row over the cache and their own keys;
        # a row whose first document is shorter reads no key beyond it (causal), and its queries
        # past it are dropped
        first_len = int((packing.starts == 0).sum(1).max())
        q1 = qkv[:, :first_len, 0].transpose(1, 2)
        k1, v1 = (z[:, : p + first_len].transpose(1, 2) for z in (kbuf, vbuf))
        mask = allowed_keys(p, first_len, None, qkv.device, key_start)
        outs.append(fused_attention(q1, k1, v1, mask).transpose(1, 2).reshape(b * first_len, h * k))
        t_idx = torch.arange(t, device=qkv.device)
        first_rows = at + torch.arange(b, device=qkv.device)[:, None] * first_len + t_idx[None, :]
        place = torch.where(place >= 0, place, first_rows.flatten())
    return torch.cat(outs).index_select(0, place).view(b, t, h, k)


def attention_probs(q: Tensor, kbuf: Tensor, p: int, window: int | None, key_start: Tensor | None = None) -> Tensor:
    """Softmax weights of the segment queries over the buffer keys.

    Args:
        q: [B, T, H, K] queries of the segment.
        kbuf: [B, P + T, H, K] cached keys followed by the segment keys.
        p: number of cached positions P.
        window: None for full causal attention, else the window w.
        key_start: [B] leading padding keys of each row's buffer, or None (see ``allowed_keys``).
    Returns:
        probs: [B, H, T, P + T]; exactly zero outside the allowed keys.
    """
    scores = torch.einsum("bthk,bshk->bhts", q, kbuf) / math.sqrt(q.shape[-1])
    mask = allowed_keys(p, q.shape[1], window, q.device, key_start)
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


class SoftmaxAttention(Mixer):
    """Multi-head causal softmax attention (full causal context; see LocalAttention for a window)."""

    modes = ("sdpa", "dense", "recurrent")
    packing_modes = ("sdpa",)
    time_complexity = "O(n)"
    cache_complexity = "O(n)"

    def __init__(self, config: MixerConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, k = self.n_heads, self.head_dim
        self.qkv = Linear(d_model, 3 * h * k, bias=False)
        self.out = Linear(h * k, d_model, bias=False)

    @property
    def window(self) -> int | None:
        """Positions attended including the current one; None = the whole causal prefix."""
        return None

    # ---------------------------------------------------------------- shared pieces
    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        return q, k, v  # each [B, T, H, K]

    def _start(self, x: Tensor, state: KVCache | None) -> tuple[KVCache, Tensor, KVCache]:
        """Projections of a segment: (state, q [B, T, H, K], the cache with the segment appended,
        whose keys / values [B, P + T, H, .] are the buffers the segment reads, cache first)."""
        if state is None:
            state = self.empty_state(x.shape[0], x.device, x.dtype)
        q, k, v = self._project(x)
        return state, q, state.appended(k, v)

    def _kept(self, total: int) -> int:
        """Past positions the cache keeps once ``total`` positions have been seen."""
        return total if self.window is None else min(total, self.window - 1)

    def _finish(self, grown: KVCache, y: Tensor) -> tuple[Tensor, KVCache]:
        """Output projection of y [B, T, H, V] and the next cache (the last positions of ``grown``)."""
        return self.out(y.flatten(2)), grown.keeping(self._kept(grown.position))

    # ---------------------------------------------------------------- modes
    def forward_sdpa(self, x: Tensor, state: KVCache | None, packing: Packing | None = None) -> tuple[Tensor, KVCache]:
        if packing is not None:
            return self._packed_sdpa(x, state, packing)
        state, q, grown = self._start(x, state)
        kbuf, vbuf = grown.keys, grown.values
        p, t = state.cached_positions(), x.shape[1]
        key_start = state.padded_keys(p)
        qh, kh, vh = (z.transpose(1, 2) for z in (q, kbuf, vbuf))  # [B, H, ., K]
        if p == 0 and self.window is None and key_start is None:
            y = fused_attention(qh, kh, vh)
        else:
            # is_causal aligns the mask to the top-left corner, which is wrong once the queries are
            # offset by P cached keys: pass the causal (and window, padding) mask explicitly.
            y = fused_attention(qh, kh, vh, allowed_keys(p, t, self.window, x.device, key_start))
        return self._finish(grown, y.transpose(1, 2))

    def _packed_sdpa(self, x: Tensor, state: KVCache | None, packing: Packing) -> tuple[Tensor, KVCache]:
        """``sdpa`` of a packed segment (``packed_attention``). The next cache holds the whole row, its
        ``start`` at each row's last document, so later reads mask the earlier documents as padding."""
        if state is None:
            state = self.empty_state(x.shape[0], x.device, x.dtype)
        b, t, _ = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim)
        _, k, v = qkv.unbind(2)
        grown = state.appended(k, v)
        key_start = state.padded_keys(state.cached_positions())
        y, new = self._finish(grown, packed_attention(qkv, grown.keys, grown.values, packing, key_start))
        return y, new  # Mixer.forward starts it at each row's last document (begin_last_documents)

    def forward_dense(self, x: Tensor, state: KVCache | None) -> tuple[Tensor, KVCache]:
        state, q, grown = self._start(x, state)
        kbuf, vbuf = grown.keys, grown.values
        p = state.cached_positions()
        probs = attention_probs(q, kbuf, p, self.window, state.padded_keys(p))  # [B, H, T, P + T]
        mix_a = probs[..., p:]
        # cached positions are not part of the segment's operator: their values enter as a known
        # right-hand side, read through the prefix columns of the softmax
        offset = torch.einsum("bhts,bshv->bthv", probs[..., :p], vbuf[:, :p]) if p else None
        y = solve_dense(MixOperator(mix_a, torch.zeros_like(mix_a)), vbuf[:, p:], offset=offset)
        return self._finish(grown, y)

    def forward_recurrent(self, x: Tensor, state: KVCache | None) -> tuple[Tensor, KVCache]:
        """Token by token: append k_t, v_t to the cache (in place), read it, evict beyond the window."""
        if state is None:
            state = self.empty_state(x.shape[0], x.device, x.dtype)

        def weights(q_t: Tensor, keys: Tensor, before: KVCache) -> Tensor:
            scores = torch.einsum("bhk,bshk->bhs", q_t, keys) / math.sqrt(self.head_dim)
            return torch.softmax(mask_padding_keys(scores, before.padded_keys(keys.shape[1] - 1)), -1)

        y, state = decode_tokens(
            *self._project(x), state, weights, lambda grown: grown.keeping(self._kept(grown.position))
        )
        return self.out(y.flatten(2)), state

    # ---------------------------------------------------------------- surface
    def empty_state(self, batch_size: int, device="cpu", dtype=torch.float32) -> KVCache:
        return KVCache.empty(self.owner, batch_size, self.n_heads, self.head_dim, self.head_dim, device, dtype)

    def materialize(self, x: Tensor) -> MixOperator:
        q, k, _ = self._project(x)
        mix_a = attention_probs(q, k, 0, self.window)
        return MixOperator(mix_a, torch.zeros_like(mix_a))

    def values(self, x: Tensor) -> Tensor:
        """The inputs X the operator mixes: v [B, T, H, K]."""
        return self._project(x)[2]

    def cache_positions(self, n: int) -> int:
        # while the last token is processed the cache holds every earlier position (or the window's)
        return self._kept(max(n - 1, 0))

    def state_size(self, n: int) -> int:
        return self.cache_positions(n) * self.n_heads * 2 * self.head_dim  # a key and a value per position

    def flops_per_token(self, n: int) -> int:
        read = self._kept(max(n - 1, 0)) + 1  # cached positions plus the token itself
        return self.n_heads * read * 2 * self.head_dim  # scores q.k_j + weighted sum of v_j


register_mixer("attention", AttentionConfig, family="attention", ab_form="A = causal softmax(QK^T / sqrt(K)), B = 0")(
    SoftmaxAttention
)
