"""``tokenmix demo``: its timings leave out the first call of each mode (compilation, plans), and its
tables reach a log uncut."""

from __future__ import annotations

import re

import pytest

from lm_helpers import run_cli
from tokenmix.cli import demo_cmd

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_demo_times_no_first_call_and_prints_whole_tables_in_a_log(capsys, monkeypatch):
    """A fake clock that a mode's first call (where kernels compile and plans are built) moves by a
    whole second: a timing that included one would show it, the warmed-up timings show 0."""
    clock = [0.0]
    real_build = demo_cmd.build_mixer

    def build(*args, **kwargs):
        mixer = real_build(*args, **kwargs)
        forward, seen = mixer.forward, set()

        def first_call_is_slow(x, *rest, mode=None, **kw):
            if mode not in seen:
                seen.add(mode)
                clock[0] += 1.0
            return forward(x, *rest, mode=mode, **kw)

        mixer.forward = first_call_is_slow
        return mixer

    class FakeTime:
        @staticmethod
        def perf_counter() -> float:
            return clock[0]

    monkeypatch.setattr(demo_cmd, "build_mixer", build)
    monkeypatch.setattr(demo_cmd, "time", FakeTime)
    rc, out, err = run_cli(["demo", "--n", "64"], capsys)
    assert rc == 0, err
    assert "cache (measured/derived)" in out  # the header whole, not cut at 80 columns
    modes_table = [line for line in out.splitlines() if line.startswith("│") and len(line.split("│")) == 9]
    rows = [line for line in modes_table if re.match(r"^│\s+(pow2|pow2_ce|sq1|sq1_ce) │", line)]
    assert len(rows) == 4, out
    for row in rows:
        chunked_ms, dense_ms, step_ms = [c.strip() for c in row.split("│")[4:7]]
        assert float(chunked_ms) == float(dense_ms) == float(step_ms) == 0.0, row
