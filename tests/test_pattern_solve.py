"""The chunked sparse triangular solve against a plain forward-substitution loop and the dense solver."""
from __future__ import annotations

import pytest
import torch

from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.ops.pattern_solve import chunked_pattern_solve
from tokenmix.patterns import get_pattern
from tolerances import FLOAT32_REL_RMS, assert_close, rel_rms


def substitution(alpha, beta, idx, x, y_prefix):
    """y_t = alpha_t x_t + sum_w beta_{t,w} y_{idx[t,w]}, one position at a time."""
    ys = list(y_prefix.unbind(1))
    for t in range(x.shape[1]):
        y = alpha[:, t, :, None] * x[:, t]
        for w, j in enumerate(idx[t].tolist()):
            if j >= 0:
                y = y + beta[:, t, :, w, None] * ys[j]
        ys.append(y)
    return torch.stack(ys[y_prefix.shape[1]:], 1)


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
    assert_close(chunked_pattern_solve(alpha, beta, tab, x, yp, chunk), substitution(alpha, beta, tab, x, yp),
                 1e-12, f"{spec} C={chunk}")


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
