"""The packed-batch representation (core/packing.py): conversions to and from the other libraries'
conventions agree, and bad boundaries are one clear error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tokenmix.core.errors import InputError
from tokenmix.core.packing import Packing, as_packing
from tokenmix.mixers.registry import build_mixer
from tokenmix.models import MixerModel, ModelConfig


def test_conversions_round_trip():
    p = Packing.from_lengths([[3, 1, 4], [8], [1, 1, 6]])
    assert p.starts.tolist()[0] == [0, 0, 0, 3, 4, 4, 4, 4]
    assert p.documents(0) == [(0, 3), (3, 4), (4, 8)] and p.documents(1) == [(0, 8)]
    assert p.cu_seqlens().tolist() == [0, 3, 4, 8, 16, 17, 18, 24]
    for other in (
        Packing.from_cu_seqlens(p.cu_seqlens(), 3, 8),
        Packing.from_position_ids(p.position_ids()),
        Packing.from_resets(p.boundaries),
        Packing.from_document_ids(torch.cumsum(p.boundaries, 1)),
    ):
        assert torch.equal(other.starts, p.starts)
    vis = p.visible()
    assert vis[0, 5].tolist() == [False] * 4 + [True, True, False, False]  # document [4, 8), causal
    assert not p.trivial and Packing.from_lengths([[8], [8]]).trivial
    assert as_packing(Packing.from_lengths([[8]]), 1, 8) is None  # one document per row: unpacked
    assert p.segment(2, 6).starts.tolist()[0] == [0, 1, 2, 2]


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda: Packing.from_lengths([[3, 4]], 8), "sum to 7"),
        (lambda: Packing.from_lengths([[3, 0, 5]]), "positive"),
        (lambda: Packing.from_cu_seqlens([0, 3, 3, 8], 1, 8), "strictly increasing"),
        (lambda: Packing.from_cu_seqlens([0, 5, 16], 2, 8), "crosses the end of row 0"),
        (lambda: Packing.from_cu_seqlens([0, 4, 7], 1, 8), "end at B x T = 8"),
        (lambda: Packing.from_position_ids(torch.tensor([[0, 1, 2, 1]])), "count up by one"),
        (lambda: Packing(torch.tensor([[0, 0, 1, 1]])), "only where a document starts"),
        (lambda: Packing(torch.tensor([[0, 0, 2, 1]])), "must not decrease"),
        (lambda: Packing(torch.tensor([[0, 2, 2, 2]])), r"in \[0, t\]"),
        (lambda: as_packing(Packing.from_lengths([[2, 2]]), 2, 4), r"covers \[B, T\] = \[1, 4\]"),
    ],
)
def test_bad_boundaries_are_one_clear_error(make, needle):
    with pytest.raises(ValueError, match=needle):
        make()


BAD_LENGTHS = [
    [[2.5, 5.5]],  # silently truncated to [2, 5] before
    [[2.0, 6.0]],
    [[float("nan")]],
    [[float("inf")]],
    [[2**70]],
    [[10**12]],  # a 1 TB allocation before
    [[4, 4], [2**40]],
    "3,5",
    None,
    {"a": 1},
    [3, 5],  # a row that is no list
    [[1, [2]]],
    [["3", "5"]],
    [[True, 7]],
    torch.tensor([[1.5, 6.5]]),
]


@pytest.mark.parametrize("lengths", BAD_LENGTHS, ids=[repr(v)[:30] for v in BAD_LENGTHS])
def test_document_lengths_that_are_no_counts_are_one_input_error(lengths):
    """Sizes that are not positive integers, or a packing that cannot fit in memory, are InputError
    (one line), never a truncation, a TypeError / OverflowError / RuntimeError or a huge allocation."""
    with pytest.raises(InputError) as err:
        Packing.from_lengths(lengths)
    assert type(err.value) is InputError and "\n" not in str(err.value)
    with pytest.raises(InputError):
        Packing.from_lengths([[4, 4]], length=8.0)


def test_integer_lengths_of_any_kind_are_taken():
    want = [[0, 0, 0, 3, 3, 3, 3, 3], [0, 0, 0, 0, 0, 0, 0, 0]]
    assert Packing.from_lengths([[3, 5], [8]]).starts.tolist() == want
    assert Packing.from_lengths(torch.tensor([[3, 5], [4, 4]])).starts.tolist()[0] == want[0]
    assert Packing.from_lengths([[np.int64(3), np.int32(5)]]).starts.tolist() == [want[0]]
    assert Packing.from_lengths([[1, 2], [3]]).shape == (2, 3)  # rows may hold different counts


@pytest.mark.parametrize(
    "flags",
    [torch.tensor([[0.0, 0.5, 0.0, 0.0]]), torch.tensor([[0, 1, 0, 0]]), [[0.0, 1.0, 0.0, 0.0]], [[True], [1, 2]], "x"],
    ids=["float", "int", "float list", "ragged", "str"],
)
def test_start_flags_must_be_bool_in_forward_as_in_step(flags):
    """``forward(packing=...)`` takes bool start flags only (0.5 counted as a start before), as
    ``step(reset=...)`` does; a ragged list or a string is one InputError too."""
    model = MixerModel(ModelConfig(vocab_size=50, d_model=16, n_heads=2, layers="pow2"))
    with pytest.raises(InputError, match="bool"):
        model(torch.randint(0, 50, (1, 4)), packing=flags)
    mixer = build_mixer("pow2", 16)
    with pytest.raises(InputError, match="bool"):
        mixer(torch.randn(1, 4, 16), packing=flags)
    with pytest.raises(InputError, match="bool"):
        model.step(torch.randint(0, 50, (1,)), model(torch.randint(0, 50, (1, 3)))[1], reset=[0.5])
    model(torch.randint(0, 50, (1, 4)), packing=[[False, True, False, False]])  # bool lists still work
