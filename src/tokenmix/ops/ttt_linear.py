"""TTT-Linear (Sun et al. 2024, "Learning to (Learn at Test Time)"), fla-core's form (ops/ttt/naive.py):
mini-batch gradient descent on a per-head linear model with a LayerNorm-MSE inner loss.

Per head (D = head_dim), mini-batches of b tokens aligned to absolute positions (0, b, 2b, ...);
fast weight W [D, D] and bias c [D] at the start of mini-batch m. For each token s of the mini-batch

    z_s = k_s W + c,   x̂_s = (z_s - mean z_s) / sigma_s,   sigma_s = sqrt(var z_s + eps),
    loss_s = 1/2 |w ⊙ x̂_s + b - (v_s - k_s)|²,   nabla_s = d loss_s / d z_s   (the LayerNorm backward),

and every gradient of the mini-batch is taken at the same W, c (mini-batch GD). The output of token t
reads the weights updated by the mini-batch's tokens s <= t with t's own learning rate eta_t:

    o_t = (scale q_t) (W - eta_t sum_{s<=t} k_sᵀ nabla_s) + c - eta_t sum_{s<=t} nabla_s
        = scale q_t W + c - eta_t sum_{s<=t} (scale q_t·k_s + 1) nabla_s            (dual form),
    W <- W - eta_last sum_s k_sᵀ nabla_s,   c <- c - eta_last sum_s nabla_s        (at the mini-batch end),
    out_t = o_t + w ⊙ LN(o_t) + b                                                    (fla's post-norm, pointwise).

Decode state: W [D, D] and c [D]; with b > 1 also the running sums G = sum_{s<=t} k_sᵀ nabla_s [D, D]
and gb = sum_{s<=t} nabla_s [D] of the open mini-batch (every token of it still reads W, c), zero at a
mini-batch boundary. With b = 1 the state is exactly (W, c): online gradient descent.

Token view over the pseudo-values nabla (zero initial state): O = A nabla + scale Q W_0 + c_0, B = 0,
A[t,s] = -e[t,s] (scale q_t·k_s + 1) for s <= t, e[t,s] = eta_t if s is in t's mini-batch, else eta of
the last token of s's mini-batch. The nonlinearity sits in the pseudo-values: nabla of mini-batch m is
a LayerNorm-backward of k W_m + c_m, and W_m depends on every earlier nabla (a nonlinear block forward
substitution). ``chunked_ttt_linear`` is the dual form per mini-batch (fla's), ``recurrent_ttt_linear``
the primal form token by token, ``dense_ttt_linear`` the token view above through the reference solver.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from tokenmix.core.operator import MixOperator, solve_dense


class TTTWeights(NamedTuple):
    """Fast weights: W [B, H, D, D], c [B, H, D]; G [B, H, D, D], gb [B, H, D] (None when b = 1)."""

    W: Tensor
    c: Tensor
    G: Tensor | None
    gb: Tensor | None


def ln_mse_grad(z: Tensor, target: Tensor, ln_w: Tensor, ln_b: Tensor, eps: float) -> Tensor:
    """d/dz of 1/2 |ln_w ⊙ LN(z) + ln_b - target|² along the last axis (LayerNorm without affine inside)."""
    d = z.shape[-1]
    mean = z.mean(-1, keepdim=True)
    rstd = (z.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
    xh = (z - mean) / rstd
    g = ln_w * (ln_w * xh + ln_b - target)
    return (d * g - g.sum(-1, keepdim=True) - xh * (g * xh).sum(-1, keepdim=True)) / (rstd * d)


def post_norm(o: Tensor, ln_w: Tensor, ln_b: Tensor, eps: float) -> Tensor:
    """o + ln_w ⊙ LN(o) + ln_b along the last axis (o [B, T, H, D], ln_w, ln_b [H, D])."""
    mean = o.mean(-1, keepdim=True)
    rstd = (o.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
    return o + (o - mean) / rstd * ln_w + ln_b


def _pieces(start: int, t: int, mbs: int) -> list[tuple[int, int, bool]]:
    """(i0, i1, closes): the segment's slices inside one aligned mini-batch; closes = it ends one."""
    out, i = [], 0
    while i < t:
        n = min(mbs - (start + i) % mbs, t - i)
        out.append((i, i + n, (start + i + n) % mbs == 0))
        i += n
    return out


