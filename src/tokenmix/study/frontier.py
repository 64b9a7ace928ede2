"""The complexity–expressivity frontier on MQAR: accuracy against the decode state each row keeps,
against sequence length, and beyond the training length (zoology's figure, with the paper's rows).

What a frontier sweep is (``study/presets/frontier.py`` builds them): every run is one row (a mixer)
at one (training length L, width d) cell, MQAR with key-value pairs growing with L, column
``frontier_column(L, d)``, tested at L and at the multiples of L in ``train.test_lengths``. From the
finished results this module derives

    FrontierPoint   one (row, L, d): accuracy (mean ± std over seeds at the learning rate chosen by
                    validation), accuracy at 2L / 4L, training tokens per CPU-second, and the decode
                    state of one mixer layer of the row at length L -- *measured* (``peak_numel`` after
                    an L-token decode with ``model.step``, per sequence) next to its derived
                    ``state_size(L)`` -- with the row's cache class (O(1), O(log n), O(√n), O(n), ...)

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

from tokenmix.models import ModelConfig
from tokenmix.runs.synthetic import SyntheticRunConfig
from tokenmix.analysis.outputs import markdown_table
from tokenmix.study.claims import CLOSE_MARGIN, GUESS_SLACK
from tokenmix.study.plots import save_plot
from tokenmix.study.report import ReportSection, finding_lines
from tokenmix.study.structure import decode_states
from tokenmix.training.synthetic import summarize

COLUMN = re.compile(r"^MQAR L=(\d+) d=(\d+)$")
SOLVED = 0.90  # "solves MQAR" (zoology's plots read near-perfect recall as solved)
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
    acc_at: dict[str, float] = field(default_factory=dict)   # {str(test length): accuracy}
    tokens_per_cpu_s: float = 0.0
    state: LayerState | None = None
    guess: float = 0.0     # the task's best guessing baseline (``TaskConfig.baselines``): no recall below it
    still_rising: int = 0  # runs of the cell stopped by their step budget while validation still rose


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
        cache_class=str(mixers[0].cache_complexity))


def frontier_points(configs: Sequence[SyntheticRunConfig], results: Sequence[dict[str, Any]],
                    measure_state: bool = True) -> list[FrontierPoint]:
    """One point per (row, frontier column) that has finished runs (zoology's max over learning rates
    by validation, ``summarize``)."""
    by_key = {(c.label, c.column_name): c for c in configs}
    points, states = [], {}
    for row in summarize(results):
        cell = parse_column(row["column"])
        if cell is None:
            continue
        length, width = cell
        p = FrontierPoint(row["label"], length, width, row["acc_mean"], row["acc_std"], row["n_seeds"],
                          row["best_lr"], dict(row.get("acc_at", {})), row["tokens_per_cpu_s"],
                          still_rising=row.get("still_rising", 0))
        cfg = by_key.get((row["label"], row["column"]))
        if cfg is not None:
            p.guess = max(cfg.task_config().baselines().values())
        if measure_state and cfg is not None:
            key = (row["label"], length, width)
            if key not in states:
                states[key] = row_layer_state(row["label"], cfg.model_config(), length)
            p.state = states[key]
        points.append(p)
    return points


# ------------------------------------------------------------------------------------------ findings


def _get(points: Sequence[FrontierPoint], label: str, length: int, width: int) -> FrontierPoint | None:
    return next((p for p in points if (p.label, p.length, p.width) == (label, length, width)), None)


def reference_cell(points: Sequence[FrontierPoint]) -> tuple[int, int]:
    """(length, width) where the frontier is read: the length trained at the most widths (ties: the
    longest), at its widest width."""
    widths: dict[int, set[int]] = {}
    for p in points:
        widths.setdefault(p.length, set()).add(p.width)
    length = max(widths, key=lambda n: (len(widths[n]), n))
    return length, max(widths[length])


def frontier_findings(points: Sequence[FrontierPoint]) -> list[dict[str, Any]]:
    """The paper's and the anchors' claims that a frontier sweep can check, at the reference cell,
    each with a verdict computed from the points -- holds / does not hold / untested (every row
    involved at its guessing level: nothing learned to compare) / not measured -- and the numbers."""
    if not points:
        return []
    length, width = reference_cell(points)
    out = []

    def claim(text: str, labels: Sequence[str], test) -> None:
        pts = {lab: _get(points, lab, length, width) for lab in labels}
        if any(p is None for p in pts.values()):
            missing = ", ".join(lab for lab, p in pts.items() if p is None)
            out.append({"claim": text, "verdict": "not measured", "measured": f"no runs for {missing}", "why": []})
            return
        acc = {lab: p.acc for lab, p in pts.items()}
        detail = ", ".join(f"{lab} {100 * p.acc:.1f} ± {100 * p.acc_std:.1f}" for lab, p in pts.items())
        why = [f"at L={length}, d={width}; guessing level {100 * max(p.guess for p in pts.values()):.1f} %"]
        for lab, p in pts.items():
            if p.state is not None:
                why.append(f"{lab}: {p.state.scalars_measured} state scalars per layer ({p.state.cache_class})"
                           + (f"; {p.still_rising} run(s) still rising at the end" if p.still_rising else ""))
        verdict = "holds" if test(acc) else "does not hold"
        if all(p.acc <= p.guess + GUESS_SLACK for p in pts.values()):
            verdict = "untested"
            why.append("every row here is at its guessing level: nothing was learned to compare")
        out.append({"claim": text, "verdict": verdict, "measured": detail, "why": why})

    # zoology: attention solves MQAR at small width at every length -- checked at every length trained
    att = sorted((p for p in points if p.label == "attention"), key=lambda p: (p.length, p.width))
    if att:
        smallest = {n: min(p.width for p in att if p.length == n) for n in {p.length for p in att}}
        cells = [p for p in att if p.width == smallest[p.length]]
        out.append({"claim": "attention solves MQAR at every length at its smallest width (zoology; ≥ 90 %)",
                    "verdict": "holds" if all(p.acc >= SOLVED for p in cells) else "does not hold",
                    "measured": ", ".join(f"L={p.length} d={p.width}: {100 * p.acc:.1f}" for p in cells),
                    "why": [f"L={p.length}: {p.still_rising} run(s) still rising at the end of their budget"
                            for p in cells if p.still_rising]})
    structured = [lab for lab in ("pow2", "sq1") if _get(points, lab, length, width)]
    constant = [lab for lab in ("first_order", "mamba2", "gla", "gated_deltanet") if _get(points, lab, length, width)]
    if structured and constant:
        claim(f"the structured patterns ({', '.join(structured)}) recall more than the best O(1)-state row "
              f"({', '.join(constant)})", structured + constant,
              lambda a: min(a[s] for s in structured) > max(a[c] for c in constant))
    for base in ("pow2", "sq1"):
        claim(f"{base}_ce keeps {base}'s recall with its smaller cache ({base}_ce ≥ {base} − 5 points)",
              [f"{base}_ce", base], lambda a, b=base: a[f"{b}_ce"] >= a[b] - CLOSE_MARGIN)
    claim("attention ≥ every pattern recurrence (O(n) cache above O(log n) / O(√n))",
          ["attention", "pow2", "pow2_ce", "sq1", "sq1_ce"],
          lambda a: a["attention"] >= max(v for k, v in a.items() if k != "attention"))
    for base, ext in (("mamba2", "log_linear_mamba2"), ("gated_deltanet", "log_linear_gated_deltanet")):
        claim(f"the log-linear extension improves {base}'s recall (Guo et al. 2025: Mamba-2 89.6 → 92.9, "
              "Gated DeltaNet 79.0 → 84.4 on their MQAR)", [ext, base], lambda a, b=base, e=ext: a[e] > a[b])
    return out


# ------------------------------------------------------------------------------------------ report


def frontier_table(points: Sequence[FrontierPoint]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one line per (row, L, d) with accuracy, extrapolation, state and throughput."""
    mults = sorted({int(n) // p.length for p in points for n in p.acc_at if int(n) % p.length == 0})
    header = ["row", "L", "d", "cache class", "state/layer meas/der", "acc %",
              *[f"acc @{m}L %" for m in mults], "tok/CPU-s"]
    rows = []
    for p in sorted(points, key=lambda p: (p.length, p.width)):
        st = p.state
        rows.append([p.label, str(p.length), str(p.width), st.cache_class if st else "?",
                     f"{st.scalars_measured}/{st.scalars_derived}" if st else "?",
                     f"{100 * p.acc:.1f} ± {100 * p.acc_std:.1f}",
                     *[f"{100 * p.acc_at[str(m * p.length)]:.1f}" if str(m * p.length) in p.acc_at else "—"
                       for m in mults],
                     f"{p.tokens_per_cpu_s:,.0f}"])
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
        fig, ax = plt.subplots(figsize=(7.5, 5))
        seen = set()
        for p in at_longest:
            cls = p.state.cache_class
            ax.errorbar([max(p.state.scalars_measured, 1)], [100 * p.acc], yerr=[100 * p.acc_std], fmt="o",
                        color=_colour(cls), capsize=2, label=cls if cls not in seen else None,
                        markersize=4 + p.width / 16)
            seen.add(cls)
            ax.annotate(f"{p.label} d{p.width}", (max(p.state.scalars_measured, 1), 100 * p.acc), fontsize=6,
                        xytext=(3, 2), textcoords="offset points")
        ax.axhline(100 * max(p.guess for p in at_longest), color="grey", ls=":", lw=1)
        ax.annotate("best guess", (ax.get_xlim()[0], 100 * max(p.guess for p in at_longest)), fontsize=7,
                    color="grey", xytext=(2, 2), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_ylim(-2, 102)
        ax.set_xlabel(f"decode state of one mixer layer at n={longest} (scalars per sequence, measured)")
        ax.set_ylabel("MQAR test accuracy (%)")
        ax.set_title(f"accuracy vs state size at L={longest} (marker size: width)")
        ax.grid(alpha=0.3)
        ax.legend(title="cache class", fontsize=7)
        paths.append(save_plot(fig, out, "frontier_accuracy_vs_state"))
    widest = max(p.width for p in points)
    lengths = sorted({p.length for p in points if p.width == widest})
    labels = list(dict.fromkeys(p.label for p in points))
    if len(lengths) > 1:
        fig, ax = plt.subplots(figsize=(7.5, 5))
        for i, lab in enumerate(labels):
            pts = sorted((p for p in points if p.label == lab and p.width == widest), key=lambda p: p.length)
            if pts:
                ax.plot([p.length for p in pts], [100 * p.acc for p in pts], marker="o", label=lab,
                        color=plt.cm.tab20(i % 20))
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


def frontier_section(out: Path, configs: Sequence[SyntheticRunConfig], results: Sequence[dict[str, Any]],
                     plots: bool = True) -> ReportSection:
    """The frontier report section, its figures (under ``out``) and findings for a finished sweep."""
    points = frontier_points(configs, results)
    header, rows = frontier_table(points)
    findings = frontier_findings(points)
    figures = write_frontier_plots(out, points) if plots else []
    md = ["## The frontier: accuracy, state and length", "",
          "One line per (row, training length L, width d): MQAR test accuracy at L (mean ± std over seeds, "
          "learning rate chosen by validation), at the longer test lengths (same checkpoint, no position "
          "code), the decode state of one of the row's mixer layers after an L-token decode (measured / "
          "derived scalars per sequence) and training tokens per CPU-second.", "",
          markdown_table(rows, header).rstrip("\n"), "", "### Claims checked on the frontier", ""]
    md += finding_lines(findings)
    return ReportSection("\n".join(md), figures, findings)
