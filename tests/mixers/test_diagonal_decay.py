"""The chunked gated-linear-attention op and the first-order state view of its five mixers, in float64.

- ops/chunked_gla.py equals the token loop of ops/recurrent_gla.py (outputs, final state and the
  gradients of its hand-written backward) for no / per-head / per-key decay, for chunk sizes that
  are 1, odd, not powers of two, or longer than the sequence, with an initial state;
- decays so strong that exp(-G) overflows float64 (a factored exp(G_i) exp(-G_j) form gives NaN)
  stay exact, whether every chunk takes the safe form or only some (mixed with factored chunks in
  one call), and both forms are what the op picks for ordinary and for saturated gates;
- every mixer's ``materialize`` (A_c = diag(k_c), B_c = decay shift, R_c = diag(q_c)·scale, G = K axis)
  has M = sum_c R_c (I - B_c)^{-1} A_c equal to the token view scale · Q Kᵀ ⊙ decay, and
  solve_dense(op, values) + output projection is the mixer's output.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mixer_helpers import small_mixer
from tokenmix.core.operator import solve_dense
from tokenmix.ops.chunked_gla import chunked_gla
from tokenmix.ops.recurrent_gla import recurrent_gla
from tolerances import assert_close

DT = torch.float64
NAMES = ["linear_attention", "retnet", "gla", "mamba2", "diag_ssm"]


def _inputs(kind: str, b=2, t=19, h=2, dk=5, dv=3, strength=1.0):
    q, k, v = torch.randn(b, t, h, dk, dtype=DT), torch.randn(b, t, h, dk, dtype=DT), torch.randn(b, t, h, dv, dtype=DT)
    g = {
        "none": None,
        "per_head": F.logsigmoid(torch.randn(b, t, h, dtype=DT)) * strength,
        "per_key": F.logsigmoid(torch.randn(b, t, h, dk, dtype=DT)) * strength,
    }[kind]
    s0 = torch.randn(b, h, dk, dv, dtype=DT)
    return q, k, v, g, s0


def _assert_chunked_is_the_token_loop(q, k, v, g, s0, chunk: int, what: str, out_tol: float = 1e-12) -> None:
    """chunked_gla (chunk size ``chunk``) against recurrent_gla: outputs, final state and the gradients
    of every leaf (q, k, v, g where given, s0) under random output and state weights."""
    leaves = [z.requires_grad_() for z in (q, k, v, g, s0) if z is not None]
    w_o = torch.randn(*v.shape[:3], v.shape[3], dtype=DT)
    w_s = torch.randn(*s0.shape, dtype=DT)
    results = []
    for run in (lambda: chunked_gla(q, k, v, g, 0.7, s0, chunk), lambda: recurrent_gla(q, k, v, g, 0.7, s0)):
        o, s = run()
        grads = torch.autograd.grad((o * w_o).sum() + (s * w_s).sum(), leaves)
        results.append((o, s, grads))
    (o, s, grads), (o_ref, s_ref, grads_ref) = results
    assert_close(o, o_ref, out_tol, f"{what} output")
    assert_close(s, s_ref, 1e-12, f"{what} final state")
    for name, gr, gr_ref in zip("qkvgs" if g is not None else "qkvs", grads, grads_ref):
        assert_close(gr, gr_ref, 1e-11, f"{what} d{name}")


@pytest.mark.parametrize("kind", ["none", "per_head", "per_key"])
@pytest.mark.parametrize("chunk", [1, 3, 4, 6, 16, 64])
def test_chunked_equals_recurrent_with_gradients(kind, chunk):
    torch.manual_seed(0)
    q, k, v, g, s0 = _inputs(kind)
    _assert_chunked_is_the_token_loop(q, k, v, g, s0, chunk, f"{kind} C={chunk}")


@pytest.mark.parametrize("kind", ["none", "per_head", "per_key"])
def test_chunked_gradcheck(kind):
    torch.manual_seed(0)
    q, k, v, g, s0 = _inputs(kind, b=1, t=7, h=1, dk=3, dv=2)
    leaves = tuple(z.requires_grad_() for z in (q, k, v, s0) + ((g,) if g is not None else ()))

    def f(q, k, v, s0, *gs):
        return chunked_gla(q, k, v, gs[0] if gs else None, 0.5, s0, chunk_size=4)

    assert torch.autograd.gradcheck(f, leaves)


@pytest.mark.parametrize("kind", ["per_head", "per_key"])
def test_decays_beyond_exp_overflow_stay_exact(kind):
    """Log decays of -400 per token: inside a 16-token chunk exp(-G) reaches e^6400 (inf in float64)."""
    torch.manual_seed(0)
    q, k, v, g, s0 = _inputs(kind, t=40)
    g = torch.where(torch.rand_like(g) < 0.5, torch.full_like(g, -400.0), torch.full_like(g, -1e-9))
    o, s = chunked_gla(q, k, v, g, 0.7, s0, chunk_size=16)
    o_ref, s_ref = recurrent_gla(q, k, v, g, 0.7, s0)
    assert_close(o, o_ref, 1e-12, f"{kind} output")
    assert_close(s, s_ref, 1e-12, f"{kind} final state")


@pytest.mark.parametrize("kind", ["per_head", "per_key"])
def test_factored_and_safe_chunks_mixed_in_one_call(kind):
    """One chunk of each sequence saturates (-400 per token) while the others stay mild: the op splits
    the chunks between its factored and its safe form and must still equal the token loop, gradients
    included (any NaN from a factored form on a saturated chunk would show here)."""
    torch.manual_seed(0)
    q, k, v, g, s0 = _inputs(kind, t=45)
    g = g.clone()
    g[:, 8:12] = -400.0  # chunk 1 (chunk size 8) of both sequences
    g[1, 30] = -500.0  # and chunk 3 of the second only
    _assert_chunked_is_the_token_loop(q, k, v, g, s0, 8, f"{kind} mixed", out_tol=1e-11)


@pytest.mark.parametrize("strength,expect_safe", [(1.0, 0), (400.0, 8)])
def test_chunk_form_follows_the_decay_span(strength, expect_safe):
    """Ordinary gates keep every chunk on the factored form; saturated ones send them to the safe form."""
    from tokenmix.ops.chunked_gla import _split_rows, _to_rows

    torch.manual_seed(0)
    g = F.logsigmoid(torch.randn(2, 32, 2, 5, dtype=DT)) * strength
    fast, safe = _split_rows(_to_rows(g, 2, 16).cumsum_(1))
    n_safe = 8 if safe is None else safe.numel()
    assert n_safe == expect_safe


def test_invalid_arguments_are_refused():
    q, k, v, g, s0 = _inputs("per_key")
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_gla(q, k, v, g, chunk_size=0)
    with pytest.raises(ValueError, match="g must be"):
        chunked_gla(q, k, v, g[..., :2])
    with pytest.raises(ValueError, match="initial_state"):
        chunked_gla(q, k, v, g, initial_state=s0[..., :1])
    with pytest.raises(ValueError, match="expected q, k"):
        chunked_gla(q, k[:, :3], v)


@pytest.mark.parametrize("name", NAMES)
def test_state_view_equals_token_view(name):
    m = small_mixer(name)
    x = torch.randn(2, 9, 12, dtype=DT)
    op = m.materialize(x).validate()
    assert op.has_state_axis and op.A.shape[2] == m.key_dim  # G = K: one first-order recurrence per key channel
    b_sub = op.B - torch.diag_embed(torch.diagonal(op.B, offset=-1, dim1=-2, dim2=-1), offset=-1)
    assert b_sub.abs().max() == 0, "B_c must be a single sub-diagonal (first order)"
    f = m._features(x)
    g = torch.zeros_like(f.q) if f.g is None else (f.g if f.g.dim() == 4 else f.g[..., None].expand_as(f.q))
    cum = g.cumsum(1)  # [B, T, H, K]
    # token view: A[t, j] = scale sum_c q_tc k_jc exp(G_tc - G_jc), j <= t
    diff = (cum[:, :, None] - cum[:, None, :]).masked_fill(
        ~torch.ones(9, 9, dtype=torch.bool).tril()[..., None, None], float("-inf")
    )
    token = torch.einsum("bthc,bjhc,btjhc->bhtj", f.q, f.k, diff.exp()) * f.scale
    assert_close(op.mixing_matrix(), token, 1e-12, f"{name} state view vs token view")
    # dense reference: solve_dense(op, v) (+ skip) through the output projection is the mixer's output
    o = solve_dense(op, f.v)
    y = m.out((o if f.skip is None else o + f.skip).flatten(2))
    assert_close(y, m(x, mode="dense")[0], 1e-12, f"{name} solve_dense(op, v) vs dense mode")
