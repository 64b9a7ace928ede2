"""The Triton decode reads (ops/pattern/triton_decode.py) against the torch references, and token by token.

Under Triton's interpreter (``TRITON_INTERPRET=1``, set here before triton is imported; the kernels
then run on CPU tensors): (a) ``triton_step_read`` / ``triton_lattice_step`` equal
``step_read_reference`` / ``lattice_step_reference`` in float32 and float64 with -1 slots, rows
that do not see some neighbours, B > 1, H > 1, several head and neighbour blocks, slots and masks
as numpy or as tensors, and an output that is a view into the value storage; (b) a structured
mixer's decode with its strategy's read swapped for the kernel (``FixedDistanceDecode`` of pow2
with left padding; ``NeighborSetDecode`` of pow2_ce and sq1_ce) equals the general step of the same
mixer on every token, and leaves the same cache, in float64. With ``TRITON_INTERPRET=0`` and a GPU
the same tests run on CUDA tensors.
"""

from __future__ import annotations

import os
import sys

# triton fixes interpretation when it is first imported (it jits its own tl.sum then): tests/conftest.py
# sets TRITON_INTERPRET=1 before anything imports it where there is no GPU; on a GPU it stays unset
LATE = "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from mixer_helpers import decode_tokens  # noqa: E402
from tokenmix.mixers import build_mixer, structured  # noqa: E402
from tokenmix.ops.pattern.lattice_step import LatticeStep  # noqa: E402
from tokenmix.ops.pattern.numba import lattice_step_reference, step_read_reference  # noqa: E402
from tokenmix.ops.pattern.triton_decode import available, triton_lattice_step, triton_step_read  # noqa: E402
from tolerances import FLOAT32_REL_TOL, FLOAT64_EXACT, assert_close, max_rel_err  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"
pytestmark = pytest.mark.skipif(
    not INTERPRETED and not torch.cuda.is_available(), reason="TRITON_INTERPRET=0 and no GPU"
)
REL_TOL = {torch.float32: FLOAT32_REL_TOL, torch.float64: FLOAT64_EXACT}
# (block_h, block_w): chosen from the shapes (one head block, one neighbour block), and small tiles:
# two head blocks (the second half empty at H = 3) and four neighbour blocks (the online softmax)
BLOCKS = {"auto": (None, None), "small_tiles": (2, 2)}


def _rand(g: torch.Generator, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).to(DEVICE)


def test_available_and_interpreted_when_asked():
    assert available()
    assert not (INTERPRETED and LATE), (
        "triton was imported before TRITON_INTERPRET=1 was set, so its kernels cannot be interpreted "
        "in this process: set the variable before anything imports triton (tests/conftest.py)"
    )


