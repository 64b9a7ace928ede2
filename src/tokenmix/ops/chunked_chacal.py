"""ChaCAL's dense recurrence Y = P ((1 - gamma) V + gamma Y), chunk by chunk, with a hand-written backward.

P is causal softmax attention (one head); the layer is (I - gamma P) Y = (1 - gamma) P V
(mixers/chacal.py; references: its ``dense`` and ``recurrent`` modes and the explicit formula
(1 - gamma) P (I - gamma P)^{-1} V in checks). Writing w_j = (1 - gamma) v_j + gamma y_j (what row i of
A and B together read from position j), every output is y_i = sum_{j <= i} p_ij w_j, where w_i itself
depends on y_i. For a chunk c of queries over E earlier positions:

    (I - gamma P_cc) Y_c = (1 - gamma) P_cc V_c + P_{c,<E} W_{<E}                  (one C x C solve)

The right-hand side is one matmul of the chunk's [C, E + C] softmax rows with the earlier w's; the
solve is lower triangular with diagonal 1 - gamma p_ii >= 1 - gamma. gamma must stay below 1: at
gamma = 1 a row whose own weight p_ii is 1 (the first position, a padding query) has a zero pivot, and
the (1 - gamma) * inf that follows is NaN. The mixer bounds its learned gamma by 1 - eps (eps >= 1e-4,
mixers/chacal.py), so every pivot is >= eps.

Memory is O(T (K + V)): the forward keeps only the outputs, the w's and each row's log-sum-exp; the
backward recomputes a chunk's probabilities as exp(s - lse) (one pass instead of a softmax). Backward
of chunk c (reverse order), with dW the gradient reaching w_c from later chunks:

    dY_c += gamma dW_c,   dV_c = (1 - gamma) dW_c (+ below),   dgamma += <dW_c, Y_c - V_c>;
    G = (I - gamma P_cc)^{-T} dY_c;
    dP = G W_{<=c}ᵀ (the same formula for earlier and in-chunk positions: the in-chunk dependence on
         Y_c is the solve's), dS = P ⊙ (dP - rowsum(G ⊙ Y_c))   (rowsum(dP ⊙ P) = G · sum_j p_ij w_j = G · y);
    dq = dS k, dk += dSᵀ q, dW_{<E} += P_{c,<E}ᵀ G, dV_c += (1 - gamma) P_ccᵀ G,
    dgamma += <G, P_cc (Y_c - V_c)>.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from tokenmix.core.errors import InputError


def _padding_mask(key_start: Tensor | None, e: int, c: int) -> Tensor | None:
    """[B, 1, c, e + c] bool, True at the padding keys of a chunk's rows (own key excepted), or None.

    key_start [B]: leading padding keys of each row's buffer (left-padded batches, mixers/base.py).
    """
    if key_start is None:
        return None
    cols = torch.arange(e + c, device=key_start.device)
    own = cols[None, :] == e + torch.arange(c, device=key_start.device)[:, None]  # [c, e + c]
    return ((cols[None, None, :] < key_start[:, None, None]) & ~own)[:, None]


def _chunk_probs(
    q_c: Tensor, keys: Tensor, e: int, lse: Tensor | None = None, pad: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Softmax rows of a chunk of c queries over keys[: e + c], the chunk's own future masked.

    q_c: [B, H, c, K] (already scaled); keys: [B, H, >= e + c, K]; lse: the rows' log-sum-exp [B, H, c]
    when known (the backward), else computed; pad: ``_padding_mask`` of the chunk, keys masked like
    the future. Returns P [B, H, c, e + c] and lse.

    Exponents are clamped at 1 + log(smallest normal float) before exp: the CPU exp takes a slow path of
    15-45x for results at or below the smallest normal (saturated scores put most of a row there), and
    the clamp only replaces results below e · (smallest normal) (3.2e-38 in float32, 6e-308 in float64)
    by that value. The chunk's future positions (and padding keys) are zeroed after the exp, so
    causality (and the independence of real rows from padding) stays exact.

    With a saved lse (the backward), s - lse is also clamped at 0: exactly, p = exp(s - lse) <= 1, and
    only rounding can put s above lse. At huge scores (|s| ~ 1e9 in float32, where one ulp of s is ~100)
    that rounding, exponentiated, would give inf weights and NaN gradients (the failure of fused
    attention kernels that recompute their scores in the backward); clamped, no weight exceeds 1.
    """
    c = q_c.shape[2]
    s = q_c @ keys[:, :, : e + c].transpose(-1, -2)
    future = torch.ones(c, c, dtype=torch.bool, device=q_c.device).triu(1)
    s[..., e:].masked_fill_(future, float("-inf"))  # only the chunk's own block has future positions
    if pad is not None:
        s.masked_fill_(pad, float("-inf"))
    floor = math.log(torch.finfo(s.dtype).tiny) + 1.0
    if lse is None:
        m = s.amax(-1, keepdim=True)
        p = s.sub_(m).clamp_(min=floor).exp_()
    else:
        p = s.sub_(lse[..., None]).clamp_(min=floor, max=0.0).exp_()
    p[..., e:].masked_fill_(future, 0.0)
    if pad is not None:
        p.masked_fill_(pad, 0.0)
    if lse is None:
        z = p.sum(-1, keepdim=True)
        lse = (m + z.log())[..., 0]
        return p.div_(z), lse
    return p, lse


