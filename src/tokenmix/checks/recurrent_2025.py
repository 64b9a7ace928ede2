"""Cross-checks of HGRN-2, the RG-LRU and MesaNet against independent references.

* HGRN-2 against fla-core's HGRN-1 reference ``naive_recurrent_hgrn`` (ops/hgrn/naive.py,
  h = exp(g) h + x elementwise): the state expansion makes every entry S[c, v] of a head's [K, V]
  state one HGRN-1 channel with x = (1 - f_c) i_v and g = log f_c, so the K·V·H expanded channels
  run through fla's loop and the readout o_t = K^-1/2 sum_c q_tc S_t[c, :] is applied here. Also
  against ``naive_recurrent_gla`` (ops/gla/naive.py, what fla's HGRN2 layer calls, fixed K^-1/2).
* RG-LRU: no fla reference. A plain loop written from the Griffin paper's equations (§2.4),
  literally: a_t = sigmoid(Lambda) ** (c r_t) by a power, sqrt(1 - a_t ** 2), block-diagonal gates
  head by head, in float64 (the literal 1 - a_t² cancels when a_t is near 1: in float32 it would
  lose ~4 digits, which is why the mixer forms it with expm1).
* MesaNet against fla's ``naive_mesa_net_exact`` (ops/mesa_net/naive.py: h_kk, h_kv updated, then
  torch.linalg.solve(h_kk + diag(lamb), q), no readout scale), with initial h_kk / h_kv.

fla's refs compute in float32, so those checks are float32 at 1e-5; metric, stated in each label:
max relative error max|ours - ref| / max|ref|. Each check has two levels: the ops on random inputs
with an initial state (keys ``op.*``) and the registered mixer (features recomputed here from the
mixer's parameters by the papers' formulas, through the mixer's own output projection; every mode,
on two segments with the state carried: ``<mode>.output``, ``<mode>.continued.output``,
``<mode>.state*``).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.checks import fla_naive, register_crosscheck
from tokenmix.checks.attention_family import max_rel_err
from tokenmix.mixers.registry import build_mixer
from tokenmix.mixers.base import Mixer
from tokenmix.ops.chunked_gla import chunked_gla
from tokenmix.ops.chunked_mesa import (chunked_key_covariance, dense_key_covariance, mesa_solve,
                                       mesa_solve_reference, recurrent_key_covariance)
from tokenmix.ops.recurrent_gla import recurrent_gla

FLOAT32_REL_TOL = 1e-5
FLOAT64_LOOP_TOL = 1e-10          # RG-LRU against its paper loop, float64
OP_B, OP_T, OP_H, OP_K, OP_V, OP_CHUNK = 2, 50, 3, 8, 6, 16  # T = 50: chunks of 16 do not divide it
MIXER_D, MIXER_HEADS, MIXER_CHUNK = 24, 3, 8
MIXER_SEGMENTS = (21, 13)         # two calls, the second starting from the first's final state


def _small(name: str, dtype=torch.float32) -> Mixer:
    torch.manual_seed(0)
    return build_mixer(name, MIXER_D, n_heads=MIXER_HEADS, chunk_size=MIXER_CHUNK).to(dtype)


def _modes_against(m: Mixer, reference, dtype=torch.float32) -> dict[str, float]:
    """Every mode of m over MIXER_SEGMENTS (state passed along) against ``reference(x, ref_state) ->
    (y [B, T, D], ref_state, {state name: (ours(state) -> Tensor, ref tensor)})``."""
    xs = [torch.randn(2, t, MIXER_D, dtype=dtype) for t in MIXER_SEGMENTS]
    refs, rs, finals = [], None, {}
    for x in xs:
        y, rs, finals = reference(x, rs)
        refs.append(y)
    out = {}
    for mode in m.modes:
        state = None
        for i, (x, ref) in enumerate(zip(xs, refs)):
            y, state = m(x, state, mode=mode)
            out[f"{mode}.output" if i == 0 else f"{mode}.continued.output"] = max_rel_err(y, ref)
        for key, (ours, ref) in finals.items():
            out[f"{mode}.{key}"] = max_rel_err(ours(state), ref)
    return out


# ---------------------------------------------------------------- HGRN-2
def _hgrn_expanded(q: Tensor, k: Tensor, v: Tensor, log_f: Tensor, s0: Tensor | None) -> tuple[Tensor, Tensor]:
    """HGRN-2 through fla's HGRN-1 loop on the K·V expanded channels of every head.

    q, k, log_f [B, T, H, K]; v [B, T, H, V]; s0 [B, H, K, V] or None -> (o [B, T, H, V], S_T [B, H, K, V]).
    """
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    hgrn = fla_naive("hgrn")
    x = (k[..., :, None] * v[..., None, :]).reshape(b, t, h * dk * dv)               # (1 - f_c) i_v
    g = log_f[..., None].expand(b, t, h, dk, dv).reshape(b, t, h * dk * dv)        # log f_c, shared along v
    init = None if s0 is None else s0.reshape(b, h * dk * dv)
    states, final = hgrn.naive_recurrent_hgrn(x, g, initial_state=init, output_final_state=True)
    states = states.view(b, t, h, dk, dv)
    o = torch.einsum("bthk,bthkv->bthv", q, states) / math.sqrt(dk)
    return o, final.view(b, h, dk, dv)


@register_crosscheck("hgrn2", "fla naive_recurrent_hgrn on the expanded channels + naive_recurrent_gla (float32 max rel)",
                     FLOAT32_REL_TOL)
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
        out = {"op ref.naive_recurrent_gla_vs_hgrn.output": max_rel_err(o_gla, o_ref),
               "op ref.naive_recurrent_gla_vs_hgrn.state": max_rel_err(s_gla, s_ref)}
        scale = OP_K ** -0.5
        for impl, (o, s) in {f"chunked_gla(C={OP_CHUNK})": chunked_gla(q, k, v, log_f, scale, s0, OP_CHUNK),
                             "recurrent_gla": recurrent_gla(q, k, v, log_f, scale, s0)}.items():
            out[f"op.{impl}.output"], out[f"op.{impl}.state"] = max_rel_err(o, o_ref), max_rel_err(s, s_ref)

        m = _small("hgrn2")
        h, hd = m.n_heads, m.head_dim

        def reference(x, s):
            b, t, _ = x.shape
            wq, wf, wi = m.qfi.weight.view(3, h * hd, MIXER_D)                     # the paper's three maps
            q = F.silu(x @ wq.T).view(b, t, h, hd)
            f = torch.sigmoid(x @ wf.T).view(b, t, h, hd)                          # forget gate (lower bound 0)
            o, s = _hgrn_expanded(q, 1 - f, (x @ wi.T).view(b, t, h, hd), f.log(), s)
            return m.out(o.flatten(2)), s, {"state": (lambda st: st.memory, s)}

        out.update(_modes_against(m, reference))
    return out


# ---------------------------------------------------------------- RG-LRU
def rg_lru_paper_loop(m: Mixer, x: Tensor, h0: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Griffin §2.4 token by token, from the mixer's parameters: x [B, T, D] -> (y [B, T, D], h_T [B, D_in])."""
    b, t, _ = x.shape
    n_heads, hd, c = m.n_heads, m.head_dim, m.config.c
    u = x @ m.in_proj.weight.T                                                     # the RG-LRU input x_t
    w_a, w_x = m.gate_weight[..., :hd], m.gate_weight[..., hd:]                    # blocks [H, hd, hd]
    a = 1.0 / (1.0 + torch.exp(-m.Lambda))                                         # a = sigmoid(Lambda)
    h = u.new_zeros(b, n_heads * hd) if h0 is None else h0
    ys = []
    for s in range(t):
        u_t = u[:, s]
        blocks = [u_t[:, j * hd:(j + 1) * hd] for j in range(n_heads)]
        r = torch.sigmoid(torch.cat([blk @ w_a[j] for j, blk in enumerate(blocks)], -1) + m.gate_bias[0])
        i = torch.sigmoid(torch.cat([blk @ w_x[j] for j, blk in enumerate(blocks)], -1) + m.gate_bias[1])
        a_t = a ** (c * r)
        h = a_t * h + torch.sqrt(1 - a_t ** 2) * (i * u_t)
        ys.append(h @ m.out.weight.T)
    return torch.stack(ys, 1), h


