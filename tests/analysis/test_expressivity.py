"""Expressivity metrics against an independent brute-force BFS, and the §4.2–4.3 table against the spec."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mixer_helpers import ALL_MIXERS, small_mixer
from tokenmix.analysis.expressivity import (
    CommunicationGraph,
    decomposition,
    effective_reach,
    gap_hops,
    gap_path_stats,
    gap_reach,
    graph_reach,
    operator_graph,
    pattern_metrics,
    shared_decomposition_congestion,
)
from tokenmix.analysis.expressivity_report import run_expressivity
from tokenmix.analysis.expressivity_table import expressivity_table
from tokenmix.analysis.outputs import PNG_SIGNATURE
from tokenmix.core.operator import MixOperator
from tokenmix.patterns import TranslationInvariant, get_pattern
from tokenmix.patterns.graph import UNREACHABLE
from tokenmix.study.paper import PAPER_PATTERNS

INF = math.inf


pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------- the independent reference
def brute_force_distances(a: np.ndarray, b: np.ndarray, r: np.ndarray | None) -> np.ndarray:
    """0-1 BFS on the layered graph x_j -A-> z_l -B-> z_v ... -R-> out_i; diagonal A/R steps cost 0.

    a, b, r: [P, n, n] bool supports of P heads/channels; a path stays inside one of them.
    Returns D [n, n] float (inf = no path), D[i, j] = fewest hops from x_j to out_i.
    """
    p, n, _ = a.shape
    out = np.full((n, n), INF)
    for k in range(p):
        for j in range(n):
            # node ids: z_l = l, out_i = n + i
            dist = {}
            dq = deque()
            for l in range(n):
                if a[k, l, j]:
                    w = 0 if l == j else 1
                    if dist.get(l, INF) > w:
                        dist[l] = w
                        (dq.appendleft if w == 0 else dq.append)(l)
            while dq:
                u = dq.popleft()
                du = dist[u]
                if u < n:
                    for v in range(u + 1, n):  # z_v reads z_u when B[v, u] != 0
                        if b[k, v, u] and dist.get(v, INF) > du + 1:
                            dist[v] = du + 1
                            dq.append(v)
                    for i in range(n):
                        readout = (i == u) if r is None else r[k, i, u]
                        w = 0 if i == u else 1
                        if readout and dist.get(n + i, INF) > du + w:
                            dist[n + i] = du + w
                            (dq.appendleft if w == 0 else dq.append)(n + i)
            for i in range(n):
                out[i, j] = min(out[i, j], dist.get(n + i, INF))
    return out


def _supports(op: MixOperator):
    def f(m):
        s = (m[0] != 0).numpy()
        return s.reshape(-1, *s.shape[-2:])

    return f(op.A), f(op.B), (f(op.R) if op.R is not None else None)


def _as_float(d: np.ndarray) -> np.ndarray:
    return np.where(d >= UNREACHABLE, INF, d).astype(float)


def _pattern_supports(pattern, n):
    b = np.zeros((1, n, n), dtype=bool)
    for t in range(n):
        b[0, t, pattern.neighbors(t)] = True
    return np.eye(n, dtype=bool)[None], b


# ----------------------------------------------------------------------------- graph distances vs BFS
@pytest.mark.parametrize("name", ALL_MIXERS)
def test_operator_graph_matches_brute_force(name):
    m = small_mixer(name, d_model=8, n_heads=2)
    with torch.no_grad():
        op = m.materialize(torch.randn(1, 11, 8, dtype=torch.float64))
    graph = operator_graph(op, name)
    np.testing.assert_array_equal(_as_float(graph.distances()), brute_force_distances(*_supports(op)))


@pytest.mark.parametrize("spec", ["pow2", "sq1", "pow2_ce", "sq1_ce", "fenwick", "window:3", "first_order"])
def test_pattern_graph_matches_brute_force(spec):
    pattern, n = get_pattern(spec), 37
    a, b = _pattern_supports(pattern, n)
    expected = brute_force_distances(a, b, None)
    graph = CommunicationGraph.from_pattern(pattern, n)
    np.testing.assert_array_equal(_as_float(graph.distances()), expected)
    if isinstance(pattern, TranslationInvariant):
        d, _ = gap_hops(pattern, n)
        for i in range(n):
            for j in range(i + 1):
                assert d[i - j] == expected[i, j]


def test_readout_and_offdiagonal_steps_cost_a_hop():
    """Synthetic operator: A and R read one step back (one hop each), B only two steps back."""
    n = 12
    eye = torch.eye(n, dtype=torch.float64)
    one_back = eye + torch.diag(torch.ones(n - 1, dtype=torch.float64), -1)
    b = torch.diag(torch.full((n - 2,), 0.5, dtype=torch.float64), -2)[None, None]
    op = MixOperator(one_back[None, None], b, one_back[None, None].clone())
    d = _as_float(operator_graph(op).distances())
    np.testing.assert_array_equal(d, brute_force_distances(*_supports(op)))
    assert d[8, 0] == 4  # four B-hops of 2
    assert d[7, 0] == 4  # three B-hops and one A (or R) step
    assert d[9, 0] == 5 and d[1, 0] == 1 and d[2, 0] == 1 and d[3, 3] == 0
    assert d[11, 0] == 6  # an odd gap needs an A or R step; both at most once


# ----------------------------------------------------------------------------- the spec's facts
def test_pow2_hops_are_popcounts_and_sq1_at_most_four():
    d, first = gap_hops(get_pattern("pow2"), 4096)
    assert all(d[g] == bin(g).count("1") for g in range(4096))
    assert decomposition(first, 0b1011001) == [64, 16, 8, 1]
    d, _ = gap_hops(get_pattern("sq1"), 4096)
    assert d[1:].max() == 4 and d[1] == d[2] == 1 and d[3] == 2


@settings(max_examples=25, deadline=None)
@given(incs=st.lists(st.integers(1, 6), min_size=1, max_size=5), n=st.integers(2, 40), start=st.integers(1, 3))
def test_gap_dp_equals_brute_force_for_random_f(incs, n, start):
    dist = [start]
    for inc in incs:
        dist.append(dist[-1] + inc)
    pattern = TranslationInvariant(lambda k: dist[k], "f:test", max_levels=len(dist))
    d, first = gap_hops(pattern, n)
    a, b = _pattern_supports(pattern, n)
    bfs = brute_force_distances(a, b, None)
    assert all(_as_float(d)[g] == bfs[n - 1, n - 1 - g] for g in range(n))
    for g in range(1, n):
        if d[g] < UNREACHABLE:
            hops = decomposition(first, g)
            assert sum(hops) == g and len(hops) == d[g] and all(h in dist for h in hops)


@settings(max_examples=25, deadline=None)
@given(spec=st.sampled_from(["pow2", "sq1", "window:3", "first_order"]), n=st.integers(4, 120), data=st.data())
def test_shared_decomposition_congestion_counts_real_routes(spec, n, data):
    """Loads counted by range additions equal loads counted flow by flow; for L <= n/2 it is d(L)."""
    offset = data.draw(st.integers(1, n - 1))
    pattern = get_pattern(spec)
    d, first = gap_hops(pattern, n)
    hops = decomposition(first, offset)
    load = np.zeros(n, dtype=int)
    for j in range(n - offset):
        u = j + offset
        for s in hops:  # hop lands on u, then the flow continues from u - s
            load[u] += 1
            u -= s
        assert u == j
    got = shared_decomposition_congestion(hops, n, offset)
    assert got == (load.max() if n - offset > 0 else 0)
    if offset <= n // 2:
        assert got == d[offset]


def test_routes_are_shortest_valid_paths():
    pattern, n = get_pattern("pow2_ce"), 64
    graph = CommunicationGraph.from_pattern(pattern, n)
    d = graph.distances()
    for j, i in [(0, 63), (5, 40), (17, 18), (30, 30)]:
        path = graph.route(j, i)
        assert len(path) == d[i, j]
        nodes = path + [j]
        for u, v in zip(nodes, nodes[1:]):
            assert v in pattern.neighbors(u)
    cong, low = graph.routed_congestion(32)
    assert low <= cong


def test_table_matches_spec():
    ns = (64, 256)
    mixers = [m for m in ("attention", "local_attention") if m in ALL_MIXERS]
    records = expressivity_table(PAPER_PATTERNS, mixers, ns)
    checked = [r for r in records if "agrees" in r]
    assert {r["row"] for r in checked} >= {"first_order", "window:4", "dense", "pow2", "sq1", *mixers}
    bad = [(r["row"], r["n"], r["paper"], r.get("path_max"), r.get("congestion")) for r in checked if not r["agrees"]]
    assert not bad, bad
    by = {(r["row"], r["n"]): r for r in records}
    assert by[("pow2", 256)]["path_max"] == 8 and by[("pow2", 256)]["congestion_worst"] == 7
    assert by[("sq1", 256)]["path_max"] == 4 and by[("sq1", 256)]["congestion_worst"] <= 4
    assert by[("first_order", 256)]["path_max"] == 255 and by[("first_order", 256)]["congestion"] == 128
    assert by[("window:4", 256)]["path_max"] == 64
    assert all(r["graph_check"] for r in records if "graph_check" in r)
    # registered structured mixers are listed under the pattern row they are
    for name, spec in (("kth_order", "window:4"), ("pow2_ce", "pow2_ce"), ("first_order", "first_order")):
        if name in ALL_MIXERS:
            rows = expressivity_table((spec,), (name,), (32,))
            assert len(rows) == 1 and rows[0]["row"] == spec and rows[0]["mixers"] == [name]
    # cache-efficient lattices cost path length (§4.4: pow2 9 -> 10 hops at n = 1024 in 1-indexed terms)
    assert by[("pow2_ce", 256)]["path_max"] >= by[("pow2", 256)]["path_max"]
    assert by[("sq1_ce", 256)]["path_max"] > 4
    assert by[("pow2_ce", 256)]["cache"] == 8 and by[("sq1_ce", 256)]["cache"] == 13


def test_lattice_paths_at_1024_match_the_spec():
    assert pattern_metrics(get_pattern("pow2_ce"), 1024, 512, layers=1)["path_max"] == 10
    assert pattern_metrics(get_pattern("sq1_ce"), 1024, 512, layers=1)["path_max"] == 6


def test_reach_translation_invariant_equals_graph():
    for spec in ("pow2", "window:3", "sq1"):
        pattern, n = get_pattern(spec), 48
        d, _ = gap_hops(pattern, n)
        assert gap_reach(d, 3) == graph_reach(CommunicationGraph.from_pattern(pattern, n), 3)


def test_reach_of_a_band_grows_per_layer_and_effective_reach_sees_decay():
    n, w = 40, 5
    band = torch.tril(torch.ones(n, n, dtype=torch.float64)) - torch.tril(torch.ones(n, n, dtype=torch.float64), -w)
    op = MixOperator(band[None, None], torch.zeros(1, 1, n, n, dtype=torch.float64))
    reach = graph_reach(operator_graph(op), layers=4)
    assert reach["through_layers"] == [min(n, k * (w - 1) + 1) for k in range(1, 5)]
    gamma = 0.5  # first-order decay: |M[i, i - d]| = gamma^d, above 1e-3 of the max for d <= 9
    b = torch.diag_embed(torch.full((1, 1, n - 1), gamma, dtype=torch.float64), offset=-1)
    op = MixOperator(torch.eye(n, dtype=torch.float64).expand(1, 1, n, n).clone(), b)
    eff = effective_reach(op, layers=2, tol=1e-3)
    assert eff["per_layer"] == 10 and eff["through_layers"] == [10, 19]
    assert graph_reach(operator_graph(op), layers=1)["per_layer"] == n


def test_gap_path_stats_mean_over_pairs():
    d = np.array([0, 1, 2, 1])  # gaps 1, 2, 3 occur 3, 2, 1 times
    assert gap_path_stats(d) == (2.0, (3 * 1 + 2 * 2 + 1 * 1) / 6)


def test_run_expressivity_writes_outputs(tmp_path):
    out = run_expressivity(tmp_path, formats=("png",), patterns=("pow2", "sq1_ce"), mixers=(), ns=(16, 32))
    assert (tmp_path / "expressivity.json").is_file()
    md = (tmp_path / "expressivity.md").read_text()
    assert "| pow2 | — | 32 |" in md and "| sq1_ce | — | 16 |" in md
    for name in ("expressivity.png", "reach.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG_SIGNATURE)
    assert len(out["records"]) == 4
    with pytest.raises(ValueError, match="offset"):
        expressivity_table(("pow2",), (), (16,), offset=16)


def test_operator_rows_too_large_are_skipped(monkeypatch):
    from tokenmix.analysis import matrices

    budget = 4 * matrices.operator_bytes(small_mixer("attention", d_model=16), 16)
    monkeypatch.setattr(matrices, "MAX_OPERATOR_BYTES", budget)
    records = expressivity_table((), ("attention",), (16, 64))
    assert records[0]["path_max"] == 1 and "skipped" in records[1]["method"] and "path_max" not in records[1]
