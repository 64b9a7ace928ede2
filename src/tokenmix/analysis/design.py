"""Pattern design explorer (``tokenmix design``): for a decode-cache and per-token-cost budget at length
n, which recurrence pattern gives the shortest information paths and the lowest congestion?

A researcher trades three things when choosing a pattern (framework §4): reads per token (decode
time), decode cache (positions kept) and the longest shortest information path (how many B-hops the
farthest pair needs). This module builds a space of candidate patterns, derives those three numbers
and the expressivity extras for each at one n, and keeps the Pareto front: the candidates no other
candidate matches or beats in all three (the training of the best ones lives in ``study/design.py``,
since analysis may not import training).

The space (every candidate is a pattern spec of ``tokenmix.patterns``, so the mixer, the CLI and a
run config name it the same way; families are ``f:EXPR`` specs in integer arithmetic):

    named   pow2, sq1, pow2_ce, sq1_ce, fenwick, first_order, dense and window:M (M in ``windows``)
    user    each ``--pattern SPEC`` (any spec; an ``f:EXPR`` also brings its lattice when one exists)
    geom:b  f(k) = ceil(b^k), b > 1 rational (b = p/q: -((-p**k)//q**k)); b = 2 is pow2. A base
            whose ceil(b^k) repeats a value (b = 1.25: 1, 2, 2) is not a strictly increasing f and is
            refused, naming the value.
    poly:p  f(k) = k^p + 1, integer p >= 1 (f:EXPR has integer arithmetic only, so no fractional
            powers); p = 2 is sq1, p = 1 dense
    mix:w+b a window then a geometric tail: f(k) = k + 1 for k < w, ceil(w b^(k - w + 1)) from k = w
            on (the indicator [k >= w] is 0**(w//(k+1)), f:EXPR having no comparisons)

Variants: every family member comes exact and as its cache-efficient lattice (Prop. 4.12). The
lattice of ``patterns.translation.Lattice`` is general: it is defined for any unbounded strictly
increasing f with f(0) = 1, which all three families satisfy (ceil(b^0) = 0^p + 1 = 1, the window
starts at 1). It is not defined for the bounded window:M / first_order, for dense (its lattice is
itself) nor for fenwick (position-dependent already, its cache is its neighbour set), nor for a
user f with f(0) > 1; those candidates are exact only (``variant`` says which).

Candidates that are the same pattern at this n (same distances f(k) <= n - 1, and for the lattice
the same steps a_k; a lattice whose a_k are all 1 is its exact pattern) are merged, the first one in
the order above keeping its name and listing the others in ``same_as`` (geom:2 is pow2).

Numbers per candidate, all exact, all from the pattern classes and ``analysis.expressivity`` (no
second implementation of any of them):

    cost        reads per token, |N(n - 1)| = ``Pattern.neighbors_per_token(n)``: what the mixer's
                ``flops_per_token`` counts (mean reads nnz(B) / n beside it)
    cache       ``Pattern.cache_size(n)``, the peak decode cache in positions (tests compare it with
                a measured decode)
    path        max / mean shortest information path over pairs j < i < n, and congestion of the copy
                at offset L (default n / 2), from ``expressivity.pattern_metrics``: translation-
                invariant patterns by the gap DP (exact at any n; congestion of the shared
                decomposition, d(L)), the others by the bitset BFS levels of ``hop_profile`` with the
                congestion lower bound ⌈Σ flow path lengths / (n − 1)⌉; for those on the front
                the shortest-path routing adds an upper bound (the slow part, so only there)
    reach       positions the last token reads within L hops (``--layers L``); the support through L
                stacked layers is recorded too, but every candidate that connects all pairs (all
                but an f whose gaps leave some distance unreachable) reaches all n in one layer, so
                it does not separate them

Front: non-dominated among the candidates within budget (cost <= max_cost, cache <= max_cache),
minimising (cost, cache, max path). Over-budget candidates get only cost and cache (their paths are
not needed and not computed).

The candidate space (families, named patterns, limits) is ``design_space.py``.
"""

