"""Language-model training on prepared text (``tokenmix train lm``): set-up, resume and init-from.

    train_lm(cfg, run_dir, resume=False) -> TrainResult
    load_run(run_dir) -> LoadedRun (config, model with the latest weights, tokenizer): runs/lm.py

The rooms of a run: this module prepares the data, claims the run folder (``runs/lm_folder.py``),
builds or restores the model and hands over to the loop (``training/lm_loop.py``); validation,
baselines and ``tokenmix eval`` are ``training/lm_eval.py``.

A run directory holds ``config.json`` (the resolved LMRunConfig), ``tokenizer.json``,
``metrics.jsonl`` (one JSON object per optimizer step, plus validation and baseline records),
``checkpoints/`` (see checkpoint.py), ``summary.json`` and, with ``train.tensorboard=true`` (off by
default) and tensorboard installed, ``tb/``.

Validation: periodic passes score ``train.eval_windows`` windows spread over the split; the final
pass (the number in summary.json and the closing line) scores ``train.final_eval_windows`` (all of
the split by default), next to the bigram and unigram baselines counted on the train split and
scored on exactly the same targets, and in bits per character of the split (so runs with different
vocabularies compare). ``train.precision=auto`` is resolved once, before config.json is written.

One writer per run folder: ``train_lm`` holds the folder's lock (core/lock.py) for the whole run, so
a second ``train lm`` into it is refused naming this one. Resuming a finished run (its final
checkpoint evaluated, summary.json written) says so and writes nothing, unless train.max_steps was
raised (``--resume RUN --set train.max_steps=N``, the one override a resume takes: RESUME_KEYS; the
raised value is written to config.json); resuming past a corrupt latest checkpoint starts from the
newest valid one; a missing or unreadable tokenizer.json is restored from the run's prepared data.

``init_from=RUN`` starts a new run from the weights of RUN's newest valid checkpoint (the model
configs must agree on everything that shapes the weights); the optimizer, the schedule and the
data position start fresh, and metrics.jsonl records where the weights came from.

Exact resume: the model, AdamW state, RNG state, the data position and the step are restored; the
learning rate is a function of the step; nothing else carries state. On CPU a resumed run computes
bit for bit what the uninterrupted run computes. Under ``torchrun`` every rank computes its share
of the same global batch (see data/loader.py), gradients are averaged by DDP or FSDP, and rank 0
alone logs and writes checkpoints.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor, nn

from tokenmix.core.errors import InputError
from tokenmix.core.files import atomic_copy, atomic_write_json, check_regular_file
from tokenmix.core.progress import load_warning
from tokenmix.data.loader import DataPosition, TokenBatches, eval_windows
from tokenmix.data.prepare import PreparedData, prepare_data
from tokenmix.data.tokenizer import separator_id
from tokenmix.models import MixerModel
from tokenmix.runs.checkpoint import (
    CheckpointError,
    load_model_weights,
    load_training_state,
    newest_valid_checkpoint,
    recover_from,
)
from tokenmix.runs.lm import (
    LMRunConfig,
    check_batch_memory,
    check_model_memory,
    model_differences,
    read_run_config,
    with_vocab,
)
from tokenmix.runs.lm_folder import (
    check_run_tokenizer,
    finished_summary,
    open_run_folder,
    summary_step,
    tokens_differ,
    truncate_metrics,
)
from tokenmix.training.distributed import DistContext, setup_distributed, wrap_model
from tokenmix.training.lm_eval import resolve_precision
from tokenmix.training.lm_loop import RunLogger, TrainResult, run_loop
from tokenmix.training.optim import build_optimizer

# the overrides a resumed run accepts: extending its schedule. Everything else would make the resumed
# steps differ from what the saved config says the run is (and break the bit-exact resume).
RESUME_KEYS = ("train.max_steps",)


# ------------------------------------------------------------------------------------ training
def _prepare(cfg: LMRunConfig, ctx: DistContext, verbose: bool) -> tuple[LMRunConfig, PreparedData]:
    """Prepare the data on rank 0, then open it everywhere; resolve vocab size and data directory."""
    data = None
    err: str | None = None
    if ctx.is_main:
        try:  # a second process preparing the same data waits for the first, then reuses its result
            data = prepare_data(cfg.data, verbose=verbose, wait=True)
        except Exception as e:  # other ranks must not wait forever on a barrier
            err = f"{type(e).__name__}: {e}"
            if not ctx.distributed:
                raise
    err = ctx.broadcast_object(err)
    if err is not None:
        raise InputError(err.split(": ", 1)[1])
    ddir = ctx.broadcast_object(str(data.dir) if data is not None else None)
    if data is None:
        data = PreparedData(ddir)
    cfg = with_vocab(cfg, data.vocab_size)
    cfg = replace(cfg, data=replace(cfg.data, dir=str(data.dir)))
    return cfg, data


def train_lm(
    cfg: LMRunConfig,
    run_dir: str | Path,
    resume: bool = False,
    progress: bool | None = None,
    quiet: bool = False,
    init_from: str | Path | None = None,
) -> TrainResult:
    """Train (or resume) the language model of ``cfg`` in ``run_dir``; ``init_from``: a run whose
    newest valid checkpoint gives the initial weights of a new run. See the module docstring."""
    session_t0 = time.perf_counter()
    run_dir = Path(run_dir)
    tc = cfg.train
    if init_from is not None and resume:
        raise InputError("--init-from starts a new run; a resumed run continues from its own checkpoint")
    source = _init_source(Path(init_from), cfg) if init_from is not None else None
    # refused before anything is prepared or written: a model this machine cannot hold while training
    # (weights, gradients and the two AdamW moments in fp32 on CPU; the CPU copy it is built as on CUDA)
    on_cpu = tc.device == "cpu" or (tc.device == "auto" and not torch.cuda.is_available())
    check_model_memory(
        {**_model_fields(cfg), "vocab_size": max(cfg.model.vocab_size, cfg.data.vocab_size)},
        16 if on_cpu else 4,
        "weights, gradients and AdamW state" if on_cpu else "its fp32 weights",
    )
    check_batch_memory(tc)
    ctx = setup_distributed(tc.device)
    try:
        with _run_folder(run_dir, resume, ctx):
            return _train(cfg, run_dir, resume, progress, quiet, ctx, session_t0, source)
    finally:
        ctx.close()


@dataclass
class _InitSource:
    """The run a new run takes its initial weights from (``--init-from``)."""

    run_dir: Path
    config: LMRunConfig
    checkpoint: Path
    step: int


def check_init_from(src: str | Path, cfg: LMRunConfig) -> None:
    """Refuse (InputError) ``--init-from RUN`` for ``cfg`` as ``train_lm`` would, before anything is
    prepared or written (``train lm --print-config`` checks it too)."""
    _init_source(Path(src), cfg)


def _init_source(src: Path, cfg: LMRunConfig) -> _InitSource:
    """Check ``--init-from RUN`` before anything is prepared or written: a run with a valid checkpoint
    whose model agrees with ``cfg``'s (the vocabulary is compared once the data is prepared)."""
    src_cfg = read_run_config(src)
    try:
        ckpt, meta, _ = newest_valid_checkpoint(src / "checkpoints")
    except CheckpointError as e:
        raise InputError(f"--init-from {src}: {e}") from None
    if ckpt is None:
        raise InputError(f"--init-from {src}: the run has no checkpoint yet")
    _check_same_model(src, src_cfg, cfg, vocab=False)
    return _InitSource(src, src_cfg, ckpt, int(meta["step"]))


