"""The chunked sparse triangular solve against a plain forward-substitution loop and the dense solver."""

from __future__ import annotations

import pytest
import torch

from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.ops.pattern.chunked import chunked_pattern_solve
from tokenmix.patterns import get_pattern
from tolerances import FLOAT32_REL_RMS, FLOAT64_EXACT, assert_close, rel_rms


def substitution(alpha, beta, idx, x, y_prefix):
    """y_t = alpha_t x_t + sum_w beta_{t,w} y_{idx[t,w]}, one position at a time."""
    ys = list(y_prefix.unbind(1))
    for t in range(x.shape[1]):
        y = alpha[:, t, :, None] * x[:, t]
        for w, j in enumerate(idx[t].tolist()):
            if j >= 0:
                y = y + beta[:, t, :, w, None] * ys[j]
        ys.append(y)
    return torch.stack(ys[y_prefix.shape[1] :], 1)


def inputs(spec, t, p, dtype=torch.float64, b=2, h=3, v=4):
    tab = get_pattern(spec).neighbor_table(p, p + t)  # prefix = positions 0..p-1, so buffer == absolute
    alpha = torch.rand(b, t, h, dtype=dtype)
    beta = torch.randn(b, t, h, tab.shape[1], dtype=dtype) * 0.3
    x = torch.randn(b, t, h, v, dtype=dtype)
    yp = torch.randn(b, p, h, v, dtype=dtype)
    return alpha, beta, tab, x, yp


@pytest.mark.parametrize("spec", ["pow2", "sq1_ce", "dense", "fenwick", "window:2"])
@pytest.mark.parametrize("chunk", [1, 3, 8, 100])
@pytest.mark.parametrize("p", [0, 5])
def test_matches_substitution(spec, chunk, p):
    alpha, beta, tab, x, yp = inputs(spec, 19, p)
    assert_close(
        chunked_pattern_solve(alpha, beta, tab, x, yp, chunk),
        substitution(alpha, beta, tab, x, yp),
        1e-12,
        f"{spec} C={chunk}",
    )


def test_matches_dense_solver_and_float32():
    alpha, beta, tab, x, _ = inputs("sq1", 33, 0)
    b, t, h, w = beta.shape
    bmat = torch.zeros(b, h, t, t, dtype=torch.float64)
    valid = tab >= 0
    for ti in range(t):
        for wi in range(w):
            if valid[ti, wi]:
                bmat[:, :, ti, tab[ti, wi]] += beta[:, ti, :, wi]
    y_dense = solve_dense(MixOperator(torch.diag_embed(alpha.transpose(1, 2)), bmat), x)
    assert_close(chunked_pattern_solve(alpha, beta, tab, x, None, 8), y_dense, 1e-12, "vs dense")
    y32 = chunked_pattern_solve(alpha.float(), beta.float(), tab, x.float(), None, 8)
    assert rel_rms(y32.double(), y_dense) < FLOAT32_REL_RMS


@pytest.mark.parametrize("chunk", [2, 5])
def test_gradcheck(chunk):
    alpha, beta, tab, x, yp = inputs("sq1_ce", 9, 4, b=1, h=2, v=2)
    args = [a.requires_grad_() for a in (alpha, beta, x, yp)]
    assert torch.autograd.gradcheck(lambda a, b, x, yp: chunked_pattern_solve(a, b, tab, x, yp, chunk), args)


def test_bad_input():
    alpha, beta, tab, x, yp = inputs("pow2", 6, 0)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_pattern_solve(alpha, beta, tab, x, None, 0)
    bad = tab.clone()
    bad[3, 0] = 3
    with pytest.raises(ValueError, match="not strictly earlier"):
        chunked_pattern_solve(alpha, beta, bad, x, None, 2)
    with pytest.raises(ValueError, match="shape mismatch"):
        chunked_pattern_solve(alpha, beta[:, :, :, :1], tab, x, None, 2)


