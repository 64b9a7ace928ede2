"""Chunked sparse triangular solve for pattern recurrences (§4.6), neighbour scores, and a matmul
path for (nearly) dense patterns -- each with a plain reference beside it.

The recurrence, for every batch element and head:

    y_t = alpha_t * x_t + sum_w beta_{t,w} * y_{idx[t,w]}          (idx[t,w] < P + t, -1 = none)

i.e. (I - B) Y = diag(alpha) X with B[t, idx[t,w]] = beta[t,w]. Positions are *buffer* positions:
the P cached outputs of an earlier call (``y_prefix``) come first, then the T new ones, so new
position t sits at buffer index P + t.

Why the fast paths look the way they do. Gathering the neighbours of every row (an index table of
T x W buffer rows) costs a copy of T W V values per pass, about ten times the time of reading the
same values from a contiguous slice. Translation-invariant patterns never need it: level w reads
distance f(w), so "y_{t - f(w)} for every t" *is* a shifted slice of the buffer; the
cache-efficient lattice reads the same lattice point for runs of a_w consecutive rows, a strided
slice broadcast over the run. ``PatternPlan`` finds these regular parts in any index table (a
*run* per level slot, verified entry by entry against the table) and leaves whatever is irregular
(reads of a sparse cache, Fenwick levels, ...) to a gather, so the kernels stay exact for every
table and fast for the patterns that matter.

The solve, chunk by chunk (C positions):
    * reads at distance <= R (the band's reach, m = R / C chunks: 1 for pow2, up to 4 for sq1-like
      patterns that have several levels per chunk of distance) land in the chunk or the m before
      it: they are scattered into one dense [C, R + C] band block per chunk, used as a matmul
      against the previous m chunks' outputs;
      the chunk's own C x C unit lower triangular block is inverted for all chunks in one batched
      solve before the loop, so a chunk costs two small matmuls (equal up to rounding);
    * reads at distance > R land in earlier chunks. A run whose reads are all at distance >= D
      contributes to a whole block of ~D rows at once -- every row of the block reads rows before
      the block -- so it is added when the block starts: one slice operation per run and block,
      O(T / D) operations for a level at distance ~D instead of one per chunk.
Backward is the transposed solve in reverse chunk order, G = (I - B)^{-T} dY, with the same
schedule transposed (a block's contributions to earlier rows are scattered once all its rows have
their G); then d alpha_t = G_t . x_t, d x_t = alpha_t G_t, d beta_{t,w} = G_t . y_{idx[t,w]} are
whole-sequence slice operations. Memory O(T (V + W) + T C), never O(T^2).

``pattern_scores`` computes q_t . k_{idx[t,w]} with the same runs (no gathered keys are saved for
backward: the backward recomputes from the slices). ``chunked_window_softmax`` is the path for
patterns whose neighbour set is every one of the previous M positions (M = all for the dense
pattern): scores, softmax coefficients and the solve per chunk as matmuls, recomputed in backward
flash-style, memory O(T (K + V) + C T).

Packed rows (documents back to back in a row, ``core/packing.py``): a token reads only its own
document's neighbours, and the first document of a row continues the cached prefix. Two forms,
both exact. Exact-distance patterns keep the shared table, whose runs stay intact, and the caller
zeroes the coefficients of neighbours before the token's document start (the solve then reads
them with weight 0 and no gradient reaches them). Patterns whose neighbour set follows the
document's own clock (the lattice, Fenwick) get per-row tables idx [B, T, W] (``packed_table``:
the document's own table shifted by its start, -1 for absent neighbours): ``RowPatternPlan``
scatters each row's near reads into its band blocks as above, and gathers the far reads of a chunk
from the rows already solved (one gather per chunk, no runs: a run would end at every boundary),
so a boundary costs nothing; no read crosses it, so neither does a gradient. The window path
takes per-query key starts [B, T] (``key_start``) in place of the per-row left padding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.core.operator import solve_unit_lower

_GATHER_BLOCK_ELEMS = 1 << 21  # gathered values per block of irregular entries (bounds their memory)


# ---------------------------------------------------------------- plan: regular runs of an index table
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


def table_fits(idx: Tensor, b: int, t: int, w: int | None = None) -> bool:
    """Whether idx is a [T, W] table or per-row [B, T, W] tables for a [B, T] batch (W: beta's)."""
    return (
        idx.dim() in (2, 3)
        and idx.shape[-2] == t
        and (idx.dim() == 2 or idx.shape[0] == b)
        and (w is None or idx.shape[-1] == w)
    )


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


# ---------------------------------------------------------------- scores q_t . k_{idx[t, w]}
class _PatternScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, kbuf, plan):
        # q [B, T, H, K], kbuf [B, P + T, H, K] -> scores [W, B, T, H] (level-major: contiguous writes)
        b, t, h, k = q.shape
        out = q.new_zeros(plan.w, b, t, h)
        for pc in plan.pieces:
            kk = kbuf[:, pc.keys]  # [B, n, H, K], a strided view, no copy
            if pc.g == 1:
                out[pc.col, :, pc.rows] = torch.linalg.vecdot(q[:, pc.rows], kk)
            else:
                qq = q[:, pc.rows].reshape(b, pc.n, pc.g, h, k)
                out[pc.col, :, pc.rows] = torch.linalg.vecdot(qq, kk[:, :, None]).reshape(b, pc.n * pc.g, h)
        rows, cols = (plan.on(a, q.device) for a in plan.left)
        keys = plan.on(plan.left_keys, q.device)
        starts, step = _leftover_blocks(len(rows), b * h * k)
        for s in starts:
            r, c, j = rows[s : s + step], cols[s : s + step], keys[s : s + step]
            out[c, :, r] = torch.linalg.vecdot(q[:, r], kbuf[:, j]).transpose(0, 1)
        out *= plan.mask("valid", out).t()[:, None, :, None]
        ctx.save_for_backward(q, kbuf)
        ctx.plan = plan
        return out.permute(1, 2, 3, 0)

    @staticmethod
    def backward(ctx, ds):
        q, kbuf = ctx.saved_tensors
        plan = ctx.plan
        b, t, h, k = q.shape
        ds = (ds * plan.mask("valid", ds)[None, :, None, :]).permute(3, 0, 1, 2).contiguous()  # [W, B, T, H]
        dq, dk = torch.zeros_like(q), torch.zeros_like(kbuf)
        for pc in plan.pieces:
            d = ds[pc.col, :, pc.rows]  # [B, n g, H]
            if pc.g == 1:
                dq[:, pc.rows].addcmul_(d[..., None], kbuf[:, pc.keys])
                dk[:, pc.keys].addcmul_(d[..., None], q[:, pc.rows])
            else:
                d = d.reshape(b, pc.n, pc.g, h, 1)
                dq[:, pc.rows].view(b, pc.n, pc.g, h, k).addcmul_(d, kbuf[:, pc.keys][:, :, None])
                _add_group_sums(dk[:, pc.keys], d, q[:, pc.rows].reshape(b, pc.n, pc.g, h, k), 2)
        rows, cols = (plan.on(a, q.device) for a in plan.left)
        keys = plan.on(plan.left_keys, q.device)
        starts, step = _leftover_blocks(len(rows), b * h * k)
        for s in starts:
            r, c, j = rows[s : s + step], cols[s : s + step], keys[s : s + step]
            d = ds[c, :, r].transpose(0, 1)[..., None]  # [B, E, H, 1]
            dq.index_add_(1, r, d * kbuf[:, j])
            dk.index_add_(1, j, d * q[:, r])
        return dq, dk, None


