"""Cross-checks of the test-time-training family (TTT-Linear) against fla-core's naive reference.

fla's ``chunk_ttt_linear_ref`` (pure PyTorch, float32) gives the output after its post-norm and the
final fast weights W and bias. The ops (ops/ttt_linear.py: chunked, recurrent, dense) run from a
nonzero initial state; final states are compared at a length that fills whole mini-batches (fla pads
a partial last mini-batch with tokens that still move its bias). The registered mixer runs through
an identity output projection in every mode, whole and in uneven pieces with the state passed
along, at mini-batch sizes 1 and 16. Metric, stated in the label: max relative error
max|ours - ref| / max|ref|, at 1e-5.
"""

from __future__ import annotations

import torch

from tokenmix.checks import fla_naive, register_crosscheck
from tokenmix.checks.common import mixer_case, outputs_and_states_in_pieces
from tokenmix.checks.tolerances import FLOAT32_REL_TOL, max_rel_err
from tokenmix.ops.ttt_linear import TTTWeights, chunked_ttt_linear, dense_ttt_linear, post_norm, recurrent_ttt_linear


def _fla_ttt(ref, q, k, v, eta, ln_w, ln_b, scale, eps, mbs, w0=None, c0=None):
    """fla's chunk_ttt_linear_ref on clones (it scales q in place); eta [B, T, H]; c0 [B, H, D]."""
    return ref.chunk_ttt_linear_ref(
        q.clone(),
        k.clone(),
        v.clone(),
        ln_w,
        ln_b,
        eta[..., None].clone(),
        scale,
        eps,
        mbs,
        None if w0 is None else w0.clone(),
        None if c0 is None else c0[:, :, None].clone(),
        True,
    )


@register_crosscheck(
    "ttt_linear",
    "fla chunk_ttt_linear_ref",
    "float32 max rel",
    FLOAT32_REL_TOL,
    ops=("chunked", "recurrent", "dense"),
    op_states=True,
    per_mode=(".output", ".pieces.output"),
)
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
            scale = d**-0.5
            o_ref, w_ref, c_ref = _fla_ttt(ref, q, k, v, eta, ln_w, ln_b, scale, eps, mbs, w0, c0)
            s0 = TTTWeights(w0, c0, torch.zeros_like(w0), torch.zeros_like(c0))
            for name, fn in (
                ("chunked", chunked_ttt_linear),
                ("recurrent", recurrent_ttt_linear),
                ("dense", dense_ttt_linear),
            ):
                o, s = fn(q, k, v, eta, ln_w, ln_b, scale, eps, mbs, s0)
                out[f"T={t} op.{name}.output"] = max_rel_err(post_norm(o, ln_w, ln_b, eps), o_ref)
                if t % mbs == 0:
                    out[f"T={t} op.{name}.state W"] = max_rel_err(s.W, w_ref)
                    out[f"T={t} op.{name}.state bias"] = max_rel_err(s.c, c_ref[:, :, 0])
        for m_bs in (1, 16):
            m, x = mixer_case("ttt_linear", 10, mini_batch_size=m_bs)
            q, k, v, eta = m._project(x)
            o_ref, _, _ = _fla_ttt(ref, q, k, v, eta, m.ln_w, m.ln_b, m.scale, m.config.eps, m_bs)
            out.update(outputs_and_states_in_pieces(m, x, o_ref.flatten(2), prefix=f"b={m_bs} "))
    return out
