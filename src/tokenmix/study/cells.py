"""A finished compare sweep, read once: everything the table, the claims, the plots and the report
need, computed in one place (``CompareCells.build``) and then only read.

    cells = CompareCells.build(configs, results)    # what run_compare does after the sweep
    table.table_rows(cells); claims.all_findings(cells); report.report_markdown(..., cells, ...)

Cells are keyed (row label, table column): the summary row of that pair with the best mean
*validation* accuracy over widths (each width already at its best learning rate by validation;
``training.synthetic.summarize``), with each seed's test accuracy attached (``acc_by_seed``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

from tokenmix.runs.synthetic import SyntheticRunConfig
from tokenmix.study.structure import StructureFacts, structure_facts
from tokenmix.study.theory import CopyRoutes, RecallReads, copy_routes_for_rows, recall_reads_for_rows
from tokenmix.training.synthetic import summarize

Cell = dict[str, Any]


@dataclass
class CompareCells:
    """One finished sweep's numbers (module docstring)."""

    configs: list[SyntheticRunConfig]
    results: list[dict[str, Any]]
    summary: list[dict[str, Any]]  # ``summarize(results)``: one row per (label, column, width)
    labels: list[str]  # rows, in sweep order
    columns: list[str]  # table columns (task names unless a run names its column)
    n: int  # the table's length: the longest task sequence
    facts: dict[str, StructureFacts]  # per row: derived and measured structure at n
    cells: dict[tuple[str, str], Cell]  # (label, column) -> best summary row, with acc_by_seed
    throughput: dict[str, tuple[float, float]]  # per row: tokens per wall second, per CPU second
    baselines: dict[str, dict[str, float]]  # per column: the task's guessing baselines
    lrs: list[float]  # the learning-rate grid of the sweep
    seeds: list[int]
    routes: dict[str, CopyRoutes] = field(default_factory=dict)  # copy routes of the pattern rows
    reads: dict[str, RecallReads] = field(default_factory=dict)  # MQAR direct reads of the pattern rows

    @classmethod
    def build(
        cls, configs: Sequence[SyntheticRunConfig], results: Sequence[dict[str, Any]], structure: bool = True
    ) -> "CompareCells":
        """Everything read from a finished sweep; ``structure`` False skips the measured structure
        (decoding every row's model at n: the slow part, which a preset's own section may not need)."""
        configs, results = list(configs), list(results)
        summary = summarize(results)
        labels = list(dict.fromkeys(c.label for c in configs))
        columns = list(dict.fromkeys(c.column_name for c in configs))
        n = max(c.task_config().length for c in configs)
        facts: dict[str, StructureFacts] = {}
        if structure:
            for c in configs:
                if c.label not in facts:
                    facts[c.label] = structure_facts(c.label, c.model_config(), n)
        cells = best_cells(summary)
        for (label, column), cell in cells.items():
            runs = [
                r
                for r in results
                if r["label"] == label
                and r.get("column", r["task"]) == column
                and r["lr"] == cell["best_lr"]
                and r["d_model"] == cell["d_model"]
            ]
            cell["acc_by_seed"] = {r["seed"]: r["test_acc"] for r in sorted(runs, key=lambda r: r["seed"])}
        by_row: dict[str, list[tuple[float, float]]] = {}
        for r in results:
            by_row.setdefault(r["label"], []).append((r["tokens_per_s"], r.get("tokens_per_cpu_s", 0.0)))
        throughput = {
            k: (statistics.fmean(w for w, _ in v), statistics.fmean(c for _, c in v)) for k, v in by_row.items()
        }
        return cls(
            configs=configs,
            results=results,
            summary=summary,
            labels=labels,
            columns=columns,
            n=n,
            facts=facts,
            cells=cells,
            throughput=throughput,
            baselines=column_baselines(configs),
            lrs=sorted({c.train.lr for c in configs}),
            seeds=sorted({c.seed for c in configs}),
            routes=copy_routes_for_rows(configs),
            reads=recall_reads_for_rows(configs),
        )

    def acc(self, label: str, column: str) -> float | None:
        """Mean test accuracy of a cell, None when the sweep has no such cell."""
        cell = self.cells.get((label, column))
        return None if cell is None else cell["acc_mean"]


def column_baselines(configs: Sequence[SyntheticRunConfig]) -> dict[str, dict[str, float]]:
    """Per table column: the guessing baselines of its task (``TaskConfig.baselines``)."""
    out: dict[str, dict[str, float]] = {}
    for c in configs:
        if c.column_name not in out:
            out[c.column_name] = c.task_config().baselines()
    return out


def best_cells(summary: Sequence[dict[str, Any]]) -> dict[tuple[str, str], Cell]:
    """Per (label, column): the summary row with the highest mean *validation* accuracy over widths
    (each already at its best learning rate by validation); the test accuracy is only reported."""
    cells: dict[tuple[str, str], Cell] = {}
    for row in summary:
        key = (row["label"], row["column"])
        if key not in cells or row.get("val_mean", row["acc_mean"]) > cells[key].get(
            "val_mean", cells[key]["acc_mean"]
        ):
            cells[key] = row
    return cells


__all__ = ["Cell", "CompareCells", "best_cells", "column_baselines"]
