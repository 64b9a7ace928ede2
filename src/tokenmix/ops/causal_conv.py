"""Causal depthwise convolution of k taps per channel (the short convolution in front of a mixer),
compiled, with its reference beside it.

Per channel c, with the P cached inputs first and the segment's T inputs after them in one buffer
(buf[i] = cached[i] for i < P, u[i - P] after; zero before position 0):

    v[b, t, c] = sum_{j < k} w[c, j] buf[b, P + t - j, c]                      (tap j reads j back)

and the backward pass, g = dL/dv:

    dbuf[b, i, c] = sum_{j < k} w[c, j] g[b, i - P + j, c]      (0 <= i - P + j < T)
    dw[c, j]      = sum_{b, t} g[b, t, c] buf[b, P + t - j, c]    (P + t - j >= 0)

``causal_conv_reference`` is F.conv1d on the channel-major, left-padded buffer (torch's depthwise
convolution). Why compiled: at a synthetic task's sizes (B = 64, T = 64, C = 64) that path is
several passes in the wrong layout -- a transpose to [B, C, T], a padded copy, the convolution, a
transpose back, and a depthwise convolution backward that alone took longer than the layer's two
projections -- where the arithmetic is k multiply-adds per value. The kernels here read and write
[B, T, C] directly: one sweep per batch element forward, one backward producing dbuf and the
per-element tap gradients (summed over b after the sweep, so the parallel sweeps never write the
same memory). Where numba cannot run (``ops/numba_runtime.py``) the reference runs instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.ops.numba_runtime import PARALLEL_JIT, launch, numba, supported
from tokenmix.ops.numba_runtime import as_numpy as _np

if numba is not None:
    from numba import njit, prange

    @njit(inline="always")
    def _buf_row(cached, u, b, i):  # pragma: no cover - compiled
        # buf[b, i] of the module docstring [C]: the P cached inputs first, then the segment's
        p = cached.shape[1]
        return u[b, i - p] if i >= p else cached[b, i]

    @njit(**PARALLEL_JIT)
    def _conv_forward(cached, u, wt, v):  # pragma: no cover - compiled
        # cached [B,P,C], u [B,T,C], wt [k,C] (taps, tap-major) -> v [B,T,C] (written)
        nb, nt, nc = u.shape
        p = cached.shape[1]
        k = wt.shape[0]
        for b in prange(nb):
            for t in range(nt):
                for c in range(nc):
                    v[b, t, c] = 0.0
                for j in range(min(k, p + t + 1)):  # the taps that reach position 0 or later
                    x = _buf_row(cached, u, b, p + t - j)
                    for c in range(nc):
                        v[b, t, c] += wt[j, c] * x[c]

    @njit(**PARALLEL_JIT)
    def _conv_backward(cached, u, wt, g, dcached, du, dwb):  # pragma: no cover - compiled
        # g [B,T,C] -> dcached [B,P,C], du [B,T,C], dwb [B,k,C] (per-element tap gradients), all written
        nb, nt, nc = u.shape
        p = cached.shape[1]
        k = wt.shape[0]
        for b in prange(nb):
            for i in range(p + nt):
                for c in range(nc):
                    acc = 0.0
                    for j in range(k):
                        t = i - p + j
                        if t >= nt:
                            break
                        if t >= 0:
                            acc += wt[j, c] * g[b, t, c]
                    if i < p:
                        dcached[b, i, c] = acc
                    else:
                        du[b, i - p, c] = acc
            for j in range(k):
                for c in range(nc):
                    dwb[b, j, c] = 0.0
            for t in range(nt):
                for j in range(min(k, p + t + 1)):  # the taps that reach position 0 or later
                    x = _buf_row(cached, u, b, p + t - j)
                    for c in range(nc):
                        dwb[b, j, c] += g[b, t, c] * x[c]


def causal_conv_reference(u: Tensor, cached: Tensor, w: Tensor) -> Tensor:
    """v [B, T, C] of the module docstring by torch's depthwise convolution.

    Args:
        u: [B, T, C] the segment's inputs; cached: [B, P, C] the inputs before it (P may be 0);
        w: [C, k] taps, w[:, 0] on the current position.
    """
    k, c = w.shape[1], w.shape[0]
    p = cached.shape[1]
    if k == 1:
        return u * w[:, 0]
    buf = torch.cat([cached, u], 1) if p else u
    # conv1d correlates: out[t] = sum_i kernel[i] in[t + i]; with k - 1 positions of history in
    # front of u_t, in[t + i] = u_{t - (k - 1 - i)}, so the kernel is w reversed
    hist = F.pad(buf.transpose(1, 2), (max(k - 1 - p, 0), 0))  # [B, C, k - 1 + T] (or longer: all of P)
    v = F.conv1d(hist, w.flip(-1)[:, None, :], groups=c)
    return v[..., v.shape[-1] - u.shape[1] :].transpose(1, 2)


class _CompiledConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, cached, w):
        u, cached = u.contiguous(), cached.contiguous()
        wt = w.detach().t().contiguous()  # [k, C]
        v = torch.empty_like(u)
        with launch():
            _conv_forward(_np(cached), _np(u), _np(wt), _np(v))
        ctx.save_for_backward(u, cached, wt)
        return v

    @staticmethod
    def backward(ctx, gv):
        u, cached, wt = ctx.saved_tensors
        du, dcached = torch.empty_like(u), torch.empty_like(cached)
        dwb = u.new_empty(u.shape[0], *wt.shape)  # [B, k, C]
        with launch():
            _conv_backward(_np(cached), _np(u), _np(wt), _np(gv.contiguous()), _np(dcached), _np(du), _np(dwb))
        return du, dcached, dwb.sum(0).t()


def causal_conv(u: Tensor, cached: Tensor, w: Tensor) -> Tensor:
    """``causal_conv_reference`` with the same arguments, by the compiled kernels where they run
    (float32 / float64 CPU tensors, numba available), else by the reference."""
    if (
        u.dim() != 3
        or cached.dim() != 3
        or w.dim() != 2
        or cached.shape[0] != u.shape[0]
        or cached.shape[2] != u.shape[2]
        or w.shape[0] != u.shape[2]
    ):
        raise InputError(f"shape mismatch: u {tuple(u.shape)}, cached {tuple(cached.shape)}, w {tuple(w.shape)}")
    if not supported(u, cached, w):
        return causal_conv_reference(u, cached, w)
    return _CompiledConv.apply(u, cached, w)


__all__ = ["causal_conv", "causal_conv_reference"]
