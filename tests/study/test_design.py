"""``tokenmix design``: the front against brute force, the derived numbers against the pattern facts and
measurements, the space (families, user f:EXPR, merging), budgets, bad input and a tiny --train."""

from __future__ import annotations

import csv
import json
import math
import random
from collections import deque
from fractions import Fraction

import pytest
import torch

from lm_helpers import one_line_error, run_cli
from tokenmix.analysis.accounting_measured import measure_decode_cache
from tokenmix.analysis.design import DesignRequest, explore, pareto_front
from tokenmix.analysis.design_space import DesignSpace, geom_candidate, mix_candidate, poly_candidate
from tokenmix.analysis.expressivity import CommunicationGraph, graph_reach, hop_profile, pattern_metrics
from tokenmix.mixers.registry import build_mixer
from tokenmix.patterns import get_pattern, shortest_paths

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = DesignSpace(
    bases=(Fraction(3, 2), Fraction(5, 2), Fraction(3)),
    powers=(2, 3),
    mix_windows=(2, 4),
    mix_bases=(Fraction(2), Fraction(3)),
    windows=(4, 8),
)


# ----------------------------------------------------------------------------- independent brute force
def bfs_max_path(pattern, n: int) -> float:
    """Largest fewest-hops distance over pairs j < t by plain BFS over the neighbour lists."""
    nbrs = [pattern.neighbors(t) for t in range(n)]
    worst = 0
    for t in range(n):
        seen = {t: 0}
        queue = deque([t])
        while queue:
            u = queue.popleft()
            for j in nbrs[u]:
                if j not in seen:
                    seen[j] = seen[u] + 1
                    queue.append(j)
        if len(seen) < t + 1:
            return math.inf
        worst = max(worst, max(seen.values()))
    return float(worst)


def brute_cache(pattern, n: int) -> int:
    """Peak over t of |{j < t read by some t' >= t}|: the decode cache from its definition."""
    nbrs = [set(pattern.neighbors(t)) for t in range(n)]
    return max(len({j for tp in range(t, n) for j in nbrs[tp] if j < t}) for t in range(n))


def dominated(p, q) -> bool:
    """q dominates p (every coordinate minimised)."""
    return all(b <= a for a, b in zip(p, q)) and tuple(p) != tuple(q)


# ----------------------------------------------------------------------------- the front
def test_front_is_the_brute_force_non_dominated_set():
    n = 48
    res = explore(DesignRequest(n=n, max_cache=12, space=SMALL, route_front=False))
    inside = [r for r in res.rows if r.in_budget]
    # recompute each candidate's (cost, cache, max path) from the definitions, not from the module
    points = {}
    for r in inside:
        pat = r.candidate.pattern()
        points[r.name] = (len(pat.neighbors(n - 1)), brute_cache(pat, n), bfs_max_path(pat, n))
        assert points[r.name] == (r.cost, r.cache, r.path_max), r.name
    expected = {a for a, p in points.items() if not any(dominated(p, q) for b, q in points.items() if b != a)}
    assert {r.name for r in res.front} == expected
    assert len(expected) >= 4 and len(expected) < len(inside)  # a front with dominated points beside it


def test_pareto_front_matches_all_pairs_on_random_points():
    rng = random.Random(0)
    for _ in range(200):
        pts = [tuple(rng.choice((1, 2, 3, 4, math.inf)) for _ in range(3)) for _ in range(rng.randint(1, 15))]
        naive = [i for i, p in enumerate(pts) if not any(dominated(p, q) for q in pts)]
        assert pareto_front(pts) == naive


# ----------------------------------------------------------------------------- derived = facts = measured
@pytest.mark.parametrize("n", [33, 128])
def test_named_rows_equal_the_pattern_facts(n):
    res = explore(DesignRequest(n=n, space=DesignSpace(families=(), windows=(4,)), route_front=False))
    offset = n // 2
    for name in ("pow2", "sq1", "pow2_ce", "sq1_ce", "fenwick", "first_order", "window:4", "dense"):
        row, pat = res.row(name), get_pattern(name)
        assert row.cost == pat.neighbors_per_token(n)
        assert row.cache == max(len(pat.needed(t)) for t in range(n))  # the definition, not cache_size
        mx, mean = shortest_paths(pat, n)  # the graph distances (patterns/graph.py)
        assert row.path_max == mx and row.path_mean == pytest.approx(mean, abs=1e-12)
        graph = CommunicationGraph.from_pattern(pat, n)
        routed, lower = graph.routed_congestion(offset)
        assert row.congestion_lower == lower, name
        assert row.reach_hops == graph_reach(graph, 4, max_hops=4)["within_hops"][3]
        if name in ("pow2", "sq1", "first_order", "window:4", "dense"):  # shared decomposition, exact
            assert row.congestion == pattern_metrics(pat, n, offset, 4)["congestion"]


