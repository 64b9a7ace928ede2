"""tokenmix compare [--preset NAME|FILE.py] [--mixers NAME,NAME...] [--out DIR] [--workers N] [--list-presets]
and tokenmix presets [--kind compare|lm|analysis]: call ``study.compare.run_compare``, print (the
arguments: ``compare_args.py``)."""

from __future__ import annotations

import signal
import sys
import threading

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tokenmix.cli.validate import check_choice, mixer_list
from tokenmix.study.compare import CompareRequest, run_compare
from tokenmix.study.presets import KINDS, presets
from tokenmix.study.table import RISING, RISING_NOTE


def _rich_table(title: str, header: list[str], rows: list[list[str]]) -> Table:
    t = Table(title=title)
    for h in header:
        t.add_column(h, overflow="fold")
    for r in rows:
        t.add_row(*r)
    return t


def run_list(args) -> int:
    check_choice("--kind", args.kind, KINDS)
    console = Console() if sys.stdout.isatty() else Console(width=200)
    rows = [[p.kind, p.name, p.summary] for p in presets(args.kind)]
    console.print(_rich_table("tokenmix presets", ["kind", "name", "what it runs"], rows))
    return 0


class Terminated(SystemExit):
    """SIGTERM: unwinds like Ctrl-C (the worker processes are stopped, the folder's lock released)."""


def _on_sigterm(signum, _frame) -> None:
    print("tokenmix compare: terminated", file=sys.stderr)
    raise Terminated(128 + signum)


def run(args) -> int:
    if args.list_presets:
        args.kind = "compare"
        return run_list(args)
    console = Console() if sys.stdout.isatty() else Console(width=200)
    req = CompareRequest(
        preset=args.preset,
        extra_mixers=tuple(mixer_list(args.mixers, default=[], allow_none=True)),
        out=args.out,
        workers=args.workers,
        threads=args.threads,
        device=args.device,
        progress=not args.no_progress,
        plots=not args.no_plots,
    )
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    try:
        res = run_compare(req, console=console)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    if res.missing_rows:
        print(f"note: rows without a registered mixer are not run: {', '.join(res.missing_rows)}", file=sys.stderr)
    console.print(
        _rich_table(
            f"tokenmix compare — preset {res.preset.name} (n = {res.n}; accuracy % mean ± std over seeds)",
            res.header,
            res.rows,
        )
    )
    if res.paper_header:
        console.print(
            _rich_table(
                "next to the paper's Table 1 (study/paper.py; its sizes and steps are unknown)",
                res.paper_header,
                res.paper_rows,
            )
        )
    if any(RISING in cell for row in res.rows for cell in row):
        console.print(RISING_NOTE, highlight=False)
    for f in res.findings:  # the claims, each with the facts from its runs that explain the verdict
        mark = f" {RISING}" if f.get("still_rising") else ""
        console.print(
            f"- {escape(f['claim'])}: [bold]{escape(f['verdict'])}{mark}[/bold] ({escape(f['measured'])})",
            highlight=False,
        )
        for w in f["why"]:
            console.print(f"    {w}", markup=False, highlight=False)
    console.print(f"{res.stats.trained} runs trained, {res.stats.skipped} already finished; {res.stats.describe()}")
    console.print(
        f"report: {res.out / 'report.md'}  plots: {', '.join(str(p) for p in res.plots) or '(none)'}  "
        f"runs: {res.out / 'results.csv'}"
    )
    return 0