def _gather_keys(kbuf: Tensor, flat: Tensor) -> Tensor:
    """kbuf [B, N, H, K] (contiguous) at flat row indices [B, n, W] (``RowPatternPlan.flat``) ->
    [B, n, W, H, K]."""
    h, k = kbuf.shape[2:]
    return kbuf.view(-1, h, k).index_select(0, flat.reshape(-1)).view(*flat.shape, h, k)


class _RowPatternScores(torch.autograd.Function):
    """``_PatternScores`` on per-row tables (``RowPatternPlan``): the keys gathered in blocks of rows."""

    @staticmethod
    def forward(ctx, q, kbuf, plan):
        b, t, h, k = q.shape
        keys = plan.flat("keys", None, q.device)
        out = q.new_empty(b, t, h, plan.w)
        _, step = _leftover_blocks(t, b * plan.w * h * k)
        for r0 in range(0, t, step):
            r1 = min(t, r0 + step)
            out[:, r0:r1] = torch.linalg.vecdot(_gather_keys(kbuf, keys[:, r0:r1]), q[:, r0:r1, None]).transpose(-1, -2)
        out *= plan.mask("valid", out)[:, :, None, :]
        ctx.save_for_backward(q, kbuf)
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx, ds):
        q, kbuf = ctx.saved_tensors
        plan = ctx.plan
        b, t, h, k = q.shape
        w = plan.w
        ds = ds * plan.mask("valid", ds)[:, :, None, :]
        keys = plan.flat("keys", None, q.device)
        dq, dk = torch.empty_like(q), torch.zeros_like(kbuf)
        _, step = _leftover_blocks(t, b * w * h * k)
        for r0 in range(0, t, step):
            r1 = min(t, r0 + step)
            d = ds[:, r0:r1].transpose(-1, -2)[..., None]  # [B, n, W, H, 1]
            dq[:, r0:r1] = (d * _gather_keys(kbuf, keys[:, r0:r1])).sum(2)
            dk.view(-1, h, k).index_add_(0, keys[:, r0:r1].reshape(-1), (d * q[:, r0:r1, None]).reshape(-1, h, k))
        return dq, dk, None


