"""Log-linear Mamba-2 (Guo, Yang, Goel, Xing, Dao, Kim 2025, "Log-Linear Attention" §3.1): the
hierarchical Fenwick states of mixers/log_linear.py on Mamba-2's own parameterisation (mixers/mamba2.py).

Per head h (P = head_dim channels x_t, B_t, C_t [N] shared by the heads, one group), with
dt_t = softplus(w_hᵀ x_t + dt_bias_h), g_t = -dt_t exp(A_log_h) <= 0 and level scales
lambda_t^(l) = softplus(W_lambda x_t + b_lambda)^(l) >= 0, l = 0..max_levels-1:

    o_t = sum_{s <= t} lambda_t^(l(t,s)) exp(G_t - G_s) (C_t·B_s) dt_s x_s  (+ D_h x_t),   y_t = W_o [o_t]_heads,

l(t, s) = bit_length(t XOR s) the Fenwick level (tokenmix.patterns.fenwick_level). With every
lambda_t^(l) = 1 this is exactly ``mamba2`` (same in_proj / A_log / dt_bias / D / out parameters).

(A, B) form over the values X = x·dt [B, T, H, P], token view:

    A = C Bᵀ ⊙ M^S ⊙ M^H   [B, H, T, T],   M^S[t,s] = exp(G_t - G_s),   M^H[t,s] = lambda_t^(l(t,s)),   B = 0.

The hierarchy sits in M^H: each Fenwick level is a lambda-scaled semiseparable block of A, which is
what makes the chunked mode O(T log T). No solve (B = 0). The D skip is pointwise in time, outside A.

State view (recurrent mode and every mode's final state): the Fenwick bucket states
``levels`` [B, H, bit_length(n), N, P] (slot l-1 = bucket l of position n), O(log n) of them,
updated by ops/chunked_log_linear.log_linear_step (q = C, k = B, v = x·dt, scale = 1).

Modes (inherited from mixers/log_linear.py, all on ops/chunked_log_linear.py): ``chunked``
(level-wise chunks, O(T log T)), ``dense`` (materialised A through core.operator.solve_dense),
``recurrent`` (token by token on the Fenwick states). Left padding by row groups (the level map
follows each row's own clock), as log_linear.

fla reference: ``naive_log_linear_attn(q=C, k=B, v=x·dt, g, level_scales=lambda, scale=1.0)`` with
one key group (checks/log_linear_attention.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.mixers.base import Linear, Mixer
from tokenmix.mixers.fenwick_levels import FenwickState
from tokenmix.mixers.log_linear import LogLinearAttention, LogLinearConfig
from tokenmix.mixers.mamba2 import inverse_softplus_dt
from tokenmix.mixers.registry import register_mixer


@dataclass(frozen=True)
class LogLinearMamba2Config(LogLinearConfig):
    state_dim: int = 64  # N, Mamba-2's state expansion (d_state), as mamba2's default
    d_skip: bool = True  # add D_h x_t to the output

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("state_dim")


@register_mixer(
    "log_linear_mamba2",
    LogLinearMamba2Config,
    family="log-linear attention",
    ab_form="B = 0 token view: A = C Bᵀ ⊙ exp(G_t - G_s) ⊙ lambda_t^(l(t,s)) (Fenwick level scales on Mamba-2's mask)",
)
class LogLinearMamba2(LogLinearAttention):
    """log_linear's modes and Fenwick state on Mamba-2's projections (q = C, k = B, v = x·dt)."""

    test_overrides = {"state_dim": 4}

    def __init__(self, config: LogLinearMamba2Config, d_model: int) -> None:
        Mixer.__init__(self, config, d_model)  # not LogLinearAttention's projections: Mamba-2's below
        h, p, n = self.n_heads, self.head_dim, config.state_dim
        self.key_dim = n
        self.in_proj = Linear(d_model, h * p + 2 * n + h, bias=False)  # x, B, C, dt (as mamba2)
        self.A_log = nn.Parameter(torch.empty(h).uniform_(1, 16).log())
        self.dt_bias = nn.Parameter(inverse_softplus_dt(h, config.dt_min, config.dt_max))
        self.D = nn.Parameter(torch.ones(h)) if config.d_skip else None
        self._init_level_scales(d_model)  # every lambda starts at 1: as Mamba-2
        self.out = Linear(h * p, d_model, bias=False)
        self.scale = 1.0

    def _split(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        h, p, n = self.n_heads, self.head_dim, self.config.state_dim
        xs, bs, cs, dt = self.in_proj(x).split([h * p, n, n, h], dim=-1)
        return xs.view(*x.shape[:2], h, p), bs, cs, F.softplus(dt + self.dt_bias)

    def _project(self, x: Tensor, start: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """q = C, k = B [B, T, H, N] (shared by the heads), v = x·dt [B, T, H, P], g [B, T, H],
        lambda [B, T, H, max_levels] for tokens start..start+T-1."""
        b, t, _ = x.shape
        h, n = self.n_heads, self.config.state_dim
        xs, bs, cs, dt = self._split(x)
        q, k = cs[:, :, None, :].expand(b, t, h, n), bs[:, :, None, :].expand(b, t, h, n)
        g = -dt * self.A_log.exp()
        return q, k, xs * dt[..., None], g, self._level_scales(x, start)

    def _skip(self, x: Tensor, y: Tensor) -> Tensor:
        """y + W_o [D_h x_t]: the pointwise skip (W_o is linear without bias, so it adds after it)."""
        if self.D is None:
            return y
        h, p = self.n_heads, self.head_dim
        xs = F.linear(x, self.in_proj.weight[: h * p]).view(*x.shape[:2], h, p)
        return y + self.out((self.D[:, None] * xs).flatten(2))

    # ---------------------------------------------------------------- modes (log_linear's + the skip)
    def forward_chunked(self, x: Tensor, state: FenwickState | None) -> tuple[Tensor, FenwickState]:
        y, state = super().forward_chunked(x, state)
        return self._skip(x, y), state

    def forward_dense(self, x: Tensor, state: FenwickState | None) -> tuple[Tensor, FenwickState]:
        y, state = super().forward_dense(x, state)
        return self._skip(x, y), state

    def forward_recurrent(self, x: Tensor, state: FenwickState | None) -> tuple[Tensor, FenwickState]:
        y, state = super().forward_recurrent(x, state)
        return self._skip(x, y), state

    # ---------------------------------------------------------------- surface (the rest: log_linear's, K = N, V = P)
    def values(self, x: Tensor) -> Tensor:
        """The inputs X the operator mixes: x·dt [B, T, H, P]."""
        xs, _, _, dt = self._split(x)
        return xs * dt[..., None]
