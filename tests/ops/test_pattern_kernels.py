"""The compiled (numba) pattern kernels against the references, and the fallback that replaces them.

The generic mixer matrix already runs the ``compiled`` mode (the numba backend) of every structured
mixer against its ``dense`` mode and its ``chunked`` mode on the torch backend (outputs, gradients,
states). Here the kernels meet the operator-level references directly on every table kind (exact
patterns, lattices reading a scattered cache, Fenwick, dense, an irregular random table), with
prefixes and all gradients, in float64; and the decode reads of the numba and torch backends
(``backend.step_read``, ``backend.lattice_step``) meet their definition.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from test_pattern_solve import SPECS, _check_solve_against_dense, _grads, buffer_table, f64

from mixer_helpers import small_mixer
from tokenmix.mixers import structured
from tokenmix.ops import numba_runtime
from tokenmix.ops.pattern import backend as backends
from tokenmix.ops.pattern import numba as pattern_kernels
from tokenmix.ops.pattern.lattice_step import LatticeStep
from tokenmix.ops.pattern.numba import compiled_pattern_scores, compiled_pattern_solve
from tokenmix.ops.pattern.reference import pattern_scores_reference
from tolerances import FLOAT32_REL_RMS, FLOAT64_EXACT, assert_close, rel_rms

pytestmark = pytest.mark.skipif(not pattern_kernels.kernel_available(), reason="numba not importable")
SEGMENTS = [(0, 1), (0, 90), (13, 47), (40, 130)]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("t0,t", SEGMENTS, ids=[f"P{a}_T{b}" for a, b in SEGMENTS])
def test_compiled_solve_and_gradients_match_dense_reference(spec, t0, t):
    idx, p = buffer_table(spec, t0, t)
    _check_solve_against_dense(spec, idx, p, torch.Generator().manual_seed(t0 + 7 * t), 0, solve=compiled_pattern_solve)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("t0,t", SEGMENTS, ids=[f"P{a}_T{b}" for a, b in SEGMENTS])
def test_compiled_scores_and_gradients_match_gathered_reference(spec, t0, t):
    idx, p = buffer_table(spec, t0, t)
    g = torch.Generator().manual_seed(t + 3)
    q, kbuf = f64(g, 2, t, 3, 5), f64(g, 2, p + t, 3, 5)
    fast = [q.clone().requires_grad_(), kbuf.clone().requires_grad_()]
    ref = [q.clone().requires_grad_(), kbuf.clone().requires_grad_()]
    s, s_ref = compiled_pattern_scores(fast[0], fast[1], idx), pattern_scores_reference(ref[0], ref[1], idx)
    assert_close(s, s_ref, FLOAT64_EXACT, f"{spec} scores")
    ws = f64(g, *s.shape)
    for name, gf, gr in zip(["q", "k"], _grads(s, fast, ws), _grads(s_ref, ref, ws)):
        assert_close(gf, gr, FLOAT64_EXACT, f"{spec} d{name}")


def test_compiled_solve_float32_and_gradcheck():
    idx, p = buffer_table("sq1_ce", 9, 40)
    g = torch.Generator().manual_seed(5)
    args = [
        f64(g, 1, 40, 2, uniform=True),
        f64(g, 1, 40, 2, idx.shape[1]) * 0.3,
        f64(g, 1, 40, 2, 3),
        f64(g, 1, p, 2, 3),
    ]
    y64 = compiled_pattern_solve(args[0], args[1], idx, args[2], args[3])
    y32 = compiled_pattern_solve(*(a.float() for a in args[:2]), idx, *(a.float() for a in args[2:]))
    assert y32.dtype == torch.float32 and rel_rms(y32.double(), y64) <= FLOAT32_REL_RMS
    small = [a[:, :12].clone().requires_grad_() for a in args[:3]] + [args[3].clone().requires_grad_()]
    assert torch.autograd.gradcheck(lambda a, b, x, yp: compiled_pattern_solve(a, b, idx[:12], x, yp), small)


def test_compiled_kernels_refuse_what_the_references_refuse():
    idx, p = buffer_table("pow2", 0, 10)
    a, b, x = (
        torch.rand(1, 10, 1, dtype=torch.float64),
        torch.rand(1, 10, 1, idx.shape[1], dtype=torch.float64),
        torch.randn(1, 10, 1, 2, dtype=torch.float64),
    )
    bad = idx.clone()
    bad[4, 0] = 4
    with pytest.raises(ValueError, match="not strictly earlier"):
        compiled_pattern_solve(a, b, bad, x)
    with pytest.raises(ValueError, match="shape mismatch"):
        compiled_pattern_solve(a, b[..., :1], idx, x)
    with pytest.raises(ValueError, match="not strictly earlier"):
        compiled_pattern_scores(x, x, bad)


def _read_formula(qkv, keys, values, read, scale):
    q, k, v = qkv.unbind(1)
    logits = torch.cat([(q * k).sum(-1, keepdim=True), torch.einsum("bhk,bwhk->bhw", q, keys[:, read])], -1) * scale
    coef = torch.softmax(logits, -1)
    return coef[..., :1] * v + torch.einsum("bhw,bwhv->bhv", coef[..., 1:], values[:, read])


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_decode_reads_match_their_definition(backend):
    """One decode read (scores, softmax over the self slot and the cached neighbours, weighted sum)
    and the lattice step on slot-stable storage, by the numba kernel and by the torch backend."""

    def step_read(*args):
        return backends.step_read(backend, *args)

    def lattice_step(*args):
        return backends.lattice_step(backend, *args)

    g = torch.Generator().manual_seed(0)
    b, s, h, k = 2, 5, 3, 4
    qkv, keys, values = f64(g, b, 3, h, k), f64(g, b, s, h, k), f64(g, b, s, h, k)
    out = step_read(qkv, keys, values, np.array([4, -1, 0, 3]), 0.5, qkv.new_empty(b, h, k))
    assert_close(out, _read_formula(qkv, keys, values, torch.tensor([4, 0, 3]), 0.5), FLOAT64_EXACT, "step_read")
    # a cache holding positions 2, 5, 8, 9, 10 at storage slots 6, 0, 3, 1, 2 (slot 7 never written);
    # token 11 reads 10, 9 and 2 (table order, a -1 slot), token 12 reads 11, 10, 8 and 5: the next
    # cache is {5, 8, 10, 11} at slots 0, 3, 2 and 7, where the token's key and output went
    kv = torch.stack([f64(g, b, 8, h, k), f64(g, b, 8, h, k)])
    before = kv.clone()
    held, slots = np.array([2, 5, 8, 9, 10]), np.array([6, 0, 3, 1, 2])
    row, nxt = np.array([10, 9, -1, 2]), np.array([11, 10, 8, -1, 5])
    keep, new_slots = lattice_step(qkv, kv, None, LatticeStep(held, slots, 7, row, nxt, 11), 0.5)
    assert keep.tolist() == [5, 8, 10, 11] and new_slots.tolist() == [0, 3, 2, 7]
    want = _read_formula(qkv, before[0], before[1], torch.tensor([2, 1, 6]), 0.5)
    assert_close(kv[1, :, 7], want, FLOAT64_EXACT, "lattice read")
    assert torch.equal(kv[0, :, 7], qkv[:, 1]) and torch.equal(kv[:, :, :7], before[:, :, :7])  # nothing else moved
    # a cache that lacks a position the rows name is left to the general step, nothing written
    kv = before.clone()
    not_held = LatticeStep(np.array([2, 5, 8, 9, 12]), slots, 7, row, nxt, 11)
    skips_pos = LatticeStep(held, slots, 7, row, np.array([10, 9]), 11)  # 12 must read 11
    assert lattice_step(qkv, kv, None, not_held, 0.5) is None
    assert lattice_step(qkv, kv, None, skips_pos, 0.5) is None
    assert torch.equal(kv, before)


@pytest.mark.parametrize("name", ["pow2", "sq1_ce"])
def test_disabled_kernels_fall_back_to_chunked_with_one_warning(name, monkeypatch):
    """``TOKENMIX_NO_COMPILED`` (or numba missing): the compiled mode is the chunked mode, warned once."""
    m = small_mixer(name)
    x = torch.randn(2, 37, m.d_model, dtype=torch.float64)
    y_compiled, s_compiled = m(x, mode="compiled")
    monkeypatch.setattr(numba_runtime, "ENABLED", False)
    structured._warn_no_kernel.cache_clear()
    with pytest.warns(RuntimeWarning, match="compiled pattern kernels are unavailable") as record:
        y_fallback, s_fallback = m(x, mode="compiled")
        m(x, mode="compiled")
    assert len([w for w in record if "unavailable" in str(w.message)]) == 1
    y_chunked, _ = m(x, mode="chunked")
    assert torch.equal(y_fallback, y_chunked)
    assert_close(y_fallback, y_compiled, FLOAT64_EXACT, f"{name}: fallback vs compiled")
    assert torch.equal(s_fallback.positions, s_compiled.positions)
    assert_close(s_fallback.values, s_compiled.values, FLOAT64_EXACT, f"{name}: cached outputs")


def test_environment_variable_disables_the_kernels():
    code = "from tokenmix.ops.pattern import numba as k; print(k.kernel_available())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"TOKENMIX_NO_COMPILED": "1", "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "False"


def test_half_precision_and_other_devices_take_the_pytorch_path():
    m = small_mixer("pow2")
    x = torch.randn(1, 20, m.d_model, dtype=torch.float64)
    y64, _ = m(x, mode="compiled")
    yb, _ = m.to(torch.bfloat16)(x.to(torch.bfloat16), mode="compiled")
    assert yb.dtype == torch.bfloat16 and torch.isfinite(yb).all()
    assert (yb.double() - y64).abs().max() < 0.1


IDLE_WORKERS = """
import time, torch
from tokenmix.ops.pattern import numba as k
torch.set_num_threads(2)
b, t, h, v = 4, 64, 2, 16
alpha, beta, x = torch.rand(b, t, h), torch.rand(b, t, h, 3), torch.randn(b, t, h, v)
idx = torch.arange(t)[:, None] - torch.tensor([1, 2, 4])
idx[idx < 0] = -1
k.compiled_pattern_solve(alpha, beta, idx, x)
cpu, own = time.process_time(), time.thread_time()
for _ in range(200):          # small kernels with idle gaps between them, as in a training step
    k.compiled_pattern_solve(alpha, beta, idx, x)
    time.sleep(0.002)
print((time.process_time() - cpu) - (time.thread_time() - own))
"""


def test_idle_kernel_workers_sleep_in_a_plain_python_process():
    """A library user's process (torch imported first, no OMP_WAIT_POLICY) must not pay for
    kernel workers that spin between kernels: numba's OpenMP layer shared torch's libgomp, whose
    idle threads spun ~4 ms after every call (~0.7 CPU-s over these 200 calls, against ~0.02 s)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_WAIT_POLICY", "NUMBA_THREADING_LAYER", "NUMBA_NUM_THREADS")
    }
    out = subprocess.run([sys.executable, "-c", IDLE_WORKERS], env=env, capture_output=True, text=True, check=True)
    others = float(out.stdout.strip())  # CPU seconds of every thread but the caller's
    assert others < 0.2, f"kernel worker threads burned {others:.2f} CPU-s while idle"
