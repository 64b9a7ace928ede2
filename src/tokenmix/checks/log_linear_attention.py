"""Cross-checks of the log-linear attention family (log-linear attention, log-linear Mamba-2,
log-linear Gated DeltaNet) against independent references.

Metric, stated in each label: max relative error max|ours - ref| / max|ref|. Against fla-core's naive
references (pure PyTorch, float32 inside) at 1e-5 in float32; against an explicit formula written
here (no fla reference) in float64 at 1e-10. Each check runs the registered mixer through an identity
output projection (its output is then the per-head o_t) in every mode, whole and in uneven pieces
with the state passed along, on the mixer's own projections.

- log_linear: the ops (ops/chunked_log_linear.py: recurrent, chunked at two chunk sizes that do not
  divide T) at several T and the mixer against fla ``naive_log_linear_attn``, which defaults to scale
  1.0 and wants exactly ceil(log2 T) + 1 level scales; and the Fenwick level of every (i, j <= i)
  (``patterns.fenwick_level``, ``ops.chunked_log_linear.fenwick_level_matrix``) against fla's
  ``construct_level_mask``.
- log_linear_mamba2: fla ``naive_log_linear_attn(q=C, k=B, v=x·dt, g, level_scales, scale=1.0)`` with
  one key group (C, B shared by the heads), plus the pointwise D skip.
- log_linear_gated_deltanet: no fla reference. ``explicit_log_linear_delta`` is the definition,
  o_t = sum_s lambda_t^(l(t,s)) scale q_tᵀ [prod_{i=s+1..t} alpha_i (I - beta_i k_i k_iᵀ)] k_s beta_s v_s,
  with explicit K x K transition products and ``patterns.fenwick_level``; the ops (chunked at two chunk
  sizes, recurrent, the G-axis (A, B, R) solve) from unaligned starts with the Fenwick state passed
  on, and the mixer. Separately, with every level scale 1 the mixer is fla's gated delta rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.checks import fla_naive, register_crosscheck
from tokenmix.checks.common import mixer_case, outputs_and_states_in_pieces
from tokenmix.checks.tolerances import FLOAT32_REL_TOL, FLOAT64_REL_TOL, MISMATCHES_ALLOWED, max_rel_err
from tokenmix.core.operator import solve_dense
from tokenmix.ops.chunked_log_linear import (
    chunked_log_linear_attention,
    fenwick_level_matrix,
    n_levels,
    recurrent_log_linear_attention,
)
from tokenmix.ops.chunked_log_linear_delta import (
    chunked_log_linear_delta,
    final_levels,
    initial_levels_readout,
    log_linear_delta_operator,
    recurrent_log_linear_delta,
)
from tokenmix.patterns import fenwick_level

PER_MODE = (".output", ".pieces.output")


def _fla_level_count(t: int) -> int:
    """ceil(log2 T) + 1: the level scales fla's construct_H_matrix iterates over."""
    n_lam = math.ceil(math.log2(t)) + 1
    if n_lam < n_levels(t):
        raise RuntimeError(f"fla iterates over {n_lam} levels at T={t}, fewer than the {n_levels(t)} that occur")
    return n_lam


# ---------------------------------------------------------------- log-linear attention
LOG_LINEAR_LENGTHS = (37, 64, 100)
LOG_LINEAR_CHUNKS = (8, 64)


