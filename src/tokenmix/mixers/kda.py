"""Kimi Delta Attention (KDA, Kimi Linear, Moonshot AI 2025): the gated delta rule with a decay per key channel.

Recurrence per head, state S [K, V] (fla's layout, fla ``ops/kda/naive.py``):

    S_t = (I - beta_t k_t k_tᵀ) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_tᵀ,      o_t = scale · S_tᵀ q_t,

g_t [K] = -exp(A_log) ⊙ softplus(W_g x_t + dt_bias) <= 0: Gated DeltaNet's Mamba-2 gate made
channel-wise (fla's KDA layer makes W_g low-rank and adds a short convolution and an output gate;
those belong to other layers). beta_t = sigmoid(w_betaᵀ x_t), or 2·sigmoid with ``allow_neg_eigval``;
q, k L2-normalised; scale = K^-1/2.

(A, B, R) form over the values X = V: the family's derivation (mixers/delta_rule.py) with
e = beta k, w = beta v and G_t = sum_{i<=t} g_i a vector [K]. Per head, all [T, T]:

    U = (I - B)^{-1} (A V + offset),   A = diag(beta),
        B[t, j] = -beta_t sum_d k_td k_jd exp(G_td - G_jd)          (j < t; the infinite-order solve),
        offset_t = -beta_t S_0ᵀ (exp(G_t) ⊙ k_t),
    O = R U + scale (Q ⊙ exp(G)) S_0,   R[t, j] = scale sum_d q_td k_jd exp(G_td - G_jd)   (j <= t),
    S_T = exp(G_T) ⊙ S_0 + sum_j (exp(G_T - G_j) ⊙ k_j) u_jᵀ.

The channel-wise decay is a GLA-style decayed inner product inside every entry of B and R: the
mixing stays one T x T solve per head. With g_t = g_t·1 (one value per head) B and R are Gated
DeltaNet's exactly.

Modes, decode state and left padding are the base's channel-wise ones (``ChannelDelta``,
mixers/delta_rule.py): ``chunked`` (UT transform with per-channel decays inside chunks,
ops/chunked_channel_delta.py), ``dense``, ``recurrent``; S [K, V] per head, whatever n.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from tokenmix.mixers.delta_rule import ChannelDelta
from tokenmix.mixers.gated_deltanet import GatedDeltaNetConfig
from tokenmix.mixers.registry import register_mixer


@dataclass(frozen=True)
class KDAConfig(GatedDeltaNetConfig):
    chunk_size: int = 32  # C of the channel-wise chunked form (why 32: docs/notes/design-measurements.md)


@register_mixer(
    "kda",
    KDAConfig,
    family="delta rule",
    ab_form="A = diag(beta), B[t,j] = -beta_t sum_d k_td k_jd exp(G_td-G_jd), "
    "R[t,j] = scale sum_d q_td k_jd exp(G_td-G_jd)",
)
class KDA(ChannelDelta):
    def _terms(self, x: Tensor):
        q, k, v, beta, g = self._project(x)  # the family's projections, g per key channel
        return q, k, v, beta, beta[..., None] * k, g
