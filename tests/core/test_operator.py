"""The (A, B) operator and the dense reference solver."""

from __future__ import annotations

import pytest
import torch

from tokenmix.core.operator import MixOperator, solve_dense
from tolerances import assert_close


def random_op(b=2, h=3, t=7, g=None, readout=False, dtype=torch.float64):
    shape = (b, h, t, t) if g is None else (b, h, g, t, t)
    a = torch.tril(torch.randn(shape, dtype=dtype))
    bm = torch.tril(torch.randn(shape, dtype=dtype), -1) * 0.3
    r = torch.tril(torch.randn(shape, dtype=dtype)) if readout else None
    return MixOperator(a, bm, r)


@pytest.mark.parametrize("g,readout", [(None, False), (None, True), (4, True), (4, False)])
def test_solver_equals_explicit_inverse(g, readout):
    op = random_op(g=g, readout=readout)
    x = torch.randn(2, 7, 3, 5, dtype=torch.float64)
    eye = torch.eye(7, dtype=torch.float64)
    m = torch.linalg.inv(eye - op.B) @ op.A
    if op.R is not None:
        m = op.R @ m
    if g is not None:
        m = m.sum(2)
    expected = torch.einsum("bhts,bshv->bthv", m, x)
    assert_close(solve_dense(op, x), expected, 1e-11, "solve_dense")
    assert_close(op.mixing_matrix(), m, 1e-11, "mixing_matrix")


def test_solver_satisfies_recurrence():
    op = random_op()
    x = torch.randn(2, 7, 3, 4, dtype=torch.float64)
    y = solve_dense(op, x).transpose(1, 2)
    xh = x.transpose(1, 2)
    assert_close(y, op.A @ xh + op.B @ y, 1e-12, "Y = A X + B Y")


def test_solver_gradcheck_and_dtypes():
    op = random_op(b=1, h=2, t=5)
    a = op.A.clone().requires_grad_()
    bm = op.B.clone().requires_grad_()
    x = torch.randn(1, 5, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, bm, x: solve_dense(MixOperator(torch.tril(a), torch.tril(bm, -1)), x), (a, bm, x)
    )
    for dtype in (torch.float32, torch.bfloat16):
        op32 = MixOperator(op.A.to(dtype), op.B.to(dtype))
        y = solve_dense(op32, x.detach().to(dtype))
        assert y.dtype == dtype


def test_offset_is_initial_state():
    op = random_op(b=1, h=2, t=6)
    x = torch.randn(1, 6, 2, 3, dtype=torch.float64)
    off = torch.randn(1, 6, 2, 3, dtype=torch.float64)
    eye = torch.eye(6, dtype=torch.float64)
    expected = torch.linalg.inv(eye - op.B) @ (op.A @ x.transpose(1, 2) + off.transpose(1, 2))
    assert_close(solve_dense(op, x, offset=off), expected.transpose(1, 2), 1e-12, "offset")


def test_validation_errors():
    t = torch.tril(torch.randn(1, 1, 4, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="strictly lower"):
        MixOperator(t, t).validate()
    with pytest.raises(ValueError, match="A must be lower triangular"):
        MixOperator(torch.randn(1, 1, 4, 4, dtype=torch.float64), torch.tril(t, -1)).validate()
    with pytest.raises(ValueError, match="shape"):
        MixOperator(t, torch.zeros(1, 1, 5, 5, dtype=torch.float64))
    with pytest.raises(TypeError, match="dtype"):
        MixOperator(t, torch.tril(t, -1).float())
    with pytest.raises(TypeError, match="floating"):
        MixOperator(t.long(), t.long())
    with pytest.raises(ValueError, match="T, T"):
        MixOperator(torch.zeros(1, 1, 4, 3), torch.zeros(1, 1, 4, 3))
    op = MixOperator(t, torch.tril(t, -1))
    with pytest.raises(ValueError, match="does not match"):
        solve_dense(op, torch.zeros(1, 5, 1, 2, dtype=torch.float64))
    with pytest.raises(TypeError):
        solve_dense(op, torch.zeros(1, 4, 1, 2, dtype=torch.float32))
    with pytest.raises(ValueError, match="too long to materialise"):
        MixOperator(torch.zeros(1, 1, 5000, 5000), torch.zeros(1, 1, 5000, 5000))