@register_crosscheck(
    "log_linear",
    "fla naive_log_linear_attn",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=("recurrent", *(f"chunked(C={c})" for c in LOG_LINEAR_CHUNKS)),
    per_mode=PER_MODE,
)
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
            scale = dk**-0.5  # fla's default is 1.0: pass it explicitly
            o_ref = ref.naive_log_linear_attn(q, k, v, g, lam, scale=scale)
            o_rec, s_rec = recurrent_log_linear_attention(q, k, v, g, lam, scale)
            out[f"T={t} op.recurrent.output"] = max_rel_err(o_rec, o_ref)
            for c in LOG_LINEAR_CHUNKS:
                o, s = chunked_log_linear_attention(q, k, v, g, lam, scale, chunk_size=c)
                out[f"T={t} op.chunked(C={c}).output"] = max_rel_err(o, o_ref)
                out[f"T={t} op.chunked(C={c}).state_vs_recurrent"] = max_rel_err(s, s_rec)
        m, x = mixer_case("log_linear", 3, chunk_size=16)
        qm, km, vm, gm, lam_m = m._project(x, 0)
        o_ref = ref.naive_log_linear_attn(qm, km, vm, gm, lam_m[..., : _fla_level_count(x.shape[1])], scale=m.scale)
        out.update(outputs_and_states_in_pieces(m, x, o_ref, prefix=f"T={x.shape[1]} "))
    return out


FENWICK_LENGTHS = (1, 2, 5, 8, 13, 37, 64)


@register_crosscheck(
    "log_linear",
    "fla construct_level_mask",
    "mismatched entries",
    MISMATCHES_ALLOWED,
    per_mode=(),
    compares_modes=False,
)
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


# ---------------------------------------------------------------- log-linear Mamba-2
@register_crosscheck(
    "log_linear_mamba2",
    "fla naive_log_linear_attn, one key group",
    "float32 max rel",
    FLOAT32_REL_TOL,
    per_mode=PER_MODE,
)
def log_linear_mamba2_vs_fla() -> dict[str, float]:
    ref = fla_naive("log_linear_attn")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        m, x = mixer_case("log_linear_mamba2", 4, state_dim=16, chunk_size=8)
        t = x.shape[1]
        q, k, v, g, lam = m._project(x, 0)
        o_ref = ref.naive_log_linear_attn(
            q[:, :, :1].contiguous(),
            k[:, :, :1].contiguous(),
            v,
            g,
            lam[..., : math.ceil(math.log2(t)) + 1].contiguous(),
            scale=1.0,
        )
        xs, _, _, _ = m._split(x)
        y_ref = (o_ref + m.D[:, None] * xs).flatten(2)
        return outputs_and_states_in_pieces(m, x, y_ref, prefix=f"T={t} ")


# ---------------------------------------------------------------- log-linear Gated DeltaNet
def explicit_log_linear_delta(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, level_scales: Tensor, scale: float
) -> Tensor:
    """The definition, entry by entry: o [B, T, H, V] from q, k [B, T, H, K], v, beta, g, level_scales
    (absolute positions from 0). O(T² K²) with explicit transition products; for checks only."""
    b, t, h, dk = q.shape
    eye = torch.eye(dk, dtype=q.dtype)
    trans = g.exp()[..., None, None] * (eye - beta[..., None, None] * k[..., :, None] * k[..., None, :])  # [B,T,H,K,K]
    out = torch.zeros_like(v)
    for ti in range(t):
        prod = eye.expand(b, h, dk, dk)  # T_t ... T_{s+1}
        for s in range(ti, -1, -1):
            m_ts = scale * torch.einsum("bhk,bhkj,bhj->bh", q[:, ti], prod, k[:, s]) * beta[:, s]
            lam = level_scales[:, ti, :, fenwick_level(ti, s)]
            out[:, ti] += (lam * m_ts)[..., None] * v[:, s]
            prod = prod @ trans[:, s]
    return out


def _formula_inputs(t: int, seed: int, b: int = 2, h: int = 2, dk: int = 5, dv: int = 4):
    """float64 q, k (L2-normalised) [B, T, H, K], v [B, T, H, V], beta in (0, 2), g = log decay
    [B, T, H] and 8 level scales [B, T, H, 8]; seeded."""
    torch.manual_seed(seed)
    d = torch.float64
    q, v = torch.randn(b, t, h, dk, dtype=d), torch.randn(b, t, h, dv, dtype=d)
    k = F.normalize(torch.randn(b, t, h, dk, dtype=d), dim=-1)
    beta, g = 2 * torch.rand(b, t, h, dtype=d), F.logsigmoid(torch.randn(b, t, h, dtype=d) + 2)
    lam = F.softplus(torch.randn(b, t, h, 8, dtype=d))
    return q, k, v, beta, g, lam


