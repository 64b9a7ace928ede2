"""Helpers shared by the family checks modules (checks/<family>.py): building a mixer to compare,
feeding it in pieces, and comparing every mode with a reference.

Key names of the returned error dicts, which the tests read (``CrossCheck.per_mode``):
``[<case> ]<mode>.output``, ``<mode>.pieces`` or ``<mode>.pieces.output`` (uneven pieces with the
state passed along), ``<mode>.continued.output`` (a second segment from the first's state),
``<mode>.state`` (final state), ``op.<impl>...`` (an op, outside the mixer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from tokenmix.checks.tolerances import max_rel_err
from tokenmix.core.errors import InputError
from tokenmix.mixers.base import Mixer
from tokenmix.mixers.registry import build_mixer
from tokenmix.ops.chunked_gla import chunked_gla
from tokenmix.ops.recurrent_gla import recurrent_gla

PIECES = (5, 1, 20, 11)  # uneven pieces of T = 37
# the op and two-segment mixer cases of the linear-recurrence families' checks (linear attention,
# state space models, gated linear recurrences)
OP_SHAPE = (2, 50, 3, 8, 6, 16)  # an op case's B, T, H, K, V and chunk size (T = 50: chunks of 16 do not divide it)
MIXER_D, MIXER_HEADS, MIXER_CHUNK = 24, 3, 8
MIXER_SEGMENTS = (21, 13)  # two calls, the second starting from the first's final state
GLA_OPS = ("chunked_gla", "recurrent_gla")
SEGMENT_QUANTITIES = (".output", ".continued.output", ".state")


def identity_readout(m: Mixer) -> None:
    """Set the output projection to the identity, so the mixer returns the per-head outputs [B, T, H·V]."""
    with torch.no_grad():
        m.out.weight.copy_(torch.eye(m.out.weight.shape[0], dtype=m.out.weight.dtype))


def mixer_case(
    name: str,
    seed: int,
    heads: int = 3,
    head_dim: int = 8,
    t: int = 37,
    dtype: torch.dtype = torch.float32,
    **overrides,
) -> tuple[Mixer, Tensor]:
    """The registered mixer (``heads`` x ``head_dim``, config ``overrides``) with an identity readout, and
    an input x [2, t, D]; seeded."""
    torch.manual_seed(seed)
    m = build_mixer(name, heads * head_dim, n_heads=heads, **overrides).to(dtype)
    identity_readout(m)
    return m, torch.randn(2, t, heads * head_dim, dtype=dtype)


def segment_mixer(name: str, dtype: torch.dtype = torch.float32, **overrides) -> Mixer:
    """The registered mixer of the segment cases (MIXER_D wide, MIXER_HEADS heads, chunk size
    MIXER_CHUNK, config ``overrides``), built after seeding 0."""
    torch.manual_seed(0)
    return build_mixer(name, MIXER_D, n_heads=MIXER_HEADS, chunk_size=MIXER_CHUNK, **overrides).to(dtype)


def segments_case(name: str, dtype: torch.dtype = torch.float32, **overrides) -> tuple[Mixer, list[Tensor]]:
    """``segment_mixer`` and random inputs [2, t, MIXER_D] for each t of MIXER_SEGMENTS."""
    m = segment_mixer(name, dtype, **overrides)
    return m, [torch.randn(2, t, MIXER_D, dtype=dtype) for t in MIXER_SEGMENTS]


def run_in_pieces(m: Mixer, x: Tensor, mode: str, sizes: Sequence[int]):
    """Feed x [B, T, D] in pieces of the given sizes, passing the state along.

    Returns:
        (the concatenated output [B, T, D], the final state).
    """
    if sum(sizes) != x.shape[1]:
        raise InputError(f"piece sizes {list(sizes)} do not add up to T = {x.shape[1]}")
    ys, state, t0 = [], None, 0
    for size in sizes:
        y, state = m(x[:, t0 : t0 + size], state, mode=mode)
        ys.append(y)
        t0 += size
    return torch.cat(ys, 1), state


def outputs_in_pieces(
    m: Mixer,
    x: Tensor,
    ref: Tensor,
    pieces: Sequence[int] = PIECES,
    metric: Callable[[Tensor, Tensor], float] = max_rel_err,
    prefix: str = "",
) -> dict[str, float]:
    """``metric`` of every mode of m against ref [B, T, D]: ``{"<prefix><mode>.output": e,
    "<prefix><mode>.pieces": e}`` (whole, and in ``pieces`` with the state passed along)."""
    out = {}
    for mode in m.modes:
        out[f"{prefix}{mode}.output"] = metric(m(x, mode=mode)[0], ref)
        out[f"{prefix}{mode}.pieces"] = metric(run_in_pieces(m, x, mode, pieces)[0], ref)
    return out


def outputs_and_states_in_pieces(
    m: Mixer, x: Tensor, o_ref: Tensor, s_ref: Tensor | None = None, pieces: Sequence[int] = PIECES, prefix: str = ""
) -> dict[str, float]:
    """Max relative error of every mode of m, whole and in ``pieces``, against o_ref [B, T, H, V] (or
    [B, T, D]) and, when given, the final state ``state.memory`` against s_ref: keys
    ``<prefix><mode>[.pieces].output`` and ``<prefix><mode>[.pieces].state``."""
    out = {}
    for mode in m.modes:
        for how, (y, state) in (("", m(x, mode=mode)), (".pieces", run_in_pieces(m, x, mode, pieces))):
            out[f"{prefix}{mode}{how}.output"] = max_rel_err(y, o_ref.flatten(2))
            if s_ref is not None:
                out[f"{prefix}{mode}{how}.state"] = max_rel_err(state.memory, s_ref)
    return out


def modes_over_segments(m: Mixer, xs: Sequence[Tensor], reference) -> dict[str, float]:
    """Every mode of m fed the segments xs one after another (state passed along) against a reference.

    Args:
        reference: ``reference(x, ref_state) -> (y [B, T, D], ref_state, finals, extra)``, called once
            per segment in order (ref_state None first); ``finals`` {key: (ours(state) -> Tensor, ref
            Tensor)} of the last call are the final states compared; ``extra`` {quantity: error} are
            errors of the reference itself, reported as ``segment<i> <quantity>``.
    Returns:
        Max relative errors: ``<mode>.output`` (first segment), ``<mode>.continued.output`` (second),
        ``<mode>.continued<i>.output`` (further ones), ``<mode>.<key>`` (final states).
    """
    refs, rs, finals, out = [], None, {}, {}
    for i, x in enumerate(xs):
        y, rs, finals, extra = reference(x, rs)
        refs.append(y)
        out.update({f"segment{i + 1} {q}": e for q, e in extra.items()})
    for mode in m.modes:
        state = None
        for i, (x, ref) in enumerate(zip(xs, refs)):
            y, state = m(x, state, mode=mode)
            key = "output" if i == 0 else "continued.output" if i == 1 else f"continued{i}.output"
            out[f"{mode}.{key}"] = max_rel_err(y, ref)
        for key, (ours, ref) in finals.items():
            out[f"{mode}.{key}"] = max_rel_err(ours(state), ref)
    return out


def gla_ops_against(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None,
    scale: float,
    s0: Tensor | None,
    o_ref: Tensor,
    s_ref: Tensor | None,
    chunk_size: int,
    prefix: str = "op.",
) -> dict[str, float]:
    """Both GLA op implementations (ops/chunked_gla.py at ``chunk_size``, ops/recurrent_gla.py) against
    o_ref and, when given, s_ref: keys ``<prefix>chunked_gla(C=<c>).output``, ``<prefix>recurrent_gla.state``, ..."""
    runs = {
        f"chunked_gla(C={chunk_size})": chunked_gla(q, k, v, g, scale, s0, chunk_size),
        "recurrent_gla": recurrent_gla(q, k, v, g, scale, s0),
    }
    return op_errors(runs, o_ref, s_ref, prefix)


def op_errors(runs: dict, o_ref: Tensor, s_ref: Tensor | None, prefix: str = "") -> dict[str, float]:
    """Max relative errors of each op run ``{what: (o, s)}`` against o_ref and, when given, s_ref:
    keys ``<prefix><what>.output`` and ``<prefix><what>.state``."""
    out = {}
    for what, (o, s) in runs.items():
        out[f"{prefix}{what}.output"] = max_rel_err(o, o_ref)
        if s_ref is not None:
            out[f"{prefix}{what}.state"] = max_rel_err(s, s_ref)
    return out