def chunked_ttt_linear(q: Tensor, k: Tensor, v: Tensor, eta: Tensor, ln_w: Tensor, ln_b: Tensor, scale: float,
                       eps: float, mbs: int, state: TTTWeights, start: int = 0) -> tuple[Tensor, TTTWeights]:
    """Dual form, one mini-batch (or its part inside the segment) at a time.

    Args:
        q, k, v: [B, T, H, D];  eta: [B, T, H];  ln_w, ln_b: [H, D];  mbs: mini-batch size b;
        state: the fast weights before the segment;  start: absolute position of its first token.
    Returns:
        o [B, T, H, D] (before the post-norm), the fast weights after the segment.
    """
    w_, b_ = ln_w[:, None], ln_b[:, None]  # [H, 1, D]
    W, c, G, gb = state
    outs = []
    for i0, i1, closes in _pieces(start, q.shape[1], mbs):
        qi, ki, vi = (z[:, i0:i1].transpose(1, 2) for z in (q, k, v))  # [B, H, n, D]
        ei = eta[:, i0:i1].transpose(1, 2)[..., None]                   # [B, H, n, 1]
        grad = ln_mse_grad(ki @ W + c[:, :, None], vi - ki, w_, b_, eps)
        sq = qi * scale
        attn = (sq @ ki.transpose(-1, -2) + 1.0).tril()
        o = sq @ W + c[:, :, None] - ei * (attn @ grad)
        g_new, gb_new = ki.transpose(-1, -2) @ grad, grad.sum(-2)
        if G is not None:
            o = o - ei * (sq @ G + gb[:, :, None])
            g_new, gb_new = G + g_new, gb + gb_new
        outs.append(o.transpose(1, 2))
        if closes:
            e_last = ei[:, :, -1]  # [B, H, 1]
            W, c = W - e_last[..., None] * g_new, c - e_last * gb_new
            G, gb = (None, None) if G is None else (torch.zeros_like(G), torch.zeros_like(gb))
        else:
            G, gb = g_new, gb_new
    return torch.cat(outs, 1), TTTWeights(W, c, G, gb)


def ttt_linear_step(state: TTTWeights, position: int, q_t: Tensor, k_t: Tensor, v_t: Tensor, eta_t: Tensor,
                    ln_w: Tensor, ln_b: Tensor, scale: float, eps: float, mbs: int) -> tuple[Tensor, TTTWeights]:
    """Primal form, one token: q_t, k_t, v_t [B, H, D], eta_t [B, H] -> o_t [B, H, D] (before the post-norm)."""
    W, c, G, gb = state
    z = torch.einsum("bhk,bhkv->bhv", k_t, W) + c
    grad = ln_mse_grad(z, v_t - k_t, ln_w, ln_b, eps)                     # nabla_t at the mini-batch's W, c
    g_new = k_t[..., :, None] * grad[..., None, :] + (0.0 if G is None else G)
    gb_new = grad + (0.0 if gb is None else gb)
    e = eta_t[..., None]
    o_t = torch.einsum("bhk,bhkv->bhv", q_t * scale, W - e[..., None] * g_new) + c - e * gb_new
    if (position + 1) % mbs == 0:                                          # the mini-batch ends: apply it
        W, c = W - e[..., None] * g_new, c - e * gb_new
        G, gb = (None, None) if G is None else (torch.zeros_like(G), torch.zeros_like(gb))
    else:
        G, gb = g_new, gb_new
    return o_t, TTTWeights(W, c, G, gb)


def recurrent_ttt_linear(q: Tensor, k: Tensor, v: Tensor, eta: Tensor, ln_w: Tensor, ln_b: Tensor, scale: float,
                         eps: float, mbs: int, state: TTTWeights, start: int = 0) -> tuple[Tensor, TTTWeights]:
    """Token-by-token reference with the signature of ``chunked_ttt_linear``."""
    outs = []
    for i in range(q.shape[1]):
        o_t, state = ttt_linear_step(state, start + i, q[:, i], k[:, i], v[:, i], eta[:, i], ln_w, ln_b, scale,
                                     eps, mbs)
        outs.append(o_t)
    return torch.stack(outs, 1), state


