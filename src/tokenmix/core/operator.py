"""The (A, B) operator and the dense reference solver every other path is tested against.

A causal linear mixer is a pair (A, B): every output mixes current and past inputs (A, lower
triangular) and strictly earlier outputs (B, strictly lower triangular):

    Y = A X + B Y      =>      Y = (I - B)^{-1} A X.

Some mixers (DeltaNet, state-expanded SSMs) apply a per-token readout R after the recurrence,
and state-expanded ones run one recurrence per state channel g and sum the read-outs:

    M = sum_g R_g (I - B_g)^{-1} A_g,        Y = M X.

I - B is unit lower triangular, hence always invertible; computing a layer is a triangular solve.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tokenmix.core.errors import InputError, WrongInputType

MAX_DENSE_T = 4096  # materialising [B, H, T, T] beyond this is refused (use the structured paths)


def solve_unit_lower(lower: Tensor, rhs: Tensor, transpose: bool = False) -> Tensor:
    """Solve (I - lower) Z = rhs, or (I - lower)^T Z = rhs if ``transpose``, lower strictly lower.

    Half-precision dtypes are solved in float32 (CPU has no bf16/fp16 triangular solve) and cast back.
    """
    dtype = rhs.dtype
    work = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    eye = torch.eye(lower.shape[-1], dtype=work, device=lower.device)
    mat = eye - lower.to(work)
    if transpose:
        mat = mat.transpose(-1, -2)
    z = torch.linalg.solve_triangular(mat, rhs.to(work), upper=transpose, unitriangular=True)
    return z.to(dtype)


def _check_square_last2(name: str, m: Tensor) -> int:
    if m.dim() < 2 or m.shape[-1] != m.shape[-2]:
        raise InputError(f"{name} must have shape [..., T, T], got {tuple(m.shape)}")
    if not m.is_floating_point():
        raise WrongInputType(f"{name} must be a floating-point tensor, got {m.dtype}")
    return m.shape[-1]


def check_lower(name: str, m: Tensor, strict: bool, atol: float = 0.0) -> None:
    """Raise ValueError if ``m`` [..., T, T] has entries above (or, if strict, on) the diagonal."""
    offset = 0 if strict else 1
    upper = torch.triu(m, diagonal=offset)
    bad = upper.abs().max().item() if upper.numel() else 0.0
    if bad > atol:
        what = "strictly lower triangular" if strict else "lower triangular"
        raise InputError(
            f"{name} must be {what} (causal); found |entry| = {bad:.3g} at or above the "
            f"{'diagonal' if strict else 'super-diagonal'}"
        )


@dataclass
class MixOperator:
    """Materialised mixing operator of one layer.

    Attributes:
        A: [B, H, T, T] or [B, H, G, T, T], lower triangular (direct input mixing).
        B: same shape as A, strictly lower triangular (recurrent output mixing).
        R: optional readout, same shape as A, lower triangular; None means identity.
    With a G axis the mixing matrix sums the G recurrences: M = sum_g R_g (I - B_g)^{-1} A_g.
    """

    A: Tensor
    B: Tensor
    R: Tensor | None = None

    def __post_init__(self) -> None:
        t = _check_square_last2("A", self.A)
        _check_square_last2("B", self.B)
        if self.A.shape != self.B.shape:
            raise InputError(f"A and B shapes differ: {tuple(self.A.shape)} vs {tuple(self.B.shape)}")
        if self.A.dtype != self.B.dtype or self.A.device != self.B.device:
            raise WrongInputType(
                f"A and B must share dtype/device, got {self.A.dtype}/{self.A.device} "
                f"and {self.B.dtype}/{self.B.device}"
            )
        if self.R is not None:
            _check_square_last2("R", self.R)
            if self.R.shape != self.A.shape:
                raise InputError(f"R shape {tuple(self.R.shape)} differs from A {tuple(self.A.shape)}")
        if self.A.dim() not in (4, 5):
            raise InputError(f"A must be [B, H, T, T] or [B, H, G, T, T], got {tuple(self.A.shape)}")
        if t > MAX_DENSE_T:
            raise InputError(
                f"T = {t} is too long to materialise densely (limit {MAX_DENSE_T}); use the chunked or recurrent mode"
            )

    def validate(self, atol: float = 0.0) -> "MixOperator":
        check_lower("A", self.A, strict=False, atol=atol)
        check_lower("B", self.B, strict=True, atol=atol)
        if self.R is not None:
            check_lower("R", self.R, strict=False, atol=atol)
        return self

    @property
    def has_state_axis(self) -> bool:
        return self.A.dim() == 5

    def mixing_matrix(self) -> Tensor:
        """M = sum_g R_g (I - B_g)^{-1} A_g, shape [B, H, T, T]."""
        m = solve_unit_lower(self.B, self.A)
        if self.R is not None:
            m = self.R @ m
        return m.sum(dim=2) if self.has_state_axis else m

    def apply(self, x: Tensor) -> Tensor:
        """Y = M X for x [B, T, H, V] -> [B, T, H, V], through the dense reference solver."""
        return solve_dense(self, x)


def solve_dense(op: MixOperator, x: Tensor, offset: Tensor | None = None) -> Tensor:
    """Dense reference: solve (I - B) Z = A X (+ offset) per head (and state channel), then Y = R Z.

    Args:
        op: the operator, A/B/R [B, H, T, T] or [B, H, G, T, T].
        x: [B, T, H, V] inputs (the values).
        offset: optional [B, T, H, V] known right-hand side, the contribution of an initial state
            (outputs of positions before the segment read through B); G = 1 operators only.
    Returns:
        y: [B, T, H, V].
    Cost O(T^2 V) per head, memory O(T^2). Differentiable, any float dtype.
    """
    if x.dim() != 4:
        raise InputError(f"x must be [B, T, H, V], got {tuple(x.shape)}")
    b, t, h, _ = x.shape
    if (op.A.shape[0], op.A.shape[1], op.A.shape[-1]) != (b, h, t):
        raise InputError(
            f"operator [B, H, T] = {(op.A.shape[0], op.A.shape[1], op.A.shape[-1])} does not "
            f"match x [B, T, H, V] = {tuple(x.shape)}"
        )
    if x.dtype != op.A.dtype or x.device != op.A.device:
        raise WrongInputType(f"x is {x.dtype}/{x.device} but the operator is {op.A.dtype}/{op.A.device}")
    xh = x.transpose(1, 2)  # [B, H, T, V]
    if op.has_state_axis:
        xh = xh.unsqueeze(2)  # [B, H, 1, T, V] broadcast over G
    rhs = op.A @ xh
    if offset is not None:
        if op.has_state_axis or offset.shape != x.shape:
            raise InputError(f"offset must be [B, T, H, V] = {tuple(x.shape)} on a G = 1 operator")
        rhs = rhs + offset.transpose(1, 2)
    z = solve_unit_lower(op.B, rhs)
    if op.R is not None:
        z = op.R @ z
    if op.has_state_axis:
        z = z.sum(dim=2)
    return z.transpose(1, 2)
