"""The complexity–expressivity frontier on MQAR: accuracy against the decode state each row keeps,
against sequence length, and beyond the training length (zoology's figure, with the paper's rows).

What a frontier sweep is (``study/presets/frontier.py`` builds them): every run is one row (a mixer)
at one (training length L, width d) cell, MQAR with key-value pairs growing with L, column
``frontier_column(L, d)``, tested at L and at the multiples of L in ``train.test_lengths``. From the
finished results this module derives

    FrontierPoint   one (row, L, d): accuracy (mean ± std over seeds at the learning rate chosen by
                    validation, each seed's too), accuracy at 2L / 4L, training tokens per CPU-second,
                    the decode state of one mixer layer of the row at length L -- *measured*
                    (``peak_numel`` after an L-token decode with ``model.step``, per sequence) next to
                    its derived ``state_size(L)`` -- with the row's cache class (O(1), O(log n), O(√n),
                    O(n), ...), the ceiling its structure sets (the share of queries whose layer reads
                    the position holding key and value in one hop and within two: ``RecallReads``,
                    on the cell's validation set, behind the row's convolution) and how its runs
                    ended (steps, still rising at the end of the budget)

and checks the claims at the main cell (``MAIN_CELL`` when it was trained): first the calibration
against the anchors (zoology: attention solves MQAR at small width, here >= ``CALIBRATED_AT``), then
each claim with "holds" or "does not hold" and the seeds' spread. "untested" is kept for a claim
whose every row stayed at its guessing level for the whole budget: the runs show that those rows
did not learn within it, so there is nothing to compare, and the finding says so.

and writes the report section (table, findings) and three plots:
    frontier_accuracy_vs_state.png    (a) accuracy vs state scalars per mixer layer at the reference length
                                      (the one trained at the most widths), one point per row x width,
                                      coloured by cache class (the plot zoology's README shows)
    frontier_accuracy_vs_length.png   (b) accuracy vs training length per row at the widest width
    frontier_extrapolation.png        (c) accuracy at L, 2L and 4L per row (models without position codes)
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import matplotlib.pyplot as plt
import torch

from tokenmix.analysis.labels import label_points
from tokenmix.analysis.outputs import markdown_table
from tokenmix.models import MixerModel, ModelConfig
from tokenmix.models.reads import binding_window
from tokenmix.runs.synthetic import SyntheticRunConfig
from tokenmix.study.cells import CompareCells
from tokenmix.study.claims import CLOSE_MARGIN, GUESS_SLACK
from tokenmix.study.plots import save_plot
from tokenmix.study.report import ReportSection, finding_lines
from tokenmix.study.structure import decode_states
from tokenmix.study.table import RISING, RISING_NOTE
from tokenmix.study.theory import RecallReads, recall_reads
from tokenmix.tasks import READ_CLASSES
from tokenmix.training.synthetic import dataset, summarize

COLUMN = re.compile(r"^MQAR L=(\d+) d=(\d+)$")
READ_ABBREV = dict(zip(READ_CLASSES, ("value 1 hop", "window 1 hop", "2 hops", "not read")))
NATURAL = " natural"  # column suffix of a row trained without the grid's curriculum (the natural column)
SOLVED = 0.90  # "solves MQAR" (zoology's plots read near-perfect recall as solved)
MAIN_CELL = (64, 64)  # (L, d) where the claims are decided when the sweep trained it
CALIBRATED_AT = 0.95  # attention's accuracy at the main cell for the sweep to count as calibrated
O1_ROWS = ("first_order", "mamba2", "gla", "gated_deltanet")  # the O(1)-state rows the patterns must beat
PATTERN_ROWS = ("pow2", "pow2_ce", "sq1", "sq1_ce")
# cache classes in the order of the frontier (what the row keeps per layer as n grows)
CACHE_ORDER = ("O(1)", "O(k)", "O(w)", "O(log n)", "O(sqrt n)", "O(n)")


def frontier_column(length: int, width: int) -> str:
    """The table column of the cell (training length, width)."""
    return f"MQAR L={length} d={width}"


def parse_column(column: str) -> tuple[int, int] | None:
    m = COLUMN.match(column)
    return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass(frozen=True)
class LayerState:
    """Decode state of the row's own mixer layer at length n (per sequence, mean over its layers)."""

    scalars_measured: int
    scalars_derived: int
    positions_measured: int
    cache_class: str


