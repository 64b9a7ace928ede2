"""Arguments of ``tokenmix patterns`` (handler: ``patterns_cmd.py``). Light: imports no torch (cli/main.py)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("patterns", help="derived facts of a sparsity pattern")
    p.add_argument(
        "--pattern",
        required=True,
        help="pow2, sq1, dense, first_order, window:M, fenwick, f:EXPR (suffix _ce = cache-efficient)",
    )
    p.add_argument("--cache-efficient", action="store_true", help="use the lattice variant (Prop. 4.12)")
    p.add_argument("--n", type=int, nargs="+", default=[1024], help="sequence length(s)")
    p.add_argument(
        "--path-limit", type=int, default=4096, help="largest n for which shortest paths are computed (0 = none)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler="patterns_cmd:run")
