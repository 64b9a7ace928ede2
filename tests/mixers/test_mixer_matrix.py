"""The generic equivalence matrix: every registered mixer joins by registering.

For each mixer and each of its modes: outputs, final states and gradients equal the first (fast)
mode; uneven multi-token continuation equals one full pass; gradcheck in float64; causality;
measured decode cache equals the derived accounting; misuse of a state is refused; a packed batch
(documents back to back in a row, ``core/packing.py``) equals its documents run alone, and a decode
step that begins a new document equals a fresh decode.

Each check is a plain function of a mixer name (``check_*``; ``check_mixer`` runs them all), so a
mixer registered after collection (tests/mixers/test_enrolment.py) runs the same matrix.
"""

from __future__ import annotations

import pytest
import torch

from mixer_helpers import ALL_MIXERS, small_mixer
from tokenmix.checks.tolerances import FLOAT32_REL_RMS, GRADIENT_FACTOR, assert_close, mode_tolerance, rel_rms
from tokenmix.core.packing import Packing

SHAPES = [(12, 2, 11), (10, 2, 9), (8, 1, 1)]  # (d_model, n_heads, T)
SHAPE_IDS = ["h6", "odd_h5", "T1"]


def _states_close(s1, s2, atol, what):
    t1, t2 = s1.tensors(), s2.tensors()
    assert t1.keys() == t2.keys(), f"{what}: state fields differ"
    assert s1.position == s2.position
    for k in t1:
        assert_close(t1[k], t2[k], atol, f"{what} state[{k}]")


def check_modes_agree(name, d_model=12, n_heads=2, t=11):
    m = small_mixer(name, d_model, n_heads)
    x = torch.randn(2, t, d_model, dtype=torch.float64)
    ref_mode = m.modes[0]
    y_ref, s_ref = m(x, mode=ref_mode)
    for mode in m.modes[1:]:
        y, s = m(x, mode=mode)
        assert_close(y, y_ref, mode_tolerance(m), f"{name} {mode} vs {ref_mode} output")
        _states_close(s, s_ref, mode_tolerance(m), f"{name} {mode} vs {ref_mode}")


@pytest.mark.parametrize("name", ALL_MIXERS)
@pytest.mark.parametrize("d_model,n_heads,t", SHAPES, ids=SHAPE_IDS)
def test_modes_agree(name, d_model, n_heads, t):
    check_modes_agree(name, d_model, n_heads, t)


def check_uneven_continuation(name):
    m = small_mixer(name)
    x = torch.randn(2, 13, 12, dtype=torch.float64)
    y_full, s_full = m(x, mode=m.modes[0])
    for mode in m.modes:
        pieces, state, t0 = [], None, 0
        for i, size in enumerate([3, 1, 5, 4]):
            piece_mode = mode if i % 2 == 0 else m.modes[-1]  # alternate with token-by-token decode
            y, state = m(x[:, t0 : t0 + size], state, mode=piece_mode)
            pieces.append(y)
            t0 += size
        assert_close(torch.cat(pieces, 1), y_full, mode_tolerance(m), f"{name} continuation via {mode}")
        _states_close(state, s_full, mode_tolerance(m), f"{name} continuation via {mode}")


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_uneven_continuation(name):
    check_uneven_continuation(name)


def check_gradients_agree(name):
    m = small_mixer(name)
    x0 = torch.randn(2, 10, 12, dtype=torch.float64)
    w = torch.randn(2, 10, 12, dtype=torch.float64)
    grads = {}
    for mode in m.modes:
        m.zero_grad()
        x = x0.clone().requires_grad_()
        y, state = m(x, mode=mode)
        loss = (y * w).sum() + sum((t * 0.37).sum() for t in state.tensors().values())
        loss.backward()
        grads[mode] = [x.grad] + [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in m.parameters()]
    ref = m.modes[0]
    names = ["x"] + [n for n, _ in m.named_parameters()]
    for mode in m.modes[1:]:
        for pname, g, g_ref in zip(names, grads[mode], grads[ref]):
            assert_close(g, g_ref, mode_tolerance(m) * GRADIENT_FACTOR, f"{name} d{pname} {mode} vs {ref}")


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_gradients_agree(name):
    check_gradients_agree(name)


