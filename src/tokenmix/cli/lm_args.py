"""Arguments of ``tokenmix data prepare``, ``train lm``, ``generate`` and ``eval`` (handlers:
``lm_cmd.py``). Light: imports no torch and no registry (cli/main.py).

The ``train`` parser is separate (``add_train_lm_parser``) so that another ``train`` front end can
host it.
"""

from __future__ import annotations


def register(sub) -> None:
    _add_data_prepare(sub)
    _add_train(sub)
    _add_generate(sub)
    _add_eval(sub)


def _add_data_prepare(sub) -> None:
    """``tokenmix data prepare``."""
    p_data = sub.add_parser("data", help="prepare text corpora for language modelling")
    data_sub = p_data.add_subparsers(dest="data_command", required=True)
    p = data_sub.add_parser("prepare", help="split a corpus by document, train a BPE tokenizer, write token arrays")
    p.add_argument(
        "--corpus",
        default="excerpt",
        help="excerpt | shakespeare | kjv | pydocs | PATH (a text, JSONL, JSON, Parquet or CSV file, or a folder)",
    )
    p.add_argument(
        "--text-field",
        default=None,
        metavar="NAME",
        help='column holding the text in JSONL/JSON/Parquet/CSV records (default: data.text_field, "text")',
    )
    p.add_argument(
        "--install-missing",
        action="store_true",
        help="run apt-get to install a missing Debian package (kjv: bible-kjv, pydocs: python3-doc)",
    )
    p.add_argument(
        "--preset",
        default=None,
        help="prepare the data settings of this lm preset, so that `train lm --preset NAME` reads it without "
        "preparing again (`tokenmix presets --kind lm` lists them; default: default)",
    )
    p.add_argument("--vocab-size", type=int, default=None, help="BPE vocabulary size (default: the preset's)")
    p.add_argument(
        "--out",
        default=None,
        help="directory for the prepared data (default: an entry of the cache, $TOKENMIX_CACHE or ~/.cache/tokenmix)",
    )
    p.add_argument(
        "--set",
        nargs="*",
        action="extend",
        default=[],
        metavar="data.KEY=VALUE",
        help="data config overrides (repeat --set or give several after one)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handler="lm_cmd:run_data_prepare")


def _add_train(sub) -> None:
    """``tokenmix train`` (its ``lm`` parser: ``add_train_lm_parser``)."""
    p_train = sub.add_parser("train", help="train models")
    train_sub = p_train.add_subparsers(dest="train_command", required=True)
    add_train_lm_parser(train_sub)


def _add_generate(sub) -> None:
    """``tokenmix generate``."""
    p = sub.add_parser("generate", help="generate text from a trained LM run (prefill + per-mixer decode cache)")
    p.add_argument("--run", required=True, help="run directory written by `tokenmix train lm`")
    p.add_argument(
        "--prompt",
        action="append",
        default=None,
        help="prompt text (repeat for a batch; prompts of different lengths are grouped exactly)",
    )
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 = no top-k filter")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus size; 1 = no filter")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--max-context",
        type=int,
        default=None,
        help="longest prompt + continuation in tokens (default: the training context train.seq_len)",
    )
    p.add_argument("--json", action="store_true", help="print the generations as JSON instead of streaming")
    p.add_argument(
        "--device",
        default="cpu",
        help="where the model runs: cpu, cuda or auto (default cpu; auto = cuda when available)",
    )
    p.set_defaults(handler="lm_cmd:run_generate")


def _add_eval(sub) -> None:
    """``tokenmix eval``."""
    p = sub.add_parser("eval", help="perplexity and per-position loss of a trained LM run")
    p.add_argument("--run", required=True, help="run directory written by `tokenmix train lm`")
    p.add_argument(
        "--split", default=None, choices=["train", "val", "test"], help="a split of the run's data (default test)"
    )
    p.add_argument(
        "--text",
        default=None,
        metavar="FILE",
        help="score this text file (or folder) instead of a split, tokenized with the run's tokenizer",
    )
    p.add_argument(
        "--context",
        type=int,
        default=None,
        metavar="N",
        help="window length in tokens (default: the training length train.seq_len); longer measures "
        "length extrapolation (refused past learned positions)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="where the model runs: cpu, cuda or auto (default cpu; auto = cuda when available)",
    )
    p.add_argument("--max-windows", type=int, default=0, help="evaluate only N windows, spread evenly (0 = all)")
    p.add_argument(
        "--per-document",
        action="store_true",
        help="also score every document alone (from its separator, no other document in its context): "
        "each one's perplexity (in --json) and the perplexity over all of them",
    )
    p.add_argument("--json", action="store_true", help="print the result (with the full per-position loss) as JSON")
    p.set_defaults(handler="lm_cmd:run_eval")


def add_train_lm_parser(train_sub) -> None:
    """``tokenmix train lm``; separate so that another ``train`` front end can host it."""
    p = train_sub.add_parser("lm", help="train a language model on real text")
    p.add_argument("--corpus", default=None, help="excerpt (default) | shakespeare | kjv | pydocs | PATH")
    p.add_argument(
        "--preset",
        default=None,
        help="an lm preset (`tokenmix presets --kind lm` lists them; default: default)",
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="a JSON config in the shape of a run's config.json; fields it leaves out keep the preset's "
        "values, --corpus/--layers/--set apply on top",
    )
    p.add_argument(
        "--layers", default=None, help='layer pattern, e.g. "pow2,pow2,attention,pow2" or "pow2*3,attention"'
    )
    p.add_argument("--out", default=None, help="run directory (default: runs/lm-<corpus>-<time>)")
    p.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its last checkpoint (takes only --set train.max_steps=N, "
        "to extend its schedule)",
    )
    p.add_argument(
        "--init-from",
        default=None,
        metavar="RUN_DIR",
        help="start a new run from the weights of RUN_DIR's newest valid checkpoint (same model "
        "settings; the optimizer and schedule start fresh)",
    )
    p.add_argument(
        "--print-config", action="store_true", help="print the resolved config as JSON and exit without training"
    )
    p.add_argument(
        "--set",
        nargs="*",
        action="extend",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="config overrides, e.g. train.lr=3e-4 model.d_model=256 train.parallel=fsdp (repeat --set or give "
        "several after one)",
    )
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of a progress bar")
    p.set_defaults(handler="lm_cmd:run_train_lm")
