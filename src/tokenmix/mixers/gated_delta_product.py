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
Then mixers/gated_deltanet.py's derivation applies verbatim over the values X = (v_{t,i}) [N, V]:

    U = (I - B)^{-1} (A X + offset),   A = diag(beta_{t,i})                               [N, N],
        B[p, p'] = -beta_p exp(G_p - G_p') k_p·k_p'   (p' < p; within a token too: the higher order)
    O = R U + scale exp(G) ⊙ (Q S_0),  R[p, p'] = scale exp(G_p - G_p') q_t·k_p'   if p = (t, n_h) and p' <= p,
                                       R[p, ·] = 0 on the other sub-steps (no read-out there)   [N, N],

G_p = the cumulative log decay on the sub-step clock. The dense solve (I - B)^{-1} runs over N = n_h·T
positions, so ``materialize`` returns [B, H, N, N] matrices whose token-t output is row n_h·t + n_h - 1
and whose values are ``values(x)`` [B, N, H, V]; the token-level operator from the n_h·T values to the
T outputs is those rows of R (I - B)^{-1} A. Its diagonal n_h x n_h blocks of B are where the product
of reflections sits.

Modes: ``chunked`` (ops/chunked_delta.py on the sub-step clock, ``chunk_size`` counting sub-steps and
rounded down to a multiple of n_h; ``read_every = n_h`` forms only the last sub-step's read-out rows),
``dense`` (the [N, N] operator and core.operator.solve_dense), ``recurrent`` (n_h delta_rule_step per
token). Decode state: S [K, V] per head, whatever n and n_h. Left padding is masked as in DeltaNet:
every sub-step of a padding token gets beta = 0 and g = 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.core.errors import InputError
from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.mixers.deltanet import DeltaState
from tokenmix.mixers.gated_deltanet import GatedDeltaNet, GatedDeltaNetConfig
from tokenmix.mixers.registry import register_mixer
from tokenmix.ops.chunked_delta import chunked_delta_rule, delta_rule_operator, delta_rule_step
from tokenmix.mixers.base import Linear


@dataclass(frozen=True)
class GatedDeltaProductConfig(GatedDeltaNetConfig):
    n_h: int = 2  # Householder (delta) steps per token: fla's num_householder
    chunk_size: int = 32  # C in sub-steps: the n_h T sub-steps make C = 64 chunks twice as many C x C blocks
                          # as Gated DeltaNet's; 32 measured faster at 8k (docs/results.md, issue 22)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_h <= 0:
            raise InputError(f"n_h must be > 0, got {self.n_h}")


@register_mixer("gated_delta_product", GatedDeltaProductConfig, family="delta rule",
                ab_form="sub-step clock p=(t,i), N=n_h·T: A = diag(beta_p), B[p,p'] = -beta_p exp(G_p-G_p') k_p·k_p', "
                        "R = (Q Kᵀ ⊙ M^S)·scale on the last sub-step rows only")
class GatedDeltaProduct(GatedDeltaNet):
    config_cls = GatedDeltaProductConfig

    def __init__(self, config: GatedDeltaProductConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, dk, nh = self.n_heads, self.head_dim, config.n_h
        self.n_h = nh
        self.substeps = nh  # positions of the operator clock per token: materialize is [N, N], N = n_h·T
        # one query, n_h keys and n_h values per token; n_h write strengths
        self.qkv = Linear(d_model, (1 + 2 * nh) * h * dk, bias=False)
        self.beta_proj = Linear(d_model, nh * h)

    # ---------------------------------------------------------------- the sub-step clock
    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """On the sub-step clock (N = n_h·T): q [B, N, H, K] (q_t on the last sub-step of token t, 0 on
        the others), k [B, N, H, K] (L2-normalised), v [B, N, H, V], beta [B, N, H], g [B, N, H]
        (g_t on the first sub-step, 0 on the others)."""
        b, t, _ = x.shape
        h, dk, nh = self.n_heads, self.head_dim, self.n_h
        qkv = self.qkv(x)
        q = F.normalize(qkv[..., : h * dk].view(b, t, 1, h, dk), dim=-1)
        k, v = qkv[..., h * dk:].view(b, t, 2, nh, h, dk).unbind(2)  # [B, T, n_h, H, K]
        beta = torch.sigmoid(self.beta_proj(x)).view(b, t, nh, h)
        if self.config.allow_neg_eigval:
            beta = 2 * beta
        g = self._log_decay(x)[:, :, None]  # [B, T, 1, H]
        q = torch.cat([q.new_zeros(b, t, nh - 1, h, dk), q], 2)
        g = torch.cat([g, g.new_zeros(b, t, nh - 1, h)], 2)
        flat = lambda z: z.flatten(1, 2)  # noqa: E731  [B, T, n_h, ...] -> [B, N, ...]
        return flat(q), flat(F.normalize(k, dim=-1)), flat(v), flat(beta), flat(g)

    def _segment(self, x: Tensor, state: DeltaState | None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``_project`` of a segment with every sub-step of its padding tokens inert: beta = 0, g = 0."""
        q, k, v, beta, g = self._project(x)
        pad = None if state is None else state.padding(x.shape[1])  # [B, T]
        if pad is not None:
            pad = pad.repeat_interleave(self.n_h, 1)[..., None]  # [B, N, 1]
            beta, g = beta.masked_fill(pad, 0.0), g.masked_fill(pad, 0.0)
        return q, k, v, beta, g

    def _per_token(self, o: Tensor) -> Tensor:
        """o [B, N, H, V] on the sub-step clock -> y [B, T, D]: the last sub-step of each token."""
        return self.out(o[:, self.n_h - 1 :: self.n_h].flatten(2))

    # ---------------------------------------------------------------- modes
    def forward_chunked(self, x: Tensor, state: DeltaState | None) -> tuple[Tensor, DeltaState]:
        q, k, v, beta, g = self._segment(x, state)
        s0 = None if state is None else state.memory
        # only each token's last sub-step is read out: the other rows of the read-out are never formed
        o, s = chunked_delta_rule(q, k, v, beta, g, self.scale, s0, self.config.chunk_size, read_every=self.n_h)
        return self.out(o.flatten(2)), self._next_state(state, s, x.shape[1], x.shape[0])

    def forward_dense(self, x: Tensor, state: DeltaState | None) -> tuple[Tensor, DeltaState]:
        """U = (I - B)^{-1} (A X + offset) over the N sub-steps, then O = R U (+ S_0 read-out)."""
        b, t, _ = x.shape
        q, k, v, beta, g = self._segment(x, state)
        mix_a, mix_b, readout, decay = delta_rule_operator(q, k, beta, g, self.scale)
        decay_n = decay.transpose(1, 2)  # [B, N, H]: exp(G_p), the weight of S_0 at sub-step p
        s0 = None if state is None else state.memory
        offset = None
        if s0 is not None:
            offset = -(beta * decay_n)[..., None] * torch.einsum("bnhk,bhkv->bnhv", k, s0)
        u = solve_dense(MixOperator(mix_a, mix_b), v, offset=offset)  # [B, N, H, V] pseudo-values
        o = (readout @ u.transpose(1, 2)).transpose(1, 2)
        cum = g.cumsum(1)
        s = torch.einsum("bnhk,bnhv->bhkv", k * (cum[:, -1:] - cum).exp()[..., None], u)
        if s0 is not None:
            o = o + self.scale * decay_n[..., None] * torch.einsum("bnhk,bhkv->bnhv", q, s0)
            s = s + decay[..., -1, None, None] * s0
        return self._per_token(o), self._next_state(state, s, t, b)

    def forward_recurrent(self, x: Tensor, state: DeltaState | None) -> tuple[Tensor, DeltaState]:
        b, t, _ = x.shape
        nh = self.n_h
        state = self.empty_state(b, x.device, x.dtype) if state is None else state
        q, k, v, beta, g = self._segment(x, state)
        outs = []
        for i in range(t):
            state.observe()
            s = state.memory
            for j in range(i * nh, (i + 1) * nh):  # n_h delta steps; the decay rides on the first
                o_t, s = delta_rule_step(s, q[:, j], k[:, j], v[:, j], beta[:, j], g[:, j], self.scale)
            outs.append(o_t)  # the read-out after the last step (q is 0 on the others)
            state = self._next_state(state, s, 1, b)
        return self.out(torch.stack(outs, 1).flatten(2)), state

    # ---------------------------------------------------------------- surface
    def materialize(self, x: Tensor) -> MixOperator:
        """A, B, R [B, H, N, N] on the sub-step clock (N = n_h·T) over ``values(x)`` (zero initial state);
        token t's output is row n_h·t + n_h - 1, the other rows of R are 0."""
        q, k, _, beta, g = self._project(x)
        mix_a, mix_b, readout, _ = delta_rule_operator(q, k, beta, g, self.scale)
        return MixOperator(mix_a, mix_b, readout)

    def values(self, x: Tensor) -> Tensor:
        """The inputs X the operator mixes: v on the sub-step clock, [B, N, H, V]."""
        return self._project(x)[2]

    def flops_per_token(self, n: int) -> int:
        # per head: the K x V decay, n_h x (erase read S_ᵀ k and rank-1 write), one read-out S_tᵀ q_t
        return (2 * self.n_h + 2) * self.n_heads * self.head_dim * self.head_dim
