"""Cross-checks of the delta-rule family (DeltaNet, Gated DeltaNet, Gated DeltaProduct, KDA, Gated
DeltaNet-2) against fla-core's naive references.

fla's ``naive.py`` files (fla-core 0.6.0, pure PyTorch) compute in float32, so these checks are
float32. Metric, stated in each label: max relative error max|ours - ref| / max|ref|, at 1e-5.
Each check compares the ops (ops/chunked_delta.py, on the sub-step clock for DeltaProduct;
ops/chunked_channel_delta.py for the channel-wise gates) on random inputs with a nonzero initial
state, at chunk sizes that do not divide T, and then the registered mixer itself: every mode, whole
and in uneven pieces with the state passed along, through an identity output projection (so the
mixer's output is the per-head o_t) on the mixer's own projections, with beta < 1 and
(``allow_neg_eigval``) beta < 2.

Layouts handled here: fla's delta_rule is head-first [B, H, T, K]; its
naive_recurrent_gated_delta_rule takes (beta, g) but naive_chunk_gated_delta_rule takes (g, beta);
naive_recurrent_gated_delta_product takes the n_h keys, values and betas of a token consecutively
on a [B, T·n_h, ...] axis, the query and the decay per token, and ``g`` before ``beta``;
naive_chunk_kda needs T % chunk_size == 0; gdn2's refs take (g, b, w) with b the erase and w the
write gate. Our own float64 mode equivalences are ``checks.equivalence.mode_errors``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.checks import fla_naive, register_crosscheck
from tokenmix.checks.common import PIECES, mixer_case, op_errors, outputs_and_states_in_pieces
from tokenmix.checks.tolerances import FLOAT32_REL_TOL
from tokenmix.mixers.base import Mixer
from tokenmix.ops.chunked_channel_delta import chunked_channel_delta_rule, recurrent_channel_delta_rule
from tokenmix.ops.chunked_delta import chunked_delta_rule, recurrent_delta_rule

DELTA_CHUNKS = (16, 64)  # T = 50 is a multiple of neither
FLA_CHUNK = 16
CHUNK_REF_PIECES = (5, 1, 20, 22)  # T = 48: naive_chunk_kda needs T % 16 == 0
PER_MODE = (".output", ".state", ".pieces.output", ".pieces.state")
DELTA_OPS = (*(f"chunked(C={c})" for c in DELTA_CHUNKS), "recurrent")


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


def _mixer_case(name: str, seed: int, **overrides) -> tuple[Mixer, Tensor]:
    """A float32 mixer (3 heads of 8, chunk size 16) with an identity readout and an input x [2, 37, D]."""
    return mixer_case(name, seed, chunk_size=16, **overrides)


# ---------------------------------------------------------------- DeltaNet
@register_crosscheck(
    "deltanet",
    "fla delta_rule_recurrence",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=DELTA_OPS,
    op_states=True,
    per_mode=PER_MODE,
)
def deltanet_vs_fla() -> dict[str, float]:
    """The delta-rule ops (chunked at two chunk sizes, recurrent; initial state s0) and the DeltaNet
    mixer in every mode (beta in (0, 1) and, with allow_neg_eigval, in (0, 2)) against fla."""
    ref = fla_naive("delta_rule")
    out: dict[str, float] = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        q, k, v, beta, _, s0 = _delta_inputs()
        o_ref, s_ref = ref.delta_rule_recurrence(
            _head_first(q),
            _head_first(k),
            _head_first(v),
            _head_first(beta),
            initial_state=s0.clone(),
            output_final_state=True,
        )
        o_ref = _head_first(o_ref)  # back to [B, T, H, V]
        runs = {f"op.chunked(C={c})": chunked_delta_rule(q, k, v, beta, None, None, s0, c) for c in DELTA_CHUNKS}
        runs["op.recurrent"] = recurrent_delta_rule(q, k, v, beta, None, None, s0)
        out.update(op_errors(runs, o_ref, s_ref))
        for neg in (False, True):
            m, x = _mixer_case("deltanet", seed=int(neg), allow_neg_eigval=neg)
            qm, km, vm, bm, _ = m._project(x)
            o_ref, s_ref = ref.delta_rule_recurrence(
                _head_first(qm), _head_first(km), _head_first(vm), _head_first(bm), output_final_state=True
            )
            out.update(
                outputs_and_states_in_pieces(m, x, _head_first(o_ref), s_ref, prefix="beta<2 " if neg else "beta<1 ")
            )
    return out


# ---------------------------------------------------------------- Gated DeltaNet
def _gated_delta_vs(reference: str) -> dict[str, float]:
    """The gated delta-rule ops and the Gated DeltaNet mixer against fla's ``naive_<reference>_gated_delta_rule``."""
    ref = fla_naive("gated_delta_rule")

    def fla_ref(q, k, v, beta, g, scale, s0):
        if reference == "recurrent":  # (beta, g)
            return ref.naive_recurrent_gated_delta_rule(
                q, k, v, beta, g, scale=scale, initial_state=s0, output_final_state=True
            )
        return ref.naive_chunk_gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            chunk_size=16,
            scale=scale,  # (g, beta)
            initial_state=s0,
            output_final_state=True,
        )

    out: dict[str, float] = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        q, k, v, beta, g, s0 = _delta_inputs()
        scale = q.shape[-1] ** -0.5
        o_ref, s_ref = fla_ref(q, k, v, beta, g, scale, s0.clone())
        runs = {f"op.chunked(C={c})": chunked_delta_rule(q, k, v, beta, g, scale, s0, c) for c in DELTA_CHUNKS}
        runs["op.recurrent"] = recurrent_delta_rule(q, k, v, beta, g, scale, s0)
        out.update(op_errors(runs, o_ref, s_ref))
        m, x = _mixer_case("gated_deltanet", seed=2)
        qm, km, vm, bm, gm = m._project(x)
        o_ref, s_ref = fla_ref(qm, km, vm, bm, gm, m.scale, None)
        out.update(outputs_and_states_in_pieces(m, x, o_ref, s_ref))
    return out


