"""tokenmix bench solver|decode|mixers|lm|step -- JSON on stdout (progress on stderr); tokenmix bench hf -- a
table on stdout (``--out`` also writes the JSON). The handlers (their arguments: ``bench_args.py``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from tokenmix.bench import decode, mixers, packed, solver
from tokenmix.bench.device import check_device
from tokenmix.bench.lm import run as run_lm_bench
from tokenmix.bench.settings import (
    FULL_MIXER_SIZES,
    FULL_SOLVER_SIZES,
    QUICK_MIXER_SIZES,
    QUICK_MIXERS,
    QUICK_SOLVER_PATTERNS,
    QUICK_SOLVER_SIZES,
    LMBenchConfig,
)
from tokenmix.cli.limits import check_size, fmt_bytes, memory_budget
from tokenmix.cli.validate import mixer_list
from tokenmix.core.errors import InputError, MissingDependency
from tokenmix.core.files import atomic_write_text
from tokenmix.core.progress import Progress
from tokenmix.core.seeds import check_seed
from tokenmix.mixers.registry import get_mixer_spec
from tokenmix.study import step_bench
from tokenmix.study.presets import compare_preset

# memory models of the size checks (upper estimates of measured peaks, d_model 256 = 4 heads x 64):
# a decode keeps every n's prefilled input and state at once (8-22 KiB a position measured); a
# forward+backward keeps the activations of every op (per sequence in the batch)
DECODE_BYTES_PER_POSITION = 32 * 2**10
TRAIN_BYTES_PER_POSITION = 64 * 2**10
DENSE_MODE_BYTES_PER_PAIR = 128  # solver's dense mode: [1, 4, n, n] float32 matrices and their gradients
# the structured mixers' modes the solver benchmark needs (``compiled``, the chunked mode on numba,
# still names them: a mixer without it is no structured one)
SOLVER_MODES = ("compiled", "chunked", "dense")
PACKED_MAX_REPEATS = 1000  # bench packed --repeats: each is a forward+backward of three batches


def _describe(r: dict) -> str:
    keys = ("mixer", "label", "environment", "mode", "n", "time_s", "latency_ms", "cpu_ms_per_step", "peak_mb", "error")
    keys += ("packed_over_unpacked", "padded_over_unpacked")
    return " ".join(f"{k}={r[k]:.4g}" if isinstance(r.get(k), float) else f"{k}={r[k]}" for k in keys if k in r)


def _progress(r: dict) -> None:
    print("  " + _describe(r), file=sys.stderr, flush=True)


def _cases(what: str, total: int) -> tuple[Progress, Callable[[dict], None]]:
    """A benchmark's progress over its ``total`` cases: in a log, a line per finished case (k/total,
    elapsed, ETA, the case's numbers), on a terminal the live bar; one warning at the start when other
    work already loads the machine (its timings then move)."""
    bar = Progress(f"bench {what}", total, unit="cases", check_load=True)

    def done(r: dict) -> None:
        bar.advance(1, event=_describe(r))

    return bar, done


def run_step(args) -> int:
    names = mixer_list(args.mixers, default=["attention", "mamba2", "pow2", "sq1_ce"])
    envs = [e.strip() for e in args.environments.split(",") if e.strip()]
    bad = [e for e in envs if e not in step_bench.ENVIRONMENTS]
    if bad or not envs:
        raise InputError(f"--environments: unknown {bad or envs}; use {', '.join(step_bench.ENVIRONMENTS)}")
    for flag, v in (("--steps", args.steps), ("--repeats", args.repeats)):
        if v < 1:
            raise InputError(f"{flag} must be >= 1, got {v}")
    if not 0 <= args.busy <= 64:
        raise InputError(f"--busy must be in 0..64, got {args.busy}")
    runs = compare_preset(args.preset).build(names)
    configs = []
    for name in names:
        cfg = next((c for c in runs if c.label == name), None)
        if cfg is None:
            raise InputError(f"preset '{args.preset}' has no run of row '{name}'")
        configs.append(cfg)
    print(
        json.dumps(
            step_bench.run(
                configs, args.steps, repeats=args.repeats, environments=envs, busy=args.busy, progress=_progress
            ),
            indent=1,
        )
    )
    return 0


def lm_bench_config(args) -> LMBenchConfig:
    """The ``bench lm`` flags as the benchmark's config."""
    mixers = LMBenchConfig().mixers if args.mixers is None else ",".join(mixer_list(args.mixers))
    return LMBenchConfig(
        mixers=mixers,
        contexts=tuple(args.contexts),
        layers=args.layers,
        n_heads=args.n_heads,
        target_params=args.target_params,
        vocab_size=args.vocab_size,
        batch_tokens=args.batch_tokens,
        train_steps=args.train_steps,
        decode_tokens=args.decode_tokens,
        decode_block=args.decode_block,
        threads=args.threads,
        seed=args.seed,
        out=args.out,
        device=args.device,
    )


