"""Cross-checks of attention, local attention, ChaCAL and H-LRU against independent references.

The references are code nobody here wrote (fla-core's ``naive_parallel_attn``, torch SDPA) or are
written in this file straight from the defining formula (ChaCAL's dense inverse, H-LRU's
per-channel loop). Every check runs each mode of the mixer on the whole sequence and again in
uneven pieces with the state passed along, so a KV-cache prefix (queries offset from their keys)
is covered too. The attention mixers are compared through an identity output projection, so the
mixer's output is the per-head y_t itself; H-LRU is compared end to end, readout included.

Metric, stated in each label: max abs error. The attention references compute in float32, so
those checks run in float32 at 1e-5; the formula references run in float64.

The helpers ``identity_readout``, ``run_in_pieces``, ``max_abs_err`` and ``max_rel_err`` are
shared with checks/delta_family.py and checks/linear_family.py.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.checks import fla_naive, register_crosscheck
from tokenmix.checks.equivalence import small_mixer
from tokenmix.mixers.registry import build_mixer
from tokenmix.mixers.base import Mixer

FLOAT32_ATTN_ATOL = 1e-5      # float32 outputs against float32 references, max abs
CHACAL_FORMULA_ATOL = 1e-10   # float64; I - gamma P stays well conditioned (|inverse| <= 1 / (1 - gamma) = 1000)
HLRU_LOOP_ATOL = 1e-10        # float64, the same arithmetic in another order


# ---------------------------------------------------------------- shared helpers
def max_abs_err(actual: Tensor, expected: Tensor) -> float:
    """max |actual - expected| in float64; shapes must match (no silent broadcasting)."""
    if actual.shape != expected.shape:
        raise InputError(f"shape {tuple(actual.shape)} != reference shape {tuple(expected.shape)}")
    return (actual.double() - expected.double()).abs().max().item() if actual.numel() else 0.0


def max_rel_err(actual: Tensor, expected: Tensor) -> float:
    """max |actual - expected| / max |expected| in float64; shapes must match."""
    return max_abs_err(actual, expected) / max(expected.double().abs().max().item(), 1e-30)


def identity_readout(m: Mixer) -> None:
    """Set the output projection to the identity, so the mixer returns the per-head outputs [B, T, H·V]."""
    with torch.no_grad():
        m.out.weight.copy_(torch.eye(m.out.weight.shape[0], dtype=m.out.weight.dtype))


def run_in_pieces(m: Mixer, x: Tensor, mode: str, sizes: Sequence[int]):
    """Feed x [B, T, D] in pieces of the given sizes, passing the state along.

    Returns:
        (the concatenated output [B, T, D], the final state).
    """
    if sum(sizes) != x.shape[1]:
        raise InputError(f"piece sizes {list(sizes)} do not add up to T = {x.shape[1]}")
    ys, state, t0 = [], None, 0
    for size in sizes:
        y, state = m(x[:, t0 : t0 + size], state, mode=mode)
        ys.append(y)
        t0 += size
    return torch.cat(ys, 1), state


def _qkv(m: Mixer, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The mixer's own q, k, v projections, each [B, T, H, K]."""
    b, t, _ = x.shape
    return m.qkv(x).view(b, t, 3, m.n_heads, m.head_dim).unbind(2)


def _modes_against(m: Mixer, x: Tensor, ref: Tensor, pieces: Sequence[int], prefix: str = "") -> dict[str, float]:
    """Max abs error ``{"<mode>.output": e, "<mode>.pieces": e}`` of every mode of m against ref [B, T, D]."""
    out = {}
    for mode in m.modes:
        out[f"{prefix}{mode}.output"] = max_abs_err(m(x, mode=mode)[0], ref)
        out[f"{prefix}{mode}.pieces"] = max_abs_err(run_in_pieces(m, x, mode, pieces)[0], ref)
    return out


# ---------------------------------------------------------------- softmax attention
ATTN_HEADS, ATTN_HEAD_DIM, ATTN_T, ATTN_PIECES = 3, 16, 37, (5, 1, 20, 11)


def _attention_case(seed: int = 0):
    """A float32 attention mixer with an identity readout, its input, and its q, k, v."""
    torch.manual_seed(seed)
    m = build_mixer("attention", ATTN_HEADS * ATTN_HEAD_DIM, n_heads=ATTN_HEADS)
    identity_readout(m)
    x = torch.randn(2, ATTN_T, ATTN_HEADS * ATTN_HEAD_DIM)
    return m, x, _qkv(m, x)


