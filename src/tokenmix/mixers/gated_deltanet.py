"""Gated DeltaNet: the delta rule with a data-dependent scalar decay per head (Yang et al. 2025).

Recurrence per head, state S [K, V] (fla's layout):

    S_t = alpha_t (I - beta_t k_t k_tᵀ) S_{t-1} + beta_t k_t v_tᵀ,        o_t = scale · S_tᵀ q_t,

alpha_t = exp(g_t), g_t = -exp(A_log) · softplus(w_aᵀ x_t + dt_bias) <= 0 (Mamba-2's
parameterisation, as in fla's GatedDeltaNet), beta_t and the L2-normalised q, k as in DeltaNet.

(A, B, R) form: the family's derivation (mixers/delta_rule.py) with e = beta k, w = beta v and one
g per head. With G_t = sum_{i<=t} g_i (so prod_{i=j+1..t} alpha_i = exp(G_t - G_j)) and
S_t = exp(G_t) S_0 + sum_{j<=t} exp(G_t - G_j) k_j u_jᵀ, over the values X = V:

    U = (I - B)^{-1} (A V + offset),  A = diag(beta),  B[t, j] = -beta_t exp(G_t - G_j) k_t·k_j  (j < t),
                                      offset_t = -beta_t exp(G_t) S_0ᵀ k_t,
    O = R U + scale exp(G) ⊙ (Q S_0),  R[t, j] = scale exp(G_t - G_j) q_t·k_j  (j <= t),
    S_T = exp(G_T) S_0 + sum_j exp(G_T - G_j) k_j u_jᵀ.

So the gate only reweights DeltaNet's B and R by the 1-semiseparable decay mask M^S[t, j] =
exp(G_t - G_j) (A is unchanged); g = 0 recovers DeltaNet exactly. Every exponent is G_t - G_j
with j <= t, hence <= 0: the materialised matrices never overflow.

Projections, modes (chunked UT transform with decays inside chunks, dense, recurrent), decode state
and left padding are the base's (``DeltaRuleMixer``) with a decay gate per head.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenmix.core.errors import InputError
from tokenmix.mixers.delta_rule import DeltaRuleMixer
from tokenmix.mixers.deltanet import DeltaNetConfig
from tokenmix.mixers.registry import register_mixer


@dataclass(frozen=True)
class GatedDeltaNetConfig(DeltaNetConfig):
    dt_min: float = 1e-3  # initial softplus(dt_bias) range (Mamba-2 init): decay rates at start
    dt_max: float = 1e-1

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.dt_min <= self.dt_max:
            raise InputError(f"dt_min must be > 0 and <= dt_max, got dt_min={self.dt_min}, dt_max={self.dt_max}")


@register_mixer(
    "gated_deltanet",
    GatedDeltaNetConfig,
    family="delta rule",
    ab_form="A = diag(beta), B[t,j] = -beta_t exp(G_t-G_j) k_t·k_j, R = (Q Kᵀ ⊙ M^S)·scale",
)
class GatedDeltaNet(DeltaRuleMixer):
    decay_gate = "head"
