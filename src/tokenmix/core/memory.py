"""How much memory this process can still fill: the one place the size limits of bad-input checks
(absurd model widths, sequence lengths, vocabularies) ask."""

from __future__ import annotations

import os
from pathlib import Path


def available_memory() -> int | None:
    """Bytes of memory this process can still fill: the kernel's MemAvailable (or the free physical
    pages where there is no /proc), capped by a cgroup v2 container limit; None if nothing says."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    try:  # cgroup v2: a container's limit
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            avail = min(avail, max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    return int(avail)
