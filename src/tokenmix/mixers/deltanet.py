"""DeltaNet: linear attention whose memory is corrected toward each new value (the delta rule).

Recurrence per head (Schlag et al. 2021; chunkwise training from Yang et al. 2024, "Parallelizing
Linear Transformers with the Delta Rule over Sequence Length"), state S [K, V]:

    S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}ᵀ k_t)ᵀ,        o_t = scale · S_tᵀ q_t,

with q, k L2-normalised, scale = K^-1/2 and beta_t = sigmoid(w_betaᵀ x_t) in (0, 1), or
2·sigmoid in (0, 2) with ``allow_neg_eigval`` (the transition I - beta k kᵀ then has an eigenvalue
down to -1, Grazzi et al. 2025, which lets the layer track parities).

(A, B) form over the values X = V (framework.md §2.3). Writing S_t = sum_{j<=t} k_j u_jᵀ,

    u_t = beta_t v_t - sum_{j<t} beta_t (k_t·k_j) u_j
    =>  U = (I - B)^{-1} A V,   A = diag(beta),   B[t, j] = -beta_t k_t·k_j  (j < t),
        O = R U,                R = (Q Kᵀ ⊙ L) · scale,   L = lower ones incl. the diagonal.

B is dense and data-dependent: an infinite-order recurrence on the pseudo-values u. An initial
state S_0 adds the known right-hand side -beta_t S_0ᵀ k_t to row t and scale · S_0ᵀ q_t to o_t.

Symbols: q, k, v, beta as in the papers; S is fla's ``h`` / ``initial_state`` ([K, V] layout);
``mix_a``/``mix_b``/``readout`` are the framework's A/B/R.

Modes: ``chunked`` (UT-transform chunkwise form, ops/chunked_delta.py), ``dense`` (materialised
A, B, R and core.operator.solve_dense), ``recurrent`` (token by token, ops.chunked_delta.delta_rule_step).

Left padding (mixers/base.py), masked: a padding token gets beta = 0 (no write: u_t = 0, and the
transition I - beta k kᵀ is the identity) and, in the gated variant, g = 0 (no decay, which also
keeps padding decays out of the cumulative G), so the state is exactly untouched and the first real
token meets the zero state of a solo run.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.core.errors import InputError
from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.mixers.registry import register_mixer
from tokenmix.mixers.base import Linear, Mixer, MixerConfig, MixerState
from tokenmix.ops.chunked_delta import chunked_delta_rule, delta_rule_operator, delta_rule_step


@dataclass(frozen=True)
class DeltaNetConfig(MixerConfig):
    chunk_size: int = 64            # C of the chunkwise UT-transform form
    allow_neg_eigval: bool = False  # beta = 2·sigmoid in (0, 2) instead of sigmoid in (0, 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.chunk_size <= 0:
            raise InputError(f"chunk_size must be > 0, got {self.chunk_size}")


class DeltaState(MixerState):
    """Fixed-size decode state: ``memory`` [B, H, K, V], the matrix S after ``position`` tokens."""

    def __init__(self, owner: str, batch_size: int, position: int, memory: Tensor) -> None:
        self.owner, self.batch_size, self.position, self.memory = owner, batch_size, position, memory

    def tensors(self) -> dict[str, Tensor]:
        return {"memory": self.memory}


@register_mixer("deltanet", DeltaNetConfig, family="delta rule",
                ab_form="A = diag(beta), B[t,j] = -beta_t k_t·k_j (dense), R = (Q Kᵀ ⊙ L)·scale")
class DeltaNet(Mixer):
    config_cls = DeltaNetConfig
    modes = ("chunked", "dense", "recurrent")
    time_complexity = "O(1)"   # per token: K x V work, independent of n
    cache_complexity = "O(1)"  # one K x V matrix per head

    def __init__(self, config: DeltaNetConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, k = self.n_heads, self.head_dim
        self.qkv = Linear(d_model, 3 * h * k, bias=False)
        self.beta_proj = Linear(d_model, h)
        self.out = Linear(h * k, d_model, bias=False)
        self.scale = k ** -0.5

    # ---------------------------------------------------------------- shared pieces
    def _log_decay(self, x: Tensor) -> Tensor | None:
        """Per-head log decay g [B, T, H]; DeltaNet has none (the gated variant overrides this)."""
        return None

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
        """q, k [B, T, H, K] (L2-normalised), v [B, T, H, K], beta [B, T, H], g [B, T, H] or None."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        beta = torch.sigmoid(self.beta_proj(x))
        if self.config.allow_neg_eigval:
            beta = 2 * beta
        return F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, beta, self._log_decay(x)

    def _segment(self, x: Tensor, state: DeltaState | None
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
        """``_project`` of a segment, its padding tokens (if any) inert: beta = 0, g = 0."""
        q, k, v, beta, g = self._project(x)
        pad = None if state is None else state.padding(x.shape[1])  # [B, T]
        if pad is not None:
            beta = beta.masked_fill(pad[..., None], 0.0)
            g = None if g is None else g.masked_fill(pad[..., None], 0.0)
        return q, k, v, beta, g

    def _next_state(self, state: DeltaState | None, memory: Tensor, t: int, batch: int) -> DeltaState:
        pos = 0 if state is None else state.position
        new = DeltaState(self.owner, batch, pos + t, memory)
        return new.carry_over(state) if state is not None else new

    # ---------------------------------------------------------------- modes
    def forward_chunked(self, x: Tensor, state: DeltaState | None) -> tuple[Tensor, DeltaState]:
        q, k, v, beta, g = self._segment(x, state)
        s0 = None if state is None else state.memory
        o, s = chunked_delta_rule(q, k, v, beta, g, self.scale, s0, self.config.chunk_size)
        return self.out(o.flatten(2)), self._next_state(state, s, x.shape[1], x.shape[0])

    def forward_dense(self, x: Tensor, state: DeltaState | None) -> tuple[Tensor, DeltaState]:
        """U = (I - B)^{-1} (A V + offset) through the reference solver, then O = R U (+ S_0 readout)."""
        b, t, _ = x.shape
        q, k, v, beta, g = self._segment(x, state)
        mix_a, mix_b, readout, decay = delta_rule_operator(q, k, beta, g, self.scale)
        decay_t = decay.transpose(1, 2)  # [B, T, H]: exp(G_t), the weight of S_0 at token t
        s0 = None if state is None else state.memory
        offset = None
        if s0 is not None:
            offset = -(beta * decay_t)[..., None] * torch.einsum("bthk,bhkv->bthv", k, s0)
        u = solve_dense(MixOperator(mix_a, mix_b), v, offset=offset)  # [B, T, H, V] pseudo-values
        o = (readout @ u.transpose(1, 2)).transpose(1, 2)
        # final state S_T = exp(G_T) S_0 + sum_j exp(G_T - G_j) k_j u_jᵀ
        if g is None:
            k_end, carried = k, 1.0
        else:
            cum = g.cumsum(1)
            k_end = k * (cum[:, -1:] - cum).exp()[..., None]
            carried = decay[..., -1, None, None]
        s = torch.einsum("bthk,bthv->bhkv", k_end, u)
        if s0 is not None:
            o = o + self.scale * decay_t[..., None] * torch.einsum("bthk,bhkv->bthv", q, s0)
            s = s + carried * s0
        return self.out(o.flatten(2)), self._next_state(state, s, t, b)

    def forward_recurrent(self, x: Tensor, state: DeltaState | None) -> tuple[Tensor, DeltaState]:
        b, t, _ = x.shape
        state = self.empty_state(b, x.device, x.dtype) if state is None else state
        q, k, v, beta, g = self._segment(x, state)
        outs = []
        for i in range(t):
            state.observe()
            o_t, s = delta_rule_step(state.memory, q[:, i], k[:, i], v[:, i], beta[:, i],
                                     None if g is None else g[:, i], self.scale)
            outs.append(o_t)
            state = self._next_state(state, s, 1, b)
        return self.out(torch.stack(outs, 1).flatten(2)), state

    # ---------------------------------------------------------------- surface
    def empty_state(self, batch_size: int, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32) -> DeltaState:
        memory = torch.zeros(batch_size, self.n_heads, self.head_dim, self.head_dim, device=device, dtype=dtype)
        return DeltaState(self.owner, batch_size, 0, memory)

    def materialize(self, x: Tensor) -> MixOperator:
        """A = diag(beta), B, R over the values v of ``x`` [B, T, D] (zero initial state)."""
        q, k, _, beta, g = self._project(x)
        mix_a, mix_b, readout, _ = delta_rule_operator(q, k, beta, g, self.scale)
        return MixOperator(mix_a, mix_b, readout)

    def values(self, x: Tensor) -> Tensor:
        """The inputs X the operator mixes: v [B, T, H, K]."""
        b, t, _ = x.shape
        return self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim)[:, :, 2]

    def state_size(self, n: int) -> int:
        return self.n_heads * self.head_dim * self.head_dim  # S [K, V] per head, whatever n

    def flops_per_token(self, n: int) -> int:
        # S_{t-1}ᵀ k_t, the rank-1 write and S_tᵀ q_t: three K x V multiply-adds per head
        return 3 * self.n_heads * self.head_dim * self.head_dim
