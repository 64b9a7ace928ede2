"""Independent cross-checks of attention, local attention, ChaCAL and H-LRU.

References nobody here wrote (fla-core's ``naive_parallel_attn``, torch SDPA) or written from the
defining formula in this file (ChaCAL's dense inverse, H-LRU's per-channel loop). The attention
mixers are compared through an identity output projection, so the mixer's output is the per-head
y_t itself; H-LRU is compared end to end with the readout.
"""
from __future__ import annotations

import importlib.util
import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import small_mixer
from tolerances import FLOAT64_EXACT, assert_close
from tokenmix.core.registry import build_mixer

FLOAT32_ATOL = 1e-5


def fla_naive(name: str):
    """Load ``fla/ops/<name>/naive.py`` by file path (importing fla.ops would need Triton)."""
    import fla

    path = os.path.join(os.path.dirname(fla.__file__), "ops", name, "naive.py")
    modname = "fla_naive_" + name.replace("/", "_")
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    return mod


def _identity_readout(m) -> None:
    with torch.no_grad():
        m.out.weight.copy_(torch.eye(m.out.weight.shape[0], dtype=m.out.weight.dtype))


def _qkv(m, x):
    b, t, _ = x.shape
    return m.qkv(x).view(b, t, 3, m.n_heads, m.head_dim).unbind(2)


def _run_in_pieces(m, x, mode, sizes):
    """Feed x in pieces of the given sizes, passing the state along; returns the concatenated output."""
    ys, state, t0 = [], None, 0
    for size in sizes:
        y, state = m(x[:, t0 : t0 + size], state, mode=mode)
        ys.append(y)
        t0 += size
    return torch.cat(ys, 1)


# ---------------------------------------------------------------- softmax attention
def test_attention_matches_fla_naive_and_sdpa():
    h, k, t = 3, 16, 37
    m = build_mixer("attention", h * k, n_heads=h)
    _identity_readout(m)
    x = torch.randn(2, t, h * k)
    with torch.no_grad():
        q, kk, v = _qkv(m, x)
        ref_fla = fla_naive("attn").naive_parallel_attn(q, kk, v)[0].flatten(2)
        ref_sdpa = F.scaled_dot_product_attention(q.transpose(1, 2), kk.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=True).transpose(1, 2).flatten(2)
        assert_close(ref_fla, ref_sdpa, FLOAT32_ATOL, "fla naive vs SDPA (the two references)")
        for mode in m.modes:
            assert_close(m(x, mode=mode)[0], ref_fla, FLOAT32_ATOL, f"attention {mode} vs fla naive_parallel_attn")
            # a KV-cache prefix: the queries of later pieces are offset from the keys
            assert_close(_run_in_pieces(m, x, mode, [5, 1, 20, 11]), ref_fla, FLOAT32_ATOL,
                         f"attention {mode} in pieces vs fla naive_parallel_attn")


# ---------------------------------------------------------------- local attention
@pytest.mark.parametrize("window", [1, 4, 16, 50])
def test_local_attention_matches_fla_window(window):
    # fla: query i attends to keys in [i - window_size + 1, i], i.e. window_size positions including
    # itself, which is this project's w
    h, k, t = 2, 8, 37
    m = build_mixer("local_attention", h * k, n_heads=h, window=window)
    _identity_readout(m)
    x = torch.randn(2, t, h * k)
    with torch.no_grad():
        q, kk, v = _qkv(m, x)
        ref = fla_naive("attn").naive_parallel_attn(q, kk, v, window_size=window)[0].flatten(2)
        for mode in m.modes:
            assert_close(m(x, mode=mode)[0], ref, FLOAT32_ATOL, f"local w={window} {mode} vs fla")
            assert_close(_run_in_pieces(m, x, mode, [3, 1, 17, 16]), ref, FLOAT32_ATOL,
                         f"local w={window} {mode} in pieces vs fla")
        if window == 1:
            assert_close(m(x)[0], v.flatten(2), 0.0, "a window of one position returns the value itself")