def pattern_scores(q: Tensor, kbuf: Tensor, idx: Tensor, plan: PatternPlan | None = None) -> Tensor:
    """Neighbour scores s[t, w] = q_t . kbuf[idx[t, w]] (0 where idx < 0).

    Args:
        q: [B, T, H, K] queries of the segment.
        kbuf: [B, P + T, H, K] keys of the P cached positions, then of the segment.
        idx: [T, W] long buffer positions, -1 for none; idx[t] < P + t; or per-row [B, T, W].
        plan: the table's ``PatternPlan`` (``RowPatternPlan`` for per-row tables; built here if None).
    Returns:
        [B, T, H, W].
    """
    b, t, h, k = q.shape
    p = kbuf.shape[1] - t
    if kbuf.shape[0] != b or kbuf.shape[2:] != (h, k) or p < 0:
        raise InputError(f"shape mismatch: q {tuple(q.shape)}, kbuf {tuple(kbuf.shape)}")
    plan = plan if plan is not None else plan_pattern(idx, p)
    if (plan.t, plan.w, plan.p) != (t, idx.shape[-1], p) or isinstance(plan, RowPatternPlan) != (idx.dim() == 3):
        raise InputError(f"plan for T={plan.t}, W={plan.w}, P={plan.p} used with idx {tuple(idx.shape)}, P={p}")
    # contiguous operands: the per-level slices are then dense blocks (strided q, e.g. a view of a
    # fused qkv projection, makes every level's product several times slower)
    scores = _RowPatternScores if isinstance(plan, RowPatternPlan) else _PatternScores
    return scores.apply(q.contiguous(), kbuf.contiguous(), plan)


def pattern_scores_reference(q: Tensor, kbuf: Tensor, idx: Tensor) -> Tensor:
    """Reference for ``pattern_scores``: gather every neighbour key, plain autograd. [B, T, H, W]
    (idx [T, W] or per-row [B, T, W])."""
    b, t, h, k = q.shape
    w = idx.shape[-1]
    if idx.dim() == 3:
        nb = kbuf[torch.arange(b)[:, None, None], idx.clamp(min=0)]  # [B, T, W, H, K]
        return torch.einsum("bthk,btwhk->bthw", q, nb) * (idx >= 0)[:, :, None, :]
    nb = kbuf.index_select(1, idx.clamp(min=0).reshape(-1)).view(b, t, w, h, k)  # [B, T, W, H, K]
    return torch.einsum("bthk,btwhk->bthw", q, nb) * (idx >= 0)[None, :, None, :]


# ---------------------------------------------------------------- the solve
def _band(beta: Tensor, plan: PatternPlan) -> Tensor:
    """[B, H, T, R + C]: row t's coefficients on buffer positions P + c C - R + j (c = t // C, the
    previous R / C chunks then its own), from the entries read at distance <= R."""
    b, h, t, _ = beta.shape
    band = beta.new_zeros(b, h, t, plan.reach + plan.chunk)
    col = plan.on(plan.band_col, beta.device)  # [T, Wn] over the near level slots ([B, T, Wn] per row)
    near = plan.mask("near_compact", beta)
    if col.dim() == 3:  # per-row tables
        col, near = col[:, None], near[:, None]
    src = beta.index_select(-1, plan.on(plan.near_cols, beta.device)) * near
    return band.scatter_add_(-1, col.expand(b, h, t, col.shape[-1]), src)


def _level_major(beta: Tensor, mask: Tensor) -> Tensor:
    """beta [B, H, T, W] * mask [T, W] as a contiguous [W, B, H, T] tensor, in one pass: a level's
    coefficients over a row range are then one dense slice (a strided beta[..., w] view makes every
    far piece's multiply-add about twice as slow)."""
    b, h, t, w = beta.shape
    out = beta.new_empty(w, b, h, t)
    return torch.mul(beta.permute(3, 0, 1, 2), mask.t()[:, None, None, :], out=out)


