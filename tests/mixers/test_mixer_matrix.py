"""The generic equivalence matrix: every registered mixer joins by registering.

For each mixer and each of its modes: outputs, final states and gradients equal the first (fast)
mode; uneven multi-token continuation equals one full pass; gradcheck in float64; causality;
measured decode cache equals the derived accounting; misuse of a state is refused.

Each check is a plain function of a mixer name (``check_*``; ``check_mixer`` runs them all), so a
mixer registered after collection (tests/mixers/test_enrolment.py) runs the same matrix.
"""

from __future__ import annotations

import pytest
import torch

from mixer_helpers import ALL_MIXERS, small_mixer
from tokenmix.checks.tolerances import FLOAT32_REL_RMS, GRADIENT_FACTOR, assert_close, mode_tolerance, rel_rms

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
    with pytest.raises(TypeError):
        m(torch.randn(2, 5, 12, dtype=torch.float32))
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


PER_MIXER_CHECKS = (
    check_uneven_continuation,
    check_gradients_agree,
    check_gradcheck_every_mode_through_state,
    check_causality,
    check_materialize_is_causal_operator,
    check_decode_cache_matches_derivation,
    check_state_misuse_is_refused,
    check_float32_modes_agree,
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
