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
from tokenmix.core.threads import one_thread


class TTTWeights(NamedTuple):
    """Fast weights: W [B, H, D, D], c [B, H, D]; G [B, H, D, D], gb [B, H, D] (None when b = 1)."""

    W: Tensor
    c: Tensor
    G: Tensor | None
    gb: Tensor | None


def ln_mse_grad(z: Tensor, target: Tensor, ln_w: Tensor, ln_b: Tensor, eps: float) -> Tensor:
    """d/dz of 1/2 |ln_w ⊙ LN(z) + ln_b - target|² along the last axis (LayerNorm without affine inside)."""
    return _ln_mse_grad_shifted(z, ln_b - target, ln_w, eps)


def _ln_mse_grad_shifted(z: Tensor, shift: Tensor, ln_w: Tensor, eps: float) -> Tensor:
    """``ln_mse_grad`` with shift = ln_b - target given (it does not depend on the fast weights, so the
    chunked form computes it for the whole segment outside its sequential loop)."""
    d = z.shape[-1]
    var, mean = torch.var_mean(z, -1, unbiased=False, keepdim=True)
    rstd = (var + eps).rsqrt()
    xh = (z - mean) * rstd
    g = ln_w * torch.addcmul(shift, ln_w, xh)  # ln_w ⊙ (ln_w ⊙ x̂ + ln_b - target)
    inner = d * g - g.sum(-1, keepdim=True) - xh * (g * xh).sum(-1, keepdim=True)
    return inner * (rstd / d)


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


def chunked_ttt_linear(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    eta: Tensor,
    ln_w: Tensor,
    ln_b: Tensor,
    scale: float,
    eps: float,
    mbs: int,
    state: TTTWeights,
    start: int = 0,
) -> tuple[Tensor, TTTWeights]:
    """Dual form over the segment's mini-batches (or their parts inside the segment).

    Args:
        q, k, v: [B, T, H, D];  eta: [B, T, H];  ln_w, ln_b: [H, D];  mbs: mini-batch size b;
        state: the fast weights before the segment;  start: absolute position of its first token.
    Returns:
        o [B, T, H, D] (before the post-norm), the fast weights after the segment.

    Only what needs the current fast weights runs in the sequential loop over mini-batches m:
    nabla_m = LN-MSE gradient at z = K_m W_m + c_m, then W_{m+1} = W_m - eta_last K_mᵀ nabla_m (and c),
    about twenty small operations per mini-batch, forward and backward. Everything else is batched
    over the mini-batches before or after it: the targets (ln_b - v + k), and the read-out
    o_m = scale Q_m W_m + c_m - eta (Q_m K_mᵀ scale + 1)_causal nabla_m (minus eta (scale Q_m G + gb)
    for a mini-batch opened before the segment), formed from the stacked W_m, c_m, nabla_m. The
    segment is cut once (one split, not a slice per mini-batch: autograd would scatter each slice's
    gradient into a full [B, T, H, D] zero tensor, O(T² / b) traffic). B and H are flattened so that
    z and the weight update are single baddbmm calls; the loop runs on one thread (core/threads.py).
    """
    b, t, h, d = q.shape
    pieces = _pieces(start, t, mbs)
    sizes = [i1 - i0 for i0, i1, _ in pieces]

    def flat(x: Tensor) -> Tensor:  # [B, T, H, ...] -> [B H, T, ...]
        return x.transpose(1, 2).reshape(b * h, t, *x.shape[3:])

    sq, kf = flat(q) * scale, flat(k)  # [BH, T, D]
    shift = flat(ln_b - (v - k))  # ln_b - target, [BH, T, D]
    ef = flat(eta[..., None])  # [BH, T, 1]
    lw = ln_w.repeat(b, 1)[:, None]  # [BH, 1, D]
    W, c = state.W.reshape(b * h, d, d), state.c.reshape(b * h, 1, d)
    G = None if state.G is None else state.G.reshape(b * h, d, d)  # open sums; None = zero
    gb = None if state.gb is None else state.gb.reshape(b * h, 1, d)
    read_open = G is not None  # only the first piece can read them
    ws, cs, grads = [], [], []
    with one_thread():
        for kp, shp, ep, (_, _, closes) in zip(kf.split(sizes, 1), shift.split(sizes, 1), ef.split(sizes, 1), pieces):
            grad = _ln_mse_grad_shifted(torch.baddbmm(c, kp, W), shp, lw, eps)  # nabla at the mini-batch's W, c
            ws.append(W)
            cs.append(c)
            grads.append(grad)
            g_new, gb_new = kp.transpose(-1, -2) @ grad, grad.sum(-2, keepdim=True)
            if G is not None:
                g_new, gb_new = G + g_new, gb + gb_new
            if closes:
                e_last = ep[:, -1:]  # [BH, 1, 1]
                W, c = W - e_last * g_new, c - e_last * gb_new
                G = gb = None
            else:
                G, gb = g_new, gb_new
    # the read-out, batched over runs of consecutive equal-size pieces (all of them but the ends, in
    # training); a first piece that reads the open sums of the state stands alone
    runs: list[list[int]] = []  # [first piece, count]
    for j, size in enumerate(sizes):
        if runs and sizes[runs[-1][0]] == size and not (read_open and runs[-1][0] == 0):
            runs[-1][1] += 1
        else:
            runs.append([j, 1])
    outs, i0 = [], 0
    for j, run in runs:
        size = sizes[j]
        sl = slice(i0, i0 + run * size)
        qm, km, em = (x[:, sl].unflatten(1, (run, size)) for x in (sq, kf, ef))  # [BH, r, s, .]
        wm, cm = torch.stack(ws[j : j + run], 1), torch.stack(cs[j : j + run], 1)  # [BH, r, D, D], [BH, r, 1, D]
        attn = (qm @ km.transpose(-1, -2) + 1.0).tril()
        o = qm @ wm + cm - em * (attn @ torch.stack(grads[j : j + run], 1))
        if read_open and j == 0:
            o = o - em * (qm @ state.G.reshape(b * h, 1, d, d) + state.gb.reshape(b * h, 1, 1, d))
        outs.append(o.flatten(1, 2))
        i0 += run * size
    o = torch.cat(outs, 1) if len(outs) > 1 else outs[0]
    if state.G is not None:  # keep the state's layout
        G = torch.zeros_like(W) if G is None else G
        gb = torch.zeros_like(c) if gb is None else gb
        G, gb = G.view(b, h, d, d), gb.view(b, h, d)
    return o.view(b, h, t, d).transpose(1, 2), TTTWeights(W.view(b, h, d, d), c.view(b, h, d), G, gb)