@pytest.mark.parametrize("name", ["pow2_ce", "sq1_ce", "fenwick", "geom:1.5_ce", "mix:4+3_ce", "poly:3", "geom:3"])
def test_derived_cache_equals_a_measured_decode(name):
    """The cache of the table is derived (cache_size); decoding with the mixer measures it."""
    n = 40
    res = explore(
        DesignRequest(
            n=n, space=SMALL if name != "geom:1.5_ce" else DesignSpace(bases=(Fraction(3, 2),)), route_front=False
        )
    )
    row = res.row(name)
    c = row.candidate
    torch.manual_seed(0)
    mixer = build_mixer("pow2", 8, n_heads=1, pattern=c.spec, cache_efficient=c.cache_efficient).eval()
    assert measure_decode_cache(mixer, n)["peak_positions"] == row.cache
    assert row.cost == len(c.pattern().neighbors(n - 1))


@pytest.mark.parametrize("spec", ["pow2_ce", "sq1_ce", "fenwick", "pow2", "f:3**k_ce", "f:2*k+2"])
@pytest.mark.parametrize("n", [2, 5, 31, 90])
def test_hop_profile_equals_the_graph_distances(spec, n):
    pat = get_pattern(spec)
    prof = hop_profile(pat, n, offset=max(1, n // 3))
    mx, mean = shortest_paths(pat, n)
    got = prof.path_stats()
    assert got[0] == mx and (got[1] == mean or got[1] == pytest.approx(mean, abs=1e-12))
    graph = CommunicationGraph.from_pattern(pat, n)
    assert prof.reach(3, max_hops=5) == graph_reach(graph, 3, max_hops=5)
    if math.isfinite(mx):
        assert prof.congestion_lower() == graph.routed_congestion(max(1, n // 3))[1]


def test_cache_size_vectorised_equals_the_definition():
    for spec in ("pow2_ce", "sq1_ce", "fenwick", "f:3**k_ce"):
        pat = get_pattern(spec)
        for n in (1, 2, 3, 17, 64):
            assert pat.cache_size(n) == max((len(pat.needed(t)) for t in range(n)), default=0)


# ----------------------------------------------------------------------------- the space
def test_family_members_are_their_formulas():
    k = range(12)
    g = geom_candidate(Fraction(3, 2)).pattern()
    assert g.distances(10**6)[:12] == [math.ceil(Fraction(3, 2) ** i) for i in k]
    assert poly_candidate(3).pattern().distances(10**6)[:12] == [i**3 + 1 for i in k]
    assert mix_candidate(4, Fraction(2)).pattern().distances(10**6)[:8] == [1, 2, 3, 4, 8, 16, 32, 64]
    assert mix_candidate(2, Fraction(5, 2)).pattern().distances(10**6)[:5] == [1, 2, 5, 13, 32]  # ceil(2*2.5^j)
    # the lattice exists for every family member (f(0) = 1, unbounded)
    for c in (geom_candidate(Fraction(7, 4)), poly_candidate(4), mix_candidate(8, Fraction(3))):
        assert get_pattern(c.spec, True).name.endswith("_ce")


def test_same_patterns_are_merged_under_the_named_one():
    res = explore(
        DesignRequest(
            n=256,
            space=DesignSpace(
                bases=(Fraction(2),), powers=(2,), mix_windows=(2,), mix_bases=(Fraction(2),), patterns=("f:2**k",)
            ),
        )
    )
    assert set(res.row("pow2").same_as) == {"geom:2", "mix:2+2", "f:2**k"}
    assert set(res.row("pow2_ce").same_as) == {"geom:2_ce", "mix:2+2_ce", "f:2**k_ce"}
    assert res.row("sq1").same_as == ["poly:2"]
    assert len({r.name for r in res.rows}) == len(res.rows)


def test_user_pattern_joins_the_space_and_the_outputs(tmp_path, capsys):
    out = tmp_path / "d"
    rc, stdout, _ = run_cli(
        [
            "design",
            "--n",
            "256",
            "--families",
            "none",
            "--pattern",
            "f:5**k",
            "--pattern",
            "f:k**3+2",
            "--out",
            str(out),
            "--quiet",
            "--no-routing",
            "--formats",
            "png",
        ],
        capsys,
    )
    assert rc == 0
    data = json.loads((out / "design.json").read_text())
    rows = {r["pattern"]: r for r in data["rows"]}
    assert rows["f:5**k"]["family"] == "user" and rows["f:5**k"]["path_max"] is not None
    assert rows["f:5**k_ce"]["variant"] == "lattice"  # f(0) = 1: its lattice joins too
    assert "f:k**3+2_ce" not in rows and rows["f:k**3+2"]["cost"] == 7  # f(0) = 2: no lattice; k = 0..6
    assert "f:5**k_ce" in data["front"]  # cost 4 and cache 4: nothing beats it
    with open(out / "design.csv") as fh:
        assert {"f:5**k", "f:5**k_ce", "f:k**3+2"} <= {r["pattern"] for r in csv.DictReader(fh)}
    assert "f:5**k_ce" in stdout and (out / "design_front.png").stat().st_size > 0


def test_budgets_exclude_exactly():
    res = explore(DesignRequest(n=100, max_cost=6, max_cache=7, space=SMALL, route_front=False))
    for r in res.rows:
        assert r.in_budget == (r.cost <= 6 and r.cache <= 7), r.name
        assert (r.path_max is None) == (not r.in_budget)
    assert all(r.in_budget for r in res.front)
    unbounded = explore(DesignRequest(n=100, space=SMALL, route_front=False))
    assert (
        len([r for r in unbounded.rows if r.in_budget])
        == len(unbounded.rows)
        > len([r for r in res.rows if r.in_budget])
    )
    # a budget only removes points: a front member within the tighter budget stays on its front
    kept = {r.name for r in unbounded.front if r.cost <= 6 and r.cache <= 7}
    assert kept <= {r.name for r in res.front}


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "args, words",
    [
        (["--families", "geom,spiral"], ["unknown pattern family 'spiral'"]),
        (["--max-cache", "0"], ["no candidate fits", "first_order"]),
        (["--max-cost", "0", "--max-cache", "100"], ["no candidate fits"]),
        (["--n", "1"], ["--n", ">= 2"]),
        (["--n", "100000"], ["--n", "too large"]),
        (["--pattern", "f:k**"], ["invalid pattern function"]),
        (["--pattern", "f:3-k"], ["strictly increasing"]),
        (["--pattern", "spiral"], ["unknown pattern 'spiral'"]),
        (["--bases", "1.25"], ["geom:1.25", "strictly increasing"]),
        (["--bases", "0.5"], ["base must be a number > 1"]),
        (["--bases", "1:x:1"], ["--bases", "not a number"]),
        (["--powers", "2.5"], ["--powers", "not an integer"]),
        (["--layers", "0"], ["--layers"]),
        (["--train", "nosuch"], ["unknown task 'nosuch'"]),
        (["--formats", "gif"], ["format"]),
    ],
)
def test_bad_input_is_one_line_exit_2(args, words, tmp_path, capsys):
    one_line_error(run_cli(["design", "--n", "64", "--out", str(tmp_path / "o"), "--quiet", *args], capsys), *words)


# ----------------------------------------------------------------------------- --train
def test_tiny_train_adds_an_accuracy_column_and_resumes(tmp_path, capsys):
    args = [
        "design",
        "--n",
        "32",
        "--max-cache",
        "5",
        "--train",
        "copy",
        "--top",
        "1",
        "--steps",
        "3",
        "--out",
        str(tmp_path / "t"),
        "--quiet",
        "--no-plots",
    ]
    rc, stdout, _ = run_cli(args, capsys)
    assert rc == 0 and "copy acc %" in stdout and "trained 1 runs (0 finished before)" in stdout
    data = json.loads((tmp_path / "t" / "design.json").read_text())
    trained = [r for r in data["rows"] if r["accuracy"] is not None]
    assert len(trained) == 1 and 0.0 <= trained[0]["accuracy"] <= 1.0 and trained[0]["on_front"]
    assert data["training"]["candidates"] == [trained[0]["pattern"]]
    # the best by max path, then cost, among the front
    front = [r for r in data["rows"] if r["on_front"]]
    best = min(front, key=lambda r: (r["path_max"], r["cost"], r["cache"], r["pattern"]))
    assert trained[0]["pattern"] == best["pattern"]
    rc, stdout, _ = run_cli(args, capsys)  # resumable: the finished run is skipped
    assert rc == 0 and "trained 0 runs (1 finished before)" in stdout


def test_train_mqar_ranks_candidates_by_their_recall_ceiling_first(tmp_path, capsys):
    """``--train mqar`` (assoc_recall) computes each candidate's ceiling on the run's own validation
    queries behind quick's token shift and trains the highest first; the table shows it."""
    from tokenmix.analysis.design import DesignRequest, explore
    from tokenmix.study.design import DesignTraining, attach_recall_ceilings, pick_top, run_config
    from tokenmix.study.theory import binding_window, pattern_recall_reads
    from tokenmix.training.synthetic import dataset

    result = explore(DesignRequest(n=64, max_cache=6))
    training = DesignTraining(task="mqar", top=3)
    assert training.task == "assoc_recall"
    attach_recall_ceilings(result, training)
    picked = pick_top(result, 3)
    ceilings = [(r.reads_one_hop, r.reads_two_hops) for r in picked]
    front = [c for r, c in zip(picked, ceilings) if r.on_front]
    assert front == sorted(front, reverse=True) and all(0 <= a <= b <= 1 for a, b in ceilings)
    # the ceiling is the frontier's RecallReads of the candidate's pattern on those queries
    cfg = run_config(picked[0], training, 0)
    data = dataset(cfg.task_config(), cfg.train.val_examples, cfg.train.val_seed)
    ref = pattern_recall_reads(
        "x",
        picked[0].candidate.pattern(),
        data,
        cfg.task_config().num_kv_pairs,
        binding_window(cfg.model_config(), "pow2"),
    )
    assert (ref.fraction, ref.two_hop_fraction) == ceilings[0]
    # front members come first (the question is whether the front learns), each group by its ceiling
    assert [r.on_front for r in picked] == sorted((r.on_front for r in picked), reverse=True)
    rest = [r for r in result.rows if r.on_front and r not in picked]
    assert all(picked[-1].on_front is False or (r.reads_one_hop, r.reads_two_hops) <= ceilings[-1] for r in rest)
    args = [
        "design",
        "--n",
        "32",
        "--max-cache",
        "5",
        "--train",
        "mqar",
        "--top",
        "1",
        "--steps",
        "2",
        "--out",
        str(tmp_path / "m"),
        "--quiet",
        "--no-plots",
    ]
    rc, stdout, _ = run_cli(args, capsys)
    assert rc == 0 and "reads 1 / 2 hops %" in stdout and "assoc_recall acc %" in stdout


def _annotation_boxes(fig):
    """Display-space boxes of every annotation (point label) of every axes of ``fig``."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [[t.get_window_extent(renderer) for t in ax.texts] for ax in fig.axes]


def test_design_front_labels_never_overlap(tmp_path, monkeypatch):
    """design_front.png names the front and the named patterns where no other name is (labels used
    to overlap along the cost ~ cache diagonal)."""
    from tokenmix.analysis import design as D

    figures = []
    monkeypatch.setattr(D, "save_figure", lambda fig, out, stem, formats=(): figures.append(fig) or [])
    result = D.explore(D.DesignRequest(n=256, max_cache=24))
    D.plot_front(result, tmp_path)
    (fig,) = figures
    boxes = _annotation_boxes(fig)
    assert sum(map(len, boxes)) >= 8  # the front and the named patterns are named
    for ax_boxes in boxes:
        for i, a in enumerate(ax_boxes):
            for b in ax_boxes[i + 1 :]:
                inter = a.intersection(a, b)
                assert inter is None or inter.width * inter.height < 1e-6, "two labels overlap"
