"""tokenmix design --n N [--max-cache C] [--max-cost C] [--layers L] [--pattern SPEC ...] [--families ...]
[--train TASK --top K] [--out DIR]: the Pareto front of pattern candidates over (cost, cache, max path)
(``analysis/design.py``), optionally trained (``study/design.py``). Prints the front, writes
design.json / design.csv / design.md and the figure into --out."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rich.console import Console

from tokenmix.analysis.design import (
    DEFAULT_BASES,
    DEFAULT_MIX_BASES,
    DEFAULT_MIX_WINDOWS,
    DEFAULT_POWERS,
    DEFAULT_WINDOWS,
    FAMILIES,
    DesignRequest,
    DesignSpace,
    shown_rows,
    table_rows,
    value_list,
)
from tokenmix.analysis.outputs import check_formats, json_text, text_table
from tokenmix.core.files import check_output_dir
from tokenmix.study.design import DesignTraining, run_design


def _show(values) -> str:
    return ",".join(f"{float(v):g}" for v in values)


def register(sub) -> None:
    p = sub.add_parser(
        "design",
        help="Pareto front of recurrence patterns over (cost, cache, max path) for a "
        "budget at length n; --train checks that the best ones learn",
    )
    p.add_argument("--n", type=int, default=4096, help="sequence length the numbers are derived at (default 4096)")
    p.add_argument("--max-cache", type=int, default=None, help="decode cache budget in positions")
    p.add_argument("--max-cost", type=int, default=None, help="per-token cost budget in reads (|N(n-1)|)")
    p.add_argument(
        "--layers",
        type=int,
        default=4,
        help="L of the reach column: positions the last token reads within L hops (default 4)",
    )
    p.add_argument("--offset", type=int, default=None, help="copy offset of the congestion (default n/2)")
    p.add_argument(
        "--pattern",
        action="append",
        default=[],
        metavar="SPEC",
        help="add a pattern to the space (repeatable): f:EXPR (with its lattice) or any spec",
    )
    p.add_argument(
        "--families",
        default=",".join(FAMILIES),
        help=f"families to include, comma-separated from {', '.join(FAMILIES)} ('none' for only "
        "the named and --pattern ones)",
    )
    p.add_argument(
        "--bases",
        default=_show(DEFAULT_BASES),
        help="geom bases b of ceil(b^k): a,b,c or start:stop:step (default 1.5:4:0.25)",
    )
    p.add_argument("--powers", default=_show(DEFAULT_POWERS), help="poly powers p of k^p+1 (integers)")
    p.add_argument("--mix-windows", default=_show(DEFAULT_MIX_WINDOWS), help="mix: window lengths w")
    p.add_argument("--mix-bases", default=_show(DEFAULT_MIX_BASES), help="mix: tail bases b")
    p.add_argument("--windows", default=_show(DEFAULT_WINDOWS), help="M of the named window:M rows")
    p.add_argument("--no-lattice", action="store_true", help="family members exact only (no _ce variants)")
    p.add_argument(
        "--no-routing",
        action="store_true",
        help="skip the routed congestion of non-translation-invariant front members (the slow part)",
    )
    p.add_argument(
        "--train",
        default=None,
        metavar="TASK",
        help="train the --top best candidates on this synthetic task (copy, assoc_recall, multi_hop, ...)",
    )
    p.add_argument("--top", type=int, default=2, help="how many candidates --train trains (default 2)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: the quick preset's for the task)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds (default 0)")
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate (default 3e-3)")
    p.add_argument("--workers", type=int, default=None, help="training worker processes (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    p.add_argument("--device", default="cpu", help="torch device for training (default cpu)")
    p.add_argument(
        "--out",
        default=None,
        help="output folder (default runs/design-n<N>); with --train, rerunning "
        "into the same folder skips finished runs",
    )
    p.add_argument("--formats", default="png,svg", help="figure formats, comma-separated: png, svg")
    p.add_argument("--no-plots", action="store_true", help="skip the figure")
    p.add_argument("--json", action="store_true", help="print design.json instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=run)


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
