"""Independent cross-checks of the first-order linear-attention family against fla-core's naive references.

fla's ``naive.py`` files (fla-core 0.6.0, pure PyTorch) are loaded by file path, since ``fla.ops`` needs
Triton. They compute in float32, so comparisons are float32 at a relative tolerance of 1e-5 (max abs
error over max abs reference); our float64 equivalences live in test_mixer_matrix.py.

Mappings (references.md): linear attention = naive_recurrent_linear_attn; RetNet = naive_retention
(head-first [B, H, T, D], decays 1 - 2^(-5-h) computed inside fla, no state) and, for states,
naive_recurrent_simple_gla with g = log gamma_h; GLA = naive_recurrent_gla (fixed K^-1/2 scale);
Mamba-2 = naive_recurrent_simple_gla(q=C, k=B, v=x·dt, g=log a, scale=1.0); the diagonal SSM =
naive_recurrent_gla with one head per channel, q = C·sqrt(N) (undoes the fixed scale), k = B,
v = Delta·u, gk = Delta·A. fla's states are [B, H, K, V], the layout of ours.

Two levels: the ops (shared random q, k, v, g, initial state; outputs and final states) and the
mixers (features recomputed here from each mixer's parameters by the papers' formulas, every mode,
two segments so that the state carried between calls is checked too).

Also: 16k-token float32 stability of every mixer's chunked mode with extreme gates.
"""
from __future__ import annotations

import importlib.util
import math
import os
import sys

import fla  # fla-core, a dev dependency: the independent references
import pytest
import torch
import torch.nn.functional as F

from tokenmix.core.registry import build_mixer
from tokenmix.ops.chunked_gla import chunked_gla
from tokenmix.ops.recurrent_gla import recurrent_gla

REL_TOL = 1e-5
NAMES = ["linear_attention", "retnet", "gla", "mamba2", "diag_ssm"]


def fla_naive(name: str):
    """Load ``fla/ops/<name>/naive.py`` by path (``fla.ops`` imports Triton)."""
    path = os.path.join(os.path.dirname(fla.__file__), "ops", name, "naive.py")
    modname = "fla_naive_" + name.replace("/", "_")
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    return mod


LINEAR_ATTN, RETENTION, GLA, SIMPLE_GLA = (fla_naive(n) for n in ("linear_attn", "retention", "gla", "simple_gla"))


def rel_err(actual: torch.Tensor, ref: torch.Tensor) -> float:
    assert actual.shape == ref.shape, f"shape {tuple(actual.shape)} != {tuple(ref.shape)}"
    return ((actual - ref).abs().max() / ref.abs().max()).item()


def _ours(q, k, v, g, scale, s0, chunk=16):
    """Both of our op implementations: {name: (o, final state)}."""
    return {"chunked_gla": chunked_gla(q, k, v, g, scale, s0, chunk),
            "recurrent_gla": recurrent_gla(q, k, v, g, scale, s0)}


def _assert_matches(ours: dict, o_ref, s_ref, what: str) -> None:
    for impl, (o, s) in ours.items():
        errs = {"o": rel_err(o, o_ref)}
        if s_ref is not None:
            errs["state"] = rel_err(s, s_ref)
        assert all(e <= REL_TOL for e in errs.values()), f"{what}, {impl}: relative errors {errs}"


# ---------------------------------------------------------------- ops, shared random inputs

B, T, H, K, V = 2, 50, 3, 8, 6  # T = 50: chunks of 16 do not divide it


def _qkv(k_dim=K, v_dim=V, h=H):
    return torch.randn(B, T, h, k_dim), torch.randn(B, T, h, k_dim), torch.randn(B, T, h, v_dim)