# ---------------------------------------------------------------- fast paths against references
from tokenmix.ops.pattern.plan import plan_pattern  # noqa: E402
from tokenmix.ops.pattern.reference import (  # noqa: E402
    pattern_scores_reference,
    recurrent_pattern_solve,
    window_softmax_reference,
)
from tokenmix.ops.pattern.scores import pattern_scores  # noqa: E402
from tokenmix.ops.pattern.window_softmax import chunked_window_softmax  # noqa: E402

SPECS = ["pow2", "sq1", "pow2_ce", "sq1_ce", "fenwick", "window:3", "first_order", "f:3**k", "dense", "random"]


def buffer_table(spec: str, t0: int, t: int, seed: int = 0) -> tuple[torch.Tensor, int]:
    """(idx [T, W] in buffer positions, P) for a segment [t0, t0 + T) after a decode cache holding
    exactly what the pattern keeps (scattered positions for the lattice, as the mixer builds it);
    ``random``: an irregular causal table (no regular runs at all)."""
    if spec == "random":
        g = torch.Generator().manual_seed(seed)
        p = t0
        idx = torch.randint(0, p + t, (t, 5), generator=g)
        idx = torch.where(idx < p + torch.arange(t)[:, None], idx, -1)
        return idx, p
    pat = get_pattern(spec)
    held = torch.tensor(pat.needed(t0), dtype=torch.long)
    tab = pat.neighbor_table(t0, t0 + t)
    slot = torch.searchsorted(held, tab.clamp(min=0))
    idx = torch.where(tab >= t0, tab - t0 + len(held), torch.where(tab >= 0, slot, -1))
    return idx, len(held)


def dense_reference(alpha, beta, idx, x, y_prefix):
    """(I - B) Y = diag(alpha) X + (reads of the prefix), B materialised, the reference solver."""
    b, t, h, w = beta.shape
    p = y_prefix.shape[1]
    inside = idx >= p
    col = torch.where(inside, idx - p, 0)
    mix_b = beta.new_zeros(b, h, t, t).scatter_add(
        -1, col[None, None].expand(b, h, t, w), (beta * inside[None, :, None, :]).transpose(1, 2)
    )
    from_prefix = (idx >= 0) & ~inside
    offset = (
        torch.einsum("bthw,btwhv->bthv", beta * from_prefix[None, :, None, :], y_prefix[:, idx.clamp(0, max(p - 1, 0))])
        if p
        else None
    )
    return solve_dense(MixOperator(torch.diag_embed(alpha.transpose(1, 2)), mix_b), x, offset=offset)


def f64(g: torch.Generator, *shape: int, uniform: bool = False) -> torch.Tensor:
    return (torch.rand if uniform else torch.randn)(*shape, dtype=torch.float64, generator=g)


def _grads(out, inputs, w):
    return torch.autograd.grad((out * w).sum(), inputs, allow_unused=True)


def _check_solve_against_dense(spec, idx, p, g, chunk, plan=None, solve=None):
    """The chunked solve (with ``plan`` if given), or ``solve(alpha, beta, idx, x, y_prefix)``, against
    the dense reference in float64: output and the gradients of alpha, beta, x and the prefix, on
    random inputs from generator g."""
    t = idx.shape[0]
    b, h, v, w = 2, 3, 4, idx.shape[1]
    # signed neighbour coefficients of row sum ~1 at most (bounded outputs, like normalised ones)
    args = [f64(g, b, t, h, uniform=True), f64(g, b, t, h, w) * 0.6 / max(1, w), f64(g, b, t, h, v), f64(g, b, p, h, v)]
    fast = [a.clone().requires_grad_() for a in args]
    ref = [a.clone().requires_grad_() for a in args]
    if solve is None:
        y = chunked_pattern_solve(fast[0], fast[1], idx, fast[2], fast[3], chunk, plan=plan)
    else:
        y = solve(fast[0], fast[1], idx, fast[2], fast[3])
    y_ref = dense_reference(ref[0], ref[1], idx, ref[2], ref[3])
    assert_close(y, y_ref, FLOAT64_EXACT, f"{spec} output")
    wy = f64(g, *y.shape)
    for name, gf, gr, a in zip(["alpha", "beta", "x", "y_prefix"], _grads(y, fast, wy), _grads(y_ref, ref, wy), args):
        gr = torch.zeros_like(a) if gr is None else gr
        assert_close(gf, gr * ((idx >= 0)[None, :, None, :] if name == "beta" else 1), FLOAT64_EXACT, f"{spec} d{name}")


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("t0,t", [(0, 1), (0, 75), (9, 130), (40, 33)], ids=["T1", "T75", "P9_T130", "P40_T33"])
@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_fast_solve_and_gradients_match_dense_reference(spec, t0, t, chunk):
    """Outputs and all gradients (alpha, beta, x, prefix) in float64, including reads of a sparse
    lattice cache, deduplicated levels, blocks of far levels and irregular tables."""
    idx, p = buffer_table(spec, t0, t)
    g = torch.Generator().manual_seed(t0 * 1000 + t)
    _check_solve_against_dense(spec, idx, p, g, chunk)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("reach", [2, 3])
