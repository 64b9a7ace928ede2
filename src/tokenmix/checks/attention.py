"""Cross-checks of the attention family (attention, local attention, FoX, stick-breaking, PaTH)
against independent references.

The references are code nobody here wrote: fla-core 0.6.0's pure-PyTorch naive files
(``naive_parallel_attn``, ``naive_forgetting_attn``, ``naive_stickbreaking_attn``,
``naive_path_attn``) and torch SDPA. They compute in float32, so these checks are float32 at 1e-5;
the metric is stated in each label: max abs error for attention and local attention, max relative
error max|ours - ref| / max|ref| for the gated and position-aware variants. Each check builds the
registered mixer with an identity output projection (so its output is the per-head y_t), feeds the
reference the mixer's own projections, and compares every mode, whole and in uneven pieces with the
state passed along (a KV-cache prefix: queries offset from their keys), at a chunk size that does
not divide T where the mixer has one.

Conventions handled here: fla's ``naive_parallel_attn(window_size=w)`` attends to keys in
[i - w + 1, i], this project's window w. fla's ``naive_path_attn`` adds the gate cumsum *before*
the 1/sqrt(K) scaling (its effective gate is g / sqrt(K)), while ``path_attention`` uses FoX's form
(log f added after scaling), so fla gets g = sqrt(K) log f; without the forget gate fla gets g = 0.
fla's stick-breaking ``attend_current`` is the mixer's config field of the same name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.checks import fla_naive, register_crosscheck
from tokenmix.checks.common import mixer_case, outputs_in_pieces
from tokenmix.checks.tolerances import FLOAT32_ABS_TOL, FLOAT32_REL_TOL, max_abs_err
from tokenmix.mixers.base import Mixer

HEAD_DIM, CHUNK = 16, 8  # 3 heads, T = 37 (common.mixer_case); chunks of 8 do not divide T
PER_MODE = (".output", ".pieces")


def _qkv(m: Mixer, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The mixer's own q, k, v projections, each [B, T, H, K]."""
    b, t, _ = x.shape
    return m.qkv(x).view(b, t, 3, m.n_heads, m.head_dim).unbind(2)