def _chunk_inverses(band: Tensor, plan: PatternPlan) -> Tensor:
    """(I - B_cc)^{-1} of every chunk's own C x C block, one batched solve: [B, H, nC, C, C].

    Applying the inverse is one matmul per chunk instead of a triangular solve; per-chunk solves
    dominate the loop for sparse patterns. Equivalent up to rounding (unit lower triangular blocks
    of bounded coefficients are well conditioned). Half precision is inverted in float32.
    """
    b, h, t, _ = band.shape
    c, nc = plan.chunk, len(plan.chunks)
    inside = band.new_zeros(b, h, nc * c, c)
    inside[:, :, :t] = band[..., plan.reach :]
    work = torch.float32 if band.dtype in (torch.bfloat16, torch.float16) else band.dtype
    eye = torch.eye(c, dtype=work, device=band.device)
    mats = eye - inside.to(work).view(b, h, nc, c, c)
    return torch.linalg.solve_triangular(mats, eye.expand_as(mats), upper=False, unitriangular=True)


class _RunFarReads:
    """The far reads (distance > R) of a shared table (``PatternPlan``) inside ``_PatternSolve``: a
    run's reads are added to a whole block of rows when the block starts (``far_blocks``, one slice
    operation per run and block), the irregular entries are gathered per chunk (``left_chunks``).

    Args:
        plan: the table's plan.
        beta: [B, H, T, W] head-first neighbour coefficients.
    """

    def __init__(self, plan: PatternPlan, beta: Tensor) -> None:
        self.plan, self.beta = plan, beta
        self.coef = _level_major(beta, plan.mask("run_far", beta))  # [W, B, H, T]: a level's rows one slice

    def add(self, rhs: Tensor, buf: Tensor, ci: int) -> None:
        """rhs [B, H, T, V] += the far reads from buf [B, H, P + T, V] that become due at chunk ci
        (every position they read is solved)."""
        plan, (b, h, _, v) = self.plan, rhs.shape
        for pc in plan.far_blocks.get(plan.chunks[ci][0], ()):
            ys = buf[:, :, pc.keys]  # [B, H, n, V]
            bw = self.coef[pc.col, :, :, pc.rows]
            if pc.g == 1:
                rhs[:, :, pc.rows].addcmul_(bw[..., None], ys)
            else:
                rhs[:, :, pc.rows].view(b, h, pc.n, pc.g, v).addcmul_(
                    bw.reshape(b, h, pc.n, pc.g, 1), ys[:, :, :, None]
                )
        left = plan.left_chunks[ci]
        if left is not None:
            r, cc, j = (plan.on(a, rhs.device) for a in left)
            rhs.index_add_(2, r, self.beta[:, :, r, cc][..., None] * buf[:, :, j])

    def pass_back(self, gacc: Tensor, g_all: Tensor, ci: int) -> None:
        """The transpose of ``add``: gacc [B, H, P + T, V] += what the far reads of the rows whose G
        (g_all [B, H, T, V]) is complete once chunk ci is solved pass back to the positions they read."""
        plan, (b, h, _, v) = self.plan, g_all.shape
        left = plan.left_chunks[ci]
        if left is not None:
            r, cc, j = (plan.on(a, g_all.device) for a in left)
            gacc.index_add_(2, j, self.beta[:, :, r, cc][..., None] * g_all[:, :, r])
        for pc in plan.far_blocks.get(plan.chunks[ci][0], ()):  # the blocks starting here are complete
            bw = self.coef[pc.col, :, :, pc.rows]
            gr = g_all[:, :, pc.rows]
            if pc.g == 1:
                gacc[:, :, pc.keys].addcmul_(bw[..., None], gr)
            else:
                _add_group_sums(gacc[:, :, pc.keys], bw.view(b, h, pc.n, pc.g, 1), gr.view(b, h, pc.n, pc.g, v), 3)

    def coefficient_grads(self, g_all: Tensor, buf: Tensor) -> Tensor:
        """d beta [B, H, T, W] = G_t . y_{idx[t, w]} for every read (near and far), by runs and
        then the irregular entries in blocks; 0 where idx < 0."""
        plan, (b, h, t, v) = self.plan, g_all.shape
        gbeta = g_all.new_zeros(plan.w, b, h, t)
        for pc in plan.pieces:
            ys = buf[:, :, pc.keys]
            if pc.g == 1:
                gbeta[pc.col, :, :, pc.rows] = torch.linalg.vecdot(g_all[:, :, pc.rows], ys)
            else:
                gr = g_all[:, :, pc.rows].reshape(b, h, pc.n, pc.g, v)
                gbeta[pc.col, :, :, pc.rows] = torch.linalg.vecdot(gr, ys[:, :, :, None]).reshape(b, h, -1)
        rows, cols = (plan.on(a, g_all.device) for a in plan.left)
        keys = plan.on(plan.left_keys, g_all.device)
        starts, step = _leftover_blocks(len(rows), b * h * v)
        for s in starts:
            r, cc, j = rows[s : s + step], cols[s : s + step], keys[s : s + step]
            gbeta[cc, :, :, r] = torch.linalg.vecdot(g_all[:, :, r], buf[:, :, j]).permute(2, 0, 1)
        return gbeta.permute(1, 2, 3, 0) * plan.mask("valid", gbeta)