from __future__ import annotations

import csv
import io
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from matplotlib.colors import LogNorm

from tokenmix.analysis.defaults import GRAPH_PATH_LIMIT
from tokenmix.analysis.design_space import Candidate, DesignSpace
from tokenmix.analysis.expressivity import UNREACHABLE, CommunicationGraph, pattern_metrics
from tokenmix.analysis.labels import label_points
from tokenmix.analysis.outputs import FIGURE_FORMATS, markdown_table, new_figure, save_figure, write_json
from tokenmix.core.errors import InputError
from tokenmix.core.files import atomic_write_text
from tokenmix.patterns import Lattice, Pattern, TranslationInvariant

# Sizes: the lattice graphs are n^2 / 8 bytes of bitsets a candidate and the gap DP of dense n^2 steps,
# so beyond 16384 a design run stops being interactive (docs/notes/design-measurements.md).
MAX_N = 16384
MAX_LAYERS = 64


# ----------------------------------------------------------------------------- one run
@dataclass(frozen=True)
class DesignRequest:
    """One design run: the length, the budgets (None = unbounded), the extras and the space.

    ``layers`` is the L of the reach column (positions the last token reads within L hops);
    ``offset`` the copy offset of the congestion (None = n // 2, as ``tokenmix analyze expressivity``);
    ``route_front``: also route the copy flows of non-translation-invariant front members along
    shortest paths (an upper bound on their congestion; n <= expressivity.GRAPH_PATH_LIMIT).
    """

    n: int = 4096
    max_cost: int | None = None
    max_cache: int | None = None
    layers: int = 4
    offset: int | None = None
    space: DesignSpace = field(default_factory=DesignSpace)
    route_front: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 2:
            raise InputError(f"--n must be an integer >= 2 (a path needs two positions), got {self.n}")
        if self.n > MAX_N:
            raise InputError(
                f"--n {self.n} is too large: the design space is evaluated up to n = {MAX_N} "
                "(the lattice graphs are n^2/8 bytes of bitsets per candidate, dense n^2 DP steps)"
            )
        for flag, v in (("--max-cost", self.max_cost), ("--max-cache", self.max_cache)):
            if v is not None and v < 0:
                raise InputError(f"{flag} must be >= 0, got {v}")
        if not 1 <= self.layers <= MAX_LAYERS:
            raise InputError(f"--layers must be in [1, {MAX_LAYERS}], got {self.layers}")
        if self.offset is not None and not 0 < self.offset < self.n:
            raise InputError(f"--offset must be in [1, n) = [1, {self.n}), got {self.offset}")

    @property
    def copy_offset(self) -> int:
        return self.offset if self.offset is not None else self.n // 2

    def settings(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "max_cost": self.max_cost,
            "max_cache": self.max_cache,
            "layers": self.layers,
            "offset": self.copy_offset,
            **self.space.settings(),
        }


