"""The complexity-vs-expressivity table of ``tokenmix compare``: per row (a mixer, or a model such as
"attention x3"), its derived cost and cache, the cache measured at decode, the shortest information
path, and the measured task accuracies; plots and a Markdown report beside the paper's table.

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
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from tokenmix.mixers.registry import get_mixer_spec
from tokenmix.models import MixerModel, ModelConfig
from tokenmix.training.harness import RunConfig

# framework.md §5.1 (Table 1 of the paper, as reproduced by the papernotes note), keyed by our names.
# The paper's "Diagonal SSM" row has O(1) time and cache per token and path n: a first-order B in the
# paper's own parameterisation, which is our ``first_order`` (the structured recurrence with the
# first-order pattern; ``kth_order`` is the same mixer with 4 sub-diagonals). ``diag_ssm`` (Mamba-1's
# selective scan with N states per channel) is framework §2.3's "diagonal SSM with state expansion N",
# O(N) per token, a different row: it has no paper numbers here.
PAPER_TABLE: dict[str, dict[str, Any]] = {
    "attention":        {"structure": "Attention", "time": "O(n)", "cache": "O(n)", "path": "1",
                         "copy": 100.00, "assoc_recall": 100.00, "multi_hop": 39.21},
    "local_attention":  {"structure": "Local attention", "time": "O(k)", "cache": "O(k)", "path": "∞",
                         "copy": 23.75, "assoc_recall": 26.20, "multi_hop": 23.59},
    "first_order":      {"structure": "Diagonal SSM", "time": "O(1)", "cache": "O(1)", "path": "n",
                         "copy": 42.98, "assoc_recall": 32.53, "multi_hop": 27.17},
    "kth_order":        {"structure": "k-th order recurrence", "time": "O(k)", "cache": "O(k)", "path": "n/k",
                         "copy": 74.66, "assoc_recall": 41.12, "multi_hop": 39.08},
    "dense_recurrence": {"structure": "Dense recurrence", "time": "O(n)", "cache": "O(n)", "path": "1",
                         "copy": 100.00, "assoc_recall": 99.99, "multi_hop": 99.80},
    "pow2":             {"structure": "f(k) = 2^k", "time": "O(log n)", "cache": "O(n)", "path": "≤ log2 n",
                         "copy": 92.63, "assoc_recall": 49.03, "multi_hop": 34.85},
    "pow2_ce":          {"structure": "f(k) = 2^k, cache-efficient", "time": "O(log n)", "cache": "O(log n)",
                         "path": "—", "copy": 75.47, "assoc_recall": 52.59, "multi_hop": 38.63},
    "sq1":              {"structure": "f(k) = k²+1", "time": "O(√n)", "cache": "O(n)", "path": "≤ 4",
                         "copy": 99.66, "assoc_recall": 53.61, "multi_hop": 35.68},
    "sq1_ce":           {"structure": "f(k) = k²+1, cache-efficient", "time": "O(√n)", "cache": "O(√n)",
                         "path": "—", "copy": 91.59, "assoc_recall": 54.56, "multi_hop": 38.02},
}
DIAGONAL_SSM = "first_order"  # our row for the paper's "Diagonal SSM"
PAPER_TASKS = ("copy", "assoc_recall", "multi_hop")


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
        return (self.cache_positions_derived == self.cache_positions_measured
                and self.state_size_derived == self.state_size_measured)

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["layers"] = list(self.layers)
        d["cache_matches"] = self.cache_matches
        d["shortest_path"] = _fmt_path(self.shortest_path)
        return d


def _fmt_path(p: float) -> str:
    return "∞" if math.isinf(p) else str(int(p))


def layer_shortest_path(mixer: torch.nn.Module, n: int, seed: int = 0) -> float:
    """Largest shortest information path over pairs j < i < n through one layer."""
    pattern = getattr(mixer, "pattern", None)
    if pattern is not None and hasattr(pattern, "neighbor_table"):
        from tokenmix.patterns import pattern_report
        return float(pattern_report(pattern, n, path_limit=n)["shortest_path_max"])
    from tokenmix.analysis.expressivity import operator_graph
    p = next(mixer.parameters())
    x = torch.randn(1, n, mixer.d_model, generator=torch.Generator().manual_seed(seed), dtype=p.dtype)
    with torch.no_grad():
        op = mixer.materialize(x)
    return float(operator_graph(op).path_stats()[0])


def structure_facts(label: str, model_cfg: ModelConfig, n: int, seed: int = 0) -> StructureFacts:
    """Build the row's model (random weights), decode n tokens with ``model.step`` and read its
    measured cache peaks; the derived values come from each layer's accounting methods."""
    torch.manual_seed(seed)
    model = MixerModel(model_cfg).eval()
    mixers = [b.mixer for b in model.blocks]
    tokens = torch.randint(0, model_cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))
    states = None
    with torch.no_grad():
        for t in range(n):
            _, states = model.step(tokens[:, t], states)
    # complexity and shortest path describe the row's own mixer when the label names one (the
    # presets' rows are "<mixer>" models, possibly behind a shared first layer), else every layer;
    # time, cache and parameter counts are always sums over all layers
    uniq = [label] if label in model_cfg.layers else list(dict.fromkeys(model_cfg.layers))
    by_name = {name: mixers[model_cfg.layers.index(name)] for name in uniq}
    return StructureFacts(
        label=label, layers=tuple(model_cfg.layers), n=n,
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
    copy_len: int      # S, the answers
    offset: int        # L
    free: int          # free relay positions
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
        text = (f"{self.label} on copy: one layer of its pattern ({self.pattern}) has a route j -> j + "
                f"{self.offset} through the {self.free} free positions only for {self.routed} of the "
                f"{self.copy_len} answers ({counts})")
        if self.routed > self.one_flow_bound:
            text += f"; with one flow per free relay at most {self.one_flow_bound} of them at once"
            if guess is not None:
                k, n = self.one_flow_bound, self.copy_len
                text += f" ({100 * (k + (n - k) * guess) / n:.1f} % accuracy with the rest guessed)"
        if self.routed < self.copy_len:
            text += "; the others must relay through positions that carry their own symbol"
        if cell and cell.get("acc_by_seed") and guess is not None:
            solved = ", ".join(f"{answers_solved(a, self.copy_len, guess):.1f}" for a in cell["acc_by_seed"].values())
            text += (f"; answers solved per seed at lr {cell.get('best_lr', 0):g} (test accuracy a -> "
                     f"S·(a − g)/(1 − g), g = {100 * guess:.1f} %): {solved}")
        return text


def answers_solved(acc: float, answers: int, guess: float) -> float:
    """Answer positions solved if the others are guessed at level ``guess``: inverts
    acc = (k + (answers − k)·guess) / answers."""
    return answers * (acc - guess) / (1 - guess)


def attach_seed_accuracies(cells: dict[tuple[str, str], dict[str, Any]], results: Sequence[dict[str, Any]]) -> None:
    """Add ``acc_by_seed`` (test accuracy per seed at the cell's chosen learning rate and width) to each cell."""
    for (label, column), cell in cells.items():
        runs = [r for r in results if r["label"] == label and r.get("column", r["task"]) == column
                and r["lr"] == cell["best_lr"] and r["d_model"] == cell["d_model"]]
        cell["acc_by_seed"] = {r["seed"]: r["test_acc"] for r in sorted(runs, key=lambda r: r["seed"])}


def copy_routes(label: str, mixer: torch.nn.Module, copy_len: int, offset: int,
                seq_len: int) -> CopyRoutes | None:
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
    return CopyRoutes(label=label, pattern=str(getattr(pattern, "name", pattern)), copy_len=copy_len, offset=offset,
                      free=len(free), hops=tuple(hops))


def _row_mixers(configs: Sequence[RunConfig], task_name: str):
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


def copy_routes_for_rows(configs: Sequence[RunConfig]) -> dict[str, CopyRoutes]:
    """Per row label with a copy run whose row mixer is a pattern recurrence: its :class:`CopyRoutes`."""
    out: dict[str, CopyRoutes] = {}
    for c, task, mixer in _row_mixers(configs, "copy"):
        routes = copy_routes(c.label, mixer, task.copy_len, task.shift, task.seq_len)
        if routes is not None:
            out[c.label] = routes
    return out



@dataclass(frozen=True)
class RecallReads:
    """Which MQAR queries one layer of a row's pattern recurrence can answer by one content-based read.

    In zoology's layout key_i sits at an even position p = 2i and value_i at p + 1; the queries come
    after the context, each at an even position q holding its key. Behind a token shift of window w
    (block 1 reads positions u − w + 1 .. u) the positions holding key_i *and* value_i are
    p + 1 .. p + w − 1: only p + 1 for w = 2, p + 1 and p + 2 for w = 3. A one-layer softmax over
    {q} ∪ N(q) can select the bound value by its key only when one of them is in {q} ∪ N(q). Relays do
    not help: a relay u chooses what it carries by its own token, before the query is known, and its
    score for q is computed from its own token (the mixer's k_j is a projection of the layer input),
    not from what y_u carries. ``direct`` counts the scored queries with such a read on the
    validation set; ``ceiling`` is the accuracy of solving those and guessing the rest uniformly
    among the context's values (a yardstick, not a proof: a model might guess better, e.g. by ruling
    out the value that a read of a neighbouring pair brings, or from the query's rank: queries come
    roughly in the keys' order, and that guess alone gets about 30 % at 4 pairs, length 32). Parity: with w = 2, q − (p + 1) is odd,
    and 2^k has one odd distance, 1; with w = 3, p + 2 adds the even distances.
    """

    label: str
    pattern: str
    num_kv_pairs: int
    answers: int   # scored queries of the validation set
    direct: int    # those whose value position is a neighbour of the query position

    @property
    def fraction(self) -> float:
        return self.direct / max(self.answers, 1)

    @property
    def ceiling(self) -> float:
        return self.fraction + (1 - self.fraction) / self.num_kv_pairs

    def describe(self, cell: dict[str, Any] | None = None) -> str:
        text = (f"{self.label} on assoc_recall: one layer of its pattern ({self.pattern}) reads the position holding "
                f"the queried key and its value (behind the token shift) for {self.direct} of the "
                f"{self.answers} validation queries ({100 * self.fraction:.1f} %); solving those and guessing the "
                f"rest among the {self.num_kv_pairs} context values gives {100 * self.ceiling:.1f} %")
        if cell is not None:
            text += f"; measured {100 * cell['acc_mean']:.1f} %"
        return text


def recall_reads(label: str, mixer: torch.nn.Module, data: Any, num_kv_pairs: int,
                 shift_window: int = 2) -> RecallReads | None:
    """:class:`RecallReads` of ``mixer``'s pattern on MQAR ``data`` behind a token shift of window
    ``shift_window`` (None when the mixer has no pattern)."""
    pattern = getattr(mixer, "pattern", None)
    if pattern is None or not hasattr(pattern, "neighbors"):
        return None
    n = data.inputs.shape[1]
    reads = [set(pattern.neighbors(q)) | {q} for q in range(n)]
    answers = direct = 0
    for inputs, scored in zip(data.inputs.tolist(), data.scored.tolist()):
        for q in (i for i, s in enumerate(scored) if s):
            p = inputs.index(inputs[q])  # the key's first occurrence: its place in the context
            answers += 1
            direct += any(u in reads[q] for u in range(p + 1, p + shift_window))
    return RecallReads(label=label, pattern=str(getattr(pattern, "name", pattern)), num_kv_pairs=num_kv_pairs,
                       answers=answers, direct=direct)


def shift_window(model_cfg: ModelConfig, row: str) -> int:
    """Window of the token shift in front of ``row``: the local attention just before its first layer;
    2 when there is none (the binding counted at the value position only, as before any shift)."""
    i = model_cfg.layers.index(row)
    if i == 0 or model_cfg.layers[i - 1] != "local_attention":
        return 2
    # the layer's config as the registry resolves it for the model (defaults, then the overrides)
    overrides = model_cfg.mixer_overrides.get("local_attention", {})
    return get_mixer_spec("local_attention").make_config(**overrides).window


def recall_reads_for_rows(configs: Sequence[RunConfig]) -> dict[str, RecallReads]:
    """Per row label with an MQAR run whose row mixer is a pattern recurrence: its :class:`RecallReads`
    on that run's validation set."""
    from tokenmix.training.harness import dataset

    out: dict[str, RecallReads] = {}
    for c, task, mixer in _row_mixers(configs, "assoc_recall"):
        reads = recall_reads(c.label, mixer, dataset(task, c.train.val_examples, c.train.val_seed), task.num_kv_pairs,
                             shift_window(c.model_config(), c.label))
        if reads is not None:
            out[c.label] = reads
    return out


def rows_and_tasks(configs: Sequence[RunConfig]) -> tuple[list[str], list[str]]:
    """Row labels and table columns (task names unless a run names its column) in the order they first appear in the sweep."""
    return list(dict.fromkeys(c.label for c in configs)), list(dict.fromkeys(c.column_name for c in configs))


def table_length(configs: Sequence[RunConfig]) -> int:
    return max(c.task_config().length for c in configs)


def facts_for_rows(configs: Sequence[RunConfig]) -> dict[str, StructureFacts]:
    """Structure facts per row label, for the model of the row's first run at the table length."""
    n = table_length(configs)
    out: dict[str, StructureFacts] = {}
    for c in configs:
        if c.label not in out:
            out[c.label] = structure_facts(c.label, c.model_config(), n)
    return out


def best_cells(summary: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (label, task): the summary row with the highest mean *validation* accuracy over widths (each
    already at its best learning rate by validation); the test accuracy is only reported."""
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for row in summary:
        key = (row["label"], row["column"])
        if key not in cells or row.get("val_mean", row["acc_mean"]) > cells[key].get("val_mean", cells[key]["acc_mean"]):
            cells[key] = row
    return cells


def throughput(results: Sequence[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Per row label: mean training tokens per wall second (one worker process, as loaded as the
    machine was) and per CPU second of the worker (what a free core gives)."""
    by: dict[str, list[tuple[float, float]]] = {}
    for r in results:
        by.setdefault(r["label"], []).append((r["tokens_per_s"], r.get("tokens_per_cpu_s", 0.0)))
    return {k: (statistics.fmean(w for w, _ in v), statistics.fmean(c for _, c in v)) for k, v in by.items()}


def acc_cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "—"
    return f"{100 * cell['acc_mean']:.1f} ± {100 * cell['acc_std']:.1f}"


TABLE_HEADER = ("mixer", "time/token", "MACs@n", "cache", "positions@n meas/der", "scalars@n meas/der", "path@n")


def table_rows(labels: Sequence[str], tasks: Sequence[str], facts: dict[str, StructureFacts],
               cells: dict[tuple[str, str], dict[str, Any]],
               tok_s: dict[str, tuple[float, float]]) -> tuple[list[str], list[list[str]]]:
    """Header and string cells of the comparison table."""
    header = [*TABLE_HEADER, *tasks, "train tok/s", "tok/CPU-s"]
    rows = []
    for label in labels:
        f = facts[label]
        mark = "" if f.cache_matches else " (!)"
        rows.append([
            label, f.time_complexity, str(f.flops_per_token), f.cache_complexity,
            f"{f.cache_positions_measured}/{f.cache_positions_derived}{mark}",
            f"{f.state_size_measured}/{f.state_size_derived}{mark}",
            _fmt_path(f.shortest_path),
            *[acc_cell(cells.get((label, t))) for t in tasks],
            f"{tok_s.get(label, (0.0, 0.0))[0]:,.0f}",
            f"{tok_s.get(label, (0.0, 0.0))[1]:,.0f}",
        ])
    return header, rows


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    esc = [[str(c).replace("|", "\\|") for c in r] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in esc]
    return "\n".join(lines)


def paper_comparison(labels: Sequence[str], cells: dict[tuple[str, str], dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Measured accuracy next to the paper's Table 1 for the rows the paper has."""
    header = ["mixer", "paper structure"]
    for t in PAPER_TASKS:
        header += [f"{t} (ours)", f"{t} (paper)"]
    rows = []
    for label in labels:
        paper = PAPER_TABLE.get(label)
        row = [label, paper["structure"] if paper else "—"]
        for t in PAPER_TASKS:
            row += [acc_cell(cells.get((label, t))), f"{paper[t]:.2f}" if paper else "—"]
        rows.append(row)
    return header, rows


def _acc(cells: dict[tuple[str, str], dict[str, Any]], label: str, task: str) -> float | None:
    c = cells.get((label, task))
    return None if c is None else c["acc_mean"]


WIDE_MARGIN = 0.20   # "by a wide margin"
CLOSE_MARGIN = 0.05  # "close to", "keeps"
GUESS_SLACK = 0.03   # a cell within this of a guessing baseline is "at guessing level"
CEILING = 0.99


def cell_diagnostics(key: tuple[str, str], cell: dict[str, Any], baselines: dict[str, dict[str, float]],
                     lrs: Sequence[float]) -> list[str]:
    """Facts about one measured cell that bear on why a comparison came out as it did, each computed
    from the runs: accuracy per answer group (which kinds of question it answers), at a guessing
    level, stopped by the step budget while still improving, best learning rate at the edge of the grid."""
    label, task = key
    out = []
    by_group = cell.get("acc_by_group") or {}
    if len(by_group) > 1:
        out.append(f"{label} on {task} by answer group (test, every question of the group, scored or only "
                   f"trained on): " + ", ".join(f"{g} {100 * a:.1f} %" for g, a in by_group.items()))
    acc = cell["acc_mean"]
    guess = baselines.get(task, {})
    if guess:
        name, level = max(guess.items(), key=lambda kv: kv[1])
        if acc <= level + GUESS_SLACK:
            out.append(f"{label} on {task} is at a guessing level ({100 * acc:.1f} % vs '{name}' "
                       f"{100 * level:.1f} %): it learned what an answer looks like, not how to find it")
    rising = cell.get("still_rising", 0)
    if rising:
        out.append(f"{label} on {task} was still improving when its {cell.get('max_steps', '?')}-step budget "
                   f"ended ({rising} of {cell.get('n_seeds', '?')} seeds): more steps may change it")
    grid = sorted(set(lrs))
    # with two learning rates both are edges: the note says something only for a longer grid
    if len(grid) > 2 and acc < CEILING and cell.get("best_lr") in (grid[0], grid[-1]):
        out.append(f"{label} on {task}: its best learning rate {cell['best_lr']:g} is at the edge of the grid "
                   f"{[f'{lr:g}' for lr in grid]}")
    return out


def _spread_note(a: tuple[str, str], b: tuple[str, str], cells: dict) -> str | None:
    ca, cb = cells[a], cells[b]
    diff = ca["acc_mean"] - cb["acc_mean"]
    spread = ca.get("acc_std", 0.0) + cb.get("acc_std", 0.0)
    if abs(diff) <= spread:
        return (f"{a[0]} − {b[0]} on {a[1]} is {100 * diff:+.1f} points, within the seeds' spread "
                f"(± {100 * ca.get('acc_std', 0.0):.1f}, ± {100 * cb.get('acc_std', 0.0):.1f})")
    return None


def _route_pair_note(a: CopyRoutes, b: CopyRoutes) -> str:
    """What the two rows' copy routes predict about their order."""
    if a.routed == b.routed == 0:
        return (f"neither {a.label} nor {b.label} routes any answer through free positions alone at this size: "
                "what they copy goes through relays that also carry their own symbol")
    if a.hop_counts() == b.hop_counts():
        return (f"the structure does not separate {a.label} and {b.label} on copy at this size: both route "
                f"{a.routed} of {a.copy_len} answers through free positions with the same hop counts, so their "
                "difference was learned (optimisation, gates), not imposed by the pattern")
    better = a if (a.routed, [-h for h in a.hop_counts()]) > (b.routed, [-h for h in b.hop_counts()]) else b

    def hops(r: CopyRoutes) -> str:
        return ", ".join(f"{c} in {h} hop(s)" for h, c in r.hop_counts().items()) or "none"
    return (f"the structure favours {better.label} on copy at this size: {a.label} routes {a.routed} ({hops(a)}), "
            f"{b.label} {b.routed} ({hops(b)}) of {a.copy_len} answers through free positions")


def qualitative_findings(cells: dict[tuple[str, str], dict[str, Any]],
                         baselines: dict[str, dict[str, float]] | None = None,
                         lrs: Sequence[float] = (),
                         routes: dict[str, CopyRoutes] | None = None,
                         reads: dict[str, RecallReads] | None = None) -> list[dict[str, Any]]:
    """The paper's qualitative claims (framework §5.1), each checked on the measured table.

    A claim is "holds", "does not hold" or "not measured" (a row or column is missing). Margins:
    "wide" = at least 20 points, "close" / "keeps" = within 5 points. ``why`` lists facts computed
    from the runs behind the claim's cells (guessing level, still improving at the end of the
    budget, learning rate at the grid edge, difference within the seeds' spread) that bear on a
    verdict; ``baselines`` (per column, ``TaskConfig.baselines()``) and ``lrs`` (the grid) enable
    the first and third. ``routes`` (:func:`copy_routes_for_rows`) adds, to claims on the copy column,
    what each pattern row's structure allows there (and whether it separates a compared pair);
    ``reads`` (:func:`recall_reads_for_rows`) does the same for the recall column.

    A claim whose cells are all at a guessing level is "untested": it compares guesses, and a
    "holds" there would report a finding that nothing measured.

    "Diagonal SSM lowest" is checked against every recurrence and attention, not local attention:
    in the paper's own table local attention (23.75 copy, 26.20 recall) is below the diagonal SSM
    (42.98, 32.53), so the paper's ladder is a claim about the recurrences.
    """
    baselines = baselines or {}
    routes = routes or {}
    reads = reads or {}

    def get(label, task):
        return _acc(cells, label, task)

    out = []

    def claim(text: str, needed: list[tuple[str, str]], test,
              pairs: Sequence[tuple[tuple[str, str], tuple[str, str]]] = (),
              explain: Sequence[tuple[str, str]] | None = None) -> None:
        vals = {k: get(*k) for k in needed}
        why: list[str] = []
        if any(v is None for v in vals.values()):
            verdict, detail = "not measured", ", ".join(f"{a}/{t}" for (a, t), v in vals.items() if v is None)
        else:
            verdict = "holds" if test(vals) else "does not hold"
            detail = ", ".join(f"{a} {t} {100 * v:.1f} ± {100 * cells[(a, t)].get('acc_std', 0.0):.1f}"
                               for (a, t), v in vals.items())
            for a, b in pairs:
                note = _spread_note(a, b, cells)
                if note:
                    why.append(note)
                if a[1] == b[1] == "copy" and a[0] in routes and b[0] in routes:
                    why.append(_route_pair_note(routes[a[0]], routes[b[0]]))
            if all(v >= CEILING for v in vals.values()):
                why.append(f"every cell is at the ceiling (≥ {100 * CEILING:.0f} %): this task does not separate "
                           "these rows at this size")
            levels = {t: max(baselines[t].values()) for (_, t) in vals if baselines.get(t)}
            if len(vals) > 1 and all(t in levels and v <= levels[t] + GUESS_SLACK for (_, t), v in vals.items()):
                verdict = "untested"
                why.append("every cell is at a guessing level: none of these rows learned the task within its budget, "
                           "so there is nothing to compare (untested, not holds)")
            for k in (needed if explain is None else explain):
                why += cell_diagnostics(k, cells[k], baselines, lrs)
                if k[1] == "copy" and k[0] in routes:
                    guess = max(baselines.get("copy", {}).values(), default=None)
                    why.append(routes[k[0]].describe(cells[k], guess))
                if k[1] == "assoc_recall" and k[0] in reads:
                    why.append(reads[k[0]].describe(cells[k]))
        out.append({"claim": text, "verdict": verdict, "measured": detail, "why": why})

    dense, att = ("dense_recurrence", "multi_hop"), ("attention", "multi_hop")
    claim("dense recurrence ≥ attention on multi-hop by a wide margin (≥ 20 points)", [dense, att],
          lambda v: v[dense] - v[att] >= WIDE_MARGIN, [(dense, att)])
    others = ["attention", "kth_order", "dense_recurrence", "pow2", "pow2_ce", "sq1", "sq1_ce"]
    for task in ("copy", "assoc_recall"):
        present = [o for o in others if get(o, task) is not None]
        diag = (DIAGONAL_SSM, task)
        nearest = min(present, key=lambda o: get(o, task)) if present and get(*diag) is not None else None
        claim(f"diagonal SSM ({DIAGONAL_SSM}) lowest on {task} (among attention and the recurrences)",
              [diag] + [(o, task) for o in present],
              lambda v, task=task, present=present: all(v[(DIAGONAL_SSM, task)] <= v[(o, task)] for o in present),
              [(diag, (nearest, task))] if nearest else [],
              explain=[diag, (nearest, task)] if nearest else [diag])
    sq1, pow2, attc = ("sq1", "copy"), ("pow2", "copy"), ("attention", "copy")
    claim("sq1 ≥ pow2 on copy", [sq1, pow2], lambda v: v[sq1] >= v[pow2], [(sq1, pow2)])
    claim("sq1 close to attention on copy (within 5 points)", [sq1, attc],
          lambda v: v[sq1] >= v[attc] - CLOSE_MARGIN, [(sq1, attc)])
    for base in ("pow2", "sq1"):
        ce, b = (f"{base}_ce", "copy"), (base, "copy")
        claim(f"{base}_ce costs copy accuracy ({base}_ce < {base})", [ce, b], lambda v, ce=ce, b=b: v[ce] < v[b],
              [(ce, b)])
        ce, b = (f"{base}_ce", "assoc_recall"), (base, "assoc_recall")
        claim(f"{base}_ce keeps recall ({base}_ce ≥ {base} − 5 points)", [ce, b],
              lambda v, ce=ce, b=b: v[ce] >= v[b] - CLOSE_MARGIN, [(ce, b)])
    return out


SOLVED = 0.90  # "solves" in the depth claim


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


def depth_rows(configs: Sequence[RunConfig]) -> tuple[list[str], dict[int, str], dict[str, int]]:
    """The rows the depth claim reads, recognised from their models: labels of the one-layer
    ``dense_recurrence`` / ``chacal`` rows, attention-only rows by layer count, and the number of
    state changes n of every entity-tracking column."""
    one_layer: list[str] = []
    attention: dict[int, str] = {}
    columns: dict[str, int] = {}
    for c in configs:
        if c.task != "entity_tracking":
            continue
        columns.setdefault(c.column_name, c.task_config().num_changes)
        layers = c.model_config().layers
        if len(layers) == 1 and layers[0] in ("dense_recurrence", "chacal") and c.label not in one_layer:
            one_layer.append(c.label)
        elif set(layers) == {"attention"}:
            attention.setdefault(len(layers), c.label)
    return one_layer, attention, columns


def depth_findings(cells: dict[tuple[str, str], dict[str, Any]], configs: Sequence[RunConfig],
                   lrs: Sequence[float] = ()) -> list[dict[str, Any]]:
    """ChaCAL's depth claim (framework §6.2, references §3) on an entity-tracking table.

    Per column with n state changes, bound b = ceil(log2(n + 1)): (1) a one-layer dense recurrence
    or ChaCAL solves it (≥ 90 %); (2) attention with fewer than b layers does not (each at least 20
    points below the better one-layer recurrence); and, as a measured fact rather than a claim (b is
    a lower bound), the fewest attention layers that reach 90 %. Rows are recognised from their
    models: one layer of ``dense_recurrence`` or ``chacal``, or only ``attention`` layers.
    """
    one_layer, attention, columns = depth_rows(configs)
    baselines = baselines_by_column(configs)
    out = []
    for col, n in columns.items():
        bound = math.ceil(math.log2(n + 1))
        rec = {lab: cells[(lab, col)] for lab in one_layer if (lab, col) in cells}
        att = {L: cells[(lab, col)] for L, lab in sorted(attention.items()) if (lab, col) in cells}
        if not rec or not att:
            out.append({"claim": f"{col}: depth effect", "verdict": "not measured", "measured": "", "why": []})
            continue
        best_rec = max(rec, key=lambda lab: rec[lab]["acc_mean"])
        # every one-layer row's facts, not only the best one's: a second row that fails needs its reason
        why = [w for lab, c in rec.items() for w in cell_diagnostics((lab, col), c, baselines, lrs)]
        detail = ", ".join(f"{lab} {100 * c['acc_mean']:.1f} ± {100 * c['acc_std']:.1f}" for lab, c in rec.items())
        out.append({"claim": f"{col}: a one-layer dense recurrence / ChaCAL solves {n} state changes (≥ 90 %)",
                    "verdict": "holds" if rec[best_rec]["acc_mean"] >= SOLVED else "does not hold",
                    "measured": detail, "why": why})
        shallow = {L: c for L, c in att.items() if L < bound}
        if shallow:
            ok = all(c["acc_mean"] <= rec[best_rec]["acc_mean"] - WIDE_MARGIN for c in shallow.values())
            why = [w for L, c in shallow.items() for w in cell_diagnostics((attention[L], col), c, baselines, lrs)]
            out.append({"claim": f"{col}: attention with fewer than ceil(log2({n} + 1)) = {bound} layers fails "
                                 f"(≥ 20 points below {best_rec})",
                        "verdict": "holds" if ok else "does not hold",
                        "measured": ", ".join(f"{L} layer(s) {100 * c['acc_mean']:.1f} ± {100 * c['acc_std']:.1f}"
                                              for L, c in shallow.items()), "why": why})
        reach = [L for L, c in att.items() if c["acc_mean"] >= SOLVED]
        deep = {L: c for L, c in att.items() if L >= bound}
        why = []
        if not reach and deep:
            # the bound says what depth permits, not what training finds: say which it was here
            steps = max(c.get("max_steps", 0) for c in deep.values())
            budget = f" within {steps} steps" if steps else ""
            why.append(f"attention with {', '.join(map(str, deep))} layer(s) (at or above the bound) did not solve it "
                       f"either{budget}: the bound permits a solution these runs did not find")
            why.append(f"a known solution needs {doubling_layers(n)} layers: pointer doubling with one-hot attention "
                       f"(L layers follow 2^L - 1 links; the ASK is {n + 1} links from the PUT)")
            why += [w for L, c in deep.items() for w in cell_diagnostics((attention[L], col), c, baselines, lrs)]
        out.append({"claim": f"{col}: fewest attention layers reaching 90 % (lower bound {bound})",
                    "verdict": f"{reach[0]} layers" if reach else f"none of 1..{max(att)}",
                    "measured": ", ".join(f"{L}: {100 * c['acc_mean']:.1f}" for L, c in att.items()), "why": why})
    return out


def all_findings(configs: Sequence[RunConfig], cells: dict[tuple[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """The paper's claims (when the table has a paper column) and the depth claims (when it has entity
    tracking), each explained from the runs; the same list goes to the report, summary.json and the terminal."""
    baselines = baselines_by_column(configs)
    lrs = sorted({c.train.lr for c in configs})
    out: list[dict[str, Any]] = []
    if any(c.column_name in PAPER_TASKS for c in configs):
        out += qualitative_findings(cells, baselines, lrs, copy_routes_for_rows(configs), recall_reads_for_rows(configs))
    if any(c.task == "entity_tracking" for c in configs):
        out += depth_findings(cells, configs, lrs)
    return out


# --------------------------------------------------------------------------------------- plots


def write_plots(out: Path, labels: Sequence[str], tasks: Sequence[str], facts: dict[str, StructureFacts],
                cells: dict[tuple[str, str], dict[str, Any]]) -> list[Path]:
    """accuracy_vs_cache.png and accuracy_vs_cost.png: one panel per task, one point per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (NullFormatter)

    paths = []
    n = next(iter(facts.values())).n
    for stem, xlabel, xval in (
        ("accuracy_vs_cache", f"decode cache at n={n} (scalars per sequence, measured)",
         lambda f: f.state_size_measured),
        ("accuracy_vs_cost", f"mixing multiply-adds per token at n={n} (derived)", lambda f: f.flops_per_token),
    ):
        fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.8), squeeze=False)
        for ax, task in zip(axes[0], tasks):
            for i, label in enumerate(labels):
                cell = cells.get((label, task))
                if cell is None:
                    continue
                x = max(xval(facts[label]), 1)
                ax.errorbar([x], [100 * cell["acc_mean"]], yerr=[100 * cell["acc_std"]], fmt="o",
                            color=plt.cm.tab10(i % 10), capsize=3, label=label)
                ax.annotate(label, (x, 100 * cell["acc_mean"]), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_ylim(-2, 102)
            ax.set_title(task)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.set_ylabel("test accuracy (%)")
            ax.grid(alpha=0.3)
        paths.append(_save_figure(fig, out, stem))
    return paths


def write_depth_plot(out: Path, configs: Sequence[RunConfig], cells: dict[tuple[str, str], dict[str, Any]]) -> list[Path]:
    """accuracy_vs_layers.png for a table with entity tracking and attention rows (else nothing).

    Per entity-tracking column: test accuracy on the deepest questions against the number of layers
    (attention as a line, the one-layer recurrences as points at 1), with the guessing level and the
    layer counts below the bound ceil(log2(n + 1)) shaded; below it, when the runs have answer groups,
    every row's accuracy by question depth.
    """
    one_layer, attention, columns = depth_rows(configs)
    columns = {col: n for col, n in columns.items() if any((lab, col) in cells for lab in attention.values())}
    if not columns:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    baselines = baselines_by_column(configs)
    deepest = {c.column_name: c.task_config().score_deepest for c in configs if c.column_name in columns}
    labels = one_layer + [attention[L] for L in sorted(attention)]
    by_depth = any(cells.get((lab, col), {}).get("acc_by_group") for lab in labels for col in columns)
    fig, axes = plt.subplots(2 if by_depth else 1, len(columns), figsize=(4.6 * len(columns), 7.2 if by_depth else 3.8),
                             squeeze=False)
    colors = {lab: plt.cm.tab10(i % 10) for i, lab in enumerate(labels)}
    for j, (col, n) in enumerate(columns.items()):
        ax, bound = axes[0][j], math.ceil(math.log2(n + 1))
        layers = [L for L in sorted(attention) if (attention[L], col) in cells]
        acc = [cells[(attention[L], col)] for L in layers]
        ax.errorbar(layers, [100 * c["acc_mean"] for c in acc], yerr=[100 * c["acc_std"] for c in acc], fmt="o-",
                    color="tab:gray", capsize=3, label="attention")
        for i, lab in enumerate(lab for lab in one_layer if (lab, col) in cells):
            c = cells[(lab, col)]
            ax.errorbar([1 + 0.08 * (i + 1)], [100 * c["acc_mean"]], yerr=[100 * c["acc_std"]], fmt="s",
                        color=colors[lab], capsize=3, label=lab)
        if baselines.get(col):
            ax.axhline(100 * max(baselines[col].values()), color="k", ls="--", lw=0.8, label="guessing level")
        if bound > 1:
            ax.axvspan(0.5, bound - 0.5, color="tab:red", alpha=0.08, label=f"below the bound ({bound} layers)")
        ax.set_xlim(0.5, max(layers + [bound]) + 0.5)
        ax.set_xticks(range(1, max(layers + [bound]) + 1))
        ax.set_ylim(-2, 102)
        ax.set_title(f"{col}: {'deepest' if deepest[col] else 'all'} questions")
        ax.set_xlabel("layers", fontsize=8)
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        if by_depth:
            ax = axes[1][j]
            names: list[str] = []
            for lab in labels:
                groups = cells.get((lab, col), {}).get("acc_by_group") or {}
                if groups:
                    ax.plot(range(len(groups)), [100 * a for a in groups.values()], marker="o", color=colors[lab], label=lab,
                            ls="-" if lab in one_layer else ":")
                    names = max(names, list(groups), key=len)
            ax.set_xticks(range(len(names)), names, fontsize=7)
            ax.set_ylim(-2, 102)
            ax.set_title(f"{col}: by question depth (d + 1 links)")
            ax.set_ylabel("test accuracy (%)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="lower left")
    return [_save_figure(fig, out, "accuracy_vs_layers")]


def _save_figure(fig, out: Path, stem: str) -> Path:
    """Write out/<stem>.png atomically (a temporary file, then a rename) and close the figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = out / f"{stem}.png"
    tmp = out / f".{stem}.tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


# -------------------------------------------------------------------------------------- report


@dataclass
class InvocationStats:
    """How one ``tokenmix compare`` invocation ran: wall and CPU time (this process and its worker
    processes), the machine's load average around it, workers and threads."""

    wall_seconds: float
    cpu_seconds: float
    trained: int
    skipped: int
    workers: int
    threads: int
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    cpu_count: int = 0

    def describe(self) -> str:
        # run_sweep trains in this process when there is at most one run to train or one worker
        if self.trained > 1 and self.workers > 1:
            who = f"this process and its {self.workers} worker processes, {self.threads} thread(s) each"
        elif self.trained:
            who = f"this process, {self.threads} thread(s)"
        else:
            who = "this process; nothing was trained"
        return (f"wall time {self.wall_seconds:.0f} s, CPU time {self.cpu_seconds:.0f} s ({who}); machine: "
                f"{self.cpu_count} cores, 1-min load average {self.load_before[0]:.1f} before and "
                f"{self.load_after[0]:.1f} after")


def baselines_by_column(configs: Sequence[RunConfig]) -> dict[str, dict[str, float]]:
    """Per table column: the guessing baselines of its task (``TaskConfig.baselines``)."""
    out: dict[str, dict[str, float]] = {}
    for c in configs:
        if c.column_name not in out:
            out[c.column_name] = c.task_config().baselines()
    return out


def _finding_lines(findings: list[dict[str, Any]]) -> list[str]:
    """Markdown bullets of verdicts, each with the computed facts behind it, then a blank line."""
    lines = []
    for f in findings:
        lines.append(f"- **{f['claim']}: {f['verdict']}** ({f['measured']})")
        lines += [f"  - {w}" for w in f["why"]]
    return lines + [""]


def report_markdown(preset: str, configs: Sequence[RunConfig], labels: Sequence[str], tasks: Sequence[str],
                    header: Sequence[str], rows: Sequence[Sequence[str]], cells: dict, summary: Sequence[dict],
                    stats: InvocationStats, plots: Sequence[Path], notes: str = "") -> str:
    """The Markdown report: measured table, the paper's table beside it, the claims checked with the
    computed facts behind each verdict, the preset's own notes, setup and every cell."""
    n = table_length(configs)
    seeds = sorted({c.seed for c in configs})
    lrs = sorted({c.train.lr for c in configs})
    baselines = baselines_by_column(configs)
    lines = [
        f"# tokenmix compare — preset `{preset}`",
        "",
        f"{len(configs)} runs ({stats.trained} trained now, {stats.skipped} finished before), {len(labels)} rows × "
        f"{len(tasks)} tasks × {len(lrs)} learning rate(s) {[f'{lr:g}' for lr in lrs]} × {len(seeds)} seeds. "
        f"This invocation: {stats.describe()}. The runs themselves, whenever they were trained: "
        f"{sum(s.get('train_cpu_seconds', 0.0) for s in summary):.0f} CPU seconds in their training steps "
        "(validation, data and process start-up not included).",
        "",
        "Accuracy: test accuracy (%) on the answer positions, mean ± std over seeds, at the learning rate "
        "(and width) with the best mean *validation* accuracy (zoology's max over learning rates; the "
        "validation and test sets come from their own seeds, and the test set chooses nothing). "
        f"Structure columns at n = {n}; cache measured after an n-token decode with `model.step`, summed "
        "over layers, next to the derived accounting ((!) marks a mismatch). Throughput: training tokens "
        "per wall second of one worker process (depends on the machine's load) and per CPU second of "
        "that process (what one free core gives), averaged over the row's runs.",
        "",
        "## Measured",
        "",
        markdown_table(header, rows),
        "",
    ]
    if any(t in PAPER_TASKS for t in tasks):
        ph, pr = paper_comparison(labels, cells)
        lines += ["## Next to the paper's Table 1 (framework.md §5.1)", "",
                  "Paper numbers as reproduced by the papernotes note; its task sizes, widths, depths and "
                  "steps are unknown, so only the ordering is comparable. The paper's \"Diagonal SSM\" "
                  f"(O(1) time and cache) is our `{DIAGONAL_SSM}` row.", "",
                  markdown_table(ph, pr), ""]
        findings = qualitative_findings(cells, baselines, lrs, copy_routes_for_rows(configs),
                                        recall_reads_for_rows(configs))
        lines += ["## The paper's qualitative findings, checked on this table", "",
                  "Each verdict is computed from the measured cells above. Below each claim: facts computed "
                  "from its runs that bear on the verdict (the explanation of a disagreement).", ""]
        lines += _finding_lines(findings)
    if any(c.task == "entity_tracking" for c in configs):
        findings = depth_findings(cells, configs, lrs)
        lines += ["## Depth: ChaCAL's claim checked on this table", "",
                  "Accuracy on the deepest questions (depth n) unless the task scores every depth; verdicts "
                  "computed from the cells above.", ""]
        lines += _finding_lines(findings)
    if notes.strip():
        lines += ["## Notes of the preset (its design, written before these numbers)", "", notes.strip(), ""]
    lines += ["## Setup", ""]
    for task in tasks:
        c = next(c for c in configs if c.column_name == task)
        targs = ", ".join(f"{k}={v}" for k, v in c.to_dict()["task_args"].items())
        guess = ", ".join(f"{k} {100 * v:.1f} %" for k, v in baselines[task].items())
        train = {k: v for k, v in c.to_dict()["train"].items() if k not in ("lr", "mode")}
        lines.append(f"- `{task}`: {targs}; guessing baselines: {guess}")
        lines.append("  - training: " + ", ".join(f"{k}={v}" for k, v in train.items()))
    for label in labels:
        c = next(c for c in configs if c.label == label)
        m = c.to_dict()["model"]
        shared = ", ".join(f"{k}={v}" for k, v in m.items() if k not in ("vocab_size", "layers", "mixer_overrides"))
        extra = f", mixer_overrides={m['mixer_overrides']}" if m.get("mixer_overrides") else ""
        lines.append(f"- row `{label}`: layers={'+'.join(m['layers'])}{extra}, {shared}, "
                     f"training mode={c.train.mode or 'default'}")
    lines.append(f"- seeds {seeds}; learning rates {[f'{lr:g}' for lr in lrs]}")
    lines += ["", "## Every (row, task, width)", "",
              "`val by lr` chooses the learning rate; `acc by lr` (test) is shown, never used to choose.", "",
              markdown_table(["row", "task", "d_model", "best lr", "acc mean", "acc std", "seeds", "val by lr",
                              "acc by lr", "mean steps", "still rising", "tok/s", "tok/CPU-s"],
                             [[s["label"], s["column"], str(s["d_model"]), f"{s['best_lr']:g}",
                               f"{100 * s['acc_mean']:.1f}", f"{100 * s['acc_std']:.1f}", str(s["n_seeds"]),
                               ", ".join(f"{k}: {100 * v:.1f}" for k, v in s.get("val_by_lr", {}).items()),
                               ", ".join(f"{k}: {100 * v:.1f}" for k, v in s["acc_by_lr"].items()),
                               f"{s['steps_mean']:.0f}", str(s.get("still_rising", 0)), f"{s['tokens_per_s']:,.0f}",
                               f"{s['tokens_per_cpu_s']:,.0f}"] for s in summary]),
              ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    lines += ["Per-run results: `results.csv`, `results.json`, `runs/<run_id>/`; resolved configs: `sweep.json`.", ""]
    return "\n".join(lines)
