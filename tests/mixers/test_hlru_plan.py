"""H-LRU's chunked mode keeps the window:m table and its plan per shape (mixers/hlru.py ``_plan``):
a chunked prefill in segments equals one dense call in float64, and the segments that start at or
after position m share one plan (the table depends on t0 only before m)."""

from __future__ import annotations

import torch

from tokenmix.mixers import hlru
from tokenmix.mixers.registry import build_mixer


def test_segments_share_a_plan_and_equal_the_dense_solve(monkeypatch):
    torch.manual_seed(0)
    m = build_mixer("hlru", d_model=12, n_heads=2, order=3, chunk_size=4).double()
    x = torch.randn(2, 22, 12, dtype=torch.float64)
    want, _ = m(x, mode="dense")
    built = []
    plan_pattern = hlru.plan_pattern
    monkeypatch.setattr(hlru, "plan_pattern", lambda idx, p, c: built.append((len(idx), p)) or plan_pattern(idx, p, c))
    ys, state = [], None
    for a, b in ((0, 2), (2, 7), (7, 12), (12, 17), (17, 22)):  # t0 = 0, 2 (< m), then 7, 12, 17 (>= m)
        y, state = m(x[:, a:b], state, mode="chunked")
        ys.append(y)
    got = torch.cat(ys, 1)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12), float((got - want).abs().max())
    # t0 = 0 and 2 each plan their own table; 7, 12, 17 (five positions, m cached) plan one, once
    assert built == [(2, 0), (5, 2), (5, 3)]
    assert len(m._plans) <= 2
