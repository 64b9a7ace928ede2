"""ChaCAL, the Chain and Causal Attention Layer (Fagnou et al., EMNLP 2024): a dense recurrence.

With P the causal softmax attention matrix of a head (p_{i,j} = softmax_j(q_i . k_j / sqrt(K)),
j <= i) and a per-head discount gamma in [0, 1), the layer sums every attention path with a
geometric weight:

    Y = (1 - gamma) (P + gamma P^2 + gamma^2 P^3 + ...) V = (1 - gamma) P (I - gamma P)^{-1} V.

P commutes with (I - gamma P)^{-1}, so (I - gamma P) Y = (1 - gamma) P V. P has a diagonal; moving
the diagonal term to the left and dividing row i by 1 - gamma p_ii gives the (A, B) form with a
strictly lower B:

    y_i = [ (1 - gamma) sum_{j <= i} p_ij v_j + gamma sum_{j < i} p_ij y_j ] / (1 - gamma p_ii),
    A = diag(d) (1 - gamma) P,      B = diag(d) gamma strict_lower(P),      d_i = 1 / (1 - gamma p_ii).

Since gamma < 1 and p_ii <= 1, d_i <= 1 / (1 - gamma). gamma = (1 - eps) sigmoid(theta_h) per head,
with theta initialised from the config's gamma (a gamma of 0 starts at a tiny positive value so it can
still be learned). The factor 1 - eps bounds gamma away from 1 *by construction*: a plain sigmoid
rounds to exactly 1 once theta >= 17 in float32 (which training can reach: theta is unbounded), and
then d_0 = 1 / (1 - gamma p_00) = 1 / 0 and every mode returns NaN. With gamma <= 1 - eps, d_i <=
1 / eps and the outputs, convex combinations of the values (the rows of (1 - gamma) P (I - gamma P)^{-1}
are non-negative and sum to 1), stay finite. eps = ``GAMMA_MARGIN`` (1e-4: an effective path length
1 / (1 - gamma) of up to 10^4 steps), or the parameter dtype's epsilon when that is larger
(bfloat16, float16), so that 1 - eps is representable and (1 - eps) sigmoid(theta) < 1 after rounding.

Modes: ``chunked`` (training default, ops/chunked_chacal.py: block forward substitution over chunks
of C queries; the right-hand side of a chunk, A V plus B times the outputs of earlier chunks, is
matmuls against the [C, P + e] softmax rows, then one C x C triangular solve; a hand-written backward
recomputes each chunk's softmax rows from their saved log-sum-exp, so memory stays O(T (K + V))
rather than O(T^2)), ``dense`` (materialise A, B and call the reference solver), ``recurrent`` (token
by token with a cache of the key, value and output of every past position: O(n) per token).

Left padding (mixers/base.py), masked: padding keys are masked out of P, which removes them from A
and from B = gamma P alike (no real output reads a padding value or output); a padding query reads
only itself (p_ii = 1, y_i = v_i: finite).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tokenmix.core.errors import InputError
from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.mixers.attention import attention_probs, mask_padding_keys
from tokenmix.mixers.base import Linear, Mixer, MixerConfig, MixerState
from tokenmix.mixers.registry import register_mixer
from tokenmix.ops.chunked_chacal import chunked_chacal

_GAMMA_FLOOR = 1e-9  # gamma = 0 would put theta at -inf, where sigmoid has zero gradient
GAMMA_MARGIN = 1e-4  # gamma <= 1 - GAMMA_MARGIN always (see the module docstring)
GAMMA_MAX = 1.0 - GAMMA_MARGIN


def gamma_margin(dtype: torch.dtype) -> float:
    """eps of gamma = (1 - eps) sigmoid(theta) for parameters of ``dtype``: GAMMA_MARGIN, or the
    dtype's machine epsilon if larger (1 - GAMMA_MARGIN rounds to 1 in bfloat16 and float16)."""
    return max(GAMMA_MARGIN, torch.finfo(dtype).eps)