@dataclass
class DesignRow:
    """A candidate's numbers at the request's n (None: not computed; see the module docstring)."""

    candidate: Candidate
    cost: int
    mean_reads: float
    cache: int
    in_budget: bool
    same_as: list[str] = field(default_factory=list)
    path_max: float | None = None
    path_mean: float | None = None
    congestion: float | None = None  # TI: shared decomposition; else routed (front only)
    congestion_lower: float | None = None
    congestion_worst: float | None = None  # TI: max over offsets L <= n/2
    reach_hops: int | None = None  # last token, within L hops
    reach_layers: int | None = None  # support through L stacked layers
    method: str = ""
    on_front: bool = False
    accuracy: float | None = None  # mean test accuracy over seeds (study/design.py)
    accuracy_std: float | None = None
    task: str | None = None
    # MQAR's ceiling (study/design.py, --train assoc_recall): shares of the task's queries whose layer
    # reads the position holding key and value in one hop / within two
    reads_one_hop: float | None = None
    reads_two_hops: float | None = None

    @property
    def name(self) -> str:
        return self.candidate.name

    def point(self) -> tuple[float, float, float]:
        """(cost, cache, max path): the three minimised coordinates."""
        return (float(self.cost), float(self.cache), math.inf if self.path_max is None else float(self.path_max))

    def record(self) -> dict[str, Any]:
        c = self.candidate
        return {
            "pattern": c.name,
            "family": c.family,
            "variant": c.variant,
            "spec": c.spec,
            "cache_efficient": c.cache_efficient,
            "f(k)": c.formula,
            "cost": self.cost,
            "mean_reads": round(self.mean_reads, 4),
            "cache": self.cache,
            "path_max": self.path_max,
            "path_mean": self.path_mean,
            "congestion": self.congestion,
            "congestion_lower": self.congestion_lower,
            "congestion_worst": self.congestion_worst,
            "reach_hops": self.reach_hops,
            "reach_layers": self.reach_layers,
            "in_budget": self.in_budget,
            "on_front": self.on_front,
            "same_as": ",".join(self.same_as),
            "task": self.task,
            "accuracy": self.accuracy,
            "accuracy_std": self.accuracy_std,
            "reads_one_hop": self.reads_one_hop,
            "reads_two_hops": self.reads_two_hops,
            "method": self.method,
        }


@dataclass
class DesignResult:
    request: DesignRequest
    rows: list[DesignRow]
    seconds: float = 0.0
    training: dict[str, Any] | None = None  # what study/design.py trained (task, runs, folder)

    @property
    def front(self) -> list[DesignRow]:
        """Front members, by cache, then cost, then max path."""
        return sorted((r for r in self.rows if r.on_front), key=lambda r: (r.cache, r.cost, r.point()[2], r.name))

    def row(self, name: str) -> DesignRow:
        for r in self.rows:
            if r.name == name or name in r.same_as:
                return r
        raise KeyError(name)


def pareto_front(points: Sequence[Sequence[float]]) -> list[int]:
    """Indices of the non-dominated points, every coordinate minimised (q dominates p: q <= p in every
    coordinate and q != p; equal points do not dominate each other).

    One pass in lexicographic order: a dominator sorts before what it dominates, and a dominated
    point's dominator is itself dominated by a kept point (transitivity), so comparing each point with
    the kept ones only is enough: O(m * front) instead of all pairs.
    """
    kept: list[int] = []
    for i in sorted(range(len(points)), key=lambda i: tuple(points[i])):
        p = tuple(points[i])
        if not any(all(a <= b for a, b in zip(points[j], p)) and tuple(points[j]) != p for j in kept):
            kept.append(i)
    return sorted(kept)


def _identity(pattern: Pattern, n: int) -> tuple:
    """What makes two candidates the same pattern at length n (module docstring)."""
    if isinstance(pattern, Lattice):
        dist = tuple(pattern.base.distances(n))
        if all(a == 1 for a in pattern.lattice_steps(len(dist))):
            return ("exact", dist)  # every lattice step 1: each level reads i - f(k) itself
        return ("lattice", dist)
    if isinstance(pattern, TranslationInvariant):
        return ("exact", tuple(pattern.distances(n)))
    return (pattern.name,)


def _finite(v: float) -> float:
    return math.inf if v >= UNREACHABLE else v


class _Tabled(Pattern):
    """A pattern whose neighbour lists are read once from its table: the copy routing of
    ``CommunicationGraph.route`` asks for them ~10^5 times at n = 4096 (``neighbors`` builds a table
    row per call). Everything else is the wrapped pattern's."""

    def __init__(self, pattern: Pattern, n: int) -> None:
        self.base, self.name = pattern, pattern.name
        self.distinct_levels, self.cache_is_neighbors = pattern.distinct_levels, pattern.cache_is_neighbors
        self._lists = [[int(j) for j in row if j >= 0] for row in pattern.neighbor_table(0, n).numpy()]

    def neighbors(self, t: int) -> list[int]:
        return self._lists[t]

    def n_levels(self, n: int) -> int:
        return self.base.n_levels(n)

    def _table_np(self, t):
        return self.base._table_np(t)

    def needed(self, t: int) -> list[int]:
        return self.base.needed(t)


