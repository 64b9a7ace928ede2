"""Independent cross-checks of the delta-rule and log-linear ops and mixers, and their 16k stability.

The cross-checks themselves live in tokenmix/checks/delta_rule.py and log_linear_attention.py
(``tokenmix check`` runs the same functions): fla-core 0.6.0's naive references
(delta_rule_recurrence, naive_recurrent_ and naive_chunk_gated_delta_rule, naive_log_linear_attn,
construct_level_mask), float32, max relative error max|ours - ref| / max|ref| <= 1e-5, over the ops
and every mode of the mixers. The generic assertions over them are in test_crosschecks.py. Our own
float64 equivalences live in test_mixer_matrix.py and tests/ops/test_chunked_delta.py.

Also: 16k-token float32 stability of the chunked forms with extreme gates.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tokenmix.ops.chunked_delta import chunked_delta_rule
from tokenmix.ops.chunked_log_linear import chunked_log_linear_attention, n_levels

# ---------------------------------------------------------------- stability at 16k tokens, float32

STABLE_T, STABLE_H, STABLE_K = 16384, 2, 16


def _two_extremes(lo: float, hi: float, shape: tuple[int, ...]) -> torch.Tensor:
    """Each entry is lo or hi at random: gates jumping between both ends of their range."""
    return torch.where(torch.rand(shape) < 0.5, torch.full(shape, lo), torch.full(shape, hi))


def _assert_finite_fwd_bwd(run, leaves: dict[str, torch.Tensor], what: str) -> None:
    o, s = run()
    assert torch.isfinite(o).all(), f"{what}: non-finite output"
    assert torch.isfinite(s).all(), f"{what}: non-finite final state"
    ((o * torch.randn_like(o)).sum() + (s * torch.randn_like(s)).sum()).backward()
    for name, leaf in leaves.items():
        assert leaf.grad is not None and torch.isfinite(leaf.grad).all(), f"{what}: non-finite d{name}"


@pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated_deltanet"])
def test_chunked_delta_rule_is_stable_at_16k_with_extreme_gates(gated):
    torch.manual_seed(0)
    shape = (1, STABLE_T, STABLE_H)
    q = torch.randn(*shape, STABLE_K, requires_grad=True)
    k_raw = torch.randn(*shape, STABLE_K, requires_grad=True)
    v = torch.randn(*shape, STABLE_K, requires_grad=True)
    beta = _two_extremes(1e-4, 2 - 1e-4, shape).requires_grad_()  # allow_neg_eigval range (0, 2)
    g = _two_extremes(-1e-6, -50.0, shape).requires_grad_() if gated else None  # decay ~1 and ~2e-22
    leaves = {"q": q, "k": k_raw, "v": v, "beta": beta, **({"g": g} if gated else {})}
    _assert_finite_fwd_bwd(
        lambda: chunked_delta_rule(q, F.normalize(k_raw, dim=-1), v, beta, g), leaves, "chunked delta rule"
    )


def test_chunked_log_linear_is_stable_at_16k_with_extreme_gates():
    torch.manual_seed(0)
    shape = (1, STABLE_T, STABLE_H)
    q, k, v = (torch.randn(*shape, STABLE_K, requires_grad=True) for _ in range(3))
    g = _two_extremes(-1e-6, -50.0, shape).requires_grad_()
    lam = _two_extremes(1e-4, 10.0, (*shape, n_levels(STABLE_T))).requires_grad_()
    _assert_finite_fwd_bwd(
        lambda: chunked_log_linear_attention(q, k, v, g, lam, STABLE_K**-0.5),
        {"q": q, "k": k, "v": v, "g": g, "lambda": lam},
        "chunked log-linear",
    )
