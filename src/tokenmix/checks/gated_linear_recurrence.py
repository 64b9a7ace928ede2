"""Cross-checks of the gated linear recurrences (H-LRU, HGRN-2, the RG-LRU) against independent references.

* H-LRU: no fla reference. ``hlru_per_channel_loop`` is the recurrence and readout as a plain loop
  over batch, time and channel, from the mixer's parameters, compared end to end (readout included)
  in float64 for several orders and both gate normalisations; metric: max abs error.
* HGRN-2 against fla-core's HGRN-1 reference ``naive_recurrent_hgrn`` (ops/hgrn/naive.py,
  h = exp(g) h + x elementwise): the state expansion makes every entry S[c, v] of a head's [K, V]
  state one HGRN-1 channel with x = (1 - f_c) i_v and g = log f_c, so the K·V·H expanded channels
  run through fla's loop and the readout o_t = K^-1/2 sum_c q_tc S_t[c, :] is applied here. Also
  against ``naive_recurrent_gla`` (ops/gla/naive.py, what fla's HGRN2 layer calls, fixed K^-1/2).
  fla's refs compute in float32, so this check is float32 at 1e-5, max relative error.
* RG-LRU: no fla reference. A plain loop written from the Griffin paper's equations (§2.4),
  literally: a_t = sigmoid(Lambda) ** (c r_t) by a power, sqrt(1 - a_t ** 2), block-diagonal gates
  head by head, in float64 (the literal 1 - a_t² cancels when a_t is near 1: in float32 it would
  lose ~4 digits, which is why the mixer forms it with expm1); max relative error.

The HGRN-2 and RG-LRU checks have two levels: the ops on random inputs with an initial state (keys
``op.*``) and the registered mixer (features recomputed here from the mixer's parameters by the
papers' formulas, through the mixer's own output projection; every mode, on two segments with the
state carried: ``<mode>.output``, ``<mode>.continued.output``, ``<mode>.state``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.checks import fla_naive, register_crosscheck
from tokenmix.checks.common import (
    MIXER_D,
    OP_SHAPE,
    SEGMENT_QUANTITIES,
    gla_ops_against,
    modes_over_segments,
    outputs_in_pieces,
    segments_case,
)
from tokenmix.checks.equivalence import small_mixer
from tokenmix.checks.tolerances import FLOAT32_REL_TOL, FLOAT64_ABS_TOL, FLOAT64_REL_TOL, max_abs_err, max_rel_err
from tokenmix.mixers.base import Mixer

OP_B, OP_T, OP_H, OP_K, OP_V, OP_CHUNK = OP_SHAPE


# ---------------------------------------------------------------- H-LRU
HLRU_CASES = ((1, "softmax"), (2, "l1"), (4, "softmax"), (3, "l1"))  # (order m, normalization)


def hlru_per_channel_loop(m: Mixer, x: Tensor) -> Tensor:
    """The H-LRU recurrence and readout as a plain loop over batch, time and channel.

    Args:
        m: an H-LRU mixer (its v_proj, gates and out weights are used).
        x: [B, T, D].
    Returns:
        [B, T, D], the mixer's output.
    """
    b_sz, t, _ = x.shape
    order, n = m.config.order, m.channels
    wv, wg, bg, wo = m.v_proj.weight, m.gates.weight, m.gates.bias, m.out.weight
    out = torch.zeros(b_sz, t, wo.shape[0], dtype=x.dtype)
    for b in range(b_sz):
        z = [[0.0] * t for _ in range(n)]
        for s in range(t):
            feats = []
            for c in range(n):
                rows = [slot * n + c for slot in range(order + 1)]  # gate rows are slot-major
                logits = wg[rows] @ x[b, s] + bg[rows]
                if m.config.normalization == "softmax":
                    g = torch.exp(logits - logits.max())
                    g = g / g.sum()
                else:
                    g = torch.tanh(logits)
                    g = g / (g.abs().sum() + 1e-6)
                zc = g[order] * (wv[c] @ x[b, s])
                for lag in range(1, order + 1):
                    if s - lag >= 0:
                        zc = zc + g[lag - 1] * z[c][s - lag]
                z[c][s] = zc
                feats += [z[c][s - lag] if s - lag >= 0 else torch.zeros((), dtype=x.dtype) for lag in range(order)]
            out[b, s] = wo @ torch.stack(feats)
    return out


@register_crosscheck("hlru", "per-channel loop", "float64 max abs", FLOAT64_ABS_TOL, per_mode=(".output", ".pieces"))
def hlru_vs_per_channel_loop(cases: Sequence[tuple[int, str]] = HLRU_CASES) -> dict[str, float]:
    """Every mode, whole and in pieces (chunk size 4), against ``hlru_per_channel_loop``, for
    several orders and both gate normalisations."""
    out = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for order, normalization in cases:
            m = small_mixer("hlru", d_model=6, n_heads=2, order=order, normalization=normalization)
            # larger gate logits than the default init, so the gates are far from uniform
            m.gates.weight.mul_(4.0)
            m.gates.bias.normal_(0.0, 1.0)
            x = torch.randn(2, 11, 6, dtype=torch.float64)
            out.update(
                outputs_in_pieces(
                    m, x, hlru_per_channel_loop(m, x), (2, 1, 5, 3), max_abs_err, prefix=f"m={order} {normalization} "
                )
            )
    return out


# ---------------------------------------------------------------- HGRN-2
def _hgrn_expanded(q: Tensor, k: Tensor, v: Tensor, log_f: Tensor, s0: Tensor | None) -> tuple[Tensor, Tensor]:
    """HGRN-2 through fla's HGRN-1 loop on the K·V expanded channels of every head.

    q, k, log_f [B, T, H, K]; v [B, T, H, V]; s0 [B, H, K, V] or None -> (o [B, T, H, V], S_T [B, H, K, V]).
    """
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    hgrn = fla_naive("hgrn")
    x = (k[..., :, None] * v[..., None, :]).reshape(b, t, h * dk * dv)  # (1 - f_c) i_v
    g = log_f[..., None].expand(b, t, h, dk, dv).reshape(b, t, h * dk * dv)  # log f_c, shared along v
    init = None if s0 is None else s0.reshape(b, h * dk * dv)
    states, final = hgrn.naive_recurrent_hgrn(x, g, initial_state=init, output_final_state=True)
    states = states.view(b, t, h, dk, dv)
    o = torch.einsum("bthk,bthkv->bthv", q, states) / math.sqrt(dk)
    return o, final.view(b, h, dk, dv)


@register_crosscheck(
    "hgrn2",
    "fla naive_recurrent_hgrn on the expanded channels + naive_recurrent_gla",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=("chunked_gla", "recurrent_gla"),
    op_states=True,
    per_mode=SEGMENT_QUANTITIES,
)
def hgrn2_vs_fla() -> dict[str, float]:
    """The GLA ops with k = 1 - f, v = i, gk = log f (initial state s0) against fla's HGRN-1 loop on the
    expanded channels (and fla's GLA reference); the mixer in every mode against the HGRN-1 loop."""
    gla = fla_naive("gla")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        q = F.silu(torch.randn(OP_B, OP_T, OP_H, OP_K))
        f_logits = torch.randn(OP_B, OP_T, OP_H, OP_K) * 2
        k, log_f = 1 - torch.sigmoid(f_logits), F.logsigmoid(f_logits)
        v = torch.randn(OP_B, OP_T, OP_H, OP_V)
        s0 = torch.randn(OP_B, OP_H, OP_K, OP_V)
        o_ref, s_ref = _hgrn_expanded(q, k, v, log_f, s0)
        o_gla, s_gla = gla.naive_recurrent_gla(q, k, v, log_f, initial_state=s0, output_final_state=True)
        out = {
            "op ref.naive_recurrent_gla_vs_hgrn.output": max_rel_err(o_gla, o_ref),
            "op ref.naive_recurrent_gla_vs_hgrn.state": max_rel_err(s_gla, s_ref),
        }
        out.update(gla_ops_against(q, k, v, log_f, OP_K**-0.5, s0, o_ref, s_ref, OP_CHUNK))

        m, xs = segments_case("hgrn2")
        h, hd = m.n_heads, m.head_dim

        def reference(x, s):
            b, t, _ = x.shape
            wq, wf, wi = m.qfi.weight.view(3, h * hd, MIXER_D)  # the paper's three maps
            q = F.silu(x @ wq.T).view(b, t, h, hd)
            f = torch.sigmoid(x @ wf.T).view(b, t, h, hd)  # forget gate (lower bound 0)
            o, s = _hgrn_expanded(q, 1 - f, (x @ wi.T).view(b, t, h, hd), f.log(), s)
            return m.out(o.flatten(2)), s, {"state": (lambda st: st.memory, s)}, {}

        out.update(modes_over_segments(m, xs, reference))
    return out


# ---------------------------------------------------------------- RG-LRU
def rg_lru_paper_loop(m: Mixer, x: Tensor, h0: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Griffin §2.4 token by token, from the mixer's parameters: x [B, T, D] -> (y [B, T, D], h_T [B, D_in])."""
    b, t, _ = x.shape
    n_heads, hd, c = m.n_heads, m.head_dim, m.config.c
    u = x @ m.in_proj.weight.T  # the RG-LRU input x_t
    w_a, w_x = m.gate_weight[..., :hd], m.gate_weight[..., hd:]  # blocks [H, hd, hd]
    a = 1.0 / (1.0 + torch.exp(-m.Lambda))  # a = sigmoid(Lambda)
    h = u.new_zeros(b, n_heads * hd) if h0 is None else h0
    ys = []
    for s in range(t):
        u_t = u[:, s]
        blocks = [u_t[:, j * hd : (j + 1) * hd] for j in range(n_heads)]
        r = torch.sigmoid(torch.cat([blk @ w_a[j] for j, blk in enumerate(blocks)], -1) + m.gate_bias[0])
        i = torch.sigmoid(torch.cat([blk @ w_x[j] for j, blk in enumerate(blocks)], -1) + m.gate_bias[1])
        a_t = a ** (c * r)
        h = a_t * h + torch.sqrt(1 - a_t**2) * (i * u_t)
        ys.append(h @ m.out.weight.T)
    return torch.stack(ys, 1), h


@register_crosscheck(
    "rg_lru",
    "plain loop of the Griffin paper's equations",
    "float64 max rel",
    FLOAT64_REL_TOL,
    per_mode=SEGMENT_QUANTITIES,
)
def rg_lru_vs_paper_loop() -> dict[str, float]:
    """The mixer in every mode (two segments, state carried) against ``rg_lru_paper_loop``; also the
    initialisation: a^c = sigmoid(Lambda)^c within [a_min, a_max] (key ``init.a^c outside``, 0 or 1)."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        m, xs = segments_case("rg_lru", torch.float64)
        ac = torch.sigmoid(m.Lambda) ** m.config.c
        outside = float(bool(((ac < m.config.a_min - 1e-9) | (ac > m.config.a_max + 1e-9)).any()))

        def reference(x, s):
            y, h = rg_lru_paper_loop(m, x, s)
            return y, h, {"state": (lambda st: st.memory[..., 0, 0], h)}, {}

        out = {"init.a^c outside [a_min, a_max]": outside}
        out.update(modes_over_segments(m, xs, reference))
    return out
