"""Run one benchmark case in a fresh process: ``python -m tokenmix.bench.<solver|mixers> '<json case>'``.

Prints one JSON line: the case's measurements plus ``time_s`` (best wall time of a call), ``cpu_s``
(best process CPU time of a call, unless the case measures its own) and ``peak_mb`` (RSS growth
during the timed work). A case with ``"device": "cuda"`` is timed by CUDA events after a warm-up
(``bench/device.py``) and adds ``device_peak_mb``.

Each benchmark module times its cases in child processes (a fresh allocator and thread pool per
case) and is itself the child's entry point, so this module knows no benchmark (clocks:
``runs/clocks.py``).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from typing import Callable

import torch

from tokenmix.bench.device import peak_device_mb, time_on


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_case(case: dict, prepare: Callable[[dict], tuple[Callable[[], None], dict]]) -> dict:
    """Time the work ``prepare(case)`` builds: ``(fn, extra)``, fn timed, extra merged into the result."""
    torch.manual_seed(0)
    device = case.get("device", "cpu")
    fn, extra = prepare(case)
    base = _rss_mb()
    times = time_on(fn, case.get("repeats", 2), device)
    # a case that measures its own CPU time (around its core work only) keeps it
    return {
        "cpu_s": min(times["cpu"]),
        **case,
        **extra,
        "time_s": min(times["wall"]),
        "peak_mb": max(0.0, _peak_mb() - base),
        **peak_device_mb(device),
    }


def run_in_subprocess(case: dict, module: str, timeout: float = 600, env: dict[str, str] | None = None) -> dict:
    """Run ``case`` as ``python -m <module> '<json case>'`` (a benchmark module whose ``__main__``
    calls ``case_main`` with its prepare function) in ``env`` (None: this process's environment);
    failures come back as {"error": ...}."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", module, json.dumps(case)], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return {**case, "error": f"timed out after {timeout:.0f} s"}
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines() or ["(no output)"]
        return {**case, "error": lines[-1][:300]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def case_main(prepare: Callable[[dict], tuple[Callable[[], None], dict]]) -> None:
    """Entry point of a benchmark module run as a case process: one JSON line on stdout."""
    case = json.loads(sys.argv[1])
    torch.set_num_threads(int(case.get("threads", torch.get_num_threads())))
    print(json.dumps(run_case(case, prepare)))
