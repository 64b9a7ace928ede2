"""The compiled causal depthwise convolution (ops/causal_conv.py) against its reference (torch's
depthwise convolution) and against the definition written as a loop: outputs, every gradient
(the segment's inputs, the cached inputs, the taps) in float64, and gradcheck through both."""

from __future__ import annotations

import pytest
import torch

from tokenmix.ops import numba_runtime
from tokenmix.ops.causal_conv import causal_conv, causal_conv_reference
from tolerances import FLOAT64_EXACT, assert_close

pytestmark = pytest.mark.skipif(not numba_runtime.kernel_available(), reason="numba not importable")


def loop(u, cached, w):
    buf = torch.cat([cached, u], 1)
    p, k = cached.shape[1], w.shape[1]
    v = torch.zeros_like(u)
    for t in range(u.shape[1]):
        for j in range(k):
            if p + t - j >= 0:
                v[:, t] += w[:, j] * buf[:, p + t - j]
    return v


@pytest.mark.parametrize("k", [1, 2, 4, 5])
@pytest.mark.parametrize("p,t", [(0, 1), (0, 13), (3, 9), (2, 1), (6, 4)])
def test_compiled_conv_and_gradients_match_the_reference_and_the_loop(k, p, t):
    g = torch.Generator().manual_seed(31 * k + 7 * p + t)
    u, cached = (
        torch.randn(3, t, 5, generator=g, dtype=torch.float64),
        torch.randn(3, p, 5, generator=g, dtype=torch.float64),
    )
    w = torch.randn(5, k, generator=g, dtype=torch.float64)
    gv = torch.randn(3, t, 5, generator=g, dtype=torch.float64)
    outs = {}
    for name, fn in (("compiled", causal_conv), ("reference", causal_conv_reference), ("loop", loop)):
        leaves = [z.clone().requires_grad_() for z in (u, cached, w)]
        v = fn(*leaves)
        v.backward(gv)
        outs[name] = (v.detach(), *(z.grad if z.grad is not None else torch.zeros_like(z) for z in leaves))
    for name in ("reference", "loop"):
        for got, ref, what in zip(outs["compiled"], outs[name], ("v", "du", "dcached", "dw")):
            assert_close(got, ref, FLOAT64_EXACT, f"{what} vs {name} (k={k}, P={p}, T={t})")


def test_compiled_conv_gradcheck_and_float32():
    g = torch.Generator().manual_seed(0)
    leaves = [
        torch.randn(2, 7, 3, generator=g, dtype=torch.float64, requires_grad=True),
        torch.randn(2, 3, 3, generator=g, dtype=torch.float64, requires_grad=True),
        torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True),
    ]
    assert torch.autograd.gradcheck(causal_conv, leaves)
    u, cached, w = (z.detach().float() for z in leaves)
    assert_close(causal_conv(u, cached, w).double(), causal_conv_reference(*leaves).detach(), 1e-5, "float32")


def test_fallback_and_bad_shapes(monkeypatch):
    u, w = torch.randn(2, 5, 3), torch.randn(3, 4)
    empty = u.new_zeros(2, 0, 3)
    monkeypatch.setattr(numba_runtime, "ENABLED", False)
    assert torch.equal(causal_conv(u, empty, w), causal_conv_reference(u, empty, w))
    with pytest.raises(ValueError, match="shape mismatch"):
        causal_conv(u, empty, torch.randn(4, 4))
