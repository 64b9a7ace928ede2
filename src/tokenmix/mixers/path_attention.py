"""PaTH attention (Yang et al., "PaTH Attention: Position Encoding via Accumulating Householder
Transformations", 2025): softmax attention whose relative position encoding is a data-dependent
product of Householder-like transforms.

Per head, with q_t, k_t, v_t [K] projections of the layer input, a unit vector w_t = normalize(W_w x_t)
[K] and beta_t = 2 sigmoid(b_t) in (0, 2) (``allow_neg_eigval``, as in the paper: H_t then has the
eigenvalue 1 - beta_t in (-1, 1), a reflection at beta = 2; else beta_t = sigmoid(b_t) in (0, 1)):

    H_t = I - beta_t w_t w_t^T,
    s_{i,j} = q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(K)      (s_{i,i} = q_i . k_i / sqrt(K)),
    a_{i,.} = softmax_j( s_{i,j} [+ G_i - G_j] ),    y_i = sum_{j <= i} a_{i,j} v_j,

with the optional forget gate of FoX (``use_forget_gate``, the paper's PaTH-FoX): G_t = sum_{s<=t} log f_s,
f_t = sigmoid(w_f . x_t + b_f). (fla's kernels and naive reference add G_i - G_j *before* the
1/sqrt(K) scaling, i.e. their gate is f^(1/sqrt K); this mixer uses the FoX form above, and the
cross-check feeds fla g = sqrt(K) log f.)

(A, B) form: A = the PaTH softmax matrix [a_{i,j}], [B, H, T, T], causal and row-stochastic;
B = 0. The data-dependent transforms sit inside A's logits: each logit is a bilinear form through
a product of up to i - j rank-one updates of I (a product of generalized Householder matrices).

Modes:
    ``chunked`` (training default) -- ops/chunked_path.py: blocks of C = chunk_size tokens in the
        UT/WY form, grouped G at a time (G ~ sqrt(N) of the N = T / C blocks, G C <= 512), read by
        row groups of G C queries in a two-level walk (inside a group along the diagonals, the
        earlier groups and the cache in one matmul); here, per block of C queries, the gate, the
        padding mask, the softmax over its P + i1 keys and the read of the values. Row groups are
        checkpointed in training (ops/query_blocks.py): memory O(G C n) (no [T, T] logits), shared
        inputs O(n); per token O(n K) for the logits and O((G + N / G) K^2) for the transforms.
    ``dense`` -- the reference: transforms applied one token at a time to every earlier key
        (ops/chunked_path.sequential_path_scores), the materialised A and the reference solver.
    ``recurrent`` -- token by token over the decode cache below.

Decode cache (``PathCache``): for every past position j < t its key *already transformed to the
last seen position*, k~_j = H_{t-1} ... H_{j+1} k_j, its value, and (with the forget gate) log f_j:
keys [B, P, H, K], values [B, P, H, K], gates [B, P, H]. A decoded token t first applies H_t to
every cached key (k~_j <- k~_j - beta_t (w_t . k~_j) w_t, O(P H K)), appends its own k_t, and reads
s_{t,j} = q_t . k~_j / sqrt(K): the cumulative transforms are folded into the cache, so no K x K
matrix and no per-token transform is kept. While token n - 1 is decoded the cache holds n - 1
positions, H (2K [+1]) scalars each (cache_positions / state_size).

Left padding (mixers/base.py), masked as in attention: padding keys are masked out of every row,
a padding query reads only its own key; padding tokens are inert (beta = 0: H = I, log f = 0), so
no real logit sees a padding transform (no real pair spans one anyway).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.mixers.attention import allowed_keys, mask_padding_keys
from tokenmix.mixers.base import Linear, MixerConfig, MixerState
from tokenmix.mixers.registry import register_mixer
from tokenmix.mixers.row_attention import RowAttention, Segment, exclusive_reverse_cumsum, gate_bias
from tokenmix.ops.chunked_path import ChunkedPath, householder_step, sequential_path_scores
from tokenmix.ops.query_blocks import by_query_blocks


@dataclass(frozen=True)
class PathAttentionConfig(MixerConfig):
    chunk_size: int = 64  # C, tokens per block of the chunked mode
    allow_neg_eigval: bool = True  # beta in (0, 2) (the paper's choice) instead of (0, 1)
    use_forget_gate: bool = False  # PaTH-FoX: add FoX's G_i - G_j to the logits

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("chunk_size")


class PathCache(MixerState):
    """PaTH decode cache (module docstring).

    Attributes:
        keys: [B, P, H, K] cached keys transformed to the last seen position (H_{t-1} ... H_{j+1} k_j).
        values: [B, P, H, K].
        gates: [B, P, H] log forget gates, or None without the forget gate.
        position: tokens seen.
    """

    def __init__(
        self, owner: str, batch_size: int, position: int, keys: Tensor, values: Tensor, gates: Tensor | None
    ) -> None:
        self.owner, self.batch_size, self.position = owner, batch_size, position
        self.keys, self.values, self.gates = keys, values, gates

    def tensors(self) -> dict[str, Tensor]:
        out = {"keys": self.keys, "values": self.values}
        if self.gates is not None:
            out["gates"] = self.gates
        return out

    def cached_positions(self) -> int:
        return self.keys.shape[1]

    def numel_per_batch(self) -> int:
        per = self.keys.shape[2] * (self.keys.shape[3] + self.values.shape[3])
        if self.gates is not None:
            per += self.gates.shape[2]
        return self.keys.shape[1] * per

    def after(self, keys: Tensor, values: Tensor, gates: Tensor | None, position: int) -> "PathCache":
        return PathCache(self.owner, self.batch_size, position, keys, values, gates).carry_over(self)


class PathAttention(RowAttention):
    """Multi-head PaTH attention (optionally with the FoX forget gate)."""

    def __init__(self, config: PathAttentionConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, k = self.n_heads, self.head_dim
        self.qkv = Linear(d_model, 3 * h * k, bias=False)
        self.w_proj = Linear(d_model, h * k, bias=False)  # w_t = normalize(w_proj(x_t)) per head
        self.beta_proj = Linear(d_model, h, bias=True)  # beta_t = (2) sigmoid(beta_proj(x_t))
        self.fgate = Linear(d_model, h, bias=True) if config.use_forget_gate else None
        self.out = Linear(h * k, d_model, bias=False)

    # ---------------------------------------------------------------- shared pieces
    def transforms(self, x: Tensor, state: MixerState | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """w [B, T, H, K] (unit), beta [B, T, H] and log f [B, T, H] (None without the gate) of a
        segment; padding positions of ``state`` get beta = 0 and log f = 0 (inert)."""
        b, t, _ = x.shape
        w = F.normalize(self.w_proj(x).view(b, t, self.n_heads, self.head_dim), dim=-1)
        beta = torch.sigmoid(self.beta_proj(x)) * (2.0 if self.config.allow_neg_eigval else 1.0)
        logf = F.logsigmoid(self.fgate(x)) if self.fgate is not None else None
        pad = state.padding(t) if state is not None else None
        if pad is not None:
            beta = beta.masked_fill(pad[..., None], 0.0)
            logf = logf.masked_fill(pad[..., None], 0.0) if logf is not None else None
        return w, beta, logf

    def _start(self, x: Tensor, state: PathCache | None):
        if state is None:
            state = self.empty_state(x.shape[0], x.device, x.dtype)
        q, k, v = self._project(x)
        w, beta, logf = self.transforms(x, state)
        gbuf = torch.cat([state.gates, logf], 1) if logf is not None else None  # [B, P + T, H]
        return state, q, k, v, w, beta, logf, gbuf

    def _logits_to_probs(
        self, scores: Tensor, gsum: Tensor | None, p: int, i0: int, i1: int, key_start: Tensor | None
    ) -> Tensor:
        """Softmax rows of queries i0 .. i1 - 1 from scores [B, H, i1 - i0, P + i1] (unscaled)."""
        scores = scores / math.sqrt(self.head_dim)
        if gsum is not None:
            scores = scores + gate_bias(gsum, p, i0, i1)
        mask = allowed_keys(p + i0, i1 - i0, None, scores.device, key_start)
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)

    # ---------------------------------------------------------------- modes
    def forward_chunked(self, x: Tensor, state: PathCache | None) -> tuple[Tensor, PathCache]:
        """Row groups of G C queries (``by_query_blocks``, checkpointed in training), each giving its
        logits block by block (``ChunkedPath.rows``); per block of C queries the gate, the padding
        mask, the softmax over its P + i1 keys and the read of the values."""
        state, q, k, v, w, beta, logf, gbuf = self._start(x, state)
        p, t = state.cached_positions(), x.shape[1]
        key_start = state.padded_keys(p)
        gsum = gbuf.cumsum(1) if gbuf is not None else None
        vbuf = torch.cat([state.values, v], 1)
        vh = vbuf.transpose(1, 2).contiguous()  # [B, H, P + T, V], read by every block
        blocked = ChunkedPath.build(q, k, w, beta, state.keys, self.config.chunk_size, 1.0 / math.sqrt(self.head_dim))

        def group(i0: int, i1: int) -> Tensor:
            ys, vg = [], vh[:, :, : p + i1]
            for j0, scores in blocked.rows(i0, i1):  # [B, H, j1 - j0, P + j1], scaled, -inf above the diagonal
                j1 = j0 + scores.shape[2]
                if gsum is not None:
                    scores = scores + gate_bias(gsum, p, j0, j1)
                if key_start is not None:
                    mask = allowed_keys(p + j0, j1 - j0, None, scores.device, key_start)
                    scores = scores.masked_fill(~mask, float("-inf"))
                ys.append(torch.softmax(scores, -1) @ vg[:, :, : p + j1])  # [B, H, j1 - j0, V]
            return torch.cat(ys, 2).transpose(1, 2)  # [B, i1 - i0, H, V]

        records = torch.is_grad_enabled() and (x.requires_grad or any(z.requires_grad for z in self.parameters()))
        y = by_query_blocks(group, t, blocked.group_tokens, records)
        return self.out(y.flatten(2)), state.after(blocked.keys(), vbuf, gbuf, state.position + t)

    # ---------------------------------------------------------------- segments
    def _segment(self, x: Tensor, state: PathCache | None, mode: str) -> Segment:
        """The dense segment (the chunked mode runs its own driver, ``forward_chunked``)."""
        if mode != "dense":
            raise ValueError(f"PathAttention._segment serves the dense mode only, got {mode!r}")
        state, q, k, v, w, beta, logf, gbuf = self._start(x, state)
        p, t = state.cached_positions(), x.shape[1]
        key_start = state.padded_keys(p)
        gsum = gbuf.cumsum(1) if gbuf is not None else None
        vbuf = torch.cat([state.values, v], 1)
        scores, keys = sequential_path_scores(q, k, w, beta, state.keys)
        probs = self._logits_to_probs(scores, gsum, p, 0, t, key_start)
        return Segment(
            p,
            t,
            lambda i0, i1: probs[:, :, i0:i1, : p + i1],
            vbuf,
            lambda: state.after(keys, vbuf, gbuf, state.position + t),
        )

    # ---------------------------------------------------------------- decode
    def forward_recurrent(self, x: Tensor, state: PathCache | None) -> tuple[Tensor, PathCache]:
        """Token by token: apply H_t to the cached keys, append k_t (and v_t, log f_t), softmax read."""
        state, q, k, v, w, beta, logf, _ = self._start(x, state)
        ys = []
        for s in range(x.shape[1]):
            state.observe()
            p = state.cached_positions()
            keys = torch.cat([householder_step(state.keys, w[:, s], beta[:, s]), k[:, s : s + 1]], 1)
            values = torch.cat([state.values, v[:, s : s + 1]], 1)
            gates = torch.cat([state.gates, logf[:, s : s + 1]], 1) if logf is not None else None
            scores = torch.einsum("bhk,bshk->bhs", q[:, s], keys) / math.sqrt(self.head_dim)
            if gates is not None:
                scores = scores + exclusive_reverse_cumsum(gates, 1).transpose(1, 2)
            scores = mask_padding_keys(scores, state.padded_keys(p))
            ys.append(torch.einsum("bhs,bshv->bhv", torch.softmax(scores, -1), values))
            state = state.after(keys, values, gates, state.position + 1)
        return self.out(torch.stack(ys, 1).flatten(2)), state

    # ---------------------------------------------------------------- surface
    def empty_state(self, batch_size: int, device="cpu", dtype=torch.float32) -> PathCache:
        h, k = self.n_heads, self.head_dim
        gates = torch.zeros(batch_size, 0, h, device=device, dtype=dtype) if self.fgate is not None else None
        return PathCache(
            self.owner,
            batch_size,
            0,
            torch.zeros(batch_size, 0, h, k, device=device, dtype=dtype),
            torch.zeros(batch_size, 0, h, k, device=device, dtype=dtype),
            gates,
        )

    def state_size(self, n: int) -> int:
        per = 2 * self.head_dim + (1 if self.fgate is not None else 0)  # transformed key, value (, log f)
        return self.cache_positions(n) * self.n_heads * per

    def flops_per_token(self, n: int) -> int:
        cached = self.cache_positions(n)
        gate = cached + 1 if self.fgate is not None else 0
        # H_t on every cached key (w.k~ and the update), then q.k~_j and the sum of v_j (, the gate cumsum)
        return self.n_heads * (cached * 2 * self.head_dim + (cached + 1) * 2 * self.head_dim + gate)


register_mixer(
    "path_attention",
    PathAttentionConfig,
    family="attention",
    ab_form="A = causal softmax(q_i^T H_i..H_{j+1} k_j / sqrt(K) [+ G_i - G_j]), H_t = I - beta_t w_t w_t^T; B = 0",
)(PathAttention)