def test_local_attention_with_window_covering_the_sequence_is_attention():
    full = small_mixer("attention")
    local = small_mixer("local_attention", window=20)
    local.load_state_dict(full.state_dict())
    x = torch.randn(2, 13, 12, dtype=torch.float64)
    assert_close(local(x)[0], full(x)[0], FLOAT64_EXACT, "local attention with w >= T vs attention")


def test_local_attention_cache_holds_the_window():
    m = small_mixer("local_attention", window=5)
    x = torch.randn(2, 11, 12, dtype=torch.float64)
    _, state = m(x)
    q, k, v = m._project(x)
    assert_close(state.keys, k[:, -4:], 0.0, "cache keys = the last w - 1 keys")
    assert_close(state.values, v[:, -4:], 0.0, "cache values = the last w - 1 values")
    assert [m.cache_positions(n) for n in (1, 2, 5, 6, 100)] == [0, 1, 4, 4, 4]


# ---------------------------------------------------------------- ChaCAL
def _chacal_reference(m, x):
    """(1 - gamma) P (I - gamma P)^{-1} V per head with an explicit dense inverse, float64."""
    q, k, v = (z.transpose(1, 2) for z in _qkv(m, x))  # [B, H, T, K]
    t = x.shape[1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(m.head_dim)
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    p = torch.softmax(scores.masked_fill(future, float("-inf")), -1)
    g = m.gamma[:, None, None]
    eye = torch.eye(t, dtype=x.dtype)
    y = (1 - g) * p @ torch.linalg.inv(eye - g * p) @ v
    return y.transpose(1, 2).flatten(2)


def test_chacal_equals_dense_inverse_formula():
    h, k, t = 3, 4, 23
    m = build_mixer("chacal", h * k, n_heads=h, chunk_size=5).double()
    _identity_readout(m)
    with torch.no_grad():  # one head near each end of [0, 1) and one in the middle
        m.gamma_logit.copy_(torch.logit(torch.tensor([0.05, 0.5, 0.999], dtype=torch.float64)))
    x = torch.randn(2, t, h * k, dtype=torch.float64)
    with torch.no_grad():
        ref = _chacal_reference(m, x)
        for mode in m.modes:
            assert_close(m(x, mode=mode)[0], ref, 1e-9, f"chacal {mode} vs (1-g) P (I - gP)^-1 V")
            assert_close(_run_in_pieces(m, x, mode, [4, 1, 9, 9]), ref, 1e-9, f"chacal {mode} in pieces")


def test_chacal_with_zero_gamma_is_attention():
    attn = small_mixer("attention")
    chain = small_mixer("chacal", gamma=0.0)
    chain.load_state_dict({**attn.state_dict(), "gamma_logit": chain.gamma_logit.detach()})
    x = torch.randn(2, 13, 12, dtype=torch.float64)
    # gamma = 0 starts at the floor 1e-9, so paths of length >= 2 weigh about 1e-9
    assert_close(chain(x)[0], attn(x)[0], 1e-8, "chacal with gamma = 0 vs attention")


# ---------------------------------------------------------------- H-LRU
def _hlru_reference(m, x):
    """Per-channel loop over the H-LRU recurrence and readout, written from the formula."""
    b_sz, t, _ = x.shape
    order, n = m.config.order, m.channels
    wv, wg, bg, wo = m.v_proj.weight, m.gates.weight, m.gates.bias, m.out.weight
    out = torch.zeros(b_sz, t, wo.shape[0], dtype=x.dtype)
    for b in range(b_sz):
        z = [[0.0] * t for _ in range(n)]
        for s in range(t):
            feats = []
            for c in range(n):
                rows = [slot * n + c for slot in range(order + 1)]  # gate rows are slot-major
                logits = wg[rows] @ x[b, s] + bg[rows]
                if m.config.normalization == "softmax":
                    g = torch.exp(logits - logits.max())
                    g = g / g.sum()
                else:
                    g = torch.tanh(logits)
                    g = g / (g.abs().sum() + 1e-6)
                zc = g[order] * (wv[c] @ x[b, s])
                for lag in range(1, order + 1):
                    if s - lag >= 0:
                        zc = zc + g[lag - 1] * z[c][s - lag]
                z[c][s] = zc
                feats += [z[c][s - lag] if s - lag >= 0 else torch.zeros((), dtype=x.dtype) for lag in range(order)]
            out[b, s] = wo @ torch.stack(feats)
    return out


@pytest.mark.parametrize("order,normalization", [(1, "softmax"), (2, "l1"), (4, "softmax"), (3, "l1")])
def test_hlru_matches_per_channel_loop(order, normalization):
    m = small_mixer("hlru", d_model=6, n_heads=2, order=order, normalization=normalization)
    with torch.no_grad():  # larger gate logits than the default init, so the gates are far from uniform
        m.gates.weight.mul_(4.0)
        m.gates.bias.normal_(0.0, 1.0)
    x = torch.randn(2, 11, 6, dtype=torch.float64)
    with torch.no_grad():
        ref = _hlru_reference(m, x)
        for mode in m.modes:
            assert_close(m(x, mode=mode)[0], ref, FLOAT64_EXACT, f"hlru m={order} {normalization} {mode} vs loop")
            assert_close(_run_in_pieces(m, x, mode, [2, 1, 5, 3]), ref, FLOAT64_EXACT,
                         f"hlru m={order} {normalization} {mode} in pieces vs loop")


def test_hlru_operator_is_banded_with_the_gates():
    m = small_mixer("hlru", order=2)
    x = torch.randn(1, 7, 12, dtype=torch.float64)
    op = m.materialize(x)
    assert op.B.shape == (1, m.channels, 7, 7)
    assert torch.tril(op.B, -3).abs().max() == 0, "B reaches further back than the order"
    assert (torch.diagonal(op.B, -1) != 0).all() and (torch.diagonal(op.B, -2) != 0).all()
    # softmax gates: each row of [A | B] is a convex combination (sums to 1 once all m lags exist)
    row_sums = op.A.sum(-1) + op.B.sum(-1)
    assert_close(row_sums[..., 2:], torch.ones_like(row_sums[..., 2:]), 1e-12, "row sums of [A | B]")


# ---------------------------------------------------------------- configuration
@pytest.mark.parametrize("name,field,value", [
    ("local_attention", "window", 0), ("local_attention", "window", -3),
    ("chacal", "gamma", -0.1), ("chacal", "gamma", 1.0), ("chacal", "chunk_size", 0),
    ("hlru", "order", 0), ("hlru", "normalization", "relu"), ("hlru", "chunk_size", -1),
])
def test_invalid_config_names_the_field(name, field, value):
    with pytest.raises(ValueError, match=field):
        build_mixer(name, 12, **{field: value})


def test_accounting_formulas():
    h, k = 2, 6
    attn, local = small_mixer("attention"), small_mixer("local_attention", window=4)
    chain, lru = small_mixer("chacal"), small_mixer("hlru", order=3)
    assert [attn.cache_positions(n) for n in (1, 2, 37)] == [0, 1, 36]
    assert attn.state_size(37) == 36 * h * 2 * k and local.state_size(37) == 3 * h * 2 * k
    assert chain.state_size(37) == 36 * h * 3 * k
    assert [lru.cache_positions(n) for n in (1, 3, 4, 37)] == [0, 2, 3, 3] and lru.state_size(37) == 3 * h * k
    assert attn.flops_per_token(10) == h * 10 * 2 * k and local.flops_per_token(10) == h * 4 * 2 * k
    assert lru.flops_per_token(10) == h * k * 4
    assert (attn.time_complexity, attn.cache_complexity) == ("O(n)", "O(n)")
    assert (local.time_complexity, local.cache_complexity) == ("O(w)", "O(w)")
    assert (chain.time_complexity, chain.cache_complexity) == ("O(n)", "O(n)")
    assert (lru.time_complexity, lru.cache_complexity) == ("O(m)", "O(m)")
