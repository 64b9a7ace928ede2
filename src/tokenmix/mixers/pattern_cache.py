"""Decode cache of pattern recurrences: the positions later tokens will read, with their keys and outputs."""
from __future__ import annotations

import torch
from torch import Tensor

from tokenmix.mixers.base import MixerState


class PatternCache(MixerState):
    """Cached positions of one layer.

    Attributes:
        positions: [P] long, sorted absolute positions held.
        keys: [B, P, H, K] their keys (score-based coefficients read them).
        values: [B, P, H, V] their outputs y_j (read through B).
        position: number of tokens seen so far.
    """

    def __init__(self, owner: str, batch_size: int, position: int, positions: Tensor, keys: Tensor,
                 values: Tensor) -> None:
        self.owner, self.batch_size, self.position = owner, batch_size, position
        self.positions, self.keys, self.values = positions, keys, values

    def tensors(self) -> dict[str, Tensor]:
        return {"keys": self.keys, "values": self.values}

    def cached_positions(self) -> int:
        return int(self.positions.numel())

    def slots(self, wanted: Tensor) -> Tensor:
        """Indices into the cache of absolute positions ``wanted`` (any shape, -1 kept as -1)."""
        ok = wanted >= 0
        slot = torch.searchsorted(self.positions, wanted.clamp(min=0))
        slot = slot.clamp(max=max(len(self.positions) - 1, 0))
        found = ok & (self.positions[slot] == wanted) if len(self.positions) else torch.zeros_like(ok)
        if (ok & ~found).any():
            missing = wanted[ok & ~found][0].item()
            raise ValueError(f"cache does not hold position {missing} that the pattern reads; was the "
                             "state produced with another pattern or sequence?")
        return torch.where(ok, slot, torch.full_like(slot, -1))

    def select(self, keep_positions: list[int], keys_all: Tensor, values_all: Tensor, all_positions: Tensor,
               new_position: int) -> "PatternCache":
        """Build the next cache holding ``keep_positions`` taken from the concatenated buffers."""
        if len(keep_positions) == len(all_positions):  # nothing evicted (exact patterns keep everything)
            return PatternCache(self.owner, self.batch_size, new_position, all_positions, keys_all,
                                values_all).carry_peaks(self)
        keep = torch.as_tensor(keep_positions, dtype=torch.long)
        slot = torch.searchsorted(all_positions, keep)
        return PatternCache(self.owner, self.batch_size, new_position, keep, keys_all[:, slot],
                            values_all[:, slot]).carry_peaks(self)
