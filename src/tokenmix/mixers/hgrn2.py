"""HGRN-2 (Qin et al. 2024, "HGRN2: Gated Linear RNNs with State Expansion"), in fla's convention.

HGRN-1 is an elementwise gated linear RNN, h_t = f_t ⊙ h_{t-1} + (1 - f_t) ⊙ i_t (fla
``ops/hgrn/naive.py``: h = exp(g) h + x). HGRN-2 expands the state by an outer product: the input
(1 - f_t) ⊙ i_t becomes (1 - f_t) i_tᵀ, so each head holds a [K, V] matrix and reads it with a query.
Per head, with forget gate f_t in (gamma, 1) per key channel and its complement as the key:

    f_t = gamma + (1 - gamma) sigmoid(W_f x_t)                    [K]  (gamma = forget_lower_bound)
    k_t = 1 - f_t,   q_t = swish(W_q x_t),   i_t = W_i x_t        [K], [K], [V]
    S_t = diag(f_t) S_{t-1} + k_t i_tᵀ,    o_t = scale · S_tᵀ q_t,  scale = K^-1/2,    y_t = W_o [o_t]_heads.

Every entry S[c, v] is an HGRN-1 recurrence S_t[c, v] = f_tc S_{t-1}[c, v] + (1 - f_tc) i_tv, with the
forget gate shared along v: that is the state expansion. fla's layer (layers/hgrn2.py) calls
``chunk_gla(q, k = 1 - f, v = i, gk = log f)`` with its default scale K^-1/2; its lower bound gamma
is learned across layers (0 for the first); here it is a fixed config field. The layer's group
norm, short convolution and output gate are left to other layers.

(A, B) forms over the values X = i (mixers/diagonal_decay.py; K = V = head_dim):
    token view:        B = 0, A[t, j] = scale sum_c q_tc (1 - f_jc) prod_{s=j+1..t} f_sc;
    first-order view:  per key channel c, A_c = diag(1 - f_{·,c}), B_c[t, t-1] = f_{t,c}, R_c = diag(q_{·,c})·scale
                       -- each B_c is HGRN-1's recurrence, A_c its input gate; R_c sums the K
                       expanded recurrences, M = sum_c R_c (I - B_c)^{-1} A_c.
Tensor shapes: q, k, log f [B, T, H, K]; i [B, T, H, V]; state S [B, H, K, V]; A_c, B_c, R_c [B, H, K, T, T].

Modes (the base's, diagonal_decay.py): ``chunked`` (ops/chunked_gla.py, per-key-channel decay; the
training default), ``dense`` (state view through the reference solver), ``recurrent`` (token by
token). Decode state: S, H·K·V scalars per batch element, whatever n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.mixers.base import Linear, MixerConfig
from tokenmix.mixers.diagonal_decay import DiagonalDecayMixer, LinearFeatures
from tokenmix.mixers.registry import register_mixer


@dataclass(frozen=True)
class HGRN2Config(MixerConfig):
    chunk_size: int = 64  # C of the chunked form
    forget_lower_bound: float = 0.0  # gamma: f_t = gamma + (1 - gamma) sigmoid(.), in [0, 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("chunk_size")
        if not 0.0 <= self.forget_lower_bound < 1.0:
            raise InputError(f"forget_lower_bound must be in [0, 1), got {self.forget_lower_bound}")


def hgrn2_gates(f_logits: Tensor, lower_bound: float) -> tuple[Tensor, Tensor]:
    """Key k = 1 - f and log forget gate log f of the logits W_f x, f = gamma + (1 - gamma) sigmoid.

    Both are formed without the cancellation of 1 - f when f is close to 1:
    k = (1 - gamma) sigmoid(-logits), log f = logsigmoid(logits) for gamma = 0, else log(gamma + ...).
    """
    k = F.sigmoid(-f_logits)
    if lower_bound == 0.0:
        return k, F.logsigmoid(f_logits)
    return (1.0 - lower_bound) * k, (lower_bound + (1.0 - lower_bound) * F.sigmoid(f_logits)).log()


@register_mixer(
    "hgrn2",
    HGRN2Config,
    family="gated linear recurrence",
    ab_form="B = 0 token view: A = scale sum_c q_c (1 - f_c) prod f_c / first-order state view: "
    "A_c = diag(1 - f_c), B_c = f_c shift (HGRN-1 per key channel), R_c = diag(q_c)·scale",
)
class HGRN2(DiagonalDecayMixer):
    reassociates = True  # the chunked form factors the forget-gate products as exp(G_i - G_j)

    def __init__(self, config: HGRN2Config, d_model: int) -> None:
        super().__init__(config, d_model)
        h, k = self.n_heads, self.head_dim
        self.state_heads, self.key_dim, self.value_dim, self.has_decay = h, k, k, True
        self.qfi = Linear(d_model, 3 * h * k, bias=False)  # W_q, W_f, W_i
        self.out = Linear(h * k, d_model, bias=False)

    def _features(self, x: Tensor) -> LinearFeatures:
        """q = swish(W_q x), k = 1 - f, v = i [B, T, H, K]; log f [B, T, H, K] <= 0."""
        b, t, _ = x.shape
        h, k = self.n_heads, self.head_dim
        q, f, i = self.qfi(x).view(b, t, 3, h, k).unbind(2)
        key, log_f = hgrn2_gates(f, self.config.forget_lower_bound)
        return LinearFeatures(F.silu(q), key, i, log_f, 1.0 / math.sqrt(k))
