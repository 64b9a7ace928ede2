"""Independent cross-checks of the delta-rule and log-linear ops against fla-core's naive references.

fla's ``naive.py`` files (fla-core 0.6.0, pure PyTorch) are loaded by file path, since ``fla.ops``
itself needs Triton. They compute in float32, so the comparisons are float32 at a relative
tolerance of 1e-5 (max abs error over max abs reference); our own float64 equivalences live in
test_mixer_matrix.py and test_chunked_delta_log_linear.py. Layout differences handled here:
fla's delta_rule is head-first [B, H, T, K]; its naive_recurrent_gated_delta_rule takes
(beta, g) but naive_chunk_gated_delta_rule takes (g, beta); naive_log_linear_attn defaults to
scale 1.0 and wants exactly ceil(log2 T) + 1 level scales.

Also: 16k-token float32 stability of the chunked forms with extreme gates.
"""
from __future__ import annotations

import importlib.util
import math
import os
import sys

import fla  # fla-core, a dev dependency: the independent references
import pytest
import torch
import torch.nn.functional as F

from tokenmix.ops.chunked_delta import chunked_delta_rule, recurrent_delta_rule
from tokenmix.ops.chunked_log_linear import (chunked_log_linear_attention, fenwick_level_matrix, n_levels,
                                             recurrent_log_linear_attention)
from tokenmix.patterns import fenwick_level

REL_TOL = 1e-5


def fla_naive(name: str):
    """Load ``fla/ops/<name>/naive.py`` by path (``fla.ops`` imports Triton)."""
    path = os.path.join(os.path.dirname(fla.__file__), "ops", name, "naive.py")
    modname = "fla_naive_" + name.replace("/", "_")
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    return mod


def assert_rel(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    err = ((actual - expected).abs().max() / expected.abs().max()).item()
    assert err <= REL_TOL, f"{what}: relative max error {err:.2e} > {REL_TOL:.0e}"


def head_first(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2).contiguous()


def delta_inputs(t: int = 50, b: int = 2, h: int = 3, dk: int = 16, dv: int = 12):
    torch.manual_seed(0)
    q = torch.randn(b, t, h, dk)
    k = F.normalize(torch.randn(b, t, h, dk), dim=-1)  # fla's delta refs leave normalisation to the caller
    v = torch.randn(b, t, h, dv)
    beta = torch.rand(b, t, h)
    g = F.logsigmoid(2 * torch.randn(b, t, h))
    s0 = torch.randn(b, h, dk, dv)
    return q, k, v, beta, g, s0


def test_delta_rule_matches_fla_recurrence():
    q, k, v, beta, _, s0 = delta_inputs()
    ref = fla_naive("delta_rule")
    o_ref, s_ref = ref.delta_rule_recurrence(head_first(q), head_first(k), head_first(v), head_first(beta),
                                             initial_state=s0.clone(), output_final_state=True)
    o_ref = head_first(o_ref)  # back to [B, T, H, V]
    for chunk in (16, 64):  # 50 is a multiple of neither
        o, s = chunked_delta_rule(q, k, v, beta, None, None, s0, chunk)
        assert_rel(o, o_ref, f"chunked delta rule (C={chunk}) output")
        assert_rel(s, s_ref, f"chunked delta rule (C={chunk}) final state")
    o, s = recurrent_delta_rule(q, k, v, beta, None, None, s0)
    assert_rel(o, o_ref, "recurrent delta rule output")
    assert_rel(s, s_ref, "recurrent delta rule final state")


def test_gated_delta_rule_matches_fla_recurrent_and_chunk():
    q, k, v, beta, g, s0 = delta_inputs()
    dk = q.shape[-1]
    ref = fla_naive("gated_delta_rule")
    o_rec, s_rec = ref.naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale=dk ** -0.5,  # (beta, g)
                                                        initial_state=s0.clone(), output_final_state=True)
    o_chk, s_chk = ref.naive_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=16, scale=dk ** -0.5,  # (g, beta)
                                                    initial_state=s0.clone(), output_final_state=True)
    o, s = chunked_delta_rule(q, k, v, beta, g, dk ** -0.5, s0, 16)
    for name, o_ref, s_ref in (("naive_recurrent", o_rec, s_rec), ("naive_chunk", o_chk, s_chk)):
        assert_rel(o, o_ref, f"chunked gated delta rule vs fla {name} output")
        assert_rel(s, s_ref, f"chunked gated delta rule vs fla {name} final state")
    o, s = recurrent_delta_rule(q, k, v, beta, g, dk ** -0.5, s0)
    assert_rel(o, o_rec, "recurrent gated delta rule output")
    assert_rel(s, s_rec, "recurrent gated delta rule final state")


