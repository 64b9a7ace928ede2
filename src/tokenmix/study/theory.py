"""What one layer of a row can do on a task, derived from its structure alone (no training):
the routes a pattern recurrence has for the fixed-offset copy, the MQAR queries it reads directly,
and the attention layers pointer doubling needs for entity tracking. The claims compare measured
accuracies with these bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from tokenmix.analysis.expressivity import CommunicationGraph
from tokenmix.models import MixerModel
from tokenmix.models.reads import binding_window
from tokenmix.runs.synthetic import SyntheticRunConfig
from tokenmix.study.structure import layer_distances
from tokenmix.training.synthetic import dataset


@dataclass(frozen=True)
class CopyRoutes:
    """How one layer of a row's pattern recurrence can route the fixed-offset copy (framework §4.3).

    Copy puts the segment at positions 0..S-1 and asks for s_j at j + L; positions S..L-1 are blanks
    ("free": neither segment nor answer). In one layer of a pattern recurrence (A diagonal) x_j reaches
    y_{j+L} only along B-hops j -> u_1 -> ... -> j + L, and a relay u that is itself a segment or answer
    position must also carry its own symbol. ``hops[j]`` is the fewest hops of a route whose relays are
    all free (None: no such route); the window-2 shift block before the row mixer is left aside.
    """

    label: str
    pattern: str
    copy_len: int  # S, the answers
    offset: int  # L
    free: int  # free relay positions
    hops: tuple[int | None, ...]  # per answer j (length S)

    @property
    def routed(self) -> int:
        return sum(h is not None for h in self.hops)

    def hop_counts(self) -> dict[int, int]:
        """Number of routed answers per hop count, ascending."""
        out: dict[int, int] = {}
        for h in sorted(h for h in self.hops if h is not None):
            out[h] = out.get(h, 0) + 1
        return out

    @property
    def one_flow_bound(self) -> int:
        """Answers routable at once through free positions if each free relay carries one flow: the
        one-hop routes need no relay, every longer one needs a free relay of its own."""
        direct = self.hop_counts().get(1, 0)
        return direct + min(self.free, self.routed - direct)

    def describe(self, cell: dict[str, Any] | None = None, guess: float | None = None) -> str:
        """One sentence of facts; with the row's copy ``cell`` (``acc_by_seed``) and the guessing level,
        also the answers each seed solved (inverting acc = (k + (S − k)·g) / S)."""
        counts = ", ".join(f"{c} in {h} hop(s)" for h, c in self.hop_counts().items()) or "none"
        text = (
            f"{self.label} on copy: one layer of its pattern ({self.pattern}) has a route j -> j + "
            f"{self.offset} through the {self.free} free positions only for {self.routed} of the "
            f"{self.copy_len} answers ({counts})"
        )
        if self.routed > self.one_flow_bound:
            text += f"; with one flow per free relay at most {self.one_flow_bound} of them at once"
            if guess is not None:
                k, n = self.one_flow_bound, self.copy_len
                text += f" ({100 * (k + (n - k) * guess) / n:.1f} % accuracy with the rest guessed)"
        if self.routed < self.copy_len:
            text += "; the others must relay through positions that carry their own symbol"
        if cell and cell.get("acc_by_seed") and guess is not None:
            solved = ", ".join(f"{answers_solved(a, self.copy_len, guess):.1f}" for a in cell["acc_by_seed"].values())
            text += (
                f"; answers solved per seed at lr {cell.get('best_lr', 0):g} (test accuracy a -> "
                f"S·(a − g)/(1 − g), g = {100 * guess:.1f} %): {solved}"
            )
        return text


def answers_solved(acc: float, answers: int, guess: float) -> float:
    """Answer positions solved if the others are guessed at level ``guess``: inverts
    acc = (k + (answers − k)·guess) / answers."""
    return answers * (acc - guess) / (1 - guess)


def copy_routes(label: str, mixer: torch.nn.Module, copy_len: int, offset: int, seq_len: int) -> CopyRoutes | None:
    """:class:`CopyRoutes` of ``mixer``'s pattern, or None when the mixer has no pattern (attention)."""
    pattern = getattr(mixer, "pattern", None)
    if pattern is None or not hasattr(pattern, "neighbors"):
        return None
    free = set(range(copy_len, offset))
    readers: dict[int, list[int]] = {u: [] for u in range(seq_len)}  # u -> positions that read y_u
    for v in range(seq_len):
        for u in pattern.neighbors(v):
            readers[u].append(v)
    hops: list[int | None] = []
    for j in range(copy_len):
        target, dist, frontier, found = j + offset, {j: 0}, [j], None
        while frontier and found is None:  # breadth first: the first hit is a fewest-hop route
            nxt = []
            for u in frontier:
                for v in readers[u]:
                    if v == target:
                        found = dist[u] + 1
                        break
                    if v in free and v not in dist:
                        dist[v] = dist[u] + 1
                        nxt.append(v)
                if found is not None:
                    break
            frontier = nxt
        hops.append(found)
    return CopyRoutes(
        label=label,
        pattern=str(getattr(pattern, "name", pattern)),
        copy_len=copy_len,
        offset=offset,
        free=len(free),
        hops=tuple(hops),
    )