def _gather_rows(buf: Tensor, flat: Tensor) -> Tensor:
    """buf [B, H, N, V] (contiguous) at flat row indices [B, H, n, W] (``RowPatternPlan.flat``) ->
    [B, H, n, W, V]."""
    v = buf.shape[-1]
    return buf.view(-1, v).index_select(0, flat.reshape(-1)).view(*flat.shape, v)


class _GatheredFarReads:
    """The far reads of per-row tables (``RowPatternPlan``) inside ``_PatternSolve``: a chunk's far
    reads gathered from the rows solved before it (one gather per chunk: in a packed row a run
    would end at every document boundary). Same methods as ``_RunFarReads``."""

    def __init__(self, plan: RowPatternPlan, beta: Tensor) -> None:
        self.plan = plan
        self.coef = beta.index_select(-1, plan.on(plan.far_cols, beta.device)) * plan.mask("far", beta)[:, None]
        self.rows = plan.flat("far_keys", beta.shape[1], beta.device)  # [B, H, T, Wf] into the flat buffer

    def add(self, rhs: Tensor, buf: Tensor, ci: int) -> None:
        s, e = self.plan.chunks[ci]
        if self.plan.has_far[ci]:  # far reads are at distance > R >= C: rows solved before this chunk
            rhs[:, :, s:e] += (self.coef[:, :, s:e, :, None] * _gather_rows(buf, self.rows[:, :, s:e])).sum(3)

    def pass_back(self, gacc: Tensor, g_all: Tensor, ci: int) -> None:
        s, e = self.plan.chunks[ci]
        if self.plan.has_far[ci]:
            v = g_all.shape[-1]
            src = self.coef[:, :, s:e, :, None] * g_all[:, :, s:e, None, :]  # [B, H, n, Wf, V]
            gacc.view(-1, v).index_add_(0, self.rows[:, :, s:e].reshape(-1), src.view(-1, v))

    def coefficient_grads(self, g_all: Tensor, buf: Tensor) -> Tensor:
        """d beta [B, H, T, W]: every read gathered, in blocks of rows."""
        plan, (b, h, t, v) = self.plan, g_all.shape
        gbeta = g_all.new_empty(b, h, t, plan.w)
        keys = plan.flat("keys", h, g_all.device)
        _, step = _leftover_blocks(t, b * h * plan.w * v)
        for r0 in range(0, t, step):
            r1 = min(t, r0 + step)
            gbeta[:, :, r0:r1] = torch.linalg.vecdot(_gather_rows(buf, keys[:, :, r0:r1]), g_all[:, :, r0:r1, None])
        return gbeta.mul_(plan.mask("valid", gbeta)[:, None])


def _far_reads(plan: PatternPlan | RowPatternPlan, beta: Tensor) -> _RunFarReads | _GatheredFarReads:
    return _GatheredFarReads(plan, beta) if isinstance(plan, RowPatternPlan) else _RunFarReads(plan, beta)


