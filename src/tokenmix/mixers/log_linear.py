"""Log-linear attention over Mamba-2 (Guo, Yang, Goel, Xing, Dao, Kim 2025; framework.md §6.1).

Per head, with Mamba-2's scalar decay alpha_t = exp(g_t) and per-level scales lambda_t^(l) >= 0:

    o_t = scale · sum_{s <= t} lambda_t^(l(t,s)) (prod_{i=s+1..t} alpha_i) (q_t·k_s) v_s,

l(t, s) = bit_length(t XOR s) the Fenwick level (0 for s = t; tokenmix.patterns.fenwick_level,
which equals fla's naive ``construct_level_mask``). With every lambda level equal this is Mamba-2.

(A, B) form over the values X = V, token view:

    A = (Q Kᵀ ⊙ M^S ⊙ M^H) · scale,   M^S[t,s] = exp(G_t - G_s),   M^H[t,s] = lambda_t^(l(t,s)),   B = 0.

The O(T log T) cost comes from the structure of A (each level is a scaled semiseparable matrix),
not from sparsity. State view (recurrent mode): O(log n) Fenwick bucket states [K, V], merged by
the lssb rule of §6.1 (ops/chunked_log_linear.py documents the update and the state layout).

Parameters: q = C, k = B, v = x projections of Mamba-2 (no dt scaling of v), g_t =
-exp(A_log) softplus(w_aᵀ x_t + dt_bias), lambda_t = softplus(W_lambda x_t + b_lambda) for
``max_levels`` levels, b_lambda initialised so that every lambda starts near 1 (i.e. near Mamba-2).
Symbols: ``levels`` is the Fenwick state, level_scales = lambda, as in fla's naive_log_linear_attn.

Modes: ``chunked`` (level-wise chunks, ops/chunked_log_linear.py), ``dense`` (materialised A and
core.operator.solve_dense), ``recurrent`` (token by token on the Fenwick states).

Left padding (mixers/base.py) by row groups: the level map l(t, s) is not translation invariant, so
each row needs its own clock; rows with equal padding run together, unpadded, on their own states.
The modes, the Fenwick state and the level scales are mixers/fenwick_levels.py's (shared with
log_linear_mamba2 and log_linear_gated_deltanet); this file states the projections and the op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.core.errors import InputError
from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.mixers.base import Linear, Mixer, MixerConfig
from tokenmix.mixers.fenwick_levels import FenwickLevelMixer, check_fenwick_config
from tokenmix.mixers.registry import register_mixer
from tokenmix.ops.chunked_log_linear import (
    chunked_log_linear_attention,
    final_levels,
    initial_levels_readout,
    log_linear_operator,
    log_linear_step,
)


@dataclass(frozen=True)
class LogLinearConfig(MixerConfig):
    chunk_size: int = 64  # C of the level-wise chunked form, a power of two
    max_levels: int = 24  # lambda levels; sequences up to 2^(max_levels - 1) tokens
    dt_min: float = 1e-3  # initial softplus(dt_bias) range (Mamba-2 init)
    dt_max: float = 1e-1

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fenwick_config(self.chunk_size, self.max_levels)
        if not 0 < self.dt_min <= self.dt_max:
            raise InputError(f"dt_min must be > 0 and <= dt_max, got dt_min={self.dt_min}, dt_max={self.dt_max}")


@register_mixer(
    "log_linear",
    LogLinearConfig,
    family="log-linear attention",
    ab_form="A = (Q Kᵀ ⊙ M^S ⊙ M^H)·scale (Fenwick level scales), B = 0",
)
class LogLinearAttention(FenwickLevelMixer, Mixer):
    """Mamba-2's decay and q, k, v with per-level scales; the modes and state are FenwickLevelMixer's."""

    _step = staticmethod(log_linear_step)

    def __init__(self, config: LogLinearConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, k = self.n_heads, self.head_dim
        self.key_dim = k
        self.qkv = Linear(d_model, 3 * h * k, bias=False)
        self.a_proj = Linear(d_model, h, bias=False)
        self.A_log = nn.Parameter(torch.empty(h).uniform_(1, 16).log())
        dt = torch.exp(torch.empty(h).uniform_(math.log(config.dt_min), math.log(config.dt_max)))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^{-1}(dt)
        self._init_level_scales(d_model)
        self.out = Linear(h * k, d_model, bias=False)
        self.scale = k**-0.5

    # ---------------------------------------------------------------- the op's inputs and forms
    def _project(self, x: Tensor, start: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """q, k, v [B, T, H, K], g [B, T, H], lambda [B, T, H, max_levels] for tokens start..start+T-1."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        g = -self.A_log.exp() * F.softplus(self.a_proj(x) + self.dt_bias)
        return q, k, v, g, self._level_scales(x, start)

    def _level_inputs(self, x: Tensor, start: int) -> tuple[Tensor, ...]:
        return self._project(x, start)

    def _chunked(self, inputs: tuple[Tensor, ...], init: Tensor | None, start: int) -> tuple[Tensor, Tensor]:
        return chunked_log_linear_attention(*inputs, self.scale, init, start, self.config.chunk_size)

    def _dense(self, inputs: tuple[Tensor, ...], init: Tensor | None, start: int) -> tuple[Tensor, Tensor]:
        """Y = A V through the reference solver (B = 0); the initial Fenwick states enter as the offset."""
        q, k, v, g, lam = inputs
        mix_a = log_linear_operator(q, k, g, lam, self.scale, start)
        offset = None if init is None else initial_levels_readout(q, g, lam, self.scale, start, init)
        o = solve_dense(MixOperator(mix_a, torch.zeros_like(mix_a)), v, offset=offset)
        return o, final_levels(k, v, g, start, init)

    # ---------------------------------------------------------------- surface
    def materialize(self, x: Tensor) -> MixOperator:
        """A = (Q Kᵀ ⊙ M^S ⊙ M^H)·scale and B = 0 over the values v of ``x`` [B, T, D]."""
        q, k, _, g, lam = self._project(x, 0)
        mix_a = log_linear_operator(q, k, g, lam, self.scale)
        return MixOperator(mix_a, torch.zeros_like(mix_a))

    def values(self, x: Tensor) -> Tensor:
        """The inputs X the operator mixes: v [B, T, H, K]."""
        b, t, _ = x.shape
        return self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim)[:, :, 2]

    def flops_per_token(self, n: int) -> int:
        # Token t = n - 1 with L = bit_length(t) stored levels: decay L·K·V, sentinel k vᵀ K·V,
        # per-level reads (L + 1)·K·V, lambda weighting (L + 1)·V. Merges are additions, not counted.
        lv = max(n - 1, 0).bit_length()
        h, k, v = self.n_heads, self.key_dim, self.head_dim
        return h * ((2 * lv + 2) * k * v + (lv + 1) * v)
