"""Pattern facts against the spec (framework.md §4) and against brute force."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmix.patterns import Lattice, TranslationInvariant, fenwick_level, get_pattern, parse_f, shortest_paths
from tokenmix.patterns.graph import distance_matrix


def bfs_distances(pattern, n: int) -> np.ndarray:
    """Independent brute force: BFS from every target over the neighbour lists."""
    nbrs = [pattern.neighbors(t) for t in range(n)]
    d = np.full((n, n), -1)
    for t in range(n):
        d[t, t] = 0
        queue = deque([t])
        while queue:
            u = queue.popleft()
            for j in nbrs[u]:
                if d[t, j] < 0:
                    d[t, j] = d[t, u] + 1
                    queue.append(j)
    return d


def test_lattice_worked_examples():
    ce = get_pattern("pow2_ce")
    # framework.md §4.4, 1-indexed: i = 13 -> {8, 10, 11, 12}; i = 100 -> {64, 80, 88, 92, 96, 98, 99}
    assert sorted(j + 1 for j in ce.neighbors(12)) == [8, 10, 11, 12]
    assert sorted(j + 1 for j in ce.neighbors(99)) == [64, 80, 88, 92, 96, 98, 99]
    assert sorted(j + 1 for j in get_pattern("pow2").neighbors(12)) == [5, 9, 11, 12]


def test_lattice_steps():
    assert get_pattern("pow2_ce").lattice_steps(8) == [1, 1, 2, 4, 8, 16, 32, 64]
    assert get_pattern("sq1_ce").lattice_steps(16) == [1, 1, 3, 6, 12, 12, 12, 24, 24, 24, 24, 24, 24, 48, 48, 48]


@pytest.mark.parametrize("n", [256, 512, 2048, 8192])
def test_pow2_ce_cache_is_ceil_log2(n):
    assert get_pattern("pow2_ce").cache_size(n) == math.ceil(math.log2(n))


def test_sq1_ce_cache_sizes():
    assert [get_pattern("sq1_ce").cache_size(n) for n in (256, 512, 2048)] == [13, 19, 36]


@pytest.mark.parametrize("n", [2, 3, 64, 1024])
def test_pow2_shortest_path_is_popcount(n):
    d = distance_matrix(get_pattern("pow2"), n)
    for t in range(n):
        for j in range(0, t, max(1, t // 7)):
            assert d[t, j] == bin(t - j).count("1")
    mx, _ = shortest_paths(get_pattern("pow2"), n)
    assert mx == max(bin(g).count("1") for g in range(1, n)) == math.floor(math.log2(n))
    if n & (n - 1) == 0:  # the form, exact at powers of two
        assert mx == math.floor(math.log2(n - 1)) + 1


def test_sq1_shortest_path_at_most_4():
    mx, mean = shortest_paths(get_pattern("sq1"), 1024)
    assert mx == 4 and abs(mean - 2.64) < 0.01


def test_reference_rows():
    assert shortest_paths(get_pattern("first_order"), 100) == (99.0, pytest.approx(101 / 3))
    assert shortest_paths(get_pattern("dense"), 100) == (1.0, 1.0)
    assert shortest_paths(get_pattern("window:4"), 101)[0] == 25


@pytest.mark.parametrize("spec", ["pow2", "sq1", "pow2_ce", "sq1_ce", "window:3", "fenwick", "f:3**k", "f:k**3+1_ce"])
def test_distance_matrix_matches_bfs(spec):
    p = get_pattern(spec)
    n = 70
    d = distance_matrix(p, n)
    b = bfs_distances(p, n)
    lower = np.tril_indices(n)
    assert (d[lower] == b[lower]).all()


increasing_f = st.lists(st.integers(1, 40), min_size=1, max_size=12).map(
    lambda steps: [sum(steps[: i + 1]) for i in range(len(steps))]
)
lattice_f = increasing_f.map(lambda f: [1] + [v + 1 for v in f])  # the lattice needs f(0) = 1


@settings(max_examples=40, deadline=None)
@given(fvals=lattice_f, n=st.integers(2, 300))
def test_lattice_invariant_and_cache(fvals, n):
    """S_t ⊆ S_{t-1} ∪ {t-1}; needed(t) equals the brute-force union of later reads."""
    last = fvals[-1]

    def f(k):
        return fvals[k] if k < len(fvals) else last + (k - len(fvals) + 1) * 50

    exact = TranslationInvariant(f, "f")
    ce = Lattice(exact)
    table = ce.neighbor_table(0, n + 60).numpy()
    sets = [set(int(j) for j in row if j >= 0) for row in table]
    for t in range(1, n):
        assert sets[t] <= sets[t - 1] | {t - 1}, f"invariant fails at t={t}"
        # levels of the lattice stay within (f(k) - a_k, f(k)] of the exact distances
        assert all(0 <= j < t for j in sets[t])
    for t in range(n):
        later = set().union(*sets[t:]) if t < len(sets) else set()
        assert set(ce.needed(t)) == {j for j in later if j < t}
    assert ce.cache_size(n) == max(len(ce.needed(t)) for t in range(n))


@settings(max_examples=40, deadline=None)
@given(fvals=increasing_f, n=st.integers(1, 200))
def test_exact_pattern_table(fvals, n):
    p = TranslationInvariant(lambda k: fvals[k] if k < len(fvals) else fvals[-1] + 1000 * k, "f")
    table = p.neighbor_table(0, n).numpy()
    for t in range(n):
        assert sorted(int(j) for j in table[t] if j >= 0) == sorted(t - d for d in p.distances(n) if d <= t)
    assert p.nnz(n) == sum(1 for t in range(n) for d in p.distances(n) if d <= t)


def test_fenwick_levels_match_spec():
    assert [fenwick_level(7, s) for s in range(8)] == [3, 3, 3, 3, 2, 2, 1, 0]
    p = get_pattern("fenwick")
    assert sorted(p.neighbors(12)) == [7, 11]  # 1-indexed i = 13: prefix [1, 12] = [1, 8] + (8, 12]
    assert sorted(p.neighbors(14)) == [7, 11, 13]  # i = 15: [1, 8] + (8, 12] + (12, 14]
    assert p.cache_size(1024) <= 11


@pytest.mark.parametrize(
    "spec,match",
    [
        ("nope", "unknown pattern"),
        ("window:0", "window size"),
        ("window:x", "window size"),
        ("f:k-1", "must be >= 1"),
        ("f:5-k", "strictly increasing"),
        ("f:2", "strictly increasing"),
        ("f:import os", "invalid pattern function"),
        ("f:__import__('os')", "only integers"),
        ("dense_ce", "already bounded or dense"),
        ("first_order_ce", "already bounded or dense"),
        ("fenwick_ce", "no cache-efficient variant"),
        ("f:k+2_ce", "needs f\\(0\\) = 1"),
    ],
)
def test_bad_patterns(spec, match):
    with pytest.raises(ValueError, match=match):
        get_pattern(spec)


def test_bad_sizes():
    with pytest.raises(ValueError):
        get_pattern("pow2").neighbor_table(5, 5)
    with pytest.raises(ValueError, match="levels"):
        TranslationInvariant(lambda k: k + 1, "x", max_levels=0)
    assert parse_f("k**2+1")(3) == 10


@settings(max_examples=40, deadline=None)
@given(fvals=increasing_f, n=st.integers(1, 200), levels=st.one_of(st.none(), st.integers(1, 6)))
def test_needed_from_is_the_contiguous_needed_set(fvals, n, levels):
    """Exact patterns evict in O(1): needed(t) is the range [needed_from(t), t)."""
    p = TranslationInvariant(lambda k: fvals[k] if k < len(fvals) else fvals[-1] + 1000 * k, "f", max_levels=levels)
    for t in range(n):
        start = p.needed_from(t)
        assert p.needed(t) == list(range(start, t))
        later = {j for s in range(t, n + 40) for j in p.neighbors(s) if j < t}
        assert later <= set(range(start, t))  # nothing a later token reads is evicted


def test_needed_from_only_for_contiguous_caches():
    assert get_pattern("pow2").needed_from(50) == 0
    assert get_pattern("window:4").needed_from(50) == 46
    assert get_pattern("pow2_ce").needed_from(50) is None  # the lattice keeps scattered positions
    assert get_pattern("fenwick").needed_from(50) is None


def test_window_detection():
    assert get_pattern("dense").window(100) == 99
    assert get_pattern("f:k+1").window(10) == 9
    assert get_pattern("window:7").window(100) == 7
    assert get_pattern("window:7").window(4) == 3
    assert get_pattern("first_order").window(100) == 1
    assert get_pattern("pow2").window(100) is None  # distances 1, 2, 4: not contiguous
    assert get_pattern("pow2").window(3) == 2  # ... until the third level exists
    assert get_pattern("sq1").window(100) is None


@pytest.mark.parametrize("spec", ["pow2", "sq1", "window:5", "f:3**k", "dense"])
def test_translation_invariant_tables_have_distinct_levels(spec):
    """Deduplication is skipped for exact patterns: check its premise, every row's reads differ."""
    table = get_pattern(spec).neighbor_table(0, 300).numpy()
    for row in table:
        reads = row[row >= 0]
        assert len(set(reads.tolist())) == len(reads)
