"""Decode facts of the structured mixer through real token-by-token decoding (issue targets)."""

from __future__ import annotations

import math

import pytest
import torch

from tokenmix.mixers import build_mixer


@torch.no_grad()
def decode(name: str, n: int) -> int:
    m = build_mixer(name, 8, n_heads=2)
    state = None
    for _ in range(n):
        _, state = m.step(torch.randn(1, 8), state)
    return state.peak_positions


def test_pow2_ce_decode_cache_is_ceil_log2():
    assert decode("pow2_ce", 2048) == 11 == math.ceil(math.log2(2048))


@pytest.mark.parametrize("n,expected", [(256, 13), (512, 19)])
def test_sq1_ce_decode_cache(n, expected):
    assert decode("sq1_ce", n) == expected


def test_cache_evicts_exactly_what_no_later_token_reads():
    m = build_mixer("pow2_ce", 8, n_heads=2)
    state = None
    for t in range(100):
        _, state = m.step(torch.randn(1, 8), state)
        assert state.positions.tolist() == m.pattern.needed(t + 1)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="coefficients"):
        build_mixer("pow2", 8, coefficients="bogus")
    with pytest.raises(ValueError, match="chunk_size"):
        build_mixer("pow2", 8, chunk_size=0)
    with pytest.raises(ValueError, match="unknown pattern"):
        build_mixer("pow2", 8, pattern="nope")
    with pytest.raises(ValueError, match="head_dim mismatch"):
        build_mixer("pow2", 10, n_heads=4)
    with pytest.raises(ValueError, match="n_heads"):
        build_mixer("pow2", 8, n_heads=0)
    with pytest.raises(ValueError, match="no config field"):
        build_mixer("pow2", 8, windw=3)
    with pytest.raises(ValueError, match="unknown mixer 'nope'; known mixers: .*pow2"):
        build_mixer("nope", 8)


def test_gate_mode_needs_enough_levels():
    m = build_mixer("pow2", 8, n_heads=2, coefficients="gate_softmax", max_levels=3)
    with pytest.raises(ValueError, match="max_levels"):
        m(torch.randn(1, 20, 8))


def test_user_supplied_pattern_plugs_in():
    m = build_mixer("pow2", 8, n_heads=2, pattern="f:3**k", cache_efficient=True, chunk_size=5).double()
    x = torch.randn(1, 40, 8, dtype=torch.float64)
    y_c, s_c = m(x)
    y_r, s_r = m(x, mode="recurrent")
    assert (y_c - y_r).abs().max() < 1e-12
    assert s_r.peak_positions == m.cache_positions(40)


@pytest.mark.parametrize(
    "name,coef", [("pow2", "softmax"), ("sq1_ce", "softmax"), ("first_order", "gate_softmax"), ("pow2_ce", "gate_l1")]
)
def test_16k_float32_extreme_coefficients_stay_finite(name, coef):
    """Saturated coefficients (alpha -> 0 or 1, one neighbour taking all the mass) over 16k tokens."""
    torch.manual_seed(0)
    m = build_mixer(name, 8, n_heads=2, coefficients=coef, chunk_size=128)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(60.0)
    x = torch.randn(1, 16384, 8, requires_grad=True)
    y, _ = m(x)
    y.square().mean().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


@torch.no_grad()
def test_exact_pattern_decode_step_appends_in_place():
    """A decode step of an exact pattern (O(n) cache) must not copy the cache: after the first
    step doubles the prefill's storage, later steps append into the same storage."""
    m = build_mixer("pow2", 8, n_heads=2)
    _, state = m(torch.randn(1, 2000, 8))
    _, state = m.step(torch.randn(1, 8), state)
    store = state.entries.store
    assert store.capacity >= 2 * 2000
    for _ in range(100):
        _, state = m.step(torch.randn(1, 8), state)
        assert state.entries.store is store
    assert state.positions.tolist() == list(range(2101))


