"""What every compiled (numba) kernel of ``tokenmix.ops`` shares: whether they run, which tensors
they take, and numba's threads.

Availability. numba is a dependency of the package; if it cannot be imported, or
``TOKENMIX_NO_COMPILED=1`` is set (read once, at import: a decode step asks for every token), no
compiled kernel runs and each caller takes its pure-PyTorch path with the same arguments.
``kernel_available()`` says which; ``supported(*tensors)`` adds the tensors' side (float32 or
float64, one dtype, on the CPU: numba reads them through numpy). The pattern ops ask
``ops/pattern/backend.py`` (``choose_backend``), which asks ``supported``. Tests switch ``ENABLED``
with ``monkeypatch.setattr``.

Threads. A parallel kernel runs under ``launch()``: numba uses as many threads as torch (the CLI
and the benchmarks set torch's count), and the first launch chooses numba's threading layer so that
idle workers sleep (``_choose_pool``).
"""

from __future__ import annotations

import contextlib
import os
import threading

import torch
from torch import Tensor

try:  # the compiled path; everything works without it (the pure-PyTorch kernels run instead)
    import numba
except ImportError:  # pragma: no cover - exercised only where numba is missing
    numba = None

#: keyword arguments of every parallel kernel's ``numba.njit``
PARALLEL_JIT = dict(parallel=True, fastmath=True, cache=True, nogil=True)
DTYPES = (torch.float32, torch.float64)

#: Whether the compiled kernels run: numba importable and ``TOKENMIX_NO_COMPILED`` not set.
ENABLED = numba is not None and os.environ.get("TOKENMIX_NO_COMPILED", "").lower() not in ("1", "true", "yes")


def kernel_available() -> bool:
    """Whether the compiled kernels can run here (numba importable and not disabled by
    ``TOKENMIX_NO_COMPILED=1``)."""
    return ENABLED


def supported(*tensors: Tensor) -> bool:
    """Whether the compiled kernels can take these tensors: enabled, and float32 or float64, all one
    dtype, in CPU memory (numba reads them through numpy)."""
    if not ENABLED:
        return False
    dtype = tensors[0].dtype
    if dtype not in DTYPES:
        return False
    for z in tensors:  # a loop, not all(<generator>): a decode step asks for every token
        if z.dtype != dtype or not z.is_cpu:
            return False
    return True


def as_numpy(z: Tensor):
    """The numpy view of a CPU tensor (no copy; autograd detached)."""
    return z.detach().numpy() if z.requires_grad else z.numpy()  # (detach costs a decode step ~0.5 us a call)


_POOL_CHOSEN = False
_LOCK: contextlib.AbstractContextManager = contextlib.nullcontext()  # a lock under the workqueue layer


def _choose_pool() -> None:
    """Choose numba's threading layer before its first parallel kernel, so that idle workers sleep.

    numba's ``omp`` layer (its default where TBB is missing) binds to the libgomp torch has already
    loaded (torch loads its copy with global symbols), whose wait policy was fixed when torch was
    imported: left to libgomp's default, each idle worker spins for a while after every parallel
    kernel. The pattern kernels take a few hundred microseconds and run four times per layer and
    step, so the workers spun most of the time: a pow2 training step in a plain ``python`` process
    cost ~10x the CPU it costs under the CLI (which sets OMP_WAIT_POLICY=PASSIVE before torch loads)
    once another process held a core. The policy cannot be changed after torch's import, so where it
    is not PASSIVE and the user chose no layer (``NUMBA_THREADING_LAYER``), numba runs its own
    ``workqueue`` pool, whose workers wait on a condition variable. That pool is not thread-safe, so
    kernels are then launched under a lock (concurrent callers take turns instead of aborting).
    """
    global _POOL_CHOSEN, _LOCK
    _POOL_CHOSEN = True
    passive = os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"
    if numba.config.THREADING_LAYER == "default" and not passive:
        numba.config.THREADING_LAYER = "workqueue"  # read when numba starts its threads, just below
    numba.set_num_threads(1)  # starts the pool now, in the layer chosen above
    if numba.threading_layer() == "workqueue":
        _LOCK = threading.Lock()


@contextlib.contextmanager
def launch():
    """Around a parallel kernel call: numba's thread count set to torch's (the first call chooses
    the threading layer), and the workqueue layer's lock held."""
    if not _POOL_CHOSEN:
        _choose_pool()
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
    with _LOCK:
        yield


__all__ = ["DTYPES", "ENABLED", "PARALLEL_JIT", "as_numpy", "kernel_available", "launch", "numba", "supported"]
