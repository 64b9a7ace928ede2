"""Expressivity metrics of the communication graph (framework §4.2–4.3): shortest information path,
congestion of the fixed-offset copy routing, and reach.

The graph of a layer: information from input x_j reaches output y_i by one A-step (free when A only
has its diagonal, one hop otherwise: attention), any number of B-hops y_u -> y_v (v reads u), and a
readout step R (free when diagonal). By the Neumann expansion M = R (I - B)^{-1} A, M[i, j] != 0 only
if such a path exists. The *shortest information path* d(i, j) counts hops; for a pattern recurrence
(A diagonal) it is the B-distance of ``tokenmix.patterns.graph``, which is reused here.

Translation-invariant patterns (every hop length f(k) usable at every position) have d(i, j) = d(i - j)
with d(g) the fewest allowed lengths summing to g (a coin problem solved for all gaps at once:
:func:`gap_hops`), exact at any n. Other patterns (cache-efficient lattice, Fenwick) and materialised
operators go through the graph distances, limited by memory to moderate n.

*Congestion* (§4.3) of the copy at a fixed offset L: every flow j -> j + L gets a path and the load of
a node is the number of flows whose hops land on it; congestion is the largest load. With a
translation-invariant pattern all flows can use the same decomposition of L shifted in time, so each
node is hit once per hop: congestion = d(L) (pow2: popcount(L) <= log2 n; sq1: <= 4). Other graphs are
routed along shortest paths (an upper bound on the optimum); the lower bound
ceil(sum of flow distances / number of nodes a hop can land on) is reported beside it.

*Reach*: how many past positions the last output depends on, within h hops, per layer (support of M)
and through L stacked layers (residual: support of S^L); for materialised operators also the
effective reach |M[i, j]| >= tol * max_j |M[i, j]|.

*Hop profile* (:func:`hop_profile`): the same distances of a pattern graph level by level, as bitsets
(one bit per pair, n^2 / 8 bytes): level h ORs the level h - 1 reach sets of every neighbour, so a whole
breadth-first level is |N| gathers of [n, n / 64] words. It gives the path max and mean, the reach
within h hops and the copy flows' distances (the congestion lower bound) without the [n, n] int64
distance matrix: ~40x faster than the graph distances at n = 4096 for the lattice and Fenwick
patterns, which ``tokenmix design`` evaluates by the dozen (``pattern_metrics(..., routing=False)``).

The §4.2–4.3 table over patterns and mixers is ``expressivity_table.py``; its figures and files,
``expressivity_report.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from torch import Tensor

from tokenmix.analysis.defaults import GRAPH_PATH_LIMIT
from tokenmix.core.errors import InputError
from tokenmix.core.operator import MixOperator
from tokenmix.patterns import Pattern, TranslationInvariant, pattern_report
from tokenmix.patterns.graph import UNREACHABLE, distance_matrix

CROSSCHECK_LIMIT = 1024  # the gap DP is checked against the graph distances up to this n
GRAPH_CHECK_BUDGET = 3e8  # n^2 x levels of the graph BFS used for the cross-check
GAP_DP_BUDGET = 4e8  # n x levels of the gap DP (dense patterns grow as n^2)


# ----------------------------------------------------------------------------- translation-invariant
def gap_hops(pattern: TranslationInvariant, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Fewest hops d[g] covering each gap g < n with the pattern's lengths, and the first hop used.

    d[0] = 0; d[g] = 1 + min_{f(k) <= g} d[g - f(k)] (UNREACHABLE if no decomposition). Ties take the
    longest hop, so pow2 decomposes g into its binary digits from the top.
    """
    if not isinstance(pattern, TranslationInvariant):
        raise TypeError(f"gap_hops needs a translation-invariant pattern, got {pattern!r}")
    dist = np.asarray(pattern.distances(max(n, 2)), dtype=np.int64)[::-1]  # longest first
    d = np.full(n, UNREACHABLE, dtype=np.int64)
    first = np.full(n, -1, dtype=np.int64)
    if n:
        d[0] = 0
    for g in range(1, n):
        ok = dist[dist <= g]
        if not len(ok):
            continue
        cand = d[g - ok]
        k = int(np.argmin(cand))
        if cand[k] < UNREACHABLE:
            d[g], first[g] = cand[k] + 1, ok[k]
    return d, first


