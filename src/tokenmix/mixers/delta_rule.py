"""Shared machinery of the delta-rule mixers (DeltaNet, Gated DeltaNet, Gated DeltaProduct, KDA, Gated
DeltaNet-2, log-linear Gated DeltaNet): linear attention whose memory is corrected toward each new
value. A member states only what differs (which decay gate, a sub-step clock, projections or terms
of its own); the shared projections, the decay gate, the modes, the decode state, ``materialize`` and
the accounting live here.

Rule per head, state S [K, V] (fla's layout), q, k L2-normalised, scale = K^-1/2:

    S_t = (I - k_t e_tᵀ) Diag(exp(g_t)) S_{t-1} + k_t w_tᵀ,        o_t = scale · S_tᵀ q_t,

with an erase key e_t [K], a write value w_t [V] and a log decay g_t <= 0. The members:

    deltanet                   e = beta k,  w = beta v,        g = 0
    gated_deltanet             e = beta k,  w = beta v,        g one value per head
    gated_delta_product        n_h such steps per token (each with its own k, v, beta), g on the first
    kda                        e = beta k,  w = beta v,        g per key channel
    gdn2                       e = b ⊙ k,   w = w_gate ⊙ v,    g per key channel (channel-wise gates b, w_gate)
    log_linear_gated_deltanet  gated_deltanet's steps on Fenwick buckets, read with per-level scales

beta_t = sigmoid(w_betaᵀ x_t) in (0, 1), or 2·sigmoid in (0, 2) with ``allow_neg_eigval`` (the
transition I - beta k kᵀ then has an eigenvalue down to -1, Grazzi et al. 2025); the decay gate is
Mamba-2's g_t = -exp(A_log) ⊙ softplus(W_a x_t + dt_bias), one value per head or per key channel.

(A, B, R) derivation over the mixed values X. With G_t = sum_{i<=t} g_i [K] (⊙ scales the K rows),
guess S_t = exp(G_t) ⊙ S_0 + sum_{j<=t} (exp(G_t - G_j) ⊙ k_j) u_jᵀ for pseudo-values u_j [V]. Then

    Diag(exp(g_t)) S_{t-1} = exp(G_t) ⊙ S_0 + sum_{j<t} (exp(G_t - G_j) ⊙ k_j) u_jᵀ,

and the rule S_t = Diag(exp(g_t)) S_{t-1} + k_t (w_t - (Diag(exp(g_t)) S_{t-1})ᵀ e_t)ᵀ holds with

    u_t = w_t - S_0ᵀ (exp(G_t) ⊙ e_t) - sum_{j<t} [sum_d e_td k_jd exp(G_td - G_jd)] u_j.

Stacked over t, per head, all [T, T]:

    U = (I - B)^{-1} (A X + offset),   B[t, j] = -sum_d e_td k_jd exp(G_td - G_jd)   (j < t),
                                       offset_t = -S_0ᵀ (exp(G_t) ⊙ e_t),
    O = R U + scale (Q ⊙ exp(G)) S_0,  R[t, j] = scale sum_d q_td k_jd exp(G_td - G_jd)   (j <= t),
    S_T = exp(G_T) ⊙ S_0 + sum_j (exp(G_T - G_j) ⊙ k_j) u_jᵀ,

A X = W: A = diag(beta) over X = V for a write gate per head, A = I over X = w_gate ⊙ V for a
channel-wise one (a T x T matrix cannot hold a gate on the value channels). B is dense and data
dependent: an infinite-order recurrence on the pseudo-values. The channel sum sits inside each entry
(as in GLA), so the mixing stays one T x T solve per head; a per-head g makes it the scalar
exp(G_t - G_j) k_t·k_j, and g = 0 gives DeltaNet's B[t, j] = -beta_t k_t·k_j, R = (Q Kᵀ ⊙ L)·scale.
Every exponent is G_t - G_j with j <= t, hence <= 0: the materialised matrices never overflow.

Two sets of modes, each implemented once:
    ``DeltaRuleMixer``  e = beta k, g per head or none (ops/chunked_delta.py): ``chunked`` (the UT
                        transform), ``dense`` (``delta_rule_operator`` and core.operator.solve_dense),
                        ``recurrent`` (``delta_rule_step``). Optionally on a sub-step clock of
                        ``substeps`` positions per token, read out on each token's last (DeltaProduct).
    ``ChannelDelta``    any e, w and a per-channel g (ops/chunked_channel_delta.py), the same three.
The log-linear member keeps ``DeltaRuleMixer``'s projections and gate and brings its own modes and
state (Fenwick buckets, mixers/log_linear.py). Decode state of the others: ``DeltaState``, S [K, V]
per head, whatever n.

Left padding (mixers/base.py), masked: a padding token gets beta = 0 (a = 0 and e = 0 in the
channel-wise form: no write, and the transition I - k eᵀ is the identity) and g = 0 (no decay, which
also keeps padding decays out of the cumulative G), so the state is exactly untouched and the first
real token meets the zero state of a solo run.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.core.packing import Packing
from tokenmix.mixers.base import Linear, Mixer, MixerConfig, MixerState
from tokenmix.ops.chunked_channel_delta import channel_delta_operator, channel_delta_step, chunked_channel_delta_rule
from tokenmix.ops.chunked_delta import chunked_delta_rule, delta_rule_operator, delta_rule_step


class DeltaState(MixerState):
    """Fixed-size decode state: ``memory`` [B, H, K, V], the matrix S after ``position`` tokens."""

    def __init__(self, owner: str, batch_size: int, position: int, memory: Tensor) -> None:
        self.owner, self.batch_size, self.position, self.memory = owner, batch_size, position, memory

    def tensors(self) -> dict[str, Tensor]:
        return {"memory": self.memory}


class DeltaRuleMixer(Mixer):
    """Base of the delta-rule mixers: the delta rule with beta per head and an optional decay gate.

    Builds ``qkv`` (q, k, v of H heads of K = V = head_dim), ``beta_proj`` (beta per head), ``out``
    and, when ``decay_gate`` is set, the gate ``a_proj``, ``A_log``, ``dt_bias``, in that order: the
    order a seed initialises them in. Reads ``chunk_size`` and ``allow_neg_eigval`` from the config
    (DeltaNetConfig), and ``dt_min``, ``dt_max`` with a gate (GatedDeltaNetConfig).
    A member sets ``decay_gate`` and, on a sub-step clock, ``substeps`` and its own ``_project``.
    """

    modes = ("chunked", "dense", "recurrent")
    #: ``forward_chunked``'s kernel resets the state at document boundaries (a member with its own
    #: chunked kernel must state what that one does: ``Mixer.__init_subclass__``)
    packing_modes = ("chunked",)
    time_complexity = "O(1)"  # per token: K x V work, independent of n
    cache_complexity = "O(1)"  # one K x V matrix per head
    #: the decay gate: None (no decay), one log decay per "head" or per key "channel"
    decay_gate: ClassVar[Literal["head", "channel"] | None] = None
    #: positions of the operator clock per token (materialize is [N, N], N = substeps·T)
    substeps: int = 1

    def __init__(self, config: MixerConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, k = self.n_heads, self.head_dim
        self.qkv = Linear(d_model, 3 * h * k, bias=False)
        self.beta_proj = Linear(d_model, h)
        self.out = Linear(h * k, d_model, bias=False)
        self.scale = k**-0.5
        if self.decay_gate is not None:
            width = h if self.decay_gate == "head" else h * k
            self.a_proj = Linear(d_model, width, bias=False)
            self.A_log = nn.Parameter(torch.empty(h).uniform_(1, 16).log())
            dt = torch.exp(torch.empty(width).uniform_(math.log(config.dt_min), math.log(config.dt_max)))
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^{-1}(dt)

    # ---------------------------------------------------------------- shared pieces
    def _log_decay(self, x: Tensor) -> Tensor | None:
        """g = -exp(A_log) softplus(a_proj x + dt_bias) <= 0: [B, T, H] per head, [B, T, H, K] per
        key channel, or None without a gate."""
        if self.decay_gate is None:
            return None
        raw = F.softplus(self.a_proj(x) + self.dt_bias)
        if self.decay_gate == "head":
            return -self.A_log.exp() * raw
        b, t, _ = x.shape
        return -self.A_log.exp()[:, None] * raw.view(b, t, self.n_heads, self.head_dim)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
        """q, k [B, T, H, K] (L2-normalised), v [B, T, H, K], beta [B, T, H], g (``_log_decay``)."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        beta = torch.sigmoid(self.beta_proj(x))
        if self.config.allow_neg_eigval:
            beta = 2 * beta
        return F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, beta, self._log_decay(x)

    def _segment(self, x: Tensor, state: DeltaState | None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
        """``_project`` of a segment, every sub-step of its padding tokens (if any) inert: beta = 0, g = 0."""
        q, k, v, beta, g = self._project(x)
        pad = None if state is None else state.padding(x.shape[1])  # [B, T]
        if pad is not None:
            pad = pad.repeat_interleave(self.substeps, 1)[..., None]  # [B, N, 1]
            beta = beta.masked_fill(pad, 0.0)
            g = None if g is None else g.masked_fill(pad, 0.0)
        return q, k, v, beta, g

    def _next_state(self, state: DeltaState | None, memory: Tensor, t: int, batch: int) -> DeltaState:
        pos = 0 if state is None else state.position
        new = DeltaState(self.owner, batch, pos + t, memory)
        return new.carry_over(state) if state is not None else new

    # ---------------------------------------------------------------- modes
    def forward_chunked(
        self, x: Tensor, state: DeltaState | None, packing: Packing | None = None
    ) -> tuple[Tensor, DeltaState]:
        """The UT-transform kernel; with ``packing`` (``chunked`` is a packing mode here and in every
        member that keeps this kernel) the kernel resets the state at each document boundary and the
        returned memory is each row's last document's."""
        q, k, v, beta, g = self._segment(x, state)
        s0 = None if state is None else state.memory
        n = self.substeps
        doc_starts = None
        if packing is not None:  # on the sub-step clock: token t's sub-steps are positions n t .. n t + n - 1
            doc_starts = packing.starts if n == 1 else (packing.starts * n).repeat_interleave(n, 1)
        # on a sub-step clock only each token's last sub-step is read out: the other rows are never formed
        o, s = chunked_delta_rule(
            q, k, v, beta, g, self.scale, s0, self.config.chunk_size, read_every=n, doc_starts=doc_starts
        )
        return self.out(o.flatten(2)), self._next_state(state, s, x.shape[1], x.shape[0])

    def forward_dense(self, x: Tensor, state: DeltaState | None) -> tuple[Tensor, DeltaState]:
        """U = (I - B)^{-1} (A V + offset) through the reference solver, then O = R U (+ S_0 readout)."""
        b, t, _ = x.shape
        q, k, v, beta, g = self._segment(x, state)
        mix_a, mix_b, readout, decay = delta_rule_operator(q, k, beta, g, self.scale)
        decay_n = decay.transpose(1, 2)  # [B, N, H]: exp(G_p), the weight of S_0 at position p
        s0 = None if state is None else state.memory
        offset = None
        if s0 is not None:
            offset = -(beta * decay_n)[..., None] * torch.einsum("bnhk,bhkv->bnhv", k, s0)
        u = solve_dense(MixOperator(mix_a, mix_b), v, offset=offset)  # [B, N, H, V] pseudo-values
        o = (readout @ u.transpose(1, 2)).transpose(1, 2)
        # final state S_T = exp(G_T) S_0 + sum_j exp(G_T - G_j) k_j u_jᵀ
        if g is None:
            k_end, carried = k, 1.0
        else:
            cum = g.cumsum(1)
            k_end = k * (cum[:, -1:] - cum).exp()[..., None]
            carried = decay[..., -1, None, None]
        s = torch.einsum("bnhk,bnhv->bhkv", k_end, u)
        if s0 is not None:
            o = o + self.scale * decay_n[..., None] * torch.einsum("bnhk,bhkv->bnhv", q, s0)
            s = s + carried * s0
        o = o[:, self.substeps - 1 :: self.substeps]  # each token's output: its last position
        return self.out(o.flatten(2)), self._next_state(state, s, t, b)

    def forward_recurrent(self, x: Tensor, state: DeltaState | None) -> tuple[Tensor, DeltaState]:
        b, t, _ = x.shape
        n = self.substeps
        state = self.empty_state(b, x.device, x.dtype) if state is None else state
        q, k, v, beta, g = self._segment(x, state)
        outs = []
        for i in range(t):
            state.observe()
            s = state.memory
            for p in range(i * n, (i + 1) * n):  # a token's steps; a decay rides on its first
                o_t, s = delta_rule_step(
                    s, q[:, p], k[:, p], v[:, p], beta[:, p], None if g is None else g[:, p], self.scale
                )
            outs.append(o_t)  # the read-out after the last step
            state = self._next_state(state, s, 1, b)
        return self.out(torch.stack(outs, 1).flatten(2)), state

    # ---------------------------------------------------------------- surface
    def empty_state(
        self, batch_size: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> DeltaState:
        memory = torch.zeros(batch_size, self.n_heads, self.head_dim, self.head_dim, device=device, dtype=dtype)
        return DeltaState(self.owner, batch_size, 0, memory)

    def materialize(self, x: Tensor) -> MixOperator:
        """A = diag(beta), B, R [B, H, N, N] over ``values(x)`` (zero initial state); on a sub-step
        clock token t's output is row substeps·t + substeps - 1 and the other rows of R are 0."""
        q, k, _, beta, g = self._project(x)
        mix_a, mix_b, readout, _ = delta_rule_operator(q, k, beta, g, self.scale)
        return MixOperator(mix_a, mix_b, readout)

    def values(self, x: Tensor) -> Tensor:
        """The inputs X the operator mixes: v [B, N, H, V]."""
        return self._project(x)[2]

    def state_size(self, n: int) -> int:
        return self.n_heads * self.head_dim * self.head_dim  # S [K, V] per head, whatever n

    def flops_per_token(self, n: int) -> int:
        # per head, in K x V multiply-adds: the decay of S (with a gate), per step the erase read
        # S_ᵀ k and the rank-1 write, and one read-out S_tᵀ q_t
        return (2 * self.substeps + 1 + (self.decay_gate is not None)) * self.n_heads * self.head_dim * self.head_dim


class ChannelDelta(DeltaRuleMixer):
    """Modes of the channel-wise gated delta rule over ``_terms``; a member defines the terms.

    The decay gate is per key channel; ``_terms`` may use the base's projections (KDA) or its own.
    """

    decay_gate = "channel"
    packing_modes = ()  # ops/chunked_channel_delta.py has no document boundaries: packed rows run piece by piece

    @abstractmethod
    def _terms(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """q, k [B, T, H, K]; values X [B, T, H, V]; write gate a ([B, T, H] or [B, T, H, V]);
        erase key e [B, T, H, K]; log decay g [B, T, H, K]. The write value is w = a ⊙ X."""

    def _segment_terms(self, x: Tensor, state: DeltaState | None):
        """``_terms`` of a segment with its padding tokens inert: a = 0, e = 0, g = 0."""
        q, k, vals, a, e, g = self._terms(x)
        pad = None if state is None else state.padding(x.shape[1])  # [B, T]
        if pad is not None:
            a = a.masked_fill(pad.view(*pad.shape, *([1] * (a.dim() - 2))), 0.0)
            e = e.masked_fill(pad[..., None, None], 0.0)
            g = g.masked_fill(pad[..., None, None], 0.0)
        return q, k, vals, a, e, g

    @staticmethod
    def _write(vals: Tensor, a: Tensor) -> Tensor:
        return vals * (a if a.dim() == vals.dim() else a[..., None])

    # ---------------------------------------------------------------- modes
    def forward_chunked(self, x: Tensor, state: DeltaState | None) -> tuple[Tensor, DeltaState]:
        q, k, vals, a, e, g = self._segment_terms(x, state)
        s0 = None if state is None else state.memory
        o, s = chunked_channel_delta_rule(q, k, self._write(vals, a), e, g, self.scale, s0, self.config.chunk_size)
        return self.out(o.flatten(2)), self._next_state(state, s, x.shape[1], x.shape[0])

    def forward_dense(self, x: Tensor, state: DeltaState | None) -> tuple[Tensor, DeltaState]:
        """U = (I - B)^{-1} (A X + offset) through the reference solver, then O = R U (+ S_0 readout)."""
        b, t, _ = x.shape
        q, k, vals, a, e, g = self._segment_terms(x, state)
        mix_a, xs = self._mix_a(a, vals)
        mix_b, readout, decay = channel_delta_operator(q, k, e, g, self.scale)  # decay [B,H,T,K]
        decay_t = decay.transpose(1, 2)  # [B, T, H, K]
        s0 = None if state is None else state.memory
        offset = None if s0 is None else -torch.einsum("bthk,bhkv->bthv", e * decay_t, s0)
        u = solve_dense(MixOperator(mix_a, mix_b), xs, offset=offset)  # [B, T, H, V] pseudo-values
        o = (readout @ u.transpose(1, 2)).transpose(1, 2)
        cum = g.cumsum(1)
        s = torch.einsum("bthk,bthv->bhkv", k * (cum[:, -1:] - cum).exp(), u)
        if s0 is not None:
            o = o + self.scale * torch.einsum("bthk,bhkv->bthv", q * decay_t, s0)
            s = s + decay[:, :, -1, :, None] * s0
        return self.out(o.flatten(2)), self._next_state(state, s, t, b)

    def forward_recurrent(self, x: Tensor, state: DeltaState | None) -> tuple[Tensor, DeltaState]:
        b, t, _ = x.shape
        state = self.empty_state(b, x.device, x.dtype) if state is None else state
        q, k, vals, a, e, g = self._segment_terms(x, state)
        w = self._write(vals, a)
        outs = []
        for i in range(t):
            state.observe()
            o_t, s = channel_delta_step(state.memory, q[:, i], k[:, i], w[:, i], e[:, i], g[:, i], self.scale)
            outs.append(o_t)
            state = self._next_state(state, s, 1, b)
        return self.out(torch.stack(outs, 1).flatten(2)), state

    # ---------------------------------------------------------------- surface
    def _mix_a(self, a: Tensor, vals: Tensor) -> tuple[Tensor, Tensor]:
        """(A [B, H, T, T], the values it multiplies [B, T, H, V]): A = diag(a) over X for a scalar
        gate per head; a channel-wise write gate is folded into the values (A = I over a ⊙ X)."""
        if a.dim() == vals.dim():
            ones = a.new_ones(a.shape[0], a.shape[2], a.shape[1])
            return torch.diag_embed(ones), vals * a
        return torch.diag_embed(a.transpose(1, 2)), vals

    def materialize(self, x: Tensor) -> MixOperator:
        """A, B, R over the values of ``x`` [B, T, D] (zero initial state)."""
        q, k, vals, a, e, g = self._terms(x)
        mix_a, _ = self._mix_a(a, vals)
        mix_b, readout, _ = channel_delta_operator(q, k, e, g, self.scale)
        return MixOperator(mix_a, mix_b, readout)

    def values(self, x: Tensor) -> Tensor:
        """The inputs X the operator mixes, [B, T, H, V] (see ``_mix_a``)."""
        _, _, vals, a, _, _ = self._terms(x)
        return self._mix_a(a, vals)[1]
