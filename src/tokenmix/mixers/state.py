"""The decode state of one mixer layer (``MixerState``): what every mixer's state holds beside its
tensors (position, row padding, measured peaks) and the checks a forward makes on it. The mixer
contract is ``mixers/base.py``; a batch whose rows run on different clocks is ``mixers/row_groups.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from tokenmix.core.errors import InputError


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
    start: Tensor | None = None  # [B] long on the state's device: leading padding positions per row
    max_start: int = 0  # max(start) as a Python int: the checks below need no device sync
    min_start: int = 0  # min(start) as a Python int (the model's position-range check)

    def observe(self) -> None:
        self.peak_positions = max(self.peak_positions, self.cached_positions())
        self.peak_numel = max(self.peak_numel, self.numel_per_batch())

    def carry_over(self, other: "MixerState") -> "MixerState":
        """Inherit what outlives one update from ``other`` (the state this one replaces): the
        measured peaks and the row padding. Returns self."""
        self.peak_positions, self.peak_numel = other.peak_positions, other.peak_numel
        self.start, self.max_start, self.min_start = other.start, other.max_start, other.min_start
        return self

    def padding(self, t: int) -> Tensor | None:
        """[B, t] bool, True at the padding positions of the next t-token segment; None if it has none
        (always after the prefill, and for unpadded states)."""
        if self.start is None or self.position >= self.max_start:
            return None
        pos = self.position + torch.arange(t, device=self.start.device)
        return pos[None, :] < self.start[:, None]

    def padded_keys(self, p: int) -> Tensor | None:
        """Leading padding positions per row, [B] long, of a buffer holding the p positions just
        before ``position`` followed by the next segment (a KV cache or a window); None if no
        buffered position is padding."""
        first = self.position - p
        if self.start is None or self.max_start <= first:
            return None
        return (self.start - first).clamp(min=0)

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
            raise InputError(
                f"state was produced by a different mixer configuration ({self.owner}), cannot be used with {owner}"
            )
        if self.batch_size != batch_size:
            raise InputError(f"state batch size {self.batch_size} does not match input batch size {batch_size}")
