"""Gated linear attention (GLA, Yang et al. 2024, "Gated Linear Attention Transformers with
Hardware-Efficient Training"), in fla's convention.

Per head, with a data-dependent log decay per key channel, state S [K, V]:

    gk_t = logsigmoid(W_g2 W_g1 x_t + b_g) / normaliser                 [K], <= 0 (low-rank gate)
    S_t  = diag(exp(gk_t)) S_{t-1} + k_t v_tᵀ,    o_t = scale · S_tᵀ q_t,  scale = K^-1/2,
    y_t  = W_o [o_t]_heads.

The normaliser (fla's gate_logit_normalizer, 16) keeps the decays close to 1 at initialisation.
fla's GLA layer adds an output gate and a group norm; those are left to other layers.

(A, B) forms over the values X = V (mixers/diagonal_decay.py):
    token view:        B = 0, A[t, j] = scale sum_c q_tc k_jc exp(G_tc - G_jc) (G = cumsum of gk);
    first-order view:  per key channel c, A_c = diag(k_{·,c}), B_c[t, t-1] = exp(gk_{t,c}),
                       R_c = diag(q_{·,c}) · scale.
Chunked form: ops/chunked_gla.py with a per-key-channel decay (its intra-chunk scores use only
exp of differences G_i - G_j, j <= i, so strong gates cannot overflow).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

from tokenmix.mixers.base import Linear, MixerConfig
from tokenmix.mixers.diagonal_decay import DiagonalDecayMixer, LinearFeatures
from tokenmix.mixers.registry import register_mixer


@dataclass(frozen=True)
class GLAConfig(MixerConfig):
    chunk_size: int = 64  # C of the chunked form
    gate_low_rank_dim: int = 16  # rank of the gate projection W_g2 W_g1
    gate_logit_normalizer: float = 16.0  # gk = logsigmoid(.) / normaliser

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("chunk_size", "gate_low_rank_dim", "gate_logit_normalizer")


@register_mixer(
    "gla",
    GLAConfig,
    family="linear attention",
    ab_form="B = 0 token view: A = scale sum_c q_c k_c exp(G_c(t) - G_c(j)) / first-order state view: "
    "A_c = diag(k_c), B_c = exp(gk_c) shift, R_c = diag(q_c)·scale",
)
class GLA(DiagonalDecayMixer):
    reassociates = True  # the chunked form factors the decay products as exp(G_i - G_j)

    def __init__(self, config: GLAConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, k = self.n_heads, self.head_dim
        self.state_heads, self.key_dim, self.value_dim, self.has_decay = h, k, k, True
        self.qkv = Linear(d_model, 3 * h * k, bias=False)
        self.gate_down = Linear(d_model, config.gate_low_rank_dim, bias=False)
        self.gate_up = Linear(config.gate_low_rank_dim, h * k, bias=True)
        self.out = Linear(h * k, d_model, bias=False)

    def _features(self, x: Tensor) -> LinearFeatures:
        """q, k, v [B, T, H, K]; gk [B, T, H, K] <= 0."""
        b, t, _ = x.shape
        h, k = self.n_heads, self.head_dim
        q, kk, v = self.qkv(x).view(b, t, 3, h, k).unbind(2)
        gk = F.logsigmoid(self.gate_up(self.gate_down(x))).view(b, t, h, k) / self.config.gate_logit_normalizer
        return LinearFeatures(q, kk, v, gk, k**-0.5)