def explore(req: DesignRequest, progress: Callable[[str], None] | None = None) -> DesignResult:
    """Every candidate's cost and cache, the metrics of those within budget, and the front."""
    start = time.perf_counter()
    say = progress or (lambda msg: None)
    n = req.n
    rows: list[DesignRow] = []
    patterns: dict[str, Pattern] = {}
    seen: dict[tuple, DesignRow] = {}
    for cand in req.space.candidates():
        pat = cand.pattern()
        key = _identity(pat, n)
        if key in seen:
            seen[key].same_as.append(cand.name)
            continue
        cost = pat.neighbors_per_token(n)
        cache = pat.cache_size(n)
        fits = (req.max_cost is None or cost <= req.max_cost) and (req.max_cache is None or cache <= req.max_cache)
        row = DesignRow(cand, cost, 0.0, cache, fits)
        seen[key] = row
        rows.append(row)
        patterns[cand.name] = pat
    inside = [r for r in rows if r.in_budget]
    if not inside:
        cheapest = min(rows, key=lambda r: (r.cache, r.cost))
        raise InputError(
            f"no candidate fits the budget (max cost {req.max_cost}, max cache {req.max_cache}) at "
            f"n = {n}: the smallest cache is {cheapest.cache} ({cheapest.name}, cost {cheapest.cost}), "
            f"the smallest cost {min(r.cost for r in rows)}"
        )
    say(f"design: {len(rows)} distinct candidates at n = {n}, {len(inside)} within budget")
    for i, row in enumerate(inside, 1):
        say(f"design: metrics {i}/{len(inside)} {row.name}")
        m = pattern_metrics(patterns[row.name], n, req.copy_offset, req.layers, max_hops=req.layers, routing=False)
        if m["neighbors_per_token"] != row.cost or m["cache"] != row.cache:
            raise RuntimeError(f"{row.name}: pattern_metrics disagrees with the pattern's cost/cache")
        row.mean_reads = m.get("nnz_B", 0) / n
        row.method = m["method"]
        if "path_max" not in m:
            continue  # skipped by a size guard of pattern_metrics (the method says which)
        row.path_max, row.path_mean = m["path_max"], m["path_mean"]
        row.congestion = m.get("congestion")
        row.congestion_lower = m.get("congestion_lower")
        row.congestion_worst = m.get("congestion_worst")
        reach = m["reach"]
        row.reach_hops = reach["within_hops"][req.layers - 1]
        row.reach_layers = reach["through_layers"][req.layers - 1]
    ranked = [r for r in inside if r.path_max is not None]
    for i in pareto_front([r.point() for r in ranked]):
        ranked[i].on_front = True
    if req.route_front:
        for row in ranked:
            pat = patterns[row.name]
            if not row.on_front or isinstance(pat, TranslationInvariant) or row.congestion is not None:
                continue
            if n > GRAPH_PATH_LIMIT:
                row.method += f"; no routed congestion (n > {GRAPH_PATH_LIMIT})"
                continue
            say(f"design: routing the copy flows of {row.name}")
            cong, _ = CommunicationGraph.from_pattern(_Tabled(pat, n), n).routed_congestion(req.copy_offset)
            row.congestion = _finite(cong)
            row.method += "; congestion: shortest-path routing (an upper bound)"
    return DesignResult(req, rows, time.perf_counter() - start)