def _sdpa_reference(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """torch's causal SDPA on [B, T, H, K] inputs; returns [B, T, H·V]."""
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return y.transpose(1, 2).flatten(2)


@register_crosscheck("attention", "fla naive_parallel_attn (float32 max abs)", FLOAT32_ATTN_ATOL)
def attention_vs_fla() -> dict[str, float]:
    """Every mode, whole and in pieces, against fla-core's ``naive_parallel_attn``."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        m, x, (q, k, v) = _attention_case()
        ref = fla_naive("attn").naive_parallel_attn(q, k, v)[0].flatten(2)
        return _modes_against(m, x, ref, ATTN_PIECES)


@register_crosscheck("attention", "torch SDPA is_causal (float32 max abs)", FLOAT32_ATTN_ATOL)
def attention_vs_sdpa() -> dict[str, float]:
    """Every mode, whole and in pieces, against torch's fused causal SDPA; also the two references
    against each other (fla naive vs SDPA)."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        m, x, (q, k, v) = _attention_case()
        ref = _sdpa_reference(q, k, v)
        fla_ref = fla_naive("attn").naive_parallel_attn(q, k, v)[0].flatten(2)
        return {"fla_naive_vs_sdpa": max_abs_err(fla_ref, ref), **_modes_against(m, x, ref, ATTN_PIECES)}


# ---------------------------------------------------------------- local attention
LOCAL_WINDOWS = (1, 4, 16, 50)  # 50 > T: the window covers the whole sequence


@register_crosscheck("local_attention", "fla naive_parallel_attn window_size (float32 max abs)", FLOAT32_ATTN_ATOL)
def local_attention_vs_fla(windows: Sequence[int] = LOCAL_WINDOWS) -> dict[str, float]:
    """Every mode, whole and in pieces, against fla's windowed naive attention.

    fla's query i attends to keys in [i - window_size + 1, i]: window_size positions including
    itself, which is this project's w.
    """
    h, k_dim, t = 2, 8, 37
    out = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for window in windows:
            torch.manual_seed(window)
            m = build_mixer("local_attention", h * k_dim, n_heads=h, window=window)
            identity_readout(m)
            x = torch.randn(2, t, h * k_dim)
            q, k, v = _qkv(m, x)
            ref = fla_naive("attn").naive_parallel_attn(q, k, v, window_size=window)[0].flatten(2)
            out.update(_modes_against(m, x, ref, (3, 1, 17, 16), prefix=f"w={window} "))
    return out


# ---------------------------------------------------------------- ChaCAL
CHACAL_GAMMAS = (0.05, 0.5, 0.999)  # one head near each end of [0, 1) and one in the middle


def chacal_dense_inverse(m: Mixer, x: Tensor) -> Tensor:
    """(1 - gamma) P (I - gamma P)^{-1} V per head, with an explicit dense inverse.

    Args:
        m: a ChaCAL mixer (its q, k, v projections and gamma [H] are used; not its output projection).
        x: [B, T, D].
    Returns:
        [B, T, H·V], the per-head outputs before the output projection.
    """
    q, k, v = (z.transpose(1, 2) for z in _qkv(m, x))  # [B, H, T, K]
    t = x.shape[1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(m.head_dim)
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    p = torch.softmax(scores.masked_fill(future, float("-inf")), -1)  # [B, H, T, T]
    g = m.gamma[:, None, None]
    eye = torch.eye(t, dtype=x.dtype)
    y = (1 - g) * p @ torch.linalg.inv(eye - g * p) @ v
    return y.transpose(1, 2).flatten(2)


@register_crosscheck("chacal", "dense-inverse formula (1-g) P (I-gP)^-1 V (float64 max abs)", CHACAL_FORMULA_ATOL)
def chacal_vs_dense_inverse() -> dict[str, float]:
    """Every mode, whole and in pieces (chunk size 5), against ``chacal_dense_inverse``."""
    h, k_dim, t = 3, 4, 23
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        m = build_mixer("chacal", h * k_dim, n_heads=h, chunk_size=5).double()
        identity_readout(m)
        m.gamma_logit.copy_(torch.logit(torch.tensor(CHACAL_GAMMAS, dtype=torch.float64)))
        x = torch.randn(2, t, h * k_dim, dtype=torch.float64)
        return _modes_against(m, x, chacal_dense_inverse(m, x), (4, 1, 9, 9))


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


@register_crosscheck("hlru", "per-channel loop (float64 max abs)", HLRU_LOOP_ATOL)
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
            out.update(_modes_against(m, x, hlru_per_channel_loop(m, x), (2, 1, 5, 3),
                                      prefix=f"m={order} {normalization} "))
    return out