def run_lm(args) -> int:
    check_device(args.device)
    print(json.dumps(run_lm_bench(lm_bench_config(args), available_memory=memory_budget()), indent=2))
    return 0


def run_hf(args) -> int:
    # transformers is an optional dependency (the ``hf`` extra) and takes seconds to import, so the
    # benchmark is imported when it runs -- not on every tokenmix command, and not to dodge a cycle.
    try:
        from tokenmix.bench import hf_generate
    except ImportError as e:
        if getattr(e, "name", None) and e.name.split(".")[0] == "transformers":
            raise MissingDependency("transformers", "tokenmix bench hf", "hf") from None
        raise
    names = mixer_list(args.mixers, default=["attention", "pow2_ce", "mamba2"])
    cfg = hf_generate.HFBenchConfig(
        mixers=tuple(names),
        layers=args.layers,
        d_model=args.d_model,
        n_heads=args.n_heads,
        prompt=args.prompt,
        new_tokens=args.new_tokens,
        warmup=args.warmup,
        repeats=args.repeats,
        threads=args.threads,
    )
    if args.out is not None:  # checked now, not after the timing
        out = Path(args.out)
        if out.is_dir():
            raise InputError(f"--out '{out}' is a folder; give the path of the JSON file to write")
        if not out.parent.is_dir():
            raise InputError(f"--out '{out}': folder '{out.parent}' does not exist")
    check_size("--d-model", cfg.d_model, lambda d: hf_generate.weight_bytes(cfg, d), "the models' weights")
    # the prompt alone first, so that a huge --prompt is named as the cause
    check_size(
        "--prompt",
        cfg.prompt,
        lambda n: DECODE_BYTES_PER_POSITION * float(cfg.layers) * (n + 1) * cfg.d_model / 256,
        "the prompt's decode caches",
    )
    check_size(
        "--new-tokens",
        cfg.new_tokens,
        lambda n: DECODE_BYTES_PER_POSITION * float(cfg.layers) * (cfg.prompt + n) * cfg.d_model / 256,
        "the decode caches",
    )
    result = hf_generate.run(
        cfg,
        lambda r: print(
            f"  {r['mixer']}: HF generate {r['hf_ms_per_token']:.3f} ms/token, "
            f"tokenmix {r['tokenmix_ms_per_token']:.3f}",
            file=sys.stderr,
            flush=True,
        ),
    )
    if args.out:
        atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    print(hf_generate.table(result))
    return 0


def _check_sizes(ns, need, what: str):
    """--n values: >= 1, and what ``need(n)`` bytes stand for fits in memory."""
    for n in ns or []:
        if n < 1:
            raise InputError(f"--n must be >= 1, got {n}")
    for n in ns or []:
        check_size("--n", n, need, what)


def _check_mixers(names, flag: str, modes: tuple[str, ...] = ()) -> None:
    """Every name registered (and, for the solver, a structured mixer with ``modes``), before any case runs:
    an unknown name is bad input (exit 2), not an error row inside the JSON."""
    for name in names or []:
        spec = get_mixer_spec(name)  # InputError naming the known mixers
        missing = [m for m in modes if m not in spec.cls.modes]
        if missing:
            raise InputError(
                f"{flag}: '{name}' has no {'/'.join(missing)} mode (modes: {', '.join(spec.cls.modes)}); "
                f"this benchmark times the structured mixers' {'/'.join(modes)} modes"
            )


