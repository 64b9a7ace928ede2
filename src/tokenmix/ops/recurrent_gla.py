"""Gated linear attention, token by token: the reference ``chunked_gla`` is tested against.

Recurrence per head, state S [K, V] (fla's layout, ``h`` / ``initial_state`` there):

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ,        o_t = scale · S_tᵀ q_t.

The log decay g_t is per key channel ([K], GLA, diagonal SSMs), one scalar per head (RetNet,
Mamba-2) broadcast over K, or absent (linear attention, decay 1). Every first-order mixer of the
linear-attention family is this recurrence with its own q, k, v, g and scale.
"""

from __future__ import annotations

import torch
from torch import Tensor


def gla_step(
    state: Tensor, q_t: Tensor, k_t: Tensor, v_t: Tensor, g_t: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    """One token of gated linear attention.

    Args:
        state: [B, H, K, V], S_{t-1}.
        q_t, k_t: [B, H, K];  v_t: [B, H, V].
        g_t: log decay, [B, H, K] per key channel, [B, H] per head, or None (no decay).
        scale: readout scale.
    Returns:
        o_t [B, H, V], S_t [B, H, K, V].
    """
    if g_t is not None:
        decay = g_t.exp()
        state = state * (decay[..., None] if g_t.dim() == 3 else decay[..., None, None])  # 1. forget
    state = state + k_t[..., :, None] * v_t[..., None, :]  # 2. write k_t v_tᵀ
    return scale * torch.einsum("bhk,bhkv->bhv", q_t, state), state  # 3. read with q_t


def recurrent_gla(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, scale: float = 1.0, initial_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Token-by-token loop with the signature of ``chunked_gla`` (no chunk size).

    Args:
        q, k: [B, T, H, K];  v: [B, T, H, V].
        g: log decay [B, T, H, K] (per key channel), [B, T, H] (per head) or None.
        scale: readout scale (fla's GLA and linear attention use K^-1/2, Mamba-2 uses 1).
        initial_state: [B, H, K, V] or None (zeros).
    Returns:
        o [B, T, H, V], final state S_T [B, H, K, V].

    Examples:
        >>> o, s = recurrent_gla(torch.randn(1, 5, 2, 4), torch.randn(1, 5, 2, 4), torch.randn(1, 5, 2, 3))
        >>> o.shape, s.shape
        (torch.Size([1, 5, 2, 3]), torch.Size([1, 2, 4, 3]))
    """
    b, t, h, dk = q.shape
    s = q.new_zeros(b, h, dk, v.shape[-1]) if initial_state is None else initial_state
    outs = []
    # unbind once: indexing token i inside the loop would make autograd scatter every token's gradient
    # into a full-size zero tensor (O(T^2) memory traffic)
    gs = [None] * t if g is None else g.unbind(1)
    for q_t, k_t, v_t, g_t in zip(q.unbind(1), k.unbind(1), v.unbind(1), gs):
        o_t, s = gla_step(s, q_t, k_t, v_t, g_t, scale)
        outs.append(o_t)
    return torch.stack(outs, 1), s
