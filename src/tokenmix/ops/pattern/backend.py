"""Which way of running the pattern ops a call takes, and the calls themselves: the one place that decides.

A backend is *how* the structured recurrence is computed, never *what*: every backend gives the
chunked mode's numbers up to rounding (tests/mixers/test_structured_backends.py holds them to the
float64 dense reference), so it enters no run id or config hash.

Backends, one file each in this package:
    numba   ``numba.py``: compiled sweeps over t (one pass per head, forward and backward). numba
            reads tensors through numpy: float32 or float64 CPU tensors of one dtype, where numba
            imports and ``TOKENMIX_NO_COMPILED`` is not set (``numba_runtime.supported``).
    torch   ``chunked.py``, ``scores.py`` and the tensor-operation decode reads (``numba.py``'s
            ``*_reference``): any dtype, any device.
    triton  ``triton_solve.py``, ``triton_decode.py``: float32 / float64 CUDA tensors where triton
            imports; CPU tensors only under Triton's interpreter (``TRITON_INTERPRET=1`` when triton
            is first imported: how the tests run it), and then no CUDA ones.

``auto`` takes triton for CUDA tensors where it is available, numba where it takes the tensors,
else torch. ``TOKENMIX_PATTERN_BACKEND`` (read once at import, as ``TOKENMIX_NO_COMPILED`` is)
replaces ``auto`` for every caller that asks ``auto``; a mixer's own ``backend`` field other than
``auto`` wins over it.

The caller (``mixers/structured.py``) asks ``choose_backend`` once per call, keeps the answer,
records it (the decode cache's ``repr``, ``bench`` rows), and runs the ops through ``solve``,
``scores``, ``step_read`` and ``lattice_step`` below with it. Adding a backend: its file, its name in
``BACKENDS``, its rule in ``choose_backend`` and one branch in each of the four dispatchers.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Sequence
from types import ModuleType

import numpy as np
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.ops import numba_runtime
from tokenmix.ops.pattern import numba as numba_kernels
from tokenmix.ops.pattern.chunked import chunked_pattern_solve
from tokenmix.ops.pattern.lattice_step import LatticeStep
from tokenmix.ops.pattern.plan import PatternPlan, RowPatternPlan
from tokenmix.ops.pattern.scores import pattern_scores

BACKENDS = ("numba", "torch", "triton")
REQUESTS = ("auto", *BACKENDS)
ENV_VAR = "TOKENMIX_PATTERN_BACKEND"
#: What ``auto`` means in this process: the environment's choice (read once, at import), else ``auto``.
DEFAULT = os.environ.get(ENV_VAR, "").strip().lower() or "auto"

PlanGetter = Callable[[], "PatternPlan | RowPatternPlan"]


def check_request(requested: str, what: str = "backend") -> str:
    """``requested`` if it names a backend or ``auto``; else one InputError line naming them."""
    if requested not in REQUESTS:
        raise InputError(f"{what} must be one of {', '.join(REQUESTS)}, got '{requested}'")
    return requested


def triton_available() -> bool:
    """Whether the Triton kernels can run here: triton is installed (found, not imported)."""
    return importlib.util.find_spec("triton") is not None


def _triton(part: str) -> ModuleType:
    """``triton_solve`` or ``triton_decode``, imported on first use, not with this module: triton
    decides when it is first imported whether its kernels run under the interpreter
    (``TRITON_INTERPRET``), so a process that never asks for them neither pays for the import
    (~0.1 s) nor fixes that choice for code that sets the variable later (a test module)."""
    return importlib.import_module(f"tokenmix.ops.pattern.triton_{part}")


def choose_backend(tensors: Sequence[Tensor], requested: str = "auto") -> str:
    """The backend that runs a pattern op on ``tensors``: ``requested`` if it takes them; ``auto``
    (after ``TOKENMIX_PATTERN_BACKEND``): triton on CUDA tensors where it is available, numba
    where it runs, else torch.

    Args:
        tensors: the op's floating-point operands (their dtypes and devices decide).
        requested: "auto", or one of ``BACKENDS``.
    Returns:
        "numba", "torch" or "triton".
    Raises:
        InputError: an unknown name, or a backend asked for tensors it cannot take.
    """
    if requested == "auto":
        requested = DEFAULT
    if requested == "auto":
        if tensors[0].is_cuda and triton_available() and _triton("solve").supported(*tensors):
            return "triton"
        return "numba" if numba_runtime.supported(*tensors) else "torch"
    if requested == "torch":
        return "torch"
    if requested == "numba":
        numba_kernels.check_tensors(tensors)
        return "numba"
    if requested == "triton":
        if not triton_available():
            raise InputError("backend 'triton' is unavailable (triton not installed: pip install 'tokenmix[gpu]')")
        _triton("solve").check_tensors(tensors)
        return "triton"
    raise InputError(f"unknown backend '{requested}'; backends: auto, {', '.join(BACKENDS)}")


def compiled_mode_backend(tensors: Sequence[Tensor]) -> str:
    """The backend of the structured mixers' ``compiled`` mode, the name it had before backends:
    numba where it takes the tensors, else torch (that mode never meant Triton)."""
    return "numba" if numba_runtime.supported(*tensors) else "torch"


def solve(
    backend: str,
    alpha: Tensor,
    beta: Tensor,
    idx: Tensor,
    x: Tensor,
    y_prefix: Tensor,
    chunk_size: int,
    plan: PlanGetter | None = None,
) -> Tensor:
    """The pattern solve (I - B) Y = diag(alpha) X by ``backend``: y [B, T, H, V].

    Args as ``chunked.chunked_pattern_solve``; ``plan`` returns the table's plan (built on first
    call: only the torch path reads it).
    """
    if backend == "numba":
        return numba_kernels.compiled_pattern_solve(alpha, beta, idx, x, y_prefix)
    if backend == "triton":
        return _triton("solve").triton_pattern_solve(alpha, beta, idx, x, y_prefix)
    return chunked_pattern_solve(alpha, beta, idx, x, y_prefix, chunk_size, plan=None if plan is None else plan())


def scores(backend: str, q: Tensor, kbuf: Tensor, idx: Tensor, plan: PlanGetter | None = None) -> Tensor:
    """Neighbour scores s[t, w] = q_t . kbuf[idx[t, w]] (0 where idx < 0) by ``backend``: [B, T, H, W].

    Args as ``scores.pattern_scores``; ``plan`` as in ``solve``.
    """
    if backend == "numba":
        return numba_kernels.compiled_pattern_scores(q, kbuf, idx)
    if backend == "triton":
        return _triton("solve").triton_pattern_scores(q, kbuf, idx)
    return pattern_scores(q, kbuf, idx, None if plan is None else plan())


def step_read(
    backend: str,
    qkv: Tensor,
    keys: Tensor,
    values: Tensor,
    slots: np.ndarray,
    scale: float,
    out: Tensor,
    visible: np.ndarray | None = None,
) -> Tensor:
    """One decoded token's read of a fixed-distance cache by ``backend`` (args: ``numba.step_read``)."""
    if backend == "numba":
        return numba_kernels.step_read(qkv, keys, values, slots, scale, out, visible)
    if backend == "triton":
        return _triton("decode").triton_step_read(qkv, keys, values, slots, scale, out, visible)
    if visible is None:
        visible = numba_kernels.all_visible(qkv.shape[0], slots.shape[0])
    return numba_kernels.step_read_reference(qkv, keys, values, slots, scale, out, visible)


def lattice_step(
    backend: str, qkv: Tensor, kv: Tensor, kv_np: np.ndarray | None, step: LatticeStep, scale: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """One decoded token of a neighbour-set cache by ``backend`` (args and result: ``numba.lattice_step``)."""
    if backend == "numba":
        return numba_kernels.lattice_step(qkv, kv, kv_np, step, scale)
    if backend == "triton":
        return _triton("decode").triton_lattice_step(qkv, kv, step, scale)
    return numba_kernels.lattice_step_reference(qkv, kv, step, scale)


__all__ = [
    "BACKENDS",
    "DEFAULT",
    "ENV_VAR",
    "REQUESTS",
    "check_request",
    "choose_backend",
    "compiled_mode_backend",
    "lattice_step",
    "scores",
    "solve",
    "step_read",
    "triton_available",
]
