"""The Triton pattern kernels (ops/pattern/triton_solve.py) under Triton's CPU interpreter (or, with
TRITON_INTERPRET=0 on a CUDA machine, compiled on the GPU: the same tests on CUDA tensors), against the
torch chunked path (``chunked_pattern_solve``, ``pattern_scores``) and the float64 references.

Outputs and every gradient (alpha, beta, x, y_prefix of the solve; q, kbuf of the scores; q, k, v and
the gates through the torch softmax / gate normalisation between them) on the index tables of pow2,
sq1, the lattices pow2_ce and sq1_ce reading a scattered cache, window:8 and a user f:EXPR; T not a
multiple of the kernels' chunk (16), B x H > 1, a prefix, left padding (zeroed coefficients on the
shared table) and packed rows (per-row tables, ``packed_table``). Float64 to 1e-10, float32 to 1e-5
relative. Shapes are tiny: the interpreter runs every program instance in numpy.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest  # noqa: E402

pytest.importorskip("triton")

import torch  # noqa: E402
from test_pattern_solve import _grads, buffer_table, f64  # noqa: E402

from tokenmix.core.errors import InputError  # noqa: E402
from tokenmix.core.packing import Packing  # noqa: E402
from tokenmix.ops.pattern import triton_solve  # noqa: E402
from tokenmix.ops.pattern.chunked import chunked_pattern_solve  # noqa: E402
from tokenmix.ops.pattern.plan import packed_table  # noqa: E402
from tokenmix.ops.pattern.reference import pattern_scores_reference, recurrent_pattern_solve  # noqa: E402
from tokenmix.ops.pattern.scores import pattern_scores  # noqa: E402
from tokenmix.ops.pattern.triton_solve import triton_pattern_scores, triton_pattern_solve  # noqa: E402
from tokenmix.patterns import get_pattern  # noqa: E402
from tolerances import FLOAT32_REL_TOL, FLOAT64_EXACT, assert_close, max_rel_err  # noqa: E402

DEVICE = "cpu" if triton_solve.interpreted() else "cuda"  # where the kernels run
pytestmark = pytest.mark.usefixtures("one_thread", "kernels_runnable")


@pytest.fixture(scope="module")
def kernels_runnable():
    """Fail (not skip) where the kernels were made for a GPU this machine lacks: something imported
    triton_solve before TRITON_INTERPRET=1 was set (set it earlier, e.g. in tests/conftest.py)."""
    if DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.fail("triton_solve was imported without TRITON_INTERPRET=1 and there is no GPU", pytrace=False)


SPECS = ["pow2", "sq1", "pow2_ce", "sq1_ce", "window:8", "f:3**k"]
T0, T = 9, 37  # a prefix (the lattices: a scattered cache), T = 2 chunks + 5


def _torch_solve(alpha, beta, idx, x, y_prefix):
    return chunked_pattern_solve(alpha, beta, idx, x, y_prefix, 16)


def _solve_inputs(g, idx, p, b=2, h=2, v=5):
    w = idx.shape[-1]
    t = idx.shape[-2]
    # signed neighbour coefficients of row sum ~1 at most (bounded outputs, like normalised ones)
    return [f64(g, b, t, h, uniform=True), f64(g, b, t, h, w) * 0.6 / w, f64(g, b, t, h, v), f64(g, b, p, h, v)]


def _run(fn, args, dtype, weight):
    """fn(*args) in dtype and the gradients of (out * weight).sum() for every arg (zeros for an
    argument the output does not read)."""
    leaves = [a.to(DEVICE, dtype).requires_grad_() for a in args]
    out = fn(*leaves)
    grads = _grads(out, leaves, weight.to(DEVICE, dtype))
    return out, [torch.zeros_like(a) if gr is None else gr for gr, a in zip(grads, leaves)]


def _assert_float32_close(got, want, what):
    assert got.dtype == torch.float32 and got.shape == want.shape, what
    if not want.numel():
        return
    err = max_rel_err(got, want)
    assert err <= FLOAT32_REL_TOL, f"{what}: max rel err {err:.2e} > {FLOAT32_REL_TOL:.0e}"


def _check(fast, torch_path, reference, args, names, what):
    """fast against the float64 reference (float64) and against the torch path (float32), outputs
    and the gradients of every input."""
    y_ref = reference(*[a.to(DEVICE) for a in args])
    weight = f64(torch.Generator().manual_seed(3), *y_ref.shape)
    want = _run(reference, args, torch.float64, weight)
    got = _run(fast, args, torch.float64, weight)
    assert_close(got[0], want[0], FLOAT64_EXACT, f"{what} output float64")
    for name, gf, gr in zip(names, got[1], want[1]):
        assert_close(gf, gr, FLOAT64_EXACT, f"{what} d{name} float64")
    got, want = _run(fast, args, torch.float32, weight), _run(torch_path, args, torch.float32, weight)
    _assert_float32_close(got[0], want[0], f"{what} output float32")
    for name, gf, gr in zip(names, got[1], want[1]):
        _assert_float32_close(gf, gr, f"{what} d{name} float32")


@pytest.mark.parametrize("spec", SPECS)
def test_solve_and_gradients_match_torch_path_and_reference(spec):
    idx, p = buffer_table(spec, T0, T)
    idx = idx.to(DEVICE)
    args = _solve_inputs(torch.Generator().manual_seed(len(spec)), idx, p)

    def with_table(solve):
        return lambda a, b, x, yp: solve(a, b, idx, x, yp)

    _check(
        with_table(triton_pattern_solve),
        with_table(_torch_solve),
        with_table(recurrent_pattern_solve),
        args,
        ["alpha", "beta", "x", "y_prefix"],
        spec,
    )


@pytest.mark.parametrize("spec", SPECS)
def test_scores_and_gradients_match_torch_path_and_reference(spec):
    idx, p = buffer_table(spec, T0, T)
    idx = idx.to(DEVICE)
    g = torch.Generator().manual_seed(len(spec) + 1)
    args = [f64(g, 2, T, 2, 6), f64(g, 2, p + T, 2, 6)]

    def with_table(scores):
        return lambda q, kbuf: scores(q, kbuf, idx)

    _check(
        with_table(triton_pattern_scores),
        with_table(pattern_scores),
        with_table(pattern_scores_reference),
        args,
        ["q", "kbuf"],
        spec,
    )


def _mixed(solve, scores, idx, valid, p, gated):
    """The structured mixer's segment on q, k, v, y_prefix (and gate logits): coefficients from a
    softmax of the scores (or tanh gates normalised by their L1 sum), neighbours outside ``valid``
    [1 or B, T, W] given exactly zero coefficient, then the solve."""

    def run(q, k_prefix, k, v, y_prefix, gates):
        mask = torch.cat([valid.new_ones(*valid.shape[:-1], 1), valid], -1)[:, :, None, :]  # [., T, 1, W + 1]
        if gated:
            gt = torch.tanh(gates) * mask
            coef = gt / (gt.abs().sum(-1, keepdim=True) + 1e-6)
        else:
            s = scores(q, torch.cat([k_prefix, k], 1), idx)
            logits = torch.cat([(q * k).sum(-1, keepdim=True), s], -1) / math.sqrt(q.shape[-1])
            coef = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1)
        return solve(coef[..., 0], coef[..., 1:], idx, v, y_prefix)

    return run


def _check_mixed(idx, valid, p, gated, what, b=2, h=2):
    t, w = idx.shape[-2], idx.shape[-1]
    g = torch.Generator().manual_seed(t + w)
    args = [f64(g, b, t, h, 4), f64(g, b, p, h, 4), f64(g, b, t, h, 4), f64(g, b, t, h, 5), f64(g, b, p, h, 5)]
    args.append(f64(g, b, t, h, w + 1))  # gate logits (read only when gated)
    fast = _mixed(triton_pattern_solve, triton_pattern_scores, idx, valid, p, gated)
    torch_path = _mixed(_torch_solve, pattern_scores, idx, valid, p, gated)
    reference = _mixed(recurrent_pattern_solve, pattern_scores_reference, idx, valid, p, gated)
    _check(fast, torch_path, reference, args, ["q", "k_prefix", "k", "v", "y_prefix", "gates"], what)


@pytest.mark.parametrize("spec,gated", [("pow2", False), ("sq1_ce", True)])
def test_left_padding_zeroed_coefficients(spec, gated):
    """Left-padded rows on the shared table: the neighbours before a row's start get coefficient 0
    (masked before the softmax / the gates' normalisation), as the mixer gives them."""
    idx = get_pattern(spec).neighbor_table(0, T).to(DEVICE)  # P = 0: buffer positions are absolute ones
    start = torch.tensor([0, 6], device=DEVICE)
    valid = (idx[None] >= start[:, None, None]) & (idx[None] >= 0)  # [B, T, W]
    _check_mixed(idx, valid, 0, gated, f"{spec} left padding")


@pytest.mark.parametrize("spec", ["pow2_ce", "sq1_ce"])
def test_packed_rows_per_row_tables(spec):
    """Packed rows of a lattice: per-row tables (``packed_table``), the first document continuing
    the cached prefix, boundaries inside and on chunk edges, scores and solve both per row."""
    idx, p = buffer_table(spec, T0, T)
    starts = Packing.from_lengths([[5, 11, 21], [T]]).starts.to(DEVICE)
    rows = packed_table(idx.to(DEVICE), get_pattern(spec).neighbor_table(0, T).to(DEVICE), starts, p)  # [B, T, W]
    assert rows.dim() == 3 and not torch.equal(rows[0], rows[1])
    _check_mixed(rows, rows >= 0, p, False, f"{spec} packed")


def test_several_value_blocks(monkeypatch):
    """V wider than a program's block: each block solves its columns, the partial sums of d alpha
    and d beta over the blocks are added."""
    monkeypatch.setattr(triton_solve, "_MAX_BLOCK_V", 16)
    idx, p = buffer_table("sq1", 3, 20)
    idx = idx.to(DEVICE)
    args = _solve_inputs(torch.Generator().manual_seed(4), idx, p, b=1, h=2, v=37)
    weight = f64(torch.Generator().manual_seed(5), 1, 20, 2, 37)
    got = _run(lambda a, b, x, yp: triton_pattern_solve(a, b, idx, x, yp), args, torch.float64, weight)
    want = _run(lambda a, b, x, yp: recurrent_pattern_solve(a, b, idx, x, yp), args, torch.float64, weight)
    for name, gf, gr in zip(["y", "alpha", "beta", "x", "y_prefix"], [got[0], *got[1]], [want[0], *want[1]]):
        assert_close(gf, gr, FLOAT64_EXACT, f"{name} with 3 value blocks")


@pytest.mark.parametrize("spec,t0,t", [("pow2", 0, 1), ("pow2", 5, 1), ("random", 7, 19)])
def test_one_token_no_levels_and_irregular_tables(spec, t0, t):
    """T = 1 (no level slot at all when P = 0: W = 0, or only prefix reads) and an irregular causal
    table (repeated and scattered reads): solve and scores with their gradients, float64."""
    idx, p = buffer_table(spec, t0, t)
    idx = idx.to(DEVICE)
    g = torch.Generator().manual_seed(t)
    args = _solve_inputs(g, idx, p, b=1, h=2, v=3) + [f64(g, 1, t, 2, 3), f64(g, 1, p + t, 2, 3)]

    def both(solve, scores):
        def run(a, b, x, yp, q, kbuf):
            return torch.cat([solve(a, b, idx, x, yp), scores(q, kbuf, idx)], -1)

        return run

    weight = f64(g, 1, t, 2, 3 + idx.shape[1])
    got = _run(both(triton_pattern_solve, triton_pattern_scores), args, torch.float64, weight)
    want = _run(both(recurrent_pattern_solve, pattern_scores_reference), args, torch.float64, weight)
    for name, gf, gr in zip(
        ["y, s", "alpha", "beta", "x", "y_prefix", "q", "kbuf"], [got[0], *got[1]], [want[0], *want[1]]
    ):
        assert_close(gf, gr, FLOAT64_EXACT, f"{spec} P={p} T={t}: {name}")


def test_tables_made_once_per_table_and_device():
    """The device tables are made on first use and kept for that idx (no upload per call); an
    in-place edit of idx makes new ones."""
    idx, p = buffer_table("pow2", 0, 20)
    device = torch.device(DEVICE)
    first = triton_solve._tables(idx, p, device)
    assert first.idx.device.type == DEVICE and first.starts.device.type == DEVICE
    assert triton_solve._tables(idx, p, device) is first
    assert triton_solve._tables(idx, p + 1, device) is not first
    idx[5, 0] = -1
    assert triton_solve._tables(idx, p, device) is not first


def test_refuses_what_the_torch_path_refuses_and_what_it_cannot_take():
    idx, p = buffer_table("pow2", 0, 10)
    a, b, x = (
        z.to(DEVICE) for z in (torch.rand(1, 10, 1), torch.rand(1, 10, 1, idx.shape[1]), torch.randn(1, 10, 1, 2))
    )
    bad = idx.clone()
    bad[4, 0] = 4  # reads itself
    with pytest.raises(InputError, match="not strictly earlier"):
        triton_pattern_solve(a, b, bad, x)
    with pytest.raises(InputError, match="shape mismatch"):
        triton_pattern_solve(a, b[..., :-1], idx, x)
    with pytest.raises(InputError, match="shape mismatch"):
        triton_pattern_scores(torch.randn(1, 10, 1, 3, device=DEVICE), torch.randn(1, 10, 2, 3, device=DEVICE), idx)
    with pytest.raises(InputError, match="shape mismatch: y_prefix"):
        triton_pattern_solve(a, b, idx, x, torch.randn(1, 3, 2, 2, device=DEVICE))
    # half precision is not the kernels' (the backend seam sends it to torch): refused, one line
    with pytest.raises(InputError, match="backend 'triton' takes float32 or float64"):
        triton_pattern_solve(*(z.to(torch.bfloat16) for z in (a, b)), idx, x.to(torch.bfloat16))
    with pytest.raises(InputError, match="backend 'triton' takes float32 or float64"):
        triton_pattern_scores(
            torch.randn(1, 10, 1, 3, device=DEVICE), torch.randn(1, 10, 1, 3).double().to(DEVICE), idx
        )


def test_imports_without_triton():
    """triton stays optional: without it the module imports, says so, and refuses calls."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from tokenmix.core.errors import InputError\n"
        "from tokenmix.ops.pattern import triton_solve as m\n"
        "assert not m.available()\n"
        "try:\n"
        "    m.triton_pattern_scores(torch.zeros(1, 2, 1, 3), torch.zeros(1, 2, 1, 3), torch.zeros(2, 1).long())\n"
        "except InputError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "triton not importable" in out.stdout
