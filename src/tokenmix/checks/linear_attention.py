"""Cross-checks of the linear-attention family (linear attention, RetNet, GLA, MesaNet) against
fla-core's naive references.

fla's ``naive.py`` files (fla-core 0.6.0, pure PyTorch) compute in float32, so these checks are
float32. Metric, stated in each label: max relative error max|ours - ref| / max|ref|, at 1e-5.

Mappings: linear attention = naive_recurrent_linear_attn (and fla's chunk form
naive_chunk_linear_attn, chunk 64, no state); RetNet = naive_retention (head-first [B, H, T, D],
decays 1 - 2^(-5-h) computed inside fla, no state) and, for states, naive_recurrent_simple_gla with
g = log gamma_h; GLA = naive_recurrent_gla (fixed K^-1/2 scale); MesaNet = naive_mesa_net_exact
(ops/mesa_net/naive.py: h_kk, h_kv updated, then torch.linalg.solve(h_kk + diag(lamb), q), no
readout scale), with initial h_kk / h_kv. fla's states are [B, H, K, V], the layout of ours.

Two levels in each check: the ops (ops/chunked_gla.py at chunk size 16 with T = 50, and
ops/recurrent_gla.py; for MesaNet also ops/chunked_mesa.py's key covariances and solves; shared
random inputs and an initial state; outputs and final states, keys ``op.<impl>...``) and the
registered mixer (fla-convention features recomputed here from the mixer's parameters by the
papers' formulas, passed through the mixer's own output projection; every mode, on two segments so
that the state carried between calls is checked too: keys ``<mode>.output`` for the first segment,
``<mode>.continued.output`` for the second, and ``<mode>.state`` for the final state). Our own
float64 mode equivalences are ``checks.equivalence.mode_errors``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.checks import fla_naive, register_crosscheck
from tokenmix.checks.common import (
    GLA_OPS,
    MIXER_D,
    MIXER_SEGMENTS,
    OP_SHAPE,
    SEGMENT_QUANTITIES,
    gla_ops_against,
    modes_over_segments,
    run_in_pieces,
    segment_mixer,
    segments_case,
)
from tokenmix.checks.tolerances import FLOAT32_REL_TOL, max_rel_err
from tokenmix.core.errors import InputError
from tokenmix.mixers.base import Mixer
from tokenmix.ops.chunked_gla import chunked_gla
from tokenmix.ops.chunked_mesa import (
    chunked_key_covariance,
    dense_key_covariance,
    mesa_solve,
    mesa_solve_reference,
    recurrent_key_covariance,
)

OP_B, OP_T, OP_H, OP_K, OP_V, OP_CHUNK = OP_SHAPE


# ---------------------------------------------------------------- helpers
def _op_qkv(t: int = OP_T) -> tuple[Tensor, Tensor, Tensor]:
    return torch.randn(OP_B, t, OP_H, OP_K), torch.randn(OP_B, t, OP_H, OP_K), torch.randn(OP_B, t, OP_H, OP_V)


def _retention_log_decay(h: int) -> Tensor:
    """log gamma_h = log(1 - 2^(-5-h)), RetNet's fixed per-head decays [H]."""
    return torch.log1p(-(2.0 ** (-5.0 - torch.arange(h, dtype=torch.float32))))


def _naive_retention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """fla's naive_retention on [B, T, H, D] inputs (it is head-first); returns [B, T, H, D]."""
    return fla_naive("retention").naive_retention(*(z.transpose(1, 2) for z in (q, k, v))).transpose(1, 2)


def reference_features(name: str, m: Mixer, x: Tensor) -> dict:
    """fla-convention q, k, v (and, for GLA, gk) in fla's [B, T, H, ...] layout, recomputed from the
    mixer's parameters by the papers' formulas."""
    b, t, _ = x.shape
    if name not in ("linear_attention", "retnet", "gla"):
        raise InputError(f"no fla reference features for {name!r}")
    h, hd = m.n_heads, m.head_dim
    q, k, v = m.qkv(x).view(b, t, 3, h, hd).unbind(2)
    if name in ("linear_attention", "retnet"):
        return dict(q=q, k=k, v=v)
    gk = F.logsigmoid(m.gate_up(m.gate_down(x))).view(b, t, h, hd) / 16.0  # fla's gate normaliser
    return dict(q=q, k=k, v=v, gk=gk)


def _mixer_against(name: str, fla_run) -> dict[str, float]:
    """Every mode of the mixer, over MIXER_SEGMENTS with the state passed along, against
    ``fla_run(features, s0) -> (o [B, T, H, V], final state [B, H, K, V], {extra quantity: error})``."""
    m, xs = segments_case(name)

    def reference(x, s):
        f = reference_features(name, m, x)
        o, s, extra = fla_run(f, s)
        return m.out(o.flatten(2)), s, {"state": (lambda st: st.memory, s)}, extra

    return modes_over_segments(m, xs, reference)


