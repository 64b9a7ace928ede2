"""Cross-checks of DeltaNet, Gated DeltaNet and log-linear attention against fla-core's naive references.

fla's ``naive.py`` files (fla-core 0.6.0, pure PyTorch) compute in float32, so these checks are
float32. Metric, stated in each label: max relative error max|ours - ref| / max|ref|, at 1e-5.
Each check compares the ops (ops/chunked_delta.py, ops/chunked_log_linear.py) on random inputs
with a nonzero initial state, at chunk sizes that do not divide T, and then the registered mixer
itself: every mode, whole and in uneven pieces with the state passed along, through an identity
output projection (so the mixer's output is the per-head o_t) on the mixer's own projections.

Layout differences handled here: fla's delta_rule is head-first [B, H, T, K]; its
naive_recurrent_gated_delta_rule takes (beta, g) but naive_chunk_gated_delta_rule takes
(g, beta); naive_log_linear_attn defaults to scale 1.0 and wants exactly ceil(log2 T) + 1 level
scales. Our own float64 mode equivalences are ``checks.equivalence.mode_errors``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.checks import fla_naive, register_crosscheck
from tokenmix.checks.attention_family import identity_readout, max_rel_err, run_in_pieces
from tokenmix.mixers.registry import build_mixer
from tokenmix.mixers.base import Mixer
from tokenmix.ops.chunked_delta import chunked_delta_rule, recurrent_delta_rule
from tokenmix.ops.chunked_log_linear import (chunked_log_linear_attention, fenwick_level_matrix, n_levels,
                                             recurrent_log_linear_attention)
from tokenmix.patterns import fenwick_level

FLOAT32_REL_TOL = 1e-5
MIXER_HEADS, MIXER_HEAD_DIM, MIXER_T, MIXER_PIECES = 3, 8, 37, (5, 1, 20, 11)
DELTA_CHUNKS = (16, 64)  # T = 50 is a multiple of neither


def _head_first(x: Tensor) -> Tensor:
    return x.transpose(1, 2).contiguous()


def _delta_inputs(t: int = 50, b: int = 2, h: int = 3, dk: int = 16, dv: int = 12):
    """q, k (L2-normalised: fla's delta refs leave that to the caller) [B, T, H, K], v [B, T, H, V],
    beta in (0, 1) and g = log decay [B, T, H], initial state s0 [B, H, K, V]; seeded."""
    torch.manual_seed(0)
    q = torch.randn(b, t, h, dk)
    k = F.normalize(torch.randn(b, t, h, dk), dim=-1)
    v = torch.randn(b, t, h, dv)
    beta = torch.rand(b, t, h)
    g = F.logsigmoid(2 * torch.randn(b, t, h))
    s0 = torch.randn(b, h, dk, dv)
    return q, k, v, beta, g, s0


def _mixer_case(name: str, seed: int, **overrides):
    """A float32 mixer (chunk size 16) with an identity readout and an input x [2, T, D]."""
    torch.manual_seed(seed)
    m = build_mixer(name, MIXER_HEADS * MIXER_HEAD_DIM, n_heads=MIXER_HEADS, chunk_size=16, **overrides)
    identity_readout(m)
    return m, torch.randn(2, MIXER_T, MIXER_HEADS * MIXER_HEAD_DIM)


def _mixer_modes_against(m: Mixer, x: Tensor, o_ref: Tensor, s_ref: Tensor | None, prefix: str = ""
                         ) -> dict[str, float]:
    """Every mode of m, whole and in pieces, against o_ref [B, T, H, V] and (delta rule) the final
    state s_ref [B, H, K, V]."""
    out = {}
    for mode in m.modes:
        for how, (y, state) in (("", m(x, mode=mode)), (".pieces", run_in_pieces(m, x, mode, MIXER_PIECES))):
            out[f"{prefix}{mode}{how}.output"] = max_rel_err(y, o_ref.flatten(2))
            if s_ref is not None:
                out[f"{prefix}{mode}{how}.state"] = max_rel_err(state.memory, s_ref)
    return out


# ---------------------------------------------------------------- DeltaNet
@register_crosscheck("deltanet", "fla delta_rule_recurrence (float32 max rel)", FLOAT32_REL_TOL)
def deltanet_vs_fla() -> dict[str, float]:
    """The delta-rule ops (chunked at two chunk sizes, recurrent; initial state s0) and the DeltaNet
    mixer in every mode (beta in (0, 1) and, with allow_neg_eigval, in (0, 2)) against fla."""
    ref = fla_naive("delta_rule")
    out = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        q, k, v, beta, _, s0 = _delta_inputs()
        o_ref, s_ref = ref.delta_rule_recurrence(_head_first(q), _head_first(k), _head_first(v), _head_first(beta),
                                                 initial_state=s0.clone(), output_final_state=True)
        o_ref = _head_first(o_ref)  # back to [B, T, H, V]
        runs = {f"op.chunked(C={c})": chunked_delta_rule(q, k, v, beta, None, None, s0, c) for c in DELTA_CHUNKS}
        runs["op.recurrent"] = recurrent_delta_rule(q, k, v, beta, None, None, s0)
        for what, (o, s) in runs.items():
            out[f"{what}.output"] = max_rel_err(o, o_ref)
            out[f"{what}.state"] = max_rel_err(s, s_ref)
        for neg in (False, True):
            m, x = _mixer_case("deltanet", seed=int(neg), allow_neg_eigval=neg)
            qm, km, vm, bm, _ = m._project(x)
            o_ref, s_ref = ref.delta_rule_recurrence(_head_first(qm), _head_first(km), _head_first(vm),
                                                     _head_first(bm), output_final_state=True)
            out.update(_mixer_modes_against(m, x, _head_first(o_ref), s_ref,
                                            prefix="beta<2 " if neg else "beta<1 "))
    return out


# ---------------------------------------------------------------- Gated DeltaNet
def _gated_delta_vs(reference: str) -> dict[str, float]:
    """The gated delta-rule ops and the Gated DeltaNet mixer against fla's ``naive_<reference>_gated_delta_rule``."""
    ref = fla_naive("gated_delta_rule")

    def fla_ref(q, k, v, beta, g, scale, s0):
        if reference == "recurrent":  # (beta, g)
            return ref.naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale=scale, initial_state=s0,
                                                        output_final_state=True)
        return ref.naive_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=16, scale=scale,  # (g, beta)
                                                initial_state=s0, output_final_state=True)

    out = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        q, k, v, beta, g, s0 = _delta_inputs()
        scale = q.shape[-1] ** -0.5
        o_ref, s_ref = fla_ref(q, k, v, beta, g, scale, s0.clone())
        runs = {f"op.chunked(C={c})": chunked_delta_rule(q, k, v, beta, g, scale, s0, c) for c in DELTA_CHUNKS}
        runs["op.recurrent"] = recurrent_delta_rule(q, k, v, beta, g, scale, s0)
        for what, (o, s) in runs.items():
            out[f"{what}.output"] = max_rel_err(o, o_ref)
            out[f"{what}.state"] = max_rel_err(s, s_ref)
        m, x = _mixer_case("gated_deltanet", seed=2)
        qm, km, vm, bm, gm = m._project(x)
        o_ref, s_ref = fla_ref(qm, km, vm, bm, gm, m.scale, None)
        out.update(_mixer_modes_against(m, x, o_ref, s_ref))
    return out


