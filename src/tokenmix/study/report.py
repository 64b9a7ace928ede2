"""The compare run's Markdown report: the table, the paper's side-by-side, the claims with their
facts, per-row notes, and how the invocation ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tokenmix.analysis.outputs import markdown_table
from tokenmix.study.cells import CompareCells
from tokenmix.study.paper import DIAGONAL_SSM
from tokenmix.study.table import RISING, RISING_NOTE


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
        return (
            f"wall time {self.wall_seconds:.0f} s, CPU time {self.cpu_seconds:.0f} s ({who}); machine: "
            f"{self.cpu_count} cores, 1-min load average {self.load_before[0]:.1f} before and "
            f"{self.load_after[0]:.1f} after"
        )


@dataclass
class ReportSection:
    """A preset's own part of the compare report (``Preset.report_section``): Markdown placed after the
    measured table, its figures (already written) and its verdicts (also in summary.json)."""

    markdown: str
    figures: list[Path]
    findings: list[dict[str, Any]]


def finding_lines(findings: list[dict[str, Any]]) -> list[str]:
    """Markdown bullets of verdicts, each with the computed facts behind it, then a blank line."""
    lines = []
    for f in findings:
        mark = f" {RISING}" if f.get("still_rising") else ""  # judged on a cell still rising: said in its facts
        lines.append(f"- **{f['claim']}: {f['verdict']}{mark}** ({f['measured']})")
        lines += [f"  - {w}" for w in f["why"]]
    return lines + [""]


def report_markdown(
    preset: str,
    cc: CompareCells,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    paper_table: tuple[Sequence[str], Sequence[Sequence[str]]],
    paper_claims: list[dict[str, Any]],
    depth_claims: list[dict[str, Any]],
    stats: InvocationStats,
    plots: Sequence[Path],
    notes: str = "",
    sections: Sequence[str] = (),
) -> str:
    """The Markdown report: measured table, the paper's table beside it, the claims checked with the
    computed facts behind each verdict, the preset's own notes, setup and every cell; everything
    read from ``cc`` and the parts computed from it once (``study/compare.py``)."""
    configs, labels, tasks, summary = cc.configs, cc.labels, cc.columns, cc.summary
    lines = [
        f"# tokenmix compare — preset `{preset}`",
        "",
        f"{len(configs)} runs ({stats.trained} trained now, {stats.skipped} finished before), {len(labels)} rows × "
        f"{len(tasks)} tasks × {len(cc.lrs)} learning rate(s) {[f'{lr:g}' for lr in cc.lrs]} × {len(cc.seeds)} seeds. "
        f"This invocation: {stats.describe()}. The runs themselves, whenever they were trained: "
        f"{sum(s.get('train_cpu_seconds', 0.0) for s in summary):.0f} CPU seconds in their training steps "
        "(validation, data and process start-up not included).",
        "",
        "Accuracy: test accuracy (%) on the answer positions, mean ± std over seeds, at the learning rate "
        "(and width) with the best mean *validation* accuracy (zoology's max over learning rates; the "
        "validation and test sets come from their own seeds, and the test set chooses nothing). "
        f"Structure columns at n = {cc.n}; cache measured after an n-token decode with `model.step`, summed "
        "over layers, next to the derived accounting ((!) marks a mismatch). Throughput: training tokens "
        "per wall second of one worker process (depends on the machine's load) and per CPU second of "
        "that process (what one free core gives), averaged over the row's runs. "
        f"{RISING_NOTE}.",
        "",
        "## Measured",
        "",
        markdown_table(rows, header).rstrip("\n"),
        "",
    ]
    for section in sections:  # the preset's own (ReportSection)
        lines += [section.rstrip("\n"), ""]
    ph, pr = paper_table
    if ph:
        lines += [
            "## Next to the paper's Table 1",
            "",
            "The paper's numbers (`study/paper.py`, Table 1 of Fagnou et al., ICML 2026); its task sizes, "
            "widths, depths and steps are unknown, so only the ordering is comparable. The paper's "
            f'"Diagonal SSM" (O(1) time and cache) is our `{DIAGONAL_SSM}` row.',
            "",
            markdown_table(pr, ph).rstrip("\n"),
            "",
        ]
    lines += _claim_sections(paper_claims, depth_claims)
    if notes.strip():
        lines += ["## Notes of the preset (its design, written before these numbers)", "", notes.strip(), ""]
    lines += _setup_lines(cc)
    lines += ["", *_every_cell_lines(summary)]
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    lines += ["Per-run results: `results.csv`, `results.json`, `runs/<run_id>/`; resolved configs: `sweep.json`.", ""]
    return "\n".join(lines)


def _claim_sections(paper_claims: list[dict[str, Any]], depth_claims: list[dict[str, Any]]) -> list[str]:
    """The paper's claims and ChaCAL's depth claim, each section only when it has findings."""
    lines: list[str] = []
    if paper_claims:
        lines += [
            "## The paper's qualitative findings, checked on this table",
            "",
            "Each verdict is computed from the measured cells above. Below each claim: facts computed "
            "from its runs that bear on the verdict (the explanation of a disagreement).",
            "",
        ]
        lines += finding_lines(paper_claims)
    if depth_claims:
        lines += [
            "## Depth: ChaCAL's claim checked on this table",
            "",
            "Accuracy on the deepest questions (depth n) unless the task scores every depth; verdicts "
            "computed from the cells above.",
            "",
        ]
        lines += finding_lines(depth_claims)
    return lines


def _setup_lines(cc: CompareCells) -> list[str]:
    """Each task's sizes, guessing levels and training; each row's model; seeds and learning rates."""
    lines = ["## Setup", ""]
    for task in cc.columns:
        c = next(c for c in cc.configs if c.column_name == task)
        targs = ", ".join(f"{k}={v}" for k, v in c.to_dict()["task_args"].items())
        guess = ", ".join(f"{k} {100 * v:.1f} %" for k, v in cc.baselines[task].items())
        train = {k: v for k, v in c.to_dict()["train"].items() if k not in ("lr", "mode")}
        lines.append(f"- `{task}`: {targs}; guessing baselines: {guess}")
        lines.append("  - training: " + ", ".join(f"{k}={v}" for k, v in train.items()))
    for label in cc.labels:
        c = next(c for c in cc.configs if c.label == label)
        m = c.to_dict()["model"]
        shared = ", ".join(f"{k}={v}" for k, v in m.items() if k not in ("vocab_size", "layers", "mixer_overrides"))
        extra = f", mixer_overrides={m['mixer_overrides']}" if m.get("mixer_overrides") else ""
        lines.append(
            f"- row `{label}`: layers={'+'.join(m['layers'])}{extra}, {shared}, "
            f"training mode={c.train.mode or 'default'}"
        )
    lines.append(f"- seeds {cc.seeds}; learning rates {[f'{lr:g}' for lr in cc.lrs]}")
    return lines


def _every_cell_lines(summary: Sequence[dict[str, Any]]) -> list[str]:
    """The table of every (row, task, width): what chose the learning rate, and the rest."""
    return [
        "## Every (row, task, width)",
        "",
        "`val by lr` chooses the learning rate; `acc by lr` (test) is shown, never used to choose.",
        "",
        markdown_table(
            [
                [
                    s["label"],
                    s["column"],
                    str(s["d_model"]),
                    f"{s['best_lr']:g}",
                    f"{100 * s['acc_mean']:.1f}",
                    f"{100 * s['acc_std']:.1f}",
                    str(s["n_seeds"]),
                    ", ".join(f"{k}: {100 * v:.1f}" for k, v in s.get("val_by_lr", {}).items()),
                    ", ".join(f"{k}: {100 * v:.1f}" for k, v in s["acc_by_lr"].items()),
                    f"{s['steps_mean']:.0f}",
                    str(s.get("still_rising", 0)),
                    f"{s['tokens_per_s']:,.0f}",
                    f"{s['tokens_per_cpu_s']:,.0f}",
                ]
                for s in summary
            ],
            [
                "row",
                "task",
                "d_model",
                "best lr",
                "acc mean",
                "acc std",
                "seeds",
                "val by lr",
                "acc by lr",
                "mean steps",
                "still rising",
                "tok/s",
                "tok/CPU-s",
            ],
        ).rstrip("\n"),
        "",
    ]
