"""The short causal depthwise convolution (mixers/short_conv.py), beyond the generic matrix: the
definition by an explicit loop, the token shift it generalises, the measured decode cache, the
initialisation, the operator and bad configs."""

from __future__ import annotations

import pytest
import torch

from tokenmix.checks import CROSSCHECKS, load_all_crosschecks
from tokenmix.checks.common import run_in_pieces
from tokenmix.core.errors import InputError
from tokenmix.core.operator import solve_dense
from tokenmix.mixers.registry import build_mixer
from tokenmix.mixers.short_conv import ShortConvConfig
from tolerances import FLOAT64_EXACT, assert_close

D, HEADS = 12, 3


def _mixer(k: int, seed: int = 0):
    torch.manual_seed(seed)
    return build_mixer("short_conv", D, n_heads=HEADS, kernel_size=k).double()


@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
def test_every_mode_equals_the_loop_formula(k):
    """v_{t,c} = sum_j w[c, j] u_{t-j,c} (zeros before the start), y = W_out v, whole and in pieces."""
    m = _mixer(k)
    with torch.no_grad():
        m.weight.normal_()
    x = torch.randn(2, 11, D, dtype=torch.float64)
    u = x @ m.in_proj.weight.T
    v = torch.zeros_like(u)
    for t in range(u.shape[1]):
        for j in range(k):
            if t - j >= 0:
                v[:, t] += m.weight[:, j].detach() * u[:, t - j]
    y_ref = v @ m.out.weight.T
    for mode in m.modes:
        y, state = m(x, mode=mode)
        assert_close(y, y_ref, FLOAT64_EXACT, f"k={k} {mode}")
        assert_close(state.inputs, u[:, u.shape[1] - (k - 1) :], FLOAT64_EXACT, f"k={k} {mode} state")
        y, state = run_in_pieces(m, x, mode, (1, 2, 5, 3))
        assert_close(y, y_ref, FLOAT64_EXACT, f"k={k} {mode} in pieces")
        assert_close(state.inputs, u[:, u.shape[1] - (k - 1) :], FLOAT64_EXACT, f"k={k} {mode} pieces state")


@pytest.mark.parametrize("mode", ["conv", "dense", "recurrent"])
def test_kernel_two_is_identity_or_one_token_shift(mode):
    m = _mixer(2)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    u = x @ m.in_proj.weight.T
    with torch.no_grad():
        m.weight.copy_(torch.tensor([1.0, 0.0]).expand(m.channels, 2))
    y, _ = m(x, mode=mode)
    assert_close(y, u @ m.out.weight.T, FLOAT64_EXACT, f"{mode}: taps (1, 0) are the identity")
    with torch.no_grad():
        m.weight.copy_(torch.tensor([0.0, 1.0]).expand(m.channels, 2))
    y, state = run_in_pieces(m, x, mode, (3, 4))
    shifted = torch.cat([torch.zeros_like(u[:, :1]), u[:, :-1]], 1)
    assert_close(y, shifted @ m.out.weight.T, FLOAT64_EXACT, f"{mode}: taps (0, 1) shift by one token")
    assert (y[:, 0] == 0).all()
    assert_close(state.inputs, u[:, -1:], FLOAT64_EXACT, f"{mode}: the state is the last input")


@pytest.mark.parametrize("k", [1, 2, 4, 9])
@pytest.mark.parametrize("n", [1, 3, 8, 20])
def test_decode_cache_holds_exactly_k_minus_one_positions(k, n):
    m = _mixer(k)
    xs = torch.randn(n, 1, D, dtype=torch.float64)
    state = None
    for t in range(n):
        _, state = m.step(xs[t], state)
    assert state.position == n
    held = min(k - 1, n - 1)  # while the last token is processed
    assert state.peak_positions == held == m.cache_positions(n)
    assert state.peak_numel == held * m.channels == m.state_size(n)
    assert state.cached_positions() == min(k - 1, n)  # after it
    u = xs[:, 0] @ m.in_proj.weight.T
    assert_close(state.inputs[0], u[n - min(k - 1, n) :], FLOAT64_EXACT, "the cache is the last inputs u")
    assert m.flops_per_token(n) == m.channels * (held + 1)


def test_initialisation_is_near_identity():
    k = 5
    m = build_mixer("short_conv", D, n_heads=HEADS, kernel_size=k)
    assert (m.weight[:, 0] == 1).all()
    assert (m.weight[:, 1:].abs() < 1.0 / k).all() and m.weight[:, 1:].abs().max() > 0
    assert m.channels == D and tuple(m.weight.shape) == (D, k)
    assert build_mixer("short_conv", D, n_heads=2, head_dim=4).channels == 8
    assert ShortConvConfig().kernel_size == 4


def test_materialized_operator_is_the_banded_toeplitz():
    k, t = 3, 8
    m = _mixer(k)
    x = torch.randn(2, t, D, dtype=torch.float64)
    op = m.materialize(x)
    assert tuple(op.A.shape) == (2, m.channels, t, t) and op.R is None and (op.B == 0).all()
    w = m.weight.detach()
    for r in range(t):
        for s in range(t):
            expect = w[:, r - s] if 0 <= r - s < k else torch.zeros(m.channels, dtype=torch.float64)
            assert torch.equal(op.A[0, :, r, s], expect), (r, s)
    y = solve_dense(op, m.values(x))[..., 0] @ m.out.weight.T
    assert_close(y, m(x)[0], FLOAT64_EXACT, "solver on the operator vs the conv mode")


@pytest.mark.parametrize("bad", [0, -1, -4, 2.5, True, "4"])
def test_bad_kernel_size_is_refused(bad):
    with pytest.raises(InputError, match="kernel_size must be an integer >= 1"):
        ShortConvConfig(kernel_size=bad)
    with pytest.raises(InputError, match="kernel_size"):
        build_mixer("short_conv", D, n_heads=HEADS, kernel_size=bad)


def test_crosschecks_within_tolerance():
    """The registered cross-checks (``tokenmix check --mixer short_conv``) cover every mode."""
    load_all_crosschecks()
    checks = CROSSCHECKS.get("short_conv", [])
    assert {label.split(" ")[0] for label, _, _ in checks} == {"explicit", "nn.Conv1d(padding=k-1)"}
    for label, fn, tol in checks:
        errors = fn()
        too_large = {q: e for q, e in errors.items() if not e <= tol}
        assert not too_large, f"{label}: {too_large}"
        for mode in ("conv", "dense", "recurrent"):
            for what in (".output", ".continued.output", ".state"):
                assert f"k=4 {mode}{what}" in errors, (label, mode, what)