def run_solver(args) -> int:
    check_device(args.device)
    _check_mixers(args.patterns, "--patterns", SOLVER_MODES)
    if args.n is None:
        args.n = list(FULL_SOLVER_SIZES if args.full else QUICK_SOLVER_SIZES)
    if args.patterns is None and not args.full:
        args.patterns = list(QUICK_SOLVER_PATTERNS)
    _check_sizes(
        args.n,
        lambda n: (
            TRAIN_BYTES_PER_POSITION * float(n)
            + (DENSE_MODE_BYTES_PER_PAIR * float(n) ** 2 if n <= solver.MAX_DENSE_N else 0.0)
        ),
        "a forward+backward over n tokens",
    )
    bar, done = _cases("solver", len(solver.cases(args.n, args.patterns or solver.PATTERNS)))
    with bar:
        result = solver.run(args.n, args.patterns, done, device=args.device)
    print(json.dumps(result, indent=1))
    return 0


def run_decode(args) -> int:
    check_device(args.device)
    args.mixers = None if args.mixers is None else mixer_list(args.mixers)  # None: the benchmark's own list
    _check_sizes(
        args.n,
        lambda n: DECODE_BYTES_PER_POSITION * float(n + sum(args.n) - max(args.n)),
        f"the prefilled contexts of every --n (about {fmt_bytes(DECODE_BYTES_PER_POSITION)} a position)",
    )
    print(json.dumps(decode.run(args.n, args.mixers, _progress, device=args.device), indent=1))
    return 0


def run_packed(args) -> int:
    names = None if args.mixers is None else mixer_list(args.mixers)  # None: the benchmark's own list
    for flag, v, lo in (("--rows", args.rows, 1), ("--row-length", args.row_length, 2), ("--repeats", args.repeats, 1)):
        if v < lo:
            raise InputError(f"{flag} must be >= {lo}, got {v}")
    if args.repeats > PACKED_MAX_REPEATS:
        raise InputError(
            f"--repeats must be <= {PACKED_MAX_REPEATS} (the best of that many calls of each way has long "
            f"settled), got {args.repeats:,}"
        )
    check_seed(args.seed)
    per_row = 3 * TRAIN_BYTES_PER_POSITION  # three batches of that many rows, forward + backward
    check_size("--row-length", args.row_length, lambda n: per_row * float(n), "a forward+backward over one row")
    check_size(
        "--rows",
        args.rows,
        lambda r: per_row * float(args.row_length) * r,
        f"forward+backward passes over rows of {args.row_length:,} tokens (three batches)",
    )
    lengths = packed.corpus_lengths(args.corpus)  # a bad corpus is refused before the progress starts
    bar, done = _cases("packed", len(names or packed.MIXERS))
    with bar:
        result = packed.run(names, args.corpus, args.rows, args.row_length, args.repeats, args.seed, done, lengths)
    print(json.dumps(result, indent=1))
    return 0


def run_mixers(args) -> int:
    check_device(args.device)
    if not 0 <= args.busy <= 64:
        raise InputError(f"--busy must be in 0..64, got {args.busy}")
    args.mixers = mixer_list(args.mixers, default=None if args.full else QUICK_MIXERS)  # --full: every mixer
    if args.n is None:
        args.n = list(FULL_MIXER_SIZES if args.full else QUICK_MIXER_SIZES)
    _check_sizes(
        args.n, lambda n: 2 * TRAIN_BYTES_PER_POSITION * float(n), "a forward+backward over n tokens at batch 2"
    )
    bar, done = _cases("mixers", len(args.n) * (1 + len(args.mixers)))
    with bar:
        result = mixers.run(args.n, args.mixers, done, busy=args.busy, device=args.device)
    print(json.dumps(result, indent=1))
    return 0
