"""The compare table's text: one line per row with its structure and every column's accuracy, and
the side-by-side with the paper's Table 1, both read from a ``CompareCells``.
"""

from __future__ import annotations

from typing import Any

from tokenmix.study.cells import CompareCells
from tokenmix.study.paper import PAPER_TABLE, PAPER_TASKS
from tokenmix.study.structure import fmt_path

RISING = "↑"  # marks a cell with a run stopped by its step budget while still rising
RISING_NOTE = (
    f"{RISING}: at least one seed of the cell was stopped by its step budget while its validation "
    "accuracy was still rising (the number is a lower bound on what the row learns)"
)
TABLE_HEADER = ("mixer", "time/token", "MACs@n", "cache", "positions@n meas/der", "scalars@n meas/der", "path@n")


def acc_cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "—"
    return f"{100 * cell['acc_mean']:.1f} ± {100 * cell['acc_std']:.1f}" + (
        f" {RISING}" if cell.get("still_rising") else ""
    )


def at_length_cell(cell: dict[str, Any] | None, n: str) -> str:
    """Mean test accuracy (%) of the cell's runs at extra test length n, or a dash."""
    if cell is None or n not in cell.get("acc_at", {}):
        return "—"
    return f"{100 * cell['acc_at'][n]:.1f}"


def table_rows(cc: CompareCells) -> tuple[list[str], list[list[str]]]:
    """Header and string cells of the comparison table."""
    # a column tested at other lengths too (train.test_lengths) gets one more column per length
    columns = [(t, None) for t in cc.columns]
    for t in cc.columns:
        lengths = dict.fromkeys(n for (_, col), c in cc.cells.items() if col == t for n in c.get("acc_at", {}))
        columns[columns.index((t, None)) + 1 : columns.index((t, None)) + 1] = [(t, n) for n in lengths]
    header = [*TABLE_HEADER, *[t if n is None else f"{t} @{n}" for t, n in columns], "train tok/s", "tok/CPU-s"]
    rows = []
    for label in cc.labels:
        f = cc.facts[label]
        mark = "" if f.cache_matches else " (!)"
        tok_s = cc.throughput.get(label, (0.0, 0.0))
        rows.append(
            [
                label,
                f.time_complexity,
                str(f.flops_per_token),
                f.cache_complexity,
                f"{f.cache_positions_measured}/{f.cache_positions_derived}{mark}",
                f"{f.state_size_measured}/{f.state_size_derived}{mark}",
                fmt_path(f.shortest_path),
                *[
                    acc_cell(cc.cells.get((label, t))) if n is None else at_length_cell(cc.cells.get((label, t)), n)
                    for t, n in columns
                ],
                f"{tok_s[0]:,.0f}",
                f"{tok_s[1]:,.0f}",
            ]
        )
    return header, rows


def paper_comparison(cc: CompareCells) -> tuple[list[str], list[list[str]]]:
    """Measured accuracy next to the paper's Table 1 for the rows the paper has; empty when the sweep
    has none of the paper's tasks."""
    if not any(c in PAPER_TASKS for c in cc.columns):
        return [], []
    header = ["mixer", "paper structure"]
    for t in PAPER_TASKS:
        header += [f"{t} (ours)", f"{t} (paper)"]
    rows = []
    for label in cc.labels:
        paper = PAPER_TABLE.get(label)
        row = [label, paper["structure"] if paper else "—"]
        for t in PAPER_TASKS:
            row += [acc_cell(cc.cells.get((label, t))), f"{paper[t]:.2f}" if paper else "—"]
        rows.append(row)
    return header, rows
