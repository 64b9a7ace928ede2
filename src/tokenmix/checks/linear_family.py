"""Cross-checks of linear attention, RetNet, GLA, Mamba-2 and the diagonal SSM against fla-core's naive references.

fla's ``naive.py`` files (fla-core 0.6.0, pure PyTorch) compute in float32, so these checks are
float32. Metric, stated in each label: max relative error max|ours - ref| / max|ref|, at 1e-5.

Mappings (references.md): linear attention = naive_recurrent_linear_attn (and fla's chunk form
naive_chunk_linear_attn, chunk 64, no state); RetNet = naive_retention (head-first [B, H, T, D],
decays 1 - 2^(-5-h) computed inside fla, no state) and, for states, naive_recurrent_simple_gla with
g = log gamma_h; GLA = naive_recurrent_gla (fixed K^-1/2 scale); Mamba-2 =
naive_recurrent_simple_gla / naive_chunk_simple_gla (q=C, k=B, v=x·dt, g=log a, scale=1.0); the
diagonal SSM = naive_recurrent_gla with one head per channel, q = C·sqrt(N) (undoes the fixed
scale), k = B, v = Delta·u, gk = Delta·A. fla's states are [B, H, K, V], the layout of ours.

Two levels in each check: the ops (ops/chunked_gla.py at chunk size 16 with T = 50, and
ops/recurrent_gla.py; shared random q, k, v, g and an initial state; outputs and final states,
keys ``op.<impl>...``) and the registered mixer (fla-convention features recomputed here from the
mixer's parameters by the papers' formulas, passed through the mixer's own output projection; every
mode, on two segments so that the state carried between calls is checked too: keys
``<mode>.output`` for the first segment, ``<mode>.continued.output`` for the second, and
``<mode>.state`` for the final state). Our own float64 mode equivalences are
``checks.equivalence.mode_errors``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.checks import fla_naive, register_crosscheck
from tokenmix.checks.attention_family import max_rel_err, run_in_pieces
from tokenmix.mixers.registry import build_mixer
from tokenmix.mixers.base import Mixer
from tokenmix.ops.chunked_gla import chunked_gla
from tokenmix.ops.recurrent_gla import recurrent_gla

FLOAT32_REL_TOL = 1e-5
OP_B, OP_T, OP_H, OP_K, OP_V, OP_CHUNK = 2, 50, 3, 8, 6, 16  # T = 50: chunks of 16 do not divide it
MIXER_D, MIXER_HEADS, MIXER_CHUNK, MIXER_STATE_DIM = 24, 3, 8, 4
MIXER_SEGMENTS = (21, 13)  # two calls, the second starting from the first's final state


# ---------------------------------------------------------------- helpers
def _ops_against(q, k, v, g, scale, s0, o_ref: Tensor, s_ref: Tensor | None, prefix: str = "op."
                 ) -> dict[str, float]:
    """Both of our op implementations (chunked at OP_CHUNK, recurrent) against o_ref and, when given, s_ref."""
    runs = {f"chunked_gla(C={OP_CHUNK})": chunked_gla(q, k, v, g, scale, s0, OP_CHUNK),
            "recurrent_gla": recurrent_gla(q, k, v, g, scale, s0)}
    out = {}
    for impl, (o, s) in runs.items():
        out[f"{prefix}{impl}.output"] = max_rel_err(o, o_ref)
        if s_ref is not None:
            out[f"{prefix}{impl}.state"] = max_rel_err(s, s_ref)
    return out


def _op_qkv(k_dim: int = OP_K, v_dim: int = OP_V, h: int = OP_H, t: int = OP_T):
    return torch.randn(OP_B, t, h, k_dim), torch.randn(OP_B, t, h, k_dim), torch.randn(OP_B, t, h, v_dim)


def _retention_log_decay(h: int) -> Tensor:
    """log gamma_h = log(1 - 2^(-5-h)), RetNet's fixed per-head decays [H]."""
    return torch.log1p(-2.0 ** (-5.0 - torch.arange(h, dtype=torch.float32)))


