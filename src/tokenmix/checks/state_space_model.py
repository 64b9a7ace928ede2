"""Cross-checks of the state space models (Mamba-2, the diagonal SSM) against fla-core's naive references.

fla's ``naive.py`` files (fla-core 0.6.0, pure PyTorch) compute in float32, so these checks are
float32. Metric, stated in each label: max relative error max|ours - ref| / max|ref|, at 1e-5.

Mappings: Mamba-2 = naive_recurrent_simple_gla / naive_chunk_simple_gla (q = C, k = B, v = x·dt,
g = log a, scale 1.0); the diagonal SSM = naive_recurrent_gla with one head per channel,
q = C·sqrt(N) (undoes its fixed K^-1/2 scale), k = B, v = Delta·u, gk = Delta·A. fla's states are
[B, H, K, V], the layout of ours.

Two levels in each check: the ops (ops/chunked_gla.py at chunk size 16 with T = 50, and
ops/recurrent_gla.py; shared random inputs and an initial state; outputs and final states, keys
``op.<impl>...``) and the registered mixer (fla-convention features recomputed here from the
mixer's parameters by the papers' formulas, the D skip added, passed through the mixer's own output
projection; every mode, on two segments: ``<mode>.output``, ``<mode>.continued.output``,
``<mode>.state``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.checks import fla_naive, register_crosscheck
from tokenmix.checks.common import (
    GLA_OPS,
    OP_SHAPE,
    SEGMENT_QUANTITIES,
    gla_ops_against,
    modes_over_segments,
    segments_case,
)
from tokenmix.checks.tolerances import FLOAT32_REL_TOL
from tokenmix.core.errors import InputError
from tokenmix.mixers.base import Mixer

OP_B, OP_T, OP_H, OP_K, OP_V, OP_CHUNK = OP_SHAPE
MIXER_STATE_DIM = 4


def reference_features(name: str, m: Mixer, x: Tensor) -> dict:
    """fla-convention q, k, v and g (Mamba-2) or gk (diagonal SSM) in fla's [B, T, H, ...] layout, and
    ``skip`` (the D-term added to the per-head output before the output projection), recomputed
    from the mixer's parameters by the papers' formulas."""
    b, t, _ = x.shape
    if name == "mamba2":
        h, p, n = m.n_heads, m.head_dim, m.config.state_dim
        xs, bs, cs, dt = m.in_proj(x).split([h * p, n, n, h], -1)
        dt = F.softplus(dt + m.dt_bias)
        log_a = -dt * m.A_log.exp()  # a_t = exp(-softplus(dt) exp(A_log))
        xs = xs.view(b, t, h, p)
        return dict(
            q=cs[:, :, None].expand(b, t, h, n),
            k=bs[:, :, None].expand(b, t, h, n),
            v=xs * dt[..., None],
            g=log_a,
            skip=m.D[:, None] * xs,
        )
    if name == "diag_ssm":
        d, n = m.n_heads * m.head_dim, m.config.state_dim
        u = m.in_proj(x)
        delta = F.softplus(m.dt_proj(x) + m.dt_bias)
        bs, cs = m.bc_proj(x).chunk(2, -1)
        a = -m.A_log.exp()
        return dict(
            q=cs[:, :, None].expand(b, t, d, n) * math.sqrt(n),
            k=bs[:, :, None].expand(b, t, d, n),
            v=(delta * u)[..., None],
            gk=delta[..., None] * a,
            skip=(m.D * u)[..., None],
        )
    raise InputError(f"no fla reference features for {name!r}")


def _mixer_against(name: str, fla_run) -> dict[str, float]:
    """Every mode of the mixer, over MIXER_SEGMENTS with the state passed along, against
    ``fla_run(features, s0) -> (o [B, T, H, V], final state [B, H, K, V])``."""
    m, xs = segments_case(name, state_dim=MIXER_STATE_DIM)

    def reference(x, s):
        f = reference_features(name, m, x)
        o, s = fla_run(f, s)
        return m.out((o + f["skip"]).flatten(2)), s, {"state": (lambda st: st.memory, s)}, {}

    return modes_over_segments(m, xs, reference)


# ---------------------------------------------------------------- Mamba-2
def _mamba2_vs(reference: str) -> dict[str, float]:
    """The ops (q = C, k = B, v = X, per-head log decays at three scales, initial state s0) and the
    Mamba-2 mixer in every mode against fla's ``naive_<reference>_simple_gla`` (scale 1.0)."""
    sgla = fla_naive("simple_gla")

    def fla_ref(q, k, v, g, s0):
        if reference == "recurrent":
            return sgla.naive_recurrent_simple_gla(q, k, v, g, scale=1.0, initial_state=s0, output_final_state=True)
        return sgla.naive_chunk_simple_gla(
            q, k, v, g, initial_state=s0, output_final_state=True, chunk_size=16, scale=1.0
        )

    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        c, b_in = torch.randn(OP_B, OP_T, OP_H, OP_K), torch.randn(OP_B, OP_T, OP_H, OP_K)  # N = OP_K states
        x = torch.randn(OP_B, OP_T, OP_H, OP_V)  # P = OP_V channels per head
        g = -F.softplus(torch.randn(OP_B, OP_T, OP_H)) * torch.tensor([0.5, 2.0, 8.0])  # log a per head
        s0 = torch.randn(OP_B, OP_H, OP_K, OP_V)
        o_ref, s_ref = fla_ref(c, b_in, x, g, s0)
        out = gla_ops_against(c, b_in, x, g, 1.0, s0, o_ref, s_ref, OP_CHUNK)
        out.update(_mixer_against("mamba2", lambda f, s0: fla_ref(f["q"], f["k"], f["v"], f["g"], s0)))
    return out


