"""Clocks of a measured call: wall, process CPU, and its user / system split.

Every measured number a run records (``tokenmix bench``, the cost accounting in ``analysis``) comes
from ``time_repeats``, so all of them mean the same thing. Process CPU time counts every thread of
the process but not the time other processes hold the cores: on a shared machine it is the steadier
clock; with one torch thread it is the work itself (with several it also counts spin-waits).
"""

from __future__ import annotations

import resource
import time
from typing import Callable


def time_repeats(
    fn: Callable[[], None], repeats: int, warmup: int = 1, setup: Callable[[], None] | None = None
) -> dict[str, list[float]]:
    """Seconds of each of ``repeats`` calls of fn(), after ``warmup`` untimed calls, on four clocks.

    ``setup()`` runs before every call, outside the timing (e.g. clearing gradients).
    Returns {"wall", "cpu", "user", "sys": [...]}, one entry per timed call, in call order: wall
    time, process CPU time (user + system, ``time.process_time``), and its user and system parts
    (``getrusage``; system time is mostly the kernel zero-filling freshly mapped pages, i.e. the
    allocator handing large buffers back to the OS and faulting them in again on the next call).
    Linux splits the exact CPU total into user and system by tick samples, so the split of a call
    much shorter than a second is coarse; the total is not.
    """
    out: dict[str, list[float]] = {"wall": [], "cpu": [], "user": [], "sys": []}
    for r in range(warmup + repeats):
        if setup is not None:
            setup()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t, c = time.perf_counter(), time.process_time()
        fn()
        dt, dc = time.perf_counter() - t, time.process_time() - c
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        if r >= warmup:
            out["wall"].append(dt)
            out["cpu"].append(dc)
            out["user"].append(ru1.ru_utime - ru0.ru_utime)
            out["sys"].append(ru1.ru_stime - ru0.ru_stime)
    return out


def time_call(fn: Callable[[], None], repeats: int) -> float:
    """Best-of-``repeats`` wall time of fn() after one warm-up call."""
    return min(time_repeats(fn, repeats)["wall"])
