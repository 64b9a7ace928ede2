"""Gram iteration is an upper bound (property test, badly scaled included), tight after <= 10 steps on
256 x 256 mixing operators, differentiable; structure-specific bounds hold."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mixer_helpers import small_mixer
from tokenmix.analysis.norms import (
    compare_estimators,
    conv_spectral_bound,
    equal_flop_power_steps,
    exact_spectral_norm,
    gram_spectral_bound,
    mixer_regularizer,
    neumann_gain_bound,
    operator_norms,
    power_iteration,
    recurrence_inverse,
    run_norms,
    spectral_regularizer,
    toeplitz_kernel,
)
from tokenmix.analysis.outputs import PNG_SIGNATURE
from tokenmix.core.operator import MixOperator

ROUNDING = 1e-12  # the bound and the SVD are each exact up to float64 rounding


pytestmark = pytest.mark.usefixtures("one_thread")


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 12),
    k=st.integers(1, 12),
    log_scale=st.floats(-250, 250),
    iters=st.integers(0, 12),
    rank=st.integers(0, 12),
    seed=st.integers(0, 10**6),
    spread=st.floats(0, 8),
)
def test_gram_bound_is_an_upper_bound(m, k, log_scale, iters, rank, seed, spread):
    gen = torch.Generator().manual_seed(seed)
    r = max(1, min(rank, m, k))
    w = torch.randn(m, r, generator=gen, dtype=torch.float64) @ torch.randn(r, k, generator=gen, dtype=torch.float64)
    # badly scaled rows and an overall scale from 1e-250 to 1e250
    w = w * torch.logspace(0, spread, m, dtype=torch.float64)[:, None] * 10.0**log_scale
    bound = float(gram_spectral_bound(w, iters))
    exact = float(exact_spectral_norm(w))
    assert math.isfinite(bound)
    assert bound >= exact * (1 - ROUNDING), (bound, exact)
    assert bound <= exact * min(m, k) ** (2.0 ** -(iters + 1)) * (1 + ROUNDING)  # the convergence guarantee


def test_zero_matrix_and_shape_errors():
    assert float(gram_spectral_bound(torch.zeros(4, 3), 5)) == 0.0
    with pytest.raises(ValueError, match="matrices"):
        gram_spectral_bound(torch.ones(3), 2)


@pytest.mark.parametrize("name", ["pow2", "sq1_ce", "first_order"])
def test_gram_within_1e3_after_10_steps_on_256_operators(name):
    m = small_mixer(name, d_model=8, n_heads=2)
    with torch.no_grad():
        op = m.materialize(torch.randn(1, 256, 8, dtype=torch.float64))
    for mats in (op.mixing_matrix()[0], recurrence_inverse(op)[0]):
        assert mats.shape[-1] == 256
        rel = gram_spectral_bound(mats, 10) / exact_spectral_norm(mats) - 1
        assert (rel >= -ROUNDING).all() and (rel <= 1e-3).all(), rel


def test_worst_case_convergence_is_the_rank_root():
    """An orthogonal 256 x 256 matrix (all singular values equal) is the worst case: 256^(2^-(t+1))."""
    q = torch.linalg.qr(torch.randn(256, 256, dtype=torch.float64))[0]
    for t in (8, 10, 12):
        assert float(gram_spectral_bound(q, t)) == pytest.approx(256 ** (2.0 ** -(t + 1)), rel=1e-9)


def test_power_iteration_is_a_lower_estimate_at_equal_time():
    torch.manual_seed(0)
    w = torch.tril(torch.randn(3, 128, 128, dtype=torch.float64))
    res = compare_estimators(w, gram_iters=10)
    assert res["power_iters"] >= 1
    assert (res["power"] <= res["exact"] * (1 + ROUNDING)).all()
    assert (res["gram"] >= res["exact"] * (1 - ROUNDING)).all()
    assert (power_iteration(w, 1) <= res["exact"] * (1 + ROUNDING)).all()
    assert (res["power_equal_flops"] <= res["exact"] * (1 + ROUNDING)).all()
    # ten Gram steps on 128 x 128 cost 128^3 (first) + 9 * 128^3 multiply-adds = 640 power steps
    assert res["power_iters_equal_flops"] == equal_flop_power_steps(128, 128, 10) == 640


def test_gradients_flow():
    w = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w: gram_spectral_bound(w, 4), (w,))
    m = small_mixer("pow2", d_model=8, n_heads=2)
    x = torch.randn(1, 12, 8, dtype=torch.float64)
    loss = mixer_regularizer(m, x, target=0.0, n_iter=6)
    loss.backward()
    grads = [p.grad for p in m.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
    # a regulariser whose target is above the norm contributes nothing
    assert float(spectral_regularizer(m.materialize(x), "recurrence", target=1e6).detach()) == 0.0
    with pytest.raises(ValueError, match="which"):
        spectral_regularizer(m.materialize(x), "other")


def test_toeplitz_view_of_a_fixed_decay():
    n, gamma = 64, 0.8
    b = torch.diag_embed(torch.full((1, 2, n - 1), gamma, dtype=torch.float64), offset=-1)
    op = MixOperator(torch.eye(n, dtype=torch.float64).expand(1, 2, n, n).clone(), b)
    inv = recurrence_inverse(op)[0, 0]
    kern = toeplitz_kernel(inv)
    assert kern is not None and torch.allclose(kern, gamma ** torch.arange(n, dtype=torch.float64))
    exact = float(exact_spectral_norm(inv))
    bound = conv_spectral_bound(kern)
    assert exact <= bound <= 1 / (1 - gamma) + 1e-12
    assert bound / exact - 1 < 0.05
    rows, _ = operator_norms(op)
    assert rows[0]["inv toeplitz conv bound"] == pytest.approx(bound)
    # a data-dependent decay is not Toeplitz
    b2 = b.clone()
    b2[0, 0, 5, 4] = 0.3
    assert toeplitz_kernel(recurrence_inverse(MixOperator(op.A, b2))[0, 0]) is None


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 24), seed=st.integers(0, 10**6), scale=st.floats(0.01, 0.99))
def test_neumann_gain_bound(n, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    b = torch.tril(torch.rand(n, n, generator=gen, dtype=torch.float64), -1)
    norm = max(float(b.abs().sum(0).max()), float(b.abs().sum(1).max()), 1e-12)
    b = b / norm * scale
    bound = neumann_gain_bound(b)
    inv = torch.linalg.inv(torch.eye(n, dtype=torch.float64) - b)
    assert bound is not None and bound >= float(exact_spectral_norm(inv)) * (1 - ROUNDING)
    assert neumann_gain_bound(b / scale * 1.5) is None  # the larger of the two norms is now 1.5


def test_run_norms_outputs(tmp_path):
    out = run_norms(["pow2", "first_order"], tmp_path, n=16, gram_iters=8, d_model=8, formats=("png",))
    data = json.loads((tmp_path / "norms.json").read_text())
    assert [r["mixer"] for r in data["summary"]] == ["pow2", "first_order"]
    for r in out["summary"]:
        assert r["max ||M|| gram"] >= r["max ||M|| exact"] * (1 - ROUNDING)
    assert (tmp_path / "norms.png").read_bytes().startswith(PNG_SIGNATURE)
    assert "| pow2 |" in (tmp_path / "norms.md").read_text()
    with pytest.raises(ValueError, match="limit"):
        run_norms(["pow2"], tmp_path, n=10**5)


def test_run_norms_skips_operators_too_large(tmp_path, monkeypatch):
    from tokenmix.analysis import matrices

    monkeypatch.setattr(matrices, "MAX_OPERATOR_BYTES", 1000)
    out = run_norms(["pow2"], tmp_path, n=16, gram_iters=4, d_model=8, formats=("png",))
    assert out["summary"] == [] and out["skipped"][0]["mixer"] == "pow2"
    assert "skipped pow2" in (tmp_path / "norms.md").read_text()