def _row_mixers(configs: Sequence[SyntheticRunConfig], task_name: str):
    """(config, task config, row mixer) for the first ``task_name`` run of every row label whose
    model has a layer of that name (the mixer built with a fixed seed: only its structure is read)."""
    seen: set[str] = set()
    for c in configs:
        if c.task != task_name or c.label in seen:
            continue
        seen.add(c.label)
        model_cfg = c.model_config()
        if c.label not in model_cfg.layers:
            continue
        torch.manual_seed(0)
        yield c, c.task_config(), MixerModel(model_cfg).blocks[model_cfg.layers.index(c.label)].mixer


def copy_routes_for_rows(configs: Sequence[SyntheticRunConfig]) -> dict[str, CopyRoutes]:
    """Per row label with a copy run whose row mixer is a pattern recurrence: its :class:`CopyRoutes`."""
    out: dict[str, CopyRoutes] = {}
    for c, task, mixer in _row_mixers(configs, "copy"):
        routes = copy_routes(c.label, mixer, task.copy_len, task.shift, task.seq_len)
        if routes is not None:
            out[c.label] = routes
    return out


@dataclass(frozen=True)
class RecallReads:
    """Which MQAR queries one layer of a row's mixer can answer by reading its key and value directly.

    In zoology's layout key_i sits at an even position p = 2i and value_i at p + 1; the queries come
    after the context, each at an even position q holding its key. Behind a layer that mixes the last
    w positions (a token shift of window w, or a short convolution of w taps: position u then holds
    inputs u − w + 1 .. u) the positions holding key_i *and* value_i are p + 1 .. p + w − 1: only
    p + 1 for w = 2, p + 1 .. p + 3 behind zoology's kernel-4 convolution. The layer at q can select
    the bound value by its key only through a path from such a position to q: ``direct`` counts the
    scored queries with one in one hop (a pattern recurrence: q itself or a neighbour of q; attention
    and the linear recurrences: any earlier position), ``two_hops`` within two (``layer_distances``;
    the second hop is what a second layer of the row, stacked on the first, can add). In one layer,
    relays do not help a softmax pattern: a relay u chooses what it carries by its own token, before
    the query is known. ``ceiling`` is the accuracy of solving the directly read queries and guessing
    the rest uniformly among the context's values (a yardstick, not a proof: a model might guess
    better, e.g. from the query's rank: queries come roughly in the keys' order under zoology's
    power-law gaps, and that guess alone gets about 30 % at 4 pairs, length 32). Reachability is not
    capacity: a recurrence that reads every position (A lower triangular) still holds them in a
    fixed-size state. Parity: with w = 2, q − (p + 1) is odd, and 2^k has one odd distance, 1; with
    w = 3, p + 2 adds the even distances.
    """

    label: str
    pattern: str  # the pattern's name, or the mixer's name when it reads through its operator
    num_kv_pairs: int
    answers: int  # scored queries of the sample
    direct: int  # those with a position holding key and value within one hop of the query
    two_hops: int = 0  # ... within two hops

    @property
    def fraction(self) -> float:
        return self.direct / max(self.answers, 1)

    @property
    def two_hop_fraction(self) -> float:
        return self.two_hops / max(self.answers, 1)

    @property
    def ceiling(self) -> float:
        return self.fraction + (1 - self.fraction) / self.num_kv_pairs

    def describe(self, cell: dict[str, Any] | None = None) -> str:
        text = (
            f"{self.label} on assoc_recall: one layer of its pattern ({self.pattern}) reads the position holding "
            f"the queried key and its value (behind the token shift) for {self.direct} of the "
            f"{self.answers} validation queries ({100 * self.fraction:.1f} %); solving those and guessing the "
            f"rest among the {self.num_kv_pairs} context values gives {100 * self.ceiling:.1f} %"
        )
        if cell is not None:
            text += f"; measured {100 * cell['acc_mean']:.1f} %"
        return text


