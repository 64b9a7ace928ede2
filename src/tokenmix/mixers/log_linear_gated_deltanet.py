"""Log-linear Gated DeltaNet (Guo, Yang, Goel, Xing, Dao, Kim 2025, "Log-Linear Attention" §3.2): the
Fenwick hierarchy of mixers/log_linear.py on the gated delta rule (mixers/delta_family.py).

Per head (q, k L2-normalised [K], v [V], beta_t, alpha_t = exp(g_t) and every projection as in
``gated_deltanet``; level scales lambda_t^(l) = softplus(W_lambda x_t + b_lambda)^(l), l = 0..max_levels-1):

    o_t = sum_{s <= t} lambda_t^(l(t,s)) M[t,s] v_s,
    M[t,s] = scale q_tᵀ [prod_{i=s+1..t} alpha_i (I - beta_i k_i k_iᵀ)] k_s beta_s,   l(t,s) = bit_length(t XOR s).

With every lambda_t^(l) = 1 this is exactly ``gated_deltanet`` (same parameters otherwise).

(A, B, R) form over the values X = V [B, T, H, V], one recurrence per Fenwick level (the G axis,
A, B, R [B, H, L, T, T] with L = bit_length(T - 1) + 1):

    M ⊙ M^H = sum_l R_l (I - B_l)^{-1} A_l,   M^H[t,s] = lambda_t^(l(t,s)),
    level l >= 1:  A_l = diag(beta_s [bit l-1 of s = 0]),  B_l = B ⊙ [t>>l = s>>l],
                   R_l = diag(lambda_t^(l) [bit l-1 of t = 1]) · (R ⊙ [t>>l = s>>l]),
    level 0:       A_0 = diag(beta),  B_0 = 0,  R_0 = diag(lambda_t^(0) scale q_t·k_t),
with Gated DeltaNet's B[t,j] = -beta_t exp(G_t - G_j) k_t·k_j and R[t,j] = scale exp(G_t - G_j) q_t·k_j.
The solve sits in each (I - B_l)^{-1} (the delta rule restarted at aligned 2^l blocks), the hierarchy
in the block masks and the lambda-weighted row selections (ops/chunked_log_linear_delta.py derives it).

State (recurrent mode, and every mode's final state): the Fenwick bucket states ``levels``
[B, H, bit_length(n), K, V]; every bucket goes through the same transition alpha_t (I - beta_t k_t k_tᵀ),
the write beta_t k_t v_tᵀ enters level 0, buckets merge by the lssb rule: O(log n) states of K x V.

Modes: ``chunked`` (UT transform inside aligned chunks + a chunk-granular Fenwick recurrence,
O(T log T)), ``dense`` (the G-axis operator through core.operator.solve_dense; the initial buckets
as known right-hand sides), ``recurrent`` (token by token). Left padding by row groups (the level
map follows each row's own clock), as log_linear. ``allow_neg_eigval`` as in DeltaNet. The
projections and the decay gate are the delta family's (``DeltaRuleMixer``, mixers/delta_family.py);
the modes and the state are this file's.

No fla reference: checks/log_linear_attention.py checks it against the explicit formula above
(products of the transition matrices, lambda-weighted by tokenmix.patterns.fenwick_level).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.core.errors import InputError
from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.mixers.base import Linear
from tokenmix.mixers.delta_family import DeltaRuleMixer
from tokenmix.mixers.gated_deltanet import GatedDeltaNetConfig
from tokenmix.mixers.log_linear import FenwickState
from tokenmix.mixers.registry import register_mixer
from tokenmix.ops.chunked_log_linear import n_levels
from tokenmix.ops.chunked_log_linear_delta import (
    chunked_log_linear_delta,
    final_levels,
    initial_levels_readout,
    log_linear_delta_operator,
    log_linear_delta_step,
)


@dataclass(frozen=True)
class LogLinearGatedDeltaNetConfig(GatedDeltaNetConfig):
    max_levels: int = 24  # lambda levels; sequences up to 2^(max_levels - 1) tokens

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.chunk_size & (self.chunk_size - 1):
            raise InputError(f"chunk_size must be a power of two > 0, got {self.chunk_size}")
        if self.max_levels <= 0:
            raise InputError(f"max_levels must be > 0, got {self.max_levels}")


@register_mixer(
    "log_linear_gated_deltanet",
    LogLinearGatedDeltaNetConfig,
    family="log-linear attention",
    ab_form="G = Fenwick levels: A_l = diag(beta ⊙ [bit l-1 of s = 0]), B_l = B_gdn ⊙ blocks_l, "
    "R_l = diag(lambda^(l) ⊙ [bit l-1 of t = 1]) (R_gdn ⊙ blocks_l)",
)
class LogLinearGatedDeltaNet(DeltaRuleMixer):
    """gated_deltanet's projections with per-level scales; Fenwick states instead of one matrix."""

    config_cls = LogLinearGatedDeltaNetConfig
    decay_gate = "head"
    time_complexity = "O(log n)"  # per token: the delta update and a read on each Fenwick level
    cache_complexity = "O(log n)"  # bit_length(n) bucket states [K, V]
    pads_by_row_groups = True  # the Fenwick levels follow each row's own clock t - start

    def __init__(self, config: LogLinearGatedDeltaNetConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        self.level_proj = Linear(d_model, self.n_heads * config.max_levels)
        nn.init.constant_(self.level_proj.bias, math.log(math.e - 1))  # softplus(b) = 1: start as Gated DeltaNet

    # ---------------------------------------------------------------- shared pieces
    def _levels_project(self, x: Tensor, start: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """q, k (L2-normalised), v [B, T, H, K], beta, g [B, T, H], lambda [B, T, H, max_levels]."""
        b, t, _ = x.shape
        need = n_levels(start + t)
        if need > self.config.max_levels:
            raise InputError(
                f"position {start + t - 1} needs {need} Fenwick levels but max_levels="
                f"{self.config.max_levels}; raise max_levels"
            )
        q, k, v, beta, g = self._project(x)
        lam = F.softplus(self.level_proj(x)).view(b, t, self.n_heads, self.config.max_levels)
        return q, k, v, beta, g, lam

    # ---------------------------------------------------------------- modes
    def forward_chunked(self, x: Tensor, state: FenwickState | None) -> tuple[Tensor, FenwickState]:
        start, init = FenwickState.resumed(state)
        q, k, v, beta, g, lam = self._levels_project(x, start)
        o, levels = chunked_log_linear_delta(q, k, v, beta, g, lam, self.scale, init, start, self.config.chunk_size)
        return self.out(o.flatten(2)), FenwickState.after(state, self.owner, levels, start + x.shape[1], x.shape[0])

    def forward_dense(self, x: Tensor, state: FenwickState | None) -> tuple[Tensor, FenwickState]:
        """O = sum_l R_l (I - B_l)^{-1} A_l V through the reference solver, plus the initial buckets' reads."""
        start, init = FenwickState.resumed(state)
        q, k, v, beta, g, lam = self._levels_project(x, start)
        o = solve_dense(log_linear_delta_operator(q, k, beta, g, lam, self.scale, start), v)
        if init is not None:
            o = o + initial_levels_readout(q, k, beta, g, lam, self.scale, start, init)
        levels = final_levels(k, v, beta, g, start, init)
        return self.out(o.flatten(2)), FenwickState.after(state, self.owner, levels, start + x.shape[1], x.shape[0])

    def forward_recurrent(self, x: Tensor, state: FenwickState | None) -> tuple[Tensor, FenwickState]:
        b, t, _ = x.shape
        state = self.empty_state(b, x.device, x.dtype) if state is None else state
        q, k, v, beta, g, lam = self._levels_project(x, state.position)
        outs = []
        for i in range(t):
            state.observe()
            o_t, levels = log_linear_delta_step(
                state.levels, state.position, q[:, i], k[:, i], v[:, i], beta[:, i], g[:, i], lam[:, i], self.scale
            )
            outs.append(o_t)
            state = FenwickState.after(state, self.owner, levels, state.position + 1, b)
        return self.out(torch.stack(outs, 1).flatten(2)), state

    # ---------------------------------------------------------------- surface
    def empty_state(
        self, batch_size: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> FenwickState:
        levels = torch.zeros(batch_size, self.n_heads, 0, self.head_dim, self.head_dim, device=device, dtype=dtype)
        return FenwickState(self.owner, batch_size, 0, levels)

    def materialize(self, x: Tensor) -> MixOperator:
        """(A_l, B_l, R_l) [B, H, L, T, T], one per Fenwick level, over the values v of ``x`` [B, T, D]."""
        q, k, _, beta, g, lam = self._levels_project(x, 0)
        return log_linear_delta_operator(q, k, beta, g, lam, self.scale)

    def state_size(self, n: int) -> int:
        # bit_length(t) bucket states [K, V] per head before token t; the largest over t < n is t = n - 1
        return self.n_heads * self.head_dim * self.head_dim * max(n - 1, 0).bit_length()

    def flops_per_token(self, n: int) -> int:
        # token t = n - 1 with L = bit_length(t) buckets: decay L·K·V (half a multiply-add each, as
        # gated_deltanet), erase k_tᵀ S and the rank-1 correction 2 L·K·V, the write K·V, reads
        # (L + 1)·K·V, lambda weighting (L + 1)·V. Merges are additions, not counted.
        lv = max(n - 1, 0).bit_length()
        h, k = self.n_heads, self.head_dim
        return h * ((3 * lv + 2) * k * k + lv * k * k // 2 + (lv + 1) * k)
