"""The uniform surface every mixer implements.

    forward(x, state=None, mode=None) -> (y, state)   x, y: [B, T, D]
    step(x_t, state) -> (y_t, state)                  x_t, y_t: [B, D]  (one decoded token)
    materialize(x) -> MixOperator                     A, B (, R) over the values, for short T
    init_state(batch_size, device, dtype) -> MixerState

``modes`` lists the exact computation modes; the first is the training default. Every mode accepts
an initial state and returns the final state, so a long sequence can be fed in uneven pieces
(multi-token continuation). ``dense`` goes through ``materialize`` and the one reference solver.

Accounting is derived, never measured here. Over an n-token decode, while token t < n is processed:
``cache_positions(n)`` = the most past positions the state holds (0 for fixed-size states),
``state_size(n)`` = the most scalars it holds per batch element, ``flops_per_token(n)`` = the
multiply-adds of the mixing for the last token. Tests and ``tokenmix analyze`` compare them with
the measured ``MixerState.peak_positions`` / ``peak_numel``.
"""
from __future__ import annotations

from abc import ABC, ABCMeta, abstractmethod
from dataclasses import dataclass, fields
from typing import ClassVar

import torch
from torch import Tensor, nn

from tokenmix.core.operator import MixOperator


@dataclass(frozen=True)
class MixerConfig:
    """Fields shared by all mixers. head_dim None means d_model // n_heads."""

    n_heads: int = 2
    head_dim: int | None = None

    def __post_init__(self) -> None:
        if self.n_heads <= 0:
            raise ValueError(f"n_heads must be > 0, got {self.n_heads}")
        if self.head_dim is not None and self.head_dim <= 0:
            raise ValueError(f"head_dim must be > 0, got {self.head_dim}")

    def resolved_head_dim(self, d_model: int) -> int:
        if self.head_dim is not None:
            return self.head_dim
        if d_model % self.n_heads:
            raise ValueError(f"head_dim mismatch: d_model={d_model} is not divisible by n_heads={self.n_heads}; "
                             "set head_dim explicitly")
        return d_model // self.n_heads

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class MixerState(ABC):
    """Decode state of one mixer layer. Subclasses hold tensors; ``position`` counts tokens seen.

    ``peak_positions`` / ``peak_numel`` are *measured*: the recurrent mode calls ``observe()`` before
    each token, so after an n-token decode they hold the largest cache (past positions, scalars per
    batch element) that any token read. They are what ``cache_positions(n)`` / ``state_size(n)``
    derive.
    """

    position: int
    batch_size: int
    owner: str  # identifies the mixer configuration that produced it
    peak_positions: int = 0
    peak_numel: int = 0

    def observe(self) -> None:
        self.peak_positions = max(self.peak_positions, self.cached_positions())
        self.peak_numel = max(self.peak_numel, self.numel_per_batch())

    def carry_peaks(self, other: "MixerState") -> "MixerState":
        """Copy the measured peaks of ``other`` (the state this one replaces); returns self."""
        self.peak_positions, self.peak_numel = other.peak_positions, other.peak_numel
        return self

    @abstractmethod
    def tensors(self) -> dict[str, Tensor]:
        """Named tensors of the state, in a canonical order (for comparisons and accounting)."""

    def numel_per_batch(self) -> int:
        return sum(t[0].numel() for t in self.tensors().values())

    def cached_positions(self) -> int:
        """Number of past token positions held (0 for fixed-size states)."""
        return 0

    def check(self, owner: str, batch_size: int) -> None:
        if self.owner != owner:
            raise ValueError(f"state was produced by a different mixer configuration ({self.owner}), "
                             f"cannot be used with {owner}")
        if self.batch_size != batch_size:
            raise ValueError(f"state batch size {self.batch_size} does not match input batch size {batch_size}")


class Mixer(nn.Module, metaclass=ABCMeta):
    """Base class: subclasses set ``modes``, ``time_complexity``, ``cache_complexity``."""

    config_cls: ClassVar[type] = MixerConfig
    modes: ClassVar[tuple[str, ...]] = ("dense",)
    time_complexity: ClassVar[str] = "?"
    cache_complexity: ClassVar[str] = "?"

    def __init__(self, config: MixerConfig, d_model: int) -> None:
        super().__init__()
        if d_model <= 0:
            raise ValueError(f"d_model must be > 0, got {d_model}")
        self.config = config
        self.d_model = d_model
        self.n_heads = config.n_heads
        self.head_dim = config.resolved_head_dim(d_model)

    # -- identity used to refuse a state from another configuration
    @property
    def owner(self) -> str:
        return f"{type(self).__name__}({self.config})"

    # -- the uniform surface
    def forward(self, x: Tensor, state: MixerState | None = None, mode: str | None = None
                ) -> tuple[Tensor, MixerState]:
        mode = self.modes[0] if mode is None else mode
        if mode not in self.modes:
            raise ValueError(f"mixer {type(self).__name__} has no mode '{mode}'; modes: {self.modes}")
        self._check_input(x)
        if state is not None:
            state.check(self.owner, x.shape[0])
        return getattr(self, f"forward_{mode}")(x, state)

    def step(self, x_t: Tensor, state: MixerState | None) -> tuple[Tensor, MixerState]:
        """Decode one token: x_t [B, D] -> y_t [B, D]."""
        if x_t.dim() != 2:
            raise ValueError(f"step expects x_t of shape [B, D], got {tuple(x_t.shape)}")
        y, state = self.forward(x_t[:, None], state, mode="recurrent")
        return y[:, 0], state

    def _check_input(self, x: Tensor) -> None:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"expected x of shape [B, T, {self.d_model}], got {tuple(x.shape)}")
        if x.shape[1] == 0:
            raise ValueError("empty sequence (T = 0)")
        p = next(self.parameters(), None)
        if p is not None and (x.dtype != p.dtype or x.device != p.device):
            raise TypeError(f"input is {x.dtype} on {x.device} but the mixer's parameters are "
                            f"{p.dtype} on {p.device}")

    # Each mode m in ``modes`` is a method ``forward_m(x, state) -> (y, state)`` of the subclass.

    @abstractmethod
    def init_state(self, batch_size: int, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float32) -> MixerState:
        """The empty decode state for ``batch_size`` sequences."""

    @abstractmethod
    def materialize(self, x: Tensor) -> MixOperator:
        """(A, B[, R]) over the mixed values for x [B, T, D] (short T)."""

    # -- derived accounting
    @abstractmethod
    def state_size(self, n: int) -> int:
        """Peak scalars per batch element held by the decode state over an n-token decode."""

    def cache_positions(self, n: int) -> int:
        return 0

    @abstractmethod
    def flops_per_token(self, n: int) -> int:
        """Multiply-adds of the mixing for the last token of an n-token sequence."""
