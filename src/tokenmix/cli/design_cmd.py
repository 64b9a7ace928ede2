"""tokenmix design --n N [--max-cache C] [--max-cost C] [--layers L] [--pattern SPEC ...] [--families ...]
[--train TASK --top K] [--out DIR]: the Pareto front of pattern candidates over (cost, cache, max path)
(``analysis/design.py``), optionally trained (``study/design.py``). Prints the front, writes
design.json / design.csv / design.md and the figure into --out. The handler (its arguments:
``design_args.py``)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rich.console import Console

from tokenmix.analysis.design import DesignRequest, shown_rows, table_rows
from tokenmix.analysis.design_space import DesignSpace, value_list
from tokenmix.analysis.outputs import check_formats, json_text, text_table
from tokenmix.core.files import check_output_dir
from tokenmix.study.design import DesignTraining, run_design


def request_from_args(args) -> DesignRequest:
    families = (
        ()
        if args.families.strip() == "none"
        else tuple(dict.fromkeys(f.strip() for f in args.families.split(",") if f.strip()))
    )
    space = DesignSpace(
        families=families,
        bases=value_list(args.bases, "--bases"),
        powers=value_list(args.powers, "--powers", integer=True),
        mix_windows=value_list(args.mix_windows, "--mix-windows", integer=True),
        mix_bases=value_list(args.mix_bases, "--mix-bases"),
        windows=value_list(args.windows, "--windows", integer=True),
        patterns=tuple(args.pattern),
        lattice=not args.no_lattice,
    )
    return DesignRequest(
        n=args.n,
        max_cost=args.max_cost,
        max_cache=args.max_cache,
        layers=args.layers,
        offset=args.offset,
        space=space,
        route_front=not args.no_routing,
    )


def run(args) -> int:
    start = time.perf_counter()
    req = request_from_args(args)
    training = None
    if args.train is not None:
        training = DesignTraining(
            task=args.train,
            top=args.top,
            steps=args.steps,
            lr=args.lr,
            seeds=tuple(dict.fromkeys(args.seeds)),
            workers=args.workers,
            threads=args.threads,
            device=args.device,
            progress=not (args.quiet or args.json),
        )
    formats = check_formats(args.formats.split(","))
    out = check_output_dir(args.out or Path("runs") / f"design-n{req.n}")  # made by run_design, once it has checked all
    say = None if (args.quiet or args.json) else (lambda msg: print(f"  {msg}", file=sys.stderr, flush=True))
    console = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=160)
    result, files = run_design(
        req, out, training=training, formats=formats, plots=not args.no_plots, progress=say, console=console
    )
    if args.json:
        print(
            json_text(
                {
                    "settings": req.settings(),
                    "front": [r.name for r in result.front],
                    "rows": [r.record() for r in result.rows],
                    "training": result.training,
                    "files": [str(f) for f in files],
                }
            )
        )
        return 0
    budget = ", ".join(f"{k} ≤ {v}" for k, v in (("cost", req.max_cost), ("cache", req.max_cache)) if v is not None)
    inside = sum(r.in_budget for r in result.rows)
    print(
        f"tokenmix design — Pareto front over (cost, cache, max path) at n = {req.n}"
        + (f", {budget}" if budget else "")
        + f"; congestion of the copy at offset {req.copy_offset}, "
        f"reach within {req.layers} hops"
    )
    print(text_table(table_rows(result, shown_rows(result))))
    print(
        f"{len(result.rows)} distinct candidates, {inside} within budget, {len(result.front)} on the front; "
        f"derived in {result.seconds:.1f} s, {time.perf_counter() - start:.1f} s in all"
    )
    print(
        "congestion: translation-invariant = shared decomposition (exact); others = shortest-path routing "
        "(an upper bound); ≥ = lower bound ⌈Σ path lengths / (n − 1)⌉"
    )
    if result.training is not None:
        t = result.training
        print(
            f"trained {t['trained']} runs ({t['skipped']} finished before) on {t['task']}, {t['steps']} steps, "
            f"lr {t['lr']:g}, seeds {t['seeds']}: {t['runs']}"
        )
    print(f"wrote: {', '.join(str(f) for f in files)}")
    return 0