# ---------------------------------------------------------------- softmax attention
def _sdpa_reference(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """torch's causal SDPA on [B, T, H, K] inputs; returns [B, T, H·V]."""
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return y.transpose(1, 2).flatten(2)


@register_crosscheck("attention", "fla naive_parallel_attn", "float32 max abs", FLOAT32_ABS_TOL, per_mode=PER_MODE)
def attention_vs_fla() -> dict[str, float]:
    """Every mode, whole and in pieces, against fla-core's ``naive_parallel_attn``."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        m, x = mixer_case("attention", 0, head_dim=HEAD_DIM)
        ref = fla_naive("attn").naive_parallel_attn(*_qkv(m, x))[0].flatten(2)
        return outputs_in_pieces(m, x, ref, metric=max_abs_err)


@register_crosscheck("attention", "torch SDPA is_causal", "float32 max abs", FLOAT32_ABS_TOL, per_mode=PER_MODE)
def attention_vs_sdpa() -> dict[str, float]:
    """Every mode, whole and in pieces, against torch's fused causal SDPA; also the two references
    against each other (fla naive vs SDPA)."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        m, x = mixer_case("attention", 0, head_dim=HEAD_DIM)
        q, k, v = _qkv(m, x)
        ref = _sdpa_reference(q, k, v)
        fla_ref = fla_naive("attn").naive_parallel_attn(q, k, v)[0].flatten(2)
        return {"fla_naive_vs_sdpa": max_abs_err(fla_ref, ref), **outputs_in_pieces(m, x, ref, metric=max_abs_err)}


# ---------------------------------------------------------------- local attention
LOCAL_WINDOWS = (1, 4, 16, 50)  # 50 > T: the window covers the whole sequence


@register_crosscheck(
    "local_attention", "fla naive_parallel_attn window_size", "float32 max abs", FLOAT32_ABS_TOL, per_mode=PER_MODE
)
def local_attention_vs_fla(windows: Sequence[int] = LOCAL_WINDOWS) -> dict[str, float]:
    """Every mode, whole and in pieces, against fla's windowed naive attention.

    fla's query i attends to keys in [i - window_size + 1, i]: window_size positions including
    itself, which is this project's w.
    """
    out = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for window in windows:
            m, x = mixer_case("local_attention", window, heads=2, head_dim=8, window=window)
            ref = fla_naive("attn").naive_parallel_attn(*_qkv(m, x), window_size=window)[0].flatten(2)
            out.update(outputs_in_pieces(m, x, ref, (3, 1, 17, 16), max_abs_err, prefix=f"w={window} "))
    return out


# ---------------------------------------------------------------- FoX
@register_crosscheck(
    "forgetting_attention", "fla naive_forgetting_attn", "float32 max rel", FLOAT32_REL_TOL, per_mode=PER_MODE
)
def forgetting_attention_vs_fla() -> dict[str, float]:
    """Every mode against ``naive_forgetting_attn(q, k, v, g = log f)``; the forget-gate bias is
    scaled up (x4) so the gates are far from 1 and the decay matters."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        m, x = mixer_case("forgetting_attention", 0, head_dim=HEAD_DIM, chunk_size=CHUNK)
        m.fgate.weight.mul_(4.0)
        q, k, v = m._project(x)
        g = F.logsigmoid(m.fgate(x))
        ref = fla_naive("forgetting_attn").naive_forgetting_attn(q, k, v, g).flatten(2)
        return outputs_in_pieces(m, x, ref)


# ---------------------------------------------------------------- stick-breaking
@register_crosscheck(
    "stickbreaking_attention", "fla naive_stickbreaking_attn", "float32 max rel", FLOAT32_REL_TOL, per_mode=PER_MODE
)
def stickbreaking_attention_vs_fla(attend_current: Sequence[bool] = (False, True)) -> dict[str, float]:
    """Every mode against ``naive_stickbreaking_attn``, with and without ``attend_current``."""
    out = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for i, current in enumerate(attend_current):
            m, x = mixer_case("stickbreaking_attention", i, head_dim=HEAD_DIM, chunk_size=CHUNK, attend_current=current)
            q, k, v = m._project(x)
            ref = fla_naive("stickbreaking_attn").naive_stickbreaking_attn(q, k, v, attend_current=current)[0]
            out.update(outputs_in_pieces(m, x, ref.flatten(2), prefix=f"attend_current={current} "))
    return out


# ---------------------------------------------------------------- PaTH
PATH_CASES = ((False, True), (True, True), (True, False))  # (use_forget_gate, allow_neg_eigval)


@register_crosscheck("path_attention", "fla naive_path_attn", "float32 max rel", FLOAT32_REL_TOL, per_mode=PER_MODE)
def path_attention_vs_fla(cases: Sequence[tuple[bool, bool]] = PATH_CASES) -> dict[str, float]:
    """Every mode against ``naive_path_attn(q, k, v, w, beta, g, scale)`` (fla chunk 16, ours 8), with
    and without the forget gate and with beta in (0, 2) and (0, 1). The beta bias is scaled up so
    that beta reaches close to its ends (reflections near 2, projections near 1)."""
    out = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for i, (gate, neg) in enumerate(cases):
            m, x = mixer_case(
                "path_attention", i, head_dim=HEAD_DIM, chunk_size=CHUNK, use_forget_gate=gate, allow_neg_eigval=neg
            )
            m.beta_proj.weight.mul_(4.0)
            q, k, v = m._project(x)
            w, beta, logf = m.transforms(x)
            scale = 1.0 / math.sqrt(HEAD_DIM)
            g = logf / scale if logf is not None else torch.zeros_like(beta)
            ref = fla_naive("path_attn").naive_path_attn(q, k, v, w, beta, g, scale, chunk_size=16)
            out.update(outputs_in_pieces(m, x, ref.flatten(2), prefix=f"gate={gate} neg_eigval={neg} "))
    return out
