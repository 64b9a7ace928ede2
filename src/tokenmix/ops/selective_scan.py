"""Mamba-1 selective scan (diagonal SSM, state expansion N per channel), in time blocks, with a
hand-written backward that recomputes each block.

Recurrence per channel d (reference: ops/recurrent_gla.py with one head per channel, K = N, V = 1,
q = C, k = B, v = x, per-key log decay Delta_t A_d; see mixers/diag_ssm.py), state h [N]:

    h_t = exp(Delta_{t,d} A_d) ⊙ h_{t-1} + x_{t,d} B_t,        y_{t,d} = C_t · h_t.

Why not the chunked matmul form: with V = 1 every "matmul" of the chunked GLA form is a matrix-vector
product, and its intra-chunk scores cost O(C N) per token and channel against O(N) for the recurrence
itself. The recurrence is elementwise over [B, D, N], so it is computed as it is defined, one fused
multiply-add per token on the whole [B, D, N] state, with the per-token factors of a block of L
tokens formed at once ([B, L, D, N]: small enough to stay in cache). Nothing of size [B, T, D, N] is
ever held: the forward keeps the state entering each block, and the backward recomputes a block's
decays and states from it. Work and memory are linear in T; the arithmetic is the recurrence's own
(no exponent is reassociated), so it equals the token loop up to rounding.

Backward of one block (reverse order), with carry = dL/dh at the block end:
    dh_t = dy_t C_t + exp(Delta_{t+1} A) ⊙ dh_{t+1}          (dh_{L-1} also receives the carry)
    dx_t = dh_t · B_t,   dB_t = sum_d dh_t x_t,   dC_t = sum_d dy_t h_t,
    dG_t = dh_t ⊙ h_{t-1} ⊙ exp(G_t) with G = Delta A:   dDelta_t = sum_n dG_t A,  dA += sum_{b,t} dG_t Delta_t;
    carry <- exp(Delta_0 A) ⊙ dh_0, the gradient of the state entering the block.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from tokenmix.core.errors import InputError


def _block_factors(delta: Tensor, x: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Per-token decay exp(Delta A) and input x B of a block, time-major.

    delta, x: [B, L, D];  a: [D, N];  b: [B, L, N]  ->  decay, xb: [L, B, D, N].
    """
    bsz, length, d = x.shape
    # explicit time-major outputs: broadcasting would follow the inputs' batch-major strides
    decay = x.new_empty(length, bsz, d, a.shape[1])
    torch.mul(delta.transpose(0, 1)[..., None], a, out=decay).exp_()
    xb = torch.mul(x.transpose(0, 1)[..., None], b.transpose(0, 1)[:, :, None, :], out=torch.empty_like(decay))
    return decay, xb


def _scan_block(decay: Tensor, hs: Tensor, h0: Tensor) -> Tensor:
    """In place on hs (the inputs x B, [L, B, D, N]): hs[t] <- h_t = decay_t ⊙ h_{t-1} + hs[t], h_{-1} = h0.

    One fused multiply-add per token over the whole [B, D, N] state; the views are taken once (a
    per-step index would double the cost of these small steps).
    """
    hv, dv = hs.unbind(0), decay.unbind(0)
    hv[0].addcmul_(dv[0], h0)
    for t in range(1, len(hv)):
        hv[t].addcmul_(dv[t], hv[t - 1])
    return hs


def _rowdot(x: Tensor, w: Tensor) -> Tensor:
    """sum_n x[..., n] w[..., n] for x [L, B, D, N] and w broadcastable to it: [L, B, D].

    A multiply then a matrix-vector product with ones: a plain sum over a last axis of 16 is
    several times slower on CPU.
    """
    prod = torch.mul(x, w, out=x.new_empty(x.shape))  # contiguous, whatever the strides of w
    return prod.view(-1, prod.shape[-1]).mv(prod.new_ones(prod.shape[-1])).view(prod.shape[:-1])