def _naive_retention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """fla's naive_retention on [B, T, H, D] inputs (it is head-first); returns [B, T, H, D]."""
    return fla_naive("retention").naive_retention(*(z.transpose(1, 2) for z in (q, k, v))).transpose(1, 2)


def _small_mixer(name: str) -> Mixer:
    torch.manual_seed(0)
    extra = {"state_dim": MIXER_STATE_DIM} if name in ("mamba2", "diag_ssm") else {}
    return build_mixer(name, MIXER_D, n_heads=MIXER_HEADS, chunk_size=MIXER_CHUNK, **extra)


def reference_features(name: str, m: Mixer, x: Tensor) -> dict:
    """fla-convention inputs recomputed from the mixer's parameters by the papers' formulas.

    Returns a dict with q, k, v (and gk or g) in fla's [B, T, H, ...] layout, and, for the SSMs,
    ``skip`` (the D-term added to the per-head output before the output projection).
    """
    b, t, _ = x.shape
    if name in ("linear_attention", "retnet", "gla"):
        h, hd = m.n_heads, m.head_dim
        q, k, v = m.qkv(x).view(b, t, 3, h, hd).unbind(2)
        if name in ("linear_attention", "retnet"):
            return dict(q=q, k=k, v=v)
        gk = F.logsigmoid(m.gate_up(m.gate_down(x))).view(b, t, h, hd) / 16.0  # fla's gate normaliser
        return dict(q=q, k=k, v=v, gk=gk)
    if name == "mamba2":
        h, p, n = m.n_heads, m.head_dim, m.config.state_dim
        xs, bs, cs, dt = m.in_proj(x).split([h * p, n, n, h], -1)
        dt = F.softplus(dt + m.dt_bias)
        log_a = -dt * m.A_log.exp()                                  # a_t = exp(-softplus(dt) exp(A_log))
        xs = xs.view(b, t, h, p)
        return dict(q=cs[:, :, None].expand(b, t, h, n), k=bs[:, :, None].expand(b, t, h, n),
                    v=xs * dt[..., None], g=log_a, skip=m.D[:, None] * xs)
    if name == "diag_ssm":
        d, n = m.n_heads * m.head_dim, m.config.state_dim
        u = m.in_proj(x)
        delta = F.softplus(m.dt_proj(x) + m.dt_bias)
        bs, cs = m.bc_proj(x).chunk(2, -1)
        a = -m.A_log.exp()
        return dict(q=cs[:, :, None].expand(b, t, d, n) * math.sqrt(n), k=bs[:, :, None].expand(b, t, d, n),
                    v=(delta * u)[..., None], gk=delta[..., None] * a, skip=(m.D * u)[..., None])
    raise InputError(f"no fla reference features for {name!r}")


def _mixer_against(name: str, fla_run, segments=MIXER_SEGMENTS) -> dict[str, float]:
    """Every mode of the mixer, over consecutive segments with the state passed along, against
    ``fla_run(features, s0) -> (o [B, T, H, V], final state [B, H, K, V], {extra quantity: error})``."""
    m = _small_mixer(name)
    xs = [torch.randn(2, t, MIXER_D) for t in segments]
    out, refs, s = {}, [], None
    for i, x in enumerate(xs):
        f = reference_features(name, m, x)
        o, s, extra = fla_run(f, s)
        out.update({f"segment{i + 1} {q}": e for q, e in extra.items()})
        refs.append(m.out((o + f.get("skip", 0)).flatten(2)))
    for mode in m.modes:
        state = None
        for i, (x, ref) in enumerate(zip(xs, refs)):
            y, state = m(x, state, mode=mode)
            out[f"{mode}.output" if i == 0 else f"{mode}.continued{'' if i == 1 else i}.output"] = max_rel_err(y, ref)
        out[f"{mode}.state"] = max_rel_err(state.memory, s)
    return out