def _check_same_model(src: Path, src_cfg: LMRunConfig, cfg: LMRunConfig, vocab: bool) -> None:
    diffs = [d for d in model_differences(src_cfg.model, cfg.model) if vocab or not d.startswith("model.vocab_size")]
    if diffs:
        raise InputError(
            f"--init-from {src}: its model differs from this run's ({'; '.join(diffs)}), so its "
            f"weights do not fit; give the same model settings (e.g. --config {src / 'config.json'})"
        )


def _model_fields(cfg: LMRunConfig) -> dict:
    return {f: getattr(cfg.model, f) for f in cfg.model.__dataclass_fields__}


def _on_main(ctx: DistContext, fn):
    """Run ``fn()`` on rank 0; every rank gets its result, or raises the InputError it raised."""
    result, err = None, None
    if ctx.is_main:
        try:
            result = fn()
        except InputError as e:
            if not ctx.distributed:
                raise
            err = str(e)
    result, err = ctx.broadcast_object((result, err))
    if err is not None:
        raise InputError(err)
    return result


@contextlib.contextmanager
def _run_folder(run_dir: Path, resume: bool, ctx: DistContext):
    """Rank 0 holds the run folder's lock for the whole run (a second ``train lm`` into the same
    folder is refused, naming this process); a folder made here and left empty is removed again."""
    created: list[Path] = []
    lock = contextlib.ExitStack()
    try:
        _on_main(ctx, lambda: open_run_folder(run_dir, resume, created, lock))
        yield
    finally:
        lock.close()
        for p in reversed(created):  # only folders this call made, and only while empty
            try:
                p.rmdir()
            except OSError:
                break


