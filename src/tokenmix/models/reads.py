"""What one layer of a model reads, from its structure alone: the fewest hops from each input
position to each output through the layer (counted up to a small limit), which layer of a model is
a row's own mixer, and how many positions the layer in front of it mixes (the binding window).

The synthetic harness reads these to split a task's accuracy by what the structure reads
(``tasks.READ_CLASSES``) and to build the one-hop curriculum (instances whose answers the row's
layer reads in one hop); the study's ceilings and the read diagnostic read them too.

A hop is one off-diagonal entry of A (an input read directly) or of B (an earlier output read): a
pattern recurrence (A diagonal) reaches its neighbours' inputs in one hop, attention and the linear
recurrences (A lower triangular) every earlier input.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from tokenmix.mixers.registry import get_mixer_spec
from tokenmix.models.model import ModelConfig
from tokenmix.patterns.graph import distance_matrix

READ_LIMIT = 3  # hops are counted exactly up to READ_LIMIT - 1; READ_LIMIT means "further, or never"
BINDING_LAYERS = ("local_attention", "short_conv")  # layers that mix a window of the last positions


def row_layer(model_cfg: ModelConfig, label: str) -> int:
    """Index of the row's own mixer layer: the first layer named by the row's label, else the first
    layer that is not a binding layer (a short convolution or local window in front of the row)."""
    if label in model_cfg.layers:
        return model_cfg.layers.index(label)
    return next((i for i, name in enumerate(model_cfg.layers) if name not in BINDING_LAYERS), 0)


def binding_window(model_cfg: ModelConfig, row: str) -> int:
    """How many positions the layer in front of ``row``'s first layer mixes: a local attention's
    window, a short convolution's taps; 2 when there is none (the binding counted at the value
    position only, as before any shift)."""
    i = model_cfg.layers.index(row)
    before = model_cfg.layers[i - 1] if i > 0 else None
    if before not in BINDING_LAYERS:
        return 2
    # the layer's config as the registry resolves it for the model (defaults, then the overrides)
    config = get_mixer_spec(before).make_config(**model_cfg.mixer_overrides.get(before, {}))
    return config.window if before == "local_attention" else config.kernel_size


def layer_hops(mixer: torch.nn.Module, n: int, limit: int = READ_LIMIT, seed: int = 0) -> np.ndarray:
    """H [n, n] int64: the fewest hops from input j to output i through one layer, capped at ``limit``
    (0 on the diagonal; ``limit`` for j > i, for no path, or for a path of ``limit`` hops or more).

    Pattern recurrences are read from their pattern (``distance_matrix``). Any other mixer from the
    supports of its operator materialised in float64 on one random input: per head (and state channel, and
    recurrence of a sum), the graph of (A | B) off the diagonal, its reach grown hop by hop; the
    fewest hops over heads (a path runs inside one head)."""
    pattern = getattr(mixer, "pattern", None)
    if pattern is not None and hasattr(pattern, "neighbor_table"):
        return np.minimum(distance_matrix(pattern, n), limit)
    # in float64 on a copy: a decay product over n positions that float32 rounds to 0 is still a read
    exact = copy.deepcopy(mixer).to(device="cpu", dtype=torch.float64)
    x = torch.randn(1, n, mixer.d_model, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    with torch.no_grad():
        op = exact.materialize(x)
    support = (op.A[0] != 0) | (op.B[0] != 0)  # [H, (G,) T', T'], T' = n x sub-steps
    if op.R is not None:
        support |= op.R[0] != 0
    t = support.shape[-1]
    step = support.reshape(-1, t, t).to(torch.float64).cpu()
    step = ((step + torch.eye(t, dtype=torch.float64)) > 0).to(torch.float64)  # a path may stay put
    hops = torch.full((step.shape[0], t, t), limit, dtype=torch.int64)
    hops[:, torch.arange(t), torch.arange(t)] = 0
    reach = step
    for k in range(1, limit):  # reach after k hops: grown by one more hop per round
        hops = torch.where((reach > 0) & (hops > k), torch.full_like(hops, k), hops)
        reach = (reach @ step > 0).to(torch.float64)
    best = hops.min(0).values
    sub = getattr(mixer, "substeps", 1)
    if sub > 1:  # an operator on sub-steps per token (DeltaProduct): read at each token's last sub-step
        best = best.reshape(n, sub, n, sub)[:, -1].min(-1).values
    return best.numpy()
