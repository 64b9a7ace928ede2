"""tokenmix patterns --pattern NAME [--cache-efficient] --n N [--json]"""

from __future__ import annotations

import json
import math

from tokenmix.cli.limits import check_size, memory_budget
from tokenmix.core.errors import InputError
from tokenmix.patterns import Fenwick, Lattice, Pattern, TranslationInvariant, get_pattern, pattern_report

# memory of pattern_report (measured peaks, rounded up): the neighbour table [n, levels] behind nnz(B)
# and its temporaries (the lattice's rounding and deduplication: ~37 bytes an entry), and the [n, n]
# distance matrix of the shortest paths with its triangle indices (~21 bytes an entry)
TABLE_BYTES_PER_ENTRY = 40
PATH_BYTES_PER_PAIR = 24


def levels_up_to(pat: Pattern, n: int, cap: int) -> int:
    """Level slots of ``pat`` at length n, counted no further than cap + 1 (cap + 1 = more than cap).

    A translation-invariant f is evaluated only as far as needed: dense has n - 1 levels, and
    counting them one by one for an absurd n would take as long as the work being sized.
    """
    if isinstance(pat, Fenwick):
        return pat.n_levels(n)
    base = pat.base if isinstance(pat, Lattice) else pat
    if not isinstance(base, TranslationInvariant):
        return pat.n_levels(n)
    m = min(n, cap + 2)
    while True:
        k = base.n_levels(m)  # f(k) <= m - 1: at most m - 1 evaluations, cached for the next call
        if k > cap:
            return cap + 1
        if m >= n:
            return k
        m = min(n, 2 * m)


def report_bytes(pat: Pattern, n: int, path_limit: int, budget: int) -> float:
    """Bytes ``pattern_report(pat, n, path_limit)`` allocates at its peak (an upper estimate);
    math.inf when the levels alone are past what ``budget`` bytes could hold."""
    cap = budget // (TABLE_BYTES_PER_ENTRY * max(n, 1)) + 1
    levels = levels_up_to(pat, n, cap)
    if levels > cap:
        return math.inf
    table = TABLE_BYTES_PER_ENTRY * float(n) * levels
    return table + (PATH_BYTES_PER_PAIR * float(n) ** 2 if n <= path_limit else 0.0)


def run(args) -> int:
    pat = get_pattern(args.pattern, args.cache_efficient)
    if args.path_limit < 0:
        raise InputError(f"--path-limit must be >= 0 (0 = no shortest paths), got {args.path_limit}")
    for n in args.n:
        if n < 1:
            raise InputError(f"--n must be >= 1, got {n}")
    budget = memory_budget()
    for n in args.n:
        check_size(
            "--n",
            n,
            lambda m: report_bytes(pat, m, args.path_limit, budget),
            f"pattern '{pat.name}' (its [n, levels] neighbour table"
            + (" and [n, n] shortest-path distances)" if n <= args.path_limit else ")"),
        )
    reports = [pattern_report(pat, n, args.path_limit) for n in args.n]
    if args.json:
        print(json.dumps(reports if len(reports) > 1 else reports[0], indent=2))
    else:
        for r in reports:
            print("  ".join(f"{k}={v if not isinstance(v, float) else round(v, 3)}" for k, v in r.items()))
    return 0