# ---------------------------------------------------------------- linear attention
@register_crosscheck("linear_attention", "fla naive_recurrent_linear_attn (float32 max rel)", FLOAT32_REL_TOL)
def linear_attention_vs_fla_recurrent() -> dict[str, float]:
    """The ops (initial state s0) and the mixer in every mode against fla's naive_recurrent_linear_attn."""
    ref = fla_naive("linear_attn")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        q, k, v = _op_qkv()
        s0 = torch.randn(OP_B, OP_H, OP_K, OP_V)
        scale = OP_K ** -0.5
        o_ref, s_ref = ref.naive_recurrent_linear_attn(q, k, v, scale, s0, output_final_state=True)
        out = _ops_against(q, k, v, None, scale, s0, o_ref, s_ref)

        def fla_run(f, s0):
            o, s = ref.naive_recurrent_linear_attn(f["q"], f["k"], f["v"], f["q"].shape[-1] ** -0.5, s0,
                                                   output_final_state=True)
            return o, s, {}

        out.update(_mixer_against("linear_attention", fla_run))
    return out


LINEAR_ATTN_CHUNK_T, LINEAR_ATTN_CHUNK_PIECES = 128, (5, 1, 70, 52)  # fla's chunk form needs T % 64 == 0


@register_crosscheck("linear_attention", "fla naive_chunk_linear_attn C=64 (float32 max rel)", FLOAT32_REL_TOL)
def linear_attention_vs_fla_chunk() -> dict[str, float]:
    """The ops and the mixer in every mode (whole and in uneven pieces) against fla's own chunk form
    (chunk 64, T = 128, no state, so outputs only)."""
    ref = fla_naive("linear_attn")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        q, k, v = _op_qkv(t=LINEAR_ATTN_CHUNK_T)
        scale = OP_K ** -0.5
        out = _ops_against(q, k, v, None, scale, None, ref.naive_chunk_linear_attn(q, k, v, scale), None)
        m = _small_mixer("linear_attention")
        x = torch.randn(2, LINEAR_ATTN_CHUNK_T, MIXER_D)
        f = reference_features("linear_attention", m, x)
        y_ref = m.out(ref.naive_chunk_linear_attn(f["q"], f["k"], f["v"], f["q"].shape[-1] ** -0.5).flatten(2))
        for mode in m.modes:
            out[f"{mode}.output"] = max_rel_err(m(x, mode=mode)[0], y_ref)
            out[f"{mode}.pieces.output"] = max_rel_err(run_in_pieces(m, x, mode, LINEAR_ATTN_CHUNK_PIECES)[0], y_ref)
    return out


# ---------------------------------------------------------------- RetNet
@register_crosscheck("retnet", "fla naive_retention head-first + simple_gla states (float32 max rel)", FLOAT32_REL_TOL)
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
        o_sgla, s_ref = sgla.naive_recurrent_simple_gla(q, k, v, g, scale=OP_K ** -0.5, output_final_state=True)
        out = {"op ref.simple_gla_vs_naive_retention.output": max_rel_err(o_sgla, o_ref)}
        out.update(_ops_against(q, k, v, g, OP_K ** -0.5, None, o_ref, s_ref))

        def fla_run(f, s0):
            h, hd = f["q"].shape[2], f["q"].shape[-1]
            g = _retention_log_decay(h).expand(*f["q"].shape[:3])
            o, s = sgla.naive_recurrent_simple_gla(f["q"], f["k"], f["v"], g, scale=hd ** -0.5, initial_state=s0,
                                                   output_final_state=True)
            # naive_retention has no state: on the first segment it is the output reference as well
            extra = {} if s0 is not None else {
                "ref.simple_gla_vs_naive_retention.output": max_rel_err(o, _naive_retention(f["q"], f["k"], f["v"]))}
            return o, s, extra

        out.update(_mixer_against("retnet", fla_run))
    return out


