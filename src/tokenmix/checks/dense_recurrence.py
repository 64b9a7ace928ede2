"""Cross-checks of the dense recurrence ChaCAL against its defining formula.

ChaCAL's outputs are (1 - gamma) P (I - gamma P)^{-1} V per head (P the causal softmax attention
matrix): ``chacal_dense_inverse`` writes that formula with an explicit dense inverse, independent of
the mixer's chunked solve. In float64; metric, stated in the label: max abs error. Every mode runs
whole and in uneven pieces with the state passed along, through an identity output projection.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tokenmix.checks import register_crosscheck
from tokenmix.checks.common import mixer_case, outputs_in_pieces
from tokenmix.checks.tolerances import FLOAT64_ABS_TOL, max_abs_err
from tokenmix.mixers.base import Mixer

CHACAL_GAMMAS = (0.05, 0.5, 0.999)  # one head near each end of [0, 1) and one in the middle


def chacal_dense_inverse(m: Mixer, x: Tensor) -> Tensor:
    """(1 - gamma) P (I - gamma P)^{-1} V per head, with an explicit dense inverse.

    Args:
        m: a ChaCAL mixer (its q, k, v projections and gamma [H] are used; not its output projection).
        x: [B, T, D].
    Returns:
        [B, T, H·V], the per-head outputs before the output projection.
    """
    b, t, _ = x.shape
    q, k, v = (z.transpose(1, 2) for z in m.qkv(x).view(b, t, 3, m.n_heads, m.head_dim).unbind(2))  # [B, H, T, K]
    scores = q @ k.transpose(-1, -2) / math.sqrt(m.head_dim)
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    p = torch.softmax(scores.masked_fill(future, float("-inf")), -1)  # [B, H, T, T]
    g = m.gamma[:, None, None]
    eye = torch.eye(t, dtype=x.dtype)
    y = (1 - g) * p @ torch.linalg.inv(eye - g * p) @ v
    return y.transpose(1, 2).flatten(2)


@register_crosscheck(
    "chacal",
    "dense-inverse formula (1-g) P (I-gP)^-1 V",
    "float64 max abs",
    FLOAT64_ABS_TOL,
    per_mode=(".output", ".pieces"),
)
def chacal_vs_dense_inverse() -> dict[str, float]:
    """Every mode, whole and in pieces (chunk size 5), against ``chacal_dense_inverse``."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        m, x = mixer_case("chacal", 0, heads=3, head_dim=4, t=23, dtype=torch.float64, chunk_size=5)
        m.gamma_logit.copy_(torch.logit(torch.tensor(CHACAL_GAMMAS, dtype=torch.float64)))
        return outputs_in_pieces(m, x, chacal_dense_inverse(m, x), (4, 1, 9, 9), max_abs_err)
