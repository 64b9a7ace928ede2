"""The compare table itself: rows and columns of a sweep, the best cell per (row, column), the
table's text cells, and the side-by-side with the paper's Table 1.
"""
from __future__ import annotations

import statistics
from typing import Any, Sequence

from tokenmix.runs.synthetic import SyntheticRunConfig
from tokenmix.study.paper import PAPER_TABLE, PAPER_TASKS
from tokenmix.study.structure import StructureFacts, fmt_path, structure_facts


def rows_and_tasks(configs: Sequence[SyntheticRunConfig]) -> tuple[list[str], list[str]]:
    """Row labels and table columns (task names unless a run names its column) in the order they first appear in the sweep."""
    return list(dict.fromkeys(c.label for c in configs)), list(dict.fromkeys(c.column_name for c in configs))


def table_length(configs: Sequence[SyntheticRunConfig]) -> int:
    return max(c.task_config().length for c in configs)


def facts_for_rows(configs: Sequence[SyntheticRunConfig]) -> dict[str, StructureFacts]:
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


RISING = "↑"  # marks a cell with a run stopped by its step budget while still rising
RISING_NOTE = (f"{RISING}: at least one seed of the cell was stopped by its step budget while its validation "
               "accuracy was still rising (the number is a lower bound on what the row learns)")


def acc_cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "—"
    return f"{100 * cell['acc_mean']:.1f} ± {100 * cell['acc_std']:.1f}" + (f" {RISING}" if cell.get("still_rising") else "")


def at_length_cell(cell: dict[str, Any] | None, n: str) -> str:
    """Mean test accuracy (%) of the cell's runs at extra test length n, or a dash."""
    if cell is None or n not in cell.get("acc_at", {}):
        return "—"
    return f"{100 * cell['acc_at'][n]:.1f}"


TABLE_HEADER = ("mixer", "time/token", "MACs@n", "cache", "positions@n meas/der", "scalars@n meas/der", "path@n")


def table_rows(labels: Sequence[str], tasks: Sequence[str], facts: dict[str, StructureFacts],
               cells: dict[tuple[str, str], dict[str, Any]],
               tok_s: dict[str, tuple[float, float]]) -> tuple[list[str], list[list[str]]]:
    """Header and string cells of the comparison table."""
    # a column tested at other lengths too (train.test_lengths) gets one more column per length
    columns = [(t, None) for t in tasks]
    for t in tasks:
        lengths = dict.fromkeys(n for (_, col), c in cells.items() if col == t for n in c.get("acc_at", {}))
        columns[columns.index((t, None)) + 1 : columns.index((t, None)) + 1] = [(t, n) for n in lengths]
    header = [*TABLE_HEADER, *[t if n is None else f"{t} @{n}" for t, n in columns], "train tok/s", "tok/CPU-s"]
    rows = []
    for label in labels:
        f = facts[label]
        mark = "" if f.cache_matches else " (!)"
        rows.append([
            label, f.time_complexity, str(f.flops_per_token), f.cache_complexity,
            f"{f.cache_positions_measured}/{f.cache_positions_derived}{mark}",
            f"{f.state_size_measured}/{f.state_size_derived}{mark}",
            fmt_path(f.shortest_path),
            *[acc_cell(cells.get((label, t))) if n is None else at_length_cell(cells.get((label, t)), n)
              for t, n in columns],
            f"{tok_s.get(label, (0.0, 0.0))[0]:,.0f}",
            f"{tok_s.get(label, (0.0, 0.0))[1]:,.0f}",
        ])
    return header, rows


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


def acc_of(cells: dict[tuple[str, str], dict[str, Any]], label: str, task: str) -> float | None:
    c = cells.get((label, task))
    return None if c is None else c["acc_mean"]




def attach_seed_accuracies(cells: dict[tuple[str, str], dict[str, Any]], results: Sequence[dict[str, Any]]) -> None:
    """Add ``acc_by_seed`` (test accuracy per seed at the cell's chosen learning rate and width) to each cell."""
    for (label, column), cell in cells.items():
        runs = [r for r in results if r["label"] == label and r.get("column", r["task"]) == column
                and r["lr"] == cell["best_lr"] and r["d_model"] == cell["d_model"]]
        cell["acc_by_seed"] = {r["seed"]: r["test_acc"] for r in sorted(runs, key=lambda r: r["seed"])}




def baselines_by_column(configs: Sequence[SyntheticRunConfig]) -> dict[str, dict[str, float]]:
    """Per table column: the guessing baselines of its task (``TaskConfig.baselines``)."""
    out: dict[str, dict[str, float]] = {}
    for c in configs:
        if c.column_name not in out:
            out[c.column_name] = c.task_config().baselines()
    return out