class _PatternSolve(torch.autograd.Function):
    """(I - B) Y = diag(alpha) X chunk by chunk, for a shared table or per-row tables (module
    docstring): the near reads through each chunk's band block and its inverse, the far reads by
    the plan's kind (``_RunFarReads``, ``_GatheredFarReads``)."""

    @staticmethod
    def forward(ctx, alpha, beta, x, y_prefix, plan):
        # head-first inside: alpha [B,H,T], beta [B,H,T,W], x [B,H,T,V], y_prefix [B,H,P,V]
        b, h, t, v = x.shape
        p, reach = plan.p, plan.reach
        band = _band(beta, plan)
        inv = _chunk_inverses(band, plan)
        far = _far_reads(plan, beta)
        # outputs by buffer position; zeros, as a lattice piece may read a not-yet-solved position
        # with a zero coefficient
        buf = x.new_zeros(b, h, p + t, v)
        buf[:, :, :p] = y_prefix
        rhs = alpha[..., None] * x  # accumulates every contribution a row receives before its solve
        for ci, (s, e) in enumerate(plan.chunks):
            far.add(rhs, buf, ci)
            r_c = rhs[:, :, s:e]
            lo = max(0, p + s - reach)
            if plan.has_prev[ci]:
                r_c = r_c + band[:, :, s:e, lo - (p + s - reach) : reach] @ buf[:, :, lo : p + s]
            buf[:, :, p + s : p + e] = (inv[:, :, ci, : e - s, : e - s] @ r_c.to(inv.dtype)).to(x.dtype)
        ctx.save_for_backward(alpha, beta, x, buf, band, inv)  # band and inv: O(T C), cheaper kept than rebuilt
        ctx.plan = plan
        return buf[:, :, p:].clone()

    @staticmethod
    def backward(ctx, gy):
        alpha, beta, x, buf, band, inv = ctx.saved_tensors
        plan = ctx.plan
        p, reach = plan.p, plan.reach
        b, h, t, v = x.shape
        inv_t = inv.transpose(-1, -2)  # (I - B_cc)^{-T}
        far = _far_reads(plan, beta)
        gacc = gy.new_zeros(b, h, p + t, v)  # gradient reaching each buffer position from later reads
        g_all = gy.new_empty(b, h, t, v)  # G = (I - B)^{-T} dY
        for ci in reversed(range(len(plan.chunks))):
            s, e = plan.chunks[ci]
            g = gy[:, :, s:e] + gacc[:, :, p + s : p + e]
            # (the transpose of a lower block's leading m x m inverse is the top-left of inv^T)
            g = (inv_t[:, :, ci, : e - s, : e - s] @ g.to(inv_t.dtype)).to(gy.dtype)
            g_all[:, :, s:e] = g
            lo = max(0, p + s - reach)
            if plan.has_prev[ci]:
                gacc[:, :, lo : p + s] += band[:, :, s:e, lo - (p + s - reach) : reach].transpose(-1, -2) @ g
            far.pass_back(gacc, g_all, ci)
        galpha = (g_all * x).sum(-1)
        gx = alpha[..., None] * g_all
        return galpha, far.coefficient_grads(g_all, buf), gx, gacc[:, :, :p], None


def chunked_pattern_solve(
    alpha: Tensor,
    beta: Tensor,
    idx: Tensor,
    x: Tensor,
    y_prefix: Tensor | None = None,
    chunk_size: int = 64,
    plan: PatternPlan | None = None,
) -> Tensor:
    """Solve the pattern recurrence chunk by chunk.

    Args:
        alpha: [B, T, H] self coefficients (the diagonal of A).
        beta: [B, T, H, W] neighbour coefficients; entries where idx < 0 are ignored.
        idx: [T, W] long, buffer position read by (t, w), -1 for none; must satisfy idx[t] < P + t.
            Or per-row tables [B, T, W] (packed rows, ``packed_table``; module docstring).
        x: [B, T, H, V] inputs (values).
        y_prefix: [B, P, H, V] outputs of cached earlier positions (buffer positions 0..P-1), or None.
        chunk_size: C, the block size of the triangular solves.
        plan: the table's ``PatternPlan`` for this P and C (built here if None).
    Returns:
        y: [B, T, H, V].
    """
    if chunk_size <= 0:
        raise InputError(f"chunk_size must be > 0, got {chunk_size}")
    b, t, h, v = x.shape
    if y_prefix is None:
        y_prefix = x.new_zeros(b, 0, h, v)
    if beta.dim() != 4 or beta.shape[:3] != (b, t, h) or not table_fits(idx, b, t, beta.shape[3]):
        raise InputError(f"shape mismatch: x {tuple(x.shape)}, beta {tuple(beta.shape)}, idx {tuple(idx.shape)}")
    p = y_prefix.shape[1]
    if plan is None:
        plan = plan_pattern(idx, p, chunk_size)
    elif (plan.t, plan.w, plan.p, plan.chunk) != (t, idx.shape[-1], p, chunk_size) or isinstance(
        plan, RowPatternPlan
    ) != (idx.dim() == 3):
        raise InputError(
            f"plan for T={plan.t}, W={plan.w}, P={plan.p}, C={plan.chunk} "
            f"({'per-row' if isinstance(plan, RowPatternPlan) else 'shared'} table) used with "
            f"idx {tuple(idx.shape)}, P={p}, C={chunk_size}"
        )
    y = _PatternSolve.apply(
        alpha.transpose(1, 2), beta.transpose(1, 2), x.transpose(1, 2), y_prefix.transpose(1, 2), plan
    )
    return y.transpose(1, 2)


def recurrent_pattern_solve(
    alpha: Tensor, beta: Tensor, idx: Tensor, x: Tensor, y_prefix: Tensor | None = None
) -> Tensor:
    """Reference for ``chunked_pattern_solve``: forward substitution one position at a time, plain
    autograd. Same arguments (no chunking; per-row tables [B, T, W] row by row); O(T W V) time,
    for tests."""
    b, t, h, v = x.shape
    if idx.dim() == 3:
        yp = y_prefix if y_prefix is not None else x.new_zeros(b, 0, h, v)
        rows = [slice(i, i + 1) for i in range(b)]
        return torch.cat([recurrent_pattern_solve(alpha[r], beta[r], idx[r][0], x[r], yp[r]) for r in rows])
    ys = list((y_prefix if y_prefix is not None else x.new_zeros(b, 0, h, v)).unbind(1))
    p = len(ys)
    for s in range(t):
        y = alpha[:, s, :, None] * x[:, s]
        for w, j in enumerate(idx[s].tolist()):
            if j >= 0:
                y = y + beta[:, s, :, w, None] * ys[j]
        ys.append(y)
    return torch.stack(ys[p:], 1)