@register_crosscheck(
    "mamba2",
    "fla naive_recurrent_simple_gla",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=GLA_OPS,
    op_states=True,
    per_mode=SEGMENT_QUANTITIES,
)
def mamba2_vs_fla_recurrent() -> dict[str, float]:
    return _mamba2_vs("recurrent")


@register_crosscheck(
    "mamba2",
    "fla naive_chunk_simple_gla C=16",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=GLA_OPS,
    op_states=True,
    per_mode=SEGMENT_QUANTITIES,
)
def mamba2_vs_fla_chunk() -> dict[str, float]:
    return _mamba2_vs("chunk")


# ---------------------------------------------------------------- diagonal SSM
@register_crosscheck(
    "diag_ssm",
    "fla naive_recurrent_gla one head per channel",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=GLA_OPS,
    op_states=True,
    per_mode=SEGMENT_QUANTITIES,
)
def diag_ssm_vs_fla() -> dict[str, float]:
    """The ops (D = 5 channels as heads, N = 4 states, K = N, V = 1, initial state s0) and the mixer
    in every mode against fla's naive_recurrent_gla with q = C·sqrt(N) (undoing its fixed scale)."""
    ref = fla_naive("gla")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        b, t, d, n = OP_B, OP_T, 5, 4  # channels, states per channel
        u, delta = torch.randn(b, t, d), F.softplus(torch.randn(b, t, d))
        a = -torch.rand(d, n) * 4  # A = -exp(A_log) < 0
        b_in, c = torch.randn(b, t, n), torch.randn(b, t, n)
        gk = delta[..., None] * a  # [B, T, D, N]
        expand = lambda z: z[:, :, None, :].expand(b, t, d, n)  # noqa: E731  shared by all channels
        s0 = torch.randn(b, d, n, 1)
        o_ref, s_ref = ref.naive_recurrent_gla(
            expand(c) * math.sqrt(n),
            expand(b_in),
            (delta * u)[..., None],
            gk,
            initial_state=s0,
            output_final_state=True,
        )
        out = gla_ops_against(expand(c), expand(b_in), (delta * u)[..., None], gk, 1.0, s0, o_ref, s_ref, OP_CHUNK)
        out.update(
            _mixer_against(
                "diag_ssm",
                lambda f, s0: ref.naive_recurrent_gla(
                    f["q"], f["k"], f["v"], f["gk"], initial_state=s0, output_final_state=True
                ),
            )
        )
    return out
