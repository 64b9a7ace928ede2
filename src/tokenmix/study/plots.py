"""The compare run's figures: accuracy against derived cost and cache per task, and accuracy
against layers for the depth presets.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import matplotlib.ticker
import matplotlib.pyplot as plt

from tokenmix.analysis.outputs import save_figure
from tokenmix.runs.synthetic import SyntheticRunConfig
from tokenmix.study.claims import depth_rows
from tokenmix.study.structure import StructureFacts
from tokenmix.study.table import baselines_by_column


def write_plots(out: Path, labels: Sequence[str], tasks: Sequence[str], facts: dict[str, StructureFacts],
                cells: dict[tuple[str, str], dict[str, Any]]) -> list[Path]:
    """accuracy_vs_cache.png and accuracy_vs_cost.png: one panel per task, one point per row."""
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
        paths.append(save_plot(fig, out, stem))
    return paths


def write_depth_plot(out: Path, configs: Sequence[SyntheticRunConfig], cells: dict[tuple[str, str], dict[str, Any]]) -> list[Path]:
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
    return [save_plot(fig, out, "accuracy_vs_layers")]


def save_plot(fig, out: Path, stem: str) -> Path:
    """out/<stem>.png through the one figure writer (laid out first)."""
    fig.tight_layout()
    return save_figure(fig, out, stem, formats=("png",))[0]
