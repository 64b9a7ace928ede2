"""Diagonal selective state space model (Mamba-1's selective scan, Gu & Dao 2023; S4D / LRU style):
one diagonal recurrence of N states per channel.

Per channel d of the inner width D_in = n_heads · head_dim, with u_t = W_u x_t [D_in], input-dependent
step Delta_t = softplus(W_dt x_t + dt_bias) [D_in] and shared B_t, C_t = W_B x_t, W_C x_t [N]:

    h_t = exp(Delta_{t,d} A_d) ⊙ h_{t-1} + Delta_{t,d} B_t u_{t,d}      h [N] per channel, A_d = -exp(A_log_d) [N]
    y_{t,d} = C_t·h_t (+ D_d u_{t,d}),                                  out_t = W_o y_t.

A is initialised S4D-real (A_{d,n} = -(n+1)). Mamba-1's short convolution and SiLU gate are left to
other layers; the D skip is optional (``d_skip``) and pointwise in time, so not part of the mixing.

As gated linear attention (references.md, the Mamba-1 <-> GLA mapping): one head per channel,
K = N, V = 1, q = C_t, k = B_t, v = Delta_t u_t, per-key log decay gk_{t,n} = Delta_t A_{d,n},
scale 1 (fla's naive_recurrent_gla has a fixed K^-1/2, so it needs q = C·sqrt(N)). The state is
[B, D_in, N, 1]. The dense and recurrent modes use that mapping (mixers/diagonal_decay.py); the chunked
mode is ops/selective_scan.py on the compact inputs (u, Delta [B, T, D_in], A [D_in, N], B_t, C_t
[B, T, N]): a blocked scan whose work and memory are linear in T, where the GLA mapping's chunked
form would spend O(C N) per token and channel on V = 1 "matmuls" and hold [B, T, D_in, N] tensors.

(A, B) forms over the values X = Delta·u (mixers/diagonal_decay.py), per channel d and state n:
    first-order view:  A_n = diag(B_{·,n}), B_n[t, t-1] = exp(Delta_t A_{d,n}), R_n = diag(C_{·,n});
    token view:        B = 0, A[t, j] = sum_n C_tn B_jn exp(A_{d,n} sum_{s=j+1..t} Delta_s).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.mixers.base import Linear
from tokenmix.mixers.diagonal_decay import DiagonalDecayMixer, LinearFeatures, MatrixState
from tokenmix.mixers.mamba2 import SelectiveSSMConfig, inverse_softplus_dt
from tokenmix.mixers.registry import register_mixer
from tokenmix.ops.selective_scan import selective_scan


@dataclass(frozen=True)
class DiagSSMConfig(SelectiveSSMConfig):
    chunk_size: int = 64  # tokens per block of the selective scan (its [B, L, D_in, N] working set)


@register_mixer(
    "diag_ssm",
    DiagSSMConfig,
    family="state space model",
    ab_form="first-order state view per channel and state n: A_n = diag(B_n), "
    "B_n = exp(Delta A_n) shift, R_n = diag(C_n) / B = 0 token view: A = sum_n C_n B_n decay_n",
)
class DiagSSM(DiagonalDecayMixer):
    packing_modes = ()  # its own chunked kernel has no document boundaries: packed rows run piece by piece
    test_overrides = {"state_dim": 4}  # the chunked scan is the recurrence's own arithmetic: exact tolerance

    def __init__(self, config: DiagSSMConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        d_in, n = self.n_heads * self.head_dim, config.state_dim
        self.state_heads, self.key_dim, self.value_dim, self.has_decay = d_in, n, 1, True
        self.in_proj = Linear(d_model, d_in, bias=False)  # u
        self.dt_proj = Linear(d_model, d_in, bias=False)  # Delta (before softplus)
        self.bc_proj = Linear(d_model, 2 * n, bias=False)  # B_t, C_t
        self.dt_bias = nn.Parameter(inverse_softplus_dt(d_in, config.dt_min, config.dt_max))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1, dtype=torch.float32)).repeat(d_in, 1))
        self.D = nn.Parameter(torch.ones(d_in)) if config.d_skip else None
        self.out = Linear(d_in, d_model, bias=False)

    def _scan_inputs(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """u, Delta [B, T, D_in], A = -exp(A_log) [D_in, N], B_t, C_t [B, T, N] (no [B, T, D_in, N] tensor)."""
        u = self.in_proj(x)
        delta = F.softplus(self.dt_proj(x) + self.dt_bias)
        bs, cs = self.bc_proj(x).chunk(2, dim=-1)
        return u, delta, -self.A_log.exp(), bs, cs

    def forward_chunked(self, x: Tensor, state: MatrixState | None) -> tuple[Tensor, MatrixState]:
        u, delta, a, bs, cs = self._scan_inputs(x)
        pad = None if state is None else state.padding(x.shape[1])
        if pad is not None:
            # Delta = 0 is the inert token of the scan (decay exp(0 A) = 1, input Delta u B = 0), the
            # same as the family's v = 0, g = 0 (both are Delta times something)
            delta = delta.masked_fill(pad[..., None], 0.0)
        s0 = None if state is None else state.memory[..., 0]  # [B, D_in, N]
        y, h = selective_scan(delta * u, delta, a, bs, cs, s0, self.config.chunk_size)
        if self.D is not None:
            y = y + self.D * u
        return self.out(y), self._next_state(state, h[..., None], x.shape[1], x.shape[0])

    def mixing_core(self, x: Tensor):
        """(fn, inputs): the selective scan of x without the projections (for benchmarks)."""
        u, delta, a, bs, cs = self._scan_inputs(x)
        leaves = tuple(z.detach().requires_grad_() for z in (delta * u, delta, a, bs, cs))
        block = self.config.chunk_size
        return (lambda xv, d, a_, b_, c_: selective_scan(xv, d, a_, b_, c_, None, block)), leaves

    def _features(self, x: Tensor) -> LinearFeatures:
        """One head per channel: q = C, k = B [B, T, D_in, N], v = Delta·u [B, T, D_in, 1], gk [B, T, D_in, N]."""
        b, t, _ = x.shape
        d_in, n = self.state_heads, self.config.state_dim
        u = self.in_proj(x)  # [B, T, D_in]
        delta = F.softplus(self.dt_proj(x) + self.dt_bias)  # [B, T, D_in] > 0
        bs, cs = self.bc_proj(x).chunk(2, dim=-1)  # [B, T, N] each
        gk = -delta[..., None] * self.A_log.exp()  # Delta_t A_d <= 0, [B, T, D_in, N]
        q, k = cs[:, :, None, :].expand(b, t, d_in, n), bs[:, :, None, :].expand(b, t, d_in, n)
        skip = None if self.D is None else (self.D * u)[..., None]
        return LinearFeatures(q, k, (delta * u)[..., None], gk, 1.0, skip)
