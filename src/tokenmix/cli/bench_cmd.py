"""tokenmix bench solver|decode|mixers|lm -- JSON on stdout (progress on stderr)."""
from __future__ import annotations

import json
import sys


def _progress(r: dict) -> None:
    keys = ("mixer", "mode", "n", "time_s", "latency_ms", "peak_mb", "error")
    print("  " + " ".join(f"{k}={r[k]:.4g}" if isinstance(r.get(k), float) else f"{k}={r[k]}"
                          for k in keys if k in r), file=sys.stderr, flush=True)


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks (JSON output)")
    bsub = p.add_subparsers(dest="bench", required=True)
    s = bsub.add_parser("solver", help="dense vs chunked fwd+bwd time and peak memory per pattern, SDPA baseline")
    s.add_argument("--n", type=int, nargs="+", default=None, help="sequence lengths (default 1024 4096 16384)")
    s.add_argument("--patterns", nargs="+", default=None, help="structured mixer names")
    s.set_defaults(func=_run_solver)
    d = bsub.add_parser("decode", help="per-token decode latency and cached positions, KV-attention baseline")
    d.add_argument("--n", type=int, nargs="+", default=None)
    d.add_argument("--mixers", nargs="+", default=None)
    d.set_defaults(func=_run_decode)
    m = bsub.add_parser("mixers", help="fwd+bwd time of every registered mixer vs SDPA, with achieved GFLOP/s")
    m.add_argument("--n", type=int, nargs="+", default=None, help="sequence lengths (default 512 2048 8192)")
    m.add_argument("--mixers", nargs="+", default=None)
    m.set_defaults(func=_run_mixers)
    try:
        from tokenmix.training import bench_lm
    except ImportError:
        return
    lm = bsub.add_parser("lm", help="LM training and decode tokens/s per mixer at equal parameter count")
    bench_lm.add_arguments(lm)
    lm.set_defaults(func=bench_lm.run)


def _check_sizes(ns):
    for n in ns or []:
        if n < 1:
            raise ValueError(f"--n must be >= 1, got {n}")


def _run_solver(args) -> int:
    from tokenmix.bench import solver
    _check_sizes(args.n)
    print(json.dumps(solver.run(args.n, args.patterns, _progress), indent=1))
    return 0


def _run_decode(args) -> int:
    from tokenmix.bench import decode
    _check_sizes(args.n)
    print(json.dumps(decode.run(args.n, args.mixers, _progress), indent=1))
    return 0


def _run_mixers(args) -> int:
    from tokenmix.bench import mixers
    _check_sizes(args.n)
    print(json.dumps(mixers.run(args.n, args.mixers, _progress), indent=1))
    return 0
