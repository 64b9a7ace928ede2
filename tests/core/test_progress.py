"""Progress on a terminal and in a log: plain lines with done/total, elapsed and an ETA that
discounts the budget runs did not use."""

from __future__ import annotations

import io

from tokenmix.core import progress as P


def test_plain_lines_in_a_log_with_an_eta_from_real_work(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(P.time, "monotonic", lambda: clock[0])
    log = io.StringIO()
    with P.Progress("compare", 1000, "steps", stream=log, every=30) as bar:
        clock[0] += 10
        bar.advance(100)  # 10 s after the start: no line yet
        clock[0] += 30
        bar.advance(100)  # 200 steps in 40 s; a line is due
        bar.advance(300, credited=True)  # a run stopped early: 300 steps credited, not trained
        bar.note("runs 1/4")
        bar.milestone("pow2 seed 0 finished")
    lines = log.getvalue().splitlines()
    assert lines[0] == "compare: 0/1,000 steps (0%), 0:00 elapsed -- started"
    assert lines[1] == "compare: 200/1,000 steps (20%), 0:40 elapsed, ETA in 2:40"  # 800 left at 5 steps/s
    # 500 left; finished work used 200 of 500 counted steps, so 500 * 0.4 = 200 steps at 5 steps/s
    assert lines[2] == "compare: runs 1/4 500/1,000 steps (50%), 0:40 elapsed, ETA in 0:40 -- pow2 seed 0 finished"
    assert lines[-1].endswith("-- done")


def test_disabled_progress_prints_nothing():
    log = io.StringIO()
    with P.Progress("x", 10, stream=log, enabled=False) as bar:
        bar.advance(10)
        bar.milestone("m")
        bar.warn("w")
    assert log.getvalue() == ""
    assert P.format_seconds(3725) == "1:02:05" and P.format_seconds(65) == "1:05"
    assert P.format_eta(59369) == "ETA in 16:29:29"  # a time left, not a clock time


def test_a_busy_machine_is_said_once_at_the_start(monkeypatch):
    assert P.load_warning(0.2, 2) is None
    note = P.load_warning(1.6, 2)
    assert "busy" in note and "1.6 of 2 cores" in note and "80%" in note
    log = io.StringIO()
    monkeypatch.setattr(P, "busy_cores", lambda: 1.7)
    with P.Progress("x", 10, stream=log, check_load=True) as bar:
        bar.advance(10)
    assert sum("busy" in line for line in log.getvalue().splitlines()) == 1


def test_an_item_finished_after_the_period_is_one_line_with_its_event(monkeypatch):
    """A benchmark case that took longer than the period: one line carrying the case, not a periodic
    line and then the same count again with the case."""
    clock = [0.0]
    monkeypatch.setattr(P.time, "monotonic", lambda: clock[0])
    log = io.StringIO()
    with P.Progress("bench solver", 3, "cases", stream=log, every=30) as bar:
        clock[0] += 45
        bar.advance(1, event="mixer=pow2 n=4096")
        clock[0] += 1
        bar.advance(1)  # within the period: no line
    lines = log.getvalue().splitlines()
    assert lines[1:] == [
        "bench solver: 1/3 cases (33%), 0:45 elapsed, ETA in 1:30 -- mixer=pow2 n=4096",
        lines[-1],
    ] and lines[-1].endswith("-- done")
