"""The plan of an index table: how the torch kernels (``chunked.py``, ``scores.py``) cover it with
slices, built once per table, prefix and chunk size.

Positions are *buffer* positions (package docstring): the P cached outputs first, then the T new
ones; idx[t, w] < P + t, -1 = none.

Why the fast paths look the way they do. Gathering the neighbours of every row (an index table of
T x W buffer rows) costs a copy of T W V values per pass, about ten times the time of reading the
same values from a contiguous slice. Translation-invariant patterns never need it: level w reads
distance f(w), so "y_{t - f(w)} for every t" *is* a shifted slice of the buffer; the
cache-efficient lattice reads the same lattice point for runs of a_w consecutive rows, a strided
slice broadcast over the run. ``PatternPlan`` finds these regular parts in any index table (a
*run* per level slot, verified entry by entry against the table) and leaves whatever is irregular
(reads of a sparse cache, Fenwick levels, ...) to a gather, so the kernels stay exact for every
table and fast for the patterns that matter.

Packed rows (documents back to back in a row, ``core/packing.py``): patterns whose neighbour set
follows the document's own clock (the lattice, Fenwick) get per-row tables idx [B, T, W]
(``packed_table``: the document's own table shifted by its start, -1 for absent neighbours), and a
``RowPatternPlan`` in place of the ``PatternPlan`` (package docstring).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tokenmix.core.errors import InputError

_GATHER_BLOCK_ELEMS = 1 << 21  # gathered values per block of irregular entries (bounds their memory)


@dataclass(frozen=True)
class Piece:
    """Rows [row, row + n g) of level slot ``col`` in n groups of g consecutive rows; group m reads
    buffer position key + step m. A shift is n = length, g = 1; a lattice run g = a_w rows."""

    col: int
    row: int
    n: int
    g: int
    key: int
    step: int

    @property
    def rows(self) -> slice:
        return slice(self.row, self.row + self.n * self.g)

    @property
    def keys(self) -> slice:
        return slice(self.key, self.key + self.step * (self.n - 1) + 1, self.step)


@dataclass(frozen=True)
class Run:
    """The regular part of one level slot: row ``row + i`` (0 <= i < length) reads buffer position
    ``key + stride * ((phase + i) // stride)`` -- a shift for stride 1, a staircase of lattice
    points for stride a_w (rows in runs of a_w share one position)."""

    col: int
    row: int
    length: int
    key: int
    stride: int
    phase: int

    def restrict(self, r0: int, r1: int) -> Run | None:
        """The same run limited to rows [r0, r1), or None if they do not meet."""
        lo, hi = max(self.row, r0), min(self.row + self.length, r1)
        if hi <= lo:
            return None
        i = lo - self.row
        return Run(
            self.col,
            lo,
            hi - lo,
            self.key + self.stride * ((self.phase + i) // self.stride),
            self.stride,
            (self.phase + i) % self.stride,
        )

    def pieces(self) -> list[Piece]:
        a, o, n = self.stride, self.phase, self.length
        if a == 1:
            return [Piece(self.col, self.row, n, 1, self.key, 1)]
        out, row, key = [], self.row, self.key
        if o:  # partial first group
            h = min(n, a - o)
            out.append(Piece(self.col, row, 1, h, key, a))
            row, key, n = row + h, key + a, n - h
        if n >= a:
            m = n // a
            out.append(Piece(self.col, row, m, a, key, a))
            row, key, n = row + m * a, key + m * a, n - m * a
        if n:  # partial last group
            out.append(Piece(self.col, row, 1, n, key, a))
        return out


def _fit_run(col: np.ndarray, w: int, prefix: int) -> Run | None:
    """The longest suffix of rows on which column ``col`` [T] (-1 = none) is a shift or staircase.

    Stride and phase are read off the reads inside the segment (>= ``prefix``: those of a sparse
    cache are irregular): the stride a is the gcd of the steps between successive reads, and the
    phase is any offset that puts every read row into the group of its position (an interval
    intersection; rows that read nothing -- levels deduplicated away -- may fall in either group).
    Then every row of the suffix is verified: it reads exactly the predicted position or nothing,
    and the predicted position is strictly earlier, so rows that a run covers with a zero
    coefficient stay causal.
    """
    t = len(col)
    valid = col >= 0
    if not valid.any():
        return None
    fit = valid & (col >= prefix)
    rows = np.nonzero(fit if fit.any() else valid)[0]
    vals = col[rows]
    steps = np.diff(vals)
    if (steps < 0).any():
        return None
    everywhere = np.arange(t)
    stride = int(np.gcd.reduce(steps[steps > 0])) if (steps > 0).any() else 0
    if stride == 0:  # one position read by every row (or a single row)
        pred = np.full(t, vals[0])
    else:
        # row t in group m (reads vals[0] + a m) needs a m <= t + phi < a m + a
        offs = stride * ((vals - vals[0]) // stride) - rows
        phi = int(offs.max())
        if phi >= int(offs.min()) + stride:
            return None
        pred = vals[0] + stride * ((everywhere + phi) // stride)
    ok = (~valid | (col == pred)) & (pred >= 0) & (pred < prefix + everywhere)
    bad = np.nonzero(~ok)[0]
    r0 = int(bad[-1]) + 1 if bad.size else 0
    first = np.nonzero(valid[r0:])[0]
    if not first.size:
        return None
    r0 += int(first[0])
    length = t - r0
    if stride == 0:
        return Run(w, r0, length, int(pred[r0]), length, 0)
    return Run(w, r0, length, int(pred[r0]), stride, (r0 + phi) % stride)


_MAX_BAND_CHUNKS = 4
_LEVELS_PER_BAND_CHUNK = 2.0


def _band_chunks(dist: np.ndarray, t: int, chunk: int) -> int:
    """How many chunks back the dense band reaches: m >= 1, the band covering distances <= m C.

    One more chunk of band costs every row a C x V multiply-add in the forward and the backward
    solve (~4 C V flops a row and head, at matmul speed); a level at that distance costs every row
    a few elementwise passes over V values (memory-bound, ~2 C V flops' worth each) plus a slice
    operation per far block. The band is widened while the next chunk of distances holds at least
    ``_LEVELS_PER_BAND_CHUNK`` reads per row on average (sq1: 3 levels in (C, 2C] at C = 64; pow2:
    one), up to ``_MAX_BAND_CHUNKS`` (the band is kept for backward: (m + 1) C values a row).
    dist: distances of the valid entries (>= 1)."""
    m = 1
    while m < _MAX_BAND_CHUNKS:
        per_row = np.count_nonzero((dist > m * chunk) & (dist <= (m + 1) * chunk)) / max(1, t)
        if per_row < _LEVELS_PER_BAND_CHUNK:
            break
        m += 1
    return m


class _PlanTensors:
    """What both plans share: their masks (numpy bool arrays in ``_np``) and index tensors handed
    to the kernels as tensors of the asked dtype and device, made once per plan (``_cache``)."""

    _np: dict[str, np.ndarray]
    _cache: dict

    @torch.inference_mode(False)  # cached across calls: never an inference tensor
    def mask(self, name: str, like: Tensor) -> Tensor:
        """A mask ([T, W] for a shared table, [B, T, .] for per-row tables) as a 0/1 tensor of
        like's dtype and device."""
        key = (name, like.dtype, like.device)
        if key not in self._cache:
            self._cache[key] = torch.from_numpy(self._np[name]).to(device=like.device, dtype=like.dtype)
        return self._cache[key]

    @torch.inference_mode(False)
    def on(self, t: Tensor, device: torch.device) -> Tensor:
        """One of the plan's index tensors on ``device``."""
        key = (id(t), device)
        if key not in self._cache:
            self._cache[key] = t.to(device)
        return self._cache[key]


class PatternPlan(_PlanTensors):
    """How the kernels cover an index table: regular runs, a near band, irregular leftovers.

    Built once per call from idx [T, W] (buffer positions, -1 = none), the prefix length P and the
    chunk size C; shared by ``pattern_scores`` and ``chunked_pattern_solve``.

    Attributes:
        runs: one ``Run`` per level slot with a regular part; ``pieces`` all their slice operations.
        mask(name): [T, W] 0/1 masks -- "valid" (entries read at all), "run_far" (covered by a run
            and read at distance > R); "near_compact" [T, Wn] (read at distance <= R, over the Wn
            level slots ``near_cols`` that have such reads).
        reach: R = m C, the distances the band covers (m from ``_band_chunks`` unless given).
        band_col: [T, Wn] long, column of a near entry in its chunk's [C, R + C] band block.
        left, left_keys: (rows, cols) and buffer positions of the entries no run covers.
        far_blocks: {chunk start s: pieces}, the distance > R part of the runs; a piece added at s
            covers rows >= s and reads only positions before P + s (see module docstring).
        left_chunks: per chunk, (rows, cols, keys) of leftover entries at distance > R.
        has_prev: per chunk, whether any row reads an earlier chunk within distance R.
    """

    def __init__(self, idx: Tensor, prefix: int, chunk: int, reach: int | None = None) -> None:
        if chunk <= 0:
            raise InputError(f"chunk_size must be > 0, got {chunk}")
        tab = idx.detach().cpu().numpy().astype(np.int64)
        t, w = tab.shape
        self.t, self.w, self.p, self.chunk = t, w, prefix, chunk
        # level-major [W, T] (contiguous per level slot) for the per-level work; masks go back to [T, W]
        tab_l = np.ascontiguousarray(tab.T)
        rows = np.arange(t)[None, :]
        valid = tab_l >= 0
        dist = prefix + rows - tab_l
        if reach is None:
            reach = _band_chunks(dist[valid], t, chunk)
        elif reach < 1:
            raise InputError(f"reach must be >= 1 chunk, got {reach}")
        self.reach = chunk * reach
        self.runs = [r for c in range(w) if (r := _fit_run(tab_l[c], c, prefix)) is not None]
        in_run = np.zeros_like(valid)
        for r in self.runs:
            in_run[r.col, r.row : r.row + r.length] = True
        far = dist > self.reach
        near = valid & ~far
        run_far = valid & in_run & far
        left = valid & ~in_run
        self._np = {"valid": valid.T, "run_far": run_far.T}  # [T, W] views
        start = prefix + (rows // chunk) * chunk  # buffer position of each row's chunk start
        # the band is scattered from the level slots that have near entries only (scatter is slow)
        near_cols = np.nonzero(near.any(1))[0]
        self.near_cols = torch.from_numpy(near_cols)
        self.band_col = torch.from_numpy(
            np.ascontiguousarray(np.where(near, tab_l - start + self.reach, 0)[near_cols].T)
        )
        self._np["near_compact"] = np.ascontiguousarray(near[near_cols].T)
        self.left = tuple(torch.from_numpy(a) for a in np.nonzero(left.T))  # (rows, cols), sorted by row
        self.left_keys = torch.from_numpy(tab[self.left[0].numpy(), self.left[1].numpy()])
        self.chunks = [(s, min(s + chunk, t)) for s in range(0, t, chunk)]
        # does a chunk read the previous chunk at all (skip empty matmuls, e.g. f:3**k)
        prev_rows = (near & (tab_l < start)).any(0)
        self.has_prev = [bool(prev_rows[s:e].any()) for s, e in self.chunks]
        self.pieces = [pc for r in self.runs for pc in r.pieces()]
        self.far_blocks = self._schedule(run_far, dist)
        r, c = np.nonzero((left & far).T)  # sorted by row, so each chunk's entries are contiguous
        bounds = np.searchsorted(r, [s for s, _ in self.chunks] + [t])
        self.left_chunks: list[tuple[Tensor, Tensor, Tensor] | None] = []
        for ci in range(len(self.chunks)):
            rr, cc = r[bounds[ci] : bounds[ci + 1]], c[bounds[ci] : bounds[ci + 1]]
            self.left_chunks.append(
                (torch.from_numpy(rr), torch.from_numpy(cc), torch.from_numpy(tab[rr, cc])) if rr.size else None
            )
        self._cache: dict = {}

    def _schedule(self, run_far: np.ndarray, dist: np.ndarray) -> dict[int, list[Piece]]:
        """Cut the far part of every run into blocks, each added at a chunk start s: a block covers
        rows >= s that read only positions < P + s, i.e. rows [cur, s + d_min) for a run whose far
        reads are all at distance >= d_min. Lattice blocks end on a group boundary so the next one
        is whole groups (one slice operation, no partial first group). run_far, dist: [W, T]."""
        blocks: dict[int, list[Piece]] = {}
        for r in self.runs:
            rr = slice(r.row, r.row + r.length)
            far = run_far[r.col, rr]  # [W, T] layout
            if not far.any():
                continue
            d_min = int(dist[r.col, rr][far].min())  # > C
            cur, stop = r.row + int(np.nonzero(far)[0][0]), r.row + r.length
            while cur < stop:
                s = (cur // self.chunk) * self.chunk
                end = min(stop, s + d_min)
                if r.stride > 1 and end < stop:
                    aligned = end - (end - r.row + r.phase) % r.stride
                    end = aligned if aligned > cur else end
                blocks.setdefault(s, []).extend(r.restrict(cur, end).pieces())
                cur = end
        return blocks


class RowPatternPlan(_PlanTensors):
    """How the kernels cover per-row tables idx [B, T, W] (packed rows, ``packed_table``).

    Runs are not looked for: in a packed row every level's run ends at each boundary. The near
    reads (distance <= R) go into each row's band blocks exactly as for a shared table; the far
    reads of a chunk are gathered from the rows already solved, one gather per chunk; d beta
    gathers every read, in blocks of rows. Same attributes as ``PatternPlan`` where they mean the
    same (``band_col`` and the masks per row: [B, T, .]), plus:

    Attributes:
        far_cols: [Wf] the level slots with far reads; far_keys [B, T, Wf] their buffer positions
            (0 where not far: read with a zero coefficient); keys [B, T, W] every read (0 = none).
        has_far: per chunk, whether any row reads at distance > R.
    """

    def __init__(self, idx: Tensor, prefix: int, chunk: int, reach: int | None = None) -> None:
        if chunk <= 0:
            raise InputError(f"chunk_size must be > 0, got {chunk}")
        tab = idx.detach().cpu().numpy().astype(np.int64)
        nb, t, w = tab.shape
        self.b, self.t, self.w, self.p, self.chunk = nb, t, w, prefix, chunk
        rows = np.arange(t)[None, :, None]
        valid = tab >= 0
        dist = prefix + rows - tab
        if reach is None:
            reach = _band_chunks(dist[valid], nb * t, chunk)
        elif reach < 1:
            raise InputError(f"reach must be >= 1 chunk, got {reach}")
        self.reach = chunk * reach
        far = valid & (dist > self.reach)
        near = valid & ~far
        start = prefix + (rows // chunk) * chunk  # buffer position of each row's chunk start
        near_cols, far_cols = np.nonzero(near.any((0, 1)))[0], np.nonzero(far.any((0, 1)))[0]
        self.near_cols, self.far_cols = torch.from_numpy(near_cols), torch.from_numpy(far_cols)
        self.band_col = torch.from_numpy(
            np.ascontiguousarray(np.where(near, tab - start + self.reach, 0)[..., near_cols])
        )
        self.far_keys = torch.from_numpy(np.ascontiguousarray(np.where(far, tab, 0)[..., far_cols]))
        self.keys = torch.from_numpy(np.where(valid, tab, 0))
        self._np = {
            "valid": valid,
            "near_compact": np.ascontiguousarray(near[..., near_cols]),
            "far": np.ascontiguousarray(far[..., far_cols]),
        }
        self.chunks = [(s, min(s + chunk, t)) for s in range(0, t, chunk)]
        prev_rows = (near & (tab < start)).any((0, 2))
        far_rows = far.any((0, 2))
        self.has_prev = [bool(prev_rows[s:e].any()) for s, e in self.chunks]
        self.has_far = [bool(far_rows[s:e].any()) for s, e in self.chunks]
        self._cache: dict = {}

    @torch.inference_mode(False)
    def flat(self, name: str, heads: int | None, device) -> Tensor:
        """Row indices of the reads ``name`` ("keys" or "far_keys", [B, T, W']) into a flattened
        buffer: [B, T, W'] into [B * N, ...] for heads None (keys [B, N, H, K]), else [B, H, T, W']
        into [B * H * N, V] (head-first outputs); N = P + T. Gathers and scatters of whole rows
        (``index_select`` / ``index_add_``) run several times faster than ``gather`` on expanded
        indices."""
        key = ("flat", name, heads, device)
        if key not in self._cache:
            keys, n = getattr(self, name), self.p + self.t
            rows = torch.arange(self.b)[:, None, None]
            if heads is None:
                out = rows * n + keys
            else:
                out = ((rows[:, None] * heads + torch.arange(heads)[None, :, None, None]) * n) + keys[:, None]
            self._cache[key] = out.to(device)
        return self._cache[key]


def transposed_table(idx: Tensor, prefix: int) -> tuple[Tensor, Tensor]:
    """Who reads each buffer position: the transpose of idx [T, W] (or per-row [B, T, W]) in CSR
    form, for kernels whose backward gathers what the forward scattered (no atomics: every
    position sums its readers itself, in a fixed order).

    Built with tensor operations on idx's device: no host round trip and no shape that depends on
    the data (a padded [P + T, max readers] table would need the maximum on the host), so a
    per-row table made on the GPU (``packed_table``) is transposed there.

    Args:
        idx: [T, W] or [B, T, W] long buffer positions, -1 = none (causal: ``check_causal``).
        prefix: P, the cached positions before the segment.
    Returns:
        starts: [R N + 1] int32, N = P + T, R = 1 (shared table) or B: the readers of buffer
            position j of table row r are entries[starts[r N + j] : starts[r N + j + 1]].
        entries: [R T W] int32, flat t W + w of each reader, grouped by the position read and
            ascending in t within a group; the entries that read nothing come last.
    """
    tab = idx[None] if idx.dim() == 2 else idx
    r, t, w = tab.shape
    n = prefix + t
    flat = torch.arange(t * w, device=idx.device).view(1, t, w)
    row = torch.arange(r, device=idx.device).view(r, 1, 1)
    key = torch.where(tab >= 0, row * n + tab, r * n).reshape(-1)  # reads nothing: the last group
    order = torch.argsort(key * (t * w) + flat.expand(r, t, w).reshape(-1))  # unique keys: one order
    entries = flat.reshape(-1).repeat(r)[order]
    counts = torch.zeros(r * n + 1, dtype=torch.long, device=idx.device).scatter_add_(0, key, torch.ones_like(key))
    starts = torch.zeros(r * n + 1, dtype=torch.long, device=idx.device)
    starts[1:] = counts[:-1].cumsum(0)
    return starts.to(torch.int32), entries.to(torch.int32)


def table_fits(idx: Tensor, b: int, t: int, w: int | None = None) -> bool:
    """Whether idx is a [T, W] table or per-row [B, T, W] tables for a [B, T] batch (W: beta's)."""
    return (
        idx.dim() in (2, 3)
        and idx.shape[-2] == t
        and (idx.dim() == 2 or idx.shape[0] == b)
        and (w is None or idx.shape[-1] == w)
    )


def check_solve_shapes(alpha: Tensor, beta: Tensor, idx: Tensor, x: Tensor, y_prefix: Tensor) -> None:
    """InputError unless the solve's operands fit one another: alpha [B, T, H], beta [B, T, H, W],
    idx [T, W] or [B, T, W], x [B, T, H, V], y_prefix [B, P, H, V] (the kernels index by them)."""
    b, t, h, v = x.shape
    if beta.dim() != 4 or beta.shape[:3] != (b, t, h) or alpha.shape != (b, t, h):
        raise InputError(f"shape mismatch: x {tuple(x.shape)}, alpha {tuple(alpha.shape)}, beta {tuple(beta.shape)}")
    if not table_fits(idx, b, t, beta.shape[3]):
        raise InputError(f"shape mismatch: idx {tuple(idx.shape)} for beta {tuple(beta.shape)}")
    if y_prefix.dim() != 4 or y_prefix.shape[0] != b or y_prefix.shape[2:] != (h, v):
        raise InputError(f"shape mismatch: y_prefix {tuple(y_prefix.shape)} for x {tuple(x.shape)}")


def check_causal(idx: Tensor, prefix: int) -> None:
    """InputError unless every entry of idx [.., T, W] reads a buffer position before its row's own
    (P + t; -1 = none)."""
    if idx.numel() and (idx >= prefix + torch.arange(idx.shape[-2], device=idx.device)[:, None]).any():
        raise InputError("idx reads a position that is not strictly earlier (not causal)")


def _check_table(idx: Tensor, prefix: int, t: int) -> None:
    if idx.dim() not in (2, 3) or idx.shape[-2] != t:
        raise InputError(f"shape mismatch: idx {tuple(idx.shape)} for T = {t}")
    check_causal(idx, prefix)


def plan_pattern(
    idx: Tensor, prefix: int, chunk_size: int = 64, reach: int | None = None
) -> PatternPlan | RowPatternPlan:
    """Validate idx [T, W] (buffer positions < P + t, -1 = none) and build its ``PatternPlan``
    (``reach``: chunks the dense band covers, None = chosen from the table's distances); per-row
    tables [B, T, W] (packed rows) get a ``RowPatternPlan``."""
    _check_table(idx, prefix, idx.shape[-2])
    if idx.dim() == 3:
        return RowPatternPlan(idx, prefix, chunk_size, reach)
    return PatternPlan(idx, prefix, chunk_size, reach)


def packed_table(idx: Tensor, relative: Tensor, starts: Tensor, prefix: int) -> Tensor:
    """Per-row tables [B, T, W] of a packed segment, buffer positions (-1 = none).

    A token of a row's first document (starts[b, t] = 0) reads what the segment's shared table
    says (it continues the cached prefix); a token at position p of a later document that begins
    at s = starts[b, t] reads that document's own neighbours, P + s + relative[p] (those of the
    document run alone, shifted by its start). W = the wider of the two tables.

    Args:
        idx: [T, W1] long, the segment's table on the clock of the state it continues.
        relative: [T', W2] long (T' >= T), the pattern's table of positions 0 .. T' - 1 (absolute
            positions of a sequence from 0, -1 = none).
        starts: [B, T] long, ``Packing.starts`` of the segment.
        prefix: P, the cached positions before the segment in the buffer.
    """
    t = idx.shape[0]
    w = max(idx.shape[1], relative.shape[1])
    idx = torch.nn.functional.pad(idx, (0, w - idx.shape[1]), value=-1)
    rel = torch.nn.functional.pad(relative[:t], (0, w - relative.shape[1]), value=-1)
    starts = starts.to(idx.device)
    own = rel[torch.arange(t, device=idx.device) - starts]  # [B, T, W]: the document's own table
    later = torch.where(own >= 0, own + (prefix + starts)[..., None], own)
    return torch.where((starts > 0)[..., None], later, idx)


def _leftover_blocks(n: int, per_entry: int):
    step = max(1, _GATHER_BLOCK_ELEMS // max(1, per_entry))
    return range(0, n, step), step


_LOOPED_GROUP = 8  # lattice groups up to this many rows are summed one row at a time


def _add_group_sums(dst: Tensor, weights: Tensor, values: Tensor, dim: int) -> None:
    """dst += (weights * values).sum(dim), in place (dst may be a strided view of a buffer).

    The gradient a lattice point receives is the weighted sum over the g rows of its group. For
    short groups one multiply-add per row is ~2-3x faster than the product temporary and its
    reduction (a full extra write and read of the group's values); long groups amortise them."""
    g = values.shape[dim]
    if g <= _LOOPED_GROUP:
        for j in range(g):
            dst.addcmul_(weights.select(dim, j), values.select(dim, j))
    else:
        dst += (weights * values).sum(dim)
