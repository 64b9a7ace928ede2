"""Real-Gated Linear Recurrent Unit (RG-LRU; De et al. 2024, "Griffin: Mixing Gated Linear Recurrences
with Local Attention", §2.4): the recurrence of Hawk and Griffin.

Per channel of the recurrence width D_in = n_heads · head_dim, with u_t = W_u x_t [D_in] the input of
the unit (Griffin feeds it through a linear map and a short convolution; the convolution is left to
other layers) and the paper's equations (its x_t is our u_t):

    r_t = sigmoid(W_a u_t + b_a),   i_t = sigmoid(W_x u_t + b_x)          recurrence and input gates [D_in]
    a_t = a^(c r_t),   a = sigmoid(Lambda),   c = 8                       (log a_t = c r_t log sigmoid(Lambda))
    h_t = a_t ⊙ h_{t-1} + sqrt(1 - a_t²) ⊙ (i_t ⊙ u_t),                  y_t = W_o h_t.

W_a and W_x are block diagonal with n_heads blocks of head_dim x head_dim (as in the paper). Lambda
is initialised so that a^c is uniform in [0.9, 0.999] (the paper's initialisation).
sqrt(1 - a_t²) is formed as sqrt(-expm1(2 log a_t)), exact when a_t is close to 1.

(A, B) form over the values X = u, per channel (first order, diagonal; no state expansion):
    A = diag(sqrt(1 - a_t²) ⊙ i_t),   B[t, t-1] = a_t,   y = W_o (I - B)^{-1} A u,
with A, B [B, D_in, T, T]. As a member of the gated-linear family (mixers/diagonal_decay.py) it is one
head per channel with K = V = 1: q = 1, k = sqrt(1 - a_t²) i_t, v = u_t, log decay g = log a_t,
scale 1, state [B, D_in, 1, 1] = h.

Modes: ``chunked`` (training default: ops/selective_scan.py with N = 1, Delta = r_t, A = c log a,
B_t = C_t = 1 and inputs sqrt(1 - a_t²) i_t u_t -- the recurrence's own arithmetic in time blocks,
linear in T), ``dense`` (the state view through the reference solver) and ``recurrent`` (token by
token), both the family's. Decode state: h, D_in scalars per batch element, whatever n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.core.errors import InputError
from tokenmix.mixers.base import Linear, MixerConfig
from tokenmix.mixers.diagonal_decay import DiagonalDecayMixer, LinearFeatures, MatrixState
from tokenmix.mixers.registry import register_mixer
from tokenmix.ops.selective_scan import selective_scan


@dataclass(frozen=True)
class RGLRUConfig(MixerConfig):
    chunk_size: int = 64  # tokens per block of the selective scan
    c: float = 8.0  # the paper's fixed exponent scale: a_t = a^(c r_t)
    a_min: float = 0.9  # a^c is initialised uniform in [a_min, a_max]
    a_max: float = 0.999

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("chunk_size", "c")
        if not 0.0 < self.a_min <= self.a_max < 1.0:
            raise InputError(f"need 0 < a_min <= a_max < 1, got a_min={self.a_min}, a_max={self.a_max}")


def rg_lru_log_a_init(channels: int, c: float, a_min: float, a_max: float) -> Tensor:
    """Lambda [channels] with a^c = sigmoid(Lambda)^c uniform in [a_min, a_max]."""
    a = (a_min + (a_max - a_min) * torch.rand(channels, dtype=torch.float64)) ** (1.0 / c)
    return torch.log(a / (1.0 - a)).float()


@register_mixer(
    "rg_lru",
    RGLRUConfig,
    family="gated linear recurrence",
    ab_form="A = diag(sqrt(1 - a_t²) i_t), B = a_t shift, a_t = sigmoid(Lambda)^(c r_t) (per channel)",
)
class RGLRU(DiagonalDecayMixer):
    packing_modes = ()  # its own chunked kernel has no document boundaries: packed rows run piece by piece

    def __init__(self, config: RGLRUConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, hd = self.n_heads, self.head_dim
        d_in = h * hd
        self.state_heads, self.key_dim, self.value_dim, self.has_decay = d_in, 1, 1, True
        self.in_proj = Linear(d_model, d_in, bias=False)  # u = W_u x
        bound = 1.0 / math.sqrt(hd)
        self.gate_weight = nn.Parameter(torch.empty(h, hd, 2 * hd).uniform_(-bound, bound))  # blocks of W_a | W_x
        self.gate_bias = nn.Parameter(torch.zeros(2, d_in))  # b_a, b_x
        self.Lambda = nn.Parameter(rg_lru_log_a_init(d_in, config.c, config.a_min, config.a_max))
        self.out = Linear(d_in, d_model, bias=False)

    def _gates(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """u, r, the input multiplier sqrt(1 - a_t²) ⊙ i_t [B, T, D_in], and c log a [D_in] (log a_t = r · it)."""
        b, t, _ = x.shape
        h, hd = self.n_heads, self.head_dim
        u = self.in_proj(x)
        logits = torch.einsum("bthi,hio->btho", u.view(b, t, h, hd), self.gate_weight)  # [B, T, H, 2 hd]
        r_logit, i_logit = logits.view(b, t, h, 2, hd).unbind(3)
        r = torch.sigmoid(r_logit.reshape(b, t, -1) + self.gate_bias[0])
        i = torch.sigmoid(i_logit.reshape(b, t, -1) + self.gate_bias[1])
        c_log_a = self.config.c * F.logsigmoid(self.Lambda)  # [D_in], < 0
        log_a_t = r * c_log_a
        # clamped at the smallest normal only where r_t underflows to 0 (a_t = 1): keeps sqrt's gradient finite
        one_minus_a2 = (-torch.expm1(2.0 * log_a_t)).clamp_min(torch.finfo(u.dtype).tiny)
        return u, r, torch.sqrt(one_minus_a2) * i, c_log_a

    def _features(self, x: Tensor) -> LinearFeatures:
        """One head per channel: q = 1, k = sqrt(1 - a_t²) i_t, v = u [B, T, D_in, 1]; g = log a_t [B, T, D_in]."""
        u, r, mult, c_log_a = self._gates(x)
        return LinearFeatures(torch.ones_like(u)[..., None], mult[..., None], u[..., None], r * c_log_a, 1.0)

    def forward_chunked(self, x: Tensor, state: MatrixState | None) -> tuple[Tensor, MatrixState]:
        u, r, mult, c_log_a = self._gates(x)
        xin = mult * u
        pad = None if state is None else state.padding(x.shape[1])
        if pad is not None:  # inert padding: no write (input 0) and identity transition (r = 0: a_t = 1)
            xin, r = xin.masked_fill(pad[..., None], 0.0), r.masked_fill(pad[..., None], 0.0)
        s0 = None if state is None else state.memory[..., 0]  # [B, D_in, 1]
        ones = x.new_ones(x.shape[0], x.shape[1], 1)
        y, h = selective_scan(xin, r, c_log_a[:, None], ones, ones, s0, self.config.chunk_size)
        return self.out(y), self._next_state(state, h[..., None], x.shape[1], x.shape[0])

    def mixing_core(self, x: Tensor):
        """(fn, inputs): the scan of x without the projections and gates (for benchmarks)."""
        u, r, mult, c_log_a = self._gates(x)
        ones = x.new_ones(x.shape[0], x.shape[1], 1)
        leaves = tuple(z.detach().requires_grad_() for z in (mult * u, r, c_log_a[:, None]))
        block = self.config.chunk_size
        return (lambda xv, d, a_: selective_scan(xv, d, a_, ones, ones, None, block)), leaves
