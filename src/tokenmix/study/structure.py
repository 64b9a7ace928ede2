"""The structure columns of the compare table: per row (a mixer, or a model such as "attention x3"),
its derived cost and cache, the cache measured at decode, and the shortest information path.

Structure columns, all at the table's length n (the longest task sequence):
    time/token   the row mixer's ``time_complexity`` (the label's mixer when the label names one of the
                 model's layers, else every distinct layer's) and ``flops_per_token(n)`` summed over layers
    cache        ``cache_complexity``; past positions and scalars per sequence, measured after an
                 n-token decode with ``model.step`` (``MixerState.peak_positions`` / ``peak_numel``
                 summed over layers) next to the derived ``cache_positions(n)`` / ``state_size(n)``
    path         the largest shortest information path through one layer of the row mixer, over pairs j < i < n:
                 ``pattern_report`` for pattern recurrences, else the graph of the materialised
                 operator's supports (attention: 1; B = 0 with a window shorter than n: ∞).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tokenmix.analysis.expressivity import UNREACHABLE, CommunicationGraph, operator_graph
from tokenmix.models import MixerModel, ModelConfig
from tokenmix.patterns import pattern_report


@dataclass
class StructureFacts:
    """Derived and measured structure of one row's model at length n (sums over its layers)."""

    label: str
    layers: tuple[str, ...]
    n: int
    time_complexity: str
    cache_complexity: str
    flops_per_token: int
    cache_positions_derived: int
    cache_positions_measured: int
    state_size_derived: int
    state_size_measured: int
    shortest_path: float
    num_params: int

    @property
    def cache_matches(self) -> bool:
        return (
            self.cache_positions_derived == self.cache_positions_measured
            and self.state_size_derived == self.state_size_measured
        )

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["layers"] = list(self.layers)
        d["cache_matches"] = self.cache_matches
        d["shortest_path"] = fmt_path(self.shortest_path)
        return d


def fmt_path(p: float) -> str:
    return "∞" if math.isinf(p) else str(int(p))


def layer_distances(mixer: torch.nn.Module, n: int, seed: int = 0) -> np.ndarray:
    """D [n, n]: the fewest hops from input x_j to output i through one layer (``UNREACHABLE`` if
    none; 0 on the diagonal). A hop is one off-diagonal entry of A (x_j read directly) or of B (an
    earlier output read): a pattern recurrence (A diagonal) reaches its neighbours' inputs in one hop,
    attention and the linear recurrences (A lower triangular) every earlier input in one hop.
    Pattern recurrences are read from their pattern, every other mixer from the supports of its
    materialised operator (on one random input; min over heads and state channels)."""
    pattern = getattr(mixer, "pattern", None)
    if pattern is not None and hasattr(pattern, "neighbor_table"):
        return CommunicationGraph.from_pattern(pattern, n).distances()
    p = next(mixer.parameters())
    x = torch.randn(1, n, mixer.d_model, generator=torch.Generator().manual_seed(seed), dtype=p.dtype)
    with torch.no_grad():
        op = mixer.materialize(x)
    sub = getattr(mixer, "substeps", 1)
    if sub == 1:
        return operator_graph(op).distances()
    # an operator on ``sub`` sub-steps per token (DeltaProduct): token j reaches token i when some
    # sub-step of j reaches i's output, read at i's last sub-step (the others have no output row)
    return operator_graph(op).distances().reshape(n, sub, n, sub)[:, -1].min(-1)  # [n, n]


def layer_shortest_path(mixer: torch.nn.Module, n: int, seed: int = 0) -> float:
    """Largest shortest information path over pairs j < i < n through one layer."""
    pattern = getattr(mixer, "pattern", None)
    if pattern is not None and hasattr(pattern, "neighbor_table"):
        return float(pattern_report(pattern, n, path_limit=n)["shortest_path_max"])
    if n < 2:
        return 0.0
    lower = layer_distances(mixer, n, seed)[np.tril_indices(n, k=-1)]
    return math.inf if (lower >= UNREACHABLE).any() else float(lower.max())


def decode_states(model_cfg: ModelConfig, n: int, seed: int = 0) -> tuple[MixerModel, list]:
    """The model of ``model_cfg`` (random weights, seeded) after decoding n random tokens one by one
    with ``model.step``: (model, per-layer states whose ``peak_positions`` / ``peak_numel`` are measured)."""
    torch.manual_seed(seed)
    model = MixerModel(model_cfg).eval()
    tokens = torch.randint(0, model_cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))
    states = None
    with torch.no_grad():
        for t in range(n):
            _, states = model.step(tokens[:, t], states)
    return model, states


def structure_facts(label: str, model_cfg: ModelConfig, n: int, seed: int = 0) -> StructureFacts:
    """Build the row's model (random weights), decode n tokens with ``model.step`` and read its
    measured cache peaks; the derived values come from each layer's accounting methods."""
    model, states = decode_states(model_cfg, n, seed)
    mixers = [b.mixer for b in model.blocks]
    # complexity and shortest path describe the row's own mixer when the label names one (the
    # presets' rows are "<mixer>" models, possibly behind a shared first layer), else every layer;
    # time, cache and parameter counts are always sums over all layers
    uniq = [label] if label in model_cfg.layers else list(dict.fromkeys(model_cfg.layers))
    by_name = {name: mixers[model_cfg.layers.index(name)] for name in uniq}
    return StructureFacts(
        label=label,
        layers=tuple(model_cfg.layers),
        n=n,
        time_complexity=" + ".join(dict.fromkeys(str(m.time_complexity) for m in by_name.values())),
        cache_complexity=" + ".join(dict.fromkeys(str(m.cache_complexity) for m in by_name.values())),
        flops_per_token=sum(int(m.flops_per_token(n)) for m in mixers),
        cache_positions_derived=sum(int(m.cache_positions(n)) for m in mixers),
        cache_positions_measured=sum(int(s.peak_positions) for s in states),
        state_size_derived=sum(int(m.state_size(n)) for m in mixers),
        state_size_measured=sum(int(s.peak_numel) for s in states),
        shortest_path=min(layer_shortest_path(m, n, seed) for m in by_name.values()),
        num_params=model.num_params(),
    )