@pytest.mark.parametrize("t", [37, 64, 100])
def test_log_linear_matches_fla_naive(t):
    torch.manual_seed(t)
    b, h, dk, dv = 2, 3, 16, 12
    q, k = torch.randn(b, t, h, dk), torch.randn(b, t, h, dk)
    v = torch.randn(b, t, h, dv)
    g = F.logsigmoid(torch.randn(b, t, h) + 3)
    n_lam = math.ceil(math.log2(t)) + 1  # what fla's construct_H_matrix iterates over
    assert n_lam >= n_levels(t)
    lam = F.softplus(torch.randn(b, t, h, n_lam))
    scale = dk ** -0.5  # fla's default is 1.0: pass it explicitly
    o_ref = fla_naive("log_linear_attn").naive_log_linear_attn(q, k, v, g, lam, scale=scale)
    o_rec, s_rec = recurrent_log_linear_attention(q, k, v, g, lam, scale)
    assert_rel(o_rec, o_ref, f"recurrent log-linear (T={t}) output")
    for chunk in (8, 64):
        o, s = chunked_log_linear_attention(q, k, v, g, lam, scale, chunk_size=chunk)
        assert_rel(o, o_ref, f"chunked log-linear (T={t}, C={chunk}) output")
        # fla's naive reference has no state; the Fenwick states must equal the decode reference's
        assert_rel(s, s_rec, f"chunked log-linear (T={t}, C={chunk}) final Fenwick state")


def test_fenwick_level_equals_fla_level_mask():
    """tokenmix.patterns.fenwick_level (and our vectorised matrix) vs fla's construct_level_mask."""
    ref = fla_naive("log_linear_attn")
    for t in (1, 2, 5, 8, 13, 37, 64):
        n_lam = math.ceil(math.log2(t)) + 1 if t > 1 else 1
        fla_lvl = torch.full((t, t), -1, dtype=torch.long)
        for lvl in range(n_lam):
            one_hot = torch.zeros(n_lam, t)
            one_hot[lvl] = 1.0
            fla_lvl[ref.construct_level_mask(lvl, one_hot) != 0] = lvl
        ours = torch.tensor([[fenwick_level(i, j) if j <= i else -1 for j in range(t)] for i in range(t)])
        assert torch.equal(ours, fla_lvl), f"fenwick_level differs from fla's level mask at T={t}"
        assert torch.equal(fenwick_level_matrix(0, t), fla_lvl)


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
    _assert_finite_fwd_bwd(lambda: chunked_delta_rule(q, F.normalize(k_raw, dim=-1), v, beta, g),
                           leaves, "chunked delta rule")


def test_chunked_log_linear_is_stable_at_16k_with_extreme_gates():
    torch.manual_seed(0)
    shape = (1, STABLE_T, STABLE_H)
    q, k, v = (torch.randn(*shape, STABLE_K, requires_grad=True) for _ in range(3))
    g = _two_extremes(-1e-6, -50.0, shape).requires_grad_()
    lam = _two_extremes(1e-4, 10.0, (*shape, n_levels(STABLE_T))).requires_grad_()
    _assert_finite_fwd_bwd(lambda: chunked_log_linear_attention(q, k, v, g, lam, STABLE_K ** -0.5),
                           {"q": q, "k": k, "v": v, "g": g, "lambda": lam}, "chunked log-linear")