class _SelectiveScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, delta, a, b, c, h0, block):
        bsz, t, d = x.shape
        h = x.new_zeros(bsz, d, a.shape[1]) if h0 is None else h0
        y = x.new_empty(bsz, t, d)
        starts = []
        for s in range(0, t, block):
            e = min(s + block, t)
            starts.append(h)
            decay, hs = _block_factors(delta[:, s:e], x[:, s:e], a, b[:, s:e])
            _scan_block(decay, hs, h)
            y[:, s:e] = _rowdot(hs, c[:, s:e].transpose(0, 1)[:, :, None, :]).transpose(0, 1)
            h = hs[-1].clone()
        ctx.save_for_backward(x, delta, a, b, c, torch.stack(starts))
        ctx.meta = (block, h0 is not None)
        return y, h

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh_t):
        x, delta, a, b, c, starts = ctx.saved_tensors
        block, has_h0 = ctx.meta
        t = x.shape[1]
        dx, ddelta, db, dc = torch.empty_like(x), torch.empty_like(delta), torch.empty_like(b), torch.empty_like(c)
        da = torch.zeros_like(a)
        carry = torch.zeros_like(starts[0]) if dh_t is None else dh_t
        for i in reversed(range(len(starts))):
            s, e = i * block, min((i + 1) * block, t)
            h0 = starts[i]
            xs, ds, bs, cs = (z[:, s:e].transpose(0, 1) for z in (x, delta, b, c))  # time-major views
            dys = dy[:, s:e].transpose(0, 1)
            decay, hs = _block_factors(delta[:, s:e], x[:, s:e], a, b[:, s:e])
            _scan_block(decay, hs, h0)  # recompute the block's states
            lb, d_, n_ = hs.shape[0] * hs.shape[1], hs.shape[2], hs.shape[3]
            # dC_t = sum_d dy_t h_t and dB_t = sum_d dh_t x_t: [1, D] x [D, N] per token
            dc[:, s:e] = torch.bmm(dys.reshape(lb, 1, d_), hs.view(lb, d_, n_)).view(e - s, -1, n_).transpose(0, 1)
            dh = torch.mul(dys[..., None], cs[:, :, None, :], out=torch.empty_like(hs))  # [L, B, D, N]
            dh[-1] += carry
            hv, dv = dh.unbind(0), decay.unbind(0)
            for j in reversed(range(e - s - 1)):
                hv[j].addcmul_(dv[j + 1], hv[j + 1])
            carry = decay[0] * dh[0]
            dx[:, s:e] = _rowdot(dh, bs[:, :, None, :]).transpose(0, 1)
            db[:, s:e] = torch.bmm(xs.reshape(lb, 1, d_), dh.view(lb, d_, n_)).view(e - s, -1, n_).transpose(0, 1)
            dg = dh.mul_(decay)  # dL/dG = dh_t ⊙ h_{t-1} ⊙ exp(G_t)
            dg[1:].mul_(hs[:-1])
            dg[0].mul_(h0)
            ddelta[:, s:e] = _rowdot(dg, a).transpose(0, 1)
            da += (dg * ds[..., None]).sum((0, 1))
        return dx, ddelta, da, db, dc, carry if has_h0 else None, None


def selective_scan(
    x: Tensor, delta: Tensor, a: Tensor, b: Tensor, c: Tensor, initial_state: Tensor | None = None, block_size: int = 64
) -> tuple[Tensor, Tensor]:
    """Diagonal selective SSM: h_t = exp(Delta_t A) ⊙ h_{t-1} + x_t B_t, y_t = C_t · h_t, per channel.

    Args:
        x: [B, T, D] inputs of the recurrence (Mamba's Delta_t u_t).
        delta: [B, T, D] step sizes Delta_t (> 0 for decays in (0, 1) when A < 0).
        a: [D, N] state matrix diagonal A (A = -exp(A_log) in Mamba).
        b, c: [B, T, N] input and readout maps B_t, C_t, shared by the channels.
        initial_state: [B, D, N] or None (zeros).
        block_size: L, tokens whose factors are formed at once (memory [B, L, D, N]); any L >= 1 gives
            the same result.
    Returns:
        y: [B, T, D];  final state h_T: [B, D, N].

    Examples:
        >>> x, dt = torch.randn(1, 10, 3), torch.rand(1, 10, 3)
        >>> a, b, c = -torch.rand(3, 4), torch.randn(1, 10, 4), torch.randn(1, 10, 4)
        >>> y, h = selective_scan(x, dt, a, b, c, block_size=4)
        >>> y.shape, h.shape
        (torch.Size([1, 10, 3]), torch.Size([1, 3, 4]))
    """
    if block_size <= 0:
        raise InputError(f"block_size must be > 0, got {block_size}")
    if x.dim() != 3 or delta.shape != x.shape:
        raise InputError(f"expected x and delta [B, T, D], got x {tuple(x.shape)}, delta {tuple(delta.shape)}")
    bsz, t, d = x.shape
    if a.dim() != 2 or a.shape[0] != d:
        raise InputError(f"a must be [D, N] with D = {d}, got {tuple(a.shape)}")
    n = a.shape[1]
    if b.shape != (bsz, t, n) or c.shape != (bsz, t, n):
        raise InputError(f"b and c must be [B, T, N] = {(bsz, t, n)}, got b {tuple(b.shape)}, c {tuple(c.shape)}")
    if initial_state is not None and initial_state.shape != (bsz, d, n):
        raise InputError(f"initial_state must be [B, D, N] = {(bsz, d, n)}, got {tuple(initial_state.shape)}")
    return _SelectiveScan.apply(x, delta, a, b, c, initial_state, int(block_size))