def check_gradcheck_every_mode_through_state(name):
    m = small_mixer(name, d_model=4, n_heads=2)
    xa = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    xb = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    for mode in m.modes:

        def f(xa, xb):
            ya, s = m(xa, mode=mode)
            yb, s = m(xb, s, mode=mode)
            return torch.cat([ya, yb], 1)

        assert torch.autograd.gradcheck(f, (xa, xb), eps=1e-6, atol=1e-6), f"{name} gradcheck failed in mode {mode}"


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_gradcheck_every_mode_through_state(name):
    check_gradcheck_every_mode_through_state(name)


def check_causality(name):
    m = small_mixer(name)
    x = torch.randn(1, 9, 12, dtype=torch.float64)
    for mode in m.modes:
        y, _ = m(x, mode=mode)
        for t in (0, 4, 8):
            xp = x.clone()
            xp[:, t] += torch.randn(12, dtype=torch.float64)
            yp, _ = m(xp, mode=mode)
            assert_close(yp[:, :t], y[:, :t], 0.0, f"{name} {mode}: perturbing x_{t} changed earlier outputs")
            assert (yp[:, t] - y[:, t]).abs().max() > 0, f"{name} {mode}: output ignores its own input"


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_causality(name):
    check_causality(name)


def check_materialize_is_causal_operator(name):
    m = small_mixer(name)
    op = m.materialize(torch.randn(2, 8, 12, dtype=torch.float64))
    op.validate(atol=0.0)
    mix = op.mixing_matrix()
    s = 8 * getattr(m, "substeps", 1)  # DeltaProduct's operator runs on n_h sub-steps per token
    assert mix.shape[-2:] == (s, s)
    assert torch.triu(mix, 1).abs().max() == 0


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_materialize_is_causal_operator(name):
    check_materialize_is_causal_operator(name)


def check_decode_cache_matches_derivation(name):
    m = small_mixer(name)
    n = 37
    state = None
    for t in range(n):
        _, state = m.step(torch.randn(1, 12, dtype=torch.float64), state)
    assert state.position == n
    assert state.peak_positions == m.cache_positions(n), f"{name}: measured peak cache positions"
    assert state.peak_numel == m.state_size(n), f"{name}: measured peak state scalars"


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_decode_cache_matches_derivation(name):
    check_decode_cache_matches_derivation(name)


def check_state_misuse_is_refused(name):
    m = small_mixer(name)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    _, state = m(x)
    with pytest.raises(ValueError, match="batch size"):
        m(torch.randn(3, 2, 12, dtype=torch.float64), state)
    other = small_mixer("first_order" if name != "first_order" else "pow2")
    _, foreign = other(x)
    with pytest.raises(ValueError, match="different mixer"):
        m(x, foreign)
    with pytest.raises(ValueError, match="shape"):
        m(torch.randn(2, 5, 7, dtype=torch.float64))
    with pytest.raises(TypeError, match="parameters are torch.float64"):
        m(torch.randn(2, 5, 12, dtype=torch.float32))
    with pytest.raises(TypeError, match="parameters are torch.float64"):  # a decode step checks too
        m.step(torch.randn(2, 12, dtype=torch.float32), state)
    with pytest.raises(ValueError, match="mode"):
        m(x, mode="nonexistent")


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_state_misuse_is_refused(name):
    check_state_misuse_is_refused(name)


def check_float32_modes_agree(name):
    m = small_mixer(name).float()
    x = torch.randn(2, 21, 12)
    y_ref, _ = m(x, mode=m.modes[0])
    for mode in m.modes[1:]:
        y, _ = m(x, mode=mode)
        err = rel_rms(y, y_ref)
        assert err <= FLOAT32_REL_RMS, f"{name} float32 {mode} vs {m.modes[0]}: rel rms {err:.2e}"


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_float32_modes_agree(name):
    check_float32_modes_agree(name)


PACKED_LENGTHS = [[1, 4, 6], [5, 6], [11]]  # documents per row: length 1, lengths not multiples of the chunk (4)


def _documents_alone(m, mode, prefix, x, packing, w):
    """Reference of a packed segment after ``prefix``: each row's first document continues its
    prefix, every later document runs alone from a fresh state. Returns (y, loss, last states)."""
    ys, loss, last = torch.zeros_like(x), 0.0, []
    for b in range(x.shape[0]):
        for i, (t0, t1) in enumerate(packing.documents(b)):
            if i == 0:
                _, state = m(prefix[b : b + 1], mode=mode)
            else:
                state = None
            y, state = m(x[b : b + 1, t0:t1], state, mode=mode)
            ys[b, t0:t1] = y[0]
            loss = loss + (y[0] * w[b, t0:t1]).sum()
        last.append(state)
    return ys, loss, last


