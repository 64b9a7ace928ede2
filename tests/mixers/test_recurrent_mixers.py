"""HGRN-2, RG-LRU and MesaNet beyond the generic matrix: the (A, B) form reproduces the output, the
stated special structure (HGRN-2's k = 1 - f, RG-LRU against the paper's loop, MesaNet's solve), the
ops in isolation and the cross-checks against the independent references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mixer_helpers import small_mixer
from tokenmix.checks import CROSSCHECKS, load_all_crosschecks
from tokenmix.checks.gated_linear_recurrence import rg_lru_paper_loop
from tokenmix.core.errors import InputError
from tokenmix.mixers.registry import build_mixer
from tokenmix.ops.chunked_mesa import (
    chunked_key_covariance,
    dense_key_covariance,
    mesa_solve,
    mesa_solve_reference,
    recurrent_key_covariance,
)
from tolerances import FLOAT64_EXACT, FLOAT64_REASSOCIATED, assert_close

NAMES = ("hgrn2", "rg_lru", "mesa_net")


@pytest.mark.parametrize("name", NAMES)
def test_materialized_operator_reproduces_output(name):
    """W_o applied to M V (M = sum_c R_c (I - B_c)^{-1} A_c from ``materialize``) is the mixer's output."""
    m = small_mixer(name)
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    op = m.materialize(x)
    vals = m.values(x)  # [B, T, H, V]
    o = torch.einsum("bhtj,bjhv->bthv", op.mixing_matrix(), vals)
    y, _ = m(x, mode="dense")
    assert_close(m.out(o.flatten(2)), y, FLOAT64_EXACT, f"{name}: W_o M V vs dense output")


@pytest.mark.parametrize("name", NAMES)
def test_decode_state_fields_and_size(name):
    m = small_mixer(name)
    _, state = m(torch.randn(1, 5, 12, dtype=torch.float64))
    h, k = m.n_heads, m.head_dim
    expected = {
        "hgrn2": {"memory": (1, h, k, k)},
        "rg_lru": {"memory": (1, h * k, 1, 1)},
        "mesa_net": {"memory": (1, h, k, k), "covariance": (1, h, k, k)},
    }[name]
    assert {n: tuple(t.shape) for n, t in state.tensors().items()} == expected
    assert m.state_size(1) == m.state_size(10_000) == state.numel_per_batch()


def test_hgrn2_key_is_one_minus_forget_gate():
    for bound in (0.0, 0.3):
        m = small_mixer("hgrn2", forget_lower_bound=bound)
        f = m._features(torch.randn(2, 7, 12, dtype=torch.float64))
        assert_close(f.k + f.g.exp(), torch.ones_like(f.k), 1e-15, f"k + f = 1 (bound {bound})")
        assert bool((f.g.exp() >= bound).all())
    with pytest.raises(InputError):
        build_mixer("hgrn2", 12, forget_lower_bound=1.0)


def test_hgrn2_lower_bound_modes_agree():
    m = small_mixer("hgrn2", forget_lower_bound=0.5)
    x = torch.randn(2, 11, 12, dtype=torch.float64)
    y_ref, s_ref = m(x, mode="chunked")
    for mode in ("dense", "recurrent"):
        y, s = m(x, mode=mode)
        assert_close(y, y_ref, FLOAT64_REASSOCIATED, f"hgrn2 bound 0.5 {mode}")
        assert_close(s.memory, s_ref.memory, FLOAT64_REASSOCIATED, f"hgrn2 bound 0.5 {mode} state")


@pytest.mark.parametrize("mode", ["chunked", "dense", "recurrent"])
def test_rg_lru_equals_paper_loop(mode):
    m = small_mixer("rg_lru")
    x = torch.randn(2, 10, 12, dtype=torch.float64)
    with torch.no_grad():
        y_ref, h_ref = rg_lru_paper_loop(m, x)
        y, state = m(x, mode=mode)
    assert_close(y, y_ref, 1e-13, f"rg_lru {mode} vs the paper's loop")
    assert_close(state.memory[..., 0, 0], h_ref, 1e-13, f"rg_lru {mode} state vs the paper's loop")


def test_rg_lru_initialisation_and_near_one_decays():
    m = build_mixer("rg_lru", 64, n_heads=4)
    ac = torch.sigmoid(m.Lambda.detach().double()) ** 8
    assert float(ac.min()) >= 0.9 - 1e-6 and float(ac.max()) <= 0.999 + 1e-6
    # a_t -> 1 (r_t -> 0): sqrt(1 - a_t²) is formed with expm1, so float32 gradients stay finite
    for bias in (-30.0, -200.0):  # r_t tiny, and r_t = 0 exactly in float32 (a_t = 1)
        with torch.no_grad():
            m.gate_bias[0].fill_(bias)
        m.zero_grad()
        x = torch.randn(1, 20, 64, requires_grad=True)
        y, _ = m(x)
        y.sum().backward()
        assert torch.isfinite(y).all() and torch.isfinite(x.grad).all() and torch.isfinite(m.Lambda.grad).all()


