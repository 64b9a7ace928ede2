"""Child processes that never outlive their parent.

    die_with_parent(os.getppid())    # first thing in a worker or a torchrun rank

A process that works for another (a sweep's worker, a rank ``torchrun`` started) must stop when
that parent dies, however it dies: a SIGKILLed launcher cannot stop its children itself, and
``torchrun`` starts each rank in a session of its own, so no signal to the launcher's process group
reaches them. On Linux the kernel sends the child SIGKILL when its parent dies (PR_SET_PDEATHSIG;
strictly, when the thread that started the child ends); everywhere a watcher thread ends the child
once its parent is gone (the child is then reparented, so ``os.getppid()`` changes).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PARENT_POLL_SECONDS = 0.5
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, poll_seconds: float = PARENT_POLL_SECONDS) -> None:
    """End this process (exit status 1, or SIGKILL from the kernel) as soon as ``parent_pid``, its
    parent, is gone; returns at once (the watcher is a daemon thread)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watcher below still covers it
    if os.getppid() != parent_pid:  # the parent died before the line above
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_seconds)
        os._exit(1)

    threading.Thread(target=watch, name="tokenmix-parent-watch", daemon=True).start()


__all__ = ["PARENT_POLL_SECONDS", "die_with_parent"]