@register_crosscheck("rg_lru", "plain loop of the Griffin paper's equations (float64 max rel)", FLOAT64_LOOP_TOL)
def rg_lru_vs_paper_loop() -> dict[str, float]:
    """The mixer in every mode (two segments, state carried) against ``rg_lru_paper_loop``; also the
    initialisation: a^c = sigmoid(Lambda)^c within [a_min, a_max] (key ``init.a^c outside``, 0 or 1)."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        m = _small("rg_lru", torch.float64)
        ac = torch.sigmoid(m.Lambda) ** m.config.c
        outside = float(bool(((ac < m.config.a_min - 1e-9) | (ac > m.config.a_max + 1e-9)).any()))

        def reference(x, s):
            y, h = rg_lru_paper_loop(m, x, s)
            return y, h, {"state": (lambda st: st.memory[..., 0, 0], h)}

        out = {"init.a^c outside [a_min, a_max]": outside}
        out.update(_modes_against(m, reference, torch.float64))
    return out


# ---------------------------------------------------------------- MesaNet
@register_crosscheck("mesa_net", "fla naive_mesa_net_exact (float32 max rel)", FLOAT32_REL_TOL)
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
        kk0 = kk0 @ kk0.transpose(-1, -2) / 4                                          # an SPD covariance
        kv0 = torch.randn(b, h, dk, dk)
        o_ref, kk_ref, kv_ref = ref.naive_mesa_net_exact(q, k, v, g, lam, beta, h_kk_init=kk0, h_kv_init=kv0)
        out = {}
        for cov_name, cov_fn in (("chunked", lambda *a: chunked_key_covariance(*a, chunk_size=OP_CHUNK)),
                                 ("dense", dense_key_covariance), ("recurrent", recurrent_key_covariance)):
            every, last = cov_fn(k, beta, g, kk0)
            out[f"op.{cov_name}_key_covariance.state_kk"] = max_rel_err(last, kk_ref)
            for solve_name, solve in (("cholesky", mesa_solve), ("lu", mesa_solve_reference)):
                if cov_name != "chunked" and solve_name == "cholesky":
                    continue
                q_star = solve(every, lam, q)
                o, s = chunked_gla(q_star, k * beta[..., None], v, g, 1.0, kv0, OP_CHUNK)
                out[f"op.{cov_name}+{solve_name}+chunked_gla.output"] = max_rel_err(o, o_ref)
                out[f"op.{cov_name}+{solve_name}+chunked_gla.state_kv"] = max_rel_err(s, kv_ref)

        m = _small("mesa_net")
        nh, hd = m.n_heads, m.head_dim

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
            return m.out(o.flatten(2)), (kk_t, kv_t), {"state_kk": (lambda st: st.covariance, kk_t),
                                                       "state_kv": (lambda st: st.memory, kv_t)}

        out.update(_modes_against(m, reference))
    return out
