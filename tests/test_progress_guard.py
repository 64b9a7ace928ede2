"""The hang detector every test uses (progress_guard.py): judged by CPU time and blocking, not by the clock."""

from __future__ import annotations

import os
import sys
import time

import pytest

from progress_guard import NoProgress, Watch, guarded, run_guarded


def test_a_runnable_process_that_gets_no_cpu_is_never_judged_hung(monkeypatch):
    """A starved process (runnable, no CPU time yet) on a machine at any load: neither rule fires."""
    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    watch = Watch(cpu_seconds=10, idle_seconds=5, ceiling_seconds=1e9)
    for _ in range(1000):
        clock[0] += 1.0  # 1000 s of wall clock
        assert watch.verdict(cpu=0.001, busy=True) is None


def test_cpu_budget_and_blocking_are_the_verdicts(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    watch = Watch(cpu_seconds=10, idle_seconds=5, ceiling_seconds=1e9)
    assert watch.verdict(cpu=9.0, busy=True) is None
    assert "CPU time" in watch.verdict(cpu=10.5, busy=True)
    watch = Watch(cpu_seconds=10, idle_seconds=5, ceiling_seconds=1e9)
    clock[0] = 3.0
    assert watch.verdict(cpu=0.0, busy=False) is None
    clock[0] = 6.0
    assert "blocked" in watch.verdict(cpu=0.0, busy=False)


def test_run_guarded_answers_and_reports_cpu():
    done = run_guarded([sys.executable, "-c", "print('hi')"])
    assert done.returncode == 0 and done.stdout == "hi\n" and 0 <= done.cpu_seconds < 30


def test_run_guarded_stops_a_spinning_child():
    with pytest.raises(NoProgress, match="CPU time"):
        run_guarded([sys.executable, "-c", "while 1: pass"], cpu_seconds=1.0)


def test_run_guarded_stops_a_blocked_child(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(NoProgress, match="blocked"):
        run_guarded([sys.executable, "-c", f"open({str(tmp_path / 'pipe')!r}).read()"], idle_seconds=2.0)


def test_guarded_interrupts_a_spinning_block():
    with pytest.raises(NoProgress, match="CPU time"), guarded(cpu_seconds=0.5):
        while True:
            pass


def test_guarded_interrupts_a_blocked_block(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(NoProgress, match="blocked"), guarded(idle_seconds=1.0):
        open(tmp_path / "pipe").read()


def test_guarded_lets_a_quick_block_through():
    with guarded(cpu_seconds=5.0) as watch:
        sum(range(1000))
    assert watch.cpu < 5.0