@register_crosscheck(
    "log_linear_gated_deltanet",
    "explicit λ-weighted gated-delta formula",
    "float64 max rel",
    FLOAT64_REL_TOL,
    ops=("recurrent", "dense(A_l,B_l,R_l)", "chunked(C=4)", "chunked(C=16)"),
    per_mode=PER_MODE,
)
def log_linear_gated_deltanet_vs_formula() -> dict[str, float]:
    out = {}
    scale = 0.6
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        q, k, v, beta, g, lam = _formula_inputs(45, seed=5)
        o_ref = explicit_log_linear_delta(q, k, v, beta, g, lam, scale)
        o, s_rec = recurrent_log_linear_delta(q, k, v, beta, g, lam, scale)
        out["op.recurrent.output"] = max_rel_err(o, o_ref)
        out["op.dense(A_l,B_l,R_l).output"] = max_rel_err(
            solve_dense(log_linear_delta_operator(q, k, beta, g, lam, scale), v), o_ref
        )
        for c in (4, 16):
            o, s = chunked_log_linear_delta(q, k, v, beta, g, lam, scale, chunk_size=c)
            out[f"op.chunked(C={c}).output"] = max_rel_err(o, o_ref)
            out[f"op.chunked(C={c}).state_vs_recurrent"] = max_rel_err(s, s_rec)
        for start in (13, 24):  # a second segment from the Fenwick state of the first
            head, tail = slice(0, start), slice(start, None)
            args = lambda sl: (q[:, sl], k[:, sl], v[:, sl], beta[:, sl], g[:, sl], lam[:, sl])  # noqa: E731
            _, s0 = chunked_log_linear_delta(*args(head), scale, chunk_size=8)
            o, _ = chunked_log_linear_delta(*args(tail), scale, s0, start, 8)
            out[f"op.chunked(C=8) from {start}.output"] = max_rel_err(o, o_ref[:, tail])
            qt, kt, vt, bt, gt, lt = args(tail)
            o = solve_dense(log_linear_delta_operator(qt, kt, bt, gt, lt, scale, start), vt) + initial_levels_readout(
                qt, kt, bt, gt, lt, scale, start, s0
            )
            out[f"op.dense from {start}.output"] = max_rel_err(o, o_ref[:, tail])
            out[f"op.dense from {start}.state_vs_recurrent"] = max_rel_err(
                final_levels(kt, vt, bt, gt, start, s0), s_rec
            )
        for neg in (False, True):
            m, x = mixer_case(
                "log_linear_gated_deltanet", 6 + neg, dtype=torch.float64, chunk_size=8, allow_neg_eigval=neg
            )
            qm, km, vm, bm, gm, lm = m._levels_project(x, 0)
            y_ref = explicit_log_linear_delta(qm, km, vm, bm, gm, lm, m.scale).flatten(2)
            out.update(outputs_and_states_in_pieces(m, x, y_ref, prefix="beta<2 " if neg else "beta<1 "))
    return out


@register_crosscheck(
    "log_linear_gated_deltanet",
    "level scales 1 vs fla naive_recurrent_gated_delta_rule",
    "float32 max rel",
    FLOAT32_REL_TOL,
    per_mode=PER_MODE,
)
def log_linear_gated_deltanet_flat_vs_fla() -> dict[str, float]:
    ref = fla_naive("gated_delta_rule")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        m, x = mixer_case("log_linear_gated_deltanet", 8, chunk_size=8)
        m.level_proj.weight.zero_()
        m.level_proj.bias.fill_(math.log(math.e - 1))  # softplus = 1 on every level
        q, k, v, beta, g, lam = m._levels_project(x, 0)
        o_ref, _ = ref.naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale=m.scale, output_final_state=True)
        return outputs_and_states_in_pieces(m, x, o_ref.flatten(2), prefix="λ=1 ")
