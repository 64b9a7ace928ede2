"""The uniform surface every mixer implements.

    forward(x, state=None, mode=None) -> (y, state)   x, y: [B, T, D]
    step(x_t, state) -> (y_t, state)                  x_t, y_t: [B, D]  (one decoded token)
    materialize(x) -> MixOperator                     A, B (, R) over the values, for short T
    init_state(batch_size, device, dtype, start=None) -> MixerState   (start: left padding, below)

``modes`` lists the exact computation modes; the first is the training default. Every mode accepts
an initial state and returns the final state, so a long sequence can be fed in uneven pieces
(multi-token continuation). ``dense`` goes through ``materialize`` and the one reference solver.

Accounting is derived, never measured here. Over an n-token decode, while token t < n is processed:
``cache_positions(n)`` = the most past positions the state holds (0 for fixed-size states),
``state_size(n)`` = the most scalars it holds per batch element, ``flops_per_token(n)`` = the
multiply-adds of the mixing for the last token. Tests and ``tokenmix analyze`` compare them with
the measured ``MixerState.peak_positions`` / ``peak_numel``.

Left-padded batches. ``init_state(..., start=start)`` with ``start`` [B] long, the number of leading
padding positions of each row, returns a state that carries it; every forward / step with it (in any
mode) treats positions t < start[b] of row b as padding. No real output (t >= start[b]) depends on
a padding input, and everything position-dependent runs on the row's own clock t - start[b], so a
row's real outputs and its decode continuation equal what the row gives alone, unpadded. Padding
outputs are finite; their values are otherwise unspecified. The first segment fed to a padded state
(the prefill) must contain every row's whole padding (start[b] <= T); later segments are all real.
Two mechanisms, chosen by the mixer (``pads_by_row_groups``):
    masked  -- the batch stays one computation: padding keys / neighbours are masked out of every
               read and normalisation, padding tokens of recurrences are inert (no write, identity
               transition); the state keeps the row starts for the masks of later reads.
    grouped -- for arithmetic that depends on the absolute clock of a row (lattice neighbour sets,
               Fenwick levels): rows with the same start run together as an unpadded batch on their
               own state, started after their padding (``RowGroupState``). Exact and batched within
               a group; a batch with G distinct starts costs G calls per segment.
A state with ``start`` None (or all zeros) is the ordinary unpadded state: that path is unchanged.

Packed batches (``forward(..., packing=...)``, ``core/packing.py``): documents back to back in a row.
The dense reference defines the meaning: a packed row equals its documents run one by one, the first
from the given state and every later one from a fresh state, outputs and gradients; the returned
state is each row's last document's, and ``step(x_t, state, reset=rows)`` begins a new document in
those rows. The mechanism every mixer has: the rows that begin a document leave their row group for
a fresh one (``reset_rows``, ``RowGroupState``) and the pieces between boundaries run in any mode,
exact by construction. A mixer whose kernels honour boundaries themselves lists those modes in
``packing_modes`` (cost O(T x per-token cost), no piece loop); the packed column of the mixer matrix
checks both against the documents run alone. ``materialize_packed`` is the block-diagonal operator.
"""

from __future__ import annotations

import functools
from abc import ABCMeta, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import ClassVar

import torch
from torch import Tensor, nn

from tokenmix.core.errors import InputError, WrongInputType
from tokenmix.core.operator import MixOperator
from tokenmix.core.packing import Packing, as_flags, as_packing

# the decode Linear, the row-group state and the state base class live in rooms of their own; mixer
# modules import them from here with the rest of the contract
from tokenmix.mixers.linear import Linear as Linear
from tokenmix.mixers.linear import kept_derived as kept_derived
from tokenmix.mixers.row_groups import RowGroupState
from tokenmix.mixers.state import MixerState


