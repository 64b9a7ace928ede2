"""Cross-checks of the 2025 attention variants (FoX, stick-breaking, PaTH) against fla-core's naive references.

fla's ``naive.py`` files (fla-core 0.6.0, pure PyTorch) compute in float32, so these checks are
float32. Metric, stated in each label: max relative error max|ours - ref| / max|ref|, at 1e-5.
Each check builds the registered mixer with an identity output projection (so its output is the
per-head y_t), feeds fla the mixer's own projections, and compares every mode, whole and in uneven
pieces with the state passed along (a KV-cache prefix: queries offset from their keys), at a chunk
size that does not divide T.

Conventions handled here: fla's ``naive_path_attn`` adds the gate cumsum *before* the 1/sqrt(K)
scaling (its effective gate is g / sqrt(K)), while ``path_attention`` uses FoX's form (log f added
after scaling), so fla gets g = sqrt(K) log f; without the forget gate fla gets g = 0. fla's
stick-breaking ``attend_current`` is the mixer's config field of the same name.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.checks import fla_naive, register_crosscheck
from tokenmix.checks.attention_family import identity_readout, max_rel_err, run_in_pieces
from tokenmix.mixers.base import Mixer
from tokenmix.mixers.registry import build_mixer

FLOAT32_REL_TOL = 1e-5
HEADS, HEAD_DIM, T, PIECES, CHUNK = 3, 16, 37, (5, 1, 20, 11), 8  # 8 does not divide 37


def _case(name: str, seed: int, **overrides) -> tuple[Mixer, Tensor]:
    """A float32 mixer (chunk size 8) with an identity readout, and an input x [2, T, D]; seeded."""
    torch.manual_seed(seed)
    m = build_mixer(name, HEADS * HEAD_DIM, n_heads=HEADS, chunk_size=CHUNK, **overrides)
    identity_readout(m)
    return m, torch.randn(2, T, HEADS * HEAD_DIM)


def _modes_against(m: Mixer, x: Tensor, ref: Tensor, prefix: str = "") -> dict[str, float]:
    """Max relative error ``{"<prefix><mode>.output": e, "<prefix><mode>.pieces": e}`` of every mode."""
    out = {}
    for mode in m.modes:
        out[f"{prefix}{mode}.output"] = max_rel_err(m(x, mode=mode)[0], ref)
        out[f"{prefix}{mode}.pieces"] = max_rel_err(run_in_pieces(m, x, mode, PIECES)[0], ref)
    return out


# ---------------------------------------------------------------- FoX
@register_crosscheck("forgetting_attention", "fla naive_forgetting_attn (float32 max rel)", FLOAT32_REL_TOL)
def forgetting_attention_vs_fla() -> dict[str, float]:
    """Every mode against ``naive_forgetting_attn(q, k, v, g = log f)``; the forget-gate bias is
    scaled up (x4) so the gates are far from 1 and the decay matters."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        m, x = _case("forgetting_attention", 0)
        m.fgate.weight.mul_(4.0)
        q, k, v = m._project(x)
        g = F.logsigmoid(m.fgate(x))
        ref = fla_naive("forgetting_attn").naive_forgetting_attn(q, k, v, g).flatten(2)
        return _modes_against(m, x, ref)


# ---------------------------------------------------------------- stick-breaking
@register_crosscheck("stickbreaking_attention", "fla naive_stickbreaking_attn (float32 max rel)", FLOAT32_REL_TOL)
def stickbreaking_attention_vs_fla(attend_current: Sequence[bool] = (False, True)) -> dict[str, float]:
    """Every mode against ``naive_stickbreaking_attn``, with and without ``attend_current``."""
    out = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for i, current in enumerate(attend_current):
            m, x = _case("stickbreaking_attention", i, attend_current=current)
            q, k, v = m._project(x)
            ref = fla_naive("stickbreaking_attn").naive_stickbreaking_attn(q, k, v, attend_current=current)[0]
            out.update(_modes_against(m, x, ref.flatten(2), prefix=f"attend_current={current} "))
    return out


# ---------------------------------------------------------------- PaTH
PATH_CASES = ((False, True), (True, True), (True, False))  # (use_forget_gate, allow_neg_eigval)


@register_crosscheck("path_attention", "fla naive_path_attn (float32 max rel)", FLOAT32_REL_TOL)
def path_attention_vs_fla(cases: Sequence[tuple[bool, bool]] = PATH_CASES) -> dict[str, float]:
    """Every mode against ``naive_path_attn(q, k, v, w, beta, g, scale)`` (fla chunk 16, ours 8), with
    and without the forget gate and with beta in (0, 2) and (0, 1). The beta bias is scaled up so
    that beta reaches close to its ends (reflections near 2, projections near 1)."""
    out = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for i, (gate, neg) in enumerate(cases):
            m, x = _case("path_attention", i, use_forget_gate=gate, allow_neg_eigval=neg)
            m.beta_proj.weight.mul_(4.0)
            q, k, v = m._project(x)
            w, beta, logf = m.transforms(x)
            scale = 1.0 / math.sqrt(HEAD_DIM)
            g = logf / scale if logf is not None else torch.zeros_like(beta)
            ref = fla_naive("path_attn").naive_path_attn(q, k, v, w, beta, g, scale, chunk_size=16)
            out.update(_modes_against(m, x, ref.flatten(2), prefix=f"gate={gate} neg_eigval={neg} "))
    return out