def recall_reads(
    label: str, mixer: torch.nn.Module, data: Any, num_kv_pairs: int, shift_window: int = 2
) -> RecallReads:
    """:class:`RecallReads` of ``mixer`` on MQAR ``data`` behind a layer mixing the last ``shift_window``
    positions (a token shift's window, a short convolution's taps)."""
    pattern = getattr(mixer, "pattern", None)
    name = str(getattr(pattern, "name", pattern)) if pattern is not None else label
    return reads_from_distances(
        label, name, layer_distances(mixer, data.inputs.shape[1]), data, num_kv_pairs, shift_window
    )


def pattern_recall_reads(label: str, pattern: Any, data: Any, num_kv_pairs: int, shift_window: int = 2) -> RecallReads:
    """:class:`RecallReads` of one layer reading its pattern's neighbours (no mixer built): what
    ``tokenmix design --train assoc_recall`` ranks candidate patterns by before training them."""
    hops = CommunicationGraph.from_pattern(pattern, data.inputs.shape[1]).distances()
    return reads_from_distances(label, str(getattr(pattern, "name", pattern)), hops, data, num_kv_pairs, shift_window)


def reads_from_distances(
    label: str, name: str, hops: Any, data: Any, num_kv_pairs: int, shift_window: int
) -> RecallReads:
    """Count the scored queries of ``data`` whose layer (``hops`` [T, T]: fewest hops from input j to
    output i) reaches a position holding the queried key and its value in one / two hops."""
    answers = direct = two = 0
    for inputs, scored in zip(data.inputs.tolist(), data.scored.tolist()):
        for q in (i for i, s in enumerate(scored) if s):
            p = inputs.index(inputs[q])  # the key's first occurrence: its place in the context
            near = int(hops[q, p + 1 : min(p + shift_window, q + 1)].min())
            answers += 1
            direct += near <= 1
            two += near <= 2
    return RecallReads(
        label=label, pattern=name, num_kv_pairs=num_kv_pairs, answers=answers, direct=direct, two_hops=two
    )


def recall_reads_for_rows(configs: Sequence[SyntheticRunConfig], patterns_only: bool = True) -> dict[str, RecallReads]:
    """Per row label with an MQAR run: its :class:`RecallReads` on that run's validation set; by
    default only rows whose mixer is a pattern recurrence (the others read every position)."""

    out: dict[str, RecallReads] = {}
    for c, task, mixer in _row_mixers(configs, "assoc_recall"):
        if patterns_only and not hasattr(getattr(mixer, "pattern", None), "neighbors"):
            continue
        data = dataset(task, c.train.val_examples, c.train.val_seed)
        out[c.label] = recall_reads(c.label, mixer, data, task.num_kv_pairs, binding_window(c.model_config(), c.label))
    return out


def doubling_layers(n: int) -> int:
    """Attention layers after which pointer doubling answers the deepest ASK of an n-change chain.

    The construction (one-hot attention): every event starts holding a pointer to the event it reads
    (MOVE(b, a): the event that set box a; ASK(b): the one that set b) or, for PUT, its object; a
    layer replaces each pointer with what the pointed-to event held after the previous layer, so L
    layers follow 2^L - 1 links. ASK(b_n) is n + 1 links from the PUT, hence ceil(log2(n + 2)): one
    more than ChaCAL's lower bound ceil(log2(n + 1)) when n + 1 is a power of two (the ASK's own hop).
    An upper bound for one head: with more heads and an MLP a layer can do more per link (e.g. read
    every PUT of a short context at once and pick the object by box), so fewer layers may do.
    """
    return math.ceil(math.log2(n + 2))
