"""MesaNet's accumulated key covariance and its per-token solve, chunkwise, with the plain references beside.

Per head (von Oswald et al. 2025, "MesaNet"; fla ``ops/mesa_net/naive.py``, ``naive_mesa_net_exact``),
with a log decay g_t per head, a write strength beta_t and a per-key-channel regulariser lambda > 0:

    H_t = exp(g_t) H_{t-1} + beta_t k_t k_tᵀ                       [K, K]   (the key covariance)
    q*_t = (H_t + diag(lambda))^{-1} q_t                             [K]      (the per-token solve)

Then the output is gated linear attention read with q*_t (ops/chunked_gla.py, state [K, V]):
S_t = exp(g_t) S_{t-1} + beta_t k_t v_tᵀ, o_t = S_tᵀ q*_t. Only H and the solve are here.

Unrolled, H_t = exp(G_t) H_0 + sum_{j<=t} exp(G_t - G_j) beta_j k_j k_jᵀ with G the cumulative log
decay of the segment (G_0 = g_0); every exponent is <= 0 for g <= 0.

Three ways to form every H_t of a segment ([B, T, H, K, K]):
  * ``recurrent_key_covariance``: the token loop of the definition (the reference);
  * ``dense_key_covariance``: the unrolled sum through the T x T decay mask (O(T² K²));
  * ``chunked_key_covariance``: chunks of C tokens. The covariance entering each chunk first (its
    T / C sequential steps on [K, K], ``_entering_covariances``, shared with the slab solve below);
    then inside a chunk, with G restarted at the chunk start, H_i = exp(G_i) H_in + sum_{j<=i in
    chunk} exp(G_i - G_j) beta_j k_j k_jᵀ -- one [C, C + 1] x [C + 1, K²] matmul per chunk, H_in an
    extra row (exponents <= 0, masked before the exp). O(T C K²) work, O(T K²) memory (every H_t).
``mesa_solve`` is the solve: a Cholesky factorisation (H_t + diag(lambda) is symmetric positive
definite for beta >= 0, lambda > 0), O(K³) per token; ``mesa_solve_reference`` uses an LU solve.
Autograd differentiates all of them.

``mesa_queries`` (the chunked mode's path) is covariance + Cholesky solve, computed slab by slab
(below: "The chunked solve"), with a hand-written backward that never forms a [T, K, K] gradient
(autograd through the two above spends ~10x the forward on them). With M_t = H_t + diag(lambda),
q*_t = M_t^{-1} q_t and the gradient dq*_t:

    a_t = M_t^{-1} dq*_t  (M symmetric),   dq_t = a_t,   dlambda = -sum_t a_t ⊙ q*_t,
    dH_t = W_t = -a_t q*_tᵀ (rank one; plus dH_T, the final covariance's gradient, at t = T-1).

H_t = exp(G_t) H_0 + sum_{j<=t} exp(G_t - G_j) beta_j k_j k_jᵀ, so with the accumulated gradient
Ĝ_j = sum_{t>=j} exp(G_t - G_j) W_t, u_j = Ĝ_j k_j and w_j = Ĝ_jᵀ k_j:

    dk_j = beta_j (u_j + w_j),     dbeta_j = k_j · u_j,     dH_0 = sum_t exp(G_t) W_t,
    dG_j = <W_j, H_j> - beta_j k_j · u_j,   <W_j, H_j> = -a_j · q_j + sum_c lambda_c a_jc q*_jc
           (as M_j q*_j = q_j: no H_j needed),   dg_j = sum_{i>=j} dG_i.

u and w are anti-causal gated linear attention (queries k_j, keys q*_t resp. -a_t, values -a_t resp.
q*_t, decays exp(G_t - G_j)): ``chunked_gla`` on the time-reversed sequences with log decays
g'_tau = g_{T-tau} (g'_0 = 0) and dH_T (transposed for u) as the initial state. O(T C K) each.

The chunked solve (``_solve_slabs``, the forward of ``mesa_queries``). The cost is the B H T
factorisations of [K, K] matrices (K³/3 each; at T = 8192, B H = 8, K = 64 that is 65536 of them,
1 GiB in float32): everything else is arranged around them.
  * Slabs. Time is cut into slabs of S tokens (S = whole chunks, B H S ~ SLAB_MATRICES = 512, 8 MiB
    in float32 at K = 64: cache-sized). A slab's M_t [B, H, S, K, K] is formed, factorised in place
    and solved before the next one is formed, so the H_t are never all held at once and the LAPACK
    calls read matrices still in cache. The factors are kept for the backward (one [B, H, S, K, K]
    tensor per slab, 4 bytes x K² per token in float32: refactorising there would double the
    dominant cost).
  * Entering covariances first (``_entering_covariances``). Chunk n's write decayed to its end,
    E'_n = sum_j exp(Gamma_n - G_j) beta_j k_j k_jᵀ, is one [K, C] x [C, K] matmul per chunk; the
    covariance entering each chunk, E_{n+1} = exp(Gamma_n) E_n + E'_n (E_0 = H_0), is T / C
    sequential steps on [B, H, K, K] ([N + 1, B, H, K, K] kept: 1 / C of the size of every H_t).
  * One matmul per chunk forms M_i = H_i + diag(lambda) for its C tokens, the carry and the
    regulariser folded in as two extra rows:
        M_i = [1, exp(G_i), exp(G_i - G_j) (j <= i, else 0)]  @  [vec diag(lambda); vec E_n; vec beta_j k_j k_jᵀ]
              [C, C + 2]                                         [C + 2, K²]
    (no separate pass over the slab to add them).
  * Factorise in place, then solve. LAPACK works on column-major matrices; M is symmetric, so its
    row-major buffer read as column-major (``m.mT``) is the same matrix, and torch factorises that
    view in place without the copies it makes of a row-major input (measured 10-25% faster): the
    buffer then holds Lᵀ row-major. q*_t = L^{-T} (L^{-1} q_t) by two triangular solves
    (``cholesky_solve`` gives the same numbers ~5x slower on CPU); the backward's a_t = M_t^{-1} dq*_t
    likewise, from the kept factors.
  * Threads. torch runs a batched CPU Cholesky or triangular solve as a loop over the batch in the
    calling thread (``set_num_threads`` does not apply), and releases the GIL: each slab's batch is
    split into ``torch.get_num_threads()`` contiguous parts (``workers``) run in a thread pool. Each
    matrix goes through the same LAPACK call either way, so the results do not depend on
    ``workers``. The matmuls and elementwise passes use torch's own intra-op threads.
  Symmetry: beta_j k_j k_jᵀ is not bitwise symmetric in floating point (β k_a k_b vs β k_b k_a), so
  M_t's two triangles may differ by rounding; the factorisation reads one of them (the upper of the
  row-major buffer), as any Cholesky does.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from tokenmix.core.errors import InputError
from tokenmix.core.threads import one_thread
from tokenmix.ops.chunked_delta import time_chunks
from tokenmix.ops.chunked_gla import chunked_gla


def _check(k: Tensor, beta: Tensor, g: Tensor, h0: Tensor | None) -> None:
    if k.dim() != 4:
        raise InputError(f"expected k [B, T, H, K], got {tuple(k.shape)}")
    b, t, h, dk = k.shape
    if beta.shape != (b, t, h) or g.shape != (b, t, h):
        raise InputError(f"beta and g must be [B, T, H] = {(b, t, h)}, got {tuple(beta.shape)}, {tuple(g.shape)}")
    if h0 is not None and h0.shape != (b, h, dk, dk):
        raise InputError(f"initial covariance must be [B, H, K, K] = {(b, h, dk, dk)}, got {tuple(h0.shape)}")


def recurrent_key_covariance(k: Tensor, beta: Tensor, g: Tensor, h0: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Token loop H_t = exp(g_t) H_{t-1} + beta_t k_t k_tᵀ.

    Args:
        k: [B, T, H, K];  beta, g: [B, T, H];  h0: [B, H, K, K] or None (zeros).
    Returns:
        every H_t [B, T, H, K, K], the last one [B, H, K, K].
    """
    _check(k, beta, g, h0)
    b, t, h, dk = k.shape
    cov = k.new_zeros(b, h, dk, dk) if h0 is None else h0
    out = []
    for k_t, b_t, g_t in zip(k.unbind(1), beta.unbind(1), g.unbind(1)):
        cov = key_covariance_step(cov, k_t, b_t, g_t)
        out.append(cov)
    return torch.stack(out, 1), cov