def _flat(x: Tensor) -> Tensor:
    """[B, H, m, n] -> [B H, m, n] as a view, for tensors this op allocated (their B and H axes merge)."""
    return x.view(-1, x.shape[-2], x.shape[-1])


class _ChainChunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, keys, values, y_prefix, gamma, chunk, key_start):
        b, h, t, _ = q.shape
        p = y_prefix.shape[2]
        g = gamma.view(1, h, 1, 1)
        w = values.new_empty(values.shape)  # [B, H, P + T, V], contiguous
        if p:
            torch.add((1 - g) * values[:, :, :p], g * y_prefix, out=w[:, :, :p])
        y = q.new_empty(b, h, t, values.shape[-1])
        lse = q.new_empty(b, h, t)
        for s in range(0, t, chunk):
            c = min(chunk, t - s)
            e = p + s
            probs, lse[:, :, s : s + c] = _chunk_probs(q[:, :, s : s + c], keys, e, pad=_padding_mask(key_start, e, c))
            inner = probs[..., e:]  # [B, H, c, c], lower triangular
            v_c = values[:, :, e : e + c]
            rhs = (1 - g) * (inner @ v_c)
            if e:
                rhs.add_(probs[..., :e] @ w[:, :, :e])
            m = torch.eye(c, dtype=q.dtype, device=q.device) - g * inner
            y_c = torch.linalg.solve_triangular(m, rhs, upper=False)
            y[:, :, s : s + c] = y_c
            torch.add((1 - g) * v_c, g * y_c, out=w[:, :, e : e + c])
        ctx.save_for_backward(q, keys, values, y_prefix, gamma, w, y, lse)
        ctx.chunk, ctx.key_start = chunk, key_start
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        q, keys, values, y_prefix, gamma, w, y, lse = ctx.saved_tensors
        chunk = ctx.chunk
        h, t = q.shape[1], q.shape[2]
        p = y_prefix.shape[2]
        g = gamma.view(1, h, 1, 1)
        # contiguous (the inputs are transposed views): the in-place accumulations view them as [B H, ., .]
        dq, dk, dv = q.new_empty(q.shape), keys.new_zeros(keys.shape), values.new_empty(values.shape)
        dw = w.new_zeros(w.shape)  # gradient reaching each w_j from the chunks after j's
        dgamma = torch.zeros_like(lse[:, :, 0])  # [B, H]
        for s in reversed(range(0, t, chunk)):
            c = min(chunk, t - s)
            e = p + s
            q_c, y_c, v_c, dw_c = q[:, :, s : s + c], y[:, :, s : s + c], values[:, :, e : e + c], dw[:, :, e : e + c]
            dy_c = dy[:, :, s : s + c] + g * dw_c
            y_minus_v = y_c - v_c
            dgamma += (dw_c * y_minus_v).sum((-2, -1))
            probs, _ = _chunk_probs(q_c, keys, e, lse[:, :, s : s + c], _padding_mask(ctx.key_start, e, c))
            inner = probs[..., e:]
            m = torch.eye(c, dtype=q.dtype, device=q.device) - g * inner
            gr = torch.linalg.solve_triangular(m.transpose(-1, -2), dy_c, upper=True)  # G [B, H, c, V]
            ds = gr @ w[:, :, : e + c].transpose(-1, -2)  # dP
            ds.sub_((gr * y_c).sum(-1, keepdim=True)).mul_(probs)  # softmax backward
            dq[:, :, s : s + c] = ds @ keys[:, :, : e + c]
            # accumulate in place (a [B H, e + c, K] view: B and H merge in these layouts)
            _flat(dk[:, :, : e + c]).baddbmm_(_flat(ds.transpose(-1, -2)), q_c.reshape(-1, c, q_c.shape[-1]))
            if e:
                _flat(dw[:, :, :e]).baddbmm_(_flat(probs[..., :e].transpose(-1, -2)), _flat(gr))
            dv[:, :, e : e + c] = (1 - g) * (dw_c + inner.transpose(-1, -2) @ gr)
            dgamma += (gr * (inner @ y_minus_v)).sum((-2, -1))
        dy_prefix = None
        if p:
            dw_p = dw[:, :, :p]
            dv[:, :, :p] = (1 - g) * dw_p
            dy_prefix = g * dw_p
            dgamma += (dw_p * (y_prefix - values[:, :, :p])).sum((-2, -1))
        return dq, dk, dv, dy_prefix, dgamma.sum(0), None, None