def check_packed_rows_equal_documents(name):
    """Every mode: a packed segment (after an unpacked prefix) equals its documents run alone, the
    first continuing the prefix: outputs, gradients of inputs and parameters, and the final state
    (decoding on from it equals decoding on from each row's last document)."""
    m = small_mixer(name)
    packing = Packing.from_lengths(PACKED_LENGTHS)
    prefix0 = torch.randn(3, 3, 12, dtype=torch.float64)
    x0 = torch.randn(3, 11, 12, dtype=torch.float64)
    w = torch.randn(3, 11, 12, dtype=torch.float64)
    after = torch.randn(3, 2, 12, dtype=torch.float64)
    tol = mode_tolerance(m)
    params = list(m.parameters())
    for mode in m.modes:
        x, prefix = x0.clone().requires_grad_(), prefix0.clone().requires_grad_()
        _, state = m(prefix, mode=mode)
        y, state = m(x, state, mode=mode, packing=packing)
        grads = torch.autograd.grad((y * w).sum(), [x, prefix, *params], allow_unused=True)
        xr, prefix_r = x0.clone().requires_grad_(), prefix0.clone().requires_grad_()
        y_ref, loss_ref, last = _documents_alone(m, mode, prefix_r, xr, packing, w)
        grads_ref = torch.autograd.grad(loss_ref, [xr, prefix_r, *params], allow_unused=True)
        assert_close(y, y_ref, tol, f"{name} {mode} packed output vs documents alone")
        names = ["x", "prefix"] + [n for n, _ in m.named_parameters()]
        for pname, g, g_ref in zip(names, grads, grads_ref):
            g = torch.zeros_like(g_ref) if g is None and g_ref is not None else g
            g_ref = torch.zeros_like(g) if g_ref is None and g is not None else g_ref
            if g is not None:
                assert_close(g, g_ref, tol * GRADIENT_FACTOR, f"{name} {mode} packed d{pname}")
        y_on, _ = m(after, state, mode=m.modes[-1])
        y_on_ref = torch.cat([m(after[b : b + 1], last[b], mode=m.modes[-1])[0] for b in range(3)])
        assert_close(y_on, y_on_ref, tol, f"{name} {mode} decode after a packed segment")


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_packed_rows_equal_documents(name):
    check_packed_rows_equal_documents(name)


def check_decode_reset_equals_fresh(name):
    """A decode step with ``reset`` begins a new document in those rows: their outputs from there on
    equal a fresh decode, the other rows' equal an uninterrupted one."""
    m = small_mixer(name)
    prompt = torch.randn(2, 5, 12, dtype=torch.float64)
    tokens = torch.randn(2, 3, 12, dtype=torch.float64)
    _, state = m(prompt)
    outs = []
    for i in range(3):
        y, state = m.step(tokens[:, i], state, reset=torch.tensor([i == 0, False]))
        outs.append(y)
    y = torch.stack(outs, 1)
    fresh, _ = m(tokens[0:1], mode=m.modes[-1])
    on, _ = m(torch.cat([prompt[1:2], tokens[1:2]], 1))
    tol = mode_tolerance(m)
    assert_close(y[0:1], fresh, tol, f"{name} decode after a reset vs a fresh decode")
    assert_close(y[1:2], on[:, 5:], tol, f"{name} decode of a row that did not reset")


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_decode_reset_equals_fresh(name):
    check_decode_reset_equals_fresh(name)


PER_MIXER_CHECKS = (
    check_uneven_continuation,
    check_gradients_agree,
    check_gradcheck_every_mode_through_state,
    check_causality,
    check_materialize_is_causal_operator,
    check_decode_cache_matches_derivation,
    check_state_misuse_is_refused,
    check_float32_modes_agree,
    check_packed_rows_equal_documents,
    check_decode_reset_equals_fresh,
)


def check_mixer(name):
    """The whole matrix for one registered mixer: every check, modes agreeing at every shape."""
    for d_model, n_heads, t in SHAPES:
        check_modes_agree(name, d_model, n_heads, t)
    for check in PER_MIXER_CHECKS:
        check(name)


def test_check_mixer_runs_every_check():
    checks = {n for n, f in globals().items() if n.startswith("check_") and callable(f)} - {"check_mixer"}
    assert checks == {c.__name__ for c in PER_MIXER_CHECKS} | {"check_modes_agree"}
