"""The packed-batch representation (core/packing.py): conversions to and from the other libraries'
conventions agree, and bad boundaries are one clear error."""

from __future__ import annotations

import pytest
import torch

from tokenmix.core.packing import Packing, as_packing


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
