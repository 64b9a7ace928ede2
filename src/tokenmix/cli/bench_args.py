"""Arguments of ``tokenmix bench solver|decode|mixers|lm|step|hf`` (handlers: ``bench_cmd.py``). Light:
imports no torch and no registry (cli/main.py)."""

from __future__ import annotations

from tokenmix.bench.settings import (
    DEVICES,
    FULL_MIXER_SIZES,
    FULL_SOLVER_SIZES,
    PACKED_MIXERS,
    PACKED_ROW_LENGTH,
    PACKED_ROWS,
    QUICK_MIXER_SIZES,
    QUICK_MIXERS,
    QUICK_SOLVER_PATTERNS,
    QUICK_SOLVER_SIZES,
    LMBenchConfig,
)
from tokenmix.cli.options import add_mixers_option


def _sizes(values) -> str:
    return " ".join(str(n) for n in values)


def _command(subs, name: str, handler: str, add_arguments, **kwargs) -> None:
    """Adds parser ``name`` to ``subs`` with its arguments and its handler ``bench_cmd:<handler>``."""
    p = subs.add_parser(name, **kwargs)
    add_arguments(p)
    p.set_defaults(handler=f"bench_cmd:{handler}")


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks (JSON output)")
    bsub = p.add_subparsers(dest="bench", required=True)
    _command(
        bsub,
        "solver",
        "run_solver",
        _solver_arguments,
        help="dense vs chunked fwd+bwd time and peak memory per pattern, SDPA baseline (~1 min; --full ~5 min)",
    )
    _command(
        bsub,
        "decode",
        "run_decode",
        _decode_arguments,
        help="per-token decode latency and cached positions, KV-attention baseline",
    )
    _command(
        bsub,
        "mixers",
        "run_mixers",
        _mixers_arguments,
        help="fwd+bwd time of mixers vs SDPA, with achieved GFLOP/s (~1 min; --full: every mixer, ~15 min)",
    )
    _command(
        bsub,
        "packed",
        "run_packed",
        _packed_arguments,
        help="fwd+bwd time of a batch packed with a corpus' documents against the same tokens unpacked "
        "and the documents padded to rows of their own (~1 min at the defaults)",
    )
    _command(
        bsub, "lm", "run_lm", _lm_arguments, help="LM training and decode tokens/s per mixer at equal parameter count"
    )
    _command(
        bsub,
        "step",
        "run_step",
        _step_arguments,
        help="CPU ms per training step of a compare preset's runs, under the CLI's "
        "settings and in a plain python process (~1 min at the defaults)",
    )
    _command(
        bsub,
        "hf",
        "run_hf",
        _hf_arguments,
        help="decode ms/token through transformers' generate() vs tokenmix's own loop (needs tokenmix[hf])",
    )


def _add_device(p) -> None:
    p.add_argument(
        "--device",
        default="cpu",
        help=f"where the work runs: {' | '.join(DEVICES)} (default cpu; cuda: timed by CUDA events after a warm-up)",
    )


def _solver_arguments(p) -> None:
    p.add_argument(
        "--n",
        type=int,
        nargs="+",
        default=None,
        help=f"sequence lengths (default {_sizes(QUICK_SOLVER_SIZES)}; --full: {_sizes(FULL_SOLVER_SIZES)})",
    )
    p.add_argument("--full", action="store_true", help="the whole sweep (the lengths above, every pattern)")
    p.add_argument(
        "--patterns",
        nargs="+",
        default=None,
        help=f"structured mixer names (default {' '.join(QUICK_SOLVER_PATTERNS)}; --full: every structured one)",
    )
    _add_device(p)


def _decode_arguments(p) -> None:
    p.add_argument("--n", type=int, nargs="+", default=None)
    add_mixers_option(p, "mamba2, the structured mixers and attention")
    _add_device(p)


def _mixers_arguments(p) -> None:
    p.add_argument(
        "--n",
        type=int,
        nargs="+",
        default=None,
        help=f"sequence lengths (default {_sizes(QUICK_MIXER_SIZES)}; --full: {_sizes(FULL_MIXER_SIZES)})",
    )
    add_mixers_option(p, f"{', '.join(QUICK_MIXERS)}; --full: every registered mixer")
    p.add_argument("--full", action="store_true", help="every registered mixer at every length above")
    p.add_argument(
        "--busy", type=int, default=0, help="single-threaded matmul loops kept running during the run (contention test)"
    )
    _add_device(p)


def _packed_arguments(p) -> None:
    add_mixers_option(p, ", ".join(PACKED_MIXERS))
    p.add_argument("--corpus", default="excerpt", help="whose document lengths fill the rows (default excerpt)")
    p.add_argument("--rows", type=int, default=PACKED_ROWS, help=f"rows of the batch (default {PACKED_ROWS})")
    p.add_argument(
        "--row-length", type=int, default=PACKED_ROW_LENGTH, help=f"tokens per row (default {PACKED_ROW_LENGTH})"
    )
    p.add_argument("--repeats", type=int, default=3, help="timed calls of each way (the best is reported)")
    p.add_argument("--seed", type=int, default=0)


def _lm_arguments(p) -> None:
    d = LMBenchConfig()
    add_mixers_option(p, f"{d.mixers}, those registered")
    p.add_argument("--contexts", type=int, nargs="+", default=list(d.contexts))
    p.add_argument("--layers", type=int, default=d.layers, help="layers of the one mixer per model")
    p.add_argument("--n-heads", type=int, default=d.n_heads)
    p.add_argument(
        "--target-params", type=int, default=d.target_params, help="non-embedding parameters every model is sized to"
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        default=d.vocab_size,
        help="small by default: the embedding and head cost the same for every mixer and "
        "would only dilute the differences between mixers",
    )
    p.add_argument("--batch-tokens", type=int, default=d.batch_tokens, help="tokens per training step")
    p.add_argument(
        "--train-steps", type=int, default=d.train_steps, help="timed training steps (the median is reported)"
    )
    p.add_argument(
        "--decode-tokens",
        type=int,
        default=d.decode_tokens,
        help="timed decode steps at the end of the context (the median is reported)",
    )
    p.add_argument(
        "--decode-block",
        type=int,
        default=d.decode_block,
        help="decode tokens a mixer runs back to back before the next mixer's turn",
    )
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads (0 = default)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default=None, help="also write the JSON here")
    _add_device(p)


def _step_arguments(p) -> None:
    p.add_argument("--preset", default="frontier", help="compare preset whose run configs are timed (default frontier)")
    add_mixers_option(p, "attention, mamba2, pow2, sq1_ce")
    p.add_argument("--steps", type=int, default=20, help="timed steps per block")
    p.add_argument("--repeats", type=int, default=3, help="timed blocks (the best is reported)")
    p.add_argument(
        "--busy", type=int, default=0, help="single-threaded matmul loops kept running during the run (contention test)"
    )
    p.add_argument(
        "--environments",
        default="cli,python",
        help="cli (the compare worker's settings), python (a plain process), or both",
    )


def _hf_arguments(p) -> None:
    add_mixers_option(p, "attention,pow2_ce,mamba2")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--warmup", type=int, default=8, help="decode steps not timed")
    p.add_argument("--repeats", type=int, default=3, help="runs of each loop, alternating (median)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    p.add_argument("--out", default=None, help="also write the JSON here")