# ----------------------------------------------------------------------------- outputs
FRONT_COLUMNS = (
    "pattern",
    "variant",
    "f(k)",
    "cost",
    "cache",
    "path_max",
    "path_mean",
    "congestion",
    "congestion_lower",
    "reach_hops",
    "same_as",
)


def table_rows(result: DesignResult, rows: Sequence[DesignRow] | None = None) -> list[dict[str, Any]]:
    """Display rows (the front by default), columns named for people."""
    L = result.request.layers
    out = []
    for r in result.front if rows is None else rows:
        rec = r.record()
        d = {
            "pattern": rec["pattern"],
            "variant": rec["variant"],
            "f(k)": rec["f(k)"] or "—",
            "cost": rec["cost"],
            "cache": rec["cache"],
            "path max": rec["path_max"],
            "path mean": rec["path_mean"],
            "congestion": rec["congestion"],
            "congestion ≥": rec["congestion_lower"],
            f"reach ≤{L} hops": rec["reach_hops"],
            "same as": rec["same_as"] or "—",
        }
        if result.training is not None:
            d["front"] = "yes" if r.on_front else "no"
            if r.reads_one_hop is not None:
                d["reads 1 / 2 hops %"] = f"{100 * r.reads_one_hop:.1f} / {100 * (r.reads_two_hops or 0):.1f}"
            spread = len(result.training.get("seeds", ())) > 1  # one seed has no spread to show
            d[f"{result.training['task']} acc %"] = (
                None
                if r.accuracy is None
                else f"{100 * r.accuracy:.1f}" + (f" ± {100 * (r.accuracy_std or 0):.1f}" if spread else "")
            )
        out.append(d)
    return out


def shown_rows(result: DesignResult) -> list[DesignRow]:
    """The front, then the trained rows that are not on it."""
    extra = [r for r in result.rows if r.accuracy is not None and not r.on_front]
    return result.front + sorted(extra, key=lambda r: (r.point()[2], r.cost, r.name))


def csv_text(result: DesignResult) -> str:
    buf = io.StringIO()
    recs = [r.record() for r in result.rows]
    writer = csv.DictWriter(buf, fieldnames=list(recs[0]))
    writer.writeheader()
    writer.writerows(recs)
    return buf.getvalue()


