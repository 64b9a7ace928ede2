"""What the log-linear mixers share (log_linear, log_linear_mamba2, log_linear_gated_deltanet): the
Fenwick state, the level scales and the three modes around an op (ops/fenwick_levels.py).

Each of them weights the pair (t, s) by a level scale lambda_t^(l(t,s)) = softplus(W_lambda x_t +
b_lambda)^(l), l(t, s) = bit_length(t XOR s), and keeps O(log n) Fenwick bucket states [K, V]. A member
(``FenwickLevelMixer`` first among its bases) states only its projections and its op:

    _level_inputs(x, start) -> the op's per-token tensors [B, T, H, ...] (q first, v third, lambda last)
    _chunked(inputs, init, start), _dense(inputs, init, start) -> (o [B, T, H, V], final levels)
    _step: the op's decode step, ``step(levels, t, *inputs_t, scale) -> (o_t, levels)``

and this file runs the modes, the state and its size. Left padding by row groups: the level map is
not translation invariant, so each row needs its own clock (mixers/base.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.core.errors import InputError
from tokenmix.mixers.base import Linear, MixerState
from tokenmix.ops.fenwick_levels import n_levels


def check_fenwick_config(chunk_size: int, max_levels: int) -> None:
    """The chunked form's aligned chunks need a power of two; at least one level scale."""
    if not isinstance(chunk_size, int) or chunk_size <= 0 or chunk_size & (chunk_size - 1):
        raise InputError(f"chunk_size must be a power of two > 0, got {chunk_size}")
    if not max_levels > 0:
        raise InputError(f"max_levels must be > 0, got {max_levels}")


class FenwickState(MixerState):
    """Fenwick bucket states: ``levels`` [B, H, bit_length(position), K, V], slot l-1 = level l."""

    def __init__(self, owner: str, batch_size: int, position: int, levels: Tensor) -> None:
        self.owner, self.batch_size, self.position, self.levels = owner, batch_size, position, levels

    def tensors(self) -> dict[str, Tensor]:
        return {"levels": self.levels}

    @staticmethod
    def resumed(state: "FenwickState | None") -> tuple[int, Tensor | None]:
        """(first position of the next segment, its initial levels or None for a fresh start)."""
        if state is None or state.position == 0:
            return 0, None
        return state.position, state.levels

    @classmethod
    def after(
        cls, state: "FenwickState | None", owner: str, levels: Tensor, position: int, batch: int
    ) -> "FenwickState":
        """The state holding ``levels`` at ``position``, carrying ``state``'s bookkeeping over."""
        new = cls(owner, batch, position, levels)
        return new.carry_over(state) if state is not None else new


class FenwickLevelMixer:
    """Mixin, first among a log-linear mixer's bases (before ``Mixer`` or a kernel base): the modes,
    the Fenwick state and the level scales. The member sets ``key_dim`` (K; V = head_dim) and
    ``scale``, calls ``_init_level_scales`` and defines the hooks of the module docstring."""

    modes = ("chunked", "dense", "recurrent")
    time_complexity = "O(log n)"  # per token: one K x V read (and update) per Fenwick level
    cache_complexity = "O(log n)"  # bit_length(n) bucket states [K, V]
    pads_by_row_groups = True  # the Fenwick levels follow each row's own clock t - start
    packing_modes = ()  # the level-wise kernels have no document boundaries: packed rows run piece by piece
    _step: ClassVar[Callable[..., tuple[Tensor, Tensor]]]

    def _init_level_scales(self, d_model: int) -> None:
        """``level_proj``: lambda per head and level, b_lambda such that every lambda starts at 1
        (softplus(b) = 1), i.e. as the mixer without levels (Mamba-2, Gated DeltaNet)."""
        self.level_proj = Linear(d_model, self.n_heads * self.config.max_levels)
        nn.init.constant_(self.level_proj.bias, math.log(math.e - 1))

    def _level_scales(self, x: Tensor, start: int) -> Tensor:
        """lambda [B, T, H, max_levels] of tokens start..start+T-1; refuses positions beyond max_levels."""
        b, t, _ = x.shape
        need = n_levels(start + t)
        if need > self.config.max_levels:
            raise InputError(
                f"position {start + t - 1} needs {need} Fenwick levels but max_levels="
                f"{self.config.max_levels}; raise max_levels"
            )
        return F.softplus(self.level_proj(x)).view(b, t, self.n_heads, self.config.max_levels)

    def _after(self, x: Tensor, o: Tensor, state: FenwickState | None, levels: Tensor, start: int):
        """(y = W_o [o]_heads, the state after the segment ``x``)."""
        return self.out(o.flatten(2)), FenwickState.after(state, self.owner, levels, start + x.shape[1], x.shape[0])

    # ---------------------------------------------------------------- modes
    def forward_chunked(self, x: Tensor, state: FenwickState | None) -> tuple[Tensor, FenwickState]:
        start, init = FenwickState.resumed(state)
        o, levels = self._chunked(self._level_inputs(x, start), init, start)
        return self._after(x, o, state, levels, start)

    def forward_dense(self, x: Tensor, state: FenwickState | None) -> tuple[Tensor, FenwickState]:
        """Through core.operator.solve_dense; the initial Fenwick states enter as known terms."""
        start, init = FenwickState.resumed(state)
        o, levels = self._dense(self._level_inputs(x, start), init, start)
        return self._after(x, o, state, levels, start)

    def forward_recurrent(self, x: Tensor, state: FenwickState | None) -> tuple[Tensor, FenwickState]:
        b, t, _ = x.shape
        state = self.empty_state(b, x.device, x.dtype) if state is None else state
        inputs = self._level_inputs(x, state.position)
        outs = []
        for i in range(t):
            state.observe()
            o_t, levels = self._step(state.levels, state.position, *(z[:, i] for z in inputs), self.scale)
            outs.append(o_t)
            state = FenwickState.after(state, self.owner, levels, state.position + 1, b)
        return self.out(torch.stack(outs, 1).flatten(2)), state

    # ---------------------------------------------------------------- surface
    def empty_state(
        self, batch_size: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> FenwickState:
        levels = torch.zeros(batch_size, self.n_heads, 0, self.key_dim, self.head_dim, device=device, dtype=dtype)
        return FenwickState(self.owner, batch_size, 0, levels)

    def state_size(self, n: int) -> int:
        # Before token t the state holds bit_length(t) levels of K x V per head; over t < n the
        # largest is t = n - 1 (bit_length is non-decreasing).
        return self.n_heads * self.key_dim * self.head_dim * max(n - 1, 0).bit_length()
