"""What ``tokenmix bench packed`` times (no timing asserted): the document lengths it draws from a
prepared stream, the rows it fills, and that its three ways run the same tokens, the packed way with
exactly the rows' boundaries and the padded way with each document in a row of its own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lm_helpers import one_line_error, run_cli
from tokenmix.bench import packed
from tokenmix.core.errors import InputError
from tokenmix.core.packing import Packing

pytestmark = pytest.mark.usefixtures("one_thread")


def test_document_lengths_count_each_separator_with_its_document():
    s = 9
    assert packed.document_lengths(np.array([s, 1, 2, s, 3, s]), s) == [3, 2, 1]
    with pytest.raises(InputError, match="no document separator"):
        packed.document_lengths(np.array([1, 2, 3]), s)


def test_rows_are_filled_from_the_distribution_and_cut_at_the_row_end():
    lengths = [5, 17, 40]
    rows = packed.fill_rows(lengths, rows=6, row_length=64, seed=3)
    assert rows == packed.fill_rows(lengths, rows=6, row_length=64, seed=3)  # seeded
    for row in rows:
        assert sum(row) == 64
        assert all(n in lengths for n in row[:-1])  # only the last one may be cut
        assert 1 <= row[-1] <= max(lengths)
    assert len({tuple(r) for r in rows}) > 1


def test_the_three_ways_run_the_same_tokens(monkeypatch):
    rows = [[3, 9, 4], [16]]
    seen = []
    real_build = packed.build_mixer

    def build(*args, **kwargs):
        m = real_build(*args, **kwargs)
        forward = m.forward

        def recording(x, *rest, packing=None, **kw):
            seen.append((tuple(x.shape), packing))
            return forward(x, *rest, packing=packing, **kw)

        m.forward = recording
        return m

    monkeypatch.setattr(packed, "build_mixer", build)
    r = packed.time_packing("mamba2", rows, repeats=1)
    shapes = {shape for shape, _ in seen}
    assert shapes == {(2, 16, packed.WIDTH), (4, 16, packed.WIDTH)}  # rows; the 4 documents padded to 16
    packings = [p for _, p in seen if p is not None]
    assert packings and all(torch.equal(p.starts, Packing.from_lengths(rows).starts) for p in packings)
    assert sum(p is None and s[0] == 2 for s, p in seen) == sum(p is not None for _, p in seen)  # as many unpacked
    assert (r["tokens"], r["padded_tokens"], r["documents"]) == (32, 64, 4)
    assert r["packed_over_unpacked"] == pytest.approx(r["packed_s"] / r["unpacked_s"])
    assert r["padded_over_unpacked"] == pytest.approx(r["padded_s"] / r["unpacked_s"])
    assert r["native_packing"] is True  # mamba2's chunked kernel takes the boundaries itself


@pytest.mark.parametrize(
    "args, words",
    [
        (["--rows", "0"], ("--rows", ">= 1")),
        (["--row-length", "1"], ("--row-length", ">= 2")),
        (["--mixers", "nosuch"], ("nosuch",)),
        (["--repeats", "1000000000000"], ("--repeats", "<= 1000")),
        (["--seed", str(2**63)], ("--seed", "[0, 2**63)")),
        (["--seed", "-1"], ("--seed", "[0, 2**63)")),
        (["--rows", "1000000000"], ("--rows 1,000,000,000 is too large", "the largest --rows that fits")),
        (["--row-length", "1000000000000"], ("--row-length 1,000,000,000,000 is too large",)),
        (["--rows", "1000000000", "--row-length", "1000000000000"], ("--row-length", "is too large")),
    ],
)
def test_bad_arguments_are_one_line(capsys, args, words):
    one_line_error(run_cli(["bench", "packed", *args], capsys), *words)


def test_a_corpus_error_is_the_only_line(capsys, tmp_path, monkeypatch):
    """A corpus that cannot be read is refused before the progress starts: its one error line, no
    "done" line before it."""
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path / "cache"))
    line = one_line_error(run_cli(["bench", "packed", "--corpus", str(tmp_path / "missing.txt")], capsys))
    assert "done" not in line and "missing.txt" in line