def plot_front(result: DesignResult, out_dir: Path, formats: Sequence[str] = FIGURE_FORMATS) -> list[Path]:
    """Left: cost vs cache of every candidate (log axes), marker colour = max path, the front with black
    edges, named patterns as squares with their names, over-budget candidates as grey dots (named
    ones labelled in grey). Right: the same candidates as cache vs max path, where the front (whose
    members mostly sit on the cost ~ cache diagonal) separates."""
    req = result.request
    fig, axes = new_figure(1, 2, size=(6.0, 4.8))
    ax, ax_p = axes[0]
    done = [r for r in result.rows if r.path_max is not None]
    finite = [r.path_max for r in done if math.isfinite(r.path_max)]
    norm = LogNorm(vmin=1, vmax=max(2.0, max(finite, default=2.0)))
    over = [r for r in result.rows if not r.in_budget]
    if over:
        ax.scatter(
            [max(r.cost, 1) for r in over],
            [max(r.cache, 1) for r in over],
            s=10,
            c="0.75",
            marker=".",
            label="over budget (paths not computed)",
        )
    mappable = None
    for front in (False, True):
        for named in (False, True):
            pts = [
                r
                for r in done
                if r.on_front == front and (r.candidate.family == "named") == named and math.isfinite(r.path_max)
            ]
            if not pts:
                continue
            style = dict(
                c=[r.path_max for r in pts],
                cmap="viridis",
                norm=norm,
                marker="s" if named else "o",
                s=64 if front else 22,
                edgecolors="black" if front else "none",
                linewidths=1.1,
                alpha=1.0 if front else 0.55,
                zorder=3 if front else 2,
            )
            label = ("front" if front else "dominated") + (", named" if named else "")
            mappable = ax.scatter([max(r.cost, 1) for r in pts], [max(r.cache, 1) for r in pts], label=label, **style)
            ax_p.scatter([max(r.cache, 1) for r in pts], [r.path_max for r in pts], **style)
    unreachable = [r for r in done if not math.isfinite(r.path_max)]
    if unreachable:
        ax.scatter(
            [max(r.cost, 1) for r in unreachable],
            [max(r.cache, 1) for r in unreachable],
            marker="x",
            c="red",
            label="some pair has no path",
        )
    if req.max_cost is not None:
        ax.axvline(max(req.max_cost, 1), ls="--", lw=0.8, c="0.4")
    if req.max_cache is not None:
        ax.axhline(max(req.max_cache, 1), ls="--", lw=0.8, c="0.4")
        ax_p.axvline(max(req.max_cache, 1), ls="--", lw=0.8, c="0.4")
    for a in (ax, ax_p):
        a.set_xscale("log", base=2)
        a.set_yscale("log", base=2)
    ax.set_xlabel("cost: reads per token")
    ax.set_ylabel("decode cache (positions)")
    ax_p.set_xlabel("decode cache (positions)")
    ax_p.set_ylabel("max shortest path (hops)")
    budget = ", ".join(f"{k} ≤ {v}" for k, v in (("cost", req.max_cost), ("cache", req.max_cache)) if v is not None)
    ax.set_title(f"pattern design space at n = {req.n}" + (f" ({budget})" if budget else ""), fontsize=9)
    ax_p.set_title("within budget: cache vs max path (front: black edge)", fontsize=9)
    if mappable is not None:
        fig.colorbar(mappable, ax=ax_p, label="max shortest path (hops)")
    ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    # names placed where no other name or marker is (leader lines when pushed away): the front and
    # the named patterns, and the named ones over budget in grey
    labelled = sorted((r for r in done if r.candidate.family == "named" or r.on_front), key=lambda r: (r.cost, r.cache))
    named_over = [r for r in over if r.candidate.family == "named"]
    label_points(
        ax,
        [max(r.cost, 1) for r in labelled + named_over],
        [max(r.cache, 1) for r in labelled + named_over],
        [r.name for r in labelled + named_over],
        fontsize=6,
    )
    finite_rows = [r for r in labelled if math.isfinite(r.path_max)]
    label_points(
        ax_p,
        [max(r.cache, 1) for r in finite_rows],
        [r.path_max for r in finite_rows],
        [r.name for r in finite_rows],
        fontsize=6,
    )
    return save_figure(fig, out_dir, "design_front", formats)


def write_outputs(
    result: DesignResult, out_dir: Path, formats: Sequence[str] = FIGURE_FORMATS, plots: bool = True
) -> list[Path]:
    """design.json (settings, every row, the front), design.csv (every row), design.md (the front
    table) and the figure; returns the files written."""
    out_dir = Path(out_dir)
    figures = plot_front(result, out_dir, formats) if plots else []
    data = {
        "kind": "design",
        "settings": result.request.settings(),
        "seconds": result.seconds,
        "front": [r.name for r in result.front],
        "rows": [r.record() for r in result.rows],
        "training": result.training,
        "figures": [p.name for p in figures],
    }
    files = [write_json(out_dir / "design.json", data)]
    files.append(atomic_write_text(out_dir / "design.csv", csv_text(result)))
    req = result.request
    md = [
        f"# Pattern design front at n = {req.n}",
        "",
        f"Budget: max cost {req.max_cost}, max cache {req.max_cache}; reach within {req.layers} hops; "
        f"congestion of the copy at offset {req.copy_offset} (translation-invariant: shared decomposition, "
        "exact; others: shortest-path routing, an upper bound; ≥: the lower bound).",
        "",
        markdown_table(table_rows(result, shown_rows(result))),
    ]
    files.append(atomic_write_text(out_dir / "design.md", "\n".join(md)))
    return files + figures