@dataclass
class FrontierPoint:
    label: str
    length: int
    width: int
    acc: float
    acc_std: float
    n_seeds: int
    best_lr: float
    acc_at: dict[str, float] = field(default_factory=dict)  # {str(test length): accuracy}
    tokens_per_cpu_s: float = 0.0
    state: LayerState | None = None
    guess: float = 0.0  # the task's best guessing baseline (``TaskConfig.baselines``): no recall below it
    still_rising: int = 0  # runs of the cell stopped by their step budget while validation still rose
    acc_by_seed: dict[int, float] = field(default_factory=dict)
    best_val_by_seed: dict[int, float] = field(default_factory=dict)
    steps_mean: float = 0.0
    max_steps: int = 0
    reads: RecallReads | None = None  # the structure's ceiling on the cell's validation set
    # the same row trained on MQAR from the first step (the natural column; the same runs when the
    # grid's curriculum left the row's data unchanged), mean and std over seeds
    natural: tuple[float, float] | None = None
    # test accuracy and share of the queries per READ_CLASSES (mean over seeds)
    read_acc: dict[str, float] = field(default_factory=dict)
    read_share: dict[str, float] = field(default_factory=dict)
    curriculum: str = ""  # what the runs trained on before MQAR ("" for none)

    @property
    def seeds_off_plateau(self) -> int:
        """Seeds whose test accuracy left the guessing level (by GUESS_SLACK)."""
        return sum(a > self.guess + GUESS_SLACK for a in self.acc_by_seed.values())

    @property
    def learned(self) -> bool:
        """Whether any seed's best validation accuracy left the guessing level (by GUESS_SLACK)."""
        vals = self.best_val_by_seed.values() or [self.acc]
        return max(vals) > self.guess + GUESS_SLACK


def row_layer_state(label: str, model_cfg: ModelConfig, n: int, seed: int = 0) -> LayerState:
    """Decode n random tokens with ``model.step`` and read the measured peaks of the layers that are
    the row's own mixer (the label's name; else every layer that is not the first one's kind)."""
    model, states = decode_states(model_cfg, n, seed)
    own = [i for i, name in enumerate(model_cfg.layers) if name == label] or list(range(1, len(model_cfg.layers)))
    mixers = [model.blocks[i].mixer for i in own]
    return LayerState(
        scalars_measured=round(statistics.fmean(states[i].peak_numel for i in own)),
        scalars_derived=round(statistics.fmean(int(m.state_size(n)) for m in mixers)),
        positions_measured=round(statistics.fmean(states[i].peak_positions for i in own)),
        cache_class=str(mixers[0].cache_complexity),
    )


def row_reads(label: str, cfg: SyntheticRunConfig, seed: int = 0) -> RecallReads:
    """The row's :class:`RecallReads` on its run's validation set: its own mixer layer (the first one
    named by the label, else the second layer) behind the layer in front of it."""
    model_cfg = cfg.model_config()
    torch.manual_seed(seed)
    model = MixerModel(model_cfg)
    i = model_cfg.layers.index(label) if label in model_cfg.layers else 1
    task = cfg.task_config()
    data = dataset(task, cfg.train.val_examples, cfg.train.val_seed)
    return recall_reads(
        label, model.blocks[i].mixer, data, task.num_kv_pairs, binding_window(model_cfg, model_cfg.layers[i])
    )


