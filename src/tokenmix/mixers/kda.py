"""Kimi Delta Attention (KDA, Kimi Linear, Moonshot AI 2025): the gated delta rule with a decay per key channel.

Recurrence per head, state S [K, V] (fla's layout, fla ``ops/kda/naive.py``):

    S_t = (I - beta_t k_t k_tᵀ) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_tᵀ,      o_t = scale · S_tᵀ q_t,

g_t [K] = -exp(A_log) ⊙ softplus(W_g x_t + dt_bias) <= 0: Gated DeltaNet's Mamba-2 gate made
channel-wise (fla's KDA layer makes W_g low-rank and adds a short convolution and an output gate;
those belong to other layers). beta_t = sigmoid(w_betaᵀ x_t), or 2·sigmoid with ``allow_neg_eigval``;
q, k L2-normalised; scale = K^-1/2.

(A, B, R) form over the values X = V, derived as in mixers/gated_deltanet.py with G_t = sum_{i<=t} g_i
now a vector [K] (ops/chunked_channel_delta.py). Per head, all [T, T]:

    U = (I - B)^{-1} (A V + offset),   A = diag(beta),
        B[t, j] = -beta_t sum_d k_td k_jd exp(G_td - G_jd)          (j < t; the infinite-order solve),
        offset_t = -beta_t S_0ᵀ (exp(G_t) ⊙ k_t),
    O = R U + scale (Q ⊙ exp(G)) S_0,   R[t, j] = scale sum_d q_td k_jd exp(G_td - G_jd)   (j <= t),
    S_T = exp(G_T) ⊙ S_0 + sum_j (exp(G_T - G_j) ⊙ k_j) u_jᵀ.

The channel-wise decay is a GLA-style decayed inner product inside every entry of B and R: the
mixing stays one T x T solve per head. With g_t = g_t·1 (one value per head) B and R are Gated
DeltaNet's exactly.

Modes: ``chunked`` (UT transform with per-channel decays inside chunks, ops/chunked_channel_delta.py),
``dense`` (materialised A, B, R and core.operator.solve_dense), ``recurrent`` (token by token,
ops.chunked_channel_delta.channel_delta_step). Decode state: S [K, V] per head, whatever n.

The shared machinery (``ChannelDelta``) serves any rule S_t = (I - k_t e_tᵀ) Diag(exp g_t) S_{t-1} + k_t w_tᵀ
with w_t = a_t ⊙ x_t; Gated DeltaNet-2 (mixers/gdn2.py) is the other instance. Left padding is masked
(mixers/base.py): a padding token gets a = 0, e = 0 and g = 0, so it neither writes, erases nor decays.
"""
from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.mixers.deltanet import DeltaNet, DeltaState
from tokenmix.mixers.gated_deltanet import GatedDeltaNetConfig
from tokenmix.mixers.registry import register_mixer
from tokenmix.ops.chunked_channel_delta import channel_delta_operator, channel_delta_step, chunked_channel_delta_rule
from tokenmix.mixers.base import Linear


@dataclass(frozen=True)
class KDAConfig(GatedDeltaNetConfig):
    chunk_size: int = 32  # C: fastest whole-mixer fwd+bwd at 8k in a fresh process (docs/results.md, issue 22)


