"""The chunked GLA and SSD ops on the path they take off the CPU, run here on CPU tensors, float64.

Off the CPU, ops/chunked_gla.py does not count the chunk rows that need its safe form (the count is a
read of device data, a stall per call): every row takes the safe form; ops/chunked_ssd.py does not
count its wide chunks and hands every call to chunked_gla. ``on_host`` is patched to say "not on the
CPU" so that path runs on CPU tensors, where it must equal the token loop (outputs, final state and
the gradients of every input) for mild, saturated and mixed decays, and the CPU's own path for
packed rows (which tests/ops/test_chunked_packed.py holds to the documents run alone).
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from tokenmix.core.packing import Packing
from tokenmix.ops.chunked_gla import _split_rows, _to_rows, chunked_gla
from tokenmix.ops.chunked_ssd import chunked_ssd
from tokenmix.ops.recurrent_gla import recurrent_gla
from tolerances import assert_close

pytestmark = pytest.mark.usefixtures("one_thread")

# the modules (tokenmix.ops exports functions of the same names)
gla_mod = importlib.import_module("tokenmix.ops.chunked_gla")
ssd_mod = importlib.import_module("tokenmix.ops.chunked_ssd")

DT = torch.float64
PACKING = Packing.from_lengths([[4, 1, 1, 9, 4], [19], [2, 3, 13, 1]])  # T = 19, boundaries in chunks


@pytest.fixture
def off_the_cpu(monkeypatch):
    monkeypatch.setattr(gla_mod, "on_host", lambda x: False)
    monkeypatch.setattr(ssd_mod, "on_host", lambda x: False)


def _decays(shape, decays: str) -> torch.Tensor:
    g = F.logsigmoid(torch.randn(shape, dtype=DT))
    if decays == "mixed":  # saturated chunks beside mild ones (the CPU splits these between its forms)
        g[:, 8:12] = -400.0
        g[-1, 15] = -500.0
    return g


def _outputs_and_grads(run, leaves):
    o, s = run()
    w_o, w_s = torch.ones_like(o).cumsum(1).sin(), torch.ones_like(s).cumsum(-1).cos()
    return (o.detach(), s.detach(), *torch.autograd.grad((o * w_o).sum() + (s * w_s).sum(), leaves))


def _assert_same(got, want, tol, what):
    for i, (a, b) in enumerate(zip(got, want)):
        assert_close(a, b, tol if i < 2 else 10 * tol, f"{what} {['output', 'state'][i] if i < 2 else f'grad {i - 2}'}")


@pytest.mark.parametrize("decays", ["mild", "mixed"])
@pytest.mark.parametrize("kind", ["per_head", "per_key"])
@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_gla_takes_the_safe_form_for_every_row_and_equals_the_token_loop(off_the_cpu, kind, decays, chunk):
    torch.manual_seed(0)
    b, t, h, dk, dv = 3, 19, 2, 5, 3
    q, k, v = (torch.randn(b, t, h, d, dtype=DT) for d in (dk, dk, dv))
    g = _decays((b, t, h, *([dk] if kind == "per_key" else [])), decays)
    s0 = torch.randn(b, h, dk, dv, dtype=DT)
    gl = g if kind == "per_key" else g[..., None]
    assert _split_rows(_to_rows(gl, -(-t // chunk), chunk).cumsum_(1))[1] is None  # None: every row safe
    leaves = [z.requires_grad_() for z in (q, k, v, g, s0)]
    got = _outputs_and_grads(lambda: chunked_gla(q, k, v, g, 0.7, s0, chunk), leaves)
    want = _outputs_and_grads(lambda: recurrent_gla(q, k, v, g, 0.7, s0), leaves)
    _assert_same(got, want, 1e-11, f"gla {kind} {decays} C={chunk}")


@pytest.mark.parametrize("kind", ["per_head", "per_key"])
def test_gla_packed_rows_equal_the_cpu_path(monkeypatch, kind):
    torch.manual_seed(1)
    b, t, h, dk, dv = 3, 19, 2, 5, 3
    q, k, v = (torch.randn(b, t, h, d, dtype=DT) for d in (dk, dk, dv))
    g = _decays((b, t, h, *([dk] if kind == "per_key" else [])), "mixed")
    s0 = torch.randn(b, h, dk, dv, dtype=DT)
    leaves = [z.requires_grad_() for z in (q, k, v, g, s0)]
    call = lambda: chunked_gla(q, k, v, g, 0.7, s0, 4, PACKING.starts)  # noqa: E731
    want = _outputs_and_grads(call, leaves)
    monkeypatch.setattr(gla_mod, "on_host", lambda x: False)
    _assert_same(_outputs_and_grads(call, leaves), want, 1e-12, f"packed gla {kind}")


@pytest.mark.parametrize("decays", ["mild", "mixed"])
@pytest.mark.parametrize("packed", [False, True])
def test_ssd_goes_to_the_safe_form_and_stays_exact(monkeypatch, decays, packed):
    torch.manual_seed(2)
    b, t, h, n, p = 3, 19, 3, 5, 4
    c, bk, x = torch.randn(b, t, n, dtype=DT), torch.randn(b, t, n, dtype=DT), torch.randn(b, t, h, p, dtype=DT)
    g = _decays((b, t, h), decays)
    s0 = torch.randn(b, h, n, p, dtype=DT)
    leaves = [z.requires_grad_() for z in (c, bk, x, g, s0)]
    starts = PACKING.starts if packed else None
    call = lambda: chunked_ssd(c, bk, x, g, 0.7, s0, 4, starts)  # noqa: E731
    if packed:  # the CPU's own path (the SSD kernel, wide chunks inside it) is the reference
        want = _outputs_and_grads(call, leaves)
    else:
        ref = lambda: recurrent_gla(c[:, :, None].expand(b, t, h, n), bk[:, :, None].expand(b, t, h, n), x, g, 0.7, s0)  # noqa: E731
        want = _outputs_and_grads(ref, leaves)
    monkeypatch.setattr(gla_mod, "on_host", lambda z: False)
    monkeypatch.setattr(ssd_mod, "on_host", lambda z: False)
    assert "ChunkedGLA" in type(call()[0].grad_fn).__name__
    _assert_same(_outputs_and_grads(call, leaves), want, 1e-11, f"ssd {decays} packed={packed}")
