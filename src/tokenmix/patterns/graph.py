"""Communication-graph metrics of a pattern (§4.2).

Edge t -> j for j in N(t): information from position j reaches t through a chain of B-hops. The
shortest information path d(t, j) is the fewest hops; pairs j < t only.
"""

from __future__ import annotations

import numpy as np

from tokenmix.patterns.base import Pattern

UNREACHABLE = np.iinfo(np.int32).max


def distance_matrix(pattern: Pattern, n: int) -> np.ndarray:
    """D [n, n] int32 with D[t, j] = hops from j to t (0 on the diagonal, UNREACHABLE if none/j > t).

    Row recursion D[t] = 1 + min_{m in N(t)} D[m], D[t, t] = 0: O(n^2 |N|) vectorised.
    """
    table = pattern.neighbor_table(0, n).numpy()
    d = np.full((n, n), UNREACHABLE, dtype=np.int64)
    for t in range(n):
        nb = table[t][table[t] >= 0]
        if len(nb):
            d[t] = d[nb].min(axis=0) + 1
        d[t, t] = 0
    d[d > UNREACHABLE] = UNREACHABLE
    return d.astype(np.int64)


def shortest_paths(pattern: Pattern, n: int) -> tuple[float, float]:
    """(max, mean) of d(t, j) over all pairs j < t < n; max is inf if some pair is unreachable."""
    if n < 2:
        return 0.0, 0.0
    d = distance_matrix(pattern, n)
    lower = d[np.tril_indices(n, k=-1)]
    if (lower >= UNREACHABLE).any():
        return float("inf"), float("inf")
    return float(lower.max()), float(lower.mean())