def test_wide_band_matches_dense_reference(spec, reach):
    """A band reaching 2-3 chunks back (chosen automatically for sq1-like patterns at longer T):
    the reads it absorbs leave the far blocks, the solve and its gradients stay exact."""
    t0, t, chunk = 9, 130, 5
    idx, p = buffer_table(spec, t0, t)
    plan = plan_pattern(idx, p, chunk, reach)
    assert plan.reach == reach * chunk
    _check_solve_against_dense(spec, idx, p, torch.Generator().manual_seed(reach), chunk, plan)


def test_band_reach_follows_the_pattern():
    """sq1 (3 levels at distances 82, 101, 122 in (C, 2C] for C = 64) widens the band, pow2 (one
    level, 128) does not; an explicit reach below one chunk is refused."""
    reach = {spec: plan_pattern(*buffer_table(spec, 0, 1024), 64).reach for spec in ["sq1", "sq1_ce", "pow2"]}
    assert reach["sq1"] >= 128 and reach["sq1_ce"] >= 128 and reach["pow2"] == 64
    with pytest.raises(ValueError, match="reach"):
        plan_pattern(*buffer_table("pow2", 0, 10), 4, 0)


def test_recurrent_reference_matches_dense_reference():
    idx, p = buffer_table("sq1_ce", 30, 25)
    g = torch.Generator().manual_seed(3)
    alpha, beta = f64(g, 1, 25, 2, uniform=True), f64(g, 1, 25, 2, idx.shape[1])
    x, yp = f64(g, 1, 25, 2, 3), f64(g, 1, p, 2, 3)
    assert_close(
        recurrent_pattern_solve(alpha, beta, idx, x, yp), dense_reference(alpha, beta, idx, x, yp), 1e-12, "references"
    )


@pytest.mark.parametrize("spec", ["pow2", "sq1", "pow2_ce", "sq1_ce", "fenwick", "dense", "window:9"])
def test_plan_covers_regular_patterns_without_gathers(spec):
    """The speed premise: every read of these patterns is a shift or lattice staircase, so nothing
    is gathered -- and with a lattice cache only the reads of the cache are."""
    n = 2000 if spec != "dense" else 300
    idx, p = buffer_table(spec, 0, n)
    plan = plan_pattern(idx, p, 64)
    assert len(plan.left[0]) == 0, f"{spec}: {len(plan.left[0])} irregular entries"
    idx, p = buffer_table(spec, 777, 500)
    plan = plan_pattern(idx, p, 64)
    assert (plan.left_keys < p).all(), "only reads of the cache may be irregular"


def test_plan_must_match_its_table():
    idx, p = buffer_table("pow2", 0, 20)
    alpha, beta = torch.rand(1, 20, 1, dtype=torch.float64), torch.rand(1, 20, 1, idx.shape[1], dtype=torch.float64)
    x = torch.randn(1, 20, 1, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="plan for"):
        chunked_pattern_solve(alpha, beta, idx, x, None, 4, plan=plan_pattern(idx, 0, 8))
    with pytest.raises(ValueError, match="not strictly earlier"):
        plan_pattern(torch.full((3, 1), 5), 0, 4)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("t0,t", [(0, 1), (0, 90), (13, 47)], ids=["T1", "T90", "P13_T47"])