@dataclass(frozen=True)
class ChacalConfig(MixerConfig):
    gamma: float = 0.5  # initial path discount of every head, in [0, GAMMA_MAX)
    chunk_size: int = 64  # C of the chunked forward substitution

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.gamma < GAMMA_MAX:
            raise InputError(
                f"gamma must be in [0, {GAMMA_MAX}) (the learned discount is kept at least "
                f"{GAMMA_MARGIN} below 1), got {self.gamma}"
            )
        self.require_positive("chunk_size")


class ChainCache(MixerState):
    """Keys, values and outputs y_j of every past position, oldest first.

    Attributes:
        keys: [B, P, H, K]; values: [B, P, H, V]; outputs: [B, P, H, V]; position: tokens seen.
    """

    def __init__(
        self, owner: str, batch_size: int, position: int, keys: Tensor, values: Tensor, outputs: Tensor
    ) -> None:
        self.owner, self.batch_size, self.position = owner, batch_size, position
        self.keys, self.values, self.outputs = keys, values, outputs

    def tensors(self) -> dict[str, Tensor]:
        return {"keys": self.keys, "values": self.values, "outputs": self.outputs}

    def cached_positions(self) -> int:
        return int(self.keys.shape[1])


class ChainCausalAttention(Mixer):
    """Multi-head ChaCAL with a learned per-head discount."""

    modes = ("chunked", "dense", "recurrent")
    time_complexity = "O(n)"
    cache_complexity = "O(n)"

    def __init__(self, config: ChacalConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, k = self.n_heads, self.head_dim
        self.qkv = Linear(d_model, 3 * h * k, bias=False)
        self.out = Linear(h * k, d_model, bias=False)
        s0 = max(config.gamma, _GAMMA_FLOOR) / (1.0 - GAMMA_MARGIN)  # sigmoid(theta) giving gamma = config's
        self.gamma_logit = nn.Parameter(torch.full((h,), math.log(s0 / (1.0 - s0))))

    @property
    def gamma(self) -> Tensor:
        """Per-head discount [H], in (0, 1 - eps]: (1 - eps) sigmoid(theta), never 1 whatever theta is."""
        return torch.sigmoid(self.gamma_logit) * (1.0 - gamma_margin(self.gamma_logit.dtype))

    # ---------------------------------------------------------------- shared pieces
    def _start(self, x: Tensor, state: ChainCache | None):
        if state is None:
            state = self.empty_state(x.shape[0], x.device, x.dtype)
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)  # [B, T, H, K]
        return state, q, torch.cat([state.keys, k], 1), torch.cat([state.values, v], 1)

    def _finish(self, state: ChainCache, kbuf: Tensor, vbuf: Tensor, y: Tensor) -> tuple[Tensor, ChainCache]:
        new = ChainCache(
            state.owner, state.batch_size, state.position + y.shape[1], kbuf, vbuf, torch.cat([state.outputs, y], 1)
        ).carry_over(state)
        return self.out(y.flatten(2)), new

    def _dense_ab(self, probs: Tensor, p: int) -> tuple[Tensor, Tensor, Tensor]:
        """Row scale d [B, H, T, 1], A and B [B, H, T, T] of the segment from probs [B, H, T, P + T]."""
        g = self.gamma[:, None, None]
        inner = probs[..., p:]
        d = 1.0 / (1.0 - g * inner.diagonal(dim1=-2, dim2=-1)[..., None])
        return d, d * (1.0 - g) * inner, d * g * inner.tril(-1)

    # ---------------------------------------------------------------- modes
    def forward_chunked(self, x: Tensor, state: ChainCache | None) -> tuple[Tensor, ChainCache]:
        state, q, kbuf, vbuf = self._start(x, state)
        qh, kh, vh = (z.transpose(1, 2) for z in (q, kbuf, vbuf))  # [B, H, ., K]
        y = chunked_chacal(
            qh / math.sqrt(self.head_dim),
            kh,
            vh,
            state.outputs.transpose(1, 2),
            self.gamma,
            self.config.chunk_size,
            state.padded_keys(state.cached_positions()),
        )
        return self._finish(state, kbuf, vbuf, y.transpose(1, 2))

    def forward_dense(self, x: Tensor, state: ChainCache | None) -> tuple[Tensor, ChainCache]:
        state, q, kbuf, vbuf = self._start(x, state)
        p = state.cached_positions()
        probs = attention_probs(q, kbuf, p, None, state.padded_keys(p))  # [B, H, T, P + T]
        d, mix_a, mix_b = self._dense_ab(probs, p)
        offset = None
        if p:
            # cached positions enter as a known right-hand side: A on their values, B on their outputs
            g = self.gamma[:, None, None]
            prefix = d * probs[..., :p]
            offset = torch.einsum("bhts,bshv->bthv", (1.0 - g) * prefix, vbuf[:, :p]) + torch.einsum(
                "bhts,bshv->bthv", g * prefix, state.outputs
            )
        y = solve_dense(MixOperator(mix_a, mix_b), vbuf[:, p:], offset=offset)
        return self._finish(state, kbuf, vbuf, y)

    def forward_recurrent(self, x: Tensor, state: ChainCache | None) -> tuple[Tensor, ChainCache]:
        """Token-by-token reference: y_t reads the values and outputs of every cached position."""
        if state is None:
            state = self.empty_state(x.shape[0], x.device, x.dtype)
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        g = self.gamma[None, :, None]  # [1, H, 1]
        ys = []
        for s in range(t):
            state.observe()
            keys = torch.cat([state.keys, k[:, s : s + 1]], 1)  # [B, P + 1, H, K]
            values = torch.cat([state.values, v[:, s : s + 1]], 1)
            scores = torch.einsum("bhk,bshk->bhs", q[:, s], keys) / math.sqrt(self.head_dim)
            scores = mask_padding_keys(scores, state.padded_keys(keys.shape[1] - 1))
            probs = torch.softmax(scores, -1)  # [B, H, P + 1]
            d = 1.0 / (1.0 - g * probs[..., -1:])
            y_t = d * (
                (1.0 - g) * torch.einsum("bhs,bshv->bhv", probs, values)
                + g * torch.einsum("bhs,bshv->bhv", probs[..., :-1], state.outputs)
            )
            ys.append(y_t)
            state = ChainCache(
                state.owner,
                state.batch_size,
                state.position + 1,
                keys,
                values,
                torch.cat([state.outputs, y_t[:, None]], 1),
            ).carry_over(state)
        return self.out(torch.stack(ys, 1).flatten(2)), state

    # ---------------------------------------------------------------- surface
    def empty_state(self, batch_size: int, device="cpu", dtype=torch.float32) -> ChainCache:
        empty = torch.zeros(batch_size, 0, self.n_heads, self.head_dim, device=device, dtype=dtype)
        return ChainCache(self.owner, batch_size, 0, empty, empty.clone(), empty.clone())

    def materialize(self, x: Tensor) -> MixOperator:
        b, t, _ = x.shape
        q, k, _ = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        _, mix_a, mix_b = self._dense_ab(attention_probs(q, k, 0, None), 0)
        return MixOperator(mix_a, mix_b)

    def values(self, x: Tensor) -> Tensor:
        """The inputs X the operator mixes: v [B, T, H, K]."""
        b, t, _ = x.shape
        return self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim)[:, :, 2]

    def cache_positions(self, n: int) -> int:
        return max(n - 1, 0)

    def state_size(self, n: int) -> int:
        return self.cache_positions(n) * self.n_heads * 3 * self.head_dim  # key, value and output

    def flops_per_token(self, n: int) -> int:
        # n scores q.k_j, n value reads through A, n - 1 output reads through B
        return self.n_heads * self.head_dim * (3 * n - 1)


register_mixer(
    "chacal",
    ChacalConfig,
    family="dense recurrence",
    ab_form="A = diag(d)(1 - gamma)P, B = diag(d) gamma strict_lower(P), d = 1/(1 - gamma p_ii)",
)(ChainCausalAttention)