@register_crosscheck(
    "gated_deltanet",
    "fla naive_recurrent_gated_delta_rule",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=DELTA_OPS,
    op_states=True,
    per_mode=PER_MODE,
)
def gated_deltanet_vs_fla_recurrent() -> dict[str, float]:
    return _gated_delta_vs("recurrent")


@register_crosscheck(
    "gated_deltanet",
    "fla naive_chunk_gated_delta_rule C=16",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=DELTA_OPS,
    op_states=True,
    per_mode=PER_MODE,
)
def gated_deltanet_vs_fla_chunk() -> dict[str, float]:
    return _gated_delta_vs("chunk")


# ---------------------------------------------------------------- Gated DeltaProduct
@register_crosscheck(
    "gated_delta_product",
    "fla naive_recurrent_gated_delta_product",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=DELTA_OPS,
    op_states=True,
    per_mode=PER_MODE,
)
def gated_delta_product_vs_fla() -> dict[str, float]:
    """The delta-rule ops on the sub-step clock (n_h = 2, 3) and the mixer (n_h = 1, 2, 3; beta < 1 and < 2)
    against fla's naive_recurrent_gated_delta_product."""
    ref = fla_naive("gated_delta_product")
    out: dict[str, float] = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for nh in (2, 3):
            q, k, v, beta, g, s0 = _delta_inputs(t=50 * nh)  # one key, value and beta per sub-step
            q_tok, g_tok = q[:, nh - 1 :: nh].contiguous(), g[:, ::nh].contiguous()
            scale = q.shape[-1] ** -0.5
            o_ref, s_ref = ref.naive_recurrent_gated_delta_product(
                q_tok, k, v, g_tok, beta, scale, initial_state=s0.clone(), output_final_state=True, num_householder=nh
            )
            # our clock: q on the last sub-step (0 elsewhere), g on the first (0 elsewhere)
            q_sub = torch.zeros_like(q)
            q_sub[:, nh - 1 :: nh] = q_tok
            g_sub = torch.zeros_like(g)
            g_sub[:, ::nh] = g_tok
            runs = {
                f"n_h={nh} op.chunked(C={c})": chunked_delta_rule(q_sub, k, v, beta, g_sub, scale, s0, c)
                for c in DELTA_CHUNKS
            }
            runs[f"n_h={nh} op.recurrent"] = recurrent_delta_rule(q_sub, k, v, beta, g_sub, scale, s0)
            out.update(op_errors({w: (o[:, nh - 1 :: nh], s) for w, (o, s) in runs.items()}, o_ref, s_ref))
        for nh in (1, 2, 3):
            for neg in (False, True):
                m, x = _mixer_case("gated_delta_product", seed=10 * nh + neg, n_h=nh, allow_neg_eigval=neg)
                qm, km, vm, bm, gm = m._project(x)
                o_ref, s_ref = ref.naive_recurrent_gated_delta_product(
                    qm[:, nh - 1 :: nh], km, vm, gm[:, ::nh], bm, m.scale, output_final_state=True, num_householder=nh
                )
                out.update(
                    outputs_and_states_in_pieces(
                        m, x, o_ref, s_ref, prefix=f"n_h={nh} {'beta<2' if neg else 'beta<1'} "
                    )
                )
    return out


# ---------------------------------------------------------------- KDA
def _channel_inputs(t: int, seed: int = 0):
    """q, k (L2-normalised) [B, T, H, K], v [B, T, H, V], beta [B, T, H], per-channel g [B, T, H, K],
    erase gate b [B, T, H, K], write gate w [B, T, H, V], s0 [B, H, K, V]; seeded."""
    q, k, v, beta, _, s0 = _delta_inputs(t=t)
    gen = torch.Generator().manual_seed(seed)
    g = F.logsigmoid(2 * torch.randn(*k.shape, generator=gen))
    b, w = torch.rand(*k.shape, generator=gen), torch.rand(*v.shape, generator=gen)
    return q, k, v, beta, g, b, w, s0


