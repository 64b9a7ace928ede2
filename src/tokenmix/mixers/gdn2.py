"""Gated DeltaNet-2 (GDN-2): KDA with separate channel-wise erase and write gates.

Recurrence per head, state S [K, V] (fla ``ops/gdn2/naive.py``):

    S_t = (I - k_t (b_t ⊙ k_t)ᵀ) Diag(exp(g_t)) S_{t-1} + k_t (w_t ⊙ v_t)ᵀ,      o_t = scale · S_tᵀ q_t,

with a channel-wise erase gate on the key axis b_t [K] = sigmoid(W_b x_t) (2·sigmoid with
``allow_neg_eigval``: the erase may overshoot, as beta < 2 in DeltaNet), a channel-wise write gate on
the value axis w_t [V] = sigmoid(W_w x_t), and KDA's channel-wise log decay g_t [K] <= 0; q, k
L2-normalised, scale = K^-1/2. b_t = w_t = beta_t·1 recovers KDA (mixers/kda.py).

(A, B, R) form, per head, all [T, T] (the family's derivation, mixers/delta_rule.py, with e = b ⊙ k
and w = w_gate ⊙ v). The write gate acts on the value channels, which a T x T matrix cannot hold, so
it is folded into the mixed values:

    X = W ⊙ V  [T, V],   U = (I - B)^{-1} (A X + offset),   A = I,
        B[t, j] = -sum_d b_td k_td k_jd exp(G_td - G_jd)     (j < t; the solve: erase gated per key channel),
        offset_t = -S_0ᵀ (exp(G_t) ⊙ b_t ⊙ k_t),
    O = R U + scale (Q ⊙ exp(G)) S_0,   R[t, j] = scale sum_d q_td k_jd exp(G_td - G_jd)   (j <= t).

The erase gate b only enters B (the solve), the write gate only X, the decay B and R alike.
Modes, chunked form and decode state are the base's channel-wise ones (``ChannelDelta``): chunked
(UT transform), dense, recurrent with S [K, V] per head. The config is KDA's.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from tokenmix.mixers.base import Linear
from tokenmix.mixers.delta_rule import ChannelDelta
from tokenmix.mixers.kda import KDAConfig
from tokenmix.mixers.registry import register_mixer


@register_mixer(
    "gdn2",
    KDAConfig,
    family="delta rule",
    ab_form="X = w ⊙ v, A = I, B[t,j] = -sum_d b_td k_td k_jd exp(G_td-G_jd), "
    "R[t,j] = scale sum_d q_td k_jd exp(G_td-G_jd)",
)
class GDN2(ChannelDelta):
    def __init__(self, config: KDAConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, dk = self.n_heads, self.head_dim
        # the two channel-wise gates replace beta; the base builds beta_proj all the same, so that a
        # seed gives GDN-2 the qkv, out and decay-gate weights it gives KDA
        del self.beta_proj
        self.erase_proj = Linear(d_model, h * dk)  # b_t [H, K]
        self.write_proj = Linear(d_model, h * dk)  # w_t [H, V] (V = K = head_dim)

    def _gates(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The erase gate b [B, T, H, K] in (0, 1) (or (0, 2)) and the write gate w [B, T, H, V] in (0, 1)."""
        b, t, _ = x.shape
        erase = self.erase_proj(x).sigmoid().view(b, t, self.n_heads, self.head_dim)
        if self.config.allow_neg_eigval:
            erase = 2 * erase
        return erase, self.write_proj(x).sigmoid().view(b, t, self.n_heads, self.head_dim)

    def _terms(self, x: Tensor):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        k = F.normalize(k, dim=-1)
        erase, write = self._gates(x)
        return F.normalize(q, dim=-1), k, v, write, erase * k, self._log_decay(x)
