"""The compare run's figures: accuracy against derived cost and cache per task, accuracy against
layers for the depth presets, and every row's learning curves per table column.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.ticker

from tokenmix.analysis.labels import label_points
from tokenmix.analysis.outputs import save_figure
from tokenmix.study.cells import CompareCells
from tokenmix.study.claims import depth_rows


def write_plots(out: Path, cc: CompareCells) -> list[Path]:
    """accuracy_vs_cache.png and accuracy_vs_cost.png: one panel per task, one point per row."""
    labels, tasks, facts, cells = cc.labels, cc.columns, cc.facts, cc.cells
    paths = []
    n = cc.n
    for stem, xlabel, xval in (
        (
            "accuracy_vs_cache",
            f"decode cache at n={n} (scalars per sequence, measured)",
            lambda f: f.state_size_measured,
        ),
        ("accuracy_vs_cost", f"mixing multiply-adds per token at n={n} (derived)", lambda f: f.flops_per_token),
    ):
        fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.8), squeeze=False)
        placed = []
        for ax, task in zip(axes[0], tasks):
            xs, ys, names = [], [], []
            for i, label in enumerate(labels):
                cell = cells.get((label, task))
                if cell is None:
                    continue
                x = max(xval(facts[label]), 1)
                ax.errorbar(
                    [x],
                    [100 * cell["acc_mean"]],
                    yerr=[100 * cell["acc_std"]],
                    fmt="o",
                    color=plt.cm.tab10(i % 10),
                    capsize=3,
                    label=label,
                )
                xs, ys, names = xs + [x], ys + [100 * cell["acc_mean"]], names + [label]
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_ylim(-2, 102)
            ax.set_title(task)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.set_ylabel("test accuracy (%)")
            ax.grid(alpha=0.3)
            placed.append((ax, xs, ys, names))
        fig.tight_layout()
        for ax, xs, ys, names in placed:
            if xs:
                ax.set_xlim(min(xs) / 2, max(xs) * 8)  # room on the right for the labels
                label_points(ax, xs, ys, names)
        paths.append(save_plot(fig, out, stem, layout=False))
    return paths


def write_depth_plot(out: Path, cc: CompareCells) -> list[Path]:
    """accuracy_vs_layers.png for a table with entity tracking and attention rows (else nothing).

    Per entity-tracking column: test accuracy on the deepest questions against the number of layers
    (attention as a line, the one-layer recurrences as points at 1), with the guessing level and the
    layer counts below the bound ceil(log2(n + 1)) shaded; below it, when the runs have answer groups,
    every row's accuracy by question depth.
    """
    configs, cells, baselines = cc.configs, cc.cells, cc.baselines
    one_layer, attention, columns = depth_rows(configs)
    columns = {col: n for col, n in columns.items() if any((lab, col) in cells for lab in attention.values())}
    if not columns:
        return []
    deepest = {c.column_name: c.task_config().score_deepest for c in configs if c.column_name in columns}
    labels = one_layer + [attention[L] for L in sorted(attention)]
    by_depth = any(cells.get((lab, col), {}).get("acc_by_group") for lab in labels for col in columns)
    fig, axes = plt.subplots(
        2 if by_depth else 1, len(columns), figsize=(4.6 * len(columns), 7.2 if by_depth else 3.8), squeeze=False
    )
    colors = {lab: plt.cm.tab10(i % 10) for i, lab in enumerate(labels)}
    for j, (col, n) in enumerate(columns.items()):
        ax, bound = axes[0][j], math.ceil(math.log2(n + 1))
        layers = [L for L in sorted(attention) if (attention[L], col) in cells]
        acc = [cells[(attention[L], col)] for L in layers]
        ax.errorbar(
            layers,
            [100 * c["acc_mean"] for c in acc],
            yerr=[100 * c["acc_std"] for c in acc],
            fmt="o-",
            color="tab:gray",
            capsize=3,
            label="attention",
        )
        for i, lab in enumerate(lab for lab in one_layer if (lab, col) in cells):
            c = cells[(lab, col)]
            ax.errorbar(
                [1 + 0.08 * (i + 1)],
                [100 * c["acc_mean"]],
                yerr=[100 * c["acc_std"]],
                fmt="s",
                color=colors[lab],
                capsize=3,
                label=lab,
            )
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
                    ax.plot(
                        range(len(groups)),
                        [100 * a for a in groups.values()],
                        marker="o",
                        color=colors[lab],
                        label=lab,
                        ls="-" if lab in one_layer else ":",
                    )
                    names = max(names, list(groups), key=len)
            ax.set_xticks(range(len(names)), names, fontsize=7)
            ax.set_ylim(-2, 102)
            ax.set_title(f"{col}: by question depth (d + 1 links)")
            ax.set_ylabel("test accuracy (%)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="lower left")
    return [save_plot(fig, out, "accuracy_vs_layers")]


def write_learning_curves(out: Path, cc: CompareCells) -> list[Path]:
    """learning_curves_<column>.png: per table column, one panel per row with the validation
    accuracy of each seed's run (at the cell's chosen learning rate and width) against the step,
    the column's best guessing level dashed, and the panel's title marked where a run was stopped
    by its step budget while still rising. Read these, not one number at the end: where a curve
    has left its plateau, and whether it had stopped climbing when the run ended."""
    results, labels, columns, cells, baselines = cc.results, cc.labels, cc.columns, cc.cells, cc.baselines
    paths = []
    for column in columns:
        panels = [lab for lab in labels if (lab, column) in cells]
        if not panels:
            continue
        ncols = min(4, len(panels))
        nrows = math.ceil(len(panels) / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(3.4 * ncols, 2.5 * nrows), squeeze=False, sharey=True)
        guess = max(baselines.get(column, {}).values(), default=None)
        for ax, label in zip(axes.flat, panels):
            cell = cells[(label, column)]
            runs = sorted(
                (
                    r
                    for r in results
                    if r["label"] == label
                    and r.get("column", r["task"]) == column
                    and r["lr"] == cell["best_lr"]
                    and r["d_model"] == cell["d_model"]
                ),
                key=lambda r: r["seed"],
            )
            for r in runs:
                curve = r.get("curve") or []
                ax.plot(
                    [c["step"] for c in curve],
                    [100 * c["val_acc"] for c in curve],
                    lw=1,
                    label=f"seed {r['seed']}" + (" (still rising)" if r.get("still_rising") else ""),
                )
            if guess is not None:
                ax.axhline(100 * guess, color="grey", ls="--", lw=0.8)
            rising = cell.get("still_rising", 0)
            ax.set_title(
                f"{label}" + (f"  [{rising} still rising]" if rising else ""),
                fontsize=8,
                color="tab:red" if rising else "black",
            )
            ax.set_ylim(-2, 102)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=6, loc="upper left")
        for ax in list(axes.flat)[len(panels) :]:
            ax.set_visible(False)
        for ax in axes[-1]:
            ax.set_xlabel("step", fontsize=8)
        for ax in axes[:, 0]:
            ax.set_ylabel("val. accuracy (%)", fontsize=8)
        fig.suptitle(
            f"learning curves: {column}" + ("  (dashed: best guessing level)" if guess is not None else ""), fontsize=9
        )
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", column).strip("-")
        paths.append(save_plot(fig, out, f"learning_curves_{slug}"))
    return paths


def save_plot(fig, out: Path, stem: str, layout: bool = True) -> Path:
    """out/<stem>.png through the one figure writer (laid out first, unless the caller already laid
    it out and placed labels in display space: ``label_points``)."""
    if layout:
        fig.tight_layout()
    return save_figure(fig, out, stem, formats=("png",))[0]
