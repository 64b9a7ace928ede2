"""Causal linear attention without normalisation (Katharopoulos et al. 2020; fla's
``naive_recurrent_linear_attn`` with ``normalize=False``).

Per head, with phi the feature map applied to queries and keys (identity by default):

    o_t = scale · sum_{j<=t} (phi(q_t)·phi(k_j)) v_j,      state S_t = S_{t-1} + phi(k_t) v_tᵀ [K, V],
    o_t = scale · S_tᵀ phi(q_t),  scale = K^-1/2,          y_t = W_o [o_t]_heads.

(A, B) forms over the values X = V (mixers/diagonal_decay.py):
    token view:        B = 0, A = (Q Kᵀ ⊙ L) · scale  (L = lower ones incl. the diagonal);
    first-order view:  per key channel c, A_c = diag(k_{·,c}), B_c = the shift (B_c[t, t-1] = 1),
                       R_c = diag(q_{·,c}) · scale: a running sum, no decay.
It is the gated linear attention recurrence with g = 0, computed by ops/chunked_gla.py (chunked),
the state view and core.operator.solve_dense (dense), and ops/recurrent_gla.py (recurrent).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.mixers.base import Linear, MixerConfig
from tokenmix.mixers.diagonal_decay import DiagonalDecayMixer, LinearFeatures
from tokenmix.mixers.registry import register_mixer

FEATURE_MAPS = {
    "identity": lambda x: x,
    "elu_plus_one": lambda x: F.elu(x) + 1.0,  # Katharopoulos et al.: positive features
    "relu": F.relu,
}


@dataclass(frozen=True)
class LinearAttentionConfig(MixerConfig):
    chunk_size: int = 64  # C of the chunked form
    feature_map: str = "identity"  # phi on q and k: identity | elu_plus_one | relu

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("chunk_size")
        if self.feature_map not in FEATURE_MAPS:
            raise InputError(f"feature_map must be one of {sorted(FEATURE_MAPS)}, got '{self.feature_map}'")


@register_mixer(
    "linear_attention",
    LinearAttentionConfig,
    family="linear attention",
    ab_form="B = 0 token view: A = (Q Kᵀ ⊙ L)·scale / first-order state view: A_c = diag(k_c), "
    "B_c = shift, R_c = diag(q_c)·scale",
)
class LinearAttention(DiagonalDecayMixer):
    def __init__(self, config: LinearAttentionConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, k = self.n_heads, self.head_dim
        self.state_heads, self.key_dim, self.value_dim, self.has_decay = h, k, k, False
        self.qkv = Linear(d_model, 3 * h * k, bias=False)
        self.out = Linear(h * k, d_model, bias=False)
        self.feature_map = FEATURE_MAPS[config.feature_map]

    def _features(self, x: Tensor) -> LinearFeatures:
        """q, k, v [B, T, H, K]; no decay."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        return LinearFeatures(self.feature_map(q), self.feature_map(k), v, None, self.head_dim**-0.5)
