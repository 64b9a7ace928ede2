"""Thread settings for loops of tiny sequential operations.

The chunked kernels' sequential parts (a chunk recurrence, a mini-batch loop) are hundreds of
products of ~1 MFLOP each. With two intra-op threads every such product wakes the second OpenMP
thread, which costs more than it saves (OMP_WAIT_POLICY=PASSIVE makes the wake-up a syscall), so
those loops run on one thread and the batched work around them keeps all of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads set to 1 inside, restored after (also on an exception)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


__all__ = ["one_thread"]