def frontier_points(
    configs: Sequence[SyntheticRunConfig], results: Sequence[dict[str, Any]], measure_state: bool = True
) -> list[FrontierPoint]:
    """One point per (row, frontier column) that has finished runs (zoology's max over learning rates
    by validation, ``summarize``)."""
    by_key = {(c.label, c.column_name): c for c in configs}
    rows = summarize(results)
    by_row = {(r["label"], r["column"], r["d_model"]): r for r in rows}
    points, states = [], {}
    for row in rows:
        cell = parse_column(row["column"])
        if cell is None:
            continue
        length, width = cell
        runs = sorted(
            (
                r
                for r in results
                if r["label"] == row["label"]
                and r.get("column", r["task"]) == row["column"]
                and r["lr"] == row["best_lr"]
                and r["d_model"] == row["d_model"]
            ),
            key=lambda r: r["seed"],
        )
        p = FrontierPoint(
            row["label"],
            length,
            width,
            row["acc_mean"],
            row["acc_std"],
            row["n_seeds"],
            row["best_lr"],
            dict(row.get("acc_at", {})),
            row["tokens_per_cpu_s"],
            still_rising=row.get("still_rising", 0),
            acc_by_seed={r["seed"]: r["test_acc"] for r in runs},
            best_val_by_seed={r["seed"]: r["best_val_acc"] for r in runs},
            steps_mean=row["steps_mean"],
            max_steps=row["max_steps"],
        )
        p.read_acc, p.read_share = _mean_read_split(runs)
        natural = by_row.get((row["label"], row["column"] + NATURAL, row["d_model"]))
        cfg = by_key.get((row["label"], row["column"]))
        if natural is not None:
            p.natural = (natural["acc_mean"], natural["acc_std"])
        elif cfg is not None and not cfg.train.curriculum:
            p.natural = (p.acc, p.acc_std)  # no curriculum: these runs are the natural ones
        if cfg is not None:
            p.curriculum = "; ".join(phase.describe() for phase in cfg.train.curriculum)
            p.guess = max(cfg.task_config().baselines().values())
            p.reads = row_reads(row["label"], cfg)
        if measure_state and cfg is not None:
            key = (row["label"], length, width)
            if key not in states:
                states[key] = row_layer_state(row["label"], cfg.model_config(), length)
            p.state = states[key]
        points.append(p)
    return points