@torch.no_grad()
@pytest.mark.parametrize("name", ["pow2", "sq1", "kth_order", "first_order"])
def test_decode_storage_grows_geometrically(name):
    """From an empty cache, N steps reallocate O(log N) times (exact) or every ~capacity / 2 steps
    with an O(window) copy (windows): O(1) amortised per step."""
    m = build_mixer(name, 8, n_heads=2)
    state, stores, n = None, set(), 600
    for t in range(n):
        _, state = m.step(torch.randn(1, 8), state)
        stores.add(id(state.entries.store))
        assert state.positions.tolist() == m.pattern.needed(t + 1)
    limit = 2 * math.log2(n) if m.pattern.max_levels is None else n / 4
    assert len(stores) <= limit, f"{name}: {len(stores)} storages for {n} steps"


@torch.no_grad()
@pytest.mark.parametrize("name", ["pow2", "pow2_ce", "kth_order"])
def test_branching_from_an_older_state(name):
    """Extending a state that was already extended (beam search, retries) copies first: both
    branches equal independent runs, and the older branch is left intact."""
    m = build_mixer(name, 8, n_heads=2).double()
    x = torch.randn(1, 40, 8, dtype=torch.float64)
    a, b = torch.randn(1, 8, dtype=torch.float64), torch.randn(1, 8, dtype=torch.float64)
    _, s0 = m(x)
    ya, sa = m.step(a, s0)
    kept = sa.values.clone()
    yb, sb = m.step(b, s0)  # branch from s0 again
    assert torch.equal(sa.values, kept)
    ya2, _ = m.step(a, sa)
    ref, _ = m(torch.cat([x, a[:, None], b[:, None]], 1)[:, [*range(40), 41]], mode="recurrent")
    assert torch.allclose(yb, ref[:, -1], atol=1e-12)
    ref_a, _ = m(torch.cat([x, a[:, None], a[:, None]], 1), mode="recurrent")
    assert torch.allclose(ya2, ref_a[:, -1], atol=1e-12)


@pytest.mark.parametrize("name", ["pow2", "pow2_ce", "sq1", "sq1_ce", "fenwick"])
def test_training_after_inference_mode_calls(name):
    """The structured mixers keep index tables and plans across calls; built during an
    inference-mode call (generation), they must still serve a later autograd forward."""
    from tokenmix.mixers import build_mixer

    if name == "fenwick":
        m = build_mixer("pow2", 16, n_heads=2, pattern="fenwick")
    else:
        m = build_mixer(name, 16, n_heads=2)
    x = torch.randn(2, 40, 16)
    for mode in m.modes:
        with torch.inference_mode():
            y_inf, _ = m(x, mode=mode)
        y, _ = m(x.clone().requires_grad_(), mode=mode)
        y.sum().backward()
        torch.testing.assert_close(y.detach(), y_inf.clone())


@pytest.mark.parametrize("name", ["sq1_ce", "sq1", "pow2"])
def test_gated_coefficients_default_slots_cover_long_sequences(name):
    """The default gate slots are sized from the pattern for GATED_LENGTH tokens: sq1_ce with gates
    runs past 1025 tokens (the old fixed 32 slots refused it), and a length beyond the slots is one line."""
    from tokenmix.mixers.structured import GATED_LENGTH

    torch.manual_seed(0)
    m = build_mixer(name, 8, n_heads=2, coefficients="gate_l1")
    assert m.levels == m.pattern.neighbor_table(GATED_LENGTH - 1, GATED_LENGTH).shape[1]
    x = torch.randn(1, 1100, 8)
    with torch.no_grad():
        y, _ = m(x)
    assert torch.isfinite(y).all()
    small = build_mixer(name, 8, n_heads=2, coefficients="gate_l1", max_levels=4)
    with pytest.raises(ValueError, match="raise max_levels"):
        small(torch.randn(1, 600, 8))