def test_linear_attention_op_matches_fla():
    torch.manual_seed(0)
    q, k, v = _qkv()
    s0 = torch.randn(B, H, K, V)
    o_ref, s_ref = LINEAR_ATTN.naive_recurrent_linear_attn(q, k, v, K ** -0.5, s0, output_final_state=True)
    _assert_matches(_ours(q, k, v, None, K ** -0.5, s0), o_ref, s_ref, "linear attention")
    # fla's own chunk form (chunk 64, T % 64 == 0, no state)
    q2, k2, v2 = (torch.randn(B, 128, H, d) for d in (K, K, V))
    o_chunk = LINEAR_ATTN.naive_chunk_linear_attn(q2, k2, v2, K ** -0.5)
    _assert_matches(_ours(q2, k2, v2, None, K ** -0.5, None), o_chunk, None, "linear attention (fla chunk)")


def test_retention_op_matches_fla():
    torch.manual_seed(0)
    q, k, v = _qkv()
    o_ref = RETENTION.naive_retention(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)  # head-first
    gamma = 1 - 2.0 ** (-5.0 - torch.arange(H, dtype=torch.float32))
    g = gamma.log().expand(B, T, H)
    _, s_ref = SIMPLE_GLA.naive_recurrent_simple_gla(q, k, v, g, scale=K ** -0.5, output_final_state=True)
    _assert_matches(_ours(q, k, v, g, K ** -0.5, None), o_ref, s_ref, "retention")


def test_gla_op_matches_fla():
    torch.manual_seed(0)
    q, k, v = _qkv()
    gk = F.logsigmoid(torch.randn(B, T, H, K) * 3)  # decays spread over (0, 1)
    s0 = torch.randn(B, H, K, V)
    o_ref, s_ref = GLA.naive_recurrent_gla(q, k, v, gk, initial_state=s0, output_final_state=True)
    _assert_matches(_ours(q, k, v, gk, K ** -0.5, s0), o_ref, s_ref, "gla")


def test_mamba2_op_matches_fla_simple_gla():
    torch.manual_seed(0)
    n = K
    c, b_in, x = _qkv(n, V)  # q = C, k = B, v = X
    g = -F.softplus(torch.randn(B, T, H)) * torch.tensor([0.5, 2.0, 8.0])  # log a per head
    s0 = torch.randn(B, H, n, V)
    o_ref, s_ref = SIMPLE_GLA.naive_recurrent_simple_gla(c, b_in, x, g, scale=1.0, initial_state=s0,
                                                         output_final_state=True)
    _assert_matches(_ours(c, b_in, x, g, 1.0, s0), o_ref, s_ref, "mamba2 (simple_gla, recurrent)")
    o_chunk, s_chunk = SIMPLE_GLA.naive_chunk_simple_gla(c, b_in, x, g, initial_state=s0, output_final_state=True,
                                                         chunk_size=16, scale=1.0)
    _assert_matches(_ours(c, b_in, x, g, 1.0, s0), o_chunk, s_chunk, "mamba2 (simple_gla, fla chunk)")


def test_diag_ssm_op_matches_fla_gla_one_head_per_channel():
    torch.manual_seed(0)
    d, n = 5, 4                                        # channels, states per channel
    u, delta = torch.randn(B, T, d), F.softplus(torch.randn(B, T, d))
    a = -torch.rand(d, n) * 4                          # A = -exp(A_log) < 0
    b_in, c = torch.randn(B, T, n), torch.randn(B, T, n)
    gk = delta[..., None] * a                          # [B, T, D, N]
    expand = lambda z: z[:, :, None, :].expand(B, T, d, n)  # noqa: E731  shared by all channels
    s0 = torch.randn(B, d, n, 1)
    o_ref, s_ref = GLA.naive_recurrent_gla(expand(c) * math.sqrt(n), expand(b_in), (delta * u)[..., None], gk,
                                           initial_state=s0, output_final_state=True)
    _assert_matches(_ours(expand(c), expand(b_in), (delta * u)[..., None], gk, 1.0, s0), o_ref, s_ref,
                    "diag ssm (gla, one head per channel)")


# ---------------------------------------------------------------- mixers: formulas restated, every mode

