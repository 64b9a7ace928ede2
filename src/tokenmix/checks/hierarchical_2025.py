"""Cross-checks of the hierarchical / test-time-training mixers of issue 22: log_linear_mamba2,
log_linear_gated_deltanet and ttt_linear.

Metric, stated in each label: max relative error max|ours - ref| / max|ref|. Against fla-core's naive
references (pure PyTorch, float32 inside) at 1e-5 in float32; against an explicit formula written
here (no fla reference) in float64 at 1e-10. Each check runs the registered mixer through an identity
output projection (its output is then the per-head o_t) in every mode, whole and in uneven pieces
with the state passed along, on the mixer's own projections.

- log_linear_mamba2: fla ``naive_log_linear_attn(q=C, k=B, v=x·dt, g, level_scales, scale=1.0)`` with
  one key group (C, B shared by the heads), plus the pointwise D skip.
- log_linear_gated_deltanet: no fla reference. ``explicit_log_linear_delta`` is the definition,
  o_t = sum_s lambda_t^(l(t,s)) scale q_tᵀ [prod_{i=s+1..t} alpha_i (I - beta_i k_i k_iᵀ)] k_s beta_s v_s,
  with explicit K x K transition products and ``patterns.fenwick_level``; the ops (chunked at two chunk
  sizes, recurrent, the G-axis (A, B, R) solve) from unaligned starts with the Fenwick state passed
  on, and the mixer. Separately, with every level scale 1 the mixer is fla's gated delta rule.
- ttt_linear: fla ``chunk_ttt_linear_ref`` (output after its post-norm, final W and bias), with a
  nonzero initial state for the ops; final states at a length that fills whole mini-batches (fla pads
  a partial last mini-batch with tokens that still move its bias).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.checks import fla_naive, register_crosscheck
from tokenmix.checks.attention_family import identity_readout, max_rel_err, run_in_pieces
from tokenmix.core.operator import solve_dense
from tokenmix.mixers.base import Mixer
from tokenmix.mixers.registry import build_mixer
from tokenmix.ops.chunked_log_linear_delta import (chunked_log_linear_delta, final_levels, initial_levels_readout,
                                                   log_linear_delta_operator, recurrent_log_linear_delta)
from tokenmix.ops.ttt_linear import TTTWeights, chunked_ttt_linear, dense_ttt_linear, post_norm, recurrent_ttt_linear
from tokenmix.patterns import fenwick_level

FLOAT32_REL_TOL = 1e-5
FLOAT64_REL_TOL = 1e-10
HEADS, HEAD_DIM, T, PIECES = 3, 8, 37, (5, 1, 20, 11)


def _mixer(name: str, seed: int, dtype=torch.float32, **overrides) -> tuple[Mixer, Tensor]:
    """The registered mixer with an identity readout and an input x [2, T, D]; seeded."""
    torch.manual_seed(seed)
    m = build_mixer(name, HEADS * HEAD_DIM, n_heads=HEADS, **overrides).to(dtype)
    identity_readout(m)
    return m, torch.randn(2, T, HEADS * HEAD_DIM, dtype=dtype)


def _modes_against(m: Mixer, x: Tensor, y_ref: Tensor, prefix: str = "") -> dict[str, float]:
    """Every mode of m, whole and in PIECES, against y_ref [B, T, D]."""
    out = {}
    for mode in m.modes:
        for how, (y, _) in (("", m(x, mode=mode)), (".pieces", run_in_pieces(m, x, mode, PIECES))):
            out[f"{prefix}{mode}{how}.output"] = max_rel_err(y, y_ref)
    return out


# ---------------------------------------------------------------- log-linear Mamba-2
@register_crosscheck("log_linear_mamba2", "fla naive_log_linear_attn, one key group (float32 max rel)",
                     FLOAT32_REL_TOL)
def log_linear_mamba2_vs_fla() -> dict[str, float]:
    ref = fla_naive("log_linear_attn")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        m, x = _mixer("log_linear_mamba2", seed=4, state_dim=16, chunk_size=8)
        q, k, v, g, lam = m._project(x, 0)
        n_lam = math.ceil(math.log2(T)) + 1
        o_ref = ref.naive_log_linear_attn(q[:, :, :1].contiguous(), k[:, :, :1].contiguous(), v, g,
                                          lam[..., :n_lam].contiguous(), scale=1.0)
        xs, _, _, _ = m._split(x)
        y_ref = (o_ref + m.D[:, None] * xs).flatten(2)
        return _modes_against(m, x, y_ref, prefix=f"T={T} ")


# ---------------------------------------------------------------- log-linear Gated DeltaNet
def explicit_log_linear_delta(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, level_scales: Tensor,
                              scale: float) -> Tensor:
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


def _delta_inputs(t: int, seed: int, b: int = 2, h: int = 2, dk: int = 5, dv: int = 4):
    torch.manual_seed(seed)
    d = torch.float64
    q, v = torch.randn(b, t, h, dk, dtype=d), torch.randn(b, t, h, dv, dtype=d)
    k = F.normalize(torch.randn(b, t, h, dk, dtype=d), dim=-1)
    beta, g = 2 * torch.rand(b, t, h, dtype=d), F.logsigmoid(torch.randn(b, t, h, dtype=d) + 2)
    lam = F.softplus(torch.randn(b, t, h, 8, dtype=d))
    return q, k, v, beta, g, lam


@register_crosscheck("log_linear_gated_deltanet", "explicit λ-weighted gated-delta formula (float64 max rel)",
                     FLOAT64_REL_TOL)
def log_linear_gated_deltanet_vs_formula() -> dict[str, float]:
    out = {}
    scale = 0.6
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        q, k, v, beta, g, lam = _delta_inputs(45, seed=5)
        o_ref = explicit_log_linear_delta(q, k, v, beta, g, lam, scale)
        o, s_rec = recurrent_log_linear_delta(q, k, v, beta, g, lam, scale)
        out["op.recurrent.output"] = max_rel_err(o, o_ref)
        out["op.dense(A_l,B_l,R_l).output"] = max_rel_err(solve_dense(log_linear_delta_operator(q, k, beta, g, lam,
                                                                                             scale), v), o_ref)
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
            o = (solve_dense(log_linear_delta_operator(qt, kt, bt, gt, lt, scale, start), vt)
                 + initial_levels_readout(qt, kt, bt, gt, lt, scale, start, s0))
            out[f"op.dense from {start}.output"] = max_rel_err(o, o_ref[:, tail])
            out[f"op.dense from {start}.state_vs_recurrent"] = max_rel_err(final_levels(kt, vt, bt, gt, start, s0),
                                                                           s_rec)
        for neg in (False, True):
            m, x = _mixer("log_linear_gated_deltanet", seed=6 + neg, dtype=torch.float64, chunk_size=8,
                          allow_neg_eigval=neg)
            qm, km, vm, bm, gm, lm = m._levels_project(x, 0)
            y_ref = explicit_log_linear_delta(qm, km, vm, bm, gm, lm, m.scale).flatten(2)
            out.update(_modes_against(m, x, y_ref, prefix="beta<2 " if neg else "beta<1 "))
    return out


@register_crosscheck("log_linear_gated_deltanet", "level scales 1 vs fla naive_recurrent_gated_delta_rule "
                     "(float32 max rel)", FLOAT32_REL_TOL)
def log_linear_gated_deltanet_flat_vs_fla() -> dict[str, float]:
    ref = fla_naive("gated_delta_rule")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        m, x = _mixer("log_linear_gated_deltanet", seed=8, chunk_size=8)
        m.level_proj.weight.zero_()
        m.level_proj.bias.fill_(math.log(math.e - 1))  # softplus = 1 on every level
        q, k, v, beta, g, lam = m._levels_project(x, 0)
        o_ref, _ = ref.naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale=m.scale, output_final_state=True)
        return _modes_against(m, x, o_ref.flatten(2), prefix="λ=1 ")


# ---------------------------------------------------------------- TTT-Linear
def _fla_ttt(ref, q, k, v, eta, ln_w, ln_b, scale, eps, mbs, w0=None, c0=None):
    """fla's chunk_ttt_linear_ref on clones (it scales q in place); eta [B, T, H]; c0 [B, H, D]."""
    return ref.chunk_ttt_linear_ref(q.clone(), k.clone(), v.clone(), ln_w, ln_b, eta[..., None].clone(), scale, eps,
                                    mbs, None if w0 is None else w0.clone(),
                                    None if c0 is None else c0[:, :, None].clone(), True)