def key_covariance_step(cov: Tensor, k_t: Tensor, beta_t: Tensor, g_t: Tensor) -> Tensor:
    """One token: cov [B, H, K, K], k_t [B, H, K], beta_t, g_t [B, H] -> exp(g_t) cov + beta_t k_t k_tᵀ."""
    kb = k_t * beta_t[..., None]
    return g_t.exp()[..., None, None] * cov + kb[..., :, None] * k_t[..., None, :]


def dense_key_covariance(k: Tensor, beta: Tensor, g: Tensor, h0: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """H_t = exp(G_t) H_0 + sum_{j<=t} exp(G_t - G_j) beta_j k_j k_jᵀ through the T x T mask; same returns."""
    _check(k, beta, g, h0)
    b, t, h, dk = k.shape
    gc = g.transpose(1, 2).cumsum(-1)  # [B, H, T]
    decay = _causal_decay(gc)  # [B, H, T, T]
    outer = (k * beta[..., None])[..., :, None] * k[..., None, :]  # [B, T, H, K, K]
    cov = torch.einsum("bhtj,bjhkl->bthkl", decay, outer)
    if h0 is not None:
        cov = cov + gc.exp().transpose(1, 2)[..., None, None] * h0[:, None]
    return cov, cov[:, -1]


def chunked_key_covariance(
    k: Tensor, beta: Tensor, g: Tensor, h0: Tensor | None = None, chunk_size: int = 64
) -> tuple[Tensor, Tensor]:
    """Every H_t chunkwise (module docstring); same arguments and returns as ``recurrent_key_covariance``."""
    if chunk_size <= 0:
        raise InputError(f"chunk_size must be > 0, got {chunk_size}")
    _check(k, beta, g, h0)
    every, last = _covariance_head_major(k, beta, g, h0, chunk_size)
    return every.transpose(1, 2), last


def _covariance_head_major(k: Tensor, beta: Tensor, g: Tensor, h0: Tensor | None, c: int) -> tuple[Tensor, Tensor]:
    """``chunked_key_covariance`` with every H_t in head-major layout [B, H, T, K, K]: the entering
    covariances, then one [C, C + 1] x [C + 1, K²] matmul per chunk (the carry folded in as an extra
    row, as the slab solve below does with the regulariser too)."""
    b, t, h, dk = k.shape
    n = -(-t // c)
    kc, kbc = time_chunks(k, n, c), time_chunks(k * beta[..., None], n, c)  # [B, H, N, C, K]
    gc = time_chunks(g, n, c).cumsum(-1)  # [B, H, N, C], G inside each chunk
    entering = _entering_covariances(kc, kbc, gc, h0)  # [N + 1, B, H, K, K]
    rows = torch.cat(
        [
            entering[:n].permute(1, 2, 0, 3, 4).flatten(-2)[..., None, :],
            (kbc[..., :, None] * kc[..., None, :]).flatten(-2),
        ],
        -2,
    )  # [B, H, N, C + 1, K²]
    mix = torch.cat([gc.exp()[..., None], _causal_decay(gc)], -1)  # [B, H, N, C, C + 1]
    return (mix @ rows).view(b, h, n * c, dk, dk)[:, :, :t], entering[n]


def _entering_covariances(kc: Tensor, kbc: Tensor, gc: Tensor, h0: Tensor | None) -> Tensor:
    """The covariance entering each chunk, E_0 = H_0 and E_{i+1} = exp(Gamma_i) E_i + E'_i with
    E'_i = sum_j exp(Gamma_i - G_j) beta_j k_j k_jᵀ chunk i's write decayed to its end (one
    [K, C] x [C, K] matmul per chunk): kc, kbc (= beta k) [B, H, N, C, K], gc [B, H, N, C] (G
    restarted in each chunk) -> [N + 1, B, H, K, K]; E_N = H_T. Differentiable by autograd."""
    b, h, n, _, dk = kc.shape
    gamma = gc[..., -1]  # [B, H, N]
    ends = (kbc * (gamma[..., None] - gc).exp()[..., None]).mT @ kc  # [B, H, N, K, K]
    decay_end = gamma.exp()[..., None, None]
    cov = kc.new_zeros(b, h, dk, dk) if h0 is None else h0
    out = [cov]
    with one_thread():  # the only sequential part: T / C steps on [K, K]
        for i in range(n):
            cov = torch.addcmul(ends[:, :, i], decay_end[:, :, i], cov)
            out.append(cov)
    return torch.stack(out)


def _causal_decay(gc: Tensor) -> Tensor:
    """exp(G_i - G_j) for j <= i, 0 above: gc [.., C] -> [.., C, C], masked before the exp."""
    c = gc.shape[-1]
    upper = torch.ones(c, c, dtype=torch.bool, device=gc.device).triu(1)
    return (gc[..., :, None] - gc[..., None, :]).masked_fill(upper, float("-inf")).exp()


def mesa_solve(cov: Tensor, lam: Tensor, q: Tensor) -> Tensor:
    """q* = (cov + diag(lam))^{-1} q by Cholesky: cov [..., H, K, K], lam [H, K] > 0, q [..., H, K]."""
    chol = torch.linalg.cholesky(cov + torch.diag_embed(lam))
    return torch.cholesky_solve(q[..., None], chol)[..., 0]


def mesa_solve_reference(cov: Tensor, lam: Tensor, q: Tensor) -> Tensor:
    """The same solve by LU (``torch.linalg.solve``), for the reference modes."""
    return torch.linalg.solve(cov + torch.diag_embed(lam), q[..., None])[..., 0]


COVARIANCE_CHUNK = 16  # C of the forward covariance in mesa_queries ([C, C + 2] x [C + 2, K²] matmuls)
SLAB_MATRICES = 512  # about this many [K, K] systems are formed, factorised and solved at once
MIN_ROWS_PER_WORKER = 64  # a LAPACK batch is split over threads only in parts of at least this many matrices

_POOL: tuple[int, ThreadPoolExecutor] | None = None  # (pid that made it, pool)


def _pool() -> ThreadPoolExecutor:
    """The shared pool of LAPACK threads, made on first use and again in a forked child (a child
    inherits the pool object but not its threads: submitting to it there would wait forever)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        workers = max(1, (os.cpu_count() or 1) - 1)  # the calling thread takes one part itself
        _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mesa-lapack"))
    return _POOL[1]


def _split_batch(fn, *batches: Tensor, workers: int | None = None) -> None:
    """fn(*parts) on contiguous parts of the leading (batch) dimension of ``batches``, one part per
    thread (``workers``, default ``torch.get_num_threads()``; parts of >= MIN_ROWS_PER_WORKER rows):
    the first in the calling thread, the others in a shared pool.

    torch's CPU Cholesky and triangular solves loop over the batch in the calling thread (intra-op
    threads do not apply to them) and release the GIL, so the parts run on separate cores. fn writes
    in place (``out=``); every matrix goes through the same LAPACK call as in one call over the whole
    batch, so the result does not depend on ``workers``."""
    rows = batches[0].shape[0]
    workers = torch.get_num_threads() if workers is None else workers
    workers = max(1, min(workers, rows // MIN_ROWS_PER_WORKER))
    if workers == 1:
        fn(*batches)
        return
    bounds = [rows * i // workers for i in range(workers + 1)]

    def part(i: int) -> None:
        with torch.no_grad():  # grad mode is per thread: a pool thread starts with it on
            fn(*(x[bounds[i] : bounds[i + 1]] for x in batches))

    futures = [_pool().submit(part, i) for i in range(1, workers)]
    part(0)  # the calling thread takes the first part
    for future in futures:
        future.result()


def _factorise_and_solve(m: Tensor, rhs: Tensor, out: Tensor) -> None:
    """m [R, K, K] SPD (row-major) -> its Cholesky factor, in place, stored as Lᵀ row-major (= L in
    LAPACK's column-major layout: torch factorises ``m.mT`` with no copy in or out); out [R, K, 1] =
    m^{-1} rhs."""
    chol = m.mT  # = m's values (symmetric); column-major
    torch.linalg.cholesky(chol, out=chol)
    _triangular_solves(chol, rhs, out)


def _triangular_solves(chol: Tensor, rhs: Tensor, out: Tensor) -> None:
    """out = (L Lᵀ)^{-1} rhs: L y = rhs, then Lᵀ out = y (what cholesky_solve does, ~5x faster on CPU)."""
    torch.linalg.solve_triangular(chol, rhs, upper=False, out=out)
    torch.linalg.solve_triangular(chol.mT, out, upper=True, out=out)


def _solve_slabs(
    q: Tensor, k: Tensor, beta: Tensor, g: Tensor, h0: Tensor | None, lam: Tensor, c: int, workers: int | None = None
) -> tuple[Tensor, Tensor, list[Tensor]]:
    """The forward of ``mesa_queries`` slab by slab (module docstring, "The chunked solve").

    Returns q* [B, H, T, K], the last covariance H_T [B, H, K, K] and the Cholesky factors of every
    M_t as Lᵀ (row-major), one [B, H, S_s, K, K] tensor per slab s (S_s tokens; the last slab may end
    with padding tokens: beta = g = q = 0).
    """
    b, t, h, dk = k.shape
    n = -(-t // c)
    kc = time_chunks(k, n, c)  # [B, H, N, C, K]
    kbc = time_chunks(k * beta[..., None], n, c)
    qc = time_chunks(q, n, c)
    gc = time_chunks(g, n, c).cumsum(-1)  # [B, H, N, C], G inside each chunk
    entering = _entering_covariances(kc, kbc, gc, h0)  # [N + 1, B, H, K, K]
    # mixing rows [C, C + 2] per chunk: exp(G_i - G_j) (j <= i) for the writes, exp(G_i) for E, 1 for Lambda
    mix = torch.cat([torch.ones_like(gc)[..., None], gc.exp()[..., None], _causal_decay(gc)], -1)
    per_slab = max(1, SLAB_MATRICES // (b * h * c))  # chunks per slab
    lam_row = torch.diag_embed(lam).flatten(-2)[None, :, None]  # [1, H, 1, K²]
    buffer = k.new_empty(b * h * per_slab * (c + 2) * dk * dk)
    q_star = k.new_empty(b, h, n, c, dk)
    factors = []
    for n0 in range(0, n, per_slab):
        ns = min(per_slab, n - n0)
        rows = buffer[: b * h * ns * (c + 2) * dk * dk].view(b, h, ns, c + 2, dk * dk)
        rows[..., 0, :] = lam_row  # vec(diag(lambda))
        rows[..., 1, :] = entering[n0 : n0 + ns].permute(1, 2, 0, 3, 4).flatten(-2)
        torch.mul(
            kbc[:, :, n0 : n0 + ns, :, :, None],
            kc[:, :, n0 : n0 + ns, :, None, :],
            out=rows[..., 2:, :].unflatten(-1, (dk, dk)),
        )  # beta_j k_j k_jᵀ
        m = (mix[:, :, n0 : n0 + ns] @ rows).view(-1, dk, dk)  # every M_t of the slab [R, K, K]
        out = k.new_empty(m.shape[0], dk, 1)
        _split_batch(_factorise_and_solve, m, qc[:, :, n0 : n0 + ns].reshape(-1, dk, 1), out, workers=workers)
        q_star[:, :, n0 : n0 + ns] = out.view(b, h, ns, c, dk)
        factors.append(m.view(b, h, ns * c, dk, dk))
    return (
        q_star.view(b, h, n * c, dk)[:, :, :t],
        entering[n].clone(),
        factors,
    )  # not a view: the [N + 1] stack is freed


def _reverse_readout(q: Tensor, k: Tensor, v: Tensor, g: Tensor, s_end: Tensor | None, chunk: int) -> Tensor:
    """o_j = sum_{t>=j} exp(G_t - G_j) (q_j·k_t) v_t + exp(G_T - G_j) s_endᵀ q_j: [B, T, H, V] (anti-causal GLA)."""
    g_rev = torch.cat([g.new_zeros(g.shape[0], 1, g.shape[2]), g.flip(1)[:, :-1]], 1)  # g'_tau = g_{T-tau}
    o, _ = chunked_gla(q.flip(1), k.flip(1), v.flip(1), g_rev, 1.0, s_end, chunk)
    return o.flip(1)


class _MesaQueries(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, beta, g, h0, lam, chunk, workers):
        q_star, last, factors = _solve_slabs(q, k, beta, g, h0, lam, min(chunk, COVARIANCE_CHUNK), workers)
        q_star = q_star.transpose(1, 2)  # [B, T, H, K]
        ctx.save_for_backward(q, k, beta, g, lam, q_star, last, *factors)
        ctx.meta = (chunk, h0 is not None, workers)
        return q_star, last

    @staticmethod
    @once_differentiable
    def backward(ctx, dq_star, d_last):
        q, k, beta, g, lam, q_star, last, *factors = ctx.saved_tensors
        chunk, has_h0, workers = ctx.meta
        a = _solve_with_factors(factors, dq_star, workers)  # M^-1 dq*, [B, T, H, K]
        na = -a
        u = _reverse_readout(k, q_star, na, g, None if d_last is None else d_last.transpose(-1, -2), chunk)
        w = _reverse_readout(k, na, q_star, g, d_last, chunk)
        dbeta = (k * u).sum(-1)
        dk = beta[..., None] * (u + w)
        dgc = (na * q).sum(-1) + (lam * a * q_star).sum(-1) - beta * dbeta  # dG_j, [B, T, H]
        if d_last is not None:
            dgc[:, -1] += (d_last * last).sum((-1, -2))
        dg = dgc.flip(1).cumsum(1).flip(1)
        dh0 = None
        if has_h0:
            eg = g.cumsum(1).exp()  # exp(G_t) <= 1 for g <= 0
            dh0 = torch.einsum("bthk,bthl->bhkl", na * eg[..., None], q_star)
            if d_last is not None:
                dh0 = dh0 + eg[:, -1, :, None, None] * d_last
        dlam = -(a * q_star).sum((0, 1))
        return a, dk, dbeta, dg, dh0, dlam, None, None


def _solve_with_factors(factors: list[Tensor], rhs: Tensor, workers: int | None) -> Tensor:
    """M_t^{-1} rhs_t for every token from the forward's per-slab Cholesky factors: rhs [B, T, H, K]."""
    b, t, h, dk = rhs.shape
    rhs = rhs.transpose(1, 2)
    out = rhs.new_empty(b, h, sum(f.shape[2] for f in factors), dk)
    t0 = 0
    for chol in factors:  # Lᵀ [B, H, S, K, K]
        s = min(chol.shape[2], t - t0)
        part = rhs.new_zeros(b, h, chol.shape[2], dk)  # padding tokens: rhs 0
        part[:, :, :s] = rhs[:, :, t0 : t0 + s]
        solved = rhs.new_empty(part.numel() // dk, dk, 1)
        _split_batch(_triangular_solves, chol.view(-1, dk, dk).mT, part.view(-1, dk, 1), solved, workers=workers)
        out[:, :, t0 : t0 + chol.shape[2]] = solved.view(b, h, -1, dk)
        t0 += chol.shape[2]
    return out[:, :, :t].transpose(1, 2)


def mesa_queries(
    q: Tensor,
    k: Tensor,
    beta: Tensor,
    g: Tensor,
    h0: Tensor | None,
    lam: Tensor,
    chunk_size: int = 64,
    workers: int | None = None,
) -> tuple[Tensor, Tensor]:
    """q*_t = (H_t + diag(lam))^{-1} q_t for every token, H_t chunkwise, with the closed-form backward
    (module docstring).

    Args:
        q, k: [B, T, H, K];  beta, g: [B, T, H] (beta >= 0);  h0: [B, H, K, K] or None (zeros);
        lam: [H, K] > 0;  chunk_size: C of the backward's GLA; the forward covariance uses
            min(C, COVARIANCE_CHUNK) (any chunk gives the same H_t; smaller ones cost fewer matmul flops);
        workers: threads the batched Cholesky factorisations and triangular solves are split over
            (default ``torch.get_num_threads()``; the results do not depend on it).
    Returns:
        q* [B, T, H, K], the last covariance H_T [B, H, K, K].

    Examples:
        >>> q, k = torch.randn(1, 6, 2, 3), torch.randn(1, 6, 2, 3)
        >>> qs, h = mesa_queries(q, k, torch.rand(1, 6, 2), -torch.rand(1, 6, 2), None, torch.ones(2, 3), 4)
        >>> qs.shape, h.shape
        (torch.Size([1, 6, 2, 3]), torch.Size([1, 2, 3, 3]))
    """
    if chunk_size <= 0:
        raise InputError(f"chunk_size must be > 0, got {chunk_size}")
    _check(k, beta, g, h0)
    if q.shape != k.shape or lam.shape != k.shape[2:]:
        raise InputError(
            f"q must be [B, T, H, K] = {tuple(k.shape)} and lam [H, K] = {tuple(k.shape[2:])}; "
            f"got q {tuple(q.shape)}, lam {tuple(lam.shape)}"
        )
    if workers is not None and workers <= 0:
        raise InputError(f"workers must be > 0, got {workers}")
    return _MesaQueries.apply(q, k, beta, g, h0, lam, int(chunk_size), workers)
