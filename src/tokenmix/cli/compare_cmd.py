"""tokenmix compare [--preset quick|paper|depth|FILE.py] [--mixers NAME ...] [--out DIR] [--workers N]

Trains every row of a preset (experiments/<preset>.py) on its tasks, resumably, then prints the
complexity-vs-expressivity table and writes plots and a Markdown report into the run directory.
"""
from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

from tokenmix.mixers.registry import get_mixer_spec


def register(sub) -> None:
    p = sub.add_parser("compare", help="train each mixer structure on the synthetic tasks and print the "
                                       "cost / cache / shortest path / accuracy table")
    p.add_argument("--preset", default="quick",
                   help="quick (default, ≤ 10 min on 2 CPU cores), recall (quick's MQAR column to its "
                        "plateau, ~20 min), paper (full grid, hours), depth (entity tracking vs layers), depth_long "
                        "(its n = 3 column with a budget attention learns in, ~35 min), "
                        "or a path to an experiments-style .py file")
    p.add_argument("--mixers", nargs="+", default=[], metavar="NAME",
                   help="extra rows: registered mixer names (space or comma separated)")
    p.add_argument("--out", default=None, help="run directory (default runs/compare-<preset>); rerunning "
                                                 "with the same directory skips finished runs")
    p.add_argument("--workers", type=int, default=None,
                   help="parallel worker processes (default: 2 if the machine has 2+ cores, else 1)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per worker (default 1: the models are small, one thread per "
                        "process is fastest)")
    p.add_argument("--device", default="cpu", help="torch device for training, e.g. cuda (default cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.set_defaults(func=run)


def _extra_mixers(raw: list[str]) -> list[str]:
    names = [n.strip() for item in raw for n in item.split(",") if n.strip()]
    for n in names:
        get_mixer_spec(n)  # unknown -> ValueError listing the known mixers
    return list(dict.fromkeys(names))


def run(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from tokenmix.training import compare
    from tokenmix.training.harness import (atomic_write_json, atomic_write_text, check_device, prepare_output_dir,
                                           run_sweep, summarize, validate_sweep)
    from tokenmix.training.presets import load_preset, registered

    start = time.perf_counter()
    load_before = os.getloadavg()
    extra = _extra_mixers(args.mixers)
    name, preset_fn, module = load_preset(args.preset)
    configs = validate_sweep(preset_fn(extra))
    workers = args.workers if args.workers is not None else (2 if (os.cpu_count() or 1) >= 2 else 1)
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    threads = args.threads if args.threads is not None else 1
    out = Path(args.out) if args.out else Path("runs") / f"compare-{name}"

    check_device(args.device)
    prepare_output_dir(out)  # fail on an unwritable directory before printing anything
    console = Console() if sys.stdout.isatty() else Console(width=200)
    missing = registered(getattr(module, "DEFAULT_MIXERS", ()))[1]
    if missing:
        print(f"note: rows without a registered mixer are not run: {', '.join(missing)}", file=sys.stderr)

    outcome = run_sweep(configs, out, workers=workers, threads=threads, progress=not args.no_progress,
                        console=console, device=args.device)
    summary = summarize(outcome.results)
    labels, columns = compare.rows_and_tasks(configs)
    facts = compare.facts_for_rows(configs)
    cells = compare.best_cells(summary)
    compare.attach_seed_accuracies(cells, outcome.results)
    tok_s = compare.throughput(outcome.results)
    header, rows = compare.table_rows(labels, columns, facts, cells, tok_s)

    n = compare.table_length(configs)
    table = Table(title=f"tokenmix compare — preset {name} (n = {n}; accuracy % mean ± std over seeds)")
    for h in header:
        table.add_column(h, overflow="fold")
    for r in rows:
        table.add_row(*r)
    console.print(table)
    if any(c in compare.PAPER_TASKS for c in columns):
        ph, pr = compare.paper_comparison(labels, cells)
        paper = Table(title="next to the paper's Table 1 (framework.md §5.1; its sizes and steps are unknown)")
        for h in ph:
            paper.add_column(h, overflow="fold")
        for r in pr:
            paper.add_row(*r)
        console.print(paper)

    plots = [] if args.no_plots else (compare.write_plots(out, labels, columns, facts, cells)
                                      + compare.write_depth_plot(out, configs, cells))
    stats = compare.InvocationStats(
        wall_seconds=time.perf_counter() - start, cpu_seconds=_cpu_seconds(), trained=outcome.trained,
        skipped=outcome.skipped, workers=workers, threads=threads, load_before=load_before,
        load_after=os.getloadavg(), cpu_count=os.cpu_count() or 1)
    report = compare.report_markdown(name, configs, labels, columns, header, rows, cells, summary, stats, plots,
                                     notes=getattr(module, "NOTES", ""))
    baselines = compare.baselines_by_column(configs)
    findings = compare.all_findings(configs, cells)
    atomic_write_text(out / "report.md", report)
    atomic_write_json(out / "summary.json", {
        "preset": name, "n": n, "wall_seconds": stats.wall_seconds, "cpu_seconds": stats.cpu_seconds,
        "load_before": list(stats.load_before), "load_after": list(stats.load_after), "cpu_count": stats.cpu_count,
        "trained": outcome.trained, "skipped": outcome.skipped, "workers": workers, "threads": threads,
        "rows": labels, "columns": columns, "baselines": baselines,
        "structure": {k: v.to_dict() for k, v in facts.items()}, "summary": summary,
        "findings": findings,
    })
    for f in findings:  # the claims, each with the facts from its runs that explain the verdict
        console.print(f"- {escape(f['claim'])}: [bold]{escape(f['verdict'])}[/bold] ({escape(f['measured'])})",
                      highlight=False)
        for w in f["why"]:
            console.print(f"    {w}", markup=False, highlight=False)
    console.print(f"{outcome.trained} runs trained, {outcome.skipped} already finished; {stats.describe()}")
    console.print(f"report: {out / 'report.md'}  plots: {', '.join(str(p) for p in plots) or '(none)'}  "
                  f"runs: {out / 'results.csv'}")
    return 0


def _cpu_seconds() -> float:
    """User + system CPU time of this process and of its finished children (the worker processes)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