@pytest.mark.parametrize("chunk", [1, 3, 4, 16])
def test_mesa_key_covariance_forms_agree(chunk):
    b, t, h, k = 2, 11, 2, 3
    keys = F.normalize(torch.randn(b, t, h, k, dtype=torch.float64), dim=-1)
    beta = torch.rand(b, t, h, dtype=torch.float64)
    g = F.logsigmoid(torch.randn(b, t, h, dtype=torch.float64))
    h0 = torch.randn(b, h, k, k, dtype=torch.float64)
    every_ref, last_ref = recurrent_key_covariance(keys, beta, g, h0)
    for what, (every, last) in {
        "chunked": chunked_key_covariance(keys, beta, g, h0, chunk),
        "dense": dense_key_covariance(keys, beta, g, h0),
    }.items():
        assert_close(every, every_ref, FLOAT64_REASSOCIATED, f"{what} every H_t (C={chunk})")
        assert_close(last, last_ref, FLOAT64_REASSOCIATED, f"{what} last H (C={chunk})")


def test_mesa_solve_is_the_regularised_least_squares_optimum():
    """(H_t + diag(lambda)) q*_t = q_t for every token, both solves; q* is what the mixer reads with."""
    m = small_mixer("mesa_net")
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    q, k, _, beta, g = m.projections(x)
    every, _ = chunked_key_covariance(k, beta, g, None, 4)
    lam = m.regulariser()
    system = every + torch.diag_embed(lam)
    for solve in (mesa_solve, mesa_solve_reference):
        q_star = solve(every, lam, q)
        assert_close((system @ q_star[..., None])[..., 0], q, 1e-13, f"{solve.__name__} residual")
    assert_close(m._features(x).q, mesa_solve(every, lam, q), 1e-13, "features read with q*")
    assert bool((lam > m.config.lambda_lower_bound).all())


def test_mesa_token_view_formula():
    """M[t, j] = exp(G_t - G_j) beta_j (q*_t · k_j), the B = 0 token view of the docstring."""
    m = small_mixer("mesa_net")
    x = torch.randn(1, 8, 12, dtype=torch.float64)
    q, k, _, beta, g = m.projections(x)
    every, _ = dense_key_covariance(k, beta, g)
    q_star = mesa_solve_reference(every, m.regulariser(), q)
    gc = g.cumsum(1).transpose(1, 2)  # [B, H, T]
    decay = (gc[..., :, None] - gc[..., None, :]).exp().tril()
    token_view = torch.einsum("bthk,bjhk->bhtj", q_star, k) * decay * beta.transpose(1, 2)[:, :, None, :]
    assert_close(m.materialize(x).mixing_matrix(), token_view, 1e-13, "mesa_net token view")


@pytest.mark.parametrize("name", NAMES)
def test_crosschecks_pass(name):
    load_all_crosschecks()
    checks = CROSSCHECKS.get(name, [])
    assert checks, f"{name}: no cross-check registered"
    for label, fn, tol in checks:
        errs = fn()
        worst = max(errs, key=errs.get)
        assert errs[worst] <= tol, f"{name} [{label}] {worst}: {errs[worst]:.2e} > {tol:.0e}"


@pytest.mark.parametrize("chunk", [3, 16])
def test_mesa_queries_closed_form_backward(chunk):
    """mesa_queries' hand-written backward against autograd through the covariance and the solve, and gradcheck."""
    from tokenmix.ops.chunked_mesa import mesa_queries

    b, t, h, k = 1, 7, 2, 3
    g_ = torch.Generator().manual_seed(0)
    mk = lambda *s: torch.randn(*s, dtype=torch.float64, generator=g_)  # noqa: E731
    h0 = mk(b, h, k, 2)
    inputs = (
        mk(b, t, h, k),
        F.normalize(mk(b, t, h, k), dim=-1),
        torch.sigmoid(mk(b, t, h)),
        F.logsigmoid(mk(b, t, h)),
        h0 @ h0.transpose(-1, -2),
        0.3 + torch.rand(h, k, dtype=torch.float64),
    )
    inputs = tuple(z.requires_grad_() for z in inputs)
    wq, wl = mk(b, t, h, k), mk(b, h, k, k)

    def ref(q, kk, beta, g, h0, lam):
        every, last = chunked_key_covariance(kk, beta, g, h0, chunk)
        return mesa_solve_reference(every, lam, q), last

    grads = {}
    for what, fn in (("closed form", lambda *a: mesa_queries(*a, chunk)), ("autograd", ref)):
        qs, last = fn(*inputs)
        grads[what] = torch.autograd.grad((qs * wq).sum() + (last * wl).sum(), inputs)
    for i, (a, r) in enumerate(zip(grads["closed form"], grads["autograd"])):
        assert_close(a, r, 1e-10, f"input {i} gradient")
    # the covariance is symmetric (Cholesky reads one triangle): gradcheck through a factor, h0 = F Fᵀ
    factor = h0.clone().requires_grad_()
    checked = inputs[:4] + (factor, inputs[5])
    assert torch.autograd.gradcheck(
        lambda q, kk, beta, g, f, lam: mesa_queries(q, kk, beta, g, f @ f.transpose(-1, -2), lam, chunk),
        checked,
        eps=1e-6,
        atol=1e-6,
    )
