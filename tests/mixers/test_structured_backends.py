"""The structured mixers' backends (ops/pattern/backend.py): how, never what.

Every backend that runs here (numba, torch; triton under its interpreter, in a process of its own:
triton decides at its first import whether it interprets, and this process must not decide it for
the Triton kernel tests) gives the same numbers in float64 -- outputs, every gradient, the cache, the
decode steps; the chosen backend is recorded in the state; ``compiled`` is the chunked mode on
numba; and no run id sees the backend.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tokenmix.checks.common import run_in_pieces
from tokenmix.core.errors import InputError
from tokenmix.mixers import build_mixer
from tokenmix.mixers.registry import mixer_names
from tokenmix.ops import numba_runtime
from tokenmix.ops.pattern import backend as backends
from tokenmix.study.presets import get_preset
from tolerances import FLOAT64_EXACT, assert_close

STRUCTURED = ["pow2", "sq1", "pow2_ce", "sq1_ce", "kth_order", "first_order", "dense_recurrence"]
needs_numba = pytest.mark.skipif(not numba_runtime.kernel_available(), reason="numba not importable")


def mixer(name: str, backend: str, **kw):
    torch.manual_seed(0)
    return build_mixer(name, 12, n_heads=2, chunk_size=8, backend=backend, **kw).double()


def run(m, x0, w, mode, sizes):
    """Outputs, cache values and the gradients of x and every parameter, the input fed in pieces."""
    m.zero_grad()
    x = x0.clone().requires_grad_()
    y, state = run_in_pieces(m, x, mode, sizes)
    ((y * w).sum() + (state.values * 0.3).sum()).backward()
    return y.detach(), state, [x.grad] + [p.grad.clone() for p in m.parameters()]


@needs_numba
@pytest.mark.parametrize("name", STRUCTURED)
@pytest.mark.parametrize("sizes", [[70], [29, 1, 40]], ids=["whole", "pieces"])
def test_numba_and_torch_backends_equal_the_dense_mode(name, sizes):
    """T = 70 with C = 8: near band, far blocks, a lattice cache read across pieces."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, sum(sizes), 12, dtype=torch.float64, generator=g)
    w = torch.randn(2, sum(sizes), 12, dtype=torch.float64, generator=g)
    y_ref, s_ref, g_ref = run(mixer(name, "torch"), x, w, "dense", sizes)
    for backend in ("numba", "torch"):
        y, s, grads = run(mixer(name, backend), x, w, "chunked", sizes)
        assert s.backend == (backend if name != "dense_recurrence" else "torch")  # the window path is torch
        assert_close(y, y_ref, FLOAT64_EXACT, f"{name} {backend} output")
        assert torch.equal(s.positions, s_ref.positions)
        assert_close(s.values, s_ref.values, FLOAT64_EXACT, f"{name} {backend} cached outputs")
        for i, (a, b) in enumerate(zip(grads, g_ref)):
            assert_close(a, b, FLOAT64_EXACT, f"{name} {backend} gradient {i}")


@needs_numba
@pytest.mark.parametrize("name", ["pow2", "sq1_ce"])
def test_compiled_mode_is_chunked_on_numba_whatever_the_config_asks(name):
    x = torch.randn(2, 37, 12, dtype=torch.float64)
    on_torch = mixer(name, "torch")
    y_alias, s_alias = on_torch(x, mode="compiled")
    y_numba, s_numba = mixer(name, "numba")(x, mode="chunked")
    y_torch, s_torch = on_torch(x, mode="chunked")
    assert torch.equal(y_alias, y_numba) and torch.equal(s_alias.values, s_numba.values)
    assert (s_alias.backend, s_numba.backend, s_torch.backend) == ("numba", "numba", "torch")
    assert not torch.equal(y_alias, y_torch)  # two ways of computing: rounding apart, so the test can tell
    assert_close(y_alias, y_torch, FLOAT64_EXACT, f"{name} compiled vs chunked on torch")


@needs_numba
def test_default_mode_is_chunked_on_numba_on_the_cpu():
    """Today's default on the CPU (numba where it runs), now named by its algorithm."""
    m = build_mixer("pow2_ce", 12, n_heads=2)
    assert m.modes[0] == "chunked" and m.config.backend == "auto"
    _, state = m(torch.randn(1, 20, 12))
    assert state.backend == "numba" and "backend=numba" in repr(state)
    with torch.no_grad():
        _, state = m.step(torch.randn(1, 12), state)
    assert state.backend == "numba" and state.strategy == "neighbor_set"
    _, state = m.step(torch.randn(1, 12), state)  # autograd records it: the general step, in torch
    assert state.backend == "torch"
    _, bf16 = m.to(torch.bfloat16)(torch.randn(1, 20, 12, dtype=torch.bfloat16))
    assert bf16.backend == "torch"  # numba reads float32 / float64 only


@needs_numba
@pytest.mark.parametrize("name", ["pow2", "pow2_ce"])
def test_decode_reads_agree_across_backends(name):
    """Prefill, then token by token without autograd: the fast reads of both backends."""
    x = torch.randn(2, 40, 12, dtype=torch.float64)
    outs = {}
    for backend in ("numba", "torch"):
        m = mixer(name, backend)
        with torch.no_grad():
            _, state = m(x[:, :25])
            steps = []
            for t in range(25, 40):
                y_t, state = m.step(x[:, t], state)
                steps.append(y_t)
        assert state.backend == backend and state.strategy != "general"
        outs[backend] = torch.stack(steps, 1)
    assert_close(outs["numba"], outs["torch"], FLOAT64_EXACT, f"{name} decode numba vs torch")


