"""``tokenmix compare``: train every row of a compare preset on its tasks (resumably), then build the
complexity-vs-expressivity table, the paper's side-by-side, the claims, plots and the report.

    result = run_compare(CompareRequest(preset="quick"))     # what the CLI calls

The finished sweep is read once into a ``CompareCells`` (``cells``: summary, best cells, structure
facts, throughput, baselines, the patterns' copy routes and MQAR reads); every part then reads it:
``table`` (the table's text), ``claims`` (the paper's claims checked), ``plots``, the preset's own
section, and ``report`` (the Markdown report). Below them: ``structure`` (derived and measured
cost, cache, path), ``theory`` (what one layer can do on a task); the paper's own numbers: ``paper``.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenmix.core.errors import InputError
from tokenmix.core.files import atomic_write_json, atomic_write_text, prepare_output_dir
from tokenmix.core.lock import folder_lock
from tokenmix.study import claims, plots, table
from tokenmix.study.cells import CompareCells
from tokenmix.study.presets import Preset, compare_preset, registered
from tokenmix.study.report import InvocationStats, report_markdown
from tokenmix.training.sweep import check_device, run_sweep, validate_sweep


@dataclass(frozen=True)
class CompareRequest:
    """One ``tokenmix compare`` invocation."""

    preset: str = "quick"  # a compare preset name, or a path to a preset .py file
    extra_mixers: tuple[str, ...] = ()  # extra rows: registered mixer names
    out: str | None = None  # run directory (default runs/compare-<preset>)
    workers: int | None = None  # parallel worker processes (None: 2 on 2+ cores, else 1)
    threads: int = 1  # torch threads per worker
    device: str = "cpu"
    progress: bool = True
    plots: bool = True


@dataclass
class CompareResult:
    """What ``run_compare`` produced: the table (header and text rows), the paper's side-by-side
    (empty when the preset has none of the paper's tasks), the claims, and where the files are."""

    preset: Preset
    n: int
    header: list[str]
    rows: list[list[str]]
    paper_header: list[str]
    paper_rows: list[list[str]]
    findings: list[dict[str, Any]]
    stats: InvocationStats
    out: Path
    plots: list[Path] = field(default_factory=list)
    missing_rows: list[str] = field(default_factory=list)


def _cpu_seconds() -> float:
    """User + system CPU time of this process and of its finished children (the worker processes)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_compare(req: CompareRequest, console: Any = None) -> CompareResult:
    """Train the preset's sweep under ``req.out`` (finished runs are skipped) and write
    ``report.md``, ``summary.json`` and the plots there."""
    start = time.perf_counter()
    load_before = os.getloadavg()
    preset = compare_preset(req.preset)
    configs = validate_sweep(preset.build(list(req.extra_mixers)))
    workers = req.workers if req.workers is not None else (2 if (os.cpu_count() or 1) >= 2 else 1)
    if workers < 1:
        raise InputError(f"--workers must be >= 1, got {workers}")
    if req.threads < 1:
        raise InputError(f"--threads must be >= 1, got {req.threads}")
    out = Path(req.out) if req.out else Path("runs") / f"compare-{preset.name}"
    check_device(req.device)
    prepare_output_dir(out)  # fail on an unwritable directory before training anything
    with folder_lock(out, "compare"):  # a second `compare` into the same folder is refused, naming this one
        return _compare_locked(req, preset, configs, workers, out, start, load_before, console)


def _compare_locked(
    req: CompareRequest,
    preset: Preset,
    configs: list,
    workers: int,
    out: Path,
    start: float,
    load_before: tuple[float, float, float],
    console: Any,
) -> CompareResult:
    outcome = run_sweep(
        configs, out, workers=workers, threads=req.threads, progress=req.progress, console=console, device=req.device
    )
    cc = CompareCells.build(configs, outcome.results)  # every part below reads it; nothing is recomputed
    header, rows = table.table_rows(cc)
    paper_header, paper_rows = table.paper_comparison(cc)
    paper_claims, depth_claims = claims.paper_findings(cc), claims.entity_depth_findings(cc)
    figures = (
        []
        if not req.plots
        else (plots.write_plots(out, cc) + plots.write_depth_plot(out, cc) + plots.write_learning_curves(out, cc))
    )
    stats = InvocationStats(
        wall_seconds=time.perf_counter() - start,
        cpu_seconds=_cpu_seconds(),
        trained=outcome.trained,
        skipped=outcome.skipped,
        workers=workers,
        threads=req.threads,
        load_before=load_before,
        load_after=os.getloadavg(),
        cpu_count=os.cpu_count() or 1,
    )
    own = [] if preset.report_section is None else [preset.report_section(out, cc, req.plots)]
    figures += [f for section in own for f in section.figures]
    report = report_markdown(
        preset.name,
        cc,
        header,
        rows,
        (paper_header, paper_rows),
        paper_claims,
        depth_claims,
        stats,
        figures,
        notes=preset.notes,
        sections=[section.markdown for section in own],
    )
    findings = paper_claims + depth_claims + [f for section in own for f in section.findings]
    atomic_write_text(out / "report.md", report)
    atomic_write_json(
        out / "summary.json",
        {
            "preset": preset.name,
            "n": cc.n,
            "wall_seconds": stats.wall_seconds,
            "cpu_seconds": stats.cpu_seconds,
            "load_before": list(stats.load_before),
            "load_after": list(stats.load_after),
            "cpu_count": stats.cpu_count,
            "trained": outcome.trained,
            "skipped": outcome.skipped,
            "workers": workers,
            "threads": req.threads,
            "rows": cc.labels,
            "columns": cc.columns,
            "baselines": cc.baselines,
            "structure": {k: v.to_dict() for k, v in cc.facts.items()},
            "summary": cc.summary,
            "findings": findings,
        },
    )
    return CompareResult(
        preset=preset,
        n=cc.n,
        header=list(header),
        rows=[list(r) for r in rows],
        paper_header=list(paper_header),
        paper_rows=[list(r) for r in paper_rows],
        findings=findings,
        stats=stats,
        out=out,
        plots=figures,
        missing_rows=registered(preset.default_mixers)[1],
    )
