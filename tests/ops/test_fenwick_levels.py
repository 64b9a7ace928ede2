"""``ops/fenwick_levels.bit_length``: exact for every value below its host bound, and the loop count
comes from that bound alone (a device tensor is never read back to decide when to stop)."""

from __future__ import annotations

import pytest
import torch

from tokenmix.ops.fenwick_levels import bit_length, fenwick_level_matrix, initial_level_map
from tokenmix.patterns import fenwick_level


@pytest.mark.parametrize("bits", [0, 1, 5, 13])
def test_bit_length_equals_int_bit_length_below_the_bound(bits):
    x = torch.arange(1 << bits)
    assert bit_length(x, bits).tolist() == [int(v).bit_length() for v in range(1 << bits)]


def test_level_maps_equal_the_scalar_level_at_an_unaligned_start():
    start, t = 37, 29
    lvl = fenwick_level_matrix(start, t)
    want = [[fenwick_level(start + i, start + j) if j <= i else -1 for j in range(t)] for i in range(t)]
    assert lvl.tolist() == want
    init = initial_level_map(start, t, 6)
    assert init.tolist() == [[max(l, ((start + i) ^ start).bit_length()) for l in range(1, 7)] for i in range(t)]


def test_bit_length_runs_on_a_device_without_data():
    """On ``meta`` any read of the values raises: the loop must not depend on them."""
    out = bit_length(torch.arange(100).to("meta"), 7)
    assert out.shape == (100,) and out.device.type == "meta"