def test_backend_field_is_checked_in_one_line():
    with pytest.raises(InputError, match=r"^backend must be one of auto, numba, torch, triton, got 'cuda'$"):
        build_mixer("pow2", 12, backend="cuda")


TRITON_MIXER = """
import json, os, sys
import torch
from tokenmix.mixers import build_mixer
from tokenmix.ops.pattern import backend as backends

g = torch.Generator().manual_seed(3)
x = torch.randn(2, 21, 12, dtype=torch.float64, generator=g)
w = torch.randn(2, 21, 12, dtype=torch.float64, generator=g)
runs, errors = {}, {}
for name in sys.argv[1:]:
    for backend in ("triton", "torch"):
        torch.manual_seed(0)
        m = build_mixer(name, 12, n_heads=2, chunk_size=8, backend=backend).double()
        xi = x.clone().requires_grad_()
        y, state = m(xi[:, :17])  # a prefix of 17 tokens in one call, then 4 decoded without autograd
        (y * w[:, :17]).sum().backward()
        grads = [xi.grad] + [p.grad for p in m.parameters()]
        with torch.no_grad():
            steps = []
            for t in range(17, 21):
                y_t, state = m.step(x[:, t], state)
                steps.append(y_t)
        runs[name, backend] = [y.detach(), *grads, torch.stack(steps, 1)], state.backend
    (fast, ran), (ref, _) = runs[name, "triton"], runs[name, "torch"]
    errors[name] = [ran, [float((a - b).abs().max() / b.abs().max()) for a, b in zip(fast, ref)]]
auto = backends.choose_backend((x,))
print(json.dumps({"interpret": os.environ.get("TRITON_INTERPRET"), "auto_on_cpu": auto, "errors": errors}))
"""


@pytest.mark.skipif(not backends.triton_available(), reason="triton not installed (the gpu or dev extra)")
def test_triton_backend_under_the_interpreter_equals_torch():
    """pow2_ce (neighbour-set decode, lattice tables) and pow2 (exact distances, fixed-distance
    decode): forward, the gradients of x and every parameter, and decoded tokens, in float64."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop(backends.ENV_VAR, None)
    out = subprocess.run(
        [sys.executable, "-c", TRITON_MIXER, "pow2_ce", "pow2"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["auto_on_cpu"] in ("numba", "torch")  # auto never picks the interpreter
    for name, (ran, errs) in got["errors"].items():
        assert ran == "triton", f"{name}: the decode ran on {ran}"
        assert max(errs) <= 1e-10, f"{name}: triton vs torch relative errors {errs}"
        assert errs[0] > 0, f"{name}: bit-equal to torch: did the kernels run?"  # rounding apart (a tile inverse)


def test_triton_backend_refuses_cpu_tensors_off_the_interpreter():
    code = (
        "import torch; from tokenmix.ops.pattern import backend as b\n"
        "try:\n    b.choose_backend((torch.zeros(2),), 'triton')\nexcept Exception as e:\n    print(e)"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "backend 'triton'" in out.stdout and ("CUDA" in out.stdout or "not installed" in out.stdout)


def test_environment_variable_replaces_auto():
    code = (
        "import torch; from tokenmix.mixers import build_mixer; "
        "print(build_mixer('pow2', 12, n_heads=2)(torch.randn(1, 9, 12))[1].backend, "
        "build_mixer('pow2', 12, n_heads=2, backend='numba')(torch.randn(1, 9, 12))[1].backend)"
    )
    env = {**os.environ, backends.ENV_VAR: "torch"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    want = "torch numba" if numba_runtime.kernel_available() else "torch torch"
    assert out.stdout.split() == want.split()


def test_no_run_id_sees_the_backend():
    """Run ids hash the resolved run config: the backend (how) must not be in it (the quick preset,
    every mixer a row). The ids before and after the field was added were compared once over all
    4,836 runs of the compare presets, with and without TOKENMIX_PATTERN_BACKEND=torch: identical."""
    runs = get_preset("compare", "quick").build(mixer_names())
    assert any("pow2_ce" in cfg.model_config().layers for cfg in runs)
    for cfg in runs:
        resolved = json.dumps(cfg.to_dict(), sort_keys=True)
        assert '"backend"' not in resolved, f"{cfg.label} puts a backend into its run id"


@pytest.mark.parametrize("mode", ["chunked", "compiled"])
@pytest.mark.parametrize("name", ["pow2_ce", "sq1"])
def test_the_backend_is_chosen_from_the_tensors_the_ops_take(name, mode):
    """Under bfloat16 autocast x is float32 but the projections are bfloat16, which numba does not
    take: the call runs on torch (as it did before backends), not on a choice made from x alone."""
    torch.manual_seed(0)
    m = build_mixer(name, 16, n_heads=2, chunk_size=8)
    on_torch = build_mixer(name, 16, n_heads=2, chunk_size=8, backend="torch")
    on_torch.load_state_dict(m.state_dict())
    x = torch.randn(2, 30, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, state = m(x, mode=mode)
        y_torch, _ = on_torch(x, mode="chunked")
    assert state.backend == "torch"
    assert y.dtype == torch.bfloat16 and torch.equal(y, y_torch)
