"""Log-linear Gated DeltaNet (Guo, Yang, Goel, Xing, Dao, Kim 2025, "Log-Linear Attention" §3.2): the
Fenwick hierarchy of mixers/log_linear.py on the gated delta rule (mixers/delta_rule.py).

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
projections and the decay gate are the delta base's (``DeltaRuleMixer``, mixers/delta_rule.py);
the modes, the Fenwick state and the level scales are mixers/fenwick_levels.py's; this file states
the op.

No fla reference: checks/log_linear_attention.py checks it against the explicit formula above
(products of the transition matrices, lambda-weighted by tokenmix.patterns.fenwick_level).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.mixers.delta_rule import DeltaRuleMixer
from tokenmix.mixers.fenwick_levels import FenwickLevelMixer, check_fenwick_config
from tokenmix.mixers.gated_deltanet import GatedDeltaNetConfig
from tokenmix.mixers.registry import register_mixer
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
        check_fenwick_config(self.chunk_size, self.max_levels)


@register_mixer(
    "log_linear_gated_deltanet",
    LogLinearGatedDeltaNetConfig,
    family="log-linear attention",
    ab_form="G = Fenwick levels: A_l = diag(beta ⊙ [bit l-1 of s = 0]), B_l = B_gdn ⊙ blocks_l, "
    "R_l = diag(lambda^(l) ⊙ [bit l-1 of t = 1]) (R_gdn ⊙ blocks_l)",
)
class LogLinearGatedDeltaNet(FenwickLevelMixer, DeltaRuleMixer):
    """gated_deltanet's projections with per-level scales; the modes and Fenwick state are FenwickLevelMixer's."""

    decay_gate = "head"
    _step = staticmethod(log_linear_delta_step)

    def __init__(self, config: LogLinearGatedDeltaNetConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        self.key_dim = self.head_dim
        self._init_level_scales(d_model)  # every lambda starts at 1: as Gated DeltaNet

    # ---------------------------------------------------------------- the op's inputs and forms
    def _levels_project(self, x: Tensor, start: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """q, k (L2-normalised), v [B, T, H, K], beta, g [B, T, H], lambda [B, T, H, max_levels]."""
        q, k, v, beta, g = self._project(x)
        return q, k, v, beta, g, self._level_scales(x, start)

    def _level_inputs(self, x: Tensor, start: int) -> tuple[Tensor, ...]:
        return self._levels_project(x, start)

    def _chunked(self, inputs: tuple[Tensor, ...], init: Tensor | None, start: int) -> tuple[Tensor, Tensor]:
        return chunked_log_linear_delta(*inputs, self.scale, init, start, self.config.chunk_size)

    def _dense(self, inputs: tuple[Tensor, ...], init: Tensor | None, start: int) -> tuple[Tensor, Tensor]:
        """O = sum_l R_l (I - B_l)^{-1} A_l V through the reference solver, plus the initial buckets' reads."""
        q, k, v, beta, g, lam = inputs
        o = solve_dense(log_linear_delta_operator(q, k, beta, g, lam, self.scale, start), v)
        if init is not None:
            o = o + initial_levels_readout(q, k, beta, g, lam, self.scale, start, init)
        return o, final_levels(k, v, beta, g, start, init)

    # ---------------------------------------------------------------- surface
    def materialize(self, x: Tensor) -> MixOperator:
        """(A_l, B_l, R_l) [B, H, L, T, T], one per Fenwick level, over the values v of ``x`` [B, T, D]."""
        q, k, _, beta, g, lam = self._levels_project(x, 0)
        return log_linear_delta_operator(q, k, beta, g, lam, self.scale)

    def flops_per_token(self, n: int) -> int:
        # token t = n - 1 with L = bit_length(t) buckets: decay L·K·V (half a multiply-add each, as
        # gated_deltanet), erase k_tᵀ S and the rank-1 correction 2 L·K·V, the write K·V, reads
        # (L + 1)·K·V, lambda weighting (L + 1)·V. Merges are additions, not counted.
        lv = max(n - 1, 0).bit_length()
        h, k = self.n_heads, self.head_dim
        return h * ((3 * lv + 2) * k * k + lv * k * k // 2 + (lv + 1) * k)