@dataclass(frozen=True)
class MixerConfig:
    """Fields shared by all mixers. head_dim None means d_model // n_heads."""

    n_heads: int = 2
    head_dim: int | None = None

    def __post_init__(self) -> None:
        self.require_positive("n_heads")
        if self.head_dim is not None:
            self.require_positive("head_dim")

    def require_positive(self, *names: str) -> None:
        """The check every config runs on its sizes and scales: the first named field that is not > 0
        (NaN included) is bad user input, one line naming the field and its value."""
        for name in names:
            value = getattr(self, name)
            if not value > 0:
                raise InputError(f"{name} must be > 0, got {value}")

    def resolved_head_dim(self, d_model: int) -> int:
        if self.head_dim is not None:
            return self.head_dim
        if d_model % self.n_heads:
            raise InputError(
                f"head_dim mismatch: d_model={d_model} is not divisible by n_heads={self.n_heads}; "
                "set head_dim explicitly"
            )
        return d_model // self.n_heads

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def first_parameter(module: nn.Module) -> Tensor | None:
    """``next(module.parameters(), None)`` by a direct walk in the same order (the module's own
    parameters, then its children's, depth first): the input check runs on every decode step, where
    ``parameters()``'s generators cost a few microseconds."""
    for p in module._parameters.values():
        if p is not None:
            return p
    for child in module._modules.values():
        if child is not None and (p := first_parameter(child)) is not None:
            return p
    return None


def check_reset(reset: Tensor | Sequence[bool], batch_size: int, device) -> Tensor:
    """A decode step's ``reset`` flags as a [B] bool tensor on ``device`` (one line on a bad shape)."""
    reset = as_flags(reset, "reset").to(device)
    if tuple(reset.shape) != (batch_size,):
        raise InputError(
            f"reset must be [batch_size] = [{batch_size}] bool flags, got {tuple(reset.shape)} {reset.dtype}"
        )
    return reset


def padding_start(
    start: Tensor | Sequence[int] | None, batch_size: int, device: torch.device | str = "cpu"
) -> Tensor | None:
    """Validate a left-padding ``start`` (leading padding positions per row, [B] integers).

    Returns it as a long tensor on ``device``, or None when no row is padded (start None or all 0),
    so that an unpadded batch takes the ordinary path.
    """
    if start is None:
        return None
    start = torch.as_tensor(start)
    if start.dtype == torch.bool or start.is_floating_point() or start.is_complex():
        raise InputError(f"start (leading padding positions per row) must be integers, got dtype {start.dtype}")
    if tuple(start.shape) != (batch_size,):
        raise InputError(
            f"start (leading padding positions per row) must have shape [batch_size] = "
            f"[{batch_size}], got {tuple(start.shape)}"
        )
    if batch_size and bool((start < 0).any()):
        row = int(torch.nonzero(start < 0)[0, 0])
        raise InputError(f"start (leading padding positions per row) must be >= 0, got {int(start[row])} for row {row}")
    if batch_size == 0 or not bool(start.any()):
        return None
    return start.to(device=device, dtype=torch.long)


def begin_last_documents(state: MixerState, before: MixerState | None, packing: Packing) -> MixerState:
    """``state``, the state after a packed segment that ``before`` began, with its ``start`` set to
    where each row's last document begins on the batch clock (before.position + packing.starts[b, -1]
    for a row with a boundary in the segment, else the row's start as it was): a native packed path
    whose state keeps positions of earlier documents (a whole-row KV cache) lets every later read
    mask them as it masks left padding (``padded_keys``), and the model counts positions from there.
    Returns ``state`` (updated in place)."""
    if before is None:
        start = packing.begins(0)[:, -1]
    else:
        start = packing.begins(before.position, before.start)[:, -1]
    state.start, state.max_start, state.min_start = start, int(start.max()), int(start.min())
    if not state.max_start:  # no row begins past position 0: nothing to mask
        state.start = None
    return state


