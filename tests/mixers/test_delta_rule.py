"""Gated DeltaProduct, KDA and Gated DeltaNet-2: what the generic matrix does not reach.

The generic properties (mode agreement, gradcheck, causality, continuation, decode cache, left padding)
come from registering (test_mixer_matrix.py, test_left_padding.py), at the default n_h = 2. Here:
the reductions between the mixers (n_h = 1 is Gated DeltaNet; KDA with one decay per head is Gated
DeltaNet; GDN-2 with b = w = beta is KDA), allow_neg_eigval, DeltaProduct's sub-step operator and
n_h = 3, the channel-wise op against its recurrence, and the fla cross-checks (checks/delta_2025.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mixer_helpers import small_mixer
from tokenmix.checks import CROSSCHECKS, load_all_crosschecks
from tokenmix.core.operator import solve_dense
from tokenmix.ops.chunked_channel_delta import (
    channel_delta_operator,
    chunked_channel_delta_rule,
    decayed_scores,
    recurrent_channel_delta_rule,
)
from tokenmix.study.structure import layer_shortest_path
from tolerances import FLOAT64_EXACT, assert_close

NEW = ("gated_delta_product", "kda", "gdn2")


def _all_modes(m, x):
    return {mode: m(x, mode=mode) for mode in m.modes}


def _assert_same_mixer(m, ref, x, what):
    """Every mode of m equals every mode of ref on x (outputs and final states)."""
    for (mode, (y, s)), (ref_mode, (y_ref, s_ref)) in zip(_all_modes(m, x).items(), _all_modes(ref, x).items()):
        assert_close(y, y_ref, FLOAT64_EXACT, f"{what}: {mode} vs {ref_mode} output")
        assert_close(s.memory, s_ref.memory, FLOAT64_EXACT, f"{what}: {mode} vs {ref_mode} state")


# ---------------------------------------------------------------- reductions
def test_delta_product_with_one_step_is_gated_deltanet():
    ref = small_mixer("gated_deltanet")
    m = small_mixer("gated_delta_product", n_h=1)
    m.load_state_dict(ref.state_dict())  # n_h = 1: the same projections, the same layout
    x = torch.randn(2, 11, 12, dtype=torch.float64)
    _assert_same_mixer(m, ref, x, "gated_delta_product(n_h=1) vs gated_deltanet")
    op, op_ref = m.materialize(x), ref.materialize(x)
    for name in ("A", "B", "R"):
        assert_close(getattr(op, name), getattr(op_ref, name), FLOAT64_EXACT, f"n_h=1 operator {name}")


def test_kda_with_one_decay_per_head_is_gated_deltanet():
    ref = small_mixer("gated_deltanet")
    m = small_mixer("kda")
    k = m.head_dim
    with torch.no_grad():
        for name in ("qkv.weight", "beta_proj.weight", "beta_proj.bias", "out.weight", "A_log"):
            m.get_parameter(name).copy_(ref.get_parameter(name))
        m.a_proj.weight.copy_(ref.a_proj.weight.repeat_interleave(k, 0))  # every channel: its head's gate
        m.dt_bias.copy_(ref.dt_bias.repeat_interleave(k))
    _assert_same_mixer(m, ref, torch.randn(2, 11, 12, dtype=torch.float64), "kda(g per head) vs gated_deltanet")


def test_gdn2_with_scalar_gates_is_kda():
    ref = small_mixer("kda")
    m = small_mixer("gdn2")
    k = m.head_dim
    with torch.no_grad():
        for name in ("qkv.weight", "a_proj.weight", "A_log", "dt_bias", "out.weight"):
            m.get_parameter(name).copy_(ref.get_parameter(name))
        for proj in (m.erase_proj, m.write_proj):  # b = w = beta on every channel
            proj.weight.copy_(ref.beta_proj.weight.repeat_interleave(k, 0))
            proj.bias.copy_(ref.beta_proj.bias.repeat_interleave(k))
    _assert_same_mixer(m, ref, torch.randn(2, 11, 12, dtype=torch.float64), "gdn2(b = w = beta) vs kda")


# ---------------------------------------------------------------- negative eigenvalues
def _write_strength(m, x):
    """beta (DeltaProduct, KDA) or the erase gate b (GDN-2)."""
    if hasattr(m, "_gates"):
        return m._gates(x)[0]
    return m._project(x)[3]


@pytest.mark.parametrize("name", NEW)
def test_allow_neg_eigval_lets_beta_exceed_one(name):
    x = 3 * torch.randn(2, 64, 12, dtype=torch.float64)
    plain = _write_strength(small_mixer(name), x)
    neg = _write_strength(small_mixer(name, allow_neg_eigval=True), x)
    assert 0 < plain.min() and plain.max() < 1
    assert 0 < neg.min() and neg.max() < 2 and neg.max() > 1
    assert_close(neg, 2 * plain, FLOAT64_EXACT, f"{name}: allow_neg_eigval doubles the sigmoid")
    m = small_mixer(name, allow_neg_eigval=True)  # and the modes still agree there
    runs = list(_all_modes(m, x[:, :13]).values())
    for y, s in runs[1:]:
        assert_close(y, runs[0][0], FLOAT64_EXACT, f"{name} allow_neg_eigval: modes")
        assert_close(s.memory, runs[0][1].memory, FLOAT64_EXACT, f"{name} allow_neg_eigval: states")


# ---------------------------------------------------------------- DeltaProduct's sub-step operator
@pytest.mark.parametrize("n_h", [2, 3])
def test_delta_product_operator_on_the_substep_clock(n_h):
    m = small_mixer("gated_delta_product", n_h=n_h)
    with torch.no_grad():
        m.out.weight.copy_(torch.eye(12, dtype=torch.float64))  # identity readout: y = per-head o
    t = 7
    x = torch.randn(2, t, 12, dtype=torch.float64)
    op = m.materialize(x).validate(atol=0.0)
    assert op.A.shape[-2:] == (n_h * t, n_h * t)
    last = torch.zeros(n_h * t, dtype=torch.bool)
    last[n_h - 1 :: n_h] = True
    assert op.R[..., ~last, :].abs().max() == 0, "no read-out on the sub-steps before the last"
    o = solve_dense(op, m.values(x))  # [B, N, H, V]
    y, _ = m(x)
    assert_close(o[:, last].flatten(2), y, FLOAT64_EXACT, f"n_h={n_h}: (A, B, R) on the sub-step clock")


def test_delta_product_three_steps_modes_continuation_and_gradcheck():
    m = small_mixer("gated_delta_product", n_h=3, d_model=4, n_heads=2)
    x = torch.randn(2, 9, 4, dtype=torch.float64)
    runs = _all_modes(m, x)
    y_ref, s_ref = runs[m.modes[0]]
    for y, s in runs.values():
        assert_close(y, y_ref, FLOAT64_EXACT, "n_h=3 modes")
        assert_close(s.memory, s_ref.memory, FLOAT64_EXACT, "n_h=3 states")
    state, ys = None, []
    for i, (a, b) in enumerate([(0, 2), (2, 3), (3, 7), (7, 9)]):
        y, state = m(x[:, a:b], state, mode=m.modes[i % 3])
        ys.append(y)
    assert_close(torch.cat(ys, 1), y_ref, FLOAT64_EXACT, "n_h=3 continuation")
    xa = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    for mode in m.modes:
        assert torch.autograd.gradcheck(lambda z: m(z, mode=mode)[0], (xa,), eps=1e-6, atol=1e-6), mode


@pytest.mark.parametrize("n_h", [1, 2, 3])
def test_delta_product_state_size_and_flops(n_h):
    m = small_mixer("gated_delta_product", n_h=n_h)
    state = None
    for _ in range(5):
        _, state = m.step(torch.randn(1, 12, dtype=torch.float64), state)
    assert state.peak_numel == m.state_size(5) == m.n_heads * m.head_dim**2  # S only, whatever n_h
    assert m.flops_per_token(5) == (2 * n_h + 2) * m.n_heads * m.head_dim**2


# ---------------------------------------------------------------- the channel-wise op
@pytest.mark.parametrize("gated", [True, False], ids=["per-channel g", "no decay"])
def test_chunked_channel_delta_equals_recurrence_and_operator(gated):
    torch.manual_seed(0)
    b, t, h, dk, dv = 2, 13, 2, 4, 3
    q, k = (
        torch.randn(b, t, h, dk, dtype=torch.float64),
        F.normalize(torch.randn(b, t, h, dk, dtype=torch.float64), dim=-1),
    )
    v = torch.randn(b, t, h, dv, dtype=torch.float64)
    e = torch.rand(b, t, h, dk, dtype=torch.float64) * k
    g = F.logsigmoid(torch.randn(b, t, h, dk, dtype=torch.float64)) if gated else None
    s0 = torch.randn(b, h, dk, dv, dtype=torch.float64)
    o_ref, s_ref = recurrent_channel_delta_rule(q, k, v, e, g, None, s0)
    for c in (1, 4, 5, 16):
        o, s = chunked_channel_delta_rule(q, k, v, e, g, None, s0, c)
        assert_close(o, o_ref, FLOAT64_EXACT, f"chunked C={c} output")
        assert_close(s, s_ref, FLOAT64_EXACT, f"chunked C={c} state")
    # zero initial state: O = R (I - B)^{-1} W
    o0, _ = recurrent_channel_delta_rule(q, k, v, e, g)
    mix_b, readout, _ = channel_delta_operator(q, k, e, g, dk**-0.5)
    eye = torch.eye(t, dtype=torch.float64)
    u = torch.linalg.solve(eye - mix_b, v.transpose(1, 2))
    assert_close((readout @ u).transpose(1, 2), o0, FLOAT64_EXACT, "operator")


@pytest.mark.parametrize("c", [1, 3, 8, 12])
def test_decayed_scores_binary_splitting_equals_the_pair_products(c):
    """Every level of the binary splitting against sum_d a_id b_jd exp(G_id - G_jd), forward and gradients."""
    torch.manual_seed(c)
    a1, a2, b = (torch.randn(2, 3, c, 5, dtype=torch.float64, requires_grad=True) for _ in range(3))
    g = (-torch.rand(2, 3, c, 5, dtype=torch.float64) * 3).requires_grad_()

    def reference(a1, a2, b, g):
        gc = g.cumsum(-2)
        causal = torch.ones(c, c, dtype=torch.bool).tril()
        decay = (gc[..., :, None, :] - gc[..., None, :, :]).masked_fill(~causal[..., None], float("-inf")).exp()
        return tuple((a[..., :, None, :] * b[..., None, :, :] * decay).sum(-1) for a in (a1, a2))

    def split(a1, a2, b, g):
        return decayed_scores((a1, a2), b, g.cumsum(-2))

    for got, want in zip(split(a1, a2, b, g), reference(a1, a2, b, g)):
        assert_close(got, want, FLOAT64_EXACT, f"C={c} scores")
    assert torch.autograd.gradcheck(split, (a1, a2, b, g))


def test_chunked_channel_delta_is_finite_with_extreme_gates():
    torch.manual_seed(0)
    shape = (1, 1024, 2, 8)
    q, k_raw, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    g = torch.where(torch.rand(shape) < 0.5, -1e-6, -50.0).requires_grad_()
    b = torch.where(torch.rand(shape) < 0.5, 1e-4, 2 - 1e-4)
    k = F.normalize(k_raw, dim=-1)
    o, s = chunked_channel_delta_rule(q, k, v, b * k, g)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    ((o * torch.randn_like(o)).sum() + s.sum()).backward()
    for leaf in (q, k_raw, v, g):
        assert torch.isfinite(leaf.grad).all()


# ---------------------------------------------------------------- fla cross-checks
load_all_crosschecks()
REFERENCES = {
    "gated_delta_product": ("fla naive_recurrent_gated_delta_product",),
    "kda": ("fla naive_recurrent_kda", "fla naive_chunk_kda"),
    "gdn2": ("fla naive_recurrent_gdn2", "fla naive_chunk_gdn2"),
}
CASES = [
    pytest.param(name, label, fn, tol, id=f"{name}: {label}")
    for name in REFERENCES
    for label, fn, tol in CROSSCHECKS.get(name, [])
]


@pytest.mark.parametrize("name", list(REFERENCES))
def test_registered_crosschecks_cover_the_references(name):
    labels = [label for label, _, _ in CROSSCHECKS.get(name, [])]
    for ref in REFERENCES[name]:
        assert any(label.startswith(ref) for label in labels), f"{name}: no cross-check against {ref}"


@pytest.mark.parametrize("name,label,check,tolerance", CASES)
def test_crosscheck_within_tolerance_in_every_mode(name, label, check, tolerance):
    assert tolerance <= 1e-5
    errors = check()
    too_large = {q: e for q, e in errors.items() if not e <= tolerance}
    assert not too_large, f"{name} vs {label}: {too_large}"
    for mode in small_mixer(name).modes:
        for how in ("", ".pieces"):
            assert any(f"{mode}{how}.output" in q for q in errors), f"{name}: {mode}{how} output not compared"
            assert any(f"{mode}{how}.state" in q for q in errors), f"{name}: {mode}{how} state not compared"
    assert any(q.startswith("op.chunked") or " op.chunked" in q for q in errors)
    assert any(q.startswith("op.recurrent") or " op.recurrent" in q for q in errors)


def test_deltaproduct_path_is_read_on_tokens_not_sub_steps():
    """The compare table's path@n for an operator on n_h sub-steps per token: token j reaches token
    i in one layer (as in Gated DeltaNet), not 'unreachable' because inner sub-steps have no output."""
    for n_h in (1, 2, 3):
        m = small_mixer("gated_delta_product", n_h=n_h)
        assert layer_shortest_path(m, 12) == 1.0
