"""Run one benchmark case in a fresh process: ``python -m tokenmix.bench.worker '<json case>'``.

Prints one JSON line: the case's measurements plus ``time_s`` (best wall time of a call), ``cpu_s``
(best process CPU time of a call, unless the case measures its own) and ``peak_mb`` (RSS growth
during the timed work).

Process CPU time counts every thread of the process but not the time other processes hold the
cores, so on a shared machine it is the steadier clock; with one torch thread it is the work itself
(with several it also counts the threads' spin-waits).
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from typing import Callable

import torch


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_repeats(fn: Callable[[], None], repeats: int, warmup: int = 1,
                 setup: Callable[[], None] | None = None) -> dict[str, list[float]]:
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


def run_case(case: dict) -> dict:
    kind = case["kind"]
    if kind == "solver":
        from tokenmix.bench.solver import prepare_solver_case as prep
    elif kind == "mixer":
        from tokenmix.bench.mixers import prepare_mixer_case as prep
    else:
        raise ValueError(f"unknown benchmark case kind '{kind}'")
    torch.manual_seed(0)
    fn, extra = prep(case)
    base = _rss_mb()
    times = time_repeats(fn, case.get("repeats", 2))
    # a case that measures its own CPU time (around its core work only) keeps it
    return {"cpu_s": min(times["cpu"]), **case, **extra, "time_s": min(times["wall"]),
            "peak_mb": max(0.0, _peak_mb() - base)}


def run_in_subprocess(case: dict, timeout: float = 600) -> dict:
    """Run ``case`` in a child process; failures come back as {"error": ...} rather than raising."""
    try:
        out = subprocess.run([sys.executable, "-m", "tokenmix.bench.worker", json.dumps(case)],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**case, "error": f"timed out after {timeout:.0f} s"}
    if out.returncode != 0:
        lines = (out.stderr.strip().splitlines() or ["(no output)"])
        return {**case, "error": lines[-1][:300]}
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    torch.set_num_threads(int(json.loads(sys.argv[1]).get("threads", torch.get_num_threads())))
    print(json.dumps(run_case(json.loads(sys.argv[1]))))
