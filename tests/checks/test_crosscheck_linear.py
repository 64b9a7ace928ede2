"""Independent cross-checks of the first-order linear-attention family, and its 16k stability.

The cross-checks themselves live in tokenmix/checks/linear_attention.py and state_space_model.py
(``tokenmix check`` runs the same functions): fla-core 0.6.0's naive references (naive_recurrent_
and naive_chunk_linear_attn, naive_retention with states via naive_recurrent_simple_gla,
naive_recurrent_gla, naive_recurrent_ and naive_chunk_simple_gla, and naive_recurrent_gla with one
head per channel for the diagonal SSM), float32, max relative error max|ours - ref| / max|ref| <= 1e-5, over
the ops (chunked and
recurrent, outputs and final states) and every mode of the mixers (two segments, so the state
carried between calls is checked too). The generic assertions over
them are in test_crosschecks.py. Our float64 equivalences live in test_mixer_matrix.py.

Also: 16k-token float32 stability of every mixer's chunked mode with extreme gates, and exactness
of the chunked op against the token loop at 16k.
"""

from __future__ import annotations

import math

import pytest
import torch

from tokenmix.checks.tolerances import FLOAT32_LONG_REL_TOL, max_rel_err
from tokenmix.mixers.registry import build_mixer
from tokenmix.ops.chunked_gla import chunked_gla
from tokenmix.ops.recurrent_gla import recurrent_gla

# ---------------------------------------------------------------- stability at 16k tokens, float32

STABLE_T = 16384


def _two_extremes(lo: float, hi: float, shape: tuple[int, ...]) -> torch.Tensor:
    """Each entry is lo or hi at random."""
    return torch.where(torch.rand(shape) < 0.5, torch.full(shape, lo), torch.full(shape, hi))


def _make_gates_extreme(name: str, m) -> None:
    """Decays jumping between ~0 (e^-100 and below) and ~1 (1 - 1e-8), per token and channel."""
    with torch.no_grad():
        if name == "gla":
            m.gate_up.bias.copy_(_two_extremes(-1600.0, 30.0, m.gate_up.bias.shape))  # /16: log decay -100 or ~0
            m.gate_up.weight.mul_(200.0)  # and the input moves the logits across both ends
        elif name in ("mamba2", "diag_ssm"):
            # exp(A_log) alternates 1e4 / 1e-4 over heads (mamba2) or states (diag_ssm), dt_bias 8 / -4 over
            # heads or channels: log decays down to -8e4 (decay 0) and up to -2e-6 (decay ~1)
            def alternate(p, even, odd):
                p.copy_(torch.where(torch.arange(p.numel()).view(p.shape) % 2 == 0, even, odd))

            alternate(m.A_log, math.log(1e4), math.log(1e-4))
            alternate(m.dt_bias, 8.0, -4.0)


@pytest.mark.parametrize("name", ["linear_attention", "retnet", "gla", "mamba2", "diag_ssm"])
def test_chunked_mode_is_stable_at_16k_with_extreme_gates(name):
    torch.manual_seed(0)
    m = build_mixer(name, 16, n_heads=2, **({"state_dim": 8} if name in ("mamba2", "diag_ssm") else {}))
    _make_gates_extreme(name, m)
    x = torch.randn(1, STABLE_T, 16, requires_grad=True)
    y, state = m(x, mode="chunked")
    assert torch.isfinite(y).all() and torch.isfinite(state.memory).all(), f"{name}: non-finite output or state"
    ((y * torch.randn_like(y)).mean() + state.memory.square().mean()).backward()
    assert torch.isfinite(x.grad).all(), f"{name}: non-finite input gradient"
    for pname, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name}: non-finite gradient of {pname}"


@pytest.mark.parametrize("per_key", [False, True], ids=["per_head", "per_key"])
def test_chunked_op_is_exact_at_16k_with_extreme_gates(per_key):
    """The chunked op with decays e^-100 / 1 - 1e-8 equals the token loop at 16k tokens (float32)."""
    torch.manual_seed(0)
    h, dk, dv = 2, 8, 8
    q, k, v = torch.randn(1, STABLE_T, h, dk), torch.randn(1, STABLE_T, h, dk), torch.randn(1, STABLE_T, h, dv)
    g = _two_extremes(-100.0, -1e-8, (1, STABLE_T, h, dk) if per_key else (1, STABLE_T, h))
    o, s = chunked_gla(q, k, v, g, dk**-0.5, chunk_size=32)
    o_ref, s_ref = recurrent_gla(q, k, v, g, dk**-0.5)
    errors = max_rel_err(o, o_ref), max_rel_err(s, s_ref)
    assert max(errors) <= FLOAT32_LONG_REL_TOL, errors