# ---------------------------------------------------------------- linear attention
@register_crosscheck(
    "linear_attention",
    "fla naive_recurrent_linear_attn",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=GLA_OPS,
    op_states=True,
    per_mode=SEGMENT_QUANTITIES,
)
def linear_attention_vs_fla_recurrent() -> dict[str, float]:
    """The ops (initial state s0) and the mixer in every mode against fla's naive_recurrent_linear_attn."""
    ref = fla_naive("linear_attn")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        q, k, v = _op_qkv()
        s0 = torch.randn(OP_B, OP_H, OP_K, OP_V)
        scale = OP_K**-0.5
        o_ref, s_ref = ref.naive_recurrent_linear_attn(q, k, v, scale, s0, output_final_state=True)
        out = gla_ops_against(q, k, v, None, scale, s0, o_ref, s_ref, OP_CHUNK)

        def fla_run(f, s0):
            o, s = ref.naive_recurrent_linear_attn(
                f["q"], f["k"], f["v"], f["q"].shape[-1] ** -0.5, s0, output_final_state=True
            )
            return o, s, {}

        out.update(_mixer_against("linear_attention", fla_run))
    return out


LINEAR_ATTN_CHUNK_T, LINEAR_ATTN_CHUNK_PIECES = 128, (5, 1, 70, 52)  # fla's chunk form needs T % 64 == 0


@register_crosscheck(
    "linear_attention",
    "fla naive_chunk_linear_attn C=64",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=GLA_OPS,
    per_mode=(".output", ".pieces.output"),
)
def linear_attention_vs_fla_chunk() -> dict[str, float]:
    """The ops and the mixer in every mode (whole and in uneven pieces) against fla's own chunk form
    (chunk 64, T = 128, no state, so outputs only)."""
    ref = fla_naive("linear_attn")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        q, k, v = _op_qkv(t=LINEAR_ATTN_CHUNK_T)
        scale = OP_K**-0.5
        out = gla_ops_against(q, k, v, None, scale, None, ref.naive_chunk_linear_attn(q, k, v, scale), None, OP_CHUNK)
        m = segment_mixer("linear_attention")
        x = torch.randn(2, LINEAR_ATTN_CHUNK_T, MIXER_D)
        f = reference_features("linear_attention", m, x)
        y_ref = m.out(ref.naive_chunk_linear_attn(f["q"], f["k"], f["v"], f["q"].shape[-1] ** -0.5).flatten(2))
        for mode in m.modes:
            out[f"{mode}.output"] = max_rel_err(m(x, mode=mode)[0], y_ref)
            out[f"{mode}.pieces.output"] = max_rel_err(run_in_pieces(m, x, mode, LINEAR_ATTN_CHUNK_PIECES)[0], y_ref)
    return out


# ---------------------------------------------------------------- RetNet
@register_crosscheck(
    "retnet",
    "fla naive_retention head-first + simple_gla states",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=GLA_OPS,
    op_states=True,
    per_mode=SEGMENT_QUANTITIES,
)
def retnet_vs_fla() -> dict[str, float]:
    """Outputs against fla's naive_retention (which has no state and builds the decays from the head
    index), final states and state-carrying segments against naive_recurrent_simple_gla with
    g = log gamma_h; the two references are also compared with each other (``ref.*``)."""
    sgla = fla_naive("simple_gla")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        q, k, v = _op_qkv()
        o_ref = _naive_retention(q, k, v)
        g = _retention_log_decay(OP_H).expand(OP_B, OP_T, OP_H)
        o_sgla, s_ref = sgla.naive_recurrent_simple_gla(q, k, v, g, scale=OP_K**-0.5, output_final_state=True)
        out = {"op ref.simple_gla_vs_naive_retention.output": max_rel_err(o_sgla, o_ref)}
        out.update(gla_ops_against(q, k, v, g, OP_K**-0.5, None, o_ref, s_ref, OP_CHUNK))

        def fla_run(f, s0):
            h, hd = f["q"].shape[2], f["q"].shape[-1]
            g = _retention_log_decay(h).expand(*f["q"].shape[:3])
            o, s = sgla.naive_recurrent_simple_gla(
                f["q"], f["k"], f["v"], g, scale=hd**-0.5, initial_state=s0, output_final_state=True
            )
            # naive_retention has no state: on the first segment it is the output reference as well
            extra = (
                {}
                if s0 is not None
                else {
                    "ref.simple_gla_vs_naive_retention.output": max_rel_err(o, _naive_retention(f["q"], f["k"], f["v"]))
                }
            )
            return o, s, extra

        out.update(_mixer_against("retnet", fla_run))
    return out


