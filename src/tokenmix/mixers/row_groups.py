"""``RowGroupState``: the decode state of a batch whose rows run on different clocks (left padding
by row groups, document boundaries), each group an ordinary batch on its own ``MixerState``.
How a mixer uses it: ``mixers/base.py``'s module docstring (left-padded and packed batches)."""

from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.mixers.state import MixerState


class RowGroupState(MixerState):
    """Decode state of a batch whose rows run on different clocks: groups of rows, each an ordinary
    batch on its own state, begun at a position of its own.

    Two uses. Left padding of a mixer that pads by row groups: rows with the same start form a group
    that begins after its padding. Document boundaries (any mixer, ``Mixer.reset_rows``): the rows
    that begin a new document at position s leave their group for a new one begun at s on a fresh
    state, so every row's state is exactly that of its current document run alone. A group keeps the
    rows that left it (their outputs are computed and dropped, since an ordinary state cannot be cut
    by rows) until none of its rows is live; ``live[b]`` is the group whose outputs row b takes.
    Outputs of positions before a group's beginning (padding) are 0.

    Attributes:
        groups: list of (s, rows [n] long, state or None before the group's first token).
        live: [B] long, the group of each row.
        position: tokens seen by the batch; start: [B] long, where each row's current document (or,
            for a padded row, its first real token) begins, on the batch's clock.
    """

    def __init__(
        self,
        owner: str,
        batch_size: int,
        position: int,
        start: Tensor,
        groups: list[tuple[int, Tensor, MixerState | None]],
        live: Tensor,
    ) -> None:
        self.owner, self.batch_size, self.position = owner, batch_size, position
        self.start, self.max_start, self.min_start = start, int(start.max()), int(start.min())
        self.groups, self.live = groups, live

    @classmethod
    def create(cls, owner: str, start: Tensor) -> "RowGroupState":
        """The groups of a left-padded batch: one per distinct start."""
        values = sorted(set(start.tolist()))
        groups = [(s, torch.nonzero(start == s)[:, 0], None) for s in values]
        live = torch.zeros_like(start)
        for i, (_, rows, _) in enumerate(groups):
            live[rows] = i
        return cls(owner, start.shape[0], 0, start, groups, live)

    @classmethod
    def wrap(cls, owner: str, state: MixerState, device: torch.device | str) -> "RowGroupState":
        """An ordinary state (padded or not) as one group of every row; ``device``: the batch's."""
        rows = torch.arange(state.batch_size, device=device)
        start = state.start if state.start is not None else torch.zeros_like(rows)
        return cls(owner, state.batch_size, state.position, start, [(0, rows, state)], torch.zeros_like(rows))

    def with_reset(self, rows: Tensor) -> "RowGroupState":
        """Rows ``rows`` ([B] bool) begin a new document at ``position``: a new group on a fresh state."""
        picked = torch.nonzero(rows.to(self.live.device))[:, 0]
        live = self.live.clone()
        live[picked] = len(self.groups)
        groups = [*self.groups, (self.position, picked, None)]
        # drop the groups no row reads any more, renumbering the live indices
        readers = torch.bincount(live, minlength=len(groups)).tolist()
        kept = [i for i in range(len(groups)) if readers[i]]
        renumber = torch.full((len(groups),), -1, dtype=torch.long, device=live.device)
        renumber[torch.tensor(kept, device=live.device)] = torch.arange(len(kept), device=live.device)
        start = self.start.clone()
        start[picked] = self.position
        return RowGroupState(
            self.owner, self.batch_size, self.position, start, [groups[i] for i in kept], renumber[live]
        )

    def _subs(self) -> list[MixerState]:
        return [sub for _, _, sub in self.groups if sub is not None]

    @property
    def peak_positions(self) -> int:  # type: ignore[override]
        return max((sub.peak_positions for sub in self._subs()), default=0)

    @property
    def peak_numel(self) -> int:  # type: ignore[override]
        return max((sub.peak_numel for sub in self._subs()), default=0)

    def observe(self) -> None:
        """Nothing to do: each group's own state is observed by the mode that updates it."""

    def tensors(self) -> dict[str, Tensor]:
        return {
            f"{name}@start={s}": t for s, _, sub in self.groups if sub is not None for name, t in sub.tensors().items()
        }

    def numel_per_batch(self) -> int:
        return max((sub.numel_per_batch() for sub in self._subs()), default=0)

    def cached_positions(self) -> int:
        return max((sub.cached_positions() for sub in self._subs()), default=0)

    def run(self, mixer: nn.Module, x: Tensor, mode: str) -> tuple[Tensor, "RowGroupState"]:
        """Mode ``mode`` of ``mixer`` (a ``Mixer``) on x [B, T, D], group by group -> (y [B, T, D], next state)."""
        t = x.shape[1]
        fn = getattr(mixer, f"forward_{mode}")
        y, groups = None, []
        for i, (s, rows, sub) in enumerate(self.groups):
            skip = min(max(s - self.position, 0), t)  # the group's padding positions in this segment
            whole = len(self.groups) == 1
            xg = x if whole else x.index_select(0, rows)
            if skip < t:
                yg, sub = fn(xg[:, skip:], sub)
                yg = F.pad(yg, (0, 0, skip, 0))
            else:  # the whole segment is padding for this group (start = T at the prefill)
                yg = x.new_zeros(xg.shape[0], t, mixer.d_model)
            groups.append((s, rows, sub))
            if whole:
                y = yg
                continue
            if y is None:
                y = x.new_zeros(x.shape[0], t, mixer.d_model)
            read, dst = self._readers[i]
            y.index_copy_(0, dst, yg.index_select(0, read))
        after = copy.copy(self)  # the same rows, starts and readers (a decode step recomputes none of them)
        after.position, after.groups = self.position + t, groups
        return y, after

    @functools.cached_property
    def _readers(self) -> list[tuple[Tensor, Tensor]]:
        """Per group, (the indices within its rows of the rows that read it, those batch rows):
        where ``run`` puts the group's outputs. Fixed until ``with_reset`` makes another state."""
        out = []
        for i, (_, rows, _) in enumerate(self.groups):
            read = torch.nonzero(self.live.index_select(0, rows) == i)[:, 0]
            out.append((read, rows.index_select(0, read)))
        return out