def _train(
    cfg: LMRunConfig,
    run_dir: Path,
    resume: bool,
    progress: bool | None,
    quiet: bool,
    ctx: DistContext,
    session_t0: float,
    source: _InitSource | None = None,
) -> TrainResult:
    tc = cfg.train
    if tc.threads:
        torch.set_num_threads(tc.threads)
    ckpt_root = run_dir / "checkpoints"
    start_ckpt, skipped = None, []
    if resume:
        start_ckpt, skipped, finished = _resume_point(cfg, run_dir, ctx, quiet)
        if finished is not None:  # nothing to do: said so, nothing touched
            return finished
    elif (ckpt_root / "latest.json").exists():
        raise InputError(f"run directory {run_dir} already holds a run; use --resume {run_dir} or another --out")
    if tc.batch_size % (tc.grad_accum * ctx.world_size):
        raise InputError(
            f"train.batch_size={tc.batch_size} must be divisible by grad_accum * world size = "
            f"{tc.grad_accum * ctx.world_size}"
        )

    saved_vocab = cfg.model.vocab_size
    cfg, data = _prepare(cfg, ctx, verbose=ctx.is_main and not quiet)
    precision, precision_note = resolve_precision(cfg.train.precision, ctx.device)
    cfg = replace(cfg, train=replace(cfg.train, precision=precision))  # config.json holds what ran
    tc = cfg.train
    notes = _start_notes(cfg, run_dir, ctx, data, source, saved_vocab, start_ckpt, skipped)
    # refused before config.json, tokenizer.json or metrics.jsonl is written: a context the splits cannot fill
    train_ids, val_windows, final_windows = _windows(data, cfg)
    if ctx.is_main:
        for note in notes:
            print(f"tokenmix: {note}", file=sys.stderr, flush=True)
        if not resume:
            for stale in ("metrics.jsonl", "summary.json"):  # left by a run killed before its first checkpoint
                (run_dir / stale).unlink(missing_ok=True)
            atomic_write_json(run_dir / "config.json", cfg.to_dict(), indent=1)
            atomic_copy(data.dir / "tokenizer.json", run_dir / "tokenizer.json")
    ctx.barrier()

    model, wrapped, optimizer, num_params = _build_model(cfg, ctx, source)
    step, tokens_seen, position = 0, 0, DataPosition()
    if start_ckpt is not None:
        step, tokens_seen, position = _restore(start_ckpt, run_dir, ctx, model, wrapped, optimizer)
    batches = TokenBatches(train_ids, tc.seq_len, tc.batch_size, tc.seed, position)
    log = _open_log(run_dir, ctx, cfg, step, progress, quiet, source)
    try:
        return run_loop(
            cfg,
            run_dir,
            ctx,
            data,
            wrapped,
            optimizer,
            batches,
            val_windows,
            final_windows,
            step,
            tokens_seen,
            num_params,
            log,
            resume,
            session_t0,
            precision_note,
        )
    finally:
        log.close()