# ---------------------------------------------------------------- (nearly) dense patterns: matmuls
def _window_scores(
    q_c: Tensor, kwin: Tensor, s: int, p: int, lo: int, window: int, scale: float, key_start: Tensor | None = None
) -> Tensor:
    """Masked scores of rows s.. of the segment against buffer positions lo..: [B, H, C, L], -inf
    outside {t - window, ..., t} (the row's own position included: its self score) and, with
    ``key_start`` [B] (or per query [B, T]), at the positions < key_start[b] (key_start[b, t])
    other than the row's own."""
    sc = (q_c @ kwin.transpose(-1, -2)) * scale
    c = q_c.shape[2]
    own = p + s + torch.arange(c, device=q_c.device)[:, None]  # buffer position of each row
    pos = lo + torch.arange(kwin.shape[2], device=q_c.device)[None, :]
    out = (pos > own) | (pos < own - window)  # [C, L]
    if key_start is not None:
        first = key_start[:, None, None] if key_start.dim() == 1 else key_start[:, s : s + c, None]
        out = out | ((pos[None] < first) & (pos != own))[:, None]  # [B, 1, C, L]
    return sc.masked_fill_(out, float("-inf"))


class _WindowSoftmaxSolve(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, kbuf, x, y_prefix, window, chunk, scale, key_start):
        # head-first: q [B,H,T,K], kbuf [B,H,P+T,K], x [B,H,T,V], y_prefix [B,H,P,V]
        b, h, t, v = x.shape
        p = y_prefix.shape[2]
        buf = torch.cat([y_prefix, x.new_zeros(b, h, t, v)], 2)
        lse = x.new_empty(b, h, t)
        for s in range(0, t, chunk):
            e = min(s + chunk, t)
            lo = max(0, p + s - window)
            sc = _window_scores(q[:, :, s:e], kbuf[:, :, lo : p + e], s, p, lo, window, scale, key_start)
            lse[:, :, s:e] = torch.logsumexp(sc, -1)
            coef = torch.exp(sc - lse[:, :, s:e, None])  # softmax over {t} ∪ N(t): [B, H, C, L]
            inside = coef[..., p + s - lo :]  # the chunk's own C x C block; its diagonal is alpha
            alpha = inside.diagonal(dim1=-2, dim2=-1).clone()
            inside.diagonal(dim1=-2, dim2=-1).zero_()
            rhs = alpha[..., None] * x[:, :, s:e] + coef[..., : p + s - lo] @ buf[:, :, lo : p + s]
            buf[:, :, p + s : p + e] = solve_unit_lower(inside, rhs)
        ctx.save_for_backward(q, kbuf, x, buf, lse)
        ctx.window, ctx.chunk, ctx.scale, ctx.key_start = window, chunk, scale, key_start
        return buf[:, :, p:].clone()

    @staticmethod
    def backward(ctx, gy):
        q, kbuf, x, buf, lse = ctx.saved_tensors
        window, chunk, scale, key_start = ctx.window, ctx.chunk, ctx.scale, ctx.key_start
        b, h, t, v = x.shape
        p = buf.shape[2] - t
        gacc = gy.new_zeros(b, h, p + t, v)
        dq, dk, dx = torch.zeros_like(q), torch.zeros_like(kbuf), torch.empty_like(x)
        for s in reversed(range(0, t, chunk)):
            e = min(s + chunk, t)
            lo = max(0, p + s - window)
            kwin = kbuf[:, :, lo : p + e]
            coef = torch.exp(
                _window_scores(q[:, :, s:e], kwin, s, p, lo, window, scale, key_start) - lse[:, :, s:e, None]
            )
            inside = coef[..., p + s - lo :]
            alpha = inside.diagonal(dim1=-2, dim2=-1).clone()
            inside.diagonal(dim1=-2, dim2=-1).zero_()
            g = solve_unit_lower(inside, gy[:, :, s:e] + gacc[:, :, p + s : p + e], transpose=True)
            gacc[:, :, lo : p + s] += coef[..., : p + s - lo].transpose(-1, -2) @ g
            dx[:, :, s:e] = alpha[..., None] * g
            # d coef[t, j] = G_t . y_j for neighbours, G_t . x_t for the own (alpha) slot
            dcoef = g @ buf[:, :, lo : p + e].transpose(-1, -2)
            dcoef[..., p + s - lo :].diagonal(dim1=-2, dim2=-1).copy_((g * x[:, :, s:e]).sum(-1))
            inside.diagonal(dim1=-2, dim2=-1).copy_(alpha)  # coef is the full softmax again
            dsc = coef * (dcoef - (coef * dcoef).sum(-1, keepdim=True)) * scale
            dq[:, :, s:e] = dsc @ kwin
            dk[:, :, lo : p + e] += dsc.transpose(-1, -2) @ q[:, :, s:e]
        return dq, dk, dx, gacc[:, :, :p], None, None, None, None


