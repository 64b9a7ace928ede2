"""The structured mixers on a CUDA device (marker ``gpu``; skipped without one; scripts/gpu_check.sh).

Every structured mixer x mode on CUDA float32 equals the CPU float64 result of the same weights and
input within float32 tolerance (outputs, the gradients of x and every parameter, the final cache);
on CUDA ``auto`` is the triton backend where triton is installed, ``compiled`` runs on torch (numba
takes no CUDA tensor). And the backends on CUDA against each other: triton vs torch, float32, with
a decode continued token by token.
"""

from __future__ import annotations

import pytest
import torch

from tokenmix.checks.tolerances import FLOAT32_REL_RMS, GRADIENT_FACTOR, rel_rms
from tokenmix.mixers import build_mixer
from tokenmix.ops.pattern import backend as backends

STRUCTURED = ["pow2", "sq1", "pow2_ce", "sq1_ce", "kth_order", "first_order", "dense_recurrence"]
MODES = ["chunked", "compiled", "dense", "recurrent"]
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]


def _run(name: str, device: str, dtype: torch.dtype, mode: str, backend: str = "auto", t: int = 70):
    """(output, cache values, decoded tokens, gradients [x, *parameters]) of a test-size mixer: a
    prefix of t - 6 tokens in ``mode`` with autograd, then 6 tokens decoded without it."""
    torch.manual_seed(0)
    m = build_mixer(name, 32, n_heads=2, chunk_size=16, backend=backend).to(device=device, dtype=dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, t, 32, dtype=torch.float64, generator=g).to(device=device, dtype=dtype)
    w = torch.randn(2, t - 6, 32, dtype=torch.float64, generator=g).to(device=device, dtype=dtype)
    xi = x.clone().requires_grad_()
    y, state = m(xi[:, : t - 6], mode=mode)
    (y * w).sum().backward()
    grads = [xi.grad] + [p.grad for p in m.parameters()]
    with torch.no_grad():
        steps = []
        for s in range(t - 6, t):
            y_t, state = m.step(x[:, s], state)
            steps.append(y_t)
    return y.detach(), state.values, torch.stack(steps, 1), grads, state.backend


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", STRUCTURED)
def test_cuda_float32_equals_cpu_float64(name, mode):
    y, cache, steps, grads, _ = _run(name, "cuda", torch.float32, mode)
    y_ref, cache_ref, steps_ref, grads_ref, _ = _run(name, "cpu", torch.float64, mode)
    for what, a, b in (("output", y, y_ref), ("cache", cache, cache_ref), ("decode", steps, steps_ref)):
        err = rel_rms(a.cpu(), b)
        assert err <= FLOAT32_REL_RMS, f"{name} {mode} {what}: rel rms {err:.2e}"
    for i, (a, b) in enumerate(zip(grads, grads_ref)):
        err = rel_rms(a.cpu(), b)
        assert err <= GRADIENT_FACTOR * FLOAT32_REL_RMS, f"{name} {mode} gradient {i}: rel rms {err:.2e}"


@pytest.mark.skipif(not backends.triton_available(), reason="triton not installed")
@pytest.mark.parametrize("name", STRUCTURED)
def test_triton_equals_torch_on_cuda(name):
    y, cache, steps, grads, ran = _run(name, "cuda", torch.float32, "chunked", backend="triton", t=200)
    y_ref, cache_ref, steps_ref, grads_ref, _ = _run(name, "cuda", torch.float32, "chunked", backend="torch", t=200)
    assert ran == "triton"
    for what, a, b in (("output", y, y_ref), ("cache", cache, cache_ref), ("decode", steps, steps_ref)):
        assert rel_rms(a, b) <= FLOAT32_REL_RMS, f"{name} triton vs torch {what}: rel rms {rel_rms(a, b):.2e}"
    for i, (a, b) in enumerate(zip(grads, grads_ref)):
        assert rel_rms(a, b) <= GRADIENT_FACTOR * FLOAT32_REL_RMS, f"{name} gradient {i}: rel rms {rel_rms(a, b):.2e}"


def test_auto_is_triton_on_cuda_where_installed():
    x = torch.zeros(2, device="cuda")
    assert backends.choose_backend((x,)) == ("triton" if backends.triton_available() else "torch")
    assert backends.choose_backend((x.bfloat16(),)) == "torch"  # the kernels take float32 / float64
