"""tokenmix demo -- a short built-in tour: pattern facts, mode equivalence and a small decode/solver timing."""

from __future__ import annotations

import sys
import time

import torch
from rich.console import Console
from rich.table import Table

from tokenmix.cli.limits import check_size, memory_budget
from tokenmix.cli.patterns_cmd import report_bytes
from tokenmix.core.errors import InputError
from tokenmix.mixers import build_mixer
from tokenmix.patterns import get_pattern, pattern_report

DEMO_PATTERNS = ("first_order", "window:4", "pow2", "pow2_ce", "sq1", "sq1_ce", "dense")
PATH_LIMIT = 2048


def run(args) -> int:
    if args.n < 2:
        raise InputError(f"--n must be >= 2, got {args.n}")
    pats, budget = [get_pattern(spec) for spec in DEMO_PATTERNS], memory_budget()
    check_size(
        "--n",
        args.n,
        lambda n: max(report_bytes(p, n, PATH_LIMIT, budget) for p in pats),
        "the demo's pattern tables (dense: [n, n - 1])",
        lo=2,
    )
    console = Console() if sys.stdout.isatty() else Console(width=200)  # a log gets the tables uncut
    n = args.n
    table = Table(title=f"Patterns at n = {n} (derived)")
    for col in ("pattern", "|N(n-1)|", "nnz(B)", "cache", "path max", "path mean"):
        table.add_column(col, justify="right")
    for spec, pat in zip(DEMO_PATTERNS, pats):
        r = pattern_report(pat, n, path_limit=PATH_LIMIT)
        table.add_row(
            spec,
            str(r["neighbors_last_token"]),
            str(r["nnz_B"]),
            str(r["cache_size"]),
            f"{r.get('shortest_path_max', float('nan')):.0f}",
            f"{r.get('shortest_path_mean', float('nan')):.2f}",
        )
    console.print(table)

    torch.manual_seed(0)
    eq = Table(title=f"Modes of the structured mixer, float64, n = {min(n, 256)}: max |y - y_chunked|, decode")
    for col in ("mixer", "dense", "recurrent", "chunked ms", "dense ms", "step ms", "cache (measured/derived)"):
        eq.add_column(col, justify="right")
    t = min(n, 256)
    for name in ("pow2", "pow2_ce", "sq1", "sq1_ce"):
        m = build_mixer(name, 64, n_heads=4, chunk_size=32).double()
        x = torch.randn(1, t, 64, dtype=torch.float64)
        with torch.no_grad():
            for mode in ("chunked", "dense", "recurrent"):  # untimed: kernels compile, plans build on first use
                m(x, mode=mode)
            t0 = time.perf_counter()
            y_c, _ = m(x, mode="chunked")
            tc = time.perf_counter() - t0
            t0 = time.perf_counter()
            y_d, _ = m(x, mode="dense")
            td = time.perf_counter() - t0
            t0 = time.perf_counter()
            y_r, st = m(x, mode="recurrent")
            tr = time.perf_counter() - t0
        eq.add_row(
            name,
            f"{(y_d - y_c).abs().max().item():.1e}",
            f"{(y_r - y_c).abs().max().item():.1e}",
            f"{1e3 * tc:.1f}",
            f"{1e3 * td:.1f}",
            f"{1e3 * tr / t:.2f}",
            f"{st.peak_positions}/{m.cache_positions(t)}",
        )
    console.print(eq)
    console.print(
        "Next: [bold]tokenmix bench solver[/], [bold]tokenmix bench decode[/], "
        "[bold]tokenmix patterns --pattern sq1_ce --n 2048 --json[/]"
    )
    return 0
