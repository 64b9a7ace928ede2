"""Arguments of ``tokenmix design`` (handler: ``design_cmd.py``). Light: imports no torch (cli/main.py)."""

from __future__ import annotations

from tokenmix.analysis import defaults


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
        default=",".join(defaults.FAMILIES),
        help=f"families to include, comma-separated from {', '.join(defaults.FAMILIES)} ('none' for only "
        "the named and --pattern ones)",
    )
    p.add_argument(
        "--bases",
        default=_show(defaults.DEFAULT_BASES),
        help="geom bases b of ceil(b^k): a,b,c or start:stop:step (default 1.5:4:0.25)",
    )
    p.add_argument("--powers", default=_show(defaults.DEFAULT_POWERS), help="poly powers p of k^p+1 (integers)")
    p.add_argument("--mix-windows", default=_show(defaults.DEFAULT_MIX_WINDOWS), help="mix: window lengths w")
    p.add_argument("--mix-bases", default=_show(defaults.DEFAULT_MIX_BASES), help="mix: tail bases b")
    p.add_argument("--windows", default=_show(defaults.DEFAULT_WINDOWS), help="M of the named window:M rows")
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
    p.set_defaults(handler="design_cmd:run")
