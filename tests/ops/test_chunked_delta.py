"""Float64 op-level equivalences of the delta-rule and log-linear fast paths with their references.

The generic matrix (test_mixer_matrix.py) runs the mixers at T <= 13 with C = 4; here the ops run
long enough for many chunks and several coarse Fenwick levels, from unaligned start positions,
against the token-by-token references and the dense (A, B, R) solve.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.mixers.registry import build_mixer
from tokenmix.ops.chunked_delta import (
    chunk_state_recurrence,
    chunk_state_recurrence_reference,
    chunked_delta_rule,
    delta_rule_operator,
    recurrent_delta_rule,
)
from tokenmix.ops.chunked_log_linear import (
    chunked_log_linear_attention,
    fenwick_level_matrix,
    final_levels,
    initial_levels_readout,
    log_linear_operator,
    n_levels,
    recurrent_log_linear_attention,
)
from tokenmix.patterns import fenwick_level
from tolerances import FLOAT64_EXACT, assert_close

F64 = torch.float64


def _delta_inputs(t: int, b: int = 2, h: int = 2, dk: int = 5, dv: int = 3):
    q = torch.randn(b, t, h, dk, dtype=F64)
    k = F.normalize(torch.randn(b, t, h, dk, dtype=F64), dim=-1)
    v = torch.randn(b, t, h, dv, dtype=F64)
    beta = 2 * torch.rand(b, t, h, dtype=F64)
    g = F.logsigmoid(2 * torch.randn(b, t, h, dtype=F64))
    return q, k, v, beta, g, torch.randn(b, h, dk, dv, dtype=F64)


@pytest.mark.parametrize("gated", [False, True], ids=["delta", "gated"])
def test_chunked_delta_equals_recurrent_and_dense_solve(gated):
    q, k, v, beta, g, s0 = _delta_inputs(29)
    g = g if gated else None
    scale = 0.6
    o_rec, s_rec = recurrent_delta_rule(q, k, v, beta, g, scale, s0)
    for chunk in (1, 3, 8, 64):
        o, s = chunked_delta_rule(q, k, v, beta, g, scale, s0, chunk)
        assert_close(o, o_rec, FLOAT64_EXACT, f"chunked (C={chunk}) output")
        assert_close(s, s_rec, FLOAT64_EXACT, f"chunked (C={chunk}) final state")
    # the (A, B, R) form with the initial state as a known right-hand side
    mix_a, mix_b, readout, decay = delta_rule_operator(q, k, beta, g, scale)
    decay_t = decay.transpose(1, 2)[..., None]
    offset = -beta[..., None] * decay_t * torch.einsum("bthk,bhkv->bthv", k, s0)
    u = solve_dense(MixOperator(mix_a, mix_b), v, offset=offset)
    o = (readout @ u.transpose(1, 2)).transpose(1, 2) + scale * decay_t * torch.einsum("bthk,bhkv->bthv", q, s0)
    assert_close(o, o_rec, FLOAT64_EXACT, "dense (A, B, R) solve output")


@pytest.mark.parametrize("gated", [False, True], ids=["delta", "gated"])
@pytest.mark.parametrize("r", [2, 3])
def test_read_every_gives_the_read_rows_of_the_recurrence_with_gradients(gated, r):
    """read_every = r (DeltaProduct's sub-step clock) returns rows r-1, 2r-1, ... of the recurrence,
    also for chunk sizes that are no multiple of r (rounded down), and the same gradients."""
    q, k, v, beta, g, s0 = _delta_inputs(30)
    g = g if gated else None
    o_rec, s_rec = recurrent_delta_rule(q, k, v, beta, g, 0.6, s0)
    for chunk in (1, 4, 7, 64):
        o, s = chunked_delta_rule(q, k, v, beta, g, 0.6, s0, chunk, read_every=r)
        assert_close(o, o_rec[:, r - 1 :: r], FLOAT64_EXACT, f"r={r} C={chunk} output")
        assert_close(s, s_rec, FLOAT64_EXACT, f"r={r} C={chunk} final state")
    leaves = [z.detach().requires_grad_() for z in (q, k, v, beta, s0)]
    w = torch.randn_like(o_rec[:, r - 1 :: r])

    def loss(read_every):
        qq, kk, vv, bb, ss = leaves
        o, s = chunked_delta_rule(qq, kk, vv, bb, g, 0.6, ss, 8, read_every=read_every)
        o = o if read_every == r else o[:, r - 1 :: r]
        return torch.autograd.grad((o * w).sum() + s.square().sum(), leaves)

    for got, want in zip(loss(r), loss(1)):
        assert_close(got, want, FLOAT64_EXACT, f"r={r} gradient")


@pytest.mark.parametrize("decay", ["none", "scalar", "per key"])
def test_chunk_recurrence_backward_equals_autograd_through_the_loop(decay):
    """The hand-written backward of the chunk recurrence against autograd through the plain loop:
    outputs, and gradients of u0, W, K, the decay and S_0 under a random read of all three outputs."""
    torch.manual_seed(3)
    b, h, n, c, dk, dv = 2, 3, 5, 4, 3, 2
    u0, w, k = (torch.randn(b, h, n, c, x, dtype=F64) for x in (dv, dk, dk))
    d = {
        "none": None,
        "scalar": torch.rand(b, h, n, 1, 1, dtype=F64),
        "per key": torch.rand(b, h, n, dk, 1, dtype=F64),
    }[decay]
    s0 = torch.randn(b, h, dk, dv, dtype=F64)
    leaves = [z.requires_grad_() for z in (u0, w, k, d, s0) if z is not None]
    fast, ref = chunk_state_recurrence(u0, w, k, d, s0), chunk_state_recurrence_reference(u0, w, k, d, s0)
    weights = [torch.randn_like(x) for x in ref]
    for got, want, what in zip(fast, ref, ("u", "starts", "final state")):
        assert_close(got, want, FLOAT64_EXACT, what)
    g_fast = torch.autograd.grad(sum((x * wt).sum() for x, wt in zip(fast, weights)), leaves)
    g_ref = torch.autograd.grad(sum((x * wt).sum() for x, wt in zip(ref, weights)), leaves)
    for got, want in zip(g_fast, g_ref):
        assert_close(got, want, FLOAT64_EXACT, "gradient")
    # and one output alone (the others' gradients None)
    g_last = torch.autograd.grad(chunk_state_recurrence(u0, w, k, d, s0)[2].sum(), leaves)
    g_last_ref = torch.autograd.grad(chunk_state_recurrence_reference(u0, w, k, d, s0)[2].sum(), leaves)
    for got, want in zip(g_last, g_last_ref):
        assert_close(got, want, FLOAT64_EXACT, "gradient of the final state alone")


def test_gated_delta_rule_with_zero_gate_is_the_delta_rule():
    q, k, v, beta, g, s0 = _delta_inputs(17)
    o0, s_0 = chunked_delta_rule(q, k, v, beta, None, None, s0, 4)
    o1, s_1 = chunked_delta_rule(q, k, v, beta, torch.zeros_like(g), None, s0, 4)
    assert_close(o1, o0, 1e-13, "g = 0 output")
    assert_close(s_1, s_0, 1e-13, "g = 0 state")


def test_allow_neg_eigval_gives_beta_up_to_two():
    m = build_mixer("deltanet", 8, n_heads=2, allow_neg_eigval=True, chunk_size=4).double()
    with torch.no_grad():
        m.beta_proj.bias.fill_(6.0)  # sigmoid(6) ~ 0.998 -> beta ~ 1.995: eigenvalue 1 - beta ~ -1
    x = torch.randn(1, 11, 8, dtype=F64)
    beta = torch.diagonal(m.materialize(x).A, dim1=-2, dim2=-1)
    assert beta.min() > 1.0 and beta.max() < 2.0
    y_c, s_c = m(x, mode="chunked")
    y_r, s_r = m(x, mode="recurrent")
    assert_close(y_c, y_r, 1e-10, "chunked vs recurrent with beta ~ 2")
    assert_close(s_c.memory, s_r.memory, 1e-10, "state with beta ~ 2")


def _log_linear_inputs(t: int, b: int = 2, h: int = 2, dk: int = 3, dv: int = 2, n_lam: int = 10):
    q, k = torch.randn(b, t, h, dk, dtype=F64), torch.randn(b, t, h, dk, dtype=F64)
    v = torch.randn(b, t, h, dv, dtype=F64)
    g = F.logsigmoid(torch.randn(b, t, h, dtype=F64) + 2)
    lam = F.softplus(torch.randn(b, t, h, n_lam, dtype=F64))
    return q, k, v, g, lam


@pytest.mark.parametrize("start,t,chunk", [(0, 70, 4), (5, 70, 4), (13, 130, 8), (64, 1, 4), (3, 33, 1), (7, 9, 64)])
def test_chunked_log_linear_equals_recurrent_and_dense(start, t, chunk):
    q, k, v, g, lam = _log_linear_inputs(start + t)
    scale = 0.7
    sl = slice(start, start + t)
    init = None
    if start:
        _, init = recurrent_log_linear_attention(
            q[:, :start], k[:, :start], v[:, :start], g[:, :start], lam[:, :start], scale
        )
    args = (q[:, sl], k[:, sl], v[:, sl], g[:, sl], lam[:, sl], scale, init, start)
    o_rec, s_rec = recurrent_log_linear_attention(*args)
    o, s = chunked_log_linear_attention(*args, chunk_size=chunk)
    assert_close(o, o_rec, FLOAT64_EXACT, "chunked vs recurrent output")
    assert_close(s, s_rec, FLOAT64_EXACT, "chunked vs recurrent Fenwick state")
    # dense token view: A over the segment, the earlier Fenwick states as the offset
    mix_a = log_linear_operator(q[:, sl], k[:, sl], g[:, sl], lam[:, sl], scale, start)
    offset = None if init is None else initial_levels_readout(q[:, sl], g[:, sl], lam[:, sl], scale, start, init)
    o_dense = solve_dense(MixOperator(mix_a, torch.zeros_like(mix_a)), v[:, sl], offset=offset)
    assert_close(o_dense, o_rec, FLOAT64_EXACT, "dense solve vs recurrent output")
    assert_close(
        final_levels(k[:, sl], v[:, sl], g[:, sl], start, init), s_rec, FLOAT64_EXACT, "closed-form final state"
    )


def test_fenwick_state_layout_and_size():
    """State after n tokens: bit_length(n) level slots; slot l-1 is empty exactly when bit l-1 of n is 0."""
    q, k, v, g, lam = _log_linear_inputs(45)
    for n in (1, 2, 7, 8, 12, 45):
        _, s = chunked_log_linear_attention(q[:, :n], k[:, :n], v[:, :n], g[:, :n], lam[:, :n], 1.0, chunk_size=4)
        assert s.shape[2] == n.bit_length()
        filled = [bool(s[:, :, slot].abs().max() > 0) for slot in range(s.shape[2])]
        assert filled == [bool((n >> slot) & 1) for slot in range(n.bit_length())], f"n={n}"


def test_log_linear_with_unit_level_scales_is_mamba2():
    """All lambda = 1: o_t = scale sum_s exp(G_t - G_s) (q_t·k_s) v_s (masked linear attention)."""
    q, k, v, g, lam = _log_linear_inputs(21)
    ones = torch.ones_like(lam)
    o, _ = chunked_log_linear_attention(q, k, v, g, ones, 0.5, chunk_size=4)
    cum = g.transpose(1, 2).cumsum(-1)
    causal = torch.ones(21, 21, dtype=torch.bool).tril()
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    mix = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)) * decay * 0.5
    assert_close(o, (mix @ v.transpose(1, 2)).transpose(1, 2), 1e-12, "unit level scales vs Mamba-2")


def test_log_linear_gradients_chunked_equal_recurrent_from_unaligned_start():
    start, t = 5, 40
    q, k, v, g, lam = _log_linear_inputs(start + t)
    _, init = recurrent_log_linear_attention(
        q[:, :start], k[:, :start], v[:, :start], g[:, :start], lam[:, :start], 1.0
    )
    seg = [x[:, start:].clone().requires_grad_() for x in (q, k, v, g, lam)]
    init = init.clone().requires_grad_()
    w_o, w_s = torch.randn(2, t, 2, 2, dtype=F64), torch.randn(2, 2, (start + t).bit_length(), 3, 2, dtype=F64)
    grads = {}
    for name, fn in (
        ("chunked", lambda *a: chunked_log_linear_attention(*a, chunk_size=4)),
        ("recurrent", recurrent_log_linear_attention),
    ):
        o, s = fn(*seg, 1.0, init, start)
        grads[name] = torch.autograd.grad((o * w_o).sum() + (s * w_s).sum(), [*seg, init])
    for what, a, b in zip(["q", "k", "v", "g", "lambda", "initial levels"], grads["chunked"], grads["recurrent"]):
        assert_close(a, b, FLOAT64_EXACT, f"d{what}")


def test_vectorised_level_matrix_matches_fenwick_level():
    for start, t in ((0, 33), (29, 40)):
        mat = fenwick_level_matrix(start, t)
        ref = torch.tensor(
            [[fenwick_level(start + i, start + j) if j <= i else -1 for j in range(t)] for i in range(t)]
        )
        assert torch.equal(mat, ref)
    assert [n_levels(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 3, 3, 4, 4, 5]


def test_log_linear_refuses_positions_beyond_max_levels():
    m = build_mixer("log_linear", 8, n_heads=2, max_levels=3).double()  # levels 0..2: positions < 4
    m(torch.randn(1, 4, 8, dtype=F64))
    with pytest.raises(ValueError, match="max_levels"):
        m(torch.randn(1, 5, 8, dtype=F64))
