"""tokenmix analyze matrix|cost|expressivity|norms ...   and   tokenmix report RUN_DIR_OR_PRESET: the
handlers (their arguments: ``analysis_args.py``).

Each analysis writes JSON, a Markdown table and figures into an output folder (default
runs/analyze-<what>-<time>), prints the table (or JSON with --json) and the folder.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from tokenmix.analysis.accounting import run_accounting
from tokenmix.analysis.accounting_measured import CLOCKS
from tokenmix.analysis.defaults import (
    COST_FULL_MIN_TIME,
    COST_FULL_TIME_N,
    COST_QUICK_MIN_TIME,
    COST_QUICK_MIXERS,
    COST_QUICK_TIME_N,
    GRAPH_PATH_LIMIT,
    OPERATOR_GRAPH_LIMIT,
)
from tokenmix.analysis.expressivity_report import run_expressivity
from tokenmix.analysis.lm_report import build_lm_report, is_lm_run
from tokenmix.analysis.matrices import analyze_matrix, build_analysis_mixer, check_dense_length, random_input
from tokenmix.analysis.norms import run_norms
from tokenmix.analysis.outputs import check_formats, check_out_dir, json_text, plural, prepare_out_dir, text_table
from tokenmix.analysis.reads import analyze_reads
from tokenmix.analysis.reads import summary_rows as reads_summary_rows
from tokenmix.analysis.report import check_run_dir
from tokenmix.analysis.run_inputs import text_layer_input
from tokenmix.cli.limits import check_size
from tokenmix.cli.validate import mixer_list
from tokenmix.core.errors import InputError
from tokenmix.core.progress import Progress
from tokenmix.core.seeds import check_seed
from tokenmix.mixers.registry import build_mixer, get_mixer_spec, mixer_names
from tokenmix.patterns import get_pattern
from tokenmix.study.analysis_suite import report
from tokenmix.study.paper import PAPER_ATTENTION, PAPER_PATTERNS
from tokenmix.study.presets import presets


def _progress(args):
    if getattr(args, "json", False) or getattr(args, "quiet", False):
        return None
    return lambda msg: print(f"  {msg}", file=sys.stderr, flush=True)


@contextmanager
def _counted(args, label: str, total: int, unit: str):
    """Progress over ``total`` items whose start is announced as a message ('cost: NAME'): a line as
    each item starts in a log ('analyze cost: NAME k/total mixers, elapsed, ETA'), the live bar on a
    terminal, one load warning at the start; nothing with --json or --quiet."""
    enabled = not (getattr(args, "json", False) or getattr(args, "quiet", False))
    bar = Progress(label, total, unit=unit, enabled=enabled, check_load=enabled)
    started = [0]

    def on_message(msg: str) -> None:
        bar.note(msg.split(": ", 1)[-1])  # 'cost: NAME' -> NAME
        bar.advance(1 if started[0] else 0, event="")  # the previous item is done: one line
        started[0] += 1

    with bar:
        yield on_message if enabled else None
        if started[0]:
            bar.advance(1)


def _positive(values, flag: str, minimum: int = 1) -> None:
    for v in values:
        if v < minimum:
            raise InputError(f"{flag} values must be >= {minimum}, got {v}")


# memory models of the size checks (upper estimates of the measured peaks): a mixer of width d holds
# a few d x d projections in float64 with their gradients; cost's decode keeps the inputs, outputs
# and (for attention) an n-position cache, its timed forward+backward the activations of every op
WIDTH_BYTES_PER_D2 = 256
DECODE_BYTES_PER_POSITION_AND_WIDTH = 64
TRAIN_BYTES_PER_POSITION_AND_WIDTH = 256
# expressivity: the per-gap arrays of the gap DP and a dense pattern's list of distances, per position;
# graph distances of lattice/Fenwick patterns and materialised operators, per pair (up to --path-limit)
EXPRESSIVITY_BYTES_PER_POSITION = 96
EXPRESSIVITY_BYTES_PER_PAIR = 64
MAX_LAYERS = 1000  # expressivity: the reach is reported layer by layer
MAX_GRAM_ITERS = 100  # norms: Gram iteration squares the matrix each step (converged long before)


def _check_width(args) -> None:
    """--d-model and --heads: positive, and a mixer of that width fits in memory."""
    _positive([args.d_model], "--d-model")
    _positive([args.heads], "--heads")
    check_size(
        "--d-model",
        args.d_model,
        lambda d: WIDTH_BYTES_PER_D2 * float(d) ** 2,
        "a mixer of this width (its d_model x d_model projections)",
    )


def _check_mixers_build(names, d_model: int, heads: int) -> None:
    """Build each mixer once on the meta device (no memory, no time), so that its own checks of the
    width and the heads refuse bad input before an output folder is made."""
    for name in names:
        with torch.device("meta"):
            build_mixer(name, d_model, n_heads=heads)


def _check_positive_channel(args) -> None:
    if args.channel < 0:
        raise InputError(f"--channel must be >= 0, got {args.channel}")


def _head_list(text: str | None) -> list[int] | None:
    """--show-heads '0,2' -> [0, 2]."""
    if text is None:
        return None
    try:
        heads = [int(h) for h in text.split(",") if h.strip()]
    except ValueError:
        raise InputError(f"--show-heads takes comma-separated head indices such as 0,1; got '{text}'") from None
    if not heads:
        raise InputError("--show-heads is empty; give comma-separated head indices such as 0,1")
    return heads


@contextmanager
def _out_dir(path: str | None, kind: str):
    """The output folder; one this command created is removed again when bad input surfaces only
    during the analysis (an out-of-range channel, say) and nothing was written into it yet."""
    planned = Path(path) if path is not None else Path("runs") / "analyze-new"  # default: runs/<new folder>
    missing = [d for d in (planned, *planned.parents) if not d.exists()]
    out = prepare_out_dir(path, kind)
    try:
        yield out
    except InputError:
        for d in [out] + missing[1:] if path is None else missing:  # deepest first
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        raise


def _finish(args, out_dir, rows, payload) -> int:
    if args.json:
        print(json_text({"out_dir": str(out_dir), **payload}))
    else:
        print(text_table(rows))
        print(f"wrote {out_dir}")
    return 0


def run_matrix(args) -> int:
    check_seed(args.seed)  # before anything is built or --out is made
    formats = check_formats(args.formats.split(","))
    check_out_dir(args.out)
    heads = _head_list(args.show_heads)
    if args.run is not None and args.mixer is not None:
        raise InputError("give either --mixer NAME (random input) or --run DIR --text TEXT, not both")
    if args.text is not None and args.run is None:
        raise InputError("--text needs --run DIR (the trained run the text is fed through)")
    if args.run is not None:
        if args.text is None:
            raise InputError("--run needs --text (the text fed through the trained model)")
        _positive([args.layer], "--layer", 0)

        mixer, x, name = text_layer_input(args.run, args.text, args.layer)
        check_dense_length(x.shape[1], "the matrix viewer")
        mixer, x = mixer.double(), x.double()
        note = f"layer {args.layer} of run {args.run} on a {x.shape[1]}-token text"
    else:
        if args.mixer is None:
            raise InputError("give --mixer NAME (random input) or --run DIR --text TEXT")
        get_mixer_spec(args.mixer)
        check_dense_length(args.n, "the matrix viewer")
        _check_width(args)
        mixer = build_analysis_mixer(args.mixer, args.d_model, args.heads, args.seed)
        x, name = random_input(mixer, args.n, seed=args.seed), args.mixer
        note = f"random N(0, 1) input, seed {args.seed}"
    _check_positive_channel(args)
    n_heads = getattr(mixer, "n_heads", None)
    if heads is not None and isinstance(n_heads, int):
        bad = [h for h in heads if not 0 <= h < n_heads]
        if bad:
            raise InputError(
                f"--show-heads {','.join(map(str, bad))} out of range: the mixer has heads 0..{n_heads - 1}"
            )
    if args.position is not None and not 0 <= args.position < x.shape[1]:
        raise InputError(f"--position {args.position} out of range [0, {x.shape[1]})")
    with _out_dir(args.out, "matrix") as out_dir, torch.no_grad():
        res = analyze_matrix(
            mixer,
            x,
            out_dir,
            name=name,
            position=args.position,
            heads=heads,
            channel=args.channel,
            formats=formats,
            input_note=note,
        )
    rows = [{"field": k, "value": v} for k, v in res["summary"].items()]
    rows += [
        {"field": "dependency reached", "value": res["dependency"]["reached"]},
        {"field": "dependency max hops", "value": res["dependency"]["max_hops"]},
        {"field": "figures", "value": ", ".join(res["figures"])},
    ]
    payload = {k: v for k, v in res.items() if k != "decay_profile"}
    return _finish(args, out_dir, rows, payload)


def run_cost(args) -> int:
    check_seed(args.seed)  # before anything is built or --out is made
    formats = check_formats(args.formats.split(","))
    if args.time_n is None:
        args.time_n = list(COST_FULL_TIME_N if args.full else COST_QUICK_TIME_N)
    if args.min_time is None:
        args.min_time = COST_FULL_MIN_TIME if args.full else COST_QUICK_MIN_TIME
    if args.clock not in CLOCKS:
        raise InputError(f"--clock must be one of {', '.join(CLOCKS)}, got '{args.clock}'")
    _positive(args.cache_n, "--cache-n")
    if not args.min_time >= 0:
        raise InputError(f"--min-time must be >= 0, got {args.min_time}")
    _positive(args.time_n, "--time-n", 2)
    for flag, v in (
        ("--d-model", args.d_model),
        ("--heads", args.heads),
        ("--batch", args.batch),
        ("--repeats", args.repeats),
        ("--threads", args.threads),
    ):
        _positive([v], flag)
    for flag, v in (("--time-budget", args.time_budget), ("--decode-budget", args.decode_budget)):
        if not v > 0 or v == float("inf"):
            raise InputError(f"{flag} must be a positive number of seconds, got {v}")
    _check_width(args)
    width = float(args.batch) * args.d_model
    for n in args.cache_n:
        check_size(
            "--cache-n",
            n,
            lambda m: DECODE_BYTES_PER_POSITION_AND_WIDTH * width * m,
            f"an n-token decode at batch {args.batch} and d_model {args.d_model}",
        )
    for n in args.time_n:
        check_size(
            "--time-n",
            n,
            lambda m: TRAIN_BYTES_PER_POSITION_AND_WIDTH * width * m,
            f"a forward+backward over n tokens at batch {args.batch} and d_model {args.d_model}",
        )
    names = mixer_list(args.mixers, default=None if args.full else COST_QUICK_MIXERS)
    check_out_dir(args.out)
    _check_mixers_build(names, args.d_model, args.heads)
    with _out_dir(args.out, "cost") as out_dir, _counted(args, "analyze cost", len(names), "mixers") as progress:
        res = run_accounting(
            names,
            out_dir,
            formats=formats,
            progress=progress,
            cache_ns=args.cache_n,
            time_ns=args.time_n,
            d_model=args.d_model,
            n_heads=args.heads,
            batch=args.batch,
            repeats=args.repeats,
            time_budget_s=args.time_budget,
            decode_budget_s=args.decode_budget,
            threads=args.threads,
            clock=args.clock,
            min_time_s=args.min_time,
            keep_memory=not args.return_memory,
            seed=args.seed,
        )
    return _finish(args, out_dir, res["summary"], {"summary": res["summary"], "threads": res["threads"]})


def run_expressivity_cmd(args) -> int:
    formats = check_formats(args.formats.split(","))
    _positive(args.n, "--n", 2)
    _positive([args.layers], "--layers")
    if args.layers > MAX_LAYERS:
        raise InputError(f"--layers must be <= {MAX_LAYERS} (the reach is computed layer by layer), got {args.layers}")
    for flag, v in (("--path-limit", args.path_limit), ("--operator-limit", args.operator_limit)):
        if v is not None and v < 0:
            raise InputError(f"{flag} must be >= 0, got {v}")
    path_limit = GRAPH_PATH_LIMIT if args.path_limit is None else args.path_limit
    operator_limit = OPERATOR_GRAPH_LIMIT if args.operator_limit is None else args.operator_limit
    pair_limit = max(path_limit, operator_limit)
    for n in args.n:
        check_size(
            "--n",
            n,
            lambda m: (
                EXPRESSIVITY_BYTES_PER_POSITION * float(m)
                + (EXPRESSIVITY_BYTES_PER_PAIR * float(m) ** 2 if m <= pair_limit else 0.0)
            ),
            "the per-position arrays of the path metrics"
            + (" and the [n, n] graph distances" if n <= pair_limit else ""),
            lo=2,
        )
    if args.patterns is None:
        patterns = list(PAPER_PATTERNS)
    elif args.patterns.strip() == "none":
        patterns = []
    else:
        patterns = [p.strip() for p in args.patterns.split(",") if p.strip()]
    for p in patterns:
        get_pattern(p)
    mixers = mixer_list(args.mixers, default=[m for m in PAPER_ATTENTION if m in mixer_names()], allow_none=True)
    if not patterns and not mixers:
        raise InputError("nothing to analyse: give --patterns and/or --mixers")
    if args.offset is not None:
        bad = [n for n in args.n if not 0 < args.offset < n]
        if bad:
            raise InputError(f"--offset {args.offset} must be in [1, n) for every n; fails for n = {bad}")
    check_out_dir(args.out)
    kwargs = {}
    if args.path_limit is not None:
        kwargs["path_limit"] = args.path_limit
    if args.operator_limit is not None:
        kwargs["operator_limit"] = args.operator_limit
    with _out_dir(args.out, "expressivity") as out_dir:
        res = run_expressivity(
            out_dir,
            formats=formats,
            patterns=patterns,
            mixers=mixers,
            ns=args.n,
            offset=args.offset,
            layers=args.layers,
            progress=_progress(args),
            **kwargs,
        )
    return _finish(args, out_dir, res["summary"], {"summary": res["summary"]})


def run_norms_cmd(args) -> int:
    check_seed(args.seed)  # before anything is built or --out is made
    formats = check_formats(args.formats.split(","))
    check_dense_length(args.n, "operator norms")
    _positive([args.gram_iters], "--gram-iters", 0)
    if args.gram_iters > MAX_GRAM_ITERS:
        raise InputError(
            f"--gram-iters must be <= {MAX_GRAM_ITERS} (each squares the matrix; the bound has "
            f"converged long before), got {args.gram_iters}"
        )
    _check_width(args)
    names = mixer_list(args.mixers)
    check_out_dir(args.out)
    _check_mixers_build(names or mixer_names(), args.d_model, args.heads)
    with _out_dir(args.out, "norms") as out_dir:
        res = run_norms(
            names,
            out_dir,
            n=args.n,
            gram_iters=args.gram_iters,
            d_model=args.d_model,
            n_heads=args.heads,
            seed=args.seed,
            formats=formats,
            progress=_progress(args),
        )
    return _finish(args, out_dir, res["summary"], {"summary": res["summary"]})


MAX_READ_EXAMPLES = 10_000  # materialises [examples, H, T, T] per layer


def run_reads_cmd(args) -> int:
    formats = check_formats(args.formats.split(","))
    _positive([args.examples], "--examples")
    if args.examples > MAX_READ_EXAMPLES:
        raise InputError(f"--examples must be <= {MAX_READ_EXAMPLES}, got {args.examples}")
    run = Path(args.run)
    if not (run / "config.json").is_file():
        raise InputError(f"'{run}' is not a run folder (no config.json): give <compare out>/runs/<run id>")
    check_out_dir(args.out)
    with _out_dir(args.out, "reads") as out_dir:
        payload = analyze_reads(run, out_dir, args.examples, formats)
    if not args.json:
        for layer in payload["layers"]:
            print(layer["verdict"])
        split = payload["read_split"]
        print(
            "test accuracy by read (share of queries): "
            + "; ".join(
                f"{name} {'—' if v['acc'] is None else format(100 * v['acc'], '.1f') + ' %'} ({100 * v['share']:.1f} %)"
                for name, v in split.items()
            )
        )
    return _finish(args, out_dir, reads_summary_rows(payload), {"reads": payload})


def run_report(args) -> int:
    names = [pr.name for pr in presets("analysis")]
    if args.out is not None:  # before a preset runs or a page is made
        check_out_dir(args.out)
    if args.source in names and not Path(args.source).exists() and args.out is None:
        check_out_dir(None)  # a preset runs into runs/report-<preset>-<time> (with --out: inside it)
    if is_lm_run(Path(args.source)):  # a `train lm` run: its own page (result, curves, generations)
        res = build_lm_report(args.source, args.out)
        print(f"report: {res['html']}")
        print(f"markdown: {res['markdown']}")
        print(f"{res['verdict']} ({res['figures']} figures, {res['generations']} generations)")
        return 0
    if Path(args.source).exists():  # a folder that is no run is refused before a report is written into it
        check_run_dir(Path(args.source), f"; give a run directory or an analysis preset: {', '.join(names)}")
    res = report(
        args.source,
        args.out,
        progress=None if args.quiet else (lambda msg: print(f"  {msg}", file=sys.stderr, flush=True)),
    )
    print(f"report: {res['html']}")
    print(f"markdown: {res['markdown']}")
    print(f"run directory: {res['run_dir']} ({plural(res['sections'], 'section')}, {plural(res['figures'], 'figure')})")
    return 0