def decomposition(first: np.ndarray, gap: int) -> list[int]:
    """Hop lengths of the shortest decomposition of ``gap`` (from :func:`gap_hops`'s first hops)."""
    hops, g = [], gap
    while g > 0:
        if first[g] < 0:
            raise InputError(f"gap {gap} cannot be decomposed into the pattern's hop lengths")
        hops.append(int(first[g]))
        g -= int(first[g])
    return hops


def gap_path_stats(d: np.ndarray) -> tuple[float, float]:
    """(max, mean) shortest path over all pairs j < i < n from the per-gap hops d[g]."""
    n = len(d)
    if n < 2:
        return 0.0, 0.0
    gaps = d[1:]
    if (gaps >= UNREACHABLE).any():
        return math.inf, math.inf
    weights = np.arange(n - 1, 0, -1, dtype=np.float64)  # gap g occurs n - g times
    return float(gaps.max()), float((gaps * weights).sum() / weights.sum())


def shared_decomposition_congestion(hops: Sequence[int], n: int, offset: int) -> int:
    """Largest node load when every flow j -> j + offset (j + offset < n) uses the same hop sequence.

    Flow j lands on j + offset - (s_1 + ... + s_{t-1}) at hop t; for fixed t those nodes form a
    contiguous range, so loads accumulate as range additions.
    """
    flows = n - offset
    if flows <= 0 or not hops:
        return 0
    load = np.zeros(n, dtype=np.int64)
    landed = offset
    for s in hops:
        load[landed : landed + flows] += 1
        landed -= s
    return int(load.max())


# ----------------------------------------------------------------------------- general graphs
class SupportPattern(Pattern):
    """A pattern given by an explicit strictly-lower support of B [n, n] (e.g. from a materialised operator),
    so the graph distances of ``tokenmix.patterns.graph`` apply to it."""

    def __init__(self, support: np.ndarray, name: str = "support") -> None:
        s = np.asarray(support, dtype=bool)
        if s.ndim != 2 or s.shape[0] != s.shape[1]:
            raise InputError(f"support must be [n, n], got {s.shape}")
        if np.triu(s).any():
            raise InputError("B support must be strictly lower triangular")
        self.support, self.name = s, name
        self._rows = [np.nonzero(s[t])[0] for t in range(s.shape[0])]

    def n_levels(self, n: int) -> int:
        return max((len(r) for r in self._rows[:n]), default=0)

    def _table_np(self, t: np.ndarray) -> np.ndarray:
        w = max(1, self.n_levels(int(t.max()) + 1))
        table = np.full((len(t), w), -1, dtype=np.int64)
        for i, pos in enumerate(t.tolist()):
            row = self._rows[pos][::-1]  # nearest first
            table[i, : len(row)] = row
        return table

    def needed(self, t: int) -> list[int]:
        later = self.support[t:, :t]
        return np.nonzero(later.any(axis=0))[0].tolist() if later.size else []