class Mixer(nn.Module, metaclass=ABCMeta):
    """Base class: subclasses set ``modes``, ``time_complexity``, ``cache_complexity``."""

    config_cls: ClassVar[type] = MixerConfig
    modes: ClassVar[tuple[str, ...]] = ("dense",)
    time_complexity: ClassVar[str] = "?"
    cache_complexity: ClassVar[str] = "?"
    #: left padding by row groups (``RowGroupState``) instead of masks inside the modes (module docstring)
    pads_by_row_groups: ClassVar[bool] = False
    #: modes whose ``forward_<mode>(x, state, packing=...)`` honour document boundaries in their own
    #: kernels (the others run the pieces between boundaries, ``Mixer.forward``)
    packing_modes: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        """A class that replaces the kernel of a mode it would inherit as a packing mode
        (``forward_<mode>`` or ``_mix_<mode>``) must say itself whether its kernel honours document
        boundaries: inheriting the claim would run packed rows through a kernel that may read across
        them (a programming error, raised when the class is defined)."""
        super().__init_subclass__(**kwargs)
        if "packing_modes" in cls.__dict__:
            return
        replaced = [m for m in cls.packing_modes if {f"forward_{m}", f"_mix_{m}"} & cls.__dict__.keys()]
        if replaced:
            raise TypeError(
                f"{cls.__name__} replaces the {', '.join(replaced)} kernel of a packing mode it inherits: "
                f"declare packing_modes ({replaced!r} if its kernel honours document boundaries, else ())"
            )

    def __init__(self, config: MixerConfig, d_model: int) -> None:
        super().__init__()
        if d_model <= 0:
            raise InputError(f"d_model must be > 0, got {d_model}")
        self.config = config
        self.d_model = d_model
        self.n_heads = config.n_heads
        self.head_dim = config.resolved_head_dim(d_model)

    # -- identity used to refuse a state from another configuration (the config is frozen: formatted
    # once, not on every decode step)
    @functools.cached_property
    def owner(self) -> str:
        return f"{type(self).__name__}({self.config})"

    # -- the uniform surface
    def forward(
        self,
        x: Tensor,
        state: MixerState | None = None,
        mode: str | None = None,
        packing: Packing | Tensor | None = None,
    ) -> tuple[Tensor, MixerState]:
        """x [B, T, D] -> (y [B, T, D], the state after the segment).

        Args:
            packing: document boundaries inside the rows (``core/packing.py``: a ``Packing`` or [B, T]
                bool start flags): a packed row equals its documents run one by one, the first from
                ``state``, every later one from a fresh state; the returned state is that of each
                row's last document. Modes in ``packing_modes`` honour it in their own kernels; the
                others run the segment between boundaries with the rows that begin a document reset
                (``reset_rows``), which is exact in every mode.
        """
        mode = self.modes[0] if mode is None else mode
        if mode not in self.modes:
            raise InputError(f"mixer {type(self).__name__} has no mode '{mode}'; modes: {self.modes}")
        self._check_input(x)
        if state is not None:
            state.check(self.owner, x.shape[0])
            if state.position == 0 and state.max_start > x.shape[1]:
                row = int(torch.argmax(state.start))
                raise InputError(
                    f"start (leading padding positions per row) is {state.max_start} for row {row} "
                    f"but the first segment has only {x.shape[1]} positions: the prefill must "
                    "contain every row's whole padding"
                )
        if packing is None:  # the unpacked path (a decode step's) without the packing checks
            return self._forward_mode(x, state, mode)
        packing = as_packing(packing, x.shape[0], x.shape[1], x.device)
        if packing is None:
            return self._forward_mode(x, state, mode)
        # native kernels take an ordinary state whose padding (if any) is behind it
        native = not isinstance(state, RowGroupState) and (state is None or state.position >= state.max_start)
        if mode in self.packing_modes and native:
            y, after = getattr(self, f"forward_{mode}")(x, state, packing=packing)
            if not isinstance(after, RowGroupState):  # the model's positions and later reads start there
                after = begin_last_documents(after, state, packing)
            return y, after
        return self._forward_documents(x, state, mode, packing)

    def _forward_mode(self, x: Tensor, state: MixerState | None, mode: str) -> tuple[Tensor, MixerState]:
        if isinstance(state, RowGroupState):
            return state.run(self, x, mode)
        return getattr(self, f"forward_{mode}")(x, state)

    def _forward_documents(
        self, x: Tensor, state: MixerState | None, mode: str, packing: Packing
    ) -> tuple[Tensor, MixerState]:
        """The packed segment as the pieces between boundaries, resetting the rows that begin a
        document at each piece's first position."""
        flags = packing.boundaries  # [B, T]
        cuts = torch.nonzero(flags.any(0))[:, 0].tolist()
        pieces = []
        for t0, t1 in zip([0, *cuts], [*cuts, x.shape[1]]):
            if t0 > 0:
                state = self.reset_rows(state, flags[:, t0])
            y, state = self._forward_mode(x[:, t0:t1], state, mode)
            pieces.append(y)
        return torch.cat(pieces, 1), state

    def reset_rows(self, state: MixerState | None, rows: Tensor) -> MixerState | None:
        """The state in which rows ``rows`` ([B] bool) begin a new document at ``state.position``:
        those rows continue as from a fresh state, the others as before. Exact for every mixer (a
        new row group, ``RowGroupState``); None (a fresh state) when every row resets."""
        if state is None or state.position == 0 or not bool(rows.any()):
            return state
        if bool(rows.all()):
            return None
        grouped = state if isinstance(state, RowGroupState) else RowGroupState.wrap(self.owner, state, rows.device)
        return grouped.with_reset(rows)

    def step(self, x_t: Tensor, state: MixerState | None, reset: Tensor | None = None) -> tuple[Tensor, MixerState]:
        """Decode one token: x_t [B, D] -> y_t [B, D]; ``reset`` [B] bool: rows whose token begins a
        new document (their state restarts fresh)."""
        if x_t.dim() != 2:
            raise InputError(f"step expects x_t of shape [B, D], got {tuple(x_t.shape)}")
        if reset is not None:
            state = self.reset_rows(state, check_reset(reset, x_t.shape[0], x_t.device))
        y, state = self.forward(x_t.unsqueeze(1), state, mode="recurrent")
        return y.squeeze(1), state

    def _check_input(self, x: Tensor) -> None:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise InputError(f"expected x of shape [B, T, {self.d_model}], got {tuple(x.shape)}")
        if x.shape[1] == 0:
            raise InputError("empty sequence (T = 0)")
        p = first_parameter(self)
        if p is not None and (x.dtype != p.dtype or x.device != p.device):
            raise WrongInputType(
                f"input is {x.dtype} on {x.device} but the mixer's parameters are {p.dtype} on {p.device}"
            )

    # Each mode m in ``modes`` is a method ``forward_m(x, state) -> (y, state)`` of the subclass.

    def init_state(
        self,
        batch_size: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        start: Tensor | Sequence[int] | None = None,
    ) -> MixerState:
        """The decode state before the first token of ``batch_size`` sequences.

        Args:
            start: [B] integers, the leading padding positions of each row of a left-padded batch
                (module docstring); None or all zeros = no padding.
        """
        start = padding_start(start, batch_size, device)
        if start is None:
            return self.empty_state(batch_size, device, dtype)
        if self.pads_by_row_groups:
            return RowGroupState.create(self.owner, start)
        state = self.empty_state(batch_size, device, dtype)
        state.start, state.max_start, state.min_start = start, int(start.max()), int(start.min())
        return state

    @abstractmethod
    def empty_state(
        self, batch_size: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> MixerState:
        """The empty unpadded decode state for ``batch_size`` sequences (what ``init_state`` builds on)."""

    @abstractmethod
    def materialize(self, x: Tensor) -> MixOperator:
        """(A, B[, R]) over the mixed values for x [B, T, D] (short T)."""

    def materialize_packed(self, x: Tensor, packing: Packing | Tensor) -> MixOperator:
        """The operator of a packed batch: A and B block-diagonal over each row's documents, every
        block the operator of its document alone (``materialize`` of that document)."""
        packing = as_packing(packing, x.shape[0], x.shape[1])
        if packing is None:
            return self.materialize(x)
        ops = [(b, t0, t1, self.materialize(x[b : b + 1, t0:t1])) for b, t0, t1 in packing.row_documents()]

        def assemble(name: str) -> Tensor | None:
            first = getattr(ops[0][3], name)
            if first is None:
                return None
            # a G axis that grows with the length (Fenwick levels) is padded with zero terms; an
            # operator over r sub-steps per token (DeltaProduct) has r rows per position
            r = first.shape[-1] // (ops[0][2] - ops[0][1])
            middle = [max(getattr(op, name).shape[i] for *_, op in ops) for i in range(1, first.dim() - 2)]
            out = first.new_zeros(x.shape[0], *middle, r * x.shape[1], r * x.shape[1])
            for b, t0, t1, op in ops:
                block = getattr(op, name)[0]
                out[b][tuple(slice(0, n) for n in block.shape[:-2])][..., r * t0 : r * t1, r * t0 : r * t1] = block
            return out

        return MixOperator(assemble("A"), assemble("B"), assemble("R"))

    # -- derived accounting
    @abstractmethod
    def state_size(self, n: int) -> int:
        """Peak scalars per batch element held by the decode state over an n-token decode."""

    def cache_positions(self, n: int) -> int:
        return 0

    @abstractmethod
    def flops_per_token(self, n: int) -> int:
        """Multiply-adds of the mixing for the last token of an n-token sequence."""
