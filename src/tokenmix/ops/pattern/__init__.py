"""The pattern recurrence (§4.6) as ops, one file per idea and per way of running it (fla's shape).

The recurrence, for every batch element and head:

    y_t = alpha_t * x_t + sum_w beta_{t,w} * y_{idx[t,w]}          (idx[t,w] < P + t, -1 = none)
    s_{t,w} = q_t . k_{idx[t,w]}                                     (the scores a softmax reads)

i.e. (I - B) Y = diag(alpha) X with B[t, idx[t,w]] = beta[t,w]. Positions are *buffer* positions:
the P cached outputs of an earlier call (``y_prefix``) come first, then the T new ones, so new
position t sits at buffer index P + t.

Files:
    plan.py            the index table's plan (regular runs, near band, irregular leftovers), built
                       once per table; per-row tables of packed rows (``packed_table``)
    chunked.py         the torch chunked solve and its autograd Function (``chunked_pattern_solve``)
    scores.py          the torch neighbour scores (``pattern_scores``)
    window_softmax.py  every one of the previous M positions, score softmax: matmuls per chunk
    numba.py           the compiled CPU kernels: solve, scores, and the decode reads (with their
                       tensor-operation definitions: the torch backend's reads)
    triton_solve.py    the Triton kernels (GPU; the CPU under TRITON_INTERPRET=1): solve and scores
    triton_decode.py   the Triton decode reads (fixed distances, neighbour sets)
    backend.py         which of numba / torch / triton runs a call (``choose_backend``, asked once
                       per call) and the calls themselves (``solve``, ``scores``, ``step_read``,
                       ``lattice_step``): the one place a backend is chosen (docs/backends.md)
    reference.py       the plain references the tests hold every path to

Packed rows (documents back to back in a row, ``core/packing.py``): a token reads only its own
document's neighbours, and the first document of a row continues the cached prefix. Two forms,
both exact. Exact-distance patterns keep the shared table, whose runs stay intact, and the caller
zeroes the coefficients of neighbours before the token's document start (the solve then reads
them with weight 0 and no gradient reaches them). Patterns whose neighbour set follows the
document's own clock (the lattice, Fenwick) get per-row tables idx [B, T, W] (``packed_table``),
planned by ``RowPatternPlan``. The window path takes per-query key starts [B, T] (``key_start``)
in place of the per-row left padding.
"""

from tokenmix.ops.pattern.chunked import chunked_pattern_solve
from tokenmix.ops.pattern.plan import PatternPlan, RowPatternPlan, packed_table, plan_pattern
from tokenmix.ops.pattern.reference import pattern_scores_reference, recurrent_pattern_solve, window_softmax_reference
from tokenmix.ops.pattern.scores import pattern_scores
from tokenmix.ops.pattern.window_softmax import chunked_window_softmax

__all__ = [
    "PatternPlan",
    "RowPatternPlan",
    "chunked_pattern_solve",
    "chunked_window_softmax",
    "packed_table",
    "pattern_scores",
    "pattern_scores_reference",
    "plan_pattern",
    "recurrent_pattern_solve",
    "window_softmax_reference",
]
