"""tokenmix: causal token mixers as (A, B) pairs, Y = (I - B)^-1 A X.

Levels of interface:
    core      -- MixOperator (A, B, optional readout R) and the one dense reference solver
    patterns  -- sparsity patterns N(i) of the recurrent part B
    ops       -- fast kernels (chunked sparse triangular solve, chunkwise scans)
    mixers    -- one mixer per file, registered by name
    models    -- the one generic model (embedding -> blocks -> head)
Above them: runs (the on-disk record of a run), training / analysis / bench / hf, study (the paper,
the comparison and every preset), cli (parsing only). Each floor imports only the floors below it.

Hugging Face: ``import tokenmix.hf`` registers ``model_type = "tokenmix"`` with transformers'
``AutoConfig`` / ``AutoModel`` / ``AutoModelForCausalLM`` (as ``import fla`` does for fla's models);
then ``AutoModelForCausalLM.from_pretrained(folder)`` of an exported model works. This file imports
nothing of it: ``import tokenmix`` loads neither torch nor transformers (the command line makes it on
every call, before it sets OMP_WAIT_POLICY and torch loads). Without ``import tokenmix.hf`` (e.g. from
lm-eval), ``trust_remote_code=True`` loads an export through the shims its config names (hf/export.py).
"""

from __future__ import annotations

__version__ = "0.1.0"
