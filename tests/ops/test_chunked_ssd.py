"""The Mamba-2 SSD op (ops/chunked_ssd.py, B_t and C_t shared by the heads) against the token loop, float64.

- equals ops/recurrent_gla.py with q = C, k = B broadcast over the heads: outputs, final state and
  the gradients of its hand-written backward (C, B, x, g, initial state), for chunk sizes that are 1,
  odd, not powers of two or longer than the sequence, and a readout scale;
- chunks whose decay span would over/underflow the factored form are computed by chunked_gla's safe
  form (and stay exact): those chunks alone inside the SSD kernel, or the whole call when every
  chunk is that wide; ordinary decays use the SSD kernel itself;
- gradcheck, and bad shapes are refused.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tokenmix.ops.chunked_ssd import chunked_ssd
from tokenmix.ops.recurrent_gla import recurrent_gla
from tolerances import assert_close

DT = torch.float64


def _inputs(b=2, t=19, h=3, n=5, p=4, strength=1.0):
    c, bk = torch.randn(b, t, n, dtype=DT), torch.randn(b, t, n, dtype=DT)
    x = torch.randn(b, t, h, p, dtype=DT)
    g = F.logsigmoid(torch.randn(b, t, h, dtype=DT)) * strength
    s0 = torch.randn(b, h, n, p, dtype=DT)
    return c, bk, x, g, s0


def _reference(c, bk, x, g, scale, s0):
    b, t, n = c.shape
    h = x.shape[2]
    return recurrent_gla(c[:, :, None].expand(b, t, h, n), bk[:, :, None].expand(b, t, h, n), x, g, scale, s0)


def _compare(c, bk, x, g, s0, scale, chunk, what):
    leaves = [z.requires_grad_() for z in (c, bk, x, g, s0)]
    w_o = torch.randn(x.shape, dtype=DT)
    w_s = torch.randn(s0.shape, dtype=DT)
    results = []
    for run in (lambda: chunked_ssd(c, bk, x, g, scale, s0, chunk), lambda: _reference(c, bk, x, g, scale, s0)):
        o, s = run()
        grads = torch.autograd.grad((o * w_o).sum() + (s * w_s).sum(), leaves)
        results.append((o, s, grads))
    (o, s, grads), (o_ref, s_ref, grads_ref) = results
    assert_close(o, o_ref, 1e-12, f"{what} output")
    assert_close(s, s_ref, 1e-12, f"{what} final state")
    for name, gr, gr_ref in zip(["c", "b", "x", "g", "s0"], grads, grads_ref):
        assert_close(gr, gr_ref, 1e-11, f"{what} d{name}")


@pytest.mark.parametrize("chunk", [1, 3, 4, 6, 16, 64])
def test_ssd_equals_recurrent_with_gradients(chunk):
    torch.manual_seed(0)
    _compare(*_inputs(), scale=0.7, chunk=chunk, what=f"C={chunk}")


def test_ssd_kernel_is_used_for_ordinary_decays_and_safe_form_for_saturated_ones():
    torch.manual_seed(0)
    c, bk, x, g, s0 = _inputs(t=40)
    o, _ = chunked_ssd(c, bk, x, g.requires_grad_(), 1.0, s0, 16)
    assert "ChunkedSSD" in type(o.grad_fn).__name__
    g_sat = torch.where(torch.rand_like(g) < 0.5, torch.full_like(g, -400.0), torch.full_like(g, -1e-9))
    o, _ = chunked_ssd(c, bk, x, g_sat.requires_grad_(), 1.0, s0, 16)
    assert "ChunkedGLA" in type(o.grad_fn).__name__  # a 16-token chunk spans far beyond e^709
    _compare(c, bk, x, g_sat.detach(), s0, scale=1.0, chunk=16, what="saturated")


@pytest.mark.parametrize("chunk", [4, 16])
def test_ssd_wide_chunks_take_the_safe_form_inside_the_kernel(chunk):
    """A few chunks decaying past e^709 (one head of one sequence): the SSD kernel still runs, computes
    those chunk rows with the safe per-head form, and everything stays equal to the token loop."""
    torch.manual_seed(0)
    c, bk, x, g, s0 = _inputs(t=40)
    g = g.clone()
    g[1, 16:24, 2] = -400.0
    o, _ = chunked_ssd(c, bk, x, g.clone().requires_grad_(), 0.7, s0, chunk)
    assert "ChunkedSSD" in type(o.grad_fn).__name__
    _compare(c, bk, x, g, s0, scale=0.7, chunk=chunk, what=f"wide chunks, C={chunk}")


def test_ssd_gradcheck():
    torch.manual_seed(0)
    c, bk, x, g, s0 = _inputs(b=1, t=7, h=2, n=3, p=2)
    leaves = tuple(z.requires_grad_() for z in (c, bk, x, g, s0))
    assert torch.autograd.gradcheck(lambda c, bk, x, g, s0: chunked_ssd(c, bk, x, g, 0.5, s0, 4), leaves)


def test_ssd_invalid_arguments_are_refused():
    c, bk, x, g, s0 = _inputs()
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_ssd(c, bk, x, g, chunk_size=0)
    with pytest.raises(ValueError, match="expected c, b"):
        chunked_ssd(c, bk[:, :3], x, g)
    with pytest.raises(ValueError, match="g must be"):
        chunked_ssd(c, bk, x, g[..., :1])
    with pytest.raises(ValueError, match="initial_state"):
        chunked_ssd(c, bk, x, g, initial_state=s0[..., :1])