def _mean_read_split(runs: Sequence[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """Mean over runs of the test accuracy and share per read class (classes every run has)."""
    splits = [r.get("test_reads") or {} for r in runs]
    if not splits or not all(splits):
        return {}, {}
    share = {c: statistics.fmean(s["share"][c] for s in splits) for c in READ_CLASSES}
    acc = {c: statistics.fmean(s["acc"][c] for s in splits) for c in READ_CLASSES if all(c in s["acc"] for s in splits)}
    return acc, share


# ------------------------------------------------------------------------------------------ findings


def _get(points: Sequence[FrontierPoint], label: str, length: int, width: int) -> FrontierPoint | None:
    return next((p for p in points if (p.label, p.length, p.width) == (label, length, width)), None)


def reference_cell(points: Sequence[FrontierPoint]) -> tuple[int, int]:
    """(length, width) where the frontier is read: ``MAIN_CELL`` when it was trained, else the length
    trained at the most widths (ties: the longest), at its widest width."""
    if any((p.length, p.width) == MAIN_CELL for p in points):
        return MAIN_CELL
    widths: dict[int, set[int]] = {}
    for p in points:
        widths.setdefault(p.length, set()).add(p.width)
    length = max(widths, key=lambda n: (len(widths[n]), n))
    return length, max(widths[length])


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _seeds(p: FrontierPoint) -> str:
    per = ", ".join(_pct(a) for _, a in sorted(p.acc_by_seed.items()))
    return f"{p.label} {_pct(p.acc)} ± {_pct(p.acc_std)}" + (f" (seeds {per})" if len(p.acc_by_seed) > 1 else "")


def _margin_note(a: FrontierPoint, b: FrontierPoint, margin: float = 0.0) -> str:
    """How a comparison a > b (- margin) stands against the seeds' spread."""
    gap = a.acc - b.acc + margin
    spread = a.acc_std + b.acc_std
    where = "beyond" if abs(gap) > spread else "within"
    lo = min(a.acc_by_seed.values(), default=a.acc)
    hi = max(b.acc_by_seed.values(), default=b.acc)
    every = " every seed of the first above every seed of the second" if lo - hi + margin > 0 else ""
    return (
        f"{a.label} − {b.label}{f' + {_pct(margin)}' if margin else ''} = {gap * 100:+.1f} points, {where} the "
        f"seeds' spread (± {_pct(a.acc_std)}, ± {_pct(b.acc_std)}){';' + every if every else ''}"
    )


def _dominates(q: FrontierPoint, p: FrontierPoint) -> bool:
    """q keeps at most p's decode state and recalls more than p beyond the seeds' spread."""
    return q is not p and q.state.scalars_measured <= p.state.scalars_measured and q.acc - p.acc > q.acc_std + p.acc_std


def pareto_front(points: Sequence[FrontierPoint]) -> list[FrontierPoint]:
    """The points (with a measured state) no other point dominates (``_dominates``), by state."""
    pts = [p for p in points if p.state is not None]
    return sorted((p for p in pts if not any(_dominates(q, p) for q in pts)), key=lambda p: p.state.scalars_measured)


def frontier_findings(points: Sequence[FrontierPoint]) -> list[dict[str, Any]]:
    """The calibration and the claims a frontier sweep checks, at the reference cell (``MAIN_CELL``
    when trained), each with a verdict computed from the points -- holds / does not hold / untested
    (every row involved stayed at its guessing level for its whole budget: nothing learned to
    compare) / not measured -- the numbers with the seeds' spread, and the facts behind the verdict:
    each row's ceiling (direct reads in one hop / two), the rows that never left the guessing
    level, and the cells judged while still rising (``still_rising`` lists them)."""
    if not points:
        return []
    f = _Findings(points, *reference_cell(points))
    f.calibration()
    f.structure_claims()
    f.pareto()
    f.attention_above_patterns()
    return f.out


def _not_measured(text: str, measured: str) -> dict[str, Any]:
    return {"claim": text, "verdict": "not measured", "measured": measured, "why": [], "still_rising": []}


class _Findings:
    """The findings of one sweep at its reference cell (length, width), in the report's order."""

    def __init__(self, points: Sequence[FrontierPoint], length: int, width: int) -> None:
        self.points, self.length, self.width = points, length, width
        self.out: list[dict[str, Any]] = []

    def get(self, label: str) -> FrontierPoint | None:
        return _get(self.points, label, self.length, self.width)

    def finding(self, text: str, verdict: str, pts: Sequence[FrontierPoint], measured: str, why: list[str]) -> None:
        rising = [p.label for p in pts if p.still_rising]
        if rising:
            why.append(
                f"judged on cells still rising when their budget ended: {', '.join(rising)} (a lower bound "
                "on what those rows learn)"
            )
        self.out.append({"claim": text, "verdict": verdict, "measured": measured, "why": why, "still_rising": rising})

    def claim(self, text: str, labels: Sequence[str], test, pairs: Sequence[tuple[str, str, float]] = ()) -> None:
        """A claim over rows of the cell: ``test`` on their accuracies, the spread of ``pairs`` (a, b, margin)."""
        pts = {lab: self.get(lab) for lab in labels}
        if any(p is None for p in pts.values()):
            self.out.append(_not_measured(text, f"no runs for {', '.join(lab for lab, p in pts.items() if p is None)}"))
            return
        why = [f"at L={self.length}, d={self.width}; guessing level {_pct(max(p.guess for p in pts.values()))} %"]
        why += [_margin_note(pts[a], pts[b], m) for a, b, m in pairs]
        why += [f"{lab}: " + "; ".join(_facts(p)) for lab, p in pts.items()]
        verdict = "holds" if test({lab: p.acc for lab, p in pts.items()}) else "does not hold"
        if not any(p.learned for p in pts.values()):
            verdict = "untested"
            why.append(
                "every row here stayed at its guessing level for its whole budget: they did not learn within "
                "it, so there is nothing to compare"
            )
        self.finding(text, verdict, list(pts.values()), ", ".join(_seeds(p) for p in pts.values()), why)

    def calibration(self) -> None:
        """Against the anchors: zoology's attention solves MQAR at small width (here and at every length)."""
        att = self.get("attention")
        where = f"L={self.length}, d={self.width}"
        if att is None:
            self.out.append(
                _not_measured(
                    f"calibrated: attention ≥ {100 * CALIBRATED_AT:.0f} % at {where} (zoology)", "no attention runs"
                )
            )
        else:
            ok = att.acc >= CALIBRATED_AT
            short = (
                f"attention reached {_pct(att.acc)} % < {100 * CALIBRATED_AT:.0f} %: the budget or the "
                "recipe falls short of the anchor, and every claim below is read with that caveat"
            )
            self.finding(
                f"calibrated: attention ≥ {100 * CALIBRATED_AT:.0f} % at {where} (zoology: attention "
                "solves MQAR at small width)",
                "holds" if ok else "does not hold",
                [att],
                _seeds(att),
                [] if ok else [short],
            )
        cells = sorted((p for p in self.points if p.label == "attention"), key=lambda p: (p.length, p.width))
        if len({p.length for p in cells}) > 1:
            smallest = {n: min(p.width for p in cells if p.length == n) for n in {p.length for p in cells}}
            cells = [p for p in cells if p.width == smallest[p.length]]
            self.finding(
                "attention solves MQAR at every length at its smallest width (zoology; ≥ 90 %)",
                "holds" if all(p.acc >= SOLVED for p in cells) else "does not hold",
                cells,
                ", ".join(f"L={p.length} d={p.width}: {_pct(p.acc)}" for p in cells),
                [],
            )

    def structure_claims(self) -> None:
        """The patterns against the O(1) rows, the lattices against their exact patterns, log-linear
        against its base."""
        constant = [lab for lab in O1_ROWS if self.get(lab)]
        for base in ("pow2", "sq1"):
            if constant and self.get(base):
                best = max(constant, key=lambda lab: self.get(lab).acc)
                self.claim(
                    f"{base} recalls more than the best O(1)-state row ({', '.join(constant)}; best: {best})",
                    [base, best],
                    lambda a, b=base, o=best: a[b] > a[o],
                    [(base, best, 0.0)],
                )
        for base in ("pow2", "sq1"):
            self.claim(
                f"{base}_ce keeps {base}'s recall with its smaller cache ({base}_ce ≥ {base} − 5 points)",
                [f"{base}_ce", base],
                lambda a, b=base: a[f"{b}_ce"] >= a[b] - CLOSE_MARGIN,
                [(f"{base}_ce", base, CLOSE_MARGIN)],
            )
        for base, ext in (("mamba2", "log_linear_mamba2"), ("gated_deltanet", "log_linear_gated_deltanet")):
            self.claim(
                f"the log-linear extension improves {base}'s recall (Guo et al. 2025: Mamba-2 89.6 → 92.9, "
                "Gated DeltaNet 79.0 → 84.4 on their MQAR)",
                [ext, base],
                lambda a, b=base, e=ext: a[e] > a[b],
                [(ext, base, 0.0)],
            )

    def pareto(self) -> None:
        """The paper's trade: a pattern row on the accuracy-vs-state front (``pareto_front``)."""
        at_cell = [p for p in self.points if (p.length, p.width) == (self.length, self.width) and p.state is not None]
        patterns = [p for p in at_cell if p.label in PATTERN_ROWS]
        text = (
            "a pattern row is on the accuracy-vs-state Pareto front (the paper's trade: recall at equal or "
            "smaller decode state)"
        )
        needed = {p.label for p in at_cell} & {"attention", *O1_ROWS}
        if not patterns:
            return
        if "attention" not in needed or len(needed) < 2:
            self.out.append(
                _not_measured(text, "the front needs attention and at least one O(1)-state row beside the pattern rows")
            )
            return
        front = pareto_front(at_cell)
        on = [p for p in patterns if p in front]
        why = [
            f"at L={self.length}, d={self.width}: a row is off the front when another keeps at most its decode "
            "state and recalls more beyond the seeds' spread (mean − mean > std + std)"
        ]
        for p in patterns:
            if p not in front:
                by = ", ".join(q.label for q in at_cell if _dominates(q, p))
                why.append(f"{p.label} ({p.state.scalars_measured} scalars, {_pct(p.acc)} %) is dominated by {by}")
        verdict = "holds" if on else "does not hold"
        if not any(p.learned for p in patterns):
            verdict = "untested"
            why.append("every pattern row stayed at its guessing level: nothing to place on the front")
        measured = "front: " + ", ".join(
            f"{p.label} ({p.state.scalars_measured} scalars, {_pct(p.acc)} %)" for p in front
        )
        if on:
            measured += f"; pattern rows on it: {', '.join(p.label for p in on)}"
        self.finding(text, verdict, patterns, measured, why)

    def attention_above_patterns(self) -> None:
        patterns = [lab for lab in PATTERN_ROWS if self.get(lab)]
        text = "attention ≥ every pattern recurrence (O(n) cache above O(log n) / O(√n))"
        if not patterns:
            self.claim(text, ["attention", *PATTERN_ROWS], lambda a: True)
            return
        best = max(patterns, key=lambda lab: self.get(lab).acc)
        self.claim(
            text,
            ["attention", *patterns],
            lambda a: a["attention"] >= max(v for k, v in a.items() if k != "attention"),
            [("attention", best, 0.0)],
        )


def _facts(p: FrontierPoint) -> list[str]:
    """What the structure and the runs say about a row, for a claim's 'why'."""
    facts = []
    if p.reads is not None:
        facts.append(
            f"reads key and value in one hop for {_pct(p.reads.fraction)} % of the queries, within "
            f"two for {_pct(p.reads.two_hop_fraction)} %"
        )
    if p.state is not None:
        facts.append(f"{p.state.scalars_measured} state scalars per layer ({p.state.cache_class})")
    facts.append(f"{p.steps_mean:.0f} steps on average (budget {p.max_steps})")
    if not p.learned:
        facts.append("never left the guessing level")
    return facts


# ------------------------------------------------------------------------------------------ report


def frontier_table(points: Sequence[FrontierPoint]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one line per (row, L, d) with the structure's ceiling, accuracy (marked when
    a run was still rising at the end of its budget), extrapolation, state, steps and throughput."""
    mults = sorted({int(n) // p.length for p in points for n in p.acc_at if int(n) % p.length == 0})
    header = [
        "row",
        "L",
        "d",
        "cache class",
        "state/layer meas/der",
        "key+value in conv window: 1 / 2 hops %",
        "acc %",
        "off plateau",
        "natural acc %",
        "acc % by read (share %): " + " · ".join(READ_ABBREV[c] for c in READ_CLASSES),
        *[f"acc @{m}L %" for m in mults],
        "steps (budget)",
        "tok/CPU-s",
    ]
    rows = []
    for p in sorted(points, key=lambda p: (p.length, p.width)):
        st = p.state
        rows.append(
            [
                p.label,
                str(p.length),
                str(p.width),
                st.cache_class if st else "?",
                f"{st.scalars_measured}/{st.scalars_derived}" if st else "?",
                f"{_pct(p.reads.fraction)} / {_pct(p.reads.two_hop_fraction)}" if p.reads else "?",
                f"{_pct(p.acc)} ± {_pct(p.acc_std)}" + (f" {RISING}" if p.still_rising else ""),
                f"{p.seeds_off_plateau}/{len(p.acc_by_seed)}",
                f"{_pct(p.natural[0])} ± {_pct(p.natural[1])}" if p.natural else "—",
                " · ".join(
                    f"{_pct(p.read_acc[c]) if c in p.read_acc else '—'} ({_pct(p.read_share[c])})" for c in READ_CLASSES
                )
                if p.read_share
                else "—",
                *[f"{100 * p.acc_at[str(m * p.length)]:.1f}" if str(m * p.length) in p.acc_at else "—" for m in mults],
                f"{p.steps_mean:.0f} ({p.max_steps})",
                f"{p.tokens_per_cpu_s:,.0f}",
            ]
        )
    return header, rows


def _colour(cache_class: str):
    order = {c: i for i, c in enumerate(CACHE_ORDER)}
    return plt.cm.viridis(order.get(cache_class, len(CACHE_ORDER)) / len(CACHE_ORDER))


def write_frontier_plots(out: Path, points: Sequence[FrontierPoint]) -> list[Path]:
    """The three figures of the module docstring (those the points can fill)."""
    if not points:
        return []
    paths = []
    longest, _ = reference_cell(points)  # the length trained at the most widths
    at_longest = [p for p in points if p.length == longest and p.state is not None]
    if at_longest:
        fig, ax = plt.subplots(figsize=(8.5, 5.5))
        seen = set()
        for p in at_longest:
            cls = p.state.cache_class
            ax.errorbar(
                [max(p.state.scalars_measured, 1)],
                [100 * p.acc],
                yerr=[100 * p.acc_std],
                fmt="o",
                color=_colour(cls),
                capsize=2,
                label=cls if cls not in seen else None,
                markersize=4 + p.width / 16,
            )
            seen.add(cls)
        guess = 100 * max(p.guess for p in at_longest)
        ax.axhline(guess, color="grey", ls=":", lw=1, label="best guess")
        xs = [max(p.state.scalars_measured, 1) for p in at_longest]
        ax.set_xscale("log")
        ax.set_xlim(min(xs) / 2, max(xs) * 8)
        ax.set_ylim(-2, 102)
        ax.set_xlabel(f"decode state of one mixer layer at n={longest} (scalars per sequence, measured)")
        ax.set_ylabel("MQAR test accuracy (%)")
        ax.set_title(f"accuracy vs state size at L={longest} (marker size: width)")
        ax.grid(alpha=0.3)
        ax.legend(title="cache class", fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        label_points(
            ax,
            xs,
            [100 * p.acc for p in at_longest],
            [f"{p.label} d{p.width}" + (f" {RISING}" if p.still_rising else "") for p in at_longest],
            fontsize=6,
        )
        paths.append(save_plot(fig, out, "frontier_accuracy_vs_state", layout=False))
    widest = max(p.width for p in points)
    lengths = sorted({p.length for p in points if p.width == widest})
    labels = list(dict.fromkeys(p.label for p in points))
    if len(lengths) > 1:
        fig, ax = plt.subplots(figsize=(7.5, 5))
        for i, lab in enumerate(labels):
            pts = sorted((p for p in points if p.label == lab and p.width == widest), key=lambda p: p.length)
            if pts:
                ax.plot(
                    [p.length for p in pts],
                    [100 * p.acc for p in pts],
                    marker="o",
                    label=lab,
                    color=plt.cm.tab20(i % 20),
                )
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_ylim(-2, 102)
        ax.set_xlabel("training and test length L (key-value pairs grow with L)")
        ax.set_ylabel("MQAR test accuracy (%)")
        ax.set_title(f"accuracy vs length at d={widest}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
        paths.append(save_plot(fig, out, "frontier_accuracy_vs_length"))
    extra = [p for p in points if p.width == widest and p.acc_at]
    if extra:
        trained = sorted({p.length for p in extra})
        fig, axes = plt.subplots(1, len(trained), figsize=(4.5 * len(trained), 4.2), squeeze=False)
        for ax, length in zip(axes[0], trained):
            for i, lab in enumerate(labels):
                p = _get(extra, lab, length, widest)
                if p is None:
                    continue
                xs = [1] + [int(n) / length for n in p.acc_at]
                ys = [100 * p.acc] + [100 * v for v in p.acc_at.values()]
                ax.plot(xs, ys, marker="o", label=lab, color=plt.cm.tab20(i % 20))
            ax.set_xscale("log", base=2)
            ax.set_ylim(-2, 102)
            ax.set_title(f"trained at L={length}, d={widest}")
            ax.set_xlabel("test length / training length")
            ax.set_ylabel("MQAR test accuracy (%)")
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=6, ncol=2)
        paths.append(save_plot(fig, out, "frontier_extrapolation"))
    return paths


def frontier_section(out: Path, cc: CompareCells, plots: bool = True) -> ReportSection:
    """The frontier report section, its figures (under ``out``) and findings for a finished sweep."""
    points = frontier_points(cc.configs, cc.results)
    header, rows = frontier_table(points)
    findings = frontier_findings(points)
    figures = write_frontier_plots(out, points) if plots else []
    md = [
        "## The frontier: accuracy, state and length",
        "",
        "One line per (row, training length L, width d): the decode state of one of the row's mixer layers "
        "after an L-token decode (measured / derived scalars per sequence); the ceiling its structure sets "
        "(the share of validation queries whose layer reads a position of the convolution window holding the "
        "queried key and its value in one hop / within two: attention and the linear recurrences read "
        "every earlier position in one hop, so their limit is the state, not the reach); MQAR test accuracy "
        "at L under the preset's curriculum (mean ± std over seeds, learning rate chosen by validation), the "
        "seeds whose accuracy left the guessing level, the same row trained on MQAR from the first step "
        "(natural), the test accuracy split by how the row's layer reads each query's value (the value's "
        "position in one hop; only another position of its convolution window in one hop; within two hops; "
        "not within two) with each class's share of the queries, and at the longer test lengths "
        "(same checkpoint, no position code); the steps the runs took (mean; the maximum budget in "
        f"brackets) and training tokens per CPU-second. {RISING_NOTE}. The learning curves behind every "
        "cell: `learning_curves_*.png`.",
        "",
        markdown_table(rows, header).rstrip("\n"),
        "",
        "### Claims checked on the frontier",
        "",
    ]
    md += finding_lines(findings)
    return ReportSection("\n".join(md), figures, findings)
