"""The op level: the mixers' kernels as plain functions on tensors, in fla's layout [B, T, H, ·]
(notation: core/notation.py). Each chunked op has a token-by-token reference beside it with the
same signature (no chunk size), and a test comparing them; the docstrings give every shape.

    o, final_state = chunked_gla(q, k, v, g, scale=..., initial_state=None, chunk_size=64)

Exported here are the ops meant for users; the rest of ``tokenmix.ops.*`` are their building blocks.
"""

from tokenmix.ops.chunked_delta import chunked_delta_rule, recurrent_delta_rule
from tokenmix.ops.chunked_gla import chunked_gla
from tokenmix.ops.chunked_log_linear import chunked_log_linear_attention, recurrent_log_linear_attention
from tokenmix.ops.chunked_ssd import chunked_ssd
from tokenmix.ops.pattern import chunked_pattern_solve, recurrent_pattern_solve
from tokenmix.ops.recurrent_gla import recurrent_gla
from tokenmix.ops.selective_scan import selective_scan

__all__ = [
    "chunked_delta_rule",
    "chunked_gla",
    "chunked_log_linear_attention",
    "chunked_pattern_solve",
    "chunked_ssd",
    "recurrent_delta_rule",
    "recurrent_gla",
    "recurrent_log_linear_attention",
    "recurrent_pattern_solve",
    "selective_scan",
]
