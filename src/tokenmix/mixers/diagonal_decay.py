"""The kernel base ``DiagonalDecayMixer``: a K x V state per head decayed by a diagonal gate and written
by k vᵀ each token, the computation that mixers of several registry families share (linear attention,
RetNet, GLA, MesaNet: "linear attention"; Mamba-2, the diagonal SSM: "state space model"; HGRN2,
RG-LRU: "gated linear recurrence"). A subclass only says how it computes q, k, v and the log decay g
from its input; the three modes, the decode state, ``materialize`` and the accounting live here.

Recurrence per head, state S [K, V] (ops/recurrent_gla.py):

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ,        o_t = scale · S_tᵀ q_t,        y_t = W_o [o_t (+ skip_t)]

Two (A, B) views of the same mixing of the values X = V [framework.md §2.3]:
    token view (B = 0):  A = (Q Kᵀ ⊙ D) · scale,  D[t, j] = prod_{s=j+1..t} exp(g_s) (per key channel
                         inside the sum over c: A[t, j] = scale sum_c q_tc k_jc exp(G_tc - G_jc));
    state view (first order, one recurrence per key channel c, the G axis of MixOperator):
                         A_c = diag(k_{·,c}),  B_c[t, t-1] = exp(g_{t,c}),  R_c = diag(q_{·,c}) · scale,
                         M = sum_c R_c (I - B_c)^{-1} A_c  (= the token view).
``materialize`` returns the state view, the true first-order form: every B_c has one sub-diagonal.
Row c of S_t is exactly the output z_t^{(c)} of recurrence c, which is how the dense mode also
returns the final state.

Modes: ``chunked`` (ops/chunked_gla.py through ``_mix_chunked``, which a subclass may route to a kernel
of its own: Mamba-2 to ops/chunked_ssd.py, the diagonal SSM to ops/selective_scan.py), ``dense``
(the state view through core.operator.solve_dense, one G = 1 recurrence per (head, key channel) so
that an initial state enters as the solver's known right-hand side), ``recurrent`` (token by token,
ops/recurrent_gla.gla_step).

Left padding (mixers/base.py), masked: a padding token is made inert before any mode sees it --
value 0 (no write k vᵀ) and log decay 0 (identity transition) -- so the state is exactly untouched
and the first real token meets the zero state of a solo run. (The state is still zero during the
leading padding, so v = 0 alone would do; g = 0 keeps arbitrary padding decays out of the chunked
forms' cumulative log decays, where they would cancel in G_t - G_j only up to rounding. The
diagonal SSM's own chunked scan does both with Delta = 0.)
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.core.packing import Packing
from tokenmix.mixers.base import Mixer, MixerState
from tokenmix.ops.chunked_gla import chunked_gla
from tokenmix.ops.recurrent_gla import gla_step


class LinearFeatures(NamedTuple):
    """What a subclass computes from its input x [B, T, D].

    q, k: [B, T, H, K];  v: [B, T, H, V] (the values the operator mixes);
    g: log decay [B, T, H, K] per key channel, [B, T, H] per head, or None (decay 1);
    scale: readout scale;  skip: [B, T, H, V] direct per-token term added to o before the output
    projection (the SSMs' D x_t), or None. It is pointwise in time, so it is not part of the mixing.
    """

    q: Tensor
    k: Tensor
    v: Tensor
    g: Tensor | None
    scale: float
    skip: Tensor | None = None


class MatrixState(MixerState):
    """Fixed-size decode state: ``memory`` [B, H, K, V], the matrix S after ``position`` tokens."""

    def __init__(self, owner: str, batch_size: int, position: int, memory: Tensor) -> None:
        self.owner, self.batch_size, self.position, self.memory = owner, batch_size, position, memory

    def tensors(self) -> dict[str, Tensor]:
        return {"memory": self.memory}

    def numel_per_batch(self) -> int:
        # from the shape: ``observe`` calls this before every decoded token
        return math.prod(self.memory.shape[1:])


def state_view_operator(f: LinearFeatures) -> MixOperator:
    """First-order state view over one segment: A_c = diag(k_c), B_c = sub-diagonal exp(g_c), R_c = diag(q_c)·scale.

    Returns a MixOperator with a G = K axis: A, B, R [B, H, K, T, T].
    """
    b, t, h, dk = f.q.shape
    mix_a = torch.diag_embed(f.k.permute(0, 2, 3, 1))  # [B, H, K, T, T]
    readout = torch.diag_embed(f.q.permute(0, 2, 3, 1) * f.scale)
    if f.g is None:
        decay = f.q.new_ones(b, h, dk, max(t - 1, 0))
    else:
        g = f.g if f.g.dim() == 4 else f.g[..., None].expand(b, t, h, dk)
        decay = g.permute(0, 2, 3, 1)[..., 1:].exp()  # [B, H, K, T-1]: exp(g_t), t >= 1
    mix_b = torch.diag_embed(decay, offset=-1)
    return MixOperator(mix_a, mix_b, readout)


class DiagonalDecayMixer(Mixer):
    """The diagonal-decay recurrence above, its modes and state. Subclasses set ``state_heads``,
    ``key_dim``, ``value_dim`` and ``has_decay`` in ``__init__``, own an output projection ``out`` and
    implement ``_features``."""

    modes = ("chunked", "dense", "recurrent")
    #: ``forward_chunked``'s kernel (ops/chunked_gla.py) resets the state at document boundaries (a
    #: member with its own chunked kernel must state what that one does: ``Mixer.__init_subclass__``)
    packing_modes = ("chunked",)
    time_complexity = "O(1)"  # per token: O(H K V) work on the state, independent of n
    cache_complexity = "O(1)"  # one K x V matrix per head, independent of n
    state_heads: int
    key_dim: int
    value_dim: int
    has_decay: bool

    @abstractmethod
    def _features(self, x: Tensor) -> LinearFeatures:
        """q, k, v, log-decay (and skip term) of x [B, T, D], defined by each mixer."""

    def _output(self, o: Tensor, f: LinearFeatures) -> Tensor:
        """o [B, T, H, V] -> y [B, T, D]."""
        if f.skip is not None:
            o = o + f.skip
        return self.out(o.flatten(2))

    def _segment_features(self, x: Tensor, state: MatrixState | None) -> LinearFeatures:
        """``_features`` of a segment, its padding tokens (if any) inert: v = 0, g = 0."""
        f = self._features(x)
        pad = None if state is None else state.padding(x.shape[1])  # [B, T]
        if pad is None:
            return f
        g = f.g
        if g is not None:
            g = g.masked_fill(pad[:, :, None] if g.dim() == 3 else pad[:, :, None, None], 0.0)
        return f._replace(v=f.v.masked_fill(pad[:, :, None, None], 0.0), g=g)

    def _next_state(self, state: MatrixState | None, memory: Tensor, t: int, batch: int) -> MatrixState:
        pos = 0 if state is None else state.position
        new = MatrixState(self.owner, batch, pos + t, memory)
        return new.carry_over(state) if state is not None else new

    def _mix_chunked(
        self, f: LinearFeatures, s0: Tensor | None, doc_starts: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """The chunked mixing alone: o [B, T, H, V] and the final state [B, H, K, V] from the features
        (``doc_starts``: ``Packing.starts`` of a packed segment, the state resetting at each boundary)."""
        return chunked_gla(f.q, f.k, f.v, f.g, f.scale, s0, self.config.chunk_size, doc_starts)

    def mixing_core(self, x: Tensor) -> tuple[Callable[..., tuple[Tensor, Tensor]], tuple[Tensor | None, ...]]:
        """(fn, inputs) such that fn(*inputs) is the chunked mode's mixing of x without the projections.

        For benchmarks: the inputs are x's features as leaves, requiring gradients where the mixer's
        own features do (RetNet's constant decays do not); fn returns (o, final state).
        """
        f = self._features(x)
        leaves = tuple(None if z is None else z.detach().requires_grad_(z.requires_grad) for z in (f.q, f.k, f.v, f.g))
        scale = f.scale

        def fn(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None) -> tuple[Tensor, Tensor]:
            return self._mix_chunked(LinearFeatures(q, k, v, g, scale), None)

        return fn, leaves

    # ---------------------------------------------------------------- modes
    def forward_chunked(
        self, x: Tensor, state: MatrixState | None, packing: Packing | None = None
    ) -> tuple[Tensor, MatrixState]:
        """The chunked kernel; with ``packing`` (``chunked`` is a packing mode here and in every member
        that keeps this kernel) the kernel resets the state at each document boundary and the
        returned memory is each row's last document's."""
        f = self._segment_features(x, state)
        s0 = None if state is None else state.memory
        o, s = self._mix_chunked(f, s0) if packing is None else self._mix_chunked(f, s0, packing.starts)
        return self._output(o, f), self._next_state(state, s, x.shape[1], x.shape[0])

    def forward_dense(self, x: Tensor, state: MatrixState | None) -> tuple[Tensor, MatrixState]:
        """Z^(c) = (I - B_c)^{-1} A_c V per (head, key channel) through the reference solver, O = sum_c R_c Z^(c).

        The recurrences are solved as G = 1 operators (heads x key channels folded together) so that an
        initial state enters as the known right-hand side exp(g_0) S_0 of row 0, and S_T = Z_{T-1}.
        """
        b, t, _ = x.shape
        f = self._segment_features(x, state)
        o, memory = self._solve_state_view(f, None if state is None else state.memory)
        return self._output(o, f), self._next_state(state, memory, t, b)

    def _solve_state_view(self, f: LinearFeatures, memory: Tensor | None) -> tuple[Tensor, Tensor]:
        """(O [B, T, H, V], S_T [B, H, K, V]) of the state-view operator of ``f`` by the reference
        solver, the carried memory S_0 [B, H, K, V] (None = zeros) entering row 0 decayed by token 0."""
        b, t = f.v.shape[:2]
        op = state_view_operator(f)
        h, dk, dv = self.state_heads, self.key_dim, self.value_dim
        folded = MixOperator(op.A.flatten(1, 2), op.B.flatten(1, 2))  # [B, H*K, T, T]
        values = f.v.unsqueeze(3).expand(b, t, h, dk, dv).reshape(b, t, h * dk, dv)
        offset = None
        if memory is not None:
            carried = memory
            if f.g is not None:
                g0 = f.g[:, 0] if f.g.dim() == 4 else f.g[:, 0, :, None]
                carried = g0.exp()[..., None] * carried  # S_0 decayed by token 0
            offset = torch.cat([carried.reshape(b, 1, h * dk, dv), values.new_zeros(b, t - 1, h * dk, dv)], 1)
        z = solve_dense(folded, values, offset=offset)  # [B, T, H*K, V]
        z = z.reshape(b, t, h, dk, dv).permute(0, 2, 3, 1, 4)  # [B, H, K, T, V]
        o = (op.R @ z).sum(2).transpose(1, 2)  # [B, T, H, V]
        return o, z[..., -1, :]

    def forward_recurrent(self, x: Tensor, state: MatrixState | None) -> tuple[Tensor, MatrixState]:
        b, t, _ = x.shape
        state = self.empty_state(b, x.device, x.dtype) if state is None else state
        f = self._segment_features(x, state)
        outs = []
        gs = [None] * t if f.g is None else f.g.unbind(1)  # unbind once (see recurrent_gla)
        for q_t, k_t, v_t, g_t in zip(f.q.unbind(1), f.k.unbind(1), f.v.unbind(1), gs):
            state.observe()
            o_t, s = gla_step(state.memory, q_t, k_t, v_t, g_t, f.scale)
            outs.append(o_t)
            state = self._next_state(state, s, 1, b)
        return self._output(torch.stack(outs, 1), f), state

    # ---------------------------------------------------------------- surface
    def empty_state(
        self, batch_size: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> MatrixState:
        memory = torch.zeros(batch_size, self.state_heads, self.key_dim, self.value_dim, device=device, dtype=dtype)
        return MatrixState(self.owner, batch_size, 0, memory)

    def materialize(self, x: Tensor) -> MixOperator:
        """First-order state view (A_c, B_c, R_c) [B, H, K, T, T] over the values v of x [B, T, D]."""
        return state_view_operator(self._features(x))

    def values(self, x: Tensor) -> Tensor:
        """The inputs X the operator mixes: v [B, T, H, V]."""
        return self._features(x).v

    def state_size(self, n: int) -> int:
        return self.state_heads * self.key_dim * self.value_dim  # S [K, V] per head, whatever n

    def flops_per_token(self, n: int) -> int:
        # the rank-1 write k_t v_tᵀ and the read S_tᵀ q_t (a multiply-add per state entry each), plus
        # the decay of S when there is one: a multiply per entry, i.e. half a multiply-add
        kv = self.state_heads * self.key_dim * self.value_dim
        return 2 * kv + (kv // 2 if self.has_decay else 0)
