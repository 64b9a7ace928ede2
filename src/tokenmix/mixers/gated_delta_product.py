"""Gated DeltaProduct (Siems et al. 2025, "DeltaProduct: Improving State-Tracking in Linear RNNs via
Householder Products"): n_h delta-rule steps per token, one gate and one read-out per token.

Recurrence per head, state S [K, V] (fla ``ops/gated_delta_product/naive.py``, ``num_householder`` = n_h):

    S_{t,0} = exp(g_t) S_{t-1},
    S_{t,i} = (I - beta_{t,i} k_{t,i} k_{t,i}ᵀ) S_{t,i-1} + beta_{t,i} k_{t,i} v_{t,i}ᵀ      (i = 1..n_h),
    S_t = S_{t,n_h},        o_t = scale · S_tᵀ q_t,

so the token transition is exp(g_t) prod_i (I - beta_{t,i} k_{t,i} k_{t,i}ᵀ), a product of n_h
generalised Householder reflections: rank n_h instead of DeltaNet's rank 1 (what lets it track
S_n-type states). Per token: one q [K], n_h keys k_{t,i} [K] (each L2-normalised), n_h values
v_{t,i} [V], n_h strengths beta_{t,i} = sigmoid(.) in (0, 1), or 2·sigmoid in (0, 2) with
``allow_neg_eigval`` (reflections with eigenvalue down to -1), and Gated DeltaNet's log decay g_t <= 0.
n_h = 1 is Gated DeltaNet exactly.

(A, B, R) form on the sub-step clock. The n_h sub-steps act as n_h tokens of a gated delta rule: put
them on one clock of N = n_h·T positions p = (t, i) ↦ n_h·t + i, with the decay g_t on the first
sub-step of each token and 0 on the others, and take one output per token, after its last sub-step.
Then the delta family's form (mixers/delta_rule.py) applies verbatim over the values X = (v_{t,i}) [N, V]:

    U = (I - B)^{-1} (A X + offset),   A = diag(beta_{t,i})                               [N, N],
        B[p, p'] = -beta_p exp(G_p - G_p') k_p·k_p'   (p' < p; within a token too: the higher order)
    O = R U + scale exp(G) ⊙ (Q S_0),  R[p, p'] = scale exp(G_p - G_p') q_t·k_p'   if p = (t, n_h) and p' <= p,
                                       R[p, ·] = 0 on the other sub-steps (no read-out there)   [N, N],

G_p = the cumulative log decay on the sub-step clock. The dense solve (I - B)^{-1} runs over N = n_h·T
positions, so ``materialize`` returns [B, H, N, N] matrices whose token-t output is row n_h·t + n_h - 1
and whose values are ``values(x)`` [B, N, H, V]; the token-level operator from the n_h·T values to the
T outputs is those rows of R (I - B)^{-1} A. Its diagonal n_h x n_h blocks of B are where the product
of reflections sits.

Modes: the base's (``DeltaRuleMixer``, mixers/delta_rule.py) on the sub-step clock (``substeps``
= n_h): ``chunked`` (ops/chunked_delta.py, ``chunk_size`` counting sub-steps and rounded down to a
multiple of n_h; ``read_every = n_h`` forms only the last sub-step's read-out rows), ``dense`` (the
[N, N] operator and core.operator.solve_dense), ``recurrent`` (n_h delta_rule_step per token). Decode
state: S [K, V] per head, whatever n and n_h. Left padding is masked as in DeltaNet: every sub-step
of a padding token gets beta = 0 and g = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.mixers.base import Linear
from tokenmix.mixers.delta_rule import DeltaRuleMixer
from tokenmix.mixers.gated_deltanet import GatedDeltaNetConfig
from tokenmix.mixers.registry import register_mixer


@dataclass(frozen=True)
class GatedDeltaProductConfig(GatedDeltaNetConfig):
    n_h: int = 2  # Householder (delta) steps per token: fla's num_householder
    chunk_size: int = 32  # C in sub-steps: the n_h T sub-steps make C = 64 chunks twice as many C x C blocks
    # as Gated DeltaNet's (docs/notes/design-measurements.md)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("n_h")


@register_mixer(
    "gated_delta_product",
    GatedDeltaProductConfig,
    family="delta rule",
    ab_form="sub-step clock p=(t,i), N=n_h·T: A = diag(beta_p), B[p,p'] = -beta_p exp(G_p-G_p') k_p·k_p', "
    "R = (Q Kᵀ ⊙ M^S)·scale on the last sub-step rows only",
)
class GatedDeltaProduct(DeltaRuleMixer):
    decay_gate = "head"

    def __init__(self, config: GatedDeltaProductConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, dk, nh = self.n_heads, self.head_dim, config.n_h
        self.substeps = nh
        # one query, n_h keys and n_h values per token; n_h write strengths. Built in place of the
        # base's qkv and beta_proj after the gate, so that a seed gives it Gated DeltaNet's out and
        # decay-gate weights
        self.qkv = Linear(d_model, (1 + 2 * nh) * h * dk, bias=False)
        self.beta_proj = Linear(d_model, nh * h)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """On the sub-step clock (N = n_h·T): q [B, N, H, K] (q_t on the last sub-step of token t, 0 on
        the others), k [B, N, H, K] (L2-normalised), v [B, N, H, V], beta [B, N, H], g [B, N, H]
        (g_t on the first sub-step, 0 on the others)."""
        b, t, _ = x.shape
        h, dk, nh = self.n_heads, self.head_dim, self.substeps
        qkv = self.qkv(x)
        q = F.normalize(qkv[..., : h * dk].view(b, t, 1, h, dk), dim=-1)
        k, v = qkv[..., h * dk :].view(b, t, 2, nh, h, dk).unbind(2)  # [B, T, n_h, H, K]
        beta = torch.sigmoid(self.beta_proj(x)).view(b, t, nh, h)
        if self.config.allow_neg_eigval:
            beta = 2 * beta
        g = self._log_decay(x)[:, :, None]  # [B, T, 1, H]
        q = torch.cat([q.new_zeros(b, t, nh - 1, h, dk), q], 2)
        g = torch.cat([g, g.new_zeros(b, t, nh - 1, h)], 2)
        flat = lambda z: z.flatten(1, 2)  # noqa: E731  [B, T, n_h, ...] -> [B, N, ...]
        return flat(q), flat(F.normalize(k, dim=-1)), flat(v), flat(beta), flat(g)