def _resume_point(
    cfg: LMRunConfig, run_dir: Path, ctx: DistContext, quiet: bool
) -> tuple[Path, list[str], TrainResult | None]:
    """The checkpoint a resumed run starts from, the newer ones skipped as invalid (why, each), and the
    run's result when it is already finished (said here; nothing is touched then)."""
    tc = cfg.train
    ckpt_root = run_dir / "checkpoints"

    def check_metrics() -> None:  # appended to later: a FIFO there would block the open forever
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists() or metrics.is_symlink():
            check_regular_file(metrics, "metrics file", within=run_dir)

    _on_main(ctx, check_metrics)

    def choose():
        ckpt, meta, skipped = newest_valid_checkpoint(ckpt_root)
        if ckpt is None:
            raise InputError(f"cannot resume: {run_dir} has no checkpoint (checkpoints/latest.json)")
        return ckpt.name, meta, skipped

    name, meta, skipped = _on_main(ctx, choose)
    if tc.max_steps < int(meta["step"]):
        raise InputError(
            f"cannot resume: train.max_steps={tc.max_steps} is below step {meta['step']}, which "
            f"{run_dir} has already reached; a schedule can be extended, not shortened"
        )
    summary = finished_summary(run_dir, cfg, meta)
    if summary is None:
        return ckpt_root / name, skipped, None
    if ctx.is_main:
        for why in skipped:
            print(f"tokenmix: warning: {why}; {name} is the newest valid checkpoint", file=sys.stderr)
    if ctx.is_main and not quiet:
        print(
            f"run {run_dir} is finished: step {meta['step']} of train.max_steps={tc.max_steps}, "
            f"val ppl {summary.get('val_ppl', float('nan')):.2f}; nothing to do (train it further with "
            f"--resume {run_dir} --set train.max_steps=N)",
            flush=True,
        )
    finished = TrainResult(
        run_dir,
        int(meta["step"]),
        summary.get("val_loss", math.nan),
        summary.get("val_ppl", math.nan),
        summary.get("bigram_ppl", math.nan),
        summary.get("unigram_ppl", math.nan),
        int(summary.get("tokens", meta.get("tokens", 0))),
        0.0,
        int(summary.get("num_params", meta.get("num_params", 0))),
    )
    return ckpt_root / name, skipped, finished


def _start_notes(
    cfg: LMRunConfig,
    run_dir: Path,
    ctx: DistContext,
    data: PreparedData,
    source: _InitSource | None,
    saved_vocab: int,
    start_ckpt: Path | None,
    skipped: list[str],
) -> list[str]:
    """Check what the run starts from against the prepared data, and the warnings to say once it may
    start. On resume: the run's tokenizer restored if lost, an extended schedule written to config.json,
    the unusable newer checkpoints set aside."""
    notes: list[str] = []
    if source is not None:
        _check_same_model(source.run_dir, source.config, cfg, vocab=True)
        if ctx.is_main and tokens_differ(source.run_dir / "tokenizer.json", data):
            notes.append(
                f"warning: the tokenizer of {source.run_dir} is not the one of this run's data "
                f"({data.dir}): the same ids stand for other tokens, so its embeddings start out mismatched"
            )
    if start_ckpt is not None:
        restored = _on_main(ctx, lambda: check_run_tokenizer(run_dir, data, saved_vocab))
        if ctx.is_main and read_run_config(run_dir).to_dict() != cfg.to_dict():  # an extended schedule
            atomic_write_json(run_dir / "config.json", cfg.to_dict(), indent=1)
        if ctx.is_main:
            for why in skipped:
                notes.append(f"warning: {why}; resuming from {start_ckpt.name}, the newest valid checkpoint")
            if skipped:  # the unusable newer ones are set aside (kept for inspection), latest.json repointed
                notes += recover_from(run_dir / "checkpoints", start_ckpt)
            if restored:
                notes.append(f"warning: {restored}")
    return notes


