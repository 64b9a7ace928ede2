"""tokenmix: causal token mixers as (A, B) pairs, Y = (I - B)^-1 A X.

Levels of interface:
    core      -- MixOperator (A, B, optional readout R) and the one dense reference solver
    patterns  -- sparsity patterns N(i) of the recurrent part B
    ops       -- fast kernels (chunked sparse triangular solve, chunkwise scans)
    mixers    -- one mixer per file, registered by name
    models    -- the one generic model (embedding -> blocks -> head)
Above them: runs (the on-disk record of a run), training / analysis / bench, study (the paper, the
comparison and every preset), cli (parsing only). Each floor imports only the floors below it.
"""
from __future__ import annotations

__version__ = "0.1.0"