def _min_plus(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """C[i, j] = min_l left[i, l] + right[l, j] with UNREACHABLE as infinity (row by row)."""
    n = left.shape[0]
    out = np.full((n, right.shape[1]), UNREACHABLE, dtype=np.int64)
    for i in range(n):
        row = left[i]
        ls = np.nonzero(row < UNREACHABLE)[0]
        if len(ls):
            out[i] = (row[ls, None] + right[ls]).min(axis=0)
    out[out > UNREACHABLE] = UNREACHABLE
    return out


def _step_cost(support: np.ndarray) -> np.ndarray:
    """Cost of one A or R step: 0 on a nonzero diagonal, 1 off the diagonal, UNREACHABLE where zero."""
    cost = np.where(support, 1, UNREACHABLE).astype(np.int64)
    diag = np.arange(support.shape[0])
    cost[diag, diag] = np.where(support[diag, diag], 0, UNREACHABLE)
    return cost


def _is_diagonal(support: np.ndarray | None) -> bool:
    if support is None:
        return True
    n = support.shape[0]
    return bool(support[np.arange(n), np.arange(n)].all()) and int(support.sum()) == n


class _PathMetrics:
    """Metrics shared by one graph and a family of graphs: needs ``n``, ``distances()``, ``route()``."""

    n: int

    def path_stats(self) -> tuple[float, float]:
        """(max, mean) shortest information path over pairs j < i (inf if some pair has no path)."""
        d = self.distances()
        if self.n < 2:
            return 0.0, 0.0
        lower = d[np.tril_indices(self.n, k=-1)]
        if (lower >= UNREACHABLE).any():
            return math.inf, math.inf
        return float(lower.max()), float(lower.mean())

    def routed_congestion(self, offset: int) -> tuple[int, int]:
        """(congestion of shortest-path routing, lower bound) for the copy at ``offset``."""
        flows = self.n - offset
        if flows <= 0:
            return 0, 0
        d = self.distances()
        load = np.zeros(self.n, dtype=np.int64)
        total = 0
        for j in range(flows):
            if d[j + offset, j] >= UNREACHABLE:
                return UNREACHABLE, UNREACHABLE
            path = self.route(j, j + offset, load)
            total += len(path)
            np.add.at(load, path, 1)
        return int(load.max()), math.ceil(total / max(self.n - 1, 1))

    def support(self) -> np.ndarray:
        """S [n, n] bool: M[i, j] can be nonzero (a path exists)."""
        return self.distances() < UNREACHABLE


@dataclass
class CommunicationGraph(_PathMetrics):
    """Layer graph over n positions: A-step, B-hops (a Pattern), R-step (None = diagonal).

    Attributes:
        n: number of positions.
        b_pattern: the B-edges (a pattern, or :class:`SupportPattern` of an operator).
        a_support / r_support: [n, n] bool supports, or None for the plain diagonal.
    """

    n: int
    b_pattern: Pattern
    a_support: np.ndarray | None = None
    r_support: np.ndarray | None = None
    name: str = ""
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_pattern(cls, pattern: Pattern, n: int) -> "CommunicationGraph":
        return cls(n, pattern, name=pattern.name)

    def b_distances(self) -> np.ndarray:
        """E [n, n]: B-hops from y_j to y_i (0 on the diagonal)."""
        if "E" not in self._cache:
            self._cache["E"] = distance_matrix(self.b_pattern, self.n)
        return self._cache["E"]

    def input_distances(self) -> np.ndarray:
        """D1 [n, n]: hops from input x_j to the state y_i (A-step then B-hops)."""
        if "D1" not in self._cache:
            e = self.b_distances()
            self._cache["D1"] = e if self.a_support is None else _min_plus(e, _step_cost(self.a_support))
        return self._cache["D1"]

    def distances(self) -> np.ndarray:
        """D [n, n]: shortest information path from x_j to the output i (UNREACHABLE if none)."""
        if "D" not in self._cache:
            d1 = self.input_distances()
            self._cache["D"] = d1 if self.r_support is None else _min_plus(_step_cost(self.r_support), d1)
        return self._cache["D"]

    def route(self, j: int, i: int, load: np.ndarray | None = None) -> list[int]:
        """A shortest path from x_j to output i as the list of nodes its hops land on.

        Among equally short continuations the least loaded node is taken (``load``: flows already
        landing on each node), then the earliest one, which spreads flows over parallel paths.
        """

        def pick(cands):
            return min(cands, key=(lambda v: (load[v], v)) if load is not None else None)

        d, d1 = self.distances(), self.input_distances()
        if d[i, j] >= UNREACHABLE:
            raise InputError(f"no path from position {j} to {i}")
        landed: list[int] = []
        u = i
        if self.r_support is not None:
            cost = _step_cost(self.r_support)[i]
            cands = [l for l in np.nonzero(cost < UNREACHABLE)[0] if cost[l] + d1[l, j] == d[i, j]]
            u = int(pick(cands))
            if u != i:
                landed.append(i)
        a_cost = _step_cost(self.a_support) if self.a_support is not None else None
        while True:
            here = int(d1[u, j])
            direct = (0 if u == j else UNREACHABLE) if a_cost is None else int(a_cost[u, j])
            if direct == here:
                if direct == 1:
                    landed.append(u)
                return landed
            landed.append(u)
            nbs = self.b_pattern.neighbors(u)
            u = int(pick([v for v in nbs if d1[v, j] == here - 1]))


class GraphFamily(_PathMetrics):
    """Heads (and state channels) with different supports: a path runs inside one of them, so the
    distance is the minimum over the family and each flow is routed in a graph attaining it."""

    def __init__(self, graphs: Sequence[CommunicationGraph]) -> None:
        if not graphs:
            raise InputError("empty graph family")
        self.graphs, self.n = list(graphs), graphs[0].n
        self._d: np.ndarray | None = None

    def distances(self) -> np.ndarray:
        if self._d is None:
            self._d = np.minimum.reduce([g.distances() for g in self.graphs])
        return self._d

    def route(self, j: int, i: int, load: np.ndarray | None = None) -> list[int]:
        best = min(self.graphs, key=lambda g: g.distances()[i, j])
        return best.route(j, i, load)


def operator_graph(op: MixOperator, name: str = "operator", batch: int = 0) -> CommunicationGraph | GraphFamily:
    """The communication graph of a materialised operator (batch element ``batch``), one graph per
    distinct (A, B, R) support among its heads and state channels."""

    def per_path(m: Tensor) -> np.ndarray:  # [P, T, T] bool, P = heads x channels
        s = (m[batch].detach() != 0).cpu().numpy()
        return s.reshape(-1, *s.shape[-2:])

    a, b = per_path(op.A), per_path(op.B)
    r = per_path(op.R) if op.R is not None else [None] * len(a)
    unique: dict[bytes, CommunicationGraph] = {}
    for ak, bk, rk in zip(a, b, r):
        key = np.packbits(ak).tobytes() + np.packbits(bk).tobytes() + (b"" if rk is None else np.packbits(rk).tobytes())
        if key not in unique:
            unique[key] = CommunicationGraph(
                ak.shape[0],
                SupportPattern(bk, name),
                None if _is_diagonal(ak) else ak,
                None if _is_diagonal(rk) else rk,
                name,
            )
    graphs = list(unique.values())
    return graphs[0] if len(graphs) == 1 else GraphFamily(graphs)


# ----------------------------------------------------------------------------- reach
def reach_through_layers(support_row_fn, n: int, layers: int) -> list[int]:
    """Positions the last output depends on through 1..layers stacked layers (residual stack).

    ``support_row_fn(v)`` maps a boolean vector over positions (what layer l-1 depends on) to the
    positions layer l then depends on: the union of the support rows of every marked position.
    """
    v = np.zeros(n, dtype=bool)
    v[n - 1] = True
    out = []
    for _ in range(layers):
        v = support_row_fn(v) | v
        out.append(int(v.sum()))
    return out


def graph_reach(graph: CommunicationGraph | GraphFamily, layers: int, max_hops: int = 6) -> dict:
    s = graph.support().astype(np.float32)
    d_last = graph.distances()[graph.n - 1]
    return {
        "per_layer": int((d_last < UNREACHABLE).sum()),
        "through_layers": reach_through_layers(lambda v: (v.astype(np.float32) @ s) > 0, graph.n, layers),
        "within_hops": [int((d_last <= h).sum()) for h in range(1, max_hops + 1)],
    }


def gap_reach(d: np.ndarray, layers: int, max_hops: int = 6) -> dict:
    """Reach of the last output for a translation-invariant pattern, from the per-gap hops d[g]."""
    n = len(d)
    reach_gaps = d < UNREACHABLE  # gaps g with a path (g = 0 included)

    def step(v: np.ndarray) -> np.ndarray:
        # v marks positions; position p reaches p - g for every reachable gap g: a boolean correlation
        return np.convolve(v[::-1].astype(np.float64), reach_gaps.astype(np.float64))[:n][::-1] > 0.5

    return {
        "per_layer": int(reach_gaps.sum()),
        "through_layers": reach_through_layers(step, n, layers),
        "within_hops": [int((d <= h).sum()) for h in range(1, max_hops + 1)],
    }


def _popcount(words: np.ndarray) -> int:
    """Set bits in an array of uint64 words."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return int(np.bitwise_count(words).sum(dtype=np.int64))
    return int(np.unpackbits(np.ascontiguousarray(words).view(np.uint8)).sum(dtype=np.int64))


def _unpack_row(row: np.ndarray, n: int) -> np.ndarray:
    """Bool [n] of one bitset row (bit j of word j // 64 at position j % 64)."""
    return np.unpackbits(row.astype("<u8").view(np.uint8), bitorder="little")[:n].astype(bool)


@dataclass
class HopProfile:
    """Breadth-first levels of a pattern graph (B-hops only, the graph of :func:`distance_matrix`).

    Attributes:
        n: positions.
        nnz: nonzeros of B (edges).
        pairs_within: [h] pairs j < t with d(t, j) <= h, for h = 0, 1, ... until it stops growing.
        last_within: [h] positions the last token reaches within h hops (itself included), same h.
        flow_hops: d(j + offset, j) for every copy flow j (UNREACHABLE if none); empty without offset.
        rows: the final reach sets as bitsets [n, ceil(n / 64)] uint64 (the support of M).
    """

    n: int
    nnz: int
    pairs_within: list[int]
    last_within: list[int]
    flow_hops: np.ndarray
    rows: np.ndarray

    @property
    def pairs(self) -> int:
        return self.n * (self.n - 1) // 2

    def path_stats(self) -> tuple[float, float]:
        """(max, mean) shortest path over pairs j < t, as :func:`patterns.graph.shortest_paths`."""
        if self.n < 2:
            return 0.0, 0.0
        if self.pairs_within[-1] < self.pairs:
            return math.inf, math.inf
        # mean d = sum over h >= 0 of the fraction of pairs with d > h
        return float(len(self.pairs_within) - 1), sum(self.pairs - c for c in self.pairs_within[:-1]) / self.pairs

    def congestion_lower(self) -> float:
        """⌈sum of the copy flows' path lengths / (n − 1)⌉: every hop lands on one of n − 1 nodes."""
        if not len(self.flow_hops):
            return 0
        if (self.flow_hops >= UNREACHABLE).any():
            return math.inf
        return math.ceil(int(self.flow_hops.sum()) / max(self.n - 1, 1))

    def reach(self, layers: int, max_hops: int = 6) -> dict:
        """The reach record of :func:`graph_reach` (per layer, through stacked layers, within h hops)."""

        def step(v: np.ndarray) -> np.ndarray:
            marked = np.nonzero(v)[0]
            return _unpack_row(np.bitwise_or.reduce(self.rows[marked], axis=0), self.n) if len(marked) else v

        last = self.last_within
        return {
            "per_layer": last[-1],
            "through_layers": reach_through_layers(step, self.n, layers),
            "within_hops": [last[min(h, len(last) - 1)] for h in range(1, max_hops + 1)],
        }


def hop_profile(pattern: Pattern, n: int, offset: int | None = None) -> HopProfile:
    """Breadth-first levels of the pattern's graph for all targets at once, as bitsets.

    R_0[t] = {t}; R_h[t] = R_{h-1}[t] ∪ ⋃_{m in N(t)} R_{h-1}[m] (one more hop back from t), so R_h[t] is
    every j with d(t, j) <= h: the row recursion of :func:`distance_matrix` by levels instead of rows.
    A level costs |N| gathers of [n, n / 64] words; the levels stop when no set grows (the largest
    shortest path, or a pair that has no path). Exact: tests compare it with the graph distances.
    """
    if n < 1:
        raise InputError(f"n must be >= 1, got {n}")
    table = pattern.neighbor_table(0, n).numpy()
    nnz = int((table >= 0).sum())
    table = np.where(table >= 0, table, n)  # row n: the empty set (no neighbour)
    words = (n + 63) // 64
    rows = np.zeros((n + 1, words), dtype=np.uint64)
    pos = np.arange(n)
    rows[pos, pos >> 6] = np.left_shift(np.uint64(1), (pos & 63).astype(np.uint64))
    flows = np.arange(n - offset) if offset is not None and 0 < offset < n else np.arange(0)
    flow_hops = np.full(len(flows), UNREACHABLE, dtype=np.int64)
    shift = (flows & 63).astype(np.uint64)
    pairs_within, last_within = [0], [1]
    level = np.empty((n, words), dtype=np.uint64)
    for h in range(1, n):
        np.copyto(level, rows[:n])
        for w in range(table.shape[1]):
            np.bitwise_or(level, rows[table[:, w]], out=level)
        rows[:n] = level
        within = _popcount(level) - n
        if within == pairs_within[-1]:
            break
        pairs_within.append(within)
        last_within.append(_popcount(level[n - 1]))
        if len(flows):
            hit = (level[flows + offset, flows >> 6] >> shift) & np.uint64(1)
            flow_hops[(hit == 1) & (flow_hops == UNREACHABLE)] = h
        if within == n * (n - 1) // 2:
            break
    return HopProfile(n, nnz, pairs_within, last_within, flow_hops, rows[:n])


def effective_reach(op: MixOperator, layers: int, tol: float = 1e-3, batch: int = 0) -> dict:
    """Positions j with |M[i, j]| >= tol * max_j |M[i, j]| (max over heads), last output and through layers."""
    m = op.mixing_matrix()[batch].detach().abs().amax(0).double().cpu().numpy()  # [T, T]
    rowmax = m.max(axis=1, keepdims=True)
    s = (m >= tol * np.where(rowmax > 0, rowmax, np.inf)).astype(np.float32)
    n = m.shape[0]
    return {
        "tol": tol,
        "per_layer": int(s[n - 1].sum()),
        "through_layers": reach_through_layers(lambda v: (v.astype(np.float32) @ s) > 0, n, layers),
    }


def pattern_metrics(
    pattern: Pattern,
    n: int,
    offset: int,
    layers: int,
    path_limit: int = GRAPH_PATH_LIMIT,
    crosscheck_limit: int = CROSSCHECK_LIMIT,
    *,
    max_hops: int = 6,
    routing: bool = True,
) -> dict:
    """Every metric of the table for one pattern at length n.

    ``max_hops``: the reach within h hops is listed for h = 1..max_hops. ``routing=False``: a pattern that is
    not translation-invariant gets its paths, reach and congestion lower bound from :func:`hop_profile`
    and no routed congestion (the per-flow routing is the slow part); translation-invariant ones are
    unaffected (their congestion is the shared decomposition's, exact and cheap).
    """
    out: dict = {
        "n": n,
        "offset": offset,
        "neighbors_per_token": pattern.neighbors_per_token(n),
        "cache": pattern.cache_size(n),
    }
    if isinstance(pattern, TranslationInvariant) and n * pattern.n_levels(n) > GAP_DP_BUDGET:
        out["method"] = (
            f"skipped: n x levels = {n * pattern.n_levels(n)} exceeds the gap DP budget "
            f"{GAP_DP_BUDGET:.0e} (a dense pattern at this n)"
        )
        return out
    if isinstance(pattern, TranslationInvariant):
        dist = pattern.distances(n)
        out["nnz_B"] = int(sum(max(0, n - f) for f in dist))
        d, first = gap_hops(pattern, n)
        out["path_max"], out["path_mean"] = gap_path_stats(d)
        if d[offset] < UNREACHABLE:
            hops = decomposition(first, offset)
            out["congestion"] = shared_decomposition_congestion(hops, n, offset)
            out["congestion_lower"] = math.ceil((n - offset) * len(hops) / max(n - 1, 1))
            out["offset_decomposition"] = hops if len(hops) <= 16 else f"{len(hops)} hops"
        else:
            out["congestion"] = out["congestion_lower"] = math.inf
        # For L <= n/2 the node L lies in every hop's landing range (see shared_decomposition_congestion),
        # so the shared decomposition's congestion is exactly d(L): the worst offset is the largest d.
        half = d[1 : n // 2 + 1]
        out["congestion_worst"] = int(half.max()) if (half < UNREACHABLE).all() else math.inf
        out["congestion_worst_offset"] = int(np.argmax(half)) + 1
        out["reach"] = gap_reach(d, layers, max_hops)
        out["method"] = "gap DP (translation-invariant, exact)"
        if n <= crosscheck_limit and n * n * pattern.n_levels(n) <= GRAPH_CHECK_BUDGET:
            rep = pattern_report(pattern, n, path_limit=n)
            out["graph_check"] = (
                rep["shortest_path_max"] == out["path_max"]
                and abs(rep["shortest_path_mean"] - out["path_mean"]) < 1e-9
                and rep["nnz_B"] == out["nnz_B"]
                and rep["cache_size"] == out["cache"]
            )
        return out
    if not routing:
        prof = hop_profile(pattern, n, offset)
        out["nnz_B"] = prof.nnz
        out["path_max"], out["path_mean"] = prof.path_stats()
        out["congestion_lower"] = prof.congestion_lower()
        out["reach"] = prof.reach(layers, max_hops)
        out["method"] = "bitset BFS levels (congestion: lower bound only, no routing)"
        return out
    if n > path_limit:
        out["method"] = f"skipped: n > {path_limit} for a non-translation-invariant pattern graph"
        return out
    rep = pattern_report(pattern, n, path_limit=path_limit)
    out["nnz_B"] = rep["nnz_B"]
    out["path_max"], out["path_mean"] = rep["shortest_path_max"], rep["shortest_path_mean"]
    graph = CommunicationGraph.from_pattern(pattern, n)
    out["congestion"], out["congestion_lower"] = graph.routed_congestion(offset)
    out["reach"] = graph_reach(graph, layers, max_hops)
    out["method"] = "graph distances + shortest-path routing"
    return out


def operator_metrics(op: MixOperator, name: str, offset: int, layers: int, tol: float = 1e-3) -> dict:
    graph = operator_graph(op, name)
    n = graph.n
    mx, mean = graph.path_stats()
    cong, low = graph.routed_congestion(offset)
    return {
        "n": n,
        "offset": offset,
        "path_max": mx,
        "path_mean": mean,
        "congestion": math.inf if cong >= UNREACHABLE else cong,
        "congestion_lower": math.inf if low >= UNREACHABLE else low,
        "nnz_B": float((op.B[0] != 0).sum()) / (op.B[0].numel() / (n * n)),  # per head (and channel)
        "graphs": len(graph.graphs) if isinstance(graph, GraphFamily) else 1,
        "reach": graph_reach(graph, layers),
        "effective_reach": effective_reach(op, layers, tol),
        "method": "materialised operator support (random input)",
    }
