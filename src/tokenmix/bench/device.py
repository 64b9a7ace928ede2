"""Where a benchmark runs (``--device cpu | cuda``) and the clock that times its calls there.

A CUDA call returns before its kernels finish: a host clock around it measures the launch, not the
work. So on CUDA a call is timed by a pair of ``torch.cuda.Event`` records around it, the stream
synchronised before the first record (nothing earlier is counted) and after the second (the work is
done), after untimed warm-up calls (kernel compilation -- Triton's JIT, cuBLAS handles -- and the
allocator's first blocks). On the CPU the host clock is the work's own (``runs/clocks.py``).

Both clocks return seconds per call in the same dict as ``runs.clocks.time_repeats`` ("wall",
"cpu", "user", "sys"), so a benchmark's rows mean the same on either device: on CUDA "wall" is the
event time and "cpu" the host process time of the call (launch overhead and the wait).
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable

import torch

from tokenmix.bench.settings import DEVICES
from tokenmix.core.errors import InputError
from tokenmix.runs.clocks import time_repeats

CLOCKS = {"cpu": "host", "cuda": "cuda_events"}


def check_device(device: str, cuda_available: bool | None = None) -> str:
    """``device`` if a benchmark can run there; else one InputError line. ``cuda_available`` None:
    ask torch (tests pass it)."""
    if device not in DEVICES:
        raise InputError(f"--device must be one of {', '.join(DEVICES)}, got '{device}'")
    if device == "cuda" and not (torch.cuda.is_available() if cuda_available is None else cuda_available):
        raise InputError("--device cuda: no CUDA device is available here (torch.cuda.is_available() is False)")
    return device


def clock(device: str) -> str:
    """The clock that times calls on ``device``: "host" (perf_counter) or "cuda_events"."""
    return CLOCKS[check_device(device, cuda_available=True)]


def time_on(
    fn: Callable[[], None],
    repeats: int,
    device: str = "cpu",
    warmup: int = 1,
    setup: Callable[[], None] | None = None,
) -> dict[str, list[float]]:
    """Seconds of each of ``repeats`` calls of fn() on ``device`` after ``warmup`` untimed ones (the
    dict of ``time_repeats``), by the clock of ``clock(device)``."""
    if clock(device) == "host":
        return time_repeats(fn, repeats, warmup=warmup, setup=setup)
    out: dict[str, list[float]] = {"wall": [], "cpu": [], "user": [], "sys": []}
    for r in range(warmup + repeats):
        if setup is not None:
            setup()
        wall, cpu, user, system = timed_call(fn, device)
        if r >= warmup:
            for key, value in zip(("wall", "cpu", "user", "sys"), (wall, cpu, user, system)):
                out[key].append(value)
    return out


def timed_call(fn: Callable[[], None], device: str = "cpu") -> tuple[float, float, float, float]:
    """(wall, process CPU, user, system) seconds of one call of fn() on ``device``; on CUDA "wall" is
    the time between two events around the call, the stream synchronised before and after."""
    events = clock(device) == "cuda_events"
    if events:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t, c = time.perf_counter(), time.process_time()
    fn()
    if events:
        end.record()
        end.synchronize()
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    if events:
        wall = start.elapsed_time(end) / 1e3  # ms -> s
    return wall, cpu, ru1.ru_utime - ru0.ru_utime, ru1.ru_stime - ru0.ru_stime


def peak_device_mb(device: str) -> dict[str, float]:
    """{"device_peak_mb": the most CUDA memory allocated since the last reset} on CUDA; {} on the CPU."""
    if device != "cuda":
        return {}
    return {"device_peak_mb": torch.cuda.max_memory_allocated() / 2**20}


__all__ = ["CLOCKS", "DEVICES", "check_device", "clock", "peak_device_mb", "time_on", "timed_call"]
