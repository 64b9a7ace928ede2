"""Arguments of ``tokenmix analyze matrix|cost|expressivity|norms|reads`` and ``tokenmix report`` (handlers:
``analysis_cmd.py``). Light: imports no torch and no registry (cli/main.py)."""

from __future__ import annotations

from tokenmix.analysis.defaults import (
    COST_FULL_MIN_TIME,
    COST_FULL_TIME_N,
    COST_QUICK_MIN_TIME,
    COST_QUICK_MIXERS,
    COST_QUICK_TIME_N,
    DEFAULT_TABLE_N,
    GRAPH_PATH_LIMIT,
    OPERATOR_GRAPH_LIMIT,
)
from tokenmix.cli.options import add_mixers_option


def _common(p, default_formats: str = "png,svg") -> None:
    p.add_argument("--out", default=None, help="output folder (default runs/analyze-<what>-<time>)")
    p.add_argument("--formats", default=default_formats, help="figure formats, comma-separated: png, svg")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _command(subs, name: str, handler: str, add_arguments, **kwargs) -> None:
    """Adds parser ``name`` to ``subs`` with its arguments and its handler ``analysis_cmd:<handler>``."""
    p = subs.add_parser(name, **kwargs)
    add_arguments(p)
    p.set_defaults(handler=f"analysis_cmd:{handler}")


def register(sub) -> None:
    an = sub.add_parser("analyze", help="mixing matrices, cost/cache accounting, expressivity metrics, operator norms")
    asub = an.add_subparsers(dest="analysis", required=True)
    _command(
        asub,
        "matrix",
        "run_matrix",
        _matrix_arguments,
        help="heatmaps of A, B, M per head, B-dependency graph, decay profile",
    )
    _command(
        asub,
        "cost",
        "run_cost",
        _cost_arguments,
        help="derived vs measured decode cache and training time, flagged table (~1 min; --full: every mixer, "
        "30 min or more)",
    )
    _command(
        asub,
        "expressivity",
        "run_expressivity_cmd",
        _expressivity_arguments,
        help="shortest path, congestion, reach: the §4.2–4.3 table from code",
    )
    _command(
        asub,
        "norms",
        "run_norms_cmd",
        _norms_arguments,
        help="spectral norms of M and (I - B)^-1: Gram iteration vs SVD vs power iteration",
    )
    _command(
        asub,
        "reads",
        "run_reads_cmd",
        _reads_arguments,
        help="where a trained synthetic run's layers read, query by query: |M| on the value, key, window, "
        "query, rest; accuracy by read class",
    )
    _command(
        sub,
        "report",
        "run_report",
        _report_arguments,
        help="one self-contained HTML page + Markdown from a run directory or a preset",
    )


def _matrix_arguments(p) -> None:
    p.add_argument("--mixer", help="registered mixer name (random input); or use --run with --text")
    p.add_argument("--n", type=int, default=64, help="sequence length of the random input")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=2, help="number of heads of the mixer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--position", type=int, default=None, help="position of the dependency graph (default: last)")
    p.add_argument("--show-heads", default=None, help="heads to draw, comma-separated (default: first 4)")
    p.add_argument("--channel", type=int, default=0, help="state channel g drawn for A/B when there is a G axis")
    p.add_argument("--run", default=None, help="trained run directory: analyse a layer on --text")
    p.add_argument("--text", default=None, help="text fed through the trained run")
    p.add_argument("--layer", type=int, default=0, help="layer of the trained run")
    _common(p)


def _cost_arguments(p) -> None:
    add_mixers_option(p, f"{', '.join(COST_QUICK_MIXERS)}; --full: all")
    p.add_argument("--full", action="store_true", help="every registered mixer, timed over the longer lengths")
    p.add_argument("--cache-n", type=int, nargs="+", default=[16, 64, 256], help="decode lengths for the cache")
    p.add_argument(
        "--time-n",
        type=int,
        nargs="*",
        action="extend",
        default=None,
        help=f"sequence lengths timed (forward + backward); none to skip timing (default "
        f"{' '.join(map(str, COST_QUICK_TIME_N))}; --full: {' '.join(map(str, COST_FULL_TIME_N))})",
    )
    p.add_argument("--d-model", type=int, default=256, help="model width of the timed mixers")
    p.add_argument("--heads", type=int, default=4, help="heads (head dim = d_model / heads)")
    p.add_argument("--batch", type=int, default=1, help="batch size of the timed forward+backward")
    p.add_argument(
        "--repeats", type=int, default=3, help="timed repeats per n at least (the fastest counts), after one warm-up"
    )
    p.add_argument(
        "--min-time",
        type=float,
        default=None,
        help="repeat a length (up to 25 times) until its timed calls add up to this many seconds (default "
        f"{COST_QUICK_MIN_TIME}; --full: {COST_FULL_MIN_TIME})",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=60.0,
        help="seconds (on --clock) one forward+backward may take, predicted from the previous n via "
        "the derived FLOPs; longer lengths are skipped and listed",
    )
    p.add_argument(
        "--decode-budget",
        type=float,
        default=30.0,
        help="seconds one n-token decode may take (predicted likewise); longer ones are skipped",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for the timing (with --clock cpu, more threads also count their spin-waits)",
    )
    # validated in run_cost rather than by argparse choices: bad input prints one line
    p.add_argument(
        "--clock",
        default="cpu",
        help="cpu: process CPU time (user + system; steady on a shared machine), user: its user part, wall: wall time",
    )
    p.add_argument(
        "--return-memory",
        action="store_true",
        help="time with the allocator's defaults (large buffers returned to the OS on free and "
        "faulted in again on the next call) instead of keeping freed memory in the process",
    )
    p.add_argument("--seed", type=int, default=0)
    _common(p, "png")


def _expressivity_arguments(p) -> None:
    p.add_argument(
        "--patterns",
        default=None,
        help="pattern specs, comma-separated (default: the paper's rows); 'none' for no pattern row",
    )
    add_mixers_option(p, "attention,local_attention", allow_none=True)
    p.add_argument("--n", type=int, nargs="+", default=list(DEFAULT_TABLE_N), help="sequence lengths of the table")
    p.add_argument("--offset", type=int, default=None, help="copy offset L (default n/2)")
    p.add_argument("--layers", type=int, default=4, help="stacked layers for the reach")
    p.add_argument(
        "--path-limit",
        type=int,
        default=None,
        help=f"largest n for graph distances of lattice/Fenwick (default {GRAPH_PATH_LIMIT})",
    )
    p.add_argument(
        "--operator-limit",
        type=int,
        default=None,
        help=f"largest n for materialised-operator graphs (default {OPERATOR_GRAPH_LIMIT})",
    )
    _common(p, "png")


def _norms_arguments(p) -> None:
    add_mixers_option(p, "all")
    p.add_argument("--n", type=int, default=128)
    p.add_argument("--gram-iters", type=int, default=10)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    _common(p, "png")


def _reads_arguments(p) -> None:
    p.add_argument("run", metavar="RUN", help="a finished run's folder (<compare out>/runs/<run id>)")
    p.add_argument("--examples", type=int, default=200, help="test examples read (the run's test seed)")
    _common(p, "png")


def _report_arguments(p) -> None:
    p.add_argument(
        "source",
        metavar="RUN_DIR_OR_PRESET",
        help="a run directory, or an analysis preset (`tokenmix presets --kind analysis` lists them)",
    )
    p.add_argument("--out", default=None, help="report folder (default <run dir>/report)")
    p.add_argument("--quiet", action="store_true")