# ---------------------------------------------------------------- GLA
@register_crosscheck(
    "gla",
    "fla naive_recurrent_gla",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=GLA_OPS,
    op_states=True,
    per_mode=SEGMENT_QUANTITIES,
)
def gla_vs_fla() -> dict[str, float]:
    """The ops (per-key decays spread over (0, 1), initial state s0) and the mixer in every mode
    against fla's naive_recurrent_gla (fixed K^-1/2 scale)."""
    ref = fla_naive("gla")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        q, k, v = _op_qkv()
        gk = F.logsigmoid(torch.randn(OP_B, OP_T, OP_H, OP_K) * 3)
        s0 = torch.randn(OP_B, OP_H, OP_K, OP_V)
        o_ref, s_ref = ref.naive_recurrent_gla(q, k, v, gk, initial_state=s0, output_final_state=True)
        out = gla_ops_against(q, k, v, gk, OP_K**-0.5, s0, o_ref, s_ref, OP_CHUNK)

        def fla_run(f, s0):
            o, s = ref.naive_recurrent_gla(f["q"], f["k"], f["v"], f["gk"], initial_state=s0, output_final_state=True)
            return o, s, {}

        out.update(_mixer_against("gla", fla_run))
    return out


# ---------------------------------------------------------------- MesaNet
MESA_OPS = (
    "chunked+cholesky+chunked_gla",
    "chunked+lu+chunked_gla",
    "dense+lu+chunked_gla",
    "recurrent+lu+chunked_gla",
)


@register_crosscheck(
    "mesa_net",
    "fla naive_mesa_net_exact",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=MESA_OPS,
    op_states=True,
    per_mode=(".output", ".continued.output", ".state_kk", ".state_kv"),
)
def mesa_net_vs_fla() -> dict[str, float]:
    """The ops (every H_t chunked / dense / token loop, the Cholesky and LU solves, chunked_gla with
    q*; initial h_kk, h_kv) and the mixer in every mode against fla's naive_mesa_net_exact (V = K)."""
    ref = fla_naive("mesa_net")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        b, t, h, dk = OP_B, OP_T, OP_H, OP_K
        q, k = F.normalize(torch.randn(b, t, h, dk), dim=-1), F.normalize(torch.randn(b, t, h, dk), dim=-1)
        v = torch.randn(b, t, h, dk)
        beta, g = torch.sigmoid(torch.randn(b, t, h)), F.logsigmoid(torch.randn(b, t, h) + 2)
        lam = 0.25 + torch.rand(h, dk)
        kk0 = torch.randn(b, h, dk, 4)
        kk0 = kk0 @ kk0.transpose(-1, -2) / 4  # an SPD covariance
        kv0 = torch.randn(b, h, dk, dk)
        o_ref, kk_ref, kv_ref = ref.naive_mesa_net_exact(q, k, v, g, lam, beta, h_kk_init=kk0, h_kv_init=kv0)
        out = {}
        for cov_name, cov_fn in (
            ("chunked", lambda *a: chunked_key_covariance(*a, chunk_size=OP_CHUNK)),
            ("dense", dense_key_covariance),
            ("recurrent", recurrent_key_covariance),
        ):
            every, last = cov_fn(k, beta, g, kk0)
            out[f"op.{cov_name}_key_covariance.state_kk"] = max_rel_err(last, kk_ref)
            for solve_name, solve in (("cholesky", mesa_solve), ("lu", mesa_solve_reference)):
                if cov_name != "chunked" and solve_name == "cholesky":
                    continue
                q_star = solve(every, lam, q)
                o, s = chunked_gla(q_star, k * beta[..., None], v, g, 1.0, kv0, OP_CHUNK)
                out[f"op.{cov_name}+{solve_name}+chunked_gla.output"] = max_rel_err(o, o_ref)
                out[f"op.{cov_name}+{solve_name}+chunked_gla.state_kv"] = max_rel_err(s, kv_ref)

        m = segment_mixer("mesa_net")
        nh, hd = m.n_heads, m.head_dim
        xs = [torch.randn(2, t, MIXER_D) for t in MIXER_SEGMENTS]

        def reference(x, s):
            bb, tt, _ = x.shape
            wq, wk, wv = m.qkv.weight.view(3, nh * hd, MIXER_D)
            unit = lambda z: z / z.norm(dim=-1, keepdim=True)  # noqa: E731  L2 normalisation
            qq, kk = unit((x @ wq.T).view(bb, tt, nh, hd)), unit((x @ wk.T).view(bb, tt, nh, hd))
            vv = (x @ wv.T).view(bb, tt, nh, hd)
            bt = torch.sigmoid(x @ m.beta_proj.weight.T)
            gt = F.logsigmoid(x @ m.decay_proj.weight.T + m.decay_proj.bias)
            lamb = F.softplus(m.lambda_param) + m.config.lambda_lower_bound
            kk0, kv0 = (None, None) if s is None else s
            o, kk_t, kv_t = ref.naive_mesa_net_exact(qq, kk, vv, gt, lamb, bt, h_kk_init=kk0, h_kv_init=kv0)
            return (
                m.out(o.flatten(2)),
                (kk_t, kv_t),
                {"state_kk": (lambda st: st.covariance, kk_t), "state_kv": (lambda st: st.memory, kv_t)},
                {},
            )

        out.update(modes_over_segments(m, xs, reference))
    return out