def ttt_linear_step(
    state: TTTWeights,
    position: int,
    q_t: Tensor,
    k_t: Tensor,
    v_t: Tensor,
    eta_t: Tensor,
    ln_w: Tensor,
    ln_b: Tensor,
    scale: float,
    eps: float,
    mbs: int,
) -> tuple[Tensor, TTTWeights]:
    """Primal form, one token: q_t, k_t, v_t [B, H, D], eta_t [B, H] -> o_t [B, H, D] (before the post-norm)."""
    W, c, G, gb = state
    z = torch.einsum("bhk,bhkv->bhv", k_t, W) + c
    grad = ln_mse_grad(z, v_t - k_t, ln_w, ln_b, eps)  # nabla_t at the mini-batch's W, c
    g_new = k_t[..., :, None] * grad[..., None, :] + (0.0 if G is None else G)
    gb_new = grad + (0.0 if gb is None else gb)
    e = eta_t[..., None]
    o_t = torch.einsum("bhk,bhkv->bhv", q_t * scale, W - e[..., None] * g_new) + c - e * gb_new
    if (position + 1) % mbs == 0:  # the mini-batch ends: apply it
        W, c = W - e[..., None] * g_new, c - e * gb_new
        G, gb = (None, None) if G is None else (torch.zeros_like(G), torch.zeros_like(gb))
    else:
        G, gb = g_new, gb_new
    return o_t, TTTWeights(W, c, G, gb)


def recurrent_ttt_linear(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    eta: Tensor,
    ln_w: Tensor,
    ln_b: Tensor,
    scale: float,
    eps: float,
    mbs: int,
    state: TTTWeights,
    start: int = 0,
) -> tuple[Tensor, TTTWeights]:
    """Token-by-token reference with the signature of ``chunked_ttt_linear``."""
    outs = []
    for i in range(q.shape[1]):
        o_t, state = ttt_linear_step(
            state, start + i, q[:, i], k[:, i], v[:, i], eta[:, i], ln_w, ln_b, scale, eps, mbs
        )
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


def dense_ttt_linear(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    eta: Tensor,
    ln_w: Tensor,
    ln_b: Tensor,
    scale: float,
    eps: float,
    mbs: int,
    state: TTTWeights,
    start: int = 0,
) -> tuple[Tensor, TTTWeights]:
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
    offset = (
        torch.einsum("bthk,bhkv->bthv", sq, W0)
        + c0[:, None]
        - e0[..., None] * (torch.einsum("bthk,bhkv->bthv", sq, G0) + gb0[:, None])
    )
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


__all__ = [
    "TTTWeights",
    "ln_mse_grad",
    "post_norm",
    "chunked_ttt_linear",
    "ttt_linear_step",
    "recurrent_ttt_linear",
    "ttt_operator",
    "dense_ttt_linear",
]
