"""Retention (RetNet, Sun et al. 2023): linear attention with a fixed exponential decay per head.

Per head h, with gamma_h = 1 - 2^(-5-h) (the multi-scale decays of RetNet and of fla's
``naive_retention``), state S [K, V]:

    S_t = gamma_h S_{t-1} + k_t v_tᵀ,        o_t = scale · S_tᵀ q_t,  scale = K^-1/2,      y_t = W_o [o_t]_heads,

i.e. o_t = scale sum_{j<=t} gamma_h^(t-j) (q_t·k_j) v_j. The decay is a constant, not data dependent;
RetNet's xPos rotation, group norm and output gate are left to other layers.

(A, B) forms over the values X = V (mixers/diagonal_decay.py):
    token view:        B = 0, A = (Q Kᵀ ⊙ D_h) · scale,  D_h[t, j] = gamma_h^(t-j) for j <= t;
    first-order view:  per key channel c, A_c = diag(k_{·,c}), B_c[t, t-1] = gamma_h, R_c = diag(q_{·,c}) · scale.
Computed as gated linear attention with the per-head log decay g = log gamma_h (ops/chunked_gla.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tokenmix.mixers.base import Linear, MixerConfig
from tokenmix.mixers.diagonal_decay import DiagonalDecayMixer, LinearFeatures
from tokenmix.mixers.registry import register_mixer


def retention_log_decay(n_heads: int, dtype: torch.dtype = torch.float64, device=None) -> Tensor:
    """log gamma_h = log(1 - 2^(-5-h)) for h = 0..H-1, [H]."""
    h = torch.arange(n_heads, dtype=torch.float64, device=device)
    return torch.log1p(-torch.exp2(-5.0 - h)).to(dtype)


@dataclass(frozen=True)
class RetNetConfig(MixerConfig):
    chunk_size: int = 64  # C of the chunked form

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("chunk_size")


@register_mixer(
    "retnet",
    RetNetConfig,
    family="linear attention",
    ab_form="B = 0 token view: A = (Q Kᵀ ⊙ gamma_h^(t-j))·scale / first-order state view: "
    "A_c = diag(k_c), B_c = gamma_h shift, R_c = diag(q_c)·scale",
)
class RetNet(DiagonalDecayMixer):
    reassociates = True  # the chunked form factors gamma^(t-j) as exp(G_t - G_j)

    def __init__(self, config: RetNetConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, k = self.n_heads, self.head_dim
        self.state_heads, self.key_dim, self.value_dim, self.has_decay = h, k, k, True
        self.qkv = Linear(d_model, 3 * h * k, bias=False)
        self.out = Linear(h * k, d_model, bias=False)

    def _features(self, x: Tensor) -> LinearFeatures:
        """q, k, v [B, T, H, K]; g [B, T, H] = log gamma_h."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        g = retention_log_decay(self.n_heads, x.dtype, x.device).expand(b, t, self.n_heads)
        return LinearFeatures(q, k, v, g, self.head_dim**-0.5)
