"""The one place that picks the pattern ops' backend (ops/pattern/backend.py)."""

from __future__ import annotations

import pytest
import torch

from tokenmix.core.errors import InputError
from tokenmix.ops import numba_runtime
from tokenmix.ops.pattern.backend import choose_backend

needs_numba = pytest.mark.skipif(not numba_runtime.kernel_available(), reason="numba not importable")


@needs_numba
def test_auto_takes_numba_for_float_cpu_tensors_of_one_dtype():
    x, y = torch.zeros(2, 3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    assert choose_backend((x, y)) == "numba"
    assert choose_backend((x.float(),), "numba") == "numba"


@pytest.mark.parametrize(
    "tensors",
    [
        (torch.zeros(2, dtype=torch.bfloat16),),
        (torch.zeros(2), torch.zeros(2, dtype=torch.float64)),  # mixed dtypes
        (torch.zeros(2, device="meta"),),  # not in CPU memory: numba would read it through numpy
    ],
    ids=["bfloat16", "mixed", "meta"],
)
def test_auto_takes_torch_where_numba_cannot_read_the_tensors(tensors):
    assert choose_backend(tensors) == "torch"
    assert choose_backend(tensors, "torch") == "torch"
    with pytest.raises(InputError, match="backend 'numba'"):
        choose_backend(tensors, "numba")


def test_disabled_numba_means_torch(monkeypatch):
    monkeypatch.setattr(numba_runtime, "ENABLED", False)
    x = torch.zeros(2, dtype=torch.float64)
    assert choose_backend((x,)) == "torch"
    with pytest.raises(InputError, match="unavailable"):
        choose_backend((x,), "numba")


def test_unknown_backend_is_refused_naming_the_known_ones():
    with pytest.raises(InputError, match="numba, torch, triton"):
        choose_backend((torch.zeros(1),), "cuda")
