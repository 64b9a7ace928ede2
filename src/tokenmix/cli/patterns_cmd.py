"""tokenmix patterns --pattern NAME [--cache-efficient] --n N [--json]"""
from __future__ import annotations

import json

from tokenmix.core.errors import InputError
from tokenmix.patterns import get_pattern, pattern_report


def register(sub) -> None:
    p = sub.add_parser("patterns", help="derived facts of a sparsity pattern")
    p.add_argument("--pattern", required=True, help="pow2, sq1, dense, first_order, window:M, fenwick, f:EXPR (suffix _ce = cache-efficient)")
    p.add_argument("--cache-efficient", action="store_true", help="use the lattice variant (Prop. 4.12)")
    p.add_argument("--n", type=int, nargs="+", default=[1024], help="sequence length(s)")
    p.add_argument("--path-limit", type=int, default=4096, help="largest n for which shortest paths are computed")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    pat = get_pattern(args.pattern, args.cache_efficient)
    for n in args.n:
        if n < 1:
            raise InputError(f"--n must be >= 1, got {n}")
    reports = [pattern_report(pat, n, args.path_limit) for n in args.n]
    if args.json:
        print(json.dumps(reports if len(reports) > 1 else reports[0], indent=2))
    else:
        for r in reports:
            print("  ".join(f"{k}={v if not isinstance(v, float) else round(v, 3)}" for k, v in r.items()))
    return 0
