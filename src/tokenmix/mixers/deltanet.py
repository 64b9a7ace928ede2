"""DeltaNet: linear attention whose memory is corrected toward each new value (the delta rule).

Recurrence per head (Schlag et al. 2021; chunkwise training from Yang et al. 2024, "Parallelizing
Linear Transformers with the Delta Rule over Sequence Length"), state S [K, V]:

    S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}ᵀ k_t)ᵀ,        o_t = scale · S_tᵀ q_t,

with q, k L2-normalised, scale = K^-1/2 and beta_t = sigmoid(w_betaᵀ x_t) in (0, 1), or
2·sigmoid in (0, 2) with ``allow_neg_eigval`` (the transition I - beta k kᵀ then has an eigenvalue
down to -1, Grazzi et al. 2025, which lets the layer track parities).

(A, B) form over the values X = V (framework.md §2.3; the family's derivation with g = 0,
mixers/delta_rule.py). Writing S_t = sum_{j<=t} k_j u_jᵀ,

    u_t = beta_t v_t - sum_{j<t} beta_t (k_t·k_j) u_j
    =>  U = (I - B)^{-1} A V,   A = diag(beta),   B[t, j] = -beta_t k_t·k_j  (j < t),
        O = R U,                R = (Q Kᵀ ⊙ L) · scale,   L = lower ones incl. the diagonal.

B is dense and data-dependent: an infinite-order recurrence on the pseudo-values u. An initial
state S_0 adds the known right-hand side -beta_t S_0ᵀ k_t to row t and scale · S_0ᵀ q_t to o_t.

Symbols: q, k, v, beta as in the papers; S is fla's ``h`` / ``initial_state`` ([K, V] layout);
``mix_a``/``mix_b``/``readout`` are the framework's A/B/R.

Projections, modes (chunked UT transform, dense, recurrent), decode state and left padding are the
base's (``DeltaRuleMixer``, mixers/delta_rule.py) without a decay gate.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenmix.mixers.base import MixerConfig
from tokenmix.mixers.delta_rule import DeltaRuleMixer
from tokenmix.mixers.registry import register_mixer


@dataclass(frozen=True)
class DeltaNetConfig(MixerConfig):
    chunk_size: int = 64  # C of the chunkwise UT-transform form
    allow_neg_eigval: bool = False  # beta = 2·sigmoid in (0, 2) instead of sigmoid in (0, 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("chunk_size")


@register_mixer(
    "deltanet",
    DeltaNetConfig,
    family="delta rule",
    ab_form="A = diag(beta), B[t,j] = -beta_t k_t·k_j (dense), R = (Q Kᵀ ⊙ L)·scale",
)
class DeltaNet(DeltaRuleMixer):
    """The delta-rule base without a decay gate (the module docstring has the recurrence and its form)."""
