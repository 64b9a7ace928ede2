"""Independent cross-checks of attention, local attention, ChaCAL and H-LRU, and their other properties.

The cross-checks themselves live in tokenmix/checks/attention.py, dense_recurrence.py and
gated_linear_recurrence.py (``tokenmix check`` runs the same functions): fla-core's
``naive_parallel_attn`` and torch SDPA for the attention mixers, the explicit dense-inverse formula
for ChaCAL, a per-channel loop for H-LRU, each over every mode, whole and in uneven pieces. The
generic assertions over them are in test_crosschecks.py; this file keeps the other properties.
"""

from __future__ import annotations

import pytest
import torch

from mixer_helpers import small_mixer
from tokenmix.checks.common import identity_readout
from tokenmix.checks.tolerances import FLOAT64_EXACT, assert_close
from tokenmix.mixers.registry import build_mixer


# ---------------------------------------------------------------- local attention
def test_local_attention_window_of_one_returns_the_value():
    m = small_mixer("local_attention", window=1, dtype=torch.float32)
    identity_readout(m)
    x = torch.randn(2, 11, 12)
    _, _, v = m._project(x)
    with torch.no_grad():
        for mode in m.modes:
            assert_close(m(x, mode=mode)[0], v.flatten(2), 0.0, f"{mode}: a window of one position returns the value")


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
def test_chacal_with_zero_gamma_is_attention():
    attn = small_mixer("attention")
    chain = small_mixer("chacal", gamma=0.0)
    chain.load_state_dict({**attn.state_dict(), "gamma_logit": chain.gamma_logit.detach()})
    x = torch.randn(2, 13, 12, dtype=torch.float64)
    # gamma = 0 starts at the floor 1e-9, so paths of length >= 2 weigh about 1e-9
    assert_close(chain(x)[0], attn(x)[0], 1e-8, "chacal with gamma = 0 vs attention")


# ---------------------------------------------------------------- H-LRU
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
@pytest.mark.parametrize(
    "name,field,value",
    [
        ("local_attention", "window", 0),
        ("local_attention", "window", -3),
        ("chacal", "gamma", -0.1),
        ("chacal", "gamma", 1.0),
        ("chacal", "chunk_size", 0),
        ("hlru", "order", 0),
        ("hlru", "normalization", "relu"),
        ("hlru", "chunk_size", -1),
    ],
)
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
