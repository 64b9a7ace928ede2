"""The blocked selective scan (ops/selective_scan.py, the diagonal SSM's chunked mode), float64.

- equals ops/recurrent_gla.py under the Mamba-1 mapping (one head per channel, K = N, V = 1, q = C,
  k = B, v = x, per-key log decay Delta A): outputs, final state and the gradients of its hand-written
  backward (x, Delta, A, B, C, initial state) for block sizes 1, odd, and longer than the sequence;
- saturated decays (exp(Delta A) = e^-1e4) and decays next to 1 stay exact;
- gradcheck; bad shapes are refused.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tokenmix.ops.recurrent_gla import recurrent_gla
from tokenmix.ops.selective_scan import selective_scan
from tolerances import assert_close

DT = torch.float64


def _inputs(b=2, t=19, d=3, n=5):
    x = torch.randn(b, t, d, dtype=DT)
    delta = F.softplus(torch.randn(b, t, d, dtype=DT))
    a = -torch.rand(d, n, dtype=DT) * 2
    bs, cs = torch.randn(b, t, n, dtype=DT), torch.randn(b, t, n, dtype=DT)
    h0 = torch.randn(b, d, n, dtype=DT)
    return x, delta, a, bs, cs, h0


def _reference(x, delta, a, bs, cs, h0):
    b, t, d = x.shape
    n = a.shape[1]
    o, s = recurrent_gla(
        cs[:, :, None].expand(b, t, d, n),
        bs[:, :, None].expand(b, t, d, n),
        x[..., None],
        delta[..., None] * a,
        1.0,
        h0[..., None],
    )
    return o[..., 0], s[..., 0]


def _compare(inputs, block, what):
    leaves = [z.requires_grad_() for z in inputs]
    w_y, w_h = torch.randn(inputs[0].shape, dtype=DT), torch.randn(inputs[5].shape, dtype=DT)
    results = []
    for run in (lambda: selective_scan(*leaves[:5], leaves[5], block), lambda: _reference(*leaves)):
        y, h = run()
        grads = torch.autograd.grad((y * w_y).sum() + (h * w_h).sum(), leaves)
        results.append((y, h, grads))
    (y, h, grads), (y_ref, h_ref, grads_ref) = results
    assert_close(y, y_ref, 1e-12, f"{what} output")
    assert_close(h, h_ref, 1e-12, f"{what} final state")
    for name, gr, gr_ref in zip(["x", "delta", "A", "B", "C", "h0"], grads, grads_ref):
        assert_close(gr, gr_ref, 1e-11, f"{what} d{name}")


@pytest.mark.parametrize("block", [1, 3, 4, 64])
def test_scan_equals_recurrent_with_gradients(block):
    torch.manual_seed(0)
    _compare(_inputs(), block, f"L={block}")


def test_scan_saturated_and_unit_decays_stay_exact():
    torch.manual_seed(0)
    x, delta, a, bs, cs, h0 = _inputs(t=30)
    delta = torch.where(torch.rand_like(delta) < 0.5, torch.full_like(delta, 1e4), torch.full_like(delta, 1e-9))
    _compare((x, delta, a, bs, cs, h0), 8, "saturated")


def test_scan_gradcheck():
    torch.manual_seed(0)
    leaves = tuple(z.requires_grad_() for z in _inputs(b=1, t=6, d=2, n=3))
    assert torch.autograd.gradcheck(lambda x, dl, a, b, c, h0: selective_scan(x, dl, a, b, c, h0, 4), leaves)


def test_scan_invalid_arguments_are_refused():
    x, delta, a, bs, cs, h0 = _inputs()
    with pytest.raises(ValueError, match="block_size"):
        selective_scan(x, delta, a, bs, cs, block_size=0)
    with pytest.raises(ValueError, match="x and delta"):
        selective_scan(x, delta[:, :3], a, bs, cs)
    with pytest.raises(ValueError, match="a must be"):
        selective_scan(x, delta, a[:2], bs, cs)
    with pytest.raises(ValueError, match="b and c"):
        selective_scan(x, delta, a, bs[..., :2], cs)
    with pytest.raises(ValueError, match="initial_state"):
        selective_scan(x, delta, a, bs, cs, h0[..., :2])