def _kda_vs(reference: str) -> dict[str, float]:
    ref = fla_naive("kda")

    def fla_ref(q, k, v, g, beta, scale, s0):
        fn = ref.naive_recurrent_kda if reference == "recurrent" else ref.naive_chunk_kda
        extra = {} if reference == "recurrent" else {"chunk_size": FLA_CHUNK}
        return fn(q, k, v, g, beta, scale=scale, initial_state=s0, output_final_state=True, **extra)

    out: dict[str, float] = {}
    t_op, pieces = (50, PIECES) if reference == "recurrent" else (64, CHUNK_REF_PIECES)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        q, k, v, beta, g, _, _, s0 = _channel_inputs(t_op)
        scale = q.shape[-1] ** -0.5
        o_ref, s_ref = fla_ref(q, k, v, g, beta, scale, s0.clone())
        bv, bk = beta[..., None] * v, beta[..., None] * k
        runs = {f"op.chunked(C={c})": chunked_channel_delta_rule(q, k, bv, bk, g, scale, s0, c) for c in DELTA_CHUNKS}
        runs["op.recurrent"] = recurrent_channel_delta_rule(q, k, bv, bk, g, scale, s0)
        out.update(op_errors(runs, o_ref, s_ref))
        for neg in (False, True):
            m, x = _mixer_case("kda", seed=20 + neg, allow_neg_eigval=neg)
            x = x if reference == "recurrent" else torch.randn(2, sum(pieces), x.shape[-1])
            qm, km, vm, bm, gm = m._project(x)
            o_ref, s_ref = fla_ref(qm, km, vm, gm, bm, m.scale, None)
            out.update(outputs_and_states_in_pieces(m, x, o_ref, s_ref, pieces, prefix="beta<2 " if neg else "beta<1 "))
    return out


@register_crosscheck(
    "kda",
    "fla naive_recurrent_kda",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=DELTA_OPS,
    op_states=True,
    per_mode=PER_MODE,
)
def kda_vs_fla_recurrent() -> dict[str, float]:
    """The channel-wise delta ops and the KDA mixer (beta < 1 and < 2) against fla's naive_recurrent_kda."""
    return _kda_vs("recurrent")


@register_crosscheck(
    "kda",
    "fla naive_chunk_kda C=16",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=DELTA_OPS,
    op_states=True,
    per_mode=PER_MODE,
)
def kda_vs_fla_chunk() -> dict[str, float]:
    """The same against fla's naive_chunk_kda (T = 64 and 48, multiples of its chunk size 16)."""
    return _kda_vs("chunk")


# ---------------------------------------------------------------- Gated DeltaNet-2
def _gdn2_vs(reference: str) -> dict[str, float]:
    ref = fla_naive("gdn2")

    def fla_ref(q, k, v, g, b, w, scale, s0):
        if reference == "recurrent":
            return ref.naive_recurrent_gdn2(q, k, v, g, b, w, scale=scale, initial_state=s0, output_final_state=True)
        return ref.naive_chunk_gdn2(
            q, k, v, g, b, w, scale=scale, initial_state=s0, output_final_state=True, chunk_size=FLA_CHUNK
        )

    out: dict[str, float] = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        q, k, v, _, g, b, w, s0 = _channel_inputs(50)
        scale = q.shape[-1] ** -0.5
        o_ref, s_ref = fla_ref(q, k, v, g, b, w, scale, s0.clone())
        wv, bk = w * v, b * k
        runs = {f"op.chunked(C={c})": chunked_channel_delta_rule(q, k, wv, bk, g, scale, s0, c) for c in DELTA_CHUNKS}
        runs["op.recurrent"] = recurrent_channel_delta_rule(q, k, wv, bk, g, scale, s0)
        out.update(op_errors(runs, o_ref, s_ref))
        for neg in (False, True):
            m, x = _mixer_case("gdn2", seed=30 + neg, allow_neg_eigval=neg)
            qm, km, vm, _, _, gm = m._terms(x)
            bm, wm = m._gates(x)
            o_ref, s_ref = fla_ref(qm, km, vm, gm, bm, wm, m.scale, None)
            out.update(outputs_and_states_in_pieces(m, x, o_ref, s_ref, prefix="b<2 " if neg else "b<1 "))
    return out


@register_crosscheck(
    "gdn2",
    "fla naive_recurrent_gdn2",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=DELTA_OPS,
    op_states=True,
    per_mode=PER_MODE,
)
def gdn2_vs_fla_recurrent() -> dict[str, float]:
    """The channel-wise delta ops and the GDN-2 mixer (b < 1 and < 2) against fla's naive_recurrent_gdn2."""
    return _gdn2_vs("recurrent")


@register_crosscheck(
    "gdn2",
    "fla naive_chunk_gdn2 C=16",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=DELTA_OPS,
    op_states=True,
    per_mode=PER_MODE,
)
def gdn2_vs_fla_chunk() -> dict[str, float]:
    """The same against fla's naive_chunk_gdn2."""
    return _gdn2_vs("chunk")
