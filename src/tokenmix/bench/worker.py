"""Run one benchmark case in a fresh process: ``python -m tokenmix.bench.worker '<json case>'``.

Prints one JSON line: the case's measurements plus ``peak_mb`` (RSS growth during the timed work).
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


def time_call(fn: Callable[[], None], repeats: int) -> float:
    """Best-of-``repeats`` wall time of fn() after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


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
    t = time_call(fn, case.get("repeats", 2))
    return {**case, **extra, "time_s": t, "peak_mb": max(0.0, _peak_mb() - base)}


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
