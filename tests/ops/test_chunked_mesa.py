"""mesa_queries' slab-by-slab forward (ops/chunked_mesa.py, "The chunked solve"): several slabs with a
partial last chunk, and the LAPACK calls split over threads, against the plain single-thread path
(bitwise: every matrix goes through the same LAPACK call) and against the autograd reference."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

import tokenmix.ops.chunked_mesa as cm
from lm_helpers import within
from tokenmix.core.errors import InputError
from tolerances import assert_close


def _inputs(b=2, t=45, h=2, k=5, seed=0):
    g_ = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, dtype=torch.float64, generator=g_)  # noqa: E731
    f = mk(b, h, k, 2)
    lam = 0.3 + torch.rand(h, k, dtype=torch.float64, generator=g_)
    return (
        mk(b, t, h, k),
        F.normalize(mk(b, t, h, k), dim=-1),
        torch.sigmoid(mk(b, t, h)),
        F.logsigmoid(mk(b, t, h)),
        f @ f.transpose(-1, -2),
        lam,
    )


@pytest.fixture
def small_slabs(monkeypatch):
    """Slabs of 2 chunks (b h c * 2 matrices) and no minimum part size: T = 45, C = 16 gives slabs of
    32 and 16 tokens (the last with 3 padding tokens), each split over the workers."""
    monkeypatch.setattr(cm, "SLAB_MATRICES", 2 * 2 * 16 * 2)
    monkeypatch.setattr(cm, "MIN_ROWS_PER_WORKER", 1)


def _run(inputs, workers, wq, wl, chunk=16):
    inputs = tuple(z.detach().requires_grad_() for z in inputs)
    qs, last = cm.mesa_queries(*inputs, chunk, workers=workers)
    grads = torch.autograd.grad((qs * wq).sum() + (last * wl).sum(), inputs)
    return qs.detach(), last.detach(), grads


def test_slabs_and_threads_match_plain_path_and_reference(small_slabs):
    inputs = _inputs()
    b, t, h, k = inputs[0].shape
    g_ = torch.Generator().manual_seed(1)
    wq = torch.randn(b, t, h, k, dtype=torch.float64, generator=g_)
    wl = torch.randn(b, h, k, k, dtype=torch.float64, generator=g_)
    plain = _run(inputs, 1, wq, wl)
    for workers in (2, 3):
        threaded = _run(inputs, workers, wq, wl)
        assert torch.equal(threaded[0], plain[0]), f"workers={workers}: q*"
        assert torch.equal(threaded[1], plain[1]), f"workers={workers}: last covariance"
        for i, (a, r) in enumerate(zip(threaded[2], plain[2])):
            assert torch.equal(a, r), f"workers={workers}: input {i} gradient"
    # against autograd through the token-loop covariance and the LU solve
    ref_in = tuple(z.detach().requires_grad_() for z in inputs)
    every, last = cm.recurrent_key_covariance(ref_in[1], ref_in[2], ref_in[3], ref_in[4])
    qs = cm.mesa_solve_reference(every, ref_in[5], ref_in[0])
    ref_grads = torch.autograd.grad((qs * wq).sum() + (last * wl).sum(), ref_in)
    assert_close(plain[0], qs.detach(), 1e-12, "q*")
    assert_close(plain[1], last.detach(), 1e-12, "last covariance")
    for i, (a, r) in enumerate(zip(plain[2], ref_grads)):
        assert_close(a, r, 1e-10, f"input {i} gradient")


def test_gradcheck_with_slabs_and_threads(small_slabs):
    q, k, beta, g, _, lam = _inputs(b=1, t=37, h=2, k=3, seed=2)
    factor = torch.randn(1, 2, 3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    factor.requires_grad_()  # the covariance is symmetric (Cholesky reads one triangle): h0 = F Fᵀ
    checked = tuple(z.requires_grad_() for z in (q, k, beta, g)) + (factor, lam.requires_grad_())
    assert torch.autograd.gradcheck(
        lambda q, kk, beta, g, f, lam: cm.mesa_queries(q, kk, beta, g, f @ f.transpose(-1, -2), lam, 4, workers=2),
        checked,
        eps=1e-6,
        atol=1e-6,
    )


def test_split_batch_runs_parts_in_separate_threads(monkeypatch):
    monkeypatch.setattr(cm, "MIN_ROWS_PER_WORKER", 4)
    seen, lock = [], threading.Lock()

    def record(x, out):
        with lock:
            seen.append((threading.get_ident(), x.shape[0]))
        out.copy_(2 * x)

    x = torch.arange(11.0)
    out = torch.empty(11)
    cm._split_batch(record, x, out, workers=3)  # 11 rows // 4 -> 2 parts: this thread and a pool thread
    assert sorted(n for _, n in seen) == [5, 6] and len({i for i, _ in seen}) == 2
    assert (threading.get_ident(), 5) in seen
    assert torch.equal(out, 2 * x)
    seen.clear()
    cm._split_batch(record, x[:7], out[:7], workers=3)  # too few rows for two parts: one call, this thread
    assert seen == [(threading.get_ident(), 7)]


def test_workers_must_be_positive():
    with pytest.raises(InputError):
        cm.mesa_queries(*_inputs(b=1, t=3), 4, workers=0)


def test_pool_is_remade_after_fork(monkeypatch):
    """A forked child inherits the pool object but not its threads (submitting there would wait
    forever): a pool made in another pid is replaced."""
    first = cm._pool()
    assert cm._pool() is first
    pid = cm.os.getpid()
    monkeypatch.setattr(cm.os, "getpid", lambda: pid + 1)  # as seen from a child
    second = cm._pool()
    assert second is not first and cm._pool() is second
    with within(10):  # a pool without threads would block: judged by progress, not the clock
        assert second.submit(lambda: 7).result() == 7