def _windows(data: PreparedData, cfg: LMRunConfig) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """The train split (checked to fill a batch), the periodic validation windows and the final ones."""
    tc = cfg.train
    train_ids = data.split("train")
    TokenBatches(train_ids, tc.seq_len, tc.batch_size, tc.seed)
    val_windows = eval_windows(data.split("val"), tc.seq_len, tc.eval_windows)
    final_windows = (
        val_windows
        if tc.final_eval_windows == tc.eval_windows
        else eval_windows(data.split("val"), tc.seq_len, tc.final_eval_windows)
    )
    if not val_windows:
        raise InputError("the validation split is empty; use a larger corpus or a larger data.val_fraction")
    if tc.pack:  # packed rows are cut at the separator: a tokenizer without one is refused here, not in the loop
        separator_id(data.tokenizer)
    return train_ids, val_windows, final_windows


def _build_model(
    cfg: LMRunConfig, ctx: DistContext, source: _InitSource | None
) -> tuple[MixerModel, nn.Module, torch.optim.Optimizer, int]:
    """The model (initial weights: the seed's, or ``source``'s), wrapped for the ranks, its optimizer, and
    its parameter count (counted before wrapping: FSDP shards the parameters)."""
    tc = cfg.train
    torch.manual_seed(tc.seed)  # identical initial weights on every rank and in every run
    model = MixerModel(cfg.model).to(ctx.device)
    if source is not None:  # every rank loads the same weights before wrapping (DDP and FSDP start from them)
        load_model_weights(source.checkpoint, model)
    num_params = model.num_params()
    wrapped = wrap_model(model, ctx, tc.parallel)
    optimizer = build_optimizer(wrapped, tc.lr, tc.weight_decay, (tc.beta1, tc.beta2), tc.eps)  # decay on matrices only
    return model, wrapped, optimizer, num_params


def _restore(
    start_ckpt: Path,
    run_dir: Path,
    ctx: DistContext,
    model: MixerModel,
    wrapped: nn.Module,
    optimizer: torch.optim.Optimizer,
) -> tuple[int, int, DataPosition]:
    """Load a resumed run's training state; drop the records (and the summary) of the steps it trains again."""
    meta = load_training_state(start_ckpt, wrapped, optimizer, model)
    step, tokens_seen = int(meta["step"]), int(meta["tokens"])
    position = DataPosition.from_dict(meta["data_position"])
    if ctx.is_main:
        last_summary = summary_step(run_dir)
        truncate_metrics(run_dir / "metrics.jsonl", step, keep_final=last_summary == step)
        if isinstance(last_summary, int) and last_summary > step:  # the summary of steps trained again
            (run_dir / "summary.json").unlink(missing_ok=True)
    return step, tokens_seen, position


def _open_log(
    run_dir: Path,
    ctx: DistContext,
    cfg: LMRunConfig,
    step: int,
    progress: bool | None,
    quiet: bool,
    source: _InitSource | None,
) -> RunLogger:
    """The run's logger (a progress bar on a terminal), with its opening warnings and init-from record."""
    tc = cfg.train
    if progress is None:
        progress = sys.stderr.isatty()
    log = RunLogger(run_dir, ctx.is_main, tc.max_steps, step, progress, tc.tensorboard, quiet)
    busy = load_warning() if ctx.is_main and not quiet else None  # once: stated durations assume a quiet machine
    if busy:
        log.say(f"warning: {busy}")
    if source is not None:
        log.record(
            {
                "step": 0,
                "event": "init_from",
                "run": str(source.run_dir),
                "checkpoint": source.checkpoint.name,
                "source_step": source.step,
            }
        )
        log.say(
            f"initial weights from {source.run_dir} ({source.checkpoint.name}, step {source.step}); the "
            "optimizer and the schedule start fresh"
        )
    return log
