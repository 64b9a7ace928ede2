"""Language-modelling commands, the handlers (their arguments: ``lm_args.py``):

    tokenmix data prepare --corpus NAME [--vocab-size N] [--out DIR]
    tokenmix train lm [--corpus NAME] [--preset default|small|tiny] [--config FILE] [--layers L] [--out DIR]
                      [--set k=v ...] [--init-from RUN] [--print-config]
    tokenmix train lm --resume DIR [--set train.max_steps=N]
    tokenmix generate --run DIR --prompt "..." [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]
                      [--device auto|cpu|cuda]
    tokenmix eval --run DIR [--split test | --text FILE] [--context N] [--device auto|cpu|cuda] [--json]

A run's config is built in layers, later ones winning: the LMRunConfig defaults, the --preset's
overrides, the --config file (a partial config.json), --corpus and --layers, then --set.
--print-config shows the result (what ``train lm`` would run with, before the data fixes the
vocabulary) and exits.

The same ``train lm`` command runs data-parallel under ``torchrun --nproc_per_node=N``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

from tokenmix.analysis.run_inputs import check_text
from tokenmix.cli.validate import check_choice
from tokenmix.core.errors import InputError
from tokenmix.core.files import check_output_dir
from tokenmix.data.corpora import default_cache_dir
from tokenmix.data.prepare import prepare_data
from tokenmix.data.tokenizer import check_vocab_size, separator_id
from tokenmix.generation import SamplingConfig, generate, position_limit
from tokenmix.runs.lm import (
    DEVICES,
    LMRunConfig,
    apply_overrides,
    bigram_verdict,
    check_overrides,
    load_run,
    merge_config,
    read_config_file,
    read_run_config,
    resolve_device,
)
from tokenmix.training.lm import RESUME_KEYS, check_init_from, train_lm
from tokenmix.training.lm_eval import evaluate_run


def _build_run_config(preset: str) -> LMRunConfig:
    """The config of an lm preset. The preset registry is imported here, not with this module: it
    loads every preset and their analysis modules (matplotlib; a third of the start-up), which a
    command refused on its --set never needs."""
    from tokenmix.study.presets.lm import build_run_config

    return build_run_config(preset)


def run_data_prepare(args) -> int:
    check_overrides(args.set)  # keys and types first: before the presets are loaded
    if args.vocab_size is not None:
        check_vocab_size(args.vocab_size, "--vocab-size")
    overrides = [f"data.corpus={args.corpus}"]
    given = []  # what the matching `train lm` needs besides --corpus and --preset
    if args.vocab_size is not None:
        given.append(f"data.vocab_size={args.vocab_size}")
    if args.out:
        given.append(f"data.dir={args.out}")
    if args.text_field is not None:
        given.append(f"data.text_field={args.text_field}")
    for item in args.set:
        if not item.startswith("data."):
            raise InputError(f"`data prepare` takes only data.* overrides, got '{item}'")
    given += list(args.set)
    preset = args.preset if args.preset is not None else "default"
    cfg = apply_overrides(_build_run_config(preset), overrides + given).data  # the data `train lm` would prepare
    t0 = time.perf_counter()
    data = prepare_data(cfg, verbose=not args.json, install_missing=args.install_missing or None)
    cache = default_cache_dir()
    train = ["tokenmix", "train", "lm", "--corpus", args.corpus] + (["--preset", preset] if preset != "default" else [])
    train += ["--set", *given] if given else []
    summary = data.summary() | {
        "seconds": round(time.perf_counter() - t0, 2),
        "preset": preset,
        "cache": str(cache),
        "train_command": shlex.join(train),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        s = summary["splits"]
        print(
            f"prepared {summary['corpus']} in {summary['dir']}: vocab {summary['vocab_size']}, "
            f"{summary['chars_per_token']} chars/token; tokens train {s['train']['tokens']:,} "
            f"({s['train']['documents']} docs), val {s['val']['tokens']:,} ({s['val']['documents']}), "
            f"test {s['test']['tokens']:,} ({s['test']['documents']})"
        )
        where = "$TOKENMIX_CACHE" if os.environ.get("TOKENMIX_CACHE") else "default; set TOKENMIX_CACHE to move it"
        print(f"cache: {cache} ({where})")
        print(f"`{summary['train_command']}` reads it without preparing again")
    return 0


def _default_run_dir(corpus: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(corpus).name or corpus)[:40]
    # torchrun gives every rank the same run id; a timestamp could differ between ranks
    stamp = os.environ.get("TORCHELASTIC_RUN_ID") if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
    return Path("runs") / f"lm-{slug}-{stamp or time.strftime('%Y%m%d-%H%M%S')}"


def _resume_overrides(items: list[str]) -> list[str]:
    """The ``--set`` items a resume takes (RESUME_KEYS: extending the schedule); any other is refused,
    since the resumed steps must be the ones the saved config describes."""
    for item in items:
        if item.partition("=")[0].strip() not in RESUME_KEYS:
            raise InputError(
                f"--resume continues a run with its saved config; of --set it takes only "
                f"{', '.join(k + '=N' for k in RESUME_KEYS)} (to extend the schedule), got '{item}'"
            )
    return list(items)


def resolved_train_config(args) -> tuple[LMRunConfig, Path | None]:
    """The config ``train lm`` runs with (before the data fixes the vocabulary and ``auto``
    precision is resolved) and the run folder; the one function behind training and --print-config."""
    for opt in ("resume", "out", "init_from", "config"):
        if getattr(args, opt) is not None and not getattr(args, opt).strip():
            raise InputError(
                f"--{opt.replace('_', '-')} is empty; give a {'file' if opt == 'config' else 'run folder'}"
            )
    if args.resume is not None:
        given = [
            f
            for f, v in (
                ("--corpus", args.corpus),
                ("--layers", args.layers),
                ("--preset", args.preset),
                ("--out", args.out),
                ("--config", args.config),
                ("--init-from", args.init_from),
            )
            if v is not None
        ]
        if given:
            raise InputError(f"--resume continues a run with its saved config; it takes no {', '.join(given)}")
        run_dir = Path(args.resume)
        return apply_overrides(read_run_config(run_dir), _resume_overrides(args.set)), run_dir
    check_overrides(args.set)  # keys and types first: before the presets, the config file and the data
    preset = args.preset if args.preset is not None else "default"
    cfg = _build_run_config(preset)
    if args.config is not None:
        cfg = merge_config(cfg, read_config_file(args.config), args.config)
    overrides = []
    if args.corpus is not None:  # an empty value is an error (below), not the preset's
        overrides.append(f"data.corpus={args.corpus}")
    if args.layers is not None:
        if not args.layers.strip():
            raise InputError('--layers is empty; give a layer pattern, e.g. "pow2,attention" or "pow2*3"')
        overrides.append(f"model.layers={args.layers}")
    cfg = apply_overrides(cfg, overrides + list(args.set))  # also refuses a model too large for memory
    return cfg, Path(args.out) if args.out is not None else None


def run_train_lm(args) -> int:
    cfg, run_dir = resolved_train_config(args)
    if run_dir is None:
        run_dir = _default_run_dir(cfg.data.corpus)
    if args.resume is None:  # what training would refuse, --print-config refuses too
        check_output_dir(run_dir, "run folder")
    if args.print_config:
        if args.resume is None and args.init_from is not None:  # (train_lm checks it itself)
            check_init_from(args.init_from, cfg)
        print(cfg.to_json())
        return 0
    progress = False if args.no_progress else None
    train_lm(
        cfg, run_dir, resume=args.resume is not None, progress=progress, quiet=args.quiet, init_from=args.init_from
    )
    return 0


def run_eval(args) -> int:
    check_choice("--device", args.device, DEVICES)
    if args.max_windows < 0:
        raise InputError(f"--max-windows must be >= 0, got {args.max_windows}")
    if args.text is not None and args.split is not None:
        raise InputError("give either --split (a split of the run's data) or --text FILE, not both")
    if args.text is not None and not args.text.strip():
        raise InputError("--text is empty; give a text file or a folder of text files")
    if args.context is not None and args.context < 1:
        raise InputError(f"--context must be >= 1, got {args.context}")
    resolve_device(args.device)  # a missing CUDA is refused before the run is read
    res = evaluate_run(
        args.run,
        args.split or "test",
        args.max_windows,
        text=args.text,
        context=args.context,
        device=args.device,
        per_document=args.per_document,
    )
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    what = res["split"] if args.text is None else f"'{args.text}'"
    longer = (
        f", context {res['context']} (trained at {res['train_seq_len']})"
        if res["context"] != res["train_seq_len"]
        else ""
    )
    packed = ", packed as trained (no token reads another document)" if res["packed"] else ""
    print(
        f"{what} loss {res['loss']:.4f}  perplexity {res['ppl']:.2f}  over {res['tokens']:,} tokens{longer}{packed} "
        f"(checkpoint step {res['step']}): {bigram_verdict(res['ppl'], res['bigram_ppl'])}; "
        f"unigram {res['unigram_ppl']:.2f}"
    )
    per = res["per_position_loss"]
    buckets, lo = [], 0
    while lo < len(per):
        hi = min(2 * lo + 1, len(per))  # positions 1, 2-3, 4-7, ... (1-based)
        buckets.append(
            f"{lo + 1}-{hi}: {sum(per[lo:hi]) / (hi - lo):.3f}" if hi - lo > 1 else f"{lo + 1}: {per[lo]:.3f}"
        )
        lo = hi
    print("per-position loss (positions in the window): " + ", ".join(buckets))
    if args.per_document:
        worst = max(res["documents"], key=lambda d: d["ppl"])
        print(
            f"per document (each alone): perplexity {res['document_ppl']:.2f} over {len(res['documents'])} "
            f"documents, median {res['document_ppl_median']:.2f}, highest {worst['ppl']:.2f} ({worst['name']}); "
            "each document's in --json"
        )
    return 0


def run_generate(args) -> int:
    check_choice("--device", args.device, DEVICES)
    # the sampling settings and prompts are checked before the run is loaded
    SamplingConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )
    for text in args.prompt or []:
        check_text(text, "--prompt")
    device = resolve_device(args.device)
    run = load_run(args.run, device)
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
            why = (
                f"the model's learned positions stop at max_seq_len={limit}"
                if limit is not None and max_context == limit
                else f"context {max_context}: the training length train.seq_len, or --max-context"
            )
            raise InputError(
                f"prompt is {len(ids)} tokens; this model allows prompts of at most {max_context - 1} tokens ({why})"
            )
        prompts.append(ids)
    room = max_context - max(len(p) for p in prompts)
    n_new = min(args.max_new_tokens, room)
    if n_new < args.max_new_tokens:
        print(
            f"tokenmix generate: continuation capped at {n_new} tokens by the context of {max_context}", file=sys.stderr
        )
    cfg = SamplingConfig(
        max_new_tokens=n_new, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed
    )
    if args.json or len(prompts) > 1:
        outs = generate(run.model, prompts, cfg, device=device)
        items = [
            {"prompt": t, "completion": tok.decode(o), "prompt_tokens": len(p), "new_tokens": len(o)}
            for t, p, o in zip(texts, prompts, outs)
        ]
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

    generate(run.model, prompts, cfg, device=device, on_token=on_token)
    text = tok.decode(streamed)
    sys.stdout.write(text[shown:] + "\n")
    sys.stdout.flush()
    return 0