def _reference_features(name: str, m, x: torch.Tensor) -> dict:
    """fla-convention inputs recomputed from the mixer's parameters by the papers' formulas."""
    b, t, _ = x.shape
    if name in ("linear_attention", "retnet", "gla"):
        h, hd = m.n_heads, m.head_dim
        q, k, v = m.qkv(x).view(b, t, 3, h, hd).unbind(2)
        if name == "linear_attention":
            return dict(ref="linear_attn", q=q, k=k, v=v)
        if name == "retnet":
            return dict(ref="retention", q=q, k=k, v=v)
        gk = F.logsigmoid(m.gate_up(m.gate_down(x))).view(b, t, h, hd) / 16.0  # fla's gate normaliser
        return dict(ref="gla", q=q, k=k, v=v, gk=gk)
    if name == "mamba2":
        h, p, n = m.n_heads, m.head_dim, m.config.state_dim
        xs, bs, cs, dt = m.in_proj(x).split([h * p, n, n, h], -1)
        dt = F.softplus(dt + m.dt_bias)
        log_a = -dt * m.A_log.exp()                                  # a_t = exp(-softplus(dt) exp(A_log))
        xs = xs.view(b, t, h, p)
        return dict(ref="simple_gla", q=cs[:, :, None].expand(b, t, h, n), k=bs[:, :, None].expand(b, t, h, n),
                    v=xs * dt[..., None], g=log_a, skip=m.D[:, None] * xs)
    d, n = m.n_heads * m.head_dim, m.config.state_dim
    u = m.in_proj(x)
    delta = F.softplus(m.dt_proj(x) + m.dt_bias)
    bs, cs = m.bc_proj(x).chunk(2, -1)
    a = -m.A_log.exp()
    return dict(ref="gla", q=cs[:, :, None].expand(b, t, d, n) * math.sqrt(n), k=bs[:, :, None].expand(b, t, d, n),
                v=(delta * u)[..., None], gk=delta[..., None] * a, skip=(m.D * u)[..., None])


def _fla_run(f: dict, s0):
    """(o [B, T, H, V], final state [B, H, K, V]) from the fla reference named in f."""
    if f["ref"] == "linear_attn":
        return LINEAR_ATTN.naive_recurrent_linear_attn(f["q"], f["k"], f["v"], f["q"].shape[-1] ** -0.5, s0,
                                                       output_final_state=True)
    if f["ref"] == "retention":
        h, hd = f["q"].shape[2], f["q"].shape[-1]
        g = torch.log1p(-2.0 ** (-5.0 - torch.arange(h, dtype=torch.float32))).expand(*f["q"].shape[:3])
        o, s = SIMPLE_GLA.naive_recurrent_simple_gla(f["q"], f["k"], f["v"], g, scale=hd ** -0.5,
                                                     initial_state=s0, output_final_state=True)
        if s0 is None:  # naive_retention builds its own decays from the head index: check it agrees
            o_ret = RETENTION.naive_retention(*(z.transpose(1, 2) for z in (f["q"], f["k"], f["v"]))).transpose(1, 2)
            assert rel_err(o, o_ret) <= REL_TOL
        return o, s
    if f["ref"] == "gla":
        return GLA.naive_recurrent_gla(f["q"], f["k"], f["v"], f["gk"], initial_state=s0, output_final_state=True)
    return SIMPLE_GLA.naive_recurrent_simple_gla(f["q"], f["k"], f["v"], f["g"], scale=1.0, initial_state=s0,
                                                 output_final_state=True)


