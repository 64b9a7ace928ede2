"""Translation-invariant patterns (Prop. 4.2) and their cache-efficient lattice variant (Prop. 4.12).

Exact pattern of a strictly increasing f: N+ -> N>0: token i (1-indexed) reads i - f(k) for every k
with f(k) < i. In 0-indexed positions: N(t) = { t - f(k) : f(k) <= t }.

Cache-efficient lattice (Def. 4.10 / Prop. 4.12), 1-indexed:
    S_i = { a_k * ceil((i - f(k)) / a_k) : f(k) < i },   a_0 = 1,
    a_{k+1} = a_k * ceil((f(k+1) - f(k)) / a_k).
The level-k neighbour i - f(k) is replaced by the nearest multiple of a_k at or above it; the
lattices nest (a_{k+1} is a multiple of a_k), which gives the invariant S_i ⊆ S_{i-1} ∪ {i-1}: every
position a token reads is either cached already or was produced by the previous token, so the
decode cache is exactly S_i and has O(f^{-1}(n)) entries.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from tokenmix.core.errors import InputError
from tokenmix.patterns.base import Pattern

_F_CHECK = 64  # how many values of f are checked for strict monotonicity up front


class TranslationInvariant(Pattern):
    """Exact pattern N(t) = { t - f(k) : f(k) <= t, k < max_levels }.

    Args:
        f: strictly increasing map k -> distance >= 1.
        name: label used in reports.
        max_levels: optional number of levels (f is only used for k < max_levels); None = unbounded.
    """

    distinct_levels = True  # f strictly increasing: level k reads t - f(k), all different

    def __init__(self, f: Callable[[int], int], name: str, max_levels: int | None = None) -> None:
        if max_levels is not None and max_levels < 1:
            raise InputError(f"pattern '{name}': number of levels must be >= 1, got {max_levels}")
        self.f, self.name, self.max_levels = f, name, max_levels
        self._dist: list[int] = []
        self._extend(min(_F_CHECK, max_levels or _F_CHECK), bound=None)

    def _extend(self, k_needed: int, bound: int | None) -> None:
        """Cache f(k) for k < k_needed, or until f(k) > bound; validates monotonicity."""
        while True:
            k = len(self._dist)
            if self.max_levels is not None and k >= self.max_levels:
                return
            if bound is None and k >= k_needed:
                return
            if bound is not None and k > 0 and self._dist[-1] > bound:
                return
            try:
                v = self.f(k)
            except InputError:
                raise
            except Exception as e:  # user-supplied f
                raise InputError(f"pattern '{self.name}': f({k}) raised {type(e).__name__}: {e}") from None
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise InputError(f"pattern '{self.name}': f({k}) = {v!r} is not an integer")
            v = int(v)
            if v < 1:
                raise InputError(f"pattern '{self.name}': f({k}) = {v} must be >= 1 (a distance)")
            if self._dist and v <= self._dist[-1]:
                raise InputError(
                    f"pattern '{self.name}': f must be strictly increasing, but "
                    f"f({k - 1}) = {self._dist[-1]} >= f({k}) = {v}"
                )
            self._dist.append(v)

    def distances(self, n: int) -> list[int]:
        """f(k) for all levels with f(k) <= n - 1 (those usable in an n-token sequence)."""
        self._extend(0, bound=n)
        return [d for d in self._dist if d <= n - 1]

    def distances_span(self, t: int) -> tuple[list[int], int, int | None]:
        """(distances, lo, hi): the f(k) that token t reads, and the positions [lo, hi) that read
        exactly these (hi None: every later one). A decoder keeps one entry per span."""
        d = self.distances(t + 1)  # extends the cached f(k) to the first one beyond t, if any
        lo = d[-1] if d else 0
        hi = self._dist[len(d)] if len(self._dist) > len(d) else None
        return d, lo, hi

    def n_levels(self, n: int) -> int:
        return len(self.distances(n))

    def _table_np(self, t: np.ndarray) -> np.ndarray:
        d = np.asarray(self.distances(int(t.max()) + 1), dtype=np.int64)
        table = t[:, None] - d[None, :]
        table[table < 0] = -1
        return table

    def needed(self, t: int) -> list[int]:
        return list(range(self.needed_from(t), t))

    def needed_from(self, t: int) -> int:
        if self.max_levels is None:
            return 0  # j + f(k) reaches any later token for large k: nothing is evicted
        reach = self._dist[-1] if len(self._dist) == self.max_levels else self.distances(t + 1)[-1]
        return max(0, t - reach)

    def window(self, n: int) -> int | None:
        """M if, in an n-token sequence, every position t reads exactly its M previous positions
        (clipped at 0): f(k) = k + 1 on every usable level (dense: M = n - 1; window:M). Else None."""
        d = self.distances(n)
        return len(d) if d == list(range(1, len(d) + 1)) else None

    def cache_size(self, n: int) -> int:
        if self.max_levels is None:
            return max(n - 1, 0)
        # f(max_levels - 1) directly: listing every level first would take M steps for window:M
        last = self._dist[-1] if len(self._dist) == self.max_levels else self.f(self.max_levels - 1)
        return min(max(n - 1, 0), last)


class Lattice(Pattern):
    """Cache-efficient lattice variant of a translation-invariant pattern (Prop. 4.12)."""

    cache_is_neighbors = True  # the decode cache is exactly S_t (module docstring)

    def __init__(self, base: TranslationInvariant) -> None:
        if base.max_levels is not None:
            raise InputError(f"the lattice variant is defined for unbounded patterns, not '{base.name}'")
        if base.distances(2)[:1] != [1]:
            # The nesting argument needs level 0 to be the previous output: with f(0) > 1, token t
            # reads t - f(0), which is neither in S_{t-1} nor t - 1, and the cache would not be S_t.
            raise InputError(
                f"the cache-efficient lattice of '{base.name}' needs f(0) = 1 (the previous "
                f"output), got f(0) = {base._dist[0]}"
            )
        self.base = base
        self.name = f"{base.name}_ce"
        self._a: list[int] = []

    def lattice_steps(self, n_levels: int) -> list[int]:
        d = self.base._dist
        while len(self._a) < n_levels:
            k = len(self._a)
            if k == 0:
                self._a.append(1)
            else:
                self.base._extend(k + 1, bound=None)
                prev = self._a[-1]
                self._a.append(prev * math.ceil((d[k] - d[k - 1]) / prev))
        return self._a[:n_levels]

    def n_levels(self, n: int) -> int:
        return self.base.n_levels(n)

    def _table_np(self, t: np.ndarray) -> np.ndarray:
        d = np.asarray(self.base.distances(int(t.max()) + 1), dtype=np.int64)
        a = np.asarray(self.lattice_steps(len(d)), dtype=np.int64)
        i = t[:, None] + 1  # 1-indexed
        # a_k * ceil((i - f(k)) / a_k), computed in integers; back to 0-indexed
        j = a[None, :] * (-((-(i - d[None, :])) // a[None, :])) - 1
        j[i - d[None, :] < 1] = -1
        return j

    def needed(self, t: int) -> list[int]:
        # By the invariant S_{i} ⊆ S_{i-1} ∪ {i-1}, whatever a later token reads among positions < t
        # is already in N(t): the cache while processing t is exactly N(t).
        return sorted(self.neighbors(t)) if t > 0 else []


class Fenwick(Pattern):
    """Fenwick (binary indexed tree) partition used by log-linear attention, as a state pattern.

    The prefix [1, i-1] (1-indexed) splits into <= log2(i) + 1 dyadic buckets by repeatedly removing
    the lowest set bit: j = i - 1, j - lowbit(j), ... Token i reads the last position of each bucket.
    Level slot w = index of the bit removed (bucket size 2^w).
    """

    name = "fenwick"
    cache_is_neighbors = True

    def n_levels(self, n: int) -> int:
        return max(1, int(n - 1).bit_length())

    def _table_np(self, t: np.ndarray) -> np.ndarray:
        w = self.n_levels(int(t.max()) + 1)
        table = np.full((len(t), w), -1, dtype=np.int64)
        j = t.copy()  # 1-indexed i - 1 == 0-indexed t
        for _ in range(w):
            ok = j >= 1
            low = j & -j
            lvl = np.zeros_like(j)
            lvl[ok] = np.log2(low[ok]).astype(np.int64)
            rows = np.nonzero(ok)[0]
            table[rows, lvl[ok]] = j[ok] - 1
            j = np.where(ok, j - low, 0)
        return table

    def needed(self, t: int) -> list[int]:
        # Same nesting as the lattice: the chain of t+1 is {t} ∪ a sub-chain of t's chain.
        return sorted(self.neighbors(t)) if t > 0 else []


def fenwick_level(t: int, s: int) -> int:
    """Log-linear attention's level map l(t, s) for 0 <= s <= t (0 = the sentinel bucket {t})."""
    if not 0 <= s <= t:
        raise InputError(f"need 0 <= s <= t, got s={s}, t={t}")
    if s == t:
        return 0
    return int(t ^ s).bit_length()
