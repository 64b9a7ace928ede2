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

import copy
import functools
from abc import ABC, ABCMeta, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.core.errors import InputError, WrongInputType
from tokenmix.core.operator import MixOperator
from tokenmix.core.packing import Packing, as_flags, as_packing


@dataclass(frozen=True)
class MixerConfig:
    """Fields shared by all mixers. head_dim None means d_model // n_heads."""

    n_heads: int = 2
    head_dim: int | None = None

    def __post_init__(self) -> None:
        if self.n_heads <= 0:
            raise InputError(f"n_heads must be > 0, got {self.n_heads}")
        if self.head_dim is not None and self.head_dim <= 0:
            raise InputError(f"head_dim must be > 0, got {self.head_dim}")

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


def kept_derived(module: nn.Module, name: str, source: Tensor, make) -> Tensor:
    """``make(source)``, kept on ``module`` (under ``name``, not a parameter or buffer) and remade only
    when ``source`` changes: another tensor, dtype or device, or an in-place update (its version).

    For decode steps, which would otherwise recompute the same tensor from a parameter on every
    token. The caller keeps autograd and inference tensors (whose in-place updates cannot be seen)
    out of it.
    """
    key = (source.data_ptr(), source.dtype, source.device, source._version)
    kept = module.__dict__.get(name)
    if kept is None or kept[0] != key:
        kept = module.__dict__[name] = (key, make(source))
    return kept[1]


class Linear(nn.Linear):
    """``nn.Linear`` that multiplies a few rows without autograd by a kept transposed copy of its weight.

    At batch 1 a decode step's linear layers are matrix-vector products that stream their whole
    weight, and MKL streams the weight for x Wᵀ with W in nn.Linear's [out, in] layout at about
    half the rate it streams Wᵀ stored [in, out] for x (Wᵀ) (measured: docs/notes/model.md). The
    copy is made on first use and again whenever the weight changes (another tensor or an in-place
    update), costs one more weight's memory per layer once decoding starts, and is no parameter
    (state dicts are unchanged). Same numbers up to rounding (another summation order). Every
    linear layer of the mixers and of the model is one of these, built so.
    """

    rows_transposed = 8  # up to this many rows (B * T) take the transposed weight

    def forward(self, x: Tensor) -> Tensor:
        # the parameters from their dict: ``self.weight`` goes through Module.__getattr__ (~0.6 us,
        # twice per layer and decoded token); a parametrized weight is not in it
        params = self._parameters
        w, bias = (params["weight"], params["bias"]) if "weight" in params else (self.weight, self.bias)
        if (
            torch.is_grad_enabled() or x.numel() > self.rows_transposed * self.in_features or w.is_inference()
        ):  # (an inference tensor's in-place updates cannot be seen)
            return F.linear(x, w, bias)
        wt = kept_derived(self, "_kept_transpose", w, lambda w: w.detach().t().contiguous())  # [in, out]
        if bias is None:
            return x @ wt  # [..., out]: one call, the row folding inside matmul
        return torch.addmm(bias, x.reshape(-1, self.in_features), wt).view(*x.shape[:-1], self.out_features)


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

    def run(self, mixer: "Mixer", x: Tensor, mode: str) -> tuple[Tensor, "RowGroupState"]:
        """Mode ``mode`` of ``mixer`` on x [B, T, D], group by group -> (y [B, T, D], next state)."""
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