@pytest.mark.parametrize("name", NAMES)
def test_mixer_matches_fla_in_every_mode(name):
    torch.manual_seed(0)
    m = build_mixer(name, 24, n_heads=3, chunk_size=8, **({"state_dim": 4} if name in ("mamba2", "diag_ssm") else {}))
    x1, x2 = torch.randn(2, 21, 24), torch.randn(2, 13, 24)
    with torch.no_grad():
        refs, s = [], None
        for x in (x1, x2):  # two segments: the second starts from the first's final state
            f = _reference_features(name, m, x)
            o, s = _fla_run(f, s)
            refs.append(m.out((o + f.get("skip", 0)).flatten(2)))
        for mode in m.modes:
            y1, state = m(x1, mode=mode)
            y2, state = m(x2, state, mode=mode)
            errs = {"segment 1": rel_err(y1, refs[0]), "segment 2": rel_err(y2, refs[1]),
                    "state": rel_err(state.memory, s)}
            assert all(e <= REL_TOL for e in errs.values()), f"{name} {mode} vs fla: relative errors {errs}"


# ---------------------------------------------------------------- stability at 16k tokens, float32

STABLE_T = 16384


def _two_extremes(lo: float, hi: float, shape: tuple[int, ...]) -> torch.Tensor:
    """Each entry is lo or hi at random."""
    return torch.where(torch.rand(shape) < 0.5, torch.full(shape, lo), torch.full(shape, hi))


def _make_gates_extreme(name: str, m) -> None:
    """Decays jumping between ~0 (e^-100 and below) and ~1 (1 - 1e-8), per token and channel."""
    with torch.no_grad():
        if name == "gla":
            m.gate_up.bias.copy_(_two_extremes(-1600.0, 30.0, m.gate_up.bias.shape))  # /16: log decay -100 or ~0
            m.gate_up.weight.mul_(200.0)  # and the input moves the logits across both ends
        elif name in ("mamba2", "diag_ssm"):
            # exp(A_log) alternates 1e4 / 1e-4 over heads (mamba2) or states (diag_ssm), dt_bias 8 / -4 over
            # heads or channels: log decays down to -8e4 (decay 0) and up to -2e-6 (decay ~1)
            def alternate(p, even, odd):
                p.copy_(torch.where(torch.arange(p.numel()).view(p.shape) % 2 == 0, even, odd))
            alternate(m.A_log, math.log(1e4), math.log(1e-4))
            alternate(m.dt_bias, 8.0, -4.0)


@pytest.mark.parametrize("name", NAMES)
def test_chunked_mode_is_stable_at_16k_with_extreme_gates(name):
    torch.manual_seed(0)
    m = build_mixer(name, 16, n_heads=2, **({"state_dim": 8} if name in ("mamba2", "diag_ssm") else {}))
    _make_gates_extreme(name, m)
    x = torch.randn(1, STABLE_T, 16, requires_grad=True)
    y, state = m(x, mode="chunked")
    assert torch.isfinite(y).all() and torch.isfinite(state.memory).all(), f"{name}: non-finite output or state"
    ((y * torch.randn_like(y)).mean() + state.memory.square().mean()).backward()
    assert torch.isfinite(x.grad).all(), f"{name}: non-finite input gradient"
    for pname, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name}: non-finite gradient of {pname}"


@pytest.mark.parametrize("per_key", [False, True], ids=["per_head", "per_key"])
def test_chunked_op_is_exact_at_16k_with_extreme_gates(per_key):
    """The chunked op with decays e^-100 / 1 - 1e-8 equals the token loop at 16k tokens (float32)."""
    torch.manual_seed(0)
    h, dk, dv = 2, 8, 8
    q, k, v = torch.randn(1, STABLE_T, h, dk), torch.randn(1, STABLE_T, h, dk), torch.randn(1, STABLE_T, h, dv)
    g = _two_extremes(-100.0, -1e-8, (1, STABLE_T, h, dk) if per_key else (1, STABLE_T, h))
    o, s = chunked_gla(q, k, v, g, dk ** -0.5, chunk_size=32)
    o_ref, s_ref = recurrent_gla(q, k, v, g, dk ** -0.5)
    assert rel_err(o, o_ref) <= 1e-4 and rel_err(s, s_ref) <= 1e-4, (rel_err(o, o_ref), rel_err(s, s_ref))
