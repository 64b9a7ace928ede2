"""Arguments of ``tokenmix compare`` and ``tokenmix presets`` (handlers: ``compare_cmd.py``). Light:
imports no torch and no registry (cli/main.py)."""

from __future__ import annotations

from tokenmix.cli.options import add_mixers_option
from tokenmix.study.durations import stated


def register(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="train each mixer structure on the synthetic tasks and print the "
        "cost / cache / shortest path / accuracy table",
    )
    p.add_argument(
        "--preset",
        default="quick",
        help="a compare preset (`tokenmix presets --kind compare` lists them; default quick, "
        f"{stated('compare quick')} on 2 CPU cores) or a path to a preset .py file",
    )
    p.add_argument("--list-presets", action="store_true", help="list the compare presets and exit")
    add_mixers_option(p, "none", allow_none=True, prefix="extra rows: ")
    p.add_argument(
        "--out",
        default=None,
        help="run directory (default runs/compare-<preset>); rerunning with the same directory skips finished runs",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="parallel worker processes (default: 2 if the machine has 2+ cores, else 1)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per worker (default 1: the models are small, one thread per process is fastest)",
    )
    p.add_argument("--device", default="cpu", help="torch device for training, e.g. cuda (default cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.set_defaults(handler="compare_cmd:run")

    lp = sub.add_parser("presets", help="every preset (compare, lm, analysis) with one line each")
    lp.add_argument("--kind", default=None, help="only presets of this kind: compare, lm or analysis")
    lp.set_defaults(handler="compare_cmd:run_list")