@register_crosscheck("gated_deltanet", "fla naive_recurrent_gated_delta_rule (float32 max rel)", FLOAT32_REL_TOL)
def gated_deltanet_vs_fla_recurrent() -> dict[str, float]:
    return _gated_delta_vs("recurrent")


@register_crosscheck("gated_deltanet", "fla naive_chunk_gated_delta_rule C=16 (float32 max rel)", FLOAT32_REL_TOL)
def gated_deltanet_vs_fla_chunk() -> dict[str, float]:
    return _gated_delta_vs("chunk")


# ---------------------------------------------------------------- log-linear attention
LOG_LINEAR_LENGTHS = (37, 64, 100)
LOG_LINEAR_CHUNKS = (8, 64)


def _fla_level_count(t: int) -> int:
    """ceil(log2 T) + 1: the level scales fla's construct_H_matrix iterates over."""
    n_lam = math.ceil(math.log2(t)) + 1
    if n_lam < n_levels(t):
        raise RuntimeError(f"fla iterates over {n_lam} levels at T={t}, fewer than the {n_levels(t)} that occur")
    return n_lam


@register_crosscheck("log_linear", "fla naive_log_linear_attn (float32 max rel)", FLOAT32_REL_TOL)
def log_linear_vs_fla(lengths: Sequence[int] = LOG_LINEAR_LENGTHS) -> dict[str, float]:
    """The log-linear ops (recurrent; chunked at two chunk sizes) at several T, and the mixer in every
    mode, against fla's naive_log_linear_attn. fla's reference has no state, so the chunked final
    Fenwick states are compared with the recurrent op's instead (``state_vs_recurrent``)."""
    ref = fla_naive("log_linear_attn")
    out = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for t in lengths:
            torch.manual_seed(t)
            b, h, dk, dv = 2, 3, 16, 12
            q, k = torch.randn(b, t, h, dk), torch.randn(b, t, h, dk)
            v = torch.randn(b, t, h, dv)
            g = F.logsigmoid(torch.randn(b, t, h) + 3)
            lam = F.softplus(torch.randn(b, t, h, _fla_level_count(t)))
            scale = dk ** -0.5  # fla's default is 1.0: pass it explicitly
            o_ref = ref.naive_log_linear_attn(q, k, v, g, lam, scale=scale)
            o_rec, s_rec = recurrent_log_linear_attention(q, k, v, g, lam, scale)
            out[f"T={t} op.recurrent.output"] = max_rel_err(o_rec, o_ref)
            for c in LOG_LINEAR_CHUNKS:
                o, s = chunked_log_linear_attention(q, k, v, g, lam, scale, chunk_size=c)
                out[f"T={t} op.chunked(C={c}).output"] = max_rel_err(o, o_ref)
                out[f"T={t} op.chunked(C={c}).state_vs_recurrent"] = max_rel_err(s, s_rec)
        m, x = _mixer_case("log_linear", seed=3)
        qm, km, vm, gm, lam_m = m._project(x, 0)
        o_ref = ref.naive_log_linear_attn(qm, km, vm, gm, lam_m[..., : _fla_level_count(x.shape[1])], scale=m.scale)
        out.update(_mixer_modes_against(m, x, o_ref, None, prefix=f"T={x.shape[1]} "))
    return out


