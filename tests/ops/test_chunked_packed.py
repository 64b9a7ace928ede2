"""Packed rows in the chunked matrix-state recurrences (ops/chunked_gla.py, ops/chunked_ssd.py,
ops/chunked_delta.py with the masks of ops/chunk_boundaries.py), float64.

Each op called with ``doc_starts`` must equal the same op run on every document alone, the first
document of a row continuing from the initial state and every later one from zero: outputs, the
final state (each row's last document's) and the gradients of every input, including the
hand-written backwards. The rows put boundaries at chunk edges and inside chunks, documents of one
token (first, inside, last), a document over several chunks and a row without a boundary; chunk
sizes from 1 to longer than the row, and decays strong enough for the safe forms.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tokenmix.core.errors import InputError
from tokenmix.core.packing import Packing
from tokenmix.ops.chunk_boundaries import chunk_boundaries
from tokenmix.ops.chunked_delta import chunk_state_recurrence, chunk_state_recurrence_reference, chunked_delta_rule
from tokenmix.ops.chunked_gla import chunked_gla
from tokenmix.ops.chunked_ssd import chunked_ssd
from tolerances import FLOAT64_EXACT, assert_close

pytestmark = pytest.mark.usefixtures("one_thread")

DT = torch.float64
T = 19
# with C = 4: row 0 has boundaries on a chunk edge (4) and inside a chunk (5, 6: two one-token
# documents), a document over three chunks and a last one across the partial chunk; row 1 none (the
# initial state runs to the end); row 2 ends with a one-token document; row 3 begins with one
LENGTHS = [[4, 1, 1, 9, 4], [19], [2, 3, 13, 1], [1, 3, 15]]
CHUNKS = [1, 3, 4, 8, 64]


def _packing(r: int = 1) -> Packing:
    """LENGTHS on a clock of r positions per token."""
    return Packing.from_lengths([[r * n for n in row] for row in LENGTHS])


def _check_against_documents(op, inputs, s0, packing, what, per_token=1, tol=FLOAT64_EXACT):
    """op(*inputs, s0, doc_starts) -> (o, s) against op(*inputs[document], s0 or None, None) per
    document: outputs, final states and the gradients of every input (``per_token`` input positions
    per output row)."""
    leaves = [z.requires_grad_() for z in (*inputs, s0) if z is not None]
    o, s = op(*inputs, s0, packing.starts)
    w_o, w_s = torch.randn_like(o), torch.randn_like(s)
    grads = torch.autograd.grad((o * w_o).sum() + (s * w_s).sum(), leaves)
    loss, outs, finals = 0.0, torch.zeros_like(o), []
    for b in range(o.shape[0]):
        for i, (t0, t1) in enumerate(packing.documents(b)):
            part = [None if z is None else z[b : b + 1, t0:t1] for z in inputs]
            o_d, s_d = op(*part, s0[b : b + 1] if i == 0 else None, None)
            rows = slice(t0 // per_token, t1 // per_token)
            outs[b, rows] = o_d[0].detach()
            loss = loss + (o_d[0] * w_o[b, rows]).sum()
        loss = loss + (s_d * w_s[b : b + 1]).sum()
        finals.append(s_d.detach())
    grads_ref = torch.autograd.grad(loss, leaves)
    assert_close(o.detach(), outs, tol, f"{what} output")
    assert_close(s.detach(), torch.cat(finals), tol, f"{what} final state")
    for i, (got, want) in enumerate(zip(grads, grads_ref)):
        assert_close(got, want, 10 * tol, f"{what} gradient of input {i}")


def test_chunk_masks():
    """The four masks of one row (documents [0, 2), [2, 5), [5, 6), [6, 7)) over chunks of 4, the last padded."""
    bounds = chunk_boundaries(Packing.from_lengths([[2, 3, 1, 1]]).starts, 2, 4, DT)
    doc = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3])  # the padding position continues the last document
    same = (doc[:, None] == doc[None, :]).to(DT).view(2, 4, 2, 4).diagonal(dim1=0, dim2=2).permute(2, 0, 1)
    assert torch.equal(bounds.same[:, 0], same)
    assert bounds.reads[:, 0, :, 0].tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]  # chunk 0: the first document
    assert bounds.writes[:, 0, :, 0].tolist() == [[0, 0, 1, 1], [0, 0, 1, 1]]
    assert bounds.carry[:, 0].tolist() == [0, 0]
    unpacked = chunk_boundaries(torch.zeros(1, 7, dtype=torch.long), 2, 4, DT)
    assert all(bool((m == 1).all()) for m in unpacked)


@pytest.mark.parametrize("kind", ["none", "per_head", "per_key"])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_gla_packed_equals_documents_alone(kind, chunk):
    torch.manual_seed(0)
    b, h, dk, dv = len(LENGTHS), 2, 5, 3
    q, k, v = torch.randn(b, T, h, dk, dtype=DT), torch.randn(b, T, h, dk, dtype=DT), torch.randn(b, T, h, dv, dtype=DT)
    g = {
        "none": None,
        "per_head": F.logsigmoid(torch.randn(b, T, h, dtype=DT)),
        "per_key": F.logsigmoid(torch.randn(b, T, h, dk, dtype=DT)),
    }[kind]
    s0 = torch.randn(b, h, dk, dv, dtype=DT)

    def op(q, k, v, g, s0, doc_starts):
        return chunked_gla(q, k, v, g, 0.7, s0, chunk, doc_starts)

    _check_against_documents(op, (q, k, v, g), s0, _packing(), f"gla {kind} C={chunk}")


@pytest.mark.parametrize("kind", ["per_head", "per_key"])
def test_gla_packed_factored_and_safe_chunks(kind):
    """Saturated decays (-400 per token) in some chunks, one of them holding boundaries: those rows take
    the safe form, the others the factored one, both masked."""
    torch.manual_seed(1)
    b, h, dk, dv = len(LENGTHS), 2, 5, 3
    q, k, v = torch.randn(b, T, h, dk, dtype=DT), torch.randn(b, T, h, dk, dtype=DT), torch.randn(b, T, h, dv, dtype=DT)
    g = F.logsigmoid(torch.randn(b, T, h, *([dk] if kind == "per_key" else []), dtype=DT))
    g[0, 4:8] = -400.0  # row 0's chunk 1 (boundaries at 4, 5, 6)
    g[2, 16] = -500.0
    s0 = torch.randn(b, h, dk, dv, dtype=DT)

    def op(q, k, v, g, s0, doc_starts):
        return chunked_gla(q, k, v, g, 0.7, s0, 4, doc_starts)

    _check_against_documents(op, (q, k, v, g), s0, _packing(), f"gla {kind} mixed forms")


@pytest.mark.parametrize("decays", ["mild", "some wide", "all wide"])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_ssd_packed_equals_documents_alone(decays, chunk):
    """Mild decays run the SSD kernel; chunks whose span is too wide for its factors go to chunked_gla's
    safe form inside it (some wide), or the whole call to chunked_gla (all wide)."""
    torch.manual_seed(2)
    b, h, n, p = len(LENGTHS), 3, 5, 4
    c, bk, x = torch.randn(b, T, n, dtype=DT), torch.randn(b, T, n, dtype=DT), torch.randn(b, T, h, p, dtype=DT)
    g = F.logsigmoid(torch.randn(b, T, h, dtype=DT))
    if decays == "some wide":
        g[0, 5] = -800.0
        g[2, 17] = -900.0
    elif decays == "all wide":
        g = torch.full_like(g, -800.0)
    s0 = torch.randn(b, h, n, p, dtype=DT)

    def op(c, bk, x, g, s0, doc_starts):
        return chunked_ssd(c, bk, x, g, 0.7, s0, chunk, doc_starts)

    _check_against_documents(op, (c, bk, x, g), s0, _packing(), f"ssd {decays} C={chunk}")


@pytest.mark.parametrize("gated", [False, True], ids=["delta", "gated"])
@pytest.mark.parametrize("r", [1, 2])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_delta_packed_equals_documents_alone(gated, r, chunk):
    """With r = 2 (DeltaProduct's sub-step clock) the documents hold whole tokens of two positions."""
    torch.manual_seed(3)
    b, h, dk, dv, t = len(LENGTHS), 2, 5, 3, r * T
    q, v = torch.randn(b, t, h, dk, dtype=DT), torch.randn(b, t, h, dv, dtype=DT)
    k = F.normalize(torch.randn(b, t, h, dk, dtype=DT), dim=-1)
    beta = 2 * torch.rand(b, t, h, dtype=DT)
    g = F.logsigmoid(2 * torch.randn(b, t, h, dtype=DT)) if gated else None
    s0 = torch.randn(b, h, dk, dv, dtype=DT)

    def op(q, k, v, beta, g, s0, doc_starts):
        return chunked_delta_rule(q, k, v, beta, g, 0.6, s0, chunk, read_every=r, doc_starts=doc_starts)

    _check_against_documents(op, (q, k, v, beta, g), s0, _packing(r), f"delta r={r} C={chunk}", per_token=r)


@pytest.mark.parametrize("decay", ["none", "scalar"])
def test_chunk_recurrence_with_reset_chunks_equals_autograd(decay):
    """The delta rule's hand-written chunk recurrence as a packed call drives it: chunk decays of 0
    where a document begins (the decay alone, or the 0 / 1 carry mask without a gate), zero rows of W
    (documents that do not read the entering state) and of K (keys that do not write the leaving
    state), against autograd through the plain loop."""
    torch.manual_seed(4)
    b, h, n, c, dk, dv = 2, 3, 5, 4, 3, 2
    u0, w, k = (torch.randn(b, h, n, c, x, dtype=DT) for x in (dv, dk, dk))
    carry = (torch.rand(b, 1, n, 1, 1) < 0.5).to(DT)
    w = w * (torch.rand(b, 1, n, c, 1) < 0.7).to(DT)
    k = k * (torch.rand(b, 1, n, c, 1) < 0.7).to(DT)
    d = carry if decay == "none" else torch.rand(b, h, n, 1, 1, dtype=DT) * carry
    s0 = torch.randn(b, h, dk, dv, dtype=DT)
    leaves = [z.requires_grad_() for z in (u0, w, k, d, s0)]
    fast, ref = chunk_state_recurrence(u0, w, k, d, s0), chunk_state_recurrence_reference(u0, w, k, d, s0)
    weights = [torch.randn_like(x) for x in ref]
    for got, want, what in zip(fast, ref, ("u", "starts", "final state")):
        assert_close(got, want, FLOAT64_EXACT, what)
    g_fast = torch.autograd.grad(sum((x * wt).sum() for x, wt in zip(fast, weights)), leaves)
    g_ref = torch.autograd.grad(sum((x * wt).sum() for x, wt in zip(ref, weights)), leaves)
    for got, want in zip(g_fast, g_ref):
        assert_close(got, want, FLOAT64_EXACT, "gradient")


def test_packed_gradcheck():
    """torch.autograd.gradcheck through the hand-written backwards of a packed call."""
    torch.manual_seed(5)
    starts = Packing.from_lengths([[2, 1, 4], [7]]).starts
    q, k = torch.randn(2, 7, 1, 3, dtype=DT), torch.randn(2, 7, 1, 3, dtype=DT)
    v, g = torch.randn(2, 7, 1, 2, dtype=DT), F.logsigmoid(torch.randn(2, 7, 1, 3, dtype=DT))
    s0 = torch.randn(2, 1, 3, 2, dtype=DT)
    leaves = tuple(z.requires_grad_() for z in (q, k, v, g, s0))
    assert torch.autograd.gradcheck(lambda *z: chunked_gla(*z[:4], 0.5, z[4], 4, starts), leaves)
    c, bk, x = q[:, :, 0].detach(), k[:, :, 0].detach(), torch.randn(2, 7, 2, 2, dtype=DT)
    gh, s1 = g[:, :, 0, :2].detach(), torch.randn(2, 2, 3, 2, dtype=DT)
    leaves = tuple(z.requires_grad_() for z in (c, bk, x, gh, s1))
    assert torch.autograd.gradcheck(lambda *z: chunked_ssd(*z[:4], 0.5, z[4], 4, starts), leaves)


def test_one_document_per_row_is_the_unpacked_call():
    """doc_starts of zeros (every row one document) gives the unpacked results."""
    torch.manual_seed(6)
    q, k, v = torch.randn(2, 9, 2, 3, dtype=DT), torch.randn(2, 9, 2, 3, dtype=DT), torch.randn(2, 9, 2, 2, dtype=DT)
    g, s0 = F.logsigmoid(torch.randn(2, 9, 2, dtype=DT)), torch.randn(2, 2, 3, 2, dtype=DT)
    zeros = torch.zeros(2, 9, dtype=torch.long)
    for packed, plain in zip(chunked_gla(q, k, v, g, 0.5, s0, 4, zeros), chunked_gla(q, k, v, g, 0.5, s0, 4)):
        assert_close(packed, plain, FLOAT64_EXACT, "gla")
    c, bk = q[:, :, 0], k[:, :, 0]
    for packed, plain in zip(chunked_ssd(c, bk, v, g, 1.0, s0, 4, zeros), chunked_ssd(c, bk, v, g, 1.0, s0, 4)):
        assert_close(packed, plain, FLOAT64_EXACT, "ssd")
    beta = torch.rand(2, 9, 2, dtype=DT)
    packed = chunked_delta_rule(q, k, v, beta, g, None, s0, 4, doc_starts=zeros)
    for a, b in zip(packed, chunked_delta_rule(q, k, v, beta, g, None, s0, 4)):
        assert_close(a, b, FLOAT64_EXACT, "delta")


def test_bad_doc_starts_are_refused():
    q, k, v = torch.randn(2, 9, 2, 3), torch.randn(2, 9, 2, 3), torch.randn(2, 9, 2, 2)
    with pytest.raises(InputError, match="doc_starts must be"):
        chunked_gla(q, k, v, doc_starts=torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(InputError, match="integer"):
        chunked_ssd(q[:, :, 0], k[:, :, 0], v, -torch.rand(2, 9, 2), doc_starts=torch.zeros(2, 9))
    with pytest.raises(InputError, match="doc_starts must be"):
        chunked_delta_rule(q, k, v, torch.rand(2, 9, 2), doc_starts=torch.zeros(1, 9, dtype=torch.long))