def test_pattern_scores_and_gradients_match_gathered_reference(spec, t0, t):
    idx, p = buffer_table(spec, t0, t)
    g = torch.Generator().manual_seed(t)
    q, kbuf = f64(g, 2, t, 3, 5), f64(g, 2, p + t, 3, 5)
    fast = [q.clone().requires_grad_(), kbuf.clone().requires_grad_()]
    ref = [q.clone().requires_grad_(), kbuf.clone().requires_grad_()]
    s, s_ref = pattern_scores(fast[0], fast[1], idx), pattern_scores_reference(ref[0], ref[1], idx)
    assert_close(s, s_ref, FLOAT64_EXACT, f"{spec} scores")
    ws = f64(g, *s.shape)
    for name, gf, gr in zip(["q", "k"], _grads(s, fast, ws), _grads(s_ref, ref, ws)):
        assert_close(gf, gr, FLOAT64_EXACT, f"{spec} d{name}")


@pytest.mark.parametrize(
    "p,t,window,chunk",
    [(0, 1, 5, 4), (0, 50, 49, 8), (0, 50, 1000, 7), (11, 40, 12, 16), (11, 40, 3, 1), (6, 70, 6, 64)],
)
def test_window_softmax_matches_reference(p, t, window, chunk):
    """The matmul path for window/dense patterns: outputs and gradients of q, k (prefix
    included), x and the prefix outputs."""
    g = torch.Generator().manual_seed(p + t + window)
    args = [f64(g, 2, t, 3, 5), f64(g, 2, p + t, 3, 5), f64(g, 2, t, 3, 4), f64(g, 2, p, 3, 4)]
    fast = [a.clone().requires_grad_() for a in args]
    ref = [a.clone().requires_grad_() for a in args]
    y = chunked_window_softmax(*fast, window, chunk)
    y_ref = window_softmax_reference(*ref, window)
    assert_close(y, y_ref, FLOAT64_EXACT, "output")
    wy = f64(g, *y.shape)
    for name, gf, gr, a in zip(["q", "k", "x", "y_prefix"], _grads(y, fast, wy), _grads(y_ref, ref, wy), args):
        assert_close(gf, torch.zeros_like(a) if gr is None else gr, FLOAT64_EXACT, f"d{name}")


def test_window_softmax_gradcheck_and_bad_input():
    args = [torch.randn(1, 7, 2, 3, dtype=torch.float64, requires_grad=True) for _ in range(1)]
    kbuf = torch.randn(1, 10, 2, 3, dtype=torch.float64, requires_grad=True)
    x = torch.randn(1, 7, 2, 2, dtype=torch.float64, requires_grad=True)
    yp = torch.randn(1, 3, 2, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, x, yp: chunked_window_softmax(q, k, x, yp, 4, 3), (args[0], kbuf, x, yp)
    )
    with pytest.raises(ValueError, match="window"):
        chunked_window_softmax(args[0], kbuf, x, yp, 0, 3)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_window_softmax(args[0], kbuf, x, yp, 4, 0)
    with pytest.raises(ValueError, match="shape mismatch"):
        chunked_window_softmax(args[0], kbuf[:, 1:], x, yp, 4, 3)


@pytest.mark.parametrize("spec,chunk", [("pow2", 3), ("pow2_ce", 2), ("fenwick", 4)])
def test_gradcheck_far_blocks(spec, chunk):
    """gradcheck through the blocked far levels (T = 20 spans several block sizes of C = 2..4)."""
    idx, p = buffer_table(spec, 6, 20)
    g = torch.Generator().manual_seed(1)
    args = [
        f64(g, 1, 20, 1, uniform=True),
        f64(g, 1, 20, 1, idx.shape[1]) * 0.3,
        f64(g, 1, 20, 1, 2),
        f64(g, 1, p, 1, 2),
    ]
    args = [a.requires_grad_() for a in args]
    assert torch.autograd.gradcheck(lambda a, b, x, yp: chunked_pattern_solve(a, b, idx, x, yp, chunk), args)