FENWICK_LENGTHS = (1, 2, 5, 8, 13, 37, 64)


@register_crosscheck("log_linear", "fla construct_level_mask (mismatched entries)", 0.0)
def fenwick_level_vs_fla(lengths: Sequence[int] = FENWICK_LENGTHS) -> dict[str, float]:
    """``patterns.fenwick_level`` (per entry) and ``ops.chunked_log_linear.fenwick_level_matrix``
    (vectorised) against the level of every (i, j <= i) in fla's construct_level_mask: the number of
    entries that differ, summed over several T (-1 marks j > i)."""
    ref = fla_naive("log_linear_attn")
    mismatched = {"fenwick_level": 0.0, "fenwick_level_matrix": 0.0}
    for t in lengths:
        n_lam = math.ceil(math.log2(t)) + 1 if t > 1 else 1
        fla_lvl = torch.full((t, t), -1, dtype=torch.long)
        for lvl in range(n_lam):
            one_hot = torch.zeros(n_lam, t)
            one_hot[lvl] = 1.0
            fla_lvl[ref.construct_level_mask(lvl, one_hot) != 0] = lvl
        ours = torch.tensor([[fenwick_level(i, j) if j <= i else -1 for j in range(t)] for i in range(t)])
        mismatched["fenwick_level"] += _mismatches(ours, fla_lvl)
        mismatched["fenwick_level_matrix"] += _mismatches(fenwick_level_matrix(0, t), fla_lvl)
    return mismatched


def _mismatches(ours: Tensor, expected: Tensor) -> float:
    """Entries that differ; a wrong shape counts as every entry wrong."""
    if ours.shape != expected.shape:
        return float(expected.numel())
    return float((ours != expected).sum())