def chunked_chacal(
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    y_prefix: Tensor,
    gamma: Tensor,
    chunk_size: int = 64,
    key_start: Tensor | None = None,
) -> Tensor:
    """ChaCAL outputs of T new positions after P cached ones, chunk by chunk (head-first layout).

    Args:
        q: [B, H, T, K] queries of the new positions, already scaled (1 / sqrt(K)).
        keys: [B, H, P + T, K] keys of the cached and the new positions.
        values: [B, H, P + T, V] values of the cached and the new positions.
        y_prefix: [B, H, P, V] outputs of the cached positions.
        gamma: [H] path discount per head, in [0, 1) (gamma = 1 is singular: see the module docstring).
        chunk_size: C, queries per block of the forward substitution.
        key_start: [B] long, leading padding positions of each row's buffer (left-padded batches):
            masked out of every softmax row but the padding query's own, or None.
    Returns:
        y: [B, H, T, V], solving y_i = sum_{j <= i} p_ij ((1 - gamma) v_j + gamma y_j).

    Examples:
        >>> q, k, v = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 3)
        >>> chunked_chacal(q, k, v, v[:, :, :0], torch.tensor([0.5, 0.9]), chunk_size=4).shape
        torch.Size([1, 2, 6, 3])
    """
    if chunk_size <= 0:
        raise InputError(f"chunk_size must be > 0, got {chunk_size}")
    b, h, t, _ = q.shape
    p = y_prefix.shape[2]
    if keys.shape[:3] != (b, h, p + t) or values.shape[:3] != (b, h, p + t) or y_prefix.shape[:2] != (b, h):
        raise InputError(
            f"expected keys, values [B, H, P + T, .] and y_prefix [B, H, P, V]; got q {tuple(q.shape)}, "
            f"keys {tuple(keys.shape)}, values {tuple(values.shape)}, y_prefix {tuple(y_prefix.shape)}"
        )
    return _ChainChunked.apply(q, keys, values, y_prefix, gamma, int(chunk_size), key_start)
