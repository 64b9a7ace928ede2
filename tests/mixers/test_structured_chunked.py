"""The structured mixer's fast chunked paths on sequences long enough to use them.

The generic matrix (test_mixer_matrix.py) runs every mode at T <= 13; here T spans several far
blocks (reads at distance > C), the matmul window path of the dense pattern, and continuation
from a cache (a sparse lattice cache, a window cache), in float64 against the recurrent reference,
on each CPU backend of the chunked mode (torch's slice kernels and numba's sweeps).
"""

from __future__ import annotations

import pytest
import torch

from tokenmix.checks.common import run_in_pieces
from tokenmix.mixers import build_mixer
from tolerances import FLOAT64_EXACT, assert_close

STRUCTURED = ["pow2", "sq1", "pow2_ce", "sq1_ce", "kth_order", "first_order", "dense_recurrence"]


def mixer(name: str, chunk: int = 8, **kw):
    torch.manual_seed(0)
    return build_mixer(name, 12, n_heads=2, chunk_size=chunk, **kw).double()


def grads(m, x0, mode, sizes, w):
    m.zero_grad()
    x = x0.clone().requires_grad_()
    y, state = run_in_pieces(m, x, mode, sizes)
    ((y * w).sum() + sum((t * 0.3).sum() for t in state.tensors().values())).backward()
    return y.detach(), state, [x.grad] + [p.grad.clone() for p in m.parameters()]


@pytest.mark.parametrize("backend", ["torch", "numba"])
@pytest.mark.parametrize("name", STRUCTURED)
@pytest.mark.parametrize("sizes", [[150], [37, 80, 1, 32]], ids=["whole", "pieces"])
def test_chunked_matches_recurrent_long(name, sizes, backend):
    """Outputs, final cache and every gradient; pieces continue from the cache (chunked mode
    on top of a lattice / window / full cache)."""
    m = mixer(name, backend=backend)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, sum(sizes), 12, dtype=torch.float64, generator=g)
    w = torch.randn(2, sum(sizes), 12, dtype=torch.float64, generator=g)
    y_c, s_c, g_c = grads(m, x, "chunked", sizes, w)
    y_r, s_r, g_r = grads(m, x, "recurrent", [sum(sizes)], w)
    assert_close(y_c, y_r, FLOAT64_EXACT, f"{name} output")
    assert s_c.positions.tolist() == s_r.positions.tolist()
    for k in s_r.tensors():
        assert_close(s_c.tensors()[k], s_r.tensors()[k], FLOAT64_EXACT, f"{name} state {k}")
    pnames = ["x"] + [n for n, _ in m.named_parameters()]
    for pn, a, b in zip(pnames, g_c, g_r):
        assert_close(a, b, FLOAT64_EXACT * 10, f"{name} d{pn}")


@pytest.mark.parametrize("pattern", ["window:20", "dense", "f:k+1"])
def test_window_patterns_take_the_matmul_path_and_agree_with_dense(pattern):
    """Contiguous-window patterns at least a chunk wide use chunked_window_softmax; same result
    as the dense mode, also continuing from a cache."""
    m = mixer("dense_recurrence", chunk=8, pattern=pattern)
    assert m._window(60) is not None
    x = torch.randn(1, 60, 12, dtype=torch.float64)
    y_d, s_d = m(x, mode="dense")
    y_c, s_c = run_in_pieces(m, x, "chunked", [23, 37])
    assert_close(y_c, y_d, FLOAT64_EXACT, f"{pattern} chunked vs dense")
    assert_close(s_c.values, s_d.values, FLOAT64_EXACT, f"{pattern} cache")


def test_gate_coefficients_long():
    m = mixer("pow2", coefficients="gate_softmax", max_levels=8)
    x = torch.randn(1, 140, 12, dtype=torch.float64)
    y_c, _ = run_in_pieces(m, x, "chunked", [100, 40])
    y_r, _ = m(x, mode="recurrent")
    assert_close(y_c, y_r, FLOAT64_EXACT, "gate_softmax")


def test_index_plan_is_reused_only_for_the_same_segment():
    m = mixer("sq1_ce")
    x = torch.randn(1, 50, 12, dtype=torch.float64)
    _, s1 = m(x[:, :30])
    idx_a, plan_a = m._table(s1, 20, x.device)
    idx_b, plan_b = m._table(s1, 20, x.device)
    assert plan_a.get() is plan_b.get()  # a training loop builds the plan once per length
    _, s2 = m(x[:, :31])
    assert m._table(s2, 20, x.device)[1].get() is not plan_a.get()  # another start, another table
    fresh = mixer("sq1_ce")
    assert torch.equal(fresh._table(s1, 20, x.device)[0], idx_a)
