"""H-LRU's chunked mode keeps the window:m table and its plan per shape (mixers/hlru.py ``_plan``):
a chunked prefill in segments equals one dense call in float64, and the segments that start at or
after position m share one plan (the table depends on t0 only before m)."""

from __future__ import annotations

import torch

from tokenmix.mixers.registry import build_mixer


def test_segments_share_a_plan_and_equal_the_dense_solve():
    torch.manual_seed(0)
    m = build_mixer("hlru", d_model=12, n_heads=2, order=3, chunk_size=4).double()
    x = torch.randn(2, 22, 12, dtype=torch.float64)
    want, _ = m(x, mode="dense")
    ys, state, plans = [], None, []
    for a, b in ((0, 2), (2, 7), (7, 12), (12, 17), (17, 22)):  # t0 = 0, 2 (< m), then 7, 12, 17 (>= m)
        y, state = m(x[:, a:b], state, mode="chunked")
        ys.append(y)
        plans.append(m._plan(a, b - a, min(a, 3))[1])
    got = torch.cat(ys, 1)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12), float((got - want).abs().max())
    assert plans[2] is plans[3] is plans[4]  # t0 = 7, 12, 17: one table, one plan
    assert len(m._plans) <= 2
