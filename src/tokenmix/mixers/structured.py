"""The structured higher-order recurrence of the paper (any pattern of ``tokenmix.patterns``).

Per head, with q_t, k_t, v_t projections of the layer input:

    y_t = alpha_t v_t + sum_{j in N(t)} beta_{t,j} y_j,        out_t = W_o [y_t]_heads

(A, B) form: A = diag(alpha), B[t, j] = beta_{t,j} on the pattern N(t) (strictly lower).
Coefficients, normalised over {t} ∪ N(t) so every y_t is a convex (or L1-bounded) combination:
    softmax  -- softmax of the scores q_t . k_j / sqrt(K) (alpha from the self score q_t . k_t);
    gate_softmax / gate_l1 -- per-level gates from the input as in H-LRU: logits g_t in R^{L+1}
        (slot 0 = self, slot w+1 = level w), softmax, or tanh then L1 normalisation (signed).

Modes name algorithms: ``chunked`` (training default: the chunked sparse triangular solve with the
neighbour scores; patterns that read every one of the previous M >= C positions -- the dense
pattern -- take the matmul path ``chunked_window_softmax``),
``dense`` (materialise A, B and call the reference solver), ``recurrent`` (token by token with a
cache that evicts a position as soon as no later token reads it; a step gathers only the
|N(t)| neighbours and appends to preallocated storage, O(|N(t)| K) whatever the cache size; how a
step reads its cache is the cache's decode strategy, chosen once from the pattern and the
coefficients: ``choose_decode``). ``compiled`` is the name the chunked mode on the numba backend had
before backends, kept for existing configs and runs (``forward_compiled``).

Backends (``StructuredConfig.backend``, ops/pattern/backend.py): how the chunked mode's solve and
scores and the decode steps' reads are computed -- numba (CPU), torch (anywhere), triton (CUDA) --
never what: the numbers agree to rounding, so the backend enters no run id. Each call asks
``choose_backend`` once and records the answer in the state it returns (``PatternCache.backend``).

Left padding (mixers/base.py). A solo run excludes the nonexistent neighbours of t < f(k) from the
normalisation. Translation-invariant patterns (N(t) = {t - f(k)}: every row of a padded batch reads
the same absolute positions) keep the batch's shared index table and mask, per row, the neighbours
j < start[b] exactly like nonexistent ones (t - start[b] < f(k) <=> t - f(k) < start[b]); the
matmul path masks the padding keys. The lattice and other patterns whose neighbour sets depend on
the row's own clock pad by row groups (``RowGroupState``: rows of equal start run together).

Packed rows (``forward(..., packing=...)``, native in ``chunked`` and ``compiled``): token t of a
document that begins at s reads the neighbours of its position t - s in the document, shifted by s.
For exact-distance patterns that is the shared table clipped at s: the neighbours j < s are masked
exactly like left padding (per token instead of per row), and the returned cache keeps the whole
row with ``start`` = where each row's last document begins, so decoding masks the earlier
documents as it masks padding. The lattice and the other patterns on the document's own clock
read per-row tables (``ops.pattern.plan.packed_table``: the document's own table shifted by s; the
first document continues the state's clock and cache); their returned state is a
``RowGroupState`` of one group per last-document start, each an ordinary cache on that document's
clock. Score softmaxes and gates normalise over the document's neighbours only.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.core.packing import Packing
from tokenmix.mixers.base import Linear, Mixer, MixerConfig, RowGroupState
from tokenmix.mixers.pattern_cache import DecodeStrategy, PatternCache
from tokenmix.mixers.registry import register_mixer
from tokenmix.ops.pattern import backend as backends
from tokenmix.ops.pattern.lattice_step import LatticeStep
from tokenmix.ops.pattern.numba import kernel_available
from tokenmix.ops.pattern.plan import PatternPlan, RowPatternPlan, packed_table, plan_pattern
from tokenmix.ops.pattern.window_softmax import chunked_window_softmax
from tokenmix.patterns import Lattice, Pattern, TranslationInvariant, get_pattern

COEFFICIENTS = ("softmax", "gate_softmax", "gate_l1")
GATED_LENGTH = 16384  # the longest sequence the default gate slots cover (StructuredConfig.max_levels)
_ROW_BLOCK = 256  # table rows computed at once for neighbour-cache decode steps
_ROW_BLOCKS_KEPT = 8
_PLANS_KEPT = 2  # index tables + plans kept per mixer (a plan of a 16k-token sq1 segment is ~20 MB)


@dataclass(frozen=True)
class StructuredConfig(MixerConfig):
    pattern: str = "pow2"  # see tokenmix.patterns: pow2, sq1, dense, first_order, window:M, fenwick, f:EXPR
    cache_efficient: bool = False  # use the lattice variant (Prop. 4.12)
    coefficients: str = "softmax"  # softmax | gate_softmax | gate_l1
    # level slots of the gate-based coefficients; None: as many as the pattern reads at GATED_LENGTH
    # tokens (a slot per neighbour: sq1's grow like sqrt(n), 128 at 16k; pow2's like log2(n), 14)
    max_levels: int | None = None
    chunk_size: int = 64  # C of the chunked solve
    backend: str = "auto"  # auto | numba | torch | triton: how to compute, not what (ops/pattern/backend.py)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.coefficients not in COEFFICIENTS:
            raise InputError(f"coefficients must be one of {COEFFICIENTS}, got '{self.coefficients}'")
        backends.check_request(self.backend)
        self.require_positive("chunk_size")
        if self.max_levels is not None and (
            isinstance(self.max_levels, bool) or not isinstance(self.max_levels, int) or self.max_levels <= 0
        ):
            raise InputError(
                f"max_levels must be an integer > 0 (or None: sized for {GATED_LENGTH} tokens), got {self.max_levels!r}"
            )
        get_pattern(self.pattern, self.cache_efficient)  # validate now, with a clear message


class _LazyPlan:
    """A segment's device index table and its plan (``PatternPlan``; ``RowPatternPlan`` for the
    per-row tables of a packed segment, ``packed_table``), built on first use: only the torch
    backend reads it (the numba and triton kernels read the tables alone). The shared table in
    absolute positions ``absolute`` [T, W] (CPU, -1 = none; None for per-row tables) serves
    left-padded and packed batches of exact distances.

    Kept across calls (``StructuredMixer._table``), so everything here is built outside inference
    mode even when the call that builds it runs inside (generation): an inference tensor kept in a
    table would make every later autograd forward fail ("Inference tensors cannot be saved for
    backward").
    """

    def __init__(self, idx: Tensor, idx_cpu: Tensor, absolute: Tensor | None, prefix: int, chunk: int) -> None:
        # idx: the table on the tensors' device (what every backend reads); idx_cpu: the plan's input
        self.idx, self._args, self._plan = idx, (idx_cpu, prefix, chunk), None
        self.absolute, self._lowest, self._absolute_dev = absolute, None, None  # the last two on first use

    @torch.inference_mode(False)
    def get(self) -> PatternPlan | RowPatternPlan:
        if self._plan is None:
            self._plan = plan_pattern(*self._args)
        return self._plan

    @torch.inference_mode(False)
    def padded_valid(self, start: Tensor, max_start: int) -> Tensor | None:
        """[B, T, W] bool: the entries that read a real position of their row (>= start[b]); None
        if the table reads no position below ``max_start`` (then the shared idx >= 0 is exact)."""
        absolute = self._absolute_on_device()
        if self._lowest is None or self._lowest >= max_start:
            return None
        return absolute[None] >= start[:, None, None]

    @torch.inference_mode(False)
    def document_valid(self, begins: Tensor) -> Tensor:
        """[B, T, W] bool: the entries that read a position of their token's own document, which
        begins at begins[b, t] (absolute positions; packed rows of an exact-distance pattern)."""
        return self._absolute_on_device()[None] >= begins[:, :, None]

    def _absolute_on_device(self) -> Tensor:
        """``absolute`` on the table's device, with the lowest position it reads (``_lowest``; None:
        none), both made on first use."""
        if self._absolute_dev is None:
            read = self.absolute[self.absolute >= 0]
            self._lowest = int(read.min()) if read.numel() else None  # None: reads nothing
            self._absolute_dev = self.absolute.to(self.idx.device)
        return self._absolute_dev


@functools.cache
def _warn_no_kernel() -> None:
    """Once per process: the compiled mode runs on the torch backend."""
    warnings.warn(
        "tokenmix: the compiled pattern kernels are unavailable (numba not importable or "
        "TOKENMIX_NO_COMPILED set); the structured mixers use the pure-PyTorch chunked kernels",
        RuntimeWarning,
        stacklevel=3,
    )


def _recorded(state: PatternCache | RowGroupState, backend: str) -> PatternCache | RowGroupState:
    """``state`` (or each cache of its row groups) recording the backend that made it (its ``repr``)."""
    if isinstance(state, PatternCache):  # every decoded token: the short way first
        state.backend = backend
        return state
    for _, _, cache in state.groups:
        if isinstance(cache, PatternCache):
            cache.backend = backend
    return state


def _complexities(p: Pattern) -> tuple[str, str]:
    if isinstance(p, Lattice):
        base = p.base.name
        return {"pow2": ("O(log n)", "O(log n)"), "sq1": ("O(sqrt n)", "O(sqrt n)")}.get(
            base, ("O(f^-1(n))", "O(f^-1(n))")
        )
    if isinstance(p, TranslationInvariant):
        if p.max_levels is not None:
            return ("O(1)", "O(1)") if p.max_levels == 1 else ("O(m)", "O(m)")
        return {"pow2": ("O(log n)", "O(n)"), "sq1": ("O(sqrt n)", "O(n)"), "dense": ("O(n)", "O(n)")}.get(
            p.name, ("O(f^-1(n))", "O(n)")
        )
    return ("O(log n)", "O(log n)")


class GeneralDecode(DecodeStrategy):
    """One token by the definition: read N(t) from the cache through the table, the coefficients as
    in the chunked modes, y_t, then extend the cache (evicting what no later token reads).
    O(|N(t)| K) whatever the cache size; differentiable; reads any layout through the cache's
    ``keys`` / ``values`` views. The strategy of gate-based coefficients and of patterns with no
    fast read, and the arithmetic of every step autograd records."""

    name = "general"

    def step(
        self, mixer: "StructuredRecurrence", x_t: Tensor, qkv_t: Tensor, state: PatternCache, backend: str = "torch"
    ) -> tuple[Tensor, PatternCache]:
        b = qkv_t.shape[0]
        q, k, v = qkv_t.unbind(1)  # [B, H, K] each
        pos = state.position
        nb = mixer.pattern.neighbor_table(pos, pos + 1)[0]  # [W] absolute, -1 = none
        slot = state.slots(nb).to(x_t.device)
        valid = slot >= 0
        if state.start is not None and bool((nb >= 0).any()) and int(nb[nb >= 0].min()) < state.max_start:
            valid = nb.to(x_t.device)[None, :] >= state.start[:, None]  # [B, W]: no padding neighbours
        if state.keys.shape[1]:
            k_nb = state.keys.index_select(1, slot.clamp(min=0))  # [B, W, H, K]
            y_nb = state.values.index_select(1, slot.clamp(min=0))  # [B, W, H, V]
        else:  # nothing stored yet (a first token whose table row holds only -1 entries: Fenwick)
            k_nb = state.keys.new_zeros(b, len(nb), mixer.n_heads, mixer.head_dim)
            y_nb = state.values.new_zeros(b, len(nb), mixer.n_heads, mixer.head_dim)
        s_nb = torch.einsum("bhk,bwhk->bhw", q, k_nb) * (valid[None] if valid.dim() == 1 else valid[:, None])
        alpha, beta = mixer._coefficients(
            x_t, q[:, None], k[:, None], s_nb[:, None] if mixer.gates is None else None, valid[..., None, :]
        )
        y_t = alpha[:, 0, :, None] * v + torch.einsum("bhw,bwhv->bhv", beta[:, 0], y_nb)
        return y_t, mixer._extend(state, k[:, None], y_t[:, None], pos + 1)


class FixedDistanceDecode(DecodeStrategy):
    """One token of a translation-invariant pattern with score-softmax coefficients, no autograd;
    the cache is a ``SuffixEntries`` (the contiguous suffix of positions).

    N(t) = {t - f(k)} is a set of fixed distances, and a contiguous cache holds position j in
    storage slot at - (t - j), at the slot of t itself: the neighbours' slots are at minus the
    distances, with no position lookup. k_t goes into slot at, and ``step_read`` (one call of the
    backend: scores, softmax over {t} ∪ N(t), weighted sum) writes y_t straight into the value
    slot at, the entry the cache keeps. In a left-padded batch a row does not read the neighbours in its
    padding (the read's per-row mask), as in every other mode.
    """

    name = "fixed_distance"

    def __init__(self, pattern: TranslationInvariant, scale: float) -> None:
        self.pattern, self.scale = pattern, scale
        self._offsets: list = []  # (lo, hi, distances, reach) spans of positions reading the same levels

    def offsets(self, pos: int) -> tuple[np.ndarray, int]:
        """(distances [W] int64: the f(k) <= pos of the W levels token pos reads, the largest
        distance). Kept per span of positions that read the same levels (a few spans: decodes at
        different lengths through one mixer alternate between them)."""
        for lo, hi, dist, reach in self._offsets:
            if lo <= pos and (hi is None or pos < hi):
                return dist, reach
        d, lo, hi = self.pattern.distances_span(pos)
        self._offsets.insert(0, (lo, hi, np.asarray(d, dtype=np.int64), d[-1] if d else 0))
        del self._offsets[_ROW_BLOCKS_KEPT:]
        return self._offsets[0][2], self._offsets[0][3]

    def step(
        self, mixer: "StructuredRecurrence", x_t: Tensor, qkv_t: Tensor, state: PatternCache, backend: str = "torch"
    ) -> tuple[Tensor, PatternCache]:
        pos = state.position
        dist, reach = self.offsets(pos)
        if not state.contiguous or reach > state.cached_positions():  # made only by this mixer's own modes
            raise RuntimeError(
                f"fixed-distance decode at position {pos}: the cache holds "
                f"{state.cached_positions()} positions{'' if state.contiguous else ' (not contiguous)'}, "
                f"the pattern reads {reach} back"
            )
        visible = None
        if state.start is not None and reach and pos - reach < state.max_start:
            start = state.start.cpu().numpy()
            visible = (pos - dist)[None, :] >= start[:, None]  # [B, W]: a row does not read its padding
        state, at = state.next_slot()
        keys, values = state.buffers()  # [B, cap, H, K], [B, cap, H, V]
        keys[:, at] = qkv_t[:, 1]
        y_t = backends.step_read(backend, qkv_t, keys, values, at - dist, self.scale, values[:, at], visible)
        return y_t, state.advanced(at, self.pattern.needed_from(pos + 1))


class NeighborSetDecode(DecodeStrategy):
    """One token of a pattern whose decode cache is its neighbour set (``cache_is_neighbors``: the
    lattice, Fenwick), score-softmax coefficients, no autograd; the cache is a ``SlottedEntries``.

    The cache holds sorted N(t), and N(t + 1) ⊆ N(t) ∪ {t}: on slot-stable storage
    (``PatternCache.lattice_storage``) the token's key and output go to a fresh slot and the next
    cache is the same storage with another list of (position, slot) pairs -- no entry moves. One
    call of the backend (``lattice_step``) finds the neighbours' slots, reads them (scores, softmax,
    weighted sum) and writes the token: O(|N(t)| (K + V)), plus an amortised copy of the live
    entries each time the storage fills. Left-padded batches of these patterns run by row groups
    (``pads_by_row_groups``), each group an unpadded cache of its own.
    """

    name = "neighbor_set"

    def __init__(self, pattern: Pattern, scale: float) -> None:
        self.pattern, self.scale = pattern, scale
        self._rows: OrderedDict = OrderedDict()  # first position -> table rows

    def table_row(self, pos: int) -> np.ndarray:
        """N(pos) as the deduplicated table row, int64 [W'] (-1 = none), from the aligned block of
        ``_ROW_BLOCK`` rows around it (one table call per block of decoded tokens)."""
        lo = pos - pos % _ROW_BLOCK
        block = self._rows.get(lo)
        if block is None:
            block = self._rows[lo] = self.pattern.neighbor_table(lo, lo + _ROW_BLOCK).numpy()
            while len(self._rows) > _ROW_BLOCKS_KEPT:  # several decodes at different lengths
                self._rows.popitem(last=False)
        return block[pos - lo]

    def step(
        self, mixer: "StructuredRecurrence", x_t: Tensor, qkv_t: Tensor, state: PatternCache, backend: str = "torch"
    ) -> tuple[Tensor, PatternCache]:
        pos = state.position
        if state.start is not None:  # made only by this mixer's own modes, which pad by row groups
            raise RuntimeError("neighbour-set decode of a padded cache (these patterns pad by row groups)")
        state, kv, kv_np, held, slots, end = state.lattice_storage()
        row, nxt = self.table_row(pos), self.table_row(pos + 1)
        step = LatticeStep(held, slots, end, row, nxt, pos)
        stepped = backends.lattice_step(backend, qkv_t, kv, kv_np, step, self.scale)
        if stepped is None:
            raise RuntimeError(
                f"neighbour-set decode at position {pos}: the cache does not hold the positions "
                f"the pattern reads (held {held.tolist()})"
            )
        return kv[1, :, end], state.lattice_appended(*stepped, pos + 1)


def choose_decode(pattern: Pattern, gated: bool, head_dim: int) -> DecodeStrategy:
    """A structured mixer's decode strategy, from its pattern and coefficients alone: a fast read
    for score softmaxes on a fixed-distance or neighbour-set cache, else the general step."""
    if gated:
        return GeneralDecode()
    if isinstance(pattern, TranslationInvariant):
        return FixedDistanceDecode(pattern, 1.0 / math.sqrt(head_dim))
    if pattern.cache_is_neighbors:
        return NeighborSetDecode(pattern, 1.0 / math.sqrt(head_dim))
    return GeneralDecode()


class StructuredRecurrence(Mixer):
    # ``compiled``: the chunked mode on the numba backend, its name before backends (kept for existing
    # configs and runs; not the default); ``recurrent`` stays last (the generic tests decode with it)
    modes = ("chunked", "compiled", "dense", "recurrent")
    packing_modes = ("chunked", "compiled")
    # the generic matrix (tests, ``tokenmix check``) runs the chunked mode on the torch backend, so that
    # its mode agreement holds numba (``compiled``) and torch (``chunked``) to the dense mode side by side
    test_overrides = {"backend": "torch"}

    def __init__(self, config: StructuredConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        self.pattern = get_pattern(config.pattern, config.cache_efficient)
        h, k = self.n_heads, self.head_dim
        self.qkv = Linear(d_model, 3 * h * k, bias=False)
        self.out = Linear(h * k, d_model, bias=False)
        self.levels = (
            config.max_levels
            if config.max_levels is not None
            else int(self.pattern.neighbor_table(GATED_LENGTH - 1, GATED_LENGTH).shape[1])
        )
        self.gates = Linear(d_model, h * (self.levels + 1)) if config.coefficients != "softmax" else None
        self._plans: OrderedDict = OrderedDict()  # (t0, T, P, device) -> (cached positions, _LazyPlan)
        # how its decode steps read its cache, chosen once: every cache it makes records it
        self.decode = choose_decode(self.pattern, self.gates is not None, self.head_dim)
        self._general = GeneralDecode()  # the steps autograd records (forward_recurrent)
        self._relative: OrderedDict = OrderedDict()  # (T, device) -> the table of positions 0 .. T - 1

    @property
    def pads_by_row_groups(self) -> bool:  # type: ignore[override]
        """Lattice (and other non translation-invariant) neighbour sets follow each row's own clock."""
        return not isinstance(self.pattern, TranslationInvariant)

    @property
    def time_complexity(self) -> str:  # type: ignore[override]
        return _complexities(self.pattern)[0]

    @property
    def cache_complexity(self) -> str:  # type: ignore[override]
        return _complexities(self.pattern)[1]

    # ---------------------------------------------------------------- shared pieces
    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        return q, k, v  # each [B, T, H, K]

    def _coefficients(
        self, x: Tensor, q: Tensor, k: Tensor, s_nb: Tensor | None, valid: Tensor
    ) -> tuple[Tensor, Tensor]:
        """alpha [B, T, H], beta [B, T, H, W] from the neighbour scores s_nb [B, T, H, W] (q_t . k_j,
        unscaled; unused by the gate-based coefficients); valid [T, W] (or [B, T, W] per row, for a
        left-padded batch) marks the neighbours."""
        b, t, h, _ = q.shape
        w = valid.shape[-1]  # valid is [T, W] or, per row of a left-padded batch, [B, T, W]
        if self.gates is None:
            s_self = (q * k).sum(-1)  # [B, T, H]
            logits = torch.cat([s_self[..., None], s_nb], -1) / math.sqrt(self.head_dim)
            mode = "softmax"
        else:
            if w > self.levels:
                raise InputError(
                    f"pattern '{self.pattern.name}' needs {w} level slots at this length but "
                    f"{self.levels} level slots (max_levels={self.config.max_levels}); raise max_levels"
                )
            g = self.gates(x).view(b, t, h, self.levels + 1)
            logits = g[..., : w + 1]
            mode = "softmax" if self.config.coefficients == "gate_softmax" else "l1"
        mask = torch.cat([valid.new_ones(*valid.shape[:-1], 1), valid], -1)  # [(B,) T, W + 1], slot 0 = self
        mask = mask[None, :, None, :] if mask.dim() == 2 else mask[:, :, None, :]  # [1 or B, T, 1, W + 1]
        if mode == "softmax":
            coef = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1)
        else:
            gt = torch.tanh(logits) * mask
            coef = gt / (gt.abs().sum(-1, keepdim=True) + 1e-6)
        return coef[..., 0], coef[..., 1:]  # exactly 0 at non-neighbours (masked before normalising)

    def _scores(self, q: Tensor, kbuf: Tensor, idx: Tensor, plan: _LazyPlan, backend: str) -> Tensor | None:
        """Neighbour scores [B, T, H, W] of a segment (None for gate-based coefficients), by ``backend``."""
        if self.gates is not None:
            return None
        b, t, h, _ = q.shape
        w = idx.shape[-1]
        if 2 * w >= kbuf.shape[1]:
            # (nearly) every earlier position is a neighbour: one q @ k^T matmul is cheapest
            full = torch.einsum("bthk,bshk->bths", q, kbuf)  # [B, T, H, P+T]
            rows = idx[None] if idx.dim() == 2 else idx  # [1 or B, T, W] (per-row tables: packed rows)
            return full.gather(-1, rows.clamp(min=0)[:, :, None, :].expand(b, t, h, w)) * (rows >= 0)[:, :, None, :]
        return backends.scores(backend, q, kbuf, idx, plan.get)

    @torch.inference_mode(False)  # kept across calls: never inference tensors (_LazyPlan)
    def _table(self, state: PatternCache, t: int, device) -> tuple[Tensor, _LazyPlan]:
        """Buffer indices idx [T, W] of the segment after ``state`` and their plan (built when a
        fast kernel first asks for it; the dense mode of the dense pattern never does).

        Both depend only on the segment and the cached positions, so the last few are kept: a
        training loop builds them once per sequence length, not once per step.
        """
        t0, p = state.position, state.cached_positions()
        key = (t0, t, p, str(device))
        hit = self._plans.get(key)
        if hit is not None and torch.equal(hit[0], state.positions):
            self._plans.move_to_end(key)
            return hit[1].idx, hit[1]
        tab = self.pattern.neighbor_table(t0, t0 + t)  # absolute positions
        in_seg = tab >= t0
        idx = torch.where(in_seg, tab - t0 + p, state.slots(torch.where(in_seg, torch.full_like(tab, -1), tab)))
        plan = _LazyPlan(idx.to(device), idx, tab, p, self.config.chunk_size)
        self._plans[key] = (state.positions.clone(), plan)
        while len(self._plans) > _PLANS_KEPT:
            self._plans.popitem(last=False)
        return plan.idx, plan

    def _segment(self, x: Tensor, state: PatternCache | None, request: str | None, packing: Packing | None = None):
        """Everything the chunked and dense modes share for a segment: projections, buffer indices
        (per-row tables [B, T, W] for a packed segment of a pattern on the document's clock), the
        table's plan, coefficients (the scores by the backend of ``request``, ``_backend``), and
        that backend."""
        b, t, _ = x.shape
        q, k, v = self._project(x)
        if state is None:
            state = self.empty_state(b, x.device, x.dtype)
        idx, plan = self._table(state, t, x.device)
        kbuf = torch.cat([state.keys, k], 1)
        backend = self._backend((q, kbuf, v, state.values), request)
        if packing is not None and not isinstance(self.pattern, TranslationInvariant):
            # each later document reads its own table, shifted by its start
            rel = self._relative_table(t, x.device)
            idx = packed_table(idx, rel, packing.starts.to(x.device), state.cached_positions())
            plan = _LazyPlan(idx, idx.cpu(), None, state.cached_positions(), self.config.chunk_size)
            valid = idx >= 0
        elif packing is not None:
            # exact distances: the shared table, the neighbours before the token's document masked
            valid = plan.document_valid(packing.begins(state.position, state.start))
        else:
            # left padding: per row, the neighbours before the row's start do not exist
            valid = None if state.start is None else plan.padded_valid(state.start, state.max_start)  # [B, T, W]
            valid = idx >= 0 if valid is None else valid
        alpha, beta = self._coefficients(x, q, k, self._scores(q, kbuf, idx, plan, backend), valid)
        return state, q, k, v, idx, plan, alpha, beta, backend

    def _finish(
        self, state: PatternCache, k: Tensor, y: Tensor, t: int, backend: str, packing: Packing | None = None
    ) -> tuple[Tensor, PatternCache | RowGroupState]:
        """(out [B, T, D], the state after the segment), the state recording ``backend``, the one that ran."""
        if packing is not None and not isinstance(self.pattern, TranslationInvariant):
            return self.out(y.flatten(2)), _recorded(self._grouped_state(state, k, y, packing), backend)
        # (packed exact distances: Mixer.forward starts the cache at each row's last document,
        # begin_last_documents, and decode masks the positions before it as it masks left padding)
        return self.out(y.flatten(2)), _recorded(self._extend(state, k, y, state.position + t), backend)

    @torch.inference_mode(False)  # kept across calls (as _table)
    def _relative_table(self, t: int, device) -> Tensor:
        """The pattern's table of positions 0 .. t - 1 (a document alone), on ``device``; kept."""
        key = (t, str(device))
        hit = self._relative.get(key)
        if hit is None:
            hit = self._relative[key] = self.pattern.neighbor_table(0, t).to(device)
            while len(self._relative) > _PLANS_KEPT:
                self._relative.popitem(last=False)
        return hit

    def _grouped_state(self, state: PatternCache, k: Tensor, y: Tensor, packing: Packing) -> RowGroupState:
        """The state after a packed segment of a pattern on the document's own clock: one group of
        rows per last-document start, each an ordinary cache on that document's clock holding the
        positions its next token's pattern needs (rows without a boundary continue the state's
        clock: the extended cache, cut to their rows)."""
        b, t = packing.shape
        p, end = state.cached_positions(), state.position + t
        kbuf, ybuf = torch.cat([state.keys, k], 1), torch.cat([state.values, y], 1)
        last = packing.starts[:, -1].cpu()
        groups, live = [], torch.empty(b, dtype=torch.long)
        for s in sorted(set(last.tolist())):
            rows = torch.nonzero(last == s)[:, 0]
            rows_dev = rows.to(k.device)
            if s == 0:  # the first document goes on: the cache an unpacked segment leaves, these rows
                whole = self._extend(state, k, y, end)
                begin, clock, held, keys, values = 0, end, whole.positions, whole.keys, whole.values
            else:
                begin, clock = state.position + s, t - s
                keep_from = self.pattern.needed_from(clock)
                held = torch.as_tensor(
                    self.pattern.needed(clock) if keep_from is None else range(keep_from, clock), dtype=torch.long
                )
                read = (p + s + held).to(k.device)
                keys, values = kbuf.index_select(1, read), ybuf.index_select(1, read)
            keys, values = keys.index_select(0, rows_dev), values.index_select(0, rows_dev)
            sub = PatternCache.holding(state, clock, held, keys, values)
            live[rows] = len(groups)
            groups.append((begin, rows_dev, sub))
        start = packing.begins(state.position, state.start)[:, -1]
        return RowGroupState(self.owner, b, end, start, groups, live.to(k.device))

    def _extend(self, state: PatternCache, k: Tensor, y: Tensor, new_position: int) -> PatternCache:
        """Add the segment's keys and outputs, evict what no later token reads."""
        keep_from = self.pattern.needed_from(new_position)
        if keep_from is not None:
            return state.extend(k, y, new_position, keep_from=keep_from)
        return state.extend(k, y, new_position, keep=self.pattern.needed(new_position))

    def _window(self, n: int) -> int | None:
        """M >= chunk size if every position of an n-token sequence reads exactly its M previous
        positions and the coefficients are score softmaxes: the matmul path applies."""
        if self.gates is not None or not isinstance(self.pattern, TranslationInvariant):
            return None
        m = self.pattern.window(n)
        return m if m is not None and m >= self.config.chunk_size else None

    # ---------------------------------------------------------------- modes
    def _backend(self, tensors: Sequence[Tensor], request: str | None = None) -> str:
        """The backend a call runs on, asked once per call from the tensors its ops take (the
        projections, not x: under autocast they are bfloat16 while x is float32): ``request``
        (None: the config's; ``compiled``: that mode's rule, ``forward_compiled``)."""
        if request == "compiled":
            backend = backends.compiled_mode_backend(tensors)
            if backend == "torch" and not kernel_available():
                _warn_no_kernel()
            return backend
        return backends.choose_backend(tensors, self.config.backend if request is None else request)

    def forward_compiled(self, x: Tensor, state: PatternCache | None, packing: Packing | None = None):
        """The mode of configs and runs made before backends: an alias of the chunked mode on the
        numba backend (its sweeps, ops/pattern/numba.py), whatever the config's ``backend``; where
        numba cannot run -- missing (warned once), a CUDA or half-precision tensor -- on the torch
        backend, as this mode always did."""
        return self.forward_chunked(x, state, packing=packing, backend="compiled")

    def forward_chunked(
        self, x: Tensor, state: PatternCache | None, packing: Packing | None = None, backend: str | None = None
    ):
        """The training default: the chunked solve and scores by the backend ``backend`` requests
        (None: the config's; ``_backend``). Window patterns keep their matmul path (torch).
        ``packing``: document boundaries in the rows (module docstring), honoured by the tables."""
        window = self._window(x.shape[1] + (state.position if state is not None else 0))
        if window is not None:
            # (nearly) dense: scores, softmax and the earlier-chunk contribution as matmuls, no index table
            if state is None:
                state = self.empty_state(x.shape[0], x.device, x.dtype)
            q, k, v = self._project(x)
            # the cache of a window pattern is the positions just before the segment, contiguous
            p = state.cached_positions()
            key_start = state.padded_keys(p)
            if packing is not None:  # per query: the buffer position its document begins at
                key_start = (packing.begins(state.position, state.start) - (state.position - p)).clamp(min=0)
            y = chunked_window_softmax(
                q,
                torch.cat([state.keys, k], 1),
                v,
                state.values,
                window,
                self.config.chunk_size,
                1.0 / math.sqrt(self.head_dim),
                key_start,
            )
            return self._finish(state, k, y, x.shape[1], "torch", packing)
        state, q, k, v, idx, plan, alpha, beta, backend = self._segment(x, state, backend, packing)
        y = backends.solve(backend, alpha, beta, idx, v, state.values, self.config.chunk_size, plan.get)
        return self._finish(state, k, y, x.shape[1], backend, packing)

    def forward_dense(self, x: Tensor, state: PatternCache | None):
        state, q, k, v, idx, plan, alpha, beta, _ = self._segment(x, state, "torch")
        b, t, h, _ = v.shape
        p = state.cached_positions()
        mix_a, mix_b = self._dense_ab(alpha, beta, idx, p)
        # positions read from the cache enter as a known right-hand side (the initial state)
        from_cache = (idx >= 0) & (idx < p)
        offset = (
            torch.einsum(
                "bthw,btwhv->bthv",
                beta * from_cache[None, :, None, :],
                state.values[:, idx.clamp(min=0).clamp(max=max(p - 1, 0))],
            )
            if p
            else None
        )
        y = solve_dense(MixOperator(mix_a, mix_b), v, offset=offset)
        return self._finish(state, k, y, t, "torch")

    def _dense_ab(self, alpha: Tensor, beta: Tensor, idx: Tensor, p: int) -> tuple[Tensor, Tensor]:
        b, t, h = alpha.shape
        inside = idx >= p
        col = torch.where(inside, idx - p, torch.zeros_like(idx))  # [T, W]
        mix_b = alpha.new_zeros(b, h, t, t).scatter_add(
            -1, col[None, None].expand(b, h, t, idx.shape[1]), (beta * inside[None, :, None, :]).transpose(1, 2)
        )
        mix_a = torch.diag_embed(alpha.transpose(1, 2))
        return mix_a, mix_b

    def forward_recurrent(self, x: Tensor, state: PatternCache | None):
        """Token by token, each token by its cache's decode strategy (``GeneralDecode``,
        ``FixedDistanceDecode``, ``NeighborSetDecode``; ``choose_decode``). The strategies compute
        the same numbers up to rounding (tests/mixers/test_decode_strategies.py, in float64)."""
        b, t, _ = x.shape
        if state is None:
            state = self.empty_state(b, x.device, x.dtype)
        qkv = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim)
        recorded = torch.is_grad_enabled() and (qkv.requires_grad or any(z.requires_grad for z in state.buffers()))
        # a step autograd records (the parameters, the input or the cache require grad) takes the
        # general step, whatever the cache's strategy: the fast reads write the storage in place
        # through numpy and record nothing. The general step is torch; the fast reads run on the
        # backend asked once for the call.
        decode = self._general if recorded else state.decode
        backend = "torch" if isinstance(decode, GeneralDecode) else self._backend((qkv, *state.buffers()))
        ys = []
        for s in range(t):
            state.observe()
            token = qkv.view(b, 3, self.n_heads, self.head_dim) if t == 1 else qkv[:, s]  # [B, 3, H, K]
            y_t, state = decode.step(self, x if t == 1 else x[:, s : s + 1], token, state, backend)
            ys.append(y_t[:, None])
        y = ys[0] if t == 1 else torch.cat(ys, 1)  # [B, T, H, V]
        return self.out(y.flatten(2)), _recorded(state, backend)

    # ---------------------------------------------------------------- surface
    def empty_state(self, batch_size: int, device="cpu", dtype=torch.float32) -> PatternCache:
        return PatternCache.empty(
            self.owner, batch_size, self.n_heads, self.head_dim, self.head_dim, device, dtype, self.decode
        )

    def materialize(self, x: Tensor) -> MixOperator:
        state, q, k, v, idx, plan, alpha, beta, _ = self._segment(x, None, "torch")
        return MixOperator(*self._dense_ab(alpha, beta, idx, 0))

    def values(self, x: Tensor) -> Tensor:
        """The inputs X the operator mixes: v [B, T, H, K]."""
        return self._project(x)[2]

    def cache_positions(self, n: int) -> int:
        return self.pattern.cache_size(n)

    def state_size(self, n: int) -> int:
        return self.cache_positions(n) * self.n_heads * 2 * self.head_dim  # a key and an output per position

    def flops_per_token(self, n: int) -> int:
        w = self.pattern.neighbors_per_token(n)
        return self.n_heads * (w + 1) * 2 * self.head_dim  # scores + weighted sum

    def moved_values(self, n: int) -> int:
        """Scalars a training call (forward + backward) over an n-token sequence moves, per batch
        element, for the roofline of ``tokenmix bench mixers``: each token reads the key and the
        output of itself and its |N(t)| neighbours (H (K + V) each) in the scores and the solve,
        and the backward does it twice (the transposed solve, and the gradients of the scores):
        3 sum_t (|N(t)| + 1) H (K + V). Projections are counted as FLOPs, not here."""
        nnz = self.pattern.nnz(n)
        return 3 * (nnz + n) * self.n_heads * 2 * self.head_dim


_AB = "A = diag(alpha), B on the pattern (softmax over {t} ∪ N(t))"
for _name, _kw in {
    "pow2": dict(pattern="pow2"),
    "sq1": dict(pattern="sq1"),
    "pow2_ce": dict(pattern="pow2", cache_efficient=True),
    "sq1_ce": dict(pattern="sq1", cache_efficient=True),
    "kth_order": dict(pattern="window:4"),
    "dense_recurrence": dict(pattern="dense"),
    "first_order": dict(pattern="first_order"),
}.items():
    register_mixer(_name, StructuredConfig, family="structured recurrence", ab_form=_AB, **_kw)(StructuredRecurrence)
