"""Language-modelling commands:

    tokenmix data prepare --corpus NAME [--vocab-size N] [--out DIR]
    tokenmix train lm [--corpus NAME] [--preset default|small|tiny] [--layers L] [--out DIR] [--set k=v ...]
    tokenmix train lm --resume DIR
    tokenmix generate --run DIR --prompt "..." [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]
    tokenmix eval --run DIR [--split test] [--json]

The same ``train lm`` command runs data-parallel under ``torchrun --nproc_per_node=N``.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

from tokenmix.analysis.run_inputs import check_run_config, check_text
from tokenmix.core.errors import InputError
from tokenmix.data.prepare import prepare_data
from tokenmix.data.tokenizer import check_vocab_size, separator_id
from tokenmix.generation import SamplingConfig, generate, position_limit
from tokenmix.runs.lm import LMRunConfig, apply_overrides, load_run, read_run_config
from tokenmix.study.presets import presets
from tokenmix.study.presets.lm import build_run_config
from tokenmix.training.lm import evaluate_run, train_lm


def register(sub) -> None:
    # ---- tokenmix data prepare
    p_data = sub.add_parser("data", help="prepare text corpora for language modelling")
    data_sub = p_data.add_subparsers(dest="data_command", required=True)
    p = data_sub.add_parser("prepare", help="split a corpus by document, train a BPE tokenizer, write token arrays")
    p.add_argument("--corpus", default="excerpt", help="excerpt | shakespeare | kjv | pydocs | PATH (file or folder)")
    p.add_argument("--vocab-size", type=int, default=None, help="BPE vocabulary size (default: data.vocab_size)")
    p.add_argument("--out", default=None, help="directory for the prepared data (default: a cache entry)")
    p.add_argument("--set", nargs="*", default=[], metavar="data.KEY=VALUE", help="data config overrides")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run_data_prepare)

    # ---- tokenmix train lm
    p_train = sub.add_parser("train", help="train models")
    train_sub = p_train.add_subparsers(dest="train_command", required=True)
    add_train_lm_parser(train_sub)

    # ---- tokenmix generate
    p = sub.add_parser("generate", help="generate text from a trained LM run (prefill + per-mixer decode cache)")
    p.add_argument("--run", required=True, help="run directory written by `tokenmix train lm`")
    p.add_argument("--prompt", action="append", default=None,
                   help="prompt text (repeat for a batch; prompts of different lengths are grouped exactly)")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 = no top-k filter")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus size; 1 = no filter")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-context", type=int, default=None,
                   help="longest prompt + continuation in tokens (default: the training context train.seq_len)")
    p.add_argument("--json", action="store_true", help="print the generations as JSON instead of streaming")
    p.set_defaults(func=run_generate)

    # ---- tokenmix eval
    p = sub.add_parser("eval", help="perplexity and per-position loss of a trained LM run")
    p.add_argument("--run", required=True, help="run directory written by `tokenmix train lm`")
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument("--max-windows", type=int, default=0, help="evaluate only the first N windows (0 = all)")
    p.add_argument("--json", action="store_true", help="print the result (with the full per-position loss) as JSON")
    p.set_defaults(func=run_eval)


def add_train_lm_parser(train_sub) -> None:
    """``tokenmix train lm``; separate so that another ``train`` front end can host it."""
    p = train_sub.add_parser("lm", help="train a language model on real text")
    p.add_argument("--corpus", default=None, help="excerpt (default) | shakespeare | kjv | pydocs | PATH")
    p.add_argument("--preset", default="default",
                   help="an lm preset: " + " | ".join(pr.name for pr in presets("lm")) + " (`tokenmix presets`)")
    p.add_argument("--layers", default=None, help='layer pattern, e.g. "pow2,pow2,attention,pow2" or "pow2*3,attention"')
    p.add_argument("--out", default=None, help="run directory (default: runs/lm-<corpus>-<time>)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    p.add_argument("--set", nargs="*", default=[], metavar="SECTION.KEY=VALUE",
                   help="config overrides, e.g. train.lr=3e-4 model.d_model=256 train.parallel=fsdp")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of a progress bar")
    p.set_defaults(func=run_train_lm)


# ------------------------------------------------------------------------------------------ handlers
def run_data_prepare(args) -> int:
    if args.vocab_size is not None:
        check_vocab_size(args.vocab_size, "--vocab-size")
    overrides = [f"data.corpus={args.corpus}"]
    if args.vocab_size is not None:
        overrides.append(f"data.vocab_size={args.vocab_size}")
    if args.out:
        overrides.append(f"data.dir={args.out}")
    for item in args.set:
        if not item.startswith("data."):
            raise InputError(f"`data prepare` takes only data.* overrides, got '{item}'")
    cfg = apply_overrides(LMRunConfig(), overrides + list(args.set)).data
    t0 = time.perf_counter()
    data = prepare_data(cfg, verbose=not args.json)
    summary = data.summary() | {"seconds": round(time.perf_counter() - t0, 2)}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        s = summary["splits"]
        print(f"prepared {summary['corpus']} in {summary['dir']}: vocab {summary['vocab_size']}, "
              f"{summary['chars_per_token']} chars/token; tokens train {s['train']['tokens']:,} "
              f"({s['train']['documents']} docs), val {s['val']['tokens']:,} ({s['val']['documents']}), "
              f"test {s['test']['tokens']:,} ({s['test']['documents']})")
    return 0


def _default_run_dir(corpus: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(corpus).name or corpus)[:40]
    # torchrun gives every rank the same run id; a timestamp could differ between ranks
    stamp = os.environ.get("TORCHELASTIC_RUN_ID") if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
    return Path("runs") / f"lm-{slug}-{stamp or time.strftime('%Y%m%d-%H%M%S')}"


def run_train_lm(args) -> int:
    for opt in ("resume", "out"):
        if getattr(args, opt) is not None and not getattr(args, opt).strip():
            raise InputError(f"--{opt} is empty; give a run folder")

    if args.resume is not None:
        if args.set or args.corpus is not None or args.layers is not None or args.preset != "default" or args.out:
            raise InputError("--resume continues a run with its saved config; it takes no --corpus, --preset, "
                             "--layers, --set or --out")
        run_dir = Path(args.resume)
        cfg = read_run_config(run_dir)
        resume = True
    else:
        overrides = []
        if args.corpus is not None:  # an empty value is an error (below), not the preset's
            overrides.append(f"data.corpus={args.corpus}")
        if args.layers is not None:
            if not args.layers.strip():
                raise InputError("--layers is empty; give a layer pattern, e.g. \"pow2,attention\" or \"pow2*3\"")
            overrides.append(f"model.layers={args.layers}")
        cfg = build_run_config(args.preset, overrides + list(args.set))
        run_dir = Path(args.out) if args.out is not None else _default_run_dir(cfg.data.corpus)
        resume = False
    progress = False if args.no_progress else None
    train_lm(cfg, run_dir, resume=resume, progress=progress, quiet=args.quiet)
    return 0


def run_eval(args) -> int:

    if args.max_windows < 0:
        raise InputError(f"--max-windows must be >= 0, got {args.max_windows}")
    check_run_config(args.run)
    res = evaluate_run(args.run, args.split, args.max_windows)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"{res['split']} loss {res['loss']:.4f}  perplexity {res['ppl']:.2f}  over {res['tokens']:,} tokens "
          f"(checkpoint step {res['step']}); bigram {res['bigram_ppl']:.2f}, unigram {res['unigram_ppl']:.2f}")
    per = res["per_position_loss"]
    buckets, lo = [], 0
    while lo < len(per):
        hi = min(2 * lo + 1, len(per))  # positions 1, 2-3, 4-7, ... (1-based)
        buckets.append(f"{lo + 1}-{hi}: {sum(per[lo:hi]) / (hi - lo):.3f}" if hi - lo > 1 else f"{lo + 1}: {per[lo]:.3f}")
        lo = hi
    print("per-position loss (positions in the window): " + ", ".join(buckets))
    return 0


def run_generate(args) -> int:
    # the sampling settings and prompts are checked before the run is loaded
    SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed)
    for text in args.prompt or []:
        check_text(text, "--prompt")
    check_run_config(args.run)
    run = load_run(args.run)
    tok = run.tokenizer
    max_context = args.max_context if args.max_context is not None else run.config.train.seq_len
    if max_context < 2:
        raise InputError(f"--max-context must be >= 2, got {max_context}")
    limit = position_limit(run.model)
    if limit is not None and max_context > limit:
        raise InputError(f"--max-context {max_context} exceeds this model's learned positions (max_seq_len={limit})")
    texts = args.prompt if args.prompt else [""]
    prompts = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids if text else [separator_id(tok)]
        if len(ids) >= max_context:
            why = (f"the model's learned positions stop at max_seq_len={limit}" if limit is not None and max_context == limit
                   else f"context {max_context}: the training length train.seq_len, or --max-context")
            raise InputError(f"prompt is {len(ids)} tokens; this model allows prompts of at most {max_context - 1} "
                             f"tokens ({why})")
        prompts.append(ids)
    room = max_context - max(len(p) for p in prompts)
    n_new = min(args.max_new_tokens, room)
    if n_new < args.max_new_tokens:
        print(f"tokenmix generate: continuation capped at {n_new} tokens by the context of {max_context}",
              file=sys.stderr)
    cfg = SamplingConfig(max_new_tokens=n_new, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                         seed=args.seed)
    if args.json or len(prompts) > 1:
        outs = generate(run.model, prompts, cfg)
        items = [{"prompt": t, "completion": tok.decode(o), "prompt_tokens": len(p), "new_tokens": len(o)}
                 for t, p, o in zip(texts, prompts, outs)]
        if args.json:
            print(json.dumps(items, indent=2))
        else:
            for i, it in enumerate(items):
                print(f"--- [{i}] {it['prompt']}{it['completion']}")
        return 0
    streamed: list[int] = []
    shown = 0
    sys.stdout.write(texts[0])
    sys.stdout.flush()

    def on_token(_row: int, token: int) -> None:
        nonlocal shown
        streamed.append(token)
        text = tok.decode(streamed)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for its next bytes
            return
        sys.stdout.write(text[shown:])
        sys.stdout.flush()
        shown = len(text)

    generate(run.model, prompts, cfg, on_token=on_token)
    text = tok.decode(streamed)
    sys.stdout.write(text[shown:] + "\n")
    sys.stdout.flush()
    return 0
