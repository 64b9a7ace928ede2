"""Sizes the commands refuse up front: what a request would allocate, against this machine's memory.

A size flag (``--n``, ``--contexts``, ``--cache-n`` ...) is checked before any work with a memory model
of what the command allocates for it (bytes a position, bytes a matrix entry), so that an absurd
size is one line naming the largest size that fits instead of an allocation failure, a kill by the
kernel, or minutes of work before either. The models are upper estimates (measured peaks rounded
up); the memory is what the kernel reports available now (MemAvailable), capped by a cgroup limit.
"""

from __future__ import annotations

import math
from typing import Callable

from tokenmix.core.errors import InputError
from tokenmix.core.memory import available_memory

FALLBACK_MEMORY = 8 * 2**30  # when the machine does not say (no /proc): assume a small machine


def memory_budget() -> int:
    """Bytes this process can still fill (``core.memory.available_memory``), or FALLBACK_MEMORY when
    the machine does not say."""
    avail = available_memory()
    return FALLBACK_MEMORY if avail is None else avail


def fmt_bytes(b: float) -> str:
    for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            return f"{b / size:,.1f} {unit}"
    return f"{b:,.0f} bytes"


def largest_fitting(need: Callable[[int], float], budget: float, hi: int, lo: int = 1) -> int | None:
    """The largest v in [lo, hi] with need(v) <= budget (need non-decreasing), or None if none fits."""
    if need(lo) > budget:
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_size(flag: str, value: int, need: Callable[[int], float], what: str, lo: int = 1) -> None:
    """Refuse ``flag value`` (InputError) when ``need(value)`` bytes exceed the memory available;
    the message names the largest value of the flag that fits (``need`` must be non-decreasing;
    ``math.inf`` = more than any machine has, without counting further)."""
    budget = memory_budget()
    bytes_needed = need(value)
    if bytes_needed <= budget:
        return
    amount = f"about {fmt_bytes(bytes_needed)}, more than" if math.isfinite(bytes_needed) else "more than"
    best = largest_fitting(need, budget, value - 1, lo) if value - 1 >= lo else None
    limit = (
        f"the largest {flag} that fits is {best:,}" if best is not None else f"no {flag} fits with the other settings"
    )
    raise InputError(
        f"{flag} {value:,} is too large: {what} would need {amount} "
        f"the {fmt_bytes(budget)} of memory available; {limit}"
    )


def check_range(flag: str, value: float, lo: float | None = None, hi: float | None = None) -> None:
    """Refuse a value outside [lo, hi] (either end optional), NaN included."""
    ok = value == value and (lo is None or value >= lo) and (hi is None or value <= hi)
    if not ok:
        if lo is not None and hi is not None:
            want = f"in [{lo:g}, {hi:g}]"
        elif lo is not None:
            want = f">= {lo:g}"
        else:
            want = f"<= {hi:g}"
        raise InputError(f"{flag} must be {want}, got {value}")