# ---------------------------------------------------------------- GLA
@register_crosscheck("gla", "fla naive_recurrent_gla (float32 max rel)", FLOAT32_REL_TOL)
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
        out = _ops_against(q, k, v, gk, OP_K ** -0.5, s0, o_ref, s_ref)

        def fla_run(f, s0):
            o, s = ref.naive_recurrent_gla(f["q"], f["k"], f["v"], f["gk"], initial_state=s0, output_final_state=True)
            return o, s, {}

        out.update(_mixer_against("gla", fla_run))
    return out


# ---------------------------------------------------------------- Mamba-2
def _mamba2_vs(reference: str) -> dict[str, float]:
    """The ops (q = C, k = B, v = X, per-head log decays at three scales, initial state s0) and the
    Mamba-2 mixer in every mode against fla's ``naive_<reference>_simple_gla`` (scale 1.0)."""
    sgla = fla_naive("simple_gla")

    def fla_ref(q, k, v, g, s0):
        if reference == "recurrent":
            return sgla.naive_recurrent_simple_gla(q, k, v, g, scale=1.0, initial_state=s0, output_final_state=True)
        return sgla.naive_chunk_simple_gla(q, k, v, g, initial_state=s0, output_final_state=True, chunk_size=16,
                                           scale=1.0)

    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        c, b_in, x = _op_qkv()  # N = OP_K states, P = OP_V channels per head
        g = -F.softplus(torch.randn(OP_B, OP_T, OP_H)) * torch.tensor([0.5, 2.0, 8.0])  # log a per head
        s0 = torch.randn(OP_B, OP_H, OP_K, OP_V)
        o_ref, s_ref = fla_ref(c, b_in, x, g, s0)
        out = _ops_against(c, b_in, x, g, 1.0, s0, o_ref, s_ref)
        out.update(_mixer_against("mamba2", lambda f, s0: (*fla_ref(f["q"], f["k"], f["v"], f["g"], s0), {})))
    return out


@register_crosscheck("mamba2", "fla naive_recurrent_simple_gla (float32 max rel)", FLOAT32_REL_TOL)
def mamba2_vs_fla_recurrent() -> dict[str, float]:
    return _mamba2_vs("recurrent")


@register_crosscheck("mamba2", "fla naive_chunk_simple_gla C=16 (float32 max rel)", FLOAT32_REL_TOL)
def mamba2_vs_fla_chunk() -> dict[str, float]:
    return _mamba2_vs("chunk")


# ---------------------------------------------------------------- diagonal SSM
@register_crosscheck("diag_ssm", "fla naive_recurrent_gla one head per channel (float32 max rel)", FLOAT32_REL_TOL)
def diag_ssm_vs_fla() -> dict[str, float]:
    """The ops (D = 5 channels as heads, N = 4 states, K = N, V = 1, initial state s0) and the mixer
    in every mode against fla's naive_recurrent_gla with q = C·sqrt(N) (undoing its fixed scale)."""
    ref = fla_naive("gla")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        b, t, d, n = OP_B, OP_T, 5, 4                       # channels, states per channel
        u, delta = torch.randn(b, t, d), F.softplus(torch.randn(b, t, d))
        a = -torch.rand(d, n) * 4                           # A = -exp(A_log) < 0
        b_in, c = torch.randn(b, t, n), torch.randn(b, t, n)
        gk = delta[..., None] * a                           # [B, T, D, N]
        expand = lambda z: z[:, :, None, :].expand(b, t, d, n)  # noqa: E731  shared by all channels
        s0 = torch.randn(b, d, n, 1)
        o_ref, s_ref = ref.naive_recurrent_gla(expand(c) * math.sqrt(n), expand(b_in), (delta * u)[..., None], gk,
                                               initial_state=s0, output_final_state=True)
        out = _ops_against(expand(c), expand(b_in), (delta * u)[..., None], gk, 1.0, s0, o_ref, s_ref)

        def fla_run(f, s0):
            o, s = ref.naive_recurrent_gla(f["q"], f["k"], f["v"], f["gk"], initial_state=s0, output_final_state=True)
            return o, s, {}

        out.update(_mixer_against("diag_ssm", fla_run))
    return out
