"""Gated DeltaNet: the delta rule with a data-dependent scalar decay per head (Yang et al. 2025).

Recurrence per head, state S [K, V] (fla's layout):

    S_t = alpha_t (I - beta_t k_t k_tᵀ) S_{t-1} + beta_t k_t v_tᵀ,        o_t = scale · S_tᵀ q_t,

alpha_t = exp(g_t), g_t = -exp(A_log) · softplus(w_aᵀ x_t + dt_bias) <= 0 (Mamba-2's
parameterisation, as in fla's GatedDeltaNet), beta_t and the L2-normalised q, k as in DeltaNet.

(A, B, R) derivation. Let G_t = sum_{i<=t} g_i (so prod_{i=j+1..t} alpha_i = exp(G_t - G_j)) and
guess S_t = exp(G_t) S_0 + sum_{j<=t} exp(G_t - G_j) k_j u_jᵀ for pseudo-values u_j [V]. Then

    alpha_t S_{t-1} = exp(G_t) S_0 + sum_{j<t} exp(G_t - G_j) k_j u_jᵀ,

and the recurrence S_t = alpha_t S_{t-1} + k_t beta_t (v_t - alpha_t S_{t-1}ᵀ k_t)ᵀ holds with

    u_t = beta_t v_t - beta_t alpha_t S_{t-1}ᵀ k_t
        = beta_t v_t - beta_t exp(G_t) S_0ᵀ k_t - sum_{j<t} beta_t exp(G_t - G_j) (k_t·k_j) u_j.

Stacked over t, over the values X = V:

    U = (I - B)^{-1} (A V + offset),  A = diag(beta),  B[t, j] = -beta_t exp(G_t - G_j) k_t·k_j  (j < t),
                                      offset_t = -beta_t exp(G_t) S_0ᵀ k_t,
    O = R U + scale exp(G) ⊙ (Q S_0),  R[t, j] = scale exp(G_t - G_j) q_t·k_j  (j <= t),
    S_T = exp(G_T) S_0 + sum_j exp(G_T - G_j) k_j u_jᵀ.

So the gate only reweights DeltaNet's B and R by the 1-semiseparable decay mask M^S[t, j] =
exp(G_t - G_j) (A is unchanged); g = 0 recovers DeltaNet exactly. Every exponent is G_t - G_j
with j <= t, hence <= 0: the materialised matrices never overflow.

Modes: ``chunked`` (UT transform with decays inside chunks, ops/chunked_delta.py), ``dense``,
``recurrent``; shared with mixers/deltanet.py, which this class extends with the gate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.core.errors import InputError
from tokenmix.mixers.registry import register_mixer
from tokenmix.mixers.deltanet import DeltaNet, DeltaNetConfig
from tokenmix.mixers.base import Linear


@dataclass(frozen=True)
class GatedDeltaNetConfig(DeltaNetConfig):
    dt_min: float = 1e-3  # initial softplus(dt_bias) range (Mamba-2 init): decay rates at start
    dt_max: float = 1e-1

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.dt_min <= self.dt_max:
            raise InputError(f"dt_min must be > 0 and <= dt_max, got dt_min={self.dt_min}, dt_max={self.dt_max}")


@register_mixer("gated_deltanet", GatedDeltaNetConfig, family="delta rule",
                ab_form="A = diag(beta), B[t,j] = -beta_t exp(G_t-G_j) k_t·k_j, R = (Q Kᵀ ⊙ M^S)·scale")
class GatedDeltaNet(DeltaNet):
    config_cls = GatedDeltaNetConfig

    def __init__(self, config: GatedDeltaNetConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h = self.n_heads
        self.a_proj = Linear(d_model, h, bias=False)
        self.A_log = nn.Parameter(torch.empty(h).uniform_(1, 16).log())
        dt = torch.exp(torch.empty(h).uniform_(math.log(config.dt_min), math.log(config.dt_max)))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^{-1}(dt)

    def _log_decay(self, x: Tensor) -> Tensor:
        """g [B, T, H] = -exp(A_log) softplus(a_proj x + dt_bias) <= 0."""
        return -self.A_log.exp() * F.softplus(self.a_proj(x) + self.dt_bias)

    def flops_per_token(self, n: int) -> int:
        # DeltaNet's three K x V multiply-adds plus the decay of S
        return 4 * self.n_heads * self.head_dim * self.head_dim