def chunked_window_softmax(
    q: Tensor,
    kbuf: Tensor,
    x: Tensor,
    y_prefix: Tensor | None,
    window: int,
    chunk_size: int = 64,
    scale: float | None = None,
    key_start: Tensor | None = None,
) -> Tensor:
    """The structured recurrence with softmax coefficients on a window pattern, as matmuls.

    Every position t reads the previous ``window`` positions (all of them for the dense pattern:
    window >= P + T). Coefficients: softmax over {t} ∪ N(t) of the scores q_t . k_j * scale,
    alpha_t the self term; y_t = alpha_t x_t + sum_{j in N(t)} beta_{t,j} y_j. Per chunk of C rows
    the scores against the window, the softmax, the contribution of earlier chunks (one matmul) and
    a C x C solve; backward recomputes the scores from the saved log-sum-exp.

    Args:
        q: [B, T, H, K] queries of the segment.
        kbuf: [B, P + T, H, K] keys: the P cached positions (the P positions just before the
            segment, contiguous), then the segment's.
        x: [B, T, H, V] values.
        y_prefix: [B, P, H, V] outputs of the cached positions, or None (P = 0).
        window: M >= 1, the number of previous positions each row reads.
        chunk_size: C.
        scale: score scale, 1 / sqrt(K) if None.
        key_start: [B] long, leading padding positions of each row's buffer (left-padded batches):
            excluded from every row's neighbours but a padding row's own self term; or [B, T], the
            buffer position where each query's document begins (packed rows: a query reads no
            key before it); or None.
    Returns:
        y: [B, T, H, V].
    """
    if chunk_size <= 0:
        raise InputError(f"chunk_size must be > 0, got {chunk_size}")
    if window < 1:
        raise InputError(f"window must be >= 1, got {window}")
    b, t, h, k = q.shape
    if y_prefix is None:
        y_prefix = x.new_zeros(b, 0, h, x.shape[-1])
    p = y_prefix.shape[1]
    if kbuf.shape != (b, p + t, h, k) or x.shape[:3] != (b, t, h) or y_prefix.shape[0::2] != (b, h):
        raise InputError(
            f"shape mismatch: q {tuple(q.shape)}, kbuf {tuple(kbuf.shape)}, x {tuple(x.shape)}, "
            f"y_prefix {tuple(y_prefix.shape)}"
        )
    scale = 1.0 / math.sqrt(k) if scale is None else scale
    y = _WindowSoftmaxSolve.apply(
        q.transpose(1, 2),
        kbuf.transpose(1, 2),
        x.transpose(1, 2),
        y_prefix.transpose(1, 2),
        window,
        chunk_size,
        scale,
        key_start,
    )
    return y.transpose(1, 2)


def window_softmax_reference(
    q: Tensor, kbuf: Tensor, x: Tensor, y_prefix: Tensor | None, window: int, scale: float | None = None
) -> Tensor:
    """Reference for ``chunked_window_softmax``: the dense [T, P + T] scores, masked softmax, and a
    forward substitution one position at a time (plain autograd). Same arguments."""
    b, t, h, k = q.shape
    p = kbuf.shape[1] - t
    scale = 1.0 / math.sqrt(k) if scale is None else scale
    sc = torch.einsum("bthk,bshk->bths", q, kbuf) * scale
    own = p + torch.arange(t)[:, None]
    pos = torch.arange(p + t)[None, :]
    outside = ((pos > own) | (pos < own - window))[:, None, :]  # [T, 1, P + T]
    coef = torch.softmax(sc.masked_fill(outside, float("-inf")), -1)
    ys = list((y_prefix if y_prefix is not None else x.new_zeros(b, 0, h, x.shape[-1])).unbind(1))
    for s in range(t):
        y = coef[:, s, :, p + s, None] * x[:, s]
        for j in range(max(0, p + s - window), p + s):
            y = y + coef[:, s, :, j, None] * ys[j]
        ys.append(y)
    return torch.stack(ys[p:], 1)
