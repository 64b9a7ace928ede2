"""Which way of running the pattern ops a call takes: the one place that decides it.

Backends: ``numba`` (``numba.py``: compiled sweeps over t; numba reads the tensors through numpy, so
float32 or float64 CPU tensors of one dtype, where numba imports and ``TOKENMIX_NO_COMPILED`` is
not set: ``numba_runtime.supported``) and ``torch`` (``chunked.py``, ``scores.py`` and the torch
decode reads: any dtype, any device). ``auto`` takes the fastest that takes the tensors. The caller
asks once per call and keeps the answer (it branches on it, and may report it).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.ops import numba_runtime

BACKENDS = ("numba", "torch")


def choose_backend(tensors: Sequence[Tensor], requested: str = "auto") -> str:
    """The backend that runs a pattern op on ``tensors``: ``requested`` if it takes them, ``auto``:
    ``numba`` where it runs, else ``torch``.

    Args:
        tensors: the op's floating-point operands (their dtypes and devices decide).
        requested: "auto", or one of ``BACKENDS``.
    Returns:
        "numba" or "torch".
    Raises:
        InputError: an unknown name, or ``numba`` asked for tensors it cannot take.
    """
    if requested == "auto":
        return "numba" if numba_runtime.supported(*tensors) else "torch"
    if requested == "torch":
        return "torch"
    if requested == "numba":
        if not numba_runtime.supported(*tensors):
            if not numba_runtime.kernel_available():
                raise InputError("backend 'numba' is unavailable (numba not importable or TOKENMIX_NO_COMPILED set)")
            got = sorted({f"{z.dtype} on {z.device}" for z in tensors})
            raise InputError(f"backend 'numba' takes float32 or float64 CPU tensors of one dtype, got {got}")
        return "numba"
    raise InputError(f"unknown backend '{requested}'; backends: auto, {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "choose_backend"]