def ttt_operator(q: Tensor, k: Tensor, eta: Tensor, scale: float, mbs: int, start: int = 0) -> MixOperator:
    """Token view A [B, H, T, T] (B = 0) over the pseudo-values nabla of a segment (see the module docstring)."""
    b, t, h, _ = q.shape
    pos = torch.arange(start, start + t, device=q.device)
    mb = pos // mbs
    same = mb[:, None] == mb[None, :]
    eh = eta.transpose(1, 2)  # [B, H, T]
    last = torch.clamp((mb + 1) * mbs - 1 - start, max=t - 1)  # local index of each mini-batch's last token
    e = torch.where(same, eh[..., :, None], eh[..., last][..., None, :])  # [B, H, T, T]
    qk = (q.transpose(1, 2) * scale) @ k.transpose(1, 2).transpose(-1, -2) + 1.0
    mix_a = -(e * qk).tril()
    return MixOperator(mix_a, torch.zeros_like(mix_a))


def dense_ttt_linear(q: Tensor, k: Tensor, v: Tensor, eta: Tensor, ln_w: Tensor, ln_b: Tensor, scale: float,
                     eps: float, mbs: int, state: TTTWeights, start: int = 0) -> tuple[Tensor, TTTWeights]:
    """O = A nabla + offset through core.operator.solve_dense, the pseudo-values nabla mini-batch by mini-batch
    with every W_m, c_m summed in closed form from the initial weights and the earlier nablas."""
    b, t, h, d = q.shape
    w_, b_ = ln_w[:, None], ln_b[:, None]
    W0, c0, G0, gb0 = state
    zero_g, zero_gb = torch.zeros_like(W0), torch.zeros_like(c0)
    G0 = zero_g if G0 is None else G0
    gb0 = zero_gb if gb0 is None else gb0
    pieces = _pieces(start, t, mbs)
    grads, applied = [], []  # per piece: nabla [B, H, n, D]; (e_last, sum kᵀ nabla, sum nabla) of closed ones
    for j, (i0, i1, closes) in enumerate(pieces):
        W = W0 - sum((e[..., None] * gk for e, gk, _ in applied), zero_g)
        c = c0 - sum((e * gs for e, _, gs in applied), zero_gb)
        ki, vi = k[:, i0:i1].transpose(1, 2), v[:, i0:i1].transpose(1, 2)
        grad = ln_mse_grad(ki @ W + c[:, :, None], vi - ki, w_, b_, eps)
        grads.append(grad)
        if closes:
            carried = (G0, gb0) if j == 0 else (zero_g, zero_gb)
            e_last = eta[:, i1 - 1][..., None]  # [B, H, 1]
            applied.append((e_last, carried[0] + ki.transpose(-1, -2) @ grad, carried[1] + grad.sum(-2)))
    nabla = torch.cat(grads, 2).transpose(1, 2)  # [B, T, H, D]
    # the initial weights: W0, c0 read by everyone; the open sums G0, gb0 with eta_t in the first
    # mini-batch and with the first mini-batch's closing eta after it
    e0 = torch.full_like(eta, 0.0)
    i1_first, closes_first = pieces[0][1], pieces[0][2]
    e0[:, :i1_first] = eta[:, :i1_first]
    if closes_first:
        e0[:, i1_first:] = eta[:, i1_first - 1 : i1_first]
    sq = q * scale
    offset = (torch.einsum("bthk,bhkv->bthv", sq, W0) + c0[:, None]
              - e0[..., None] * (torch.einsum("bthk,bhkv->bthv", sq, G0) + gb0[:, None]))
    o = solve_dense(ttt_operator(q, k, eta, scale, mbs, start), nabla, offset=offset)
    W = W0 - sum((e[..., None] * gk for e, gk, _ in applied), zero_g)
    c = c0 - sum((e * gs for e, _, gs in applied), zero_gb)
    if state.G is None:
        return o, TTTWeights(W, c, None, None)
    i0, i1, closes = pieces[-1]
    if closes:
        return o, TTTWeights(W, c, zero_g, zero_gb)
    kl = k[:, i0:i1].transpose(1, 2)
    carried = (G0, gb0) if len(pieces) == 1 else (zero_g, zero_gb)
    return o, TTTWeights(W, c, carried[0] + kl.transpose(-1, -2) @ grads[-1], carried[1] + grads[-1].sum(-2))


__all__ = ["TTTWeights", "ln_mse_grad", "post_norm", "chunked_ttt_linear", "ttt_linear_step",
           "recurrent_ttt_linear", "ttt_operator", "dense_ttt_linear"]
