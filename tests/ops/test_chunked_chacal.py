"""ChaCAL's chunked op (ops/chunked_chacal.py) against the explicit formula, float64, with saturated scores.

The generic matrix (test_mixer_matrix.py) covers the mixer's modes at ordinary scores. Here the op
itself, after a cached prefix, with scores in the thousands so that most softmax entries underflow
(the op clamps exponents just above the smallest normal float, where the CPU exp is slow, and zeroes
the chunk's future after the exp):
- outputs and gradients (q, keys, values, cached outputs, gamma) equal autograd through
  Y = (I - gamma P)^{-1} ((1 - gamma) P V_new + gamma P_prefix Y_prefix + (1 - gamma) P_prefix V_prefix),
  i.e. y_i = sum_{j <= i} p_ij ((1 - gamma) v_j + gamma y_j), solved densely;
- causality is exact: changing a later value leaves every earlier output bit-identical.
"""

from __future__ import annotations

import pytest
import torch

from tokenmix.ops.chunked_chacal import chunked_chacal
from tolerances import assert_close

DT = torch.float64


def _dense(q, keys, values, y_prefix, gamma):
    """y of the T new positions from the dense (P + T) x (P + T) system, prefix outputs given."""
    b, h, t, _ = q.shape
    p = y_prefix.shape[2]
    s = q @ keys.transpose(-1, -2)  # [B, H, T, P + T]
    mask = torch.ones(t, p + t, dtype=torch.bool).tril(p)
    probs = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
    g = gamma.view(1, h, 1, 1)
    prefix_w = (1 - g) * values[:, :, :p] + g * y_prefix
    rhs = (1 - g) * probs[..., p:] @ values[:, :, p:] + probs[..., :p] @ prefix_w
    system = torch.eye(t, dtype=DT) - g * probs[..., p:]
    return torch.linalg.solve_triangular(system, rhs, upper=False)


@pytest.mark.parametrize("chunk", [1, 3, 8, 64])
@pytest.mark.parametrize("score_scale", [1.0, 300.0])
def test_chunked_op_equals_dense_formula(chunk, score_scale):
    torch.manual_seed(0)
    b, h, p, t, k, v = 2, 2, 5, 19, 4, 3
    q = torch.randn(b, h, t, k, dtype=DT) * score_scale  # x300: scores in the thousands, rows near one-hot
    keys, values = torch.randn(b, h, p + t, k, dtype=DT), torch.randn(b, h, p + t, v, dtype=DT)
    y_prefix = torch.randn(b, h, p, v, dtype=DT)
    gamma = torch.tensor([0.3, 0.999], dtype=DT)
    leaves = [z.requires_grad_() for z in (q, keys, values, y_prefix, gamma)]
    w = torch.randn(b, h, t, v, dtype=DT)
    results = []
    for run in (lambda: chunked_chacal(*leaves, chunk_size=chunk), lambda: _dense(*leaves)):
        y = run()
        results.append((y, torch.autograd.grad((y * w).sum(), leaves)))
    (y, grads), (y_ref, grads_ref) = results
    assert_close(y, y_ref, 1e-10, f"C={chunk} x{score_scale} output")
    for name, gr, gr_ref in zip(["q", "keys", "values", "y_prefix", "gamma"], grads, grads_ref):
        assert_close(gr, gr_ref, 1e-9, f"C={chunk} x{score_scale} d{name}")


def test_saturated_chunks_stay_exactly_causal():
    torch.manual_seed(0)
    b, h, t, k, v = 1, 2, 20, 4, 3
    q, keys = torch.randn(b, h, t, k) * 300.0, torch.randn(b, h, t, k)
    # tiny values and a huge change: a future weight even at the clamp floor (3e-38) would show
    values = torch.randn(b, h, t, v) * 1e-30
    gamma = torch.tensor([0.5, 0.9])
    y = chunked_chacal(q, keys, values, values[:, :, :0], gamma, chunk_size=8)
    for j in (3, 9, 17):
        changed = values.clone()
        changed[:, :, j] += 1e30
        y2 = chunked_chacal(q, keys, changed, values[:, :, :0], gamma, chunk_size=8)
        assert torch.equal(y2[:, :, :j], y[:, :, :j]), f"changing v_{j} changed earlier outputs"


def test_invalid_arguments_are_refused():
    q, kv = torch.randn(1, 2, 4, 3), torch.randn(1, 2, 4, 3)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_chacal(q, kv, kv, kv[:, :, :0], torch.tensor([0.5, 0.5]), chunk_size=0)
    with pytest.raises(ValueError, match="expected keys, values"):
        chunked_chacal(q, kv[:, :, :3], kv, kv[:, :, :0], torch.tensor([0.5, 0.5]))