@register_crosscheck("ttt_linear", "fla chunk_ttt_linear_ref (float32 max rel)", FLOAT32_REL_TOL)
def ttt_linear_vs_fla() -> dict[str, float]:
    ref = fla_naive("ttt")
    out = {}
    eps, mbs = 1e-6, 16
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(9)
        b, h, d = 2, 3, 16
        for t in (37, 48):
            q, k, v = torch.randn(3, b, t, h, d).unbind(0)
            eta = 0.1 * torch.rand(b, t, h)
            ln_w, ln_b = 1 + 0.1 * torch.randn(h, d), 0.1 * torch.randn(h, d)
            w0, c0 = 0.3 * torch.randn(b, h, d, d), 0.3 * torch.randn(b, h, d)
            scale = d ** -0.5
            o_ref, w_ref, c_ref = _fla_ttt(ref, q, k, v, eta, ln_w, ln_b, scale, eps, mbs, w0, c0)
            s0 = TTTWeights(w0, c0, torch.zeros_like(w0), torch.zeros_like(c0))
            for name, fn in (("chunked", chunked_ttt_linear), ("recurrent", recurrent_ttt_linear),
                             ("dense", dense_ttt_linear)):
                o, s = fn(q, k, v, eta, ln_w, ln_b, scale, eps, mbs, s0)
                out[f"T={t} op.{name}.output"] = max_rel_err(post_norm(o, ln_w, ln_b, eps), o_ref)
                if t % mbs == 0:
                    out[f"T={t} op.{name}.state W"] = max_rel_err(s.W, w_ref)
                    out[f"T={t} op.{name}.state bias"] = max_rel_err(s.c, c_ref[:, :, 0])
        for m_bs in (1, 16):
            m, x = _mixer("ttt_linear", seed=10, mini_batch_size=m_bs)
            q, k, v, eta = m._project(x)
            o_ref, _, _ = _fla_ttt(ref, q, k, v, eta, m.ln_w, m.ln_b, m.scale, m.config.eps, m_bs)
            out.update(_modes_against(m, x, o_ref.flatten(2), prefix=f"b={m_bs} "))
    return out