@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("as_tensor", [False, True], ids=["numpy", "tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_step_read_matches_reference(dtype, as_tensor, blocks):
    g = torch.Generator().manual_seed(0)
    b, s, h, k = 3, 12, 3, 8
    qkv = _rand(g, dtype, b, 5, 3, h, k)[:, 2]  # a strided token of a [B, T, 3, H, K] projection
    keys, values = _rand(g, dtype, b, s, h, k), 3 * _rand(g, dtype, b, s, h, k)
    slots = np.array([4, -1, 0, 3, 9, 7, -1, 1], np.int64)
    visible = np.ones((b, len(slots)), bool)
    visible[1, [0, 3]] = False  # row 1 does not read two neighbours (e.g. its padding)
    visible[2] = False  # row 2 reads only itself
    ref = step_read_reference(qkv, keys, values, slots, 0.7, qkv.new_empty(b, h, k), visible)
    want = values.clone()
    want[:, 11] = ref
    args = (torch.from_numpy(slots).to(DEVICE), torch.from_numpy(visible).to(DEVICE)) if as_tensor else (slots, visible)
    block_h, block_w = BLOCKS[blocks]
    # the output goes into the value slot 11, which no neighbour reads (as the fixed-distance decode does)
    out = triton_step_read(qkv, keys, values, args[0], 0.7, values[:, 11], args[1], block_h=block_h, block_w=block_w)
    assert out.data_ptr() == values[:, 11].data_ptr()
    assert max_rel_err(values, want) <= REL_TOL[dtype], f"{dtype} {blocks}: {max_rel_err(values, want):.2e}"
    assert_close(out[2], qkv[2, 2], REL_TOL[dtype], "a row with no visible neighbour outputs its own v")
    every = triton_step_read(qkv, keys, values, args[0], 0.7, qkv.new_empty(b, h, k), block_h=block_h)
    ref = step_read_reference(qkv, keys, values, slots, 0.7, qkv.new_empty(b, h, k), np.ones_like(visible))
    assert max_rel_err(every, ref) <= REL_TOL[dtype], "visible=None reads every neighbour"


def test_step_read_without_neighbours_outputs_v():
    g = torch.Generator().manual_seed(1)
    qkv, cache = _rand(g, torch.float64, 2, 3, 2, 4), _rand(g, torch.float64, 2, 3, 2, 4)
    out = triton_step_read(qkv, cache, cache, np.zeros(0, np.int64), 0.5, qkv.new_empty(2, 2, 4))
    assert torch.equal(out, qkv[:, 2])


def _lattice_case(g: torch.Generator, dtype: torch.dtype):
    """test_pattern_kernels' case: a cache holding positions 2, 5, 8, 9, 10 at storage slots 6, 0, 3,
    1, 2 (slot 7 never written); token 11 reads 10, 9 and 2 (table order, a -1 entry), token 12
    reads 11, 10, 8 and 5: the next cache is {5, 8, 10, 11} at slots 0, 3, 2 and 7."""
    b, h, k = 2, 3, 4
    qkv = _rand(g, dtype, b, 3, h, k)
    kv = torch.stack([_rand(g, dtype, b, 9, h, k), _rand(g, dtype, b, 9, h, k)])
    return qkv, kv, np.array([2, 5, 8, 9, 10]), np.array([6, 0, 3, 1, 2]), np.array([10, 9, -1, 2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_lattice_step_matches_reference(dtype):
    qkv, kv, held, slots, row = _lattice_case(torch.Generator().manual_seed(2), dtype)
    nxt = np.array([11, 10, 8, -1, 5])
    step = LatticeStep(held, slots, 7, row, nxt, 11)
    want = kv.clone()
    keep_ref, slots_ref = lattice_step_reference(qkv, want, step, 0.5)
    got = kv.clone()
    keep, new_slots = triton_lattice_step(qkv, got, step, 0.5)
    assert keep.tolist() == keep_ref.tolist() == [5, 8, 10, 11]
    assert new_slots.tolist() == slots_ref.tolist() == [0, 3, 2, 7]
    assert max_rel_err(got, want) <= REL_TOL[dtype]
    assert torch.equal(got[0], want[0]), "the token's key goes to kv[0, :, end] as it is"
    assert torch.equal(got[:, :, :7], kv[:, :, :7]) and torch.equal(got[:, :, 8:], kv[:, :, 8:]), "nothing else moved"


def test_lattice_step_refuses_what_the_reference_refuses():
    qkv, kv, held, slots, row = _lattice_case(torch.Generator().manual_seed(3), torch.float64)
    before = kv.clone()
    cases = {
        "a row names a position not held": (np.array([2, 5, 8, 9, 12]), row, np.array([11, 10, 8, -1, 5])),
        "the next row names a position not held": (held, row, np.array([11, 10, 7])),
        "pos + 1 does not read pos": (held, row, np.array([10, 9])),
        "a position past every held one": (held, np.array([10, 13]), np.array([11])),
    }
    for what, (h, r, nxt) in cases.items():
        step = LatticeStep(h, slots, 7, r, nxt, 11)
        assert lattice_step_reference(qkv, kv.clone(), step, 0.5) is None, what
        assert triton_lattice_step(qkv, kv, step, 0.5) is None, what
        assert torch.equal(kv, before), f"{what}: nothing written"


def test_first_lattice_step_from_an_empty_cache():
    g = torch.Generator().manual_seed(4)
    qkv, kv = _rand(g, torch.float64, 1, 3, 2, 4), _rand(g, torch.float64, 2, 1, 16, 2, 4)
    empty = np.zeros(0, np.int64)
    step = LatticeStep(empty, empty, 0, np.array([-1, -1]), np.array([0, -1]), 0)
    keep, new_slots = triton_lattice_step(qkv, kv, step, 0.5)
    assert keep.tolist() == [0] and new_slots.tolist() == [0]
    assert torch.equal(kv[1, :, 0], qkv[:, 2]) and torch.equal(kv[0, :, 0], qkv[:, 1])


@pytest.fixture
def kernel_calls(monkeypatch) -> dict[str, int]:
    """The decode strategies' reads (the backend seam's dispatchers) swapped for the Triton kernels;
    counts the calls."""
    calls = {"step_read": 0, "lattice_step": 0}

    def step_read(*args):
        calls["step_read"] += 1
        return triton_step_read(*args)

    def lattice_step(qkv, kv, kv_np, *rest):
        calls["lattice_step"] += 1
        return triton_lattice_step(qkv, kv, *rest)

    # the strategies call backends.step_read(backend, ...) and backends.lattice_step(backend, ...)
    monkeypatch.setattr(structured.backends, "step_read", lambda backend, *args: step_read(*args))
    monkeypatch.setattr(structured.backends, "lattice_step", lambda backend, *args: lattice_step(*args))
    return calls


@pytest.mark.parametrize(
    "name,strategy,start",
    [("pow2", "fixed_distance", [0, 3, 9]), ("pow2_ce", "neighbor_set", None), ("sq1_ce", "neighbor_set", None)],
)
def test_decode_with_the_kernels_equals_the_general_step(name, strategy, start, kernel_calls):
    """Every token (prefill and steps) through the kernel vs the general step (autograd on: the
    parameters require grad) of the same mixer, in float64: outputs and the cache left behind."""
    torch.manual_seed(5)
    m = build_mixer(name, 16, n_heads=2).double().to(DEVICE)
    x = torch.randn(3, 60, 16, dtype=torch.float64).to(DEVICE)
    assert m.init_state(3).strategy == strategy
    with torch.no_grad():
        y_fast, s_fast = decode_tokens(m, x, start, prefill=20)
    used = "step_read" if strategy == "fixed_distance" else "lattice_step"
    assert kernel_calls == {"step_read": 0, "lattice_step": 0, used: 60}, "every token read by the kernel"
    y_gen, s_gen = decode_tokens(m, x, start, prefill=20)
    assert kernel_calls[used] == 60, "the general step calls no kernel"
    assert_close(y_fast, y_gen.detach(), FLOAT64_EXACT, f"{name} outputs token by token")
    assert s_fast.positions.tolist() == s_gen.positions.tolist()
    for key, t in s_fast.tensors().items():
        assert_close(t, s_gen.tensors()[key].detach(), FLOAT64_EXACT, f"{name} cache {key}")
