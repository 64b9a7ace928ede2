"""Mixer-specific tests of log_linear_mamba2, log_linear_gated_deltanet and ttt_linear (issue 22).

The generic matrix (test_mixer_matrix.py, test_left_padding.py) covers mode agreement, gradcheck,
causality, continuation, left padding and the derived decode cache; here: the reductions (every level
scale 1 gives the base mixer exactly), the explicit dense formula of the log-linear gated delta rule,
the ops at lengths with several coarse Fenwick levels, TTT's mini-batch state, and the registered
cross-checks within their tolerances.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tokenmix.checks import CROSSCHECKS, load_all_crosschecks
from tokenmix.checks.equivalence import small_mixer
from tokenmix.checks.log_linear_attention import explicit_log_linear_delta
from tokenmix.core.operator import solve_dense
from tokenmix.ops.chunked_log_linear_delta import (
    chunked_log_linear_delta,
    final_levels,
    initial_levels_readout,
    log_linear_delta_operator,
    recurrent_log_linear_delta,
)
from tokenmix.ops.ttt_linear import TTTWeights, chunked_ttt_linear, dense_ttt_linear, recurrent_ttt_linear
from tolerances import FLOAT64_EXACT, FLOAT64_REASSOCIATED, assert_close

F64 = torch.float64
NEW = ("log_linear_mamba2", "log_linear_gated_deltanet", "ttt_linear")


def _flat_levels(m) -> None:
    """Every level scale exactly 1: the log-linear mixer reduces to its base."""
    with torch.no_grad():
        m.level_proj.weight.zero_()
        m.level_proj.bias.fill_(math.log(math.e - 1))


def _copy_shared(src, dst) -> None:
    """Copy the parameters dst has under the same names (the base mixer's) from src."""
    own = dict(src.named_parameters())
    with torch.no_grad():
        for name, p in dst.named_parameters():
            p.copy_(own[name])


@pytest.mark.parametrize(
    "name,base", [("log_linear_mamba2", "mamba2"), ("log_linear_gated_deltanet", "gated_deltanet")]
)
def test_flat_level_scales_give_the_base_mixer(name, base):
    m = small_mixer(name)
    _flat_levels(m)
    ref = small_mixer(base)
    _copy_shared(m, ref)
    x = torch.randn(2, 21, 12, dtype=F64)
    y_ref, s_ref = ref(x, mode="recurrent")
    for mode in m.modes:
        y, s = m(x, mode=mode)
        assert_close(y, y_ref, FLOAT64_REASSOCIATED, f"{name} {mode} vs {base}")
        # the Fenwick buckets add up to the base mixer's one state
        assert_close(s.levels.sum(2), s_ref.memory, FLOAT64_REASSOCIATED, f"{name} {mode}: sum of levels")


def test_log_linear_gated_deltanet_is_its_dense_formula():
    m = small_mixer("log_linear_gated_deltanet", allow_neg_eigval=True)
    x = torch.randn(2, 19, 12, dtype=F64)
    with torch.no_grad():
        q, k, v, beta, g, lam = m._levels_project(x, 0)
        o_ref = explicit_log_linear_delta(q, k, v, beta, g, lam, m.scale)
        y_ref = m.out(o_ref.flatten(2))
        for mode in m.modes:
            assert_close(m(x, mode=mode)[0], y_ref, FLOAT64_EXACT, f"mode {mode} vs the explicit formula")
        # the G-axis (A_l, B_l, R_l) has one level per Fenwick level and sums to the formula's matrix
        op = m.materialize(x)
        assert op.A.shape[2] == (19 - 1).bit_length() + 1
        assert_close(solve_dense(op, v), o_ref, FLOAT64_EXACT, "materialize -> solve_dense")


@pytest.mark.parametrize("start", [0, 5, 64, 77])
def test_log_linear_delta_ops_long_with_coarse_levels(start):
    torch.manual_seed(start)
    t, b, h, dk, dv = 150, 1, 2, 4, 3
    q, v = torch.randn(b, start + t, h, dk, dtype=F64), torch.randn(b, start + t, h, dv, dtype=F64)
    k = F.normalize(torch.randn(b, start + t, h, dk, dtype=F64), dim=-1)
    beta, g = 2 * torch.rand(b, start + t, h, dtype=F64), F.logsigmoid(torch.randn(b, start + t, h, dtype=F64) + 3)
    lam = F.softplus(torch.randn(b, start + t, h, 10, dtype=F64))
    args = lambda sl: (q[:, sl], k[:, sl], v[:, sl], beta[:, sl], g[:, sl], lam[:, sl])  # noqa: E731
    s0 = None
    if start:
        _, s0 = recurrent_log_linear_delta(*args(slice(0, start)), 0.5)
    seg = args(slice(start, None))
    o_rec, s_rec = recurrent_log_linear_delta(*seg, 0.5, s0, start)
    for c in (1, 4, 16):
        o, s = chunked_log_linear_delta(*seg, 0.5, s0, start, c)
        assert_close(o, o_rec, FLOAT64_REASSOCIATED, f"chunked C={c} output")
        assert_close(s, s_rec, FLOAT64_REASSOCIATED, f"chunked C={c} state")
    qs, ks, vs, bs, gs, ls = seg
    o = solve_dense(log_linear_delta_operator(qs, ks, bs, gs, ls, 0.5, start), vs)
    if s0 is not None:
        o = o + initial_levels_readout(qs, ks, bs, gs, ls, 0.5, start, s0)
    assert_close(o, o_rec, FLOAT64_REASSOCIATED, "dense output")
    assert_close(final_levels(ks, vs, bs, gs, start, s0), s_rec, FLOAT64_REASSOCIATED, "dense state")


@pytest.mark.parametrize("mbs", [1, 3, 8])
def test_ttt_ops_agree_from_any_start(mbs):
    torch.manual_seed(mbs)
    b, t, h, d = 2, 23, 2, 5
    q, k, v = torch.randn(3, b, t, h, d, dtype=F64).unbind(0)
    eta = 0.2 * torch.rand(b, t, h, dtype=F64)
    ln_w, ln_b = 1 + 0.1 * torch.randn(h, d, dtype=F64), 0.1 * torch.randn(h, d, dtype=F64)
    w0, c0 = 0.3 * torch.randn(b, h, d, d, dtype=F64), 0.3 * torch.randn(b, h, d, dtype=F64)
    acc = (None, None) if mbs == 1 else (torch.zeros_like(w0), torch.zeros_like(c0))
    s0 = TTTWeights(w0, c0, *acc)
    fns = (chunked_ttt_linear, recurrent_ttt_linear, dense_ttt_linear)
    o_ref, s_ref = recurrent_ttt_linear(q, k, v, eta, ln_w, ln_b, 0.4, 1e-5, mbs, s0)
    for cut in (0, 2, 7):
        for f1 in fns:
            for f2 in fns:
                if cut:
                    o1, s1 = f1(q[:, :cut], k[:, :cut], v[:, :cut], eta[:, :cut], ln_w, ln_b, 0.4, 1e-5, mbs, s0)
                else:
                    o1, s1 = q[:, :0], s0
                o2, s2 = f2(q[:, cut:], k[:, cut:], v[:, cut:], eta[:, cut:], ln_w, ln_b, 0.4, 1e-5, mbs, s1, cut)
                what = f"b={mbs} {f1.__name__}[:{cut}] + {f2.__name__}"
                assert_close(torch.cat([o1, o2], 1), o_ref, FLOAT64_EXACT, what)
                for x, y in zip(s2, s_ref):
                    assert (x is None) == (y is None)
                    if x is not None:
                        assert_close(x, y, FLOAT64_EXACT, f"{what} state")


@pytest.mark.parametrize("mbs", [1, 4])
def test_ttt_state_is_the_fast_weight(mbs):
    m = small_mixer("ttt_linear", mini_batch_size=mbs)
    x = torch.randn(2, 10, 12, dtype=F64)
    _, state = m(x)
    names = ["W", "c"] if mbs == 1 else ["W", "c", "G", "gb"]
    assert list(state.tensors()) == names
    assert state.tensors()["W"].shape == (2, m.n_heads, m.head_dim, m.head_dim)
    if mbs > 1:  # 10 tokens: the third mini-batch (8, 9) is open
        assert state.tensors()["G"].abs().max() > 0
        _, closed = m(torch.randn(2, 2, 12, dtype=F64), state)
        assert closed.tensors()["G"].abs().max() == 0 and closed.tensors()["gb"].abs().max() == 0
    assert state.numel_per_batch() == m.state_size(10)


@pytest.mark.parametrize("name", NEW)
def test_registered_crosschecks_within_tolerance(name):
    load_all_crosschecks()
    checks = CROSSCHECKS.get(name, [])
    assert checks, f"{name}: no cross-check registered"
    for label, fn, tol in checks:
        errors = fn()
        too_large = {q: e for q, e in errors.items() if not e <= tol}
        assert not too_large, f"{name} vs {label}: {too_large}"
        for mode in small_mixer(name).modes:
            assert any(f"{mode}." in q for q in errors), f"{name} vs {label}: mode {mode} not compared"