class ChannelDelta(DeltaNet):
    """Modes of the channel-wise gated delta rule over ``_terms``; subclasses define the projections."""

    @abstractmethod
    def _terms(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """q, k [B, T, H, K]; values X [B, T, H, V]; write gate a ([B, T, H] or [B, T, H, V]);
        erase key e [B, T, H, K]; log decay g [B, T, H, K]. The write value is w = a ⊙ X."""

    def _segment_terms(self, x: Tensor, state: DeltaState | None):
        """``_terms`` of a segment with its padding tokens inert: a = 0, e = 0, g = 0."""
        q, k, vals, a, e, g = self._terms(x)
        pad = None if state is None else state.padding(x.shape[1])  # [B, T]
        if pad is not None:
            a = a.masked_fill(pad.view(*pad.shape, *([1] * (a.dim() - 2))), 0.0)
            e = e.masked_fill(pad[..., None, None], 0.0)
            g = g.masked_fill(pad[..., None, None], 0.0)
        return q, k, vals, a, e, g

    @staticmethod
    def _write(vals: Tensor, a: Tensor) -> Tensor:
        return vals * (a if a.dim() == vals.dim() else a[..., None])

    # ---------------------------------------------------------------- modes
    def forward_chunked(self, x: Tensor, state: DeltaState | None) -> tuple[Tensor, DeltaState]:
        q, k, vals, a, e, g = self._segment_terms(x, state)
        s0 = None if state is None else state.memory
        o, s = chunked_channel_delta_rule(q, k, self._write(vals, a), e, g, self.scale, s0, self.config.chunk_size)
        return self.out(o.flatten(2)), self._next_state(state, s, x.shape[1], x.shape[0])

    def forward_dense(self, x: Tensor, state: DeltaState | None) -> tuple[Tensor, DeltaState]:
        """U = (I - B)^{-1} (A X + offset) through the reference solver, then O = R U (+ S_0 readout)."""
        b, t, _ = x.shape
        q, k, vals, a, e, g = self._segment_terms(x, state)
        mix_a, xs = self._mix_a(a, vals)
        mix_b, readout, decay = channel_delta_operator(q, k, e, g, self.scale)  # decay [B,H,T,K]
        decay_t = decay.transpose(1, 2)  # [B, T, H, K]
        s0 = None if state is None else state.memory
        offset = None if s0 is None else -torch.einsum("bthk,bhkv->bthv", e * decay_t, s0)
        u = solve_dense(MixOperator(mix_a, mix_b), xs, offset=offset)  # [B, T, H, V] pseudo-values
        o = (readout @ u.transpose(1, 2)).transpose(1, 2)
        cum = g.cumsum(1)
        s = torch.einsum("bthk,bthv->bhkv", k * (cum[:, -1:] - cum).exp(), u)
        if s0 is not None:
            o = o + self.scale * torch.einsum("bthk,bhkv->bthv", q * decay_t, s0)
            s = s + decay[:, :, -1, :, None] * s0
        return self.out(o.flatten(2)), self._next_state(state, s, t, b)

    def forward_recurrent(self, x: Tensor, state: DeltaState | None) -> tuple[Tensor, DeltaState]:
        b, t, _ = x.shape
        state = self.empty_state(b, x.device, x.dtype) if state is None else state
        q, k, vals, a, e, g = self._segment_terms(x, state)
        w = self._write(vals, a)
        outs = []
        for i in range(t):
            state.observe()
            o_t, s = channel_delta_step(state.memory, q[:, i], k[:, i], w[:, i], e[:, i], g[:, i], self.scale)
            outs.append(o_t)
            state = self._next_state(state, s, 1, b)
        return self.out(torch.stack(outs, 1).flatten(2)), state

    # ---------------------------------------------------------------- surface
    def _mix_a(self, a: Tensor, vals: Tensor) -> tuple[Tensor, Tensor]:
        """(A [B, H, T, T], the values it multiplies [B, T, H, V]): A = diag(a) over X for a scalar
        gate per head; a channel-wise write gate is folded into the values (A = I over a ⊙ X)."""
        if a.dim() == vals.dim():
            ones = a.new_ones(a.shape[0], a.shape[2], a.shape[1])
            return torch.diag_embed(ones), vals * a
        return torch.diag_embed(a.transpose(1, 2)), vals

    def materialize(self, x: Tensor) -> MixOperator:
        """A, B, R over the values of ``x`` [B, T, D] (zero initial state)."""
        q, k, vals, a, e, g = self._terms(x)
        mix_a, _ = self._mix_a(a, vals)
        mix_b, readout, _ = channel_delta_operator(q, k, e, g, self.scale)
        return MixOperator(mix_a, mix_b, readout)

    def values(self, x: Tensor) -> Tensor:
        """The inputs X the operator mixes, [B, T, H, V] (see ``_mix_a``)."""
        _, _, vals, a, _, _ = self._terms(x)
        return self._mix_a(a, vals)[1]

    def flops_per_token(self, n: int) -> int:
        # per head: the K x V decay, the erase read e_tᵀ S, the rank-1 write and the read-out S_tᵀ q_t
        return 4 * self.n_heads * self.head_dim * self.head_dim


@register_mixer("kda", KDAConfig, family="delta rule",
                ab_form="A = diag(beta), B[t,j] = -beta_t sum_d k_td k_jd exp(G_td-G_jd), "
                        "R[t,j] = scale sum_d q_td k_jd exp(G_td-G_jd)")
class KDA(ChannelDelta):
    config_cls = KDAConfig

    def __init__(self, config: KDAConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, dk = self.n_heads, self.head_dim
        self.a_proj = Linear(d_model, h * dk, bias=False)
        self.A_log = nn.Parameter(torch.empty(h).uniform_(1, 16).log())
        dt = torch.exp(torch.empty(h * dk).uniform_(math.log(config.dt_min), math.log(config.dt_max)))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^{-1}(dt)

    def _log_decay(self, x: Tensor) -> Tensor:
        """g [B, T, H, K] = -exp(A_log) softplus(a_proj x + dt_bias) <= 0, one decay per key channel."""
        b, t, _ = x.shape
        raw = F.softplus(self.a_proj(x) + self.dt_bias).view(b, t, self.n_heads, self.head_dim)
        return -self.A_log.exp()[:, None] * raw

    def _terms(self, x: Tensor):
        q, k, v, beta, g = self._project(x)  # DeltaNet's projections, with the channel-wise g above
        return q, k, v, beta, beta[..., None] * k, g
