"""H-LRU of order m (Dubinin, Orvieto, Effenberger 2026): an m-th order gated linear recurrence per channel.

For every channel c of N = n_heads * head_dim channels, with v_t = W_v x_t and gate logits
W_g x_t + b in R^{N x (m+1)}:

    g_t = normalize(W_g x_t + b)                     over the m + 1 slots of each channel
    z_t = sum_{k=1..m} g_{t,k} z_{t-k} + g_{t,m+1} v_t
    out_t = W_out concat_c (z_t, z_{t-1}, ..., z_{t-m+1})      (the companion-form state, read out whole)

normalize is ``softmax`` (every update a convex combination, so |z_t| <= max |v|) or ``l1``
(tanh, then division by the L1 norm: signed gates with sum |g| <= 1).

(A, B) form per channel, over the values v: A = diag(g_{t,m+1}), B[t, t-k] = g_{t,k} for
k = 1..m (m sub-diagonals). The readout over the last m states is a fixed causal post-map
applied after the mixing, like an SSM's readout.

Modes: ``chunked`` (training default: the window:m pattern solved by
``ops.pattern.chunked.chunked_pattern_solve`` with channels as heads of value dimension 1),
``dense`` (materialise A, B and call the reference solver), ``recurrent`` (token by token; the
state is the last m outputs z per channel).

Left padding (mixers/base.py), masked: a solo run reads zeros for the lags before its first token
(gates normalised over all m + 1 slots, the readout's missing lags 0). Padding tokens get alpha = 0;
as the padding leads, a padding state reads only earlier padding states, so every padding state is
exactly z = 0: a real token reads the very same zeros as a solo run, and the cached lags hold what
a solo run's zero padding holds.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.mixers.base import Linear, Mixer, MixerConfig, MixerState
from tokenmix.mixers.registry import register_mixer
from tokenmix.ops.pattern.chunked import chunked_pattern_solve
from tokenmix.ops.pattern.plan import PatternPlan, plan_pattern
from tokenmix.patterns import get_pattern

NORMALIZATIONS = ("softmax", "l1")
_L1_EPS = 1e-6  # keeps the L1 normalisation finite when every tanh gate is 0
_PLANS_KEPT = 2  # (table, plan) pairs kept per mixer: a training loop uses one per sequence length


@dataclass(frozen=True)
class HLRUConfig(MixerConfig):
    order: int = 2  # m, the number of past states each state reads
    normalization: str = "softmax"  # softmax | l1 (tanh then L1) over the m + 1 gates
    # C of the chunked pattern solve. Small because every channel is its own head with one value:
    # the solve's [C, 2C] band and C x C chunk inverse per channel cost O(T C) each against O(T m)
    # useful work, so at C = 64 they dominate (docs/notes/design-measurements.md). Orders m > C
    # stay exact: reads past the chunk take the far path.
    chunk_size: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.order < 1:
            raise InputError(f"order must be >= 1, got {self.order}")
        if self.normalization not in NORMALIZATIONS:
            raise InputError(f"normalization must be one of {NORMALIZATIONS}, got '{self.normalization}'")
        self.require_positive("chunk_size")


class LagState(MixerState):
    """The last min(position, m) states z per channel, oldest first.

    Attributes:
        outputs: [B, P, N] with P <= m; position: tokens seen.
    """

    def __init__(self, owner: str, batch_size: int, position: int, outputs: Tensor) -> None:
        self.owner, self.batch_size, self.position = owner, batch_size, position
        self.outputs = outputs

    def tensors(self) -> dict[str, Tensor]:
        return {"outputs": self.outputs}

    def cached_positions(self) -> int:
        return int(self.outputs.shape[1])


class HigherOrderLRU(Mixer):
    """H-LRU: per-channel m-th order recurrence with normalised input-dependent gates."""

    modes = ("chunked", "dense", "recurrent")
    time_complexity = "O(m)"
    cache_complexity = "O(m)"
    test_overrides = {"order": 3}

    def __init__(self, config: HLRUConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        self.order = config.order
        self.channels = self.n_heads * self.head_dim
        self.pattern = get_pattern(f"window:{config.order}")
        self.v_proj = Linear(d_model, self.channels, bias=False)
        self.gates = Linear(d_model, self.channels * (config.order + 1))
        self.out = Linear(self.channels * config.order, d_model, bias=False)
        self._plans: OrderedDict = OrderedDict()  # (min(t0, m), T, P) -> (idx [T, W] on the CPU, its plan)

    # ---------------------------------------------------------------- shared pieces
    def _gates(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """v [B, T, N], lag gates beta [B, T, N, m] (slot k-1 = lag k) and input gate alpha [B, T, N]."""
        b, t, _ = x.shape
        # slot-major layout [B, T, m + 1, N] (gate row j * N + c is slot j of channel c): normalising
        # over a strided axis of contiguous channels is several times faster than over a last axis
        # of only m + 1 entries
        logits = self.gates(x).view(b, t, self.order + 1, self.channels)
        if self.config.normalization == "softmax":
            g = torch.softmax(logits, 2)
        else:
            g = torch.tanh(logits)
            g = g / (g.abs().sum(2, keepdim=True) + _L1_EPS)
        return self.v_proj(x), g[:, :, : self.order].transpose(2, 3), g[:, :, self.order]

    def _start(self, x: Tensor, state: LagState | None):
        if state is None:
            state = self.empty_state(x.shape[0], x.device, x.dtype)
        v, beta, alpha = self._gates(x)
        pad = state.padding(x.shape[1])  # [B, T]
        if pad is not None:  # padding states z = 0 exactly (module docstring)
            alpha = alpha.masked_fill(pad[..., None], 0.0)
        return state, v, beta, alpha

    def _lags(self, prefix: Tensor) -> Tensor:
        """[B, m, N]: prefix states left-padded with zeros, index m - k = k positions back."""
        b, p, n = prefix.shape
        return torch.cat([prefix.new_zeros(b, self.order - p, n), prefix], 1)

    def _finish(self, state: LagState, z: Tensor) -> tuple[Tensor, LagState]:
        """Read out (z_t, ..., z_{t-m+1}) for z [B, T, N] and keep the last m states."""
        t, m = z.shape[1], self.order
        full = torch.cat([self._lags(state.outputs), z], 1)  # [B, m + T, N], z_t at m + t
        feats = torch.stack([full[:, m - k : m - k + t] for k in range(m)], -1)  # [B, T, N, m]
        keep = min(state.position + t, m)
        new = LagState(state.owner, state.batch_size, state.position + t, full[:, full.shape[1] - keep :])
        return self.out(feats.flatten(2)), new.carry_over(state)

    @torch.inference_mode(False)  # kept across calls: never inference tensors (structured._LazyPlan)
    def _plan(self, t0: int, t: int, p: int) -> tuple[Tensor, PatternPlan]:
        """Buffer indices idx [T, W] of the window:m table of a segment at ``t0`` after P cached
        states (-1 = none; W = min(m, t0 + T - 1)), and their plan.

        Both are built on the host, from the host table (its causality checked there), once per
        shape: the plan hands the solve its index tensors on the data's device, made once per device,
        so a forward on a GPU reads nothing back and uploads nothing. The table depends on t0 only
        while t0 < m (after that every row reads all m lags at the same buffer offsets), so a chunked
        prefill, whose t0 moves every call, reuses one plan.
        """
        key = (min(t0, self.order), t, p)
        hit = self._plans.get(key)
        if hit is not None:
            self._plans.move_to_end(key)
            return hit
        # absolute neighbour positions of the window:m pattern -> buffer positions (the P cached
        # states are exactly the P positions before t0, so the shift is uniform)
        table = self.pattern.neighbor_table(t0, t0 + t)  # [T, W]
        idx = torch.where(table >= 0, table - t0 + p, table)
        self._plans[key] = hit = (idx, plan_pattern(idx, p, self.config.chunk_size))
        while len(self._plans) > _PLANS_KEPT:
            self._plans.popitem(last=False)
        return hit

    def _dense_ab(self, beta: Tensor, alpha: Tensor) -> tuple[Tensor, Tensor]:
        """A = diag(alpha), B with sub-diagonal k holding g_{t,k}: [B, N, T, T] each."""
        t = alpha.shape[1]
        mix_a = torch.diag_embed(alpha.transpose(1, 2))
        mix_b = torch.zeros_like(mix_a)
        for k in range(1, min(self.order, t - 1) + 1):
            mix_b = mix_b + torch.diag_embed(beta[:, k:, :, k - 1].transpose(1, 2), offset=-k)
        return mix_a, mix_b

    # ---------------------------------------------------------------- modes
    def forward_chunked(self, x: Tensor, state: LagState | None) -> tuple[Tensor, LagState]:
        state, v, beta, alpha = self._start(x, state)
        idx, plan = self._plan(state.position, x.shape[1], state.cached_positions())
        y_prefix = state.outputs[..., None]
        z = chunked_pattern_solve(
            alpha, beta[..., : idx.shape[1]], idx, v[..., None], y_prefix, self.config.chunk_size, plan
        )
        return self._finish(state, z[..., 0])

    def forward_dense(self, x: Tensor, state: LagState | None) -> tuple[Tensor, LagState]:
        state, v, beta, alpha = self._start(x, state)
        t, m, p = x.shape[1], self.order, state.cached_positions()
        offset = None
        if p:
            # lags reaching before the segment read the cached states: a known right-hand side
            lags = self._lags(state.outputs)
            offset = torch.zeros_like(v)
            for k in range(1, m + 1):
                n_read = min(k, t)  # tokens s < k read the state k - s positions before the segment
                offset[:, :n_read] += beta[:, :n_read, :, k - 1] * lags[:, m - k : m - k + n_read]
            offset = offset[..., None]
        z = solve_dense(MixOperator(*self._dense_ab(beta, alpha)), v[..., None], offset=offset)
        return self._finish(state, z[..., 0])

    def forward_recurrent(self, x: Tensor, state: LagState | None) -> tuple[Tensor, LagState]:
        """Token-by-token reference: z_t from the m cached states, then the readout of the new state."""
        state, v, beta, alpha = self._start(x, state)
        m = self.order
        outs = []
        for s in range(x.shape[1]):
            state.observe()
            lags = self._lags(state.outputs)  # [B, m, N]
            z_t = alpha[:, s] * v[:, s]
            for k in range(1, m + 1):
                z_t = z_t + beta[:, s, :, k - 1] * lags[:, m - k]
            feats = torch.stack([z_t] + [lags[:, m - k] for k in range(1, m)], -1)  # [B, N, m]
            outs.append(self.out(feats.flatten(1)))
            keep = min(state.position + 1, m)
            window = torch.cat([lags, z_t[:, None]], 1)
            state = LagState(
                state.owner, state.batch_size, state.position + 1, window[:, window.shape[1] - keep :]
            ).carry_over(state)
        return torch.stack(outs, 1), state

    # ---------------------------------------------------------------- surface
    def empty_state(self, batch_size: int, device="cpu", dtype=torch.float32) -> LagState:
        return LagState(
            self.owner, batch_size, 0, torch.zeros(batch_size, 0, self.channels, device=device, dtype=dtype)
        )

    def materialize(self, x: Tensor) -> MixOperator:
        _, beta, alpha = self._gates(x)
        return MixOperator(*self._dense_ab(beta, alpha))

    def values(self, x: Tensor) -> Tensor:
        """The inputs X the operator mixes: v [B, T, N, 1] (channels as heads of value dimension 1)."""
        return self.v_proj(x)[..., None]

    def cache_positions(self, n: int) -> int:
        return min(max(n - 1, 0), self.order)

    def state_size(self, n: int) -> int:
        return self.cache_positions(n) * self.channels

    def flops_per_token(self, n: int) -> int:
        return self.channels * (self.cache_positions(n) + 1)  # m lag gates and one input gate per channel


register_mixer(
    "hlru",
    HLRUConfig,
    family="gated linear recurrence",
    ab_form="A = diag(g_{t,m+1}), B = m sub-diagonals g_{t,k} (per channel)",
)(HigherOrderLRU)
