"""Long float32 sequences with extreme parameters: forward + backward of each fast mode stays finite.

16k tokens (B = 1, H = 2, head dim 16) for attention, local attention, ChaCAL and H-LRU. ChaCAL's
chunked mode is O(T^2) work (its backward recomputes each chunk's T / 2 softmax columns on average
from their log-sum-exp), a few seconds per run at 16k.

Every mixer here mixes with convex weights (softmax attention rows, ChaCAL's path sums, softmax
H-LRU gates), so besides finiteness the mixed outputs must stay within the range of the values.
"""

from __future__ import annotations

import pytest
import torch

from tokenmix.mixers.registry import build_mixer

pytestmark = pytest.mark.slow

H, K = 2, 16


def _identity_readout(m) -> None:
    with torch.no_grad():
        m.out.weight.copy_(torch.eye(m.out.weight.shape[0]))


def _forward_backward(m, t: int):
    x = torch.randn(1, t, m.d_model, requires_grad=True)
    y, state = m(x)
    (y.square().mean() + sum(s.square().mean() for s in state.tensors().values())).backward()
    assert torch.isfinite(y).all(), "non-finite output"
    assert torch.isfinite(x.grad).all(), "non-finite input gradient"
    for name, p in m.named_parameters():
        assert torch.isfinite(p.grad).all(), f"non-finite gradient of {name}"
    return x.detach(), y.detach(), state


def _value_bound(m, x) -> float:
    with torch.no_grad():
        return m.values(x).abs().max().item()


@pytest.mark.parametrize("name,kw", [("attention", {}), ("local_attention", {"window": 128})])
def test_attention_16k_saturated_scores(name, kw):
    torch.manual_seed(0)
    m = build_mixer(name, H * K, n_heads=H, **kw)
    _identity_readout(m)
    with torch.no_grad():
        m.qkv.weight.mul_(30.0)  # logits in the hundreds: one-hot softmax rows
    x, y, _ = _forward_backward(m, 16384)
    assert y.abs().max().item() <= _value_bound(m, x) * (1 + 1e-5)


@pytest.mark.parametrize("gamma", [1e-6, 0.999])
def test_chacal_16k_extreme_gamma(gamma):
    torch.manual_seed(0)
    m = build_mixer("chacal", H * K, n_heads=H, gamma=gamma)
    _identity_readout(m)
    with torch.no_grad():
        m.qkv.weight.mul_(30.0)  # p_ii near 1 on many rows: 1 / (1 - gamma p_ii) near 1 / (1 - gamma)
    x, y, _ = _forward_backward(m, 16384)
    assert y.abs().max().item() <= _value_bound(m, x) * (1 + 1e-4)


@pytest.mark.parametrize("normalization", ["softmax", "l1"])
def test_hlru_16k_saturated_gates(normalization):
    # gate logits in the tens: one-hot (softmax) or +-1 (tanh) gates, biased towards lag 1, so the
    # state is mostly carried (z_t = z_{t-1}) over long stretches where the gradient does not decay
    torch.manual_seed(0)
    m = build_mixer("hlru", H * K, n_heads=H, order=4, normalization=normalization)
    with torch.no_grad():
        m.gates.weight.mul_(50.0)
        m.gates.bias.zero_()
        m.gates.bias.view(5, -1)[0] = 40.0  # gate rows are slot-major; slot 0 = lag 1
    x, _, state = _forward_backward(m, 16384)
    assert state.outputs.abs().max().item() <= _value_bound(m, x) * (1 + 1e-5)
