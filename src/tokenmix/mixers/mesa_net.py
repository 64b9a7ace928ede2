"""MesaNet (von Oswald et al. 2025, "MesaNet: Sequence Modeling by Locally Optimal Test-Time Training"):
gated linear attention read with a query that is first solved against the accumulated key covariance.

Per head, with L2-normalised q_t, k_t = W_q x_t, W_k x_t [K], values v_t = W_v x_t [V], write strength
beta_t = sigmoid(w_bᵀ x_t) and log decay g_t = logsigmoid(w_aᵀ x_t + b_a) (scalars), and a learned
per-key-channel regulariser lambda = softplus(lambda_param) + lambda_lower_bound [K]:

    H_t  = exp(g_t) H_{t-1} + beta_t k_t k_tᵀ                        [K, K]  key covariance
    S_t  = exp(g_t) S_{t-1} + beta_t k_t v_tᵀ                         [K, V]  key-value memory
    q*_t = (H_t + diag(lambda))^{-1} q_t,       o_t = S_tᵀ q*_t,       y_t = W_o [o_t]_heads.

This is exactly fla's ``naive_mesa_net_exact`` (ops/mesa_net/naive.py: h_kk, h_kv updated with the
token before the solve, no readout scale), i.e. the exact mesa layer -- not its conjugate-gradient
approximation (``naive_mesa_net_CG``, fla's training kernels): the solve here is direct, so the
output is the optimum of the per-token regularised least-squares problem, not an approximation.
fla's layer adds a short convolution and an output gate/norm; those are left to other layers.

(A, B) form over the values X = V: o_t = sum_{j<=t} exp(G_t - G_j) beta_j (q*_t·k_j) v_j, so
    token view:        B = 0, A[t, j] = exp(G_t - G_j) beta_j (q*_t · k_j);
    first-order view:  per key channel c, A_c = diag(beta_{·} k_{·,c}), B_c[t, t-1] = exp(g_t),
                       R_c = diag(q*_{·,c})  (mixers/diagonal_decay.py's state view with q -> q*),
with A_c, B_c, R_c [B, H, K, T, T]. The solve sits in the readout: q*_t = (H_t + Lambda)^{-1} q_t is
a per-token K x K inverse of a matrix built from all keys up to t, so R depends nonlinearly on the
keys (the mixing is linear in V only). It is the closest relative of (I - B)^{-1}: H_t + Lambda is
the Gram matrix of the decayed keys, where (I - B)^{-1} inverts along time, this inverts along the
key channels, once per token.

Modes: ``chunked`` (training default: every H_t chunkwise and a Cholesky solve per token with a
closed-form backward, ops/chunked_mesa.mesa_queries, then ops/chunked_gla.py with q* -- exact, not
the CG approximation; linear in T: O(C K² + K³) work and O(K²) memory per token (the Cholesky
factors kept for the backward). The H_t are formed, factorised and solved a cache-sized slab of
tokens at a time, the LAPACK calls split over ``torch.get_num_threads()`` threads: see that module),
``dense`` (H_t through the T x T decay mask, an LU solve, then the state view through the reference
solver), ``recurrent`` (token by token: H and S updated, one solve). Decode state per head: H
[K, K] and S [K, V], H·(K² + K·V) scalars per batch element, whatever n.

Left padding (mixers/base.py), masked: padding tokens get beta = 0 and g = 0 -- no write to H or S
and an identity transition -- so both states meet the first real token exactly as a solo run does.
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
from tokenmix.ops.chunked_gla import chunked_gla
from tokenmix.ops.chunked_mesa import dense_key_covariance, key_covariance_step, mesa_queries, mesa_solve_reference
from tokenmix.ops.recurrent_gla import gla_step


@dataclass(frozen=True)
class MesaNetConfig(MixerConfig):
    chunk_size: int = 64  # C of the chunked forms
    lambda_lower_bound: float = 0.25  # lambda = softplus(lambda_param) + bound > 0 (keeps the solve well posed)
    lambda_init: float = 1.0  # initial lambda (every channel)
    decay_bias_init: float = 3.0  # b_a at initialisation: exp(g) = sigmoid(3) ~ 0.95

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("chunk_size", "lambda_lower_bound")
        if not self.lambda_init > self.lambda_lower_bound:
            raise InputError(
                f"lambda_init must be > lambda_lower_bound, got {self.lambda_init} <= {self.lambda_lower_bound}"
            )


class MesaState(MatrixState):
    """Fixed-size decode state: ``memory`` S [B, H, K, V] and ``covariance`` H [B, H, K, K] after
    ``position`` tokens."""

    def __init__(self, owner: str, batch_size: int, position: int, memory: Tensor, covariance: Tensor) -> None:
        super().__init__(owner, batch_size, position, memory)
        self.covariance = covariance

    def tensors(self) -> dict[str, Tensor]:
        return {"memory": self.memory, "covariance": self.covariance}

    def numel_per_batch(self) -> int:
        return math.prod(self.memory.shape[1:]) + math.prod(self.covariance.shape[1:])


@register_mixer(
    "mesa_net",
    MesaNetConfig,
    family="linear attention",
    ab_form="B = 0 token view: A = exp(G_t - G_j) beta_j (q*_t·k_j), q*_t = (H_t + Lambda)^-1 q_t / "
    "state view: A_c = diag(beta k_c), B_c = exp(g) shift, R_c = diag(q*_c)",
)
class MesaNet(DiagonalDecayMixer):
    packing_modes = ()  # its own chunked kernel has no document boundaries: packed rows run piece by piece
    reassociates = True  # the chunked forms factor the decay products as exp(G_i - G_j)

    def __init__(self, config: MesaNetConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, k = self.n_heads, self.head_dim
        self.state_heads, self.key_dim, self.value_dim, self.has_decay = h, k, k, True
        self.qkv = Linear(d_model, 3 * h * k, bias=False)
        self.beta_proj = Linear(d_model, h, bias=False)
        self.decay_proj = Linear(d_model, h, bias=True)
        with torch.no_grad():
            self.decay_proj.bias.fill_(config.decay_bias_init)
        lam0 = config.lambda_init - config.lambda_lower_bound
        self.lambda_param = nn.Parameter(torch.full((h, k), math.log(math.expm1(lam0))))  # softplus^-1
        self.out = Linear(h * k, d_model, bias=False)

    # ---------------------------------------------------------------- pieces
    def regulariser(self) -> Tensor:
        """lambda [H, K] > 0."""
        return F.softplus(self.lambda_param) + self.config.lambda_lower_bound

    def projections(self, x: Tensor, state: MatrixState | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """q, k (L2-normalised) [B, T, H, K], v [B, T, H, V], beta, g [B, T, H]; padding tokens inert."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        beta, g = torch.sigmoid(self.beta_proj(x)), F.logsigmoid(self.decay_proj(x))
        pad = None if state is None else state.padding(t)
        if pad is not None:
            beta, g = beta.masked_fill(pad[..., None], 0.0), g.masked_fill(pad[..., None], 0.0)
        return F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, beta, g

    def _solved(self, x: Tensor, state: MesaState | None, chunked: bool) -> tuple[LinearFeatures, Tensor]:
        """Features with the solved query q* and the last key covariance: chunkwise with the Cholesky
        solve and its closed-form backward (``mesa_queries``), or densely with an LU solve."""
        q, k, v, beta, g = self.projections(x, state)
        h0 = None if state is None else state.covariance
        if chunked:
            q_star, last = mesa_queries(q, k, beta, g, h0, self.regulariser(), self.config.chunk_size)
        else:
            every, last = dense_key_covariance(k, beta, g, h0)
            q_star = mesa_solve_reference(every, self.regulariser(), q)
        return LinearFeatures(q_star, k * beta[..., None], v, g, 1.0), last

    def _features(self, x: Tensor) -> LinearFeatures:
        """q* (from the zero state, reference solve), beta·k, v [B, T, H, K]; g [B, T, H] (for materialize)."""
        return self._solved(x, None, chunked=False)[0]

    def values(self, x: Tensor) -> Tensor:
        """The inputs X the operator mixes: v [B, T, H, V]."""
        return self.projections(x)[2]

    def _next_mesa(self, state: MesaState | None, memory: Tensor, cov: Tensor, t: int, batch: int) -> MesaState:
        pos = 0 if state is None else state.position
        new = MesaState(self.owner, batch, pos + t, memory, cov)
        return new.carry_over(state) if state is not None else new

    # ---------------------------------------------------------------- modes
    def forward_chunked(self, x: Tensor, state: MesaState | None) -> tuple[Tensor, MesaState]:
        f, cov = self._solved(x, state, chunked=True)
        o, s = self._mix_chunked(f, None if state is None else state.memory)
        return self._output(o, f), self._next_mesa(state, s, cov, x.shape[1], x.shape[0])

    def forward_dense(self, x: Tensor, state: MesaState | None) -> tuple[Tensor, MesaState]:
        """H_t densely, q* by LU, then Z^(c) = (I - B_c)^{-1} A_c V per (head, key channel) through the
        reference solver with the carried memory as row 0's known right-hand side (as the family's dense mode)."""
        b, t, _ = x.shape
        f, cov = self._solved(x, state, chunked=False)
        o, memory = self._solve_state_view(f, None if state is None else state.memory)
        return self._output(o, f), self._next_mesa(state, memory, cov, t, b)

    def forward_recurrent(self, x: Tensor, state: MesaState | None) -> tuple[Tensor, MesaState]:
        b, t, _ = x.shape
        state = self.empty_state(b, x.device, x.dtype) if state is None else state
        q, k, v, beta, g = self.projections(x, state)
        lam = self.regulariser()
        outs = []
        for q_t, k_t, v_t, b_t, g_t in zip(q.unbind(1), k.unbind(1), v.unbind(1), beta.unbind(1), g.unbind(1)):
            state.observe()
            cov = key_covariance_step(state.covariance, k_t, b_t, g_t)  # H_t
            q_star = mesa_solve_reference(cov, lam, q_t)  # (H_t + Lambda)^-1 q_t
            o_t, s = gla_step(state.memory, q_star, k_t * b_t[..., None], v_t, g_t, 1.0)
            outs.append(o_t)
            state = self._next_mesa(state, s, cov, 1, b)
        return self.out(torch.stack(outs, 1).flatten(2)), state

    def mixing_core(self, x: Tensor):
        """(fn, inputs): the chunked mixing of x without the projections (covariance, solve, readout)."""
        q, k, v, beta, g = (z.detach().requires_grad_() for z in self.projections(x))
        lam, chunk = self.regulariser().detach(), self.config.chunk_size

        def fn(q, k, v, beta, g):
            q_star, _ = mesa_queries(q, k, beta, g, None, lam, chunk)
            return chunked_gla(q_star, k * beta[..., None], v, g, 1.0, None, chunk)

        return fn, (q, k, v, beta, g)

    # ---------------------------------------------------------------- surface
    def empty_state(
        self, batch_size: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> MesaState:
        h, dk, dv = self.state_heads, self.key_dim, self.value_dim
        return MesaState(
            self.owner,
            batch_size,
            0,
            torch.zeros(batch_size, h, dk, dv, device=device, dtype=dtype),
            torch.zeros(batch_size, h, dk, dk, device=device, dtype=dtype),
        )

    def state_size(self, n: int) -> int:
        h, dk, dv = self.state_heads, self.key_dim, self.value_dim
        return h * (dk * dk + dk * dv)  # H [K, K] and S [K, V] per head, whatever n

    def flops_per_token(self, n: int) -> int:
        # per head: H decayed (K² multiplies = K²/2 multiply-adds) and written (K²), the LU solve
        # (K³/3 for the factorisation, K² for the two triangular solves), and the GLA part on S
        # (decay KV/2, write KV, read KV)
        dk, dv = self.key_dim, self.value_dim
        return self.state_heads * (dk**3 // 3 + dk * dk + (3 * dk * dk) // 2 + 2 * dk * dv + (dk * dv) // 2)
