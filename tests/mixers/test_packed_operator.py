"""The (A, B) view of a packed batch: ``materialize_packed`` is block-diagonal over each row's
documents, every block the operator of its document alone, also where the operator has a G axis that
grows with the length (Fenwick levels) or several rows per token (DeltaProduct's sub-steps)."""

from __future__ import annotations

import pytest
import torch

from mixer_helpers import small_mixer
from tokenmix.core.operator import solve_dense
from tokenmix.core.packing import Packing
from tokenmix.mixers.registry import get_mixer_spec, mixer_names
from tolerances import FLOAT64_EXACT, assert_close

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", ["pow2_ce", "attention", "log_linear_mamba2", "gated_delta_product", "mamba2"])
def test_packed_operator_is_block_diagonal_over_documents(name):
    m = small_mixer(name)
    packing = Packing.from_lengths([[1, 4, 6], [5, 6]])
    x = torch.randn(2, 11, 12, dtype=torch.float64)
    op = m.materialize_packed(x, packing)
    r = op.A.shape[-1] // 11  # rows per token
    for b in range(2):
        docs = packing.documents(b)
        inside = torch.zeros(11 * r, 11 * r, dtype=torch.bool)
        for t0, t1 in docs:
            inside[r * t0 : r * t1, r * t0 : r * t1] = True
            alone = m.materialize(x[b : b + 1, t0:t1])
            for part in ("A", "B", "R"):
                got, want = getattr(op, part), getattr(alone, part)
                if want is None:
                    assert got is None
                    continue
                block = got[b][tuple(slice(0, n) for n in want.shape[1:-2])][..., r * t0 : r * t1, r * t0 : r * t1]
                assert_close(block, want[0], FLOAT64_EXACT, f"{name} {part} block [{t0}, {t1}) of row {b}")
        for part in ("A", "B", "R"):
            if getattr(op, part) is not None:
                assert not bool(getattr(op, part)[b][..., ~inside].any()), f"{name} {part} crosses a document"
    # the mixing matrix of the packed operator is the documents' own, side by side
    v = torch.randn(2, 11 * r, op.A.shape[1], 3, dtype=torch.float64)
    if op.A.dim() == 4:
        y = solve_dense(op, v)
        for b in range(2):
            for t0, t1 in packing.documents(b):
                alone = solve_dense(m.materialize(x[b : b + 1, t0:t1]), v[b : b + 1, r * t0 : r * t1])
                assert_close(y[b, r * t0 : r * t1], alone[0], FLOAT64_EXACT, f"{name} solve of [{t0}, {t1})")


def test_native_packing_modes_are_modes_of_the_mixer():
    """A mode listed in ``packing_modes`` that the mixer does not have would never run natively (the
    packed column then tests only the piece-wise path and says nothing about a kernel)."""
    wrong = {n: get_mixer_spec(n).cls.packing_modes for n in mixer_names()}
    wrong = {n: p for n, p in wrong.items() if not set(p) <= set(get_mixer_spec(n).cls.modes)}
    assert not wrong, wrong


def test_a_replaced_kernel_does_not_inherit_the_packing_claim():
    """A member of a kernel base that replaces the chunked kernel must say whether it honours document
    boundaries: left unsaid, the class is refused when defined; said, it stands (as Mamba-2 says it)."""
    base = get_mixer_spec("gla").cls
    assert "chunked" in base.packing_modes
    with pytest.raises(TypeError, match="declare packing_modes"):
        type("OwnKernel", (base,), {"_mix_chunked": lambda self, *a, **k: None})
    for claim in ((), ("chunked",)):
        cls = type("OwnKernel", (base,), {"_mix_chunked": lambda self, *a, **k: None, "packing_modes": claim})
        assert cls.packing_modes == claim
    assert "packing_modes" in get_mixer_spec("mamba2").cls.__dict__  # replaces it, says so
