"""Arguments of ``tokenmix bench solver|decode|mixers|lm|step|hf`` (handlers: ``bench_cmd.py``). Light:
imports no torch and no registry (cli/main.py)."""

from __future__ import annotations

from tokenmix.bench.settings import (
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


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks (JSON output)")
    bsub = p.add_subparsers(dest="bench", required=True)
    s = bsub.add_parser(
        "solver",
        help="dense vs chunked fwd+bwd time and peak memory per pattern, SDPA baseline (~1 min; --full ~5 min)",
    )
    s.add_argument(
        "--n",
        type=int,
        nargs="+",
        default=None,
        help=f"sequence lengths (default {_sizes(QUICK_SOLVER_SIZES)}; --full: {_sizes(FULL_SOLVER_SIZES)})",
    )
    s.add_argument("--full", action="store_true", help="the whole sweep (the lengths above, every pattern)")
    s.add_argument(
        "--patterns",
        nargs="+",
        default=None,
        help=f"structured mixer names (default {' '.join(QUICK_SOLVER_PATTERNS)}; --full: every structured one)",
    )
    s.set_defaults(handler="bench_cmd:run_solver")
    d = bsub.add_parser("decode", help="per-token decode latency and cached positions, KV-attention baseline")
    d.add_argument("--n", type=int, nargs="+", default=None)
    add_mixers_option(d, "mamba2, the structured mixers and attention")
    d.set_defaults(handler="bench_cmd:run_decode")
    m = bsub.add_parser(
        "mixers", help="fwd+bwd time of mixers vs SDPA, with achieved GFLOP/s (~1 min; --full: every mixer, ~15 min)"
    )
    m.add_argument(
        "--n",
        type=int,
        nargs="+",
        default=None,
        help=f"sequence lengths (default {_sizes(QUICK_MIXER_SIZES)}; --full: {_sizes(FULL_MIXER_SIZES)})",
    )
    add_mixers_option(m, f"{', '.join(QUICK_MIXERS)}; --full: every registered mixer")
    m.add_argument("--full", action="store_true", help="every registered mixer at every length above")
    m.add_argument(
        "--busy", type=int, default=0, help="single-threaded matmul loops kept running during the run (contention test)"
    )
    m.set_defaults(handler="bench_cmd:run_mixers")
    pk = bsub.add_parser(
        "packed",
        help="fwd+bwd time of a batch packed with a corpus' documents against the same tokens unpacked "
        "and the documents padded to rows of their own (~1 min at the defaults)",
    )
    add_mixers_option(pk, ", ".join(PACKED_MIXERS))
    pk.add_argument("--corpus", default="excerpt", help="whose document lengths fill the rows (default excerpt)")
    pk.add_argument("--rows", type=int, default=PACKED_ROWS, help=f"rows of the batch (default {PACKED_ROWS})")
    pk.add_argument(
        "--row-length", type=int, default=PACKED_ROW_LENGTH, help=f"tokens per row (default {PACKED_ROW_LENGTH})"
    )
    pk.add_argument("--repeats", type=int, default=3, help="timed calls of each way (the best is reported)")
    pk.add_argument("--seed", type=int, default=0)
    pk.set_defaults(handler="bench_cmd:run_packed")
    lm = bsub.add_parser("lm", help="LM training and decode tokens/s per mixer at equal parameter count")
    d = LMBenchConfig()
    add_mixers_option(lm, f"{d.mixers}, those registered")
    lm.add_argument("--contexts", type=int, nargs="+", default=list(d.contexts))
    lm.add_argument("--layers", type=int, default=d.layers, help="layers of the one mixer per model")
    lm.add_argument("--n-heads", type=int, default=d.n_heads)
    lm.add_argument(
        "--target-params", type=int, default=d.target_params, help="non-embedding parameters every model is sized to"
    )
    lm.add_argument(
        "--vocab-size",
        type=int,
        default=d.vocab_size,
        help="small by default: the embedding and head cost the same for every mixer and "
        "would only dilute the differences between mixers",
    )
    lm.add_argument("--batch-tokens", type=int, default=d.batch_tokens, help="tokens per training step")
    lm.add_argument(
        "--train-steps", type=int, default=d.train_steps, help="timed training steps (the median is reported)"
    )
    lm.add_argument(
        "--decode-tokens",
        type=int,
        default=d.decode_tokens,
        help="timed decode steps at the end of the context (the median is reported)",
    )
    lm.add_argument(
        "--decode-block",
        type=int,
        default=d.decode_block,
        help="decode tokens a mixer runs back to back before the next mixer's turn",
    )
    lm.add_argument("--threads", type=int, default=d.threads, help="torch threads (0 = default)")
    lm.add_argument("--seed", type=int, default=d.seed)
    lm.add_argument("--out", default=None, help="also write the JSON here")
    lm.set_defaults(handler="bench_cmd:run_lm")
    st = bsub.add_parser(
        "step",
        help="CPU ms per training step of a compare preset's runs, under the CLI's "
        "settings and in a plain python process (~1 min at the defaults)",
    )
    st.add_argument(
        "--preset", default="frontier", help="compare preset whose run configs are timed (default frontier)"
    )
    add_mixers_option(st, "attention, mamba2, pow2, sq1_ce")
    st.add_argument("--steps", type=int, default=20, help="timed steps per block")
    st.add_argument("--repeats", type=int, default=3, help="timed blocks (the best is reported)")
    st.add_argument(
        "--busy", type=int, default=0, help="single-threaded matmul loops kept running during the run (contention test)"
    )
    st.add_argument(
        "--environments",
        default="cli,python",
        help="cli (the compare worker's settings), python (a plain process), or both",
    )
    st.set_defaults(handler="bench_cmd:run_step")
    hf = bsub.add_parser(
        "hf", help="decode ms/token through transformers' generate() vs tokenmix's own loop (needs tokenmix[hf])"
    )
    add_mixers_option(hf, "attention,pow2_ce,mamba2")
    hf.add_argument("--layers", type=int, default=4)
    hf.add_argument("--d-model", type=int, default=256)
    hf.add_argument("--n-heads", type=int, default=4)
    hf.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    hf.add_argument("--new-tokens", type=int, default=128)
    hf.add_argument("--warmup", type=int, default=8, help="decode steps not timed")
    hf.add_argument("--repeats", type=int, default=3, help="runs of each loop, alternating (median)")
    hf.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    hf.add_argument("--out", default=None, help="also write the JSON here")
    hf.set_defaults(handler="bench_cmd:run_hf")
