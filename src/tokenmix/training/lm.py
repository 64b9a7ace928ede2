"""Language-model training, evaluation and baselines on prepared text (``tokenmix train lm``).

    train_lm(cfg, run_dir, resume=False) -> TrainResult
    evaluate_windows(model, windows, ...) -> {"loss", "ppl", "tokens", "per_position_loss"}
    bigram_baseline(train_ids, windows, vocab_size) -> {"bigram_ppl", "unigram_ppl", ...}
    load_run(run_dir) -> LoadedRun (config, model with the latest weights, tokenizer)

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
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.core.errors import InputError
from tokenmix.core.files import (
    MAX_JSON_BYTES,
    atomic_copy,
    atomic_write_json,
    atomic_write_text,
    check_output_dir,
    check_regular_file,
    parse_json,
    read_json,
    read_text_file,
    remove_temporaries,
)
from tokenmix.core.lock import folder_lock
from tokenmix.core.packing import Packing
from tokenmix.core.progress import format_seconds, load_warning
from tokenmix.data.corpora import path_documents
from tokenmix.data.loader import DataPosition, TokenBatches, eval_windows, shard
from tokenmix.data.prepare import PreparedData, prepare_data
from tokenmix.data.tokenizer import encode_documents, load_tokenizer, separator_id
from tokenmix.generation import position_limit
from tokenmix.models import MixerModel
from tokenmix.runs.checkpoint import (
    CheckpointError,
    load_model_weights,
    load_training_state,
    newest_valid_checkpoint,
    recover_from,
    remove_stale_temporaries,
    save_checkpoint,
)
from tokenmix.runs.lm import (
    LMRunConfig,
    bigram_verdict,
    check_batch_memory,
    check_model_memory,
    load_run,
    model_differences,
    read_run_config,
    resolve_device,
    with_vocab,
)
from tokenmix.training.distributed import DistContext, setup_distributed, wrap_model
from tokenmix.training.optim import build_optimizer
from tokenmix.training.schedule import warmup_cosine

# interpolation weights tried for the bigram; the best one on Shakespeare is 100-300 (a grid that stops at
# the edge would leave the baseline weaker than it can be)
BIGRAM_SMOOTHING_GRID = (0.01, 0.1, 1.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0)
# the files of a run folder train_lm writes atomically (core/files.py): their temporaries, left by a
# killed run, are removed when the run starts again
RUN_FILES = ("config.json", "tokenizer.json", "metrics.jsonl", "summary.json")
# the overrides a resumed run accepts: extending its schedule. Everything else would make the resumed
# steps differ from what the saved config says the run is (and break the bit-exact resume).
RESUME_KEYS = ("train.max_steps",)


class TrainingDiverged(InputError):
    """The loss became non-finite (a configuration problem: usually the learning rate)."""


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    val_loss: float
    val_ppl: float
    bigram_ppl: float
    unigram_ppl: float
    tokens: int
    seconds: float
    num_params: int


# ------------------------------------------------------------------------------------ baselines
def bigram_baseline(train_ids: np.ndarray, windows: list[Tensor], vocab_size: int) -> dict:
    """Count-based bigram and unigram perplexities on exactly the targets the model is scored on.

    P(b | a) = (c(a, b) + lam * P_uni(b)) / (c(a) + lam), with P_uni add-one smoothed and lam the
    value of BIGRAM_SMOOTHING_GRID with the lowest validation loss (so the baseline is tuned on the
    data it is compared on, which only makes it stronger).
    """
    ids = np.asarray(train_ids, dtype=np.int64)
    v = vocab_size
    uni = np.bincount(ids, minlength=v).astype(np.float64) + 1.0
    p_uni = uni / uni.sum()
    pairs, counts = np.unique(ids[:-1] * v + ids[1:], return_counts=True)
    prev_count = np.bincount(ids[:-1], minlength=v).astype(np.float64)
    if windows:
        prev = np.concatenate([w[:-1].numpy() for w in windows])
        nxt = np.concatenate([w[1:].numpy() for w in windows])
    else:
        prev = nxt = np.zeros(0, dtype=np.int64)
    if len(nxt) == 0:
        return {"bigram_ppl": float("nan"), "unigram_ppl": float("nan"), "bigram_smoothing": None, "tokens": 0}
    q = prev * v + nxt
    pos = np.searchsorted(pairs, q).clip(max=len(pairs) - 1)
    c_ab = np.where(pairs[pos] == q, counts[pos], 0).astype(np.float64)
    best = None
    for lam in BIGRAM_SMOOTHING_GRID:
        p = (c_ab + lam * p_uni[nxt]) / (prev_count[prev] + lam)
        nll = float(-np.log(p).mean())
        if best is None or nll < best[1]:
            best = (lam, nll)
    uni_nll = float(-np.log(p_uni[nxt]).mean())
    return {
        "bigram_ppl": math.exp(best[1]),
        "bigram_loss": best[1],
        "bigram_smoothing": best[0],
        "unigram_ppl": math.exp(uni_nll),
        "unigram_loss": uni_nll,
        "tokens": int(len(nxt)),
    }


# ------------------------------------------------------------------------------------ precision
def native_bf16(device: torch.device) -> tuple[bool, str]:
    """Whether bf16 matmuls run natively (fast) on ``device``, and why.

    On CPU only AMX-BF16 or AVX512-BF16 make bf16 autocast pay off; without them oneDNN emulates
    bf16 and a matmul runs one to two orders of magnitude *slower* than fp32 (the measurements:
    docs/notes/design-measurements.md). The CPU flags decide, not a timing, so every rank and every
    resume reach the same answer.
    """
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ok, "this GPU supports bf16" if ok else "this GPU has no bf16 support"
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    found = sorted(flags & {"amx_bf16", "avx512_bf16"})
    if found:
        return True, f"this CPU has {', '.join(found)}"
    return False, "this CPU has no native bf16 matmul (no AMX-BF16 or AVX512-BF16)"


def resolve_precision(requested: str, device: torch.device) -> tuple[str, str]:
    """``train.precision`` as it will run (``auto`` -> bf16 or fp32) and a line saying why."""
    ok, why = native_bf16(device)
    if requested == "auto":
        return ("bf16", f"precision bf16 autocast ({why})") if ok else ("fp32", f"precision fp32 ({why})")
    if requested == "bf16" and not ok:
        return "bf16", f"precision bf16 as requested, but {why}: expect it to be much slower than fp32"
    return requested, f"precision {requested}"


# ------------------------------------------------------------------------------------ evaluation
def _autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def document_packing(inputs: Tensor, separator: int | None) -> Packing | None:
    """The documents of a batch of token windows [B, T]: each begins at a separator (the stream is
    ``[sep, doc..., sep, doc...]``, data/prepare.py), the part before a row's first separator
    continues a document begun before the window. None without a separator (unpacked).

    What the loss then sees: the separator is predicted from the document it ends (the model learns
    where a document stops, which generation relies on), and each document's first token is
    predicted from the separator alone, never from the previous document's text."""
    return None if separator is None else Packing.from_resets(inputs == separator)


@torch.no_grad()
def evaluate_windows(
    model: nn.Module,
    windows: list[Tensor],
    batch_size: int,
    device: torch.device,
    precision: str = "fp32",
    ctx: DistContext | None = None,
    separator: int | None = None,
) -> dict:
    """Mean next-token loss over ``windows`` (each [L + 1]), and the mean loss at each position.

    With ``separator`` (the document separator's id) every window runs packed (``document_packing``):
    each token is scored on its own document's context alone, as a model trained with
    ``train.pack`` was trained.

    Under torchrun the windows are dealt round-robin to ranks; every rank runs the same number of
    forward passes (a rank without a window of its own repeats one with weight 0), which FSDP needs
    because each forward is a collective there.
    """
    ctx = ctx or DistContext()
    was_training = model.training
    model.eval()
    by_len: dict[int, list[Tensor]] = {}
    for w in windows:
        by_len.setdefault(len(w), []).append(w)
    max_len = max((len(w) for w in windows), default=1) - 1
    pos_sum = torch.zeros(max(max_len, 1), dtype=torch.float64)
    pos_cnt = torch.zeros(max(max_len, 1), dtype=torch.float64)
    for length in sorted(by_len):
        group = by_len[length]
        mine = group[ctx.rank :: ctx.world_size]
        n_batches = math.ceil(math.ceil(len(group) / ctx.world_size) / batch_size)
        for bi in range(n_batches):
            rows = mine[bi * batch_size : (bi + 1) * batch_size]
            weight = 1.0
            if not rows:  # keep the collective count equal on every rank
                rows, weight = group[:1], 0.0
            x = torch.stack(rows).to(device)
            with _autocast(device, precision):
                logits, _ = model(x[:, :-1], packing=document_packing(x[:, :-1], separator))
            nll = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten(), reduction="none")
            nll = nll.view(x.shape[0], -1).double().cpu()
            pos_sum[: length - 1] += weight * nll.sum(0)
            pos_cnt[: length - 1] += weight * nll.shape[0]
    if ctx.distributed:
        sums = ctx.all_reduce_sum(pos_sum.tolist() + pos_cnt.tolist())
        pos_sum = torch.tensor(sums[: len(pos_sum)], dtype=torch.float64)
        pos_cnt = torch.tensor(sums[len(pos_cnt) :], dtype=torch.float64)
    model.train(was_training)
    tokens = float(pos_cnt.sum())
    loss = float(pos_sum.sum() / tokens) if tokens else float("nan")
    per_pos = (pos_sum / pos_cnt.clamp(min=1)).tolist()
    return {
        "loss": loss,
        "ppl": math.exp(loss) if tokens else float("nan"),
        "tokens": int(tokens),
        "per_position_loss": per_pos,
    }


# ------------------------------------------------------------------------------------ run directory
class RunLogger:
    """metrics.jsonl (every record), console lines or a rich progress bar, optional TensorBoard. Rank 0 only."""

    def __init__(
        self,
        run_dir: Path,
        enabled: bool,
        total_steps: int,
        start_step: int,
        progress: bool,
        tensorboard: bool,
        quiet: bool = False,
    ) -> None:
        self.enabled, self.quiet = enabled, quiet
        self.path = run_dir / "metrics.jsonl"
        self._file = open(self.path, "a") if enabled else None
        self._progress = self._task = None
        if enabled and progress and not quiet:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]train[/]"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("train", total=total_steps, completed=start_step, info="")
        self._tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(run_dir / "tb"))
            except ImportError:  # tensorboard is optional: said once, at the start of the run (not under --quiet)
                self._tb = None
                if not quiet:
                    print(
                        "tokenmix: warning: train.tensorboard is true but tensorboard is not installed, so no "
                        "tb/ events are written (pip install tensorboard, or set train.tensorboard=false)",
                        file=sys.stderr,
                        flush=True,
                    )

    def record(self, rec: dict) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(rec) + "\n")
        self._file.flush()
        if self._tb is not None and "step" in rec:
            for k, v in rec.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, rec["step"])

    def say(self, text: str) -> None:
        if not self.enabled or self.quiet:
            return
        if self._progress is not None:
            self._progress.console.print(text, markup=False)
        else:
            print(text, flush=True)

    def advance(self, step: int, info: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        if self._tb is not None:
            self._tb.close()
        if self._file is not None:
            self._file.close()


def _truncate_metrics(path: Path, last_step: int, keep_final: bool) -> None:
    """Drop records of steps after the checkpoint a run resumes from (the killed run wrote them), and,
    unless ``keep_final`` (the run had finished there: a schedule extended since), a final record at
    its step (a run killed between that record and summary.json)."""
    if not path.is_file():
        return
    keep = []
    for line in read_text_file(
        path, "metrics file", max_bytes=MAX_JSON_BYTES, within=path.parent, errors="replace"
    ).splitlines():
        try:
            rec = parse_json(line, "a metrics record")
        except InputError:
            continue  # a line cut by the kill
        if not isinstance(rec, dict):
            continue
        step = rec.get("step", 0)
        if step < last_step or (step == last_step and (keep_final or rec.get("event") != "final")):
            keep.append(line)  # a final record at the checkpoint's step: the resumed run writes its own
    atomic_write_text(path, "".join(l + "\n" for l in keep))


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

    def enter() -> None:
        if run_dir.exists() and not run_dir.is_dir():
            raise InputError(f"'{run_dir}' exists and is not a folder; --out must name a new or existing run folder")
        if resume and not run_dir.is_dir():
            raise InputError(f"cannot resume: run directory '{run_dir}' does not exist")
        check_output_dir(run_dir, "run folder")
        try:
            for p in reversed([run_dir, *run_dir.parents]):
                if not p.exists():
                    p.mkdir()
                    created.append(p)
        except OSError as e:
            raise InputError(f"cannot create run folder '{run_dir}': {e.strerror or e}") from None
        lock.enter_context(folder_lock(run_dir, "train lm"))
        # the lock is held: nobody else writes here, so what a killed run left half-written is stale
        remove_stale_temporaries(run_dir / "checkpoints")
        remove_temporaries(run_dir, lambda name: name in RUN_FILES)

    try:
        _on_main(ctx, enter)
        yield
    finally:
        lock.close()
        for p in reversed(created):  # only folders this call made, and only while empty
            try:
                p.rmdir()
            except OSError:
                break


def _tokens_differ(path: Path, data: PreparedData) -> bool:
    """Whether the tokenizer at ``path`` has other tokens than the prepared data's (unreadable: differs)."""
    try:
        return load_tokenizer(path, within=path.parent).get_vocab() != data.tokenizer.get_vocab()
    except InputError:
        return True


def _check_run_tokenizer(run_dir: Path, data: PreparedData, vocab_size: int) -> str | None:
    """On resume: the run's tokenizer.json must be the tokenizer of its data. A missing or unreadable
    one is restored from the prepared data (when that has the vocabulary the model was trained with);
    returns a line saying so. A readable one with other tokens is refused."""
    path = run_dir / "tokenizer.json"
    source = data.tokenizer
    try:
        tok = load_tokenizer(path, within=run_dir)
    except InputError as e:
        if source.get_vocab_size() != vocab_size:
            raise InputError(
                f"cannot resume: {e}, and the prepared data in {data.dir} has a {source.get_vocab_size()}"
                f"-token tokenizer where the model has {vocab_size}"
            ) from None
        atomic_copy(data.dir / "tokenizer.json", path)
        return f"{e}; restored it from the prepared data in {data.dir}"
    if tok.get_vocab() != source.get_vocab():
        raise InputError(
            f"cannot resume: {path} is not the tokenizer of the run's prepared data {data.dir} "
            "(different tokens); restore the run's own tokenizer.json"
        )
    return None


def _summary(run_dir: Path) -> dict | None:
    try:
        summary = read_json(run_dir / "summary.json", "run summary", within=run_dir)
    except InputError:
        return None
    return summary if isinstance(summary, dict) else None


def _summary_step(run_dir: Path) -> int | None:
    """The step summary.json was written at (the end of a finished session), if any."""
    return (_summary(run_dir) or {}).get("steps")


def _finished(run_dir: Path, cfg: LMRunConfig, meta: dict) -> dict | None:
    """summary.json of a run whose checkpoint ``meta`` is its final one, already evaluated; else None."""
    if int(meta["step"]) < cfg.train.max_steps:
        return None
    summary = _summary(run_dir)
    return summary if summary is not None and summary.get("steps") == int(meta["step"]) else None


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

        def check_metrics() -> None:  # appended to below: a FIFO there would block the open forever
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
        start_ckpt = ckpt_root / name
        if tc.max_steps < int(meta["step"]):
            raise InputError(
                f"cannot resume: train.max_steps={tc.max_steps} is below step {meta['step']}, which "
                f"{run_dir} has already reached; a schedule can be extended, not shortened"
            )
        summary = _finished(run_dir, cfg, meta)
        if summary is not None:  # nothing to do: say so and touch nothing
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
            return TrainResult(
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
    notes: list[str] = []
    if source is not None:
        _check_same_model(source.run_dir, source.config, cfg, vocab=True)
        if ctx.is_main and _tokens_differ(source.run_dir / "tokenizer.json", data):
            notes.append(
                f"warning: the tokenizer of {source.run_dir} is not the one of this run's data "
                f"({data.dir}): the same ids stand for other tokens, so its embeddings start out mismatched"
            )
    if resume:
        restored = _on_main(ctx, lambda: _check_run_tokenizer(run_dir, data, saved_vocab))
        if ctx.is_main and read_run_config(run_dir).to_dict() != cfg.to_dict():  # an extended schedule
            atomic_write_json(run_dir / "config.json", cfg.to_dict(), indent=1)
        if ctx.is_main:
            for why in skipped:
                notes.append(f"warning: {why}; resuming from {start_ckpt.name}, the newest valid checkpoint")
            if skipped:  # the unusable newer ones are set aside (kept for inspection), latest.json repointed
                notes += recover_from(ckpt_root, start_ckpt)
            if restored:
                notes.append(f"warning: {restored}")
    # refused before config.json, tokenizer.json or metrics.jsonl is written: a context the splits cannot fill
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
    if ctx.is_main:
        for note in notes:
            print(f"tokenmix: {note}", file=sys.stderr, flush=True)
        if not resume:
            for stale in ("metrics.jsonl", "summary.json"):  # left by a run killed before its first checkpoint
                (run_dir / stale).unlink(missing_ok=True)
            atomic_write_json(run_dir / "config.json", cfg.to_dict(), indent=1)
            atomic_copy(data.dir / "tokenizer.json", run_dir / "tokenizer.json")
    ctx.barrier()

    torch.manual_seed(tc.seed)  # identical initial weights on every rank and in every run
    model = MixerModel(cfg.model).to(ctx.device)
    if source is not None:  # every rank loads the same weights before wrapping (DDP and FSDP start from them)
        load_model_weights(source.checkpoint, model)
    num_params = model.num_params()
    wrapped = wrap_model(model, ctx, tc.parallel)
    optimizer = build_optimizer(wrapped, tc.lr, tc.weight_decay, (tc.beta1, tc.beta2), tc.eps)  # decay on matrices only

    step, tokens_seen, position = 0, 0, DataPosition()
    if start_ckpt is not None:
        meta = load_training_state(start_ckpt, wrapped, optimizer, model)
        step, tokens_seen = int(meta["step"]), int(meta["tokens"])
        position = DataPosition.from_dict(meta["data_position"])
        if ctx.is_main:
            summary_step = _summary_step(run_dir)
            _truncate_metrics(run_dir / "metrics.jsonl", step, keep_final=summary_step == step)
            if isinstance(summary_step, int) and summary_step > step:  # the summary of steps trained again
                (run_dir / "summary.json").unlink(missing_ok=True)
    batches = TokenBatches(train_ids, tc.seq_len, tc.batch_size, tc.seed, position)

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
    try:
        return _loop(
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


def _loop(
    cfg: LMRunConfig,
    run_dir: Path,
    ctx: DistContext,
    data: PreparedData,
    wrapped: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: TokenBatches,
    val_windows: list[Tensor],
    final_windows: list[Tensor],
    step: int,
    tokens_seen: int,
    num_params: int,
    log: RunLogger,
    resumed: bool,
    session_t0: float,
    precision_note: str = "",
) -> TrainResult:
    tc = cfg.train
    separator = separator_id(data.tokenizer) if tc.pack else None  # documents keep to themselves
    ckpt_root = run_dir / "checkpoints"
    micro = tc.batch_size // (tc.grad_accum * ctx.world_size)
    eval_batch = max(micro, 1)
    baseline = {}
    if ctx.is_main:
        # one baseline per run, scored on the targets of the reported (final) evaluation: the number the
        # start line, every validation line, the closing line and summary.json all show
        baseline = bigram_baseline(train_ids=data.split("train"), windows=final_windows, vocab_size=data.vocab_size)
        if not resumed:
            log.record({"step": 0, "event": "baseline", **baseline})
        layers = ",".join(cfg.model.layers)
        log.say(
            f"model: {num_params:,} parameters, layers {layers}, d_model {cfg.model.d_model}, vocab "
            f"{cfg.model.vocab_size}, positions {cfg.model.positions}; {tc.max_steps} steps of "
            f"{tc.batch_size} x {tc.seq_len} tokens"
            f"{', documents packed (no token reads another document)' if tc.pack else ''}"
            f"{f' on {ctx.world_size} ranks ({tc.parallel})' if ctx.distributed else ''}"
            f"{f', {precision_note}' if precision_note else ''}"  # (a line of its own opened the log, unlabelled)
        )
        log.say(
            f"baselines on the {baseline['tokens']:,} validation tokens of the final evaluation: bigram ppl "
            f"{baseline['bigram_ppl']:.2f}, "
            f"unigram ppl {baseline['unigram_ppl']:.2f}"
        )
        if resumed:
            log.say(f"resumed from step {step} ({tokens_seen:,} tokens)")
    baseline = ctx.broadcast_object(baseline)

    def checkpoint_meta() -> dict:
        return {
            "tokens": tokens_seen,
            "data_position": batches.position.to_dict(),
            "scheduler": {
                "kind": "warmup_cosine",
                "step": step,
                "peak_lr": tc.lr,
                "warmup_steps": tc.warmup_steps,
                "total_steps": tc.max_steps,
                "min_lr_ratio": tc.min_lr_ratio,
            },
            "config": cfg.to_dict(),
            "num_params": num_params,
        }

    last_val, last_val_step = None, -1
    wrapped.train()
    window_t0, window_tokens = time.perf_counter(), 0
    start_time, first_step = time.perf_counter(), step
    tokens_per_step = tc.batch_size * tc.seq_len
    while step < tc.max_steps:
        lr = tc.lr * warmup_cosine(step, tc.max_steps, tc.warmup_steps, tc.min_lr_ratio)  # a function of the step alone
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = batches.next_batch()
        loss_sum = torch.zeros((), dtype=torch.float64)
        for a in range(tc.grad_accum):
            x = shard(batch, a, tc.grad_accum, ctx.rank, ctx.world_size).to(ctx.device)
            last_micro = a == tc.grad_accum - 1
            with _grad_sync(wrapped, enabled=last_micro), _autocast(ctx.device, tc.precision):
                logits, _ = wrapped(x[:, :-1], packing=document_packing(x[:, :-1], separator))
            loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
            (loss / tc.grad_accum).backward()
            loss_sum += loss.detach().double().cpu()
        max_norm = tc.grad_clip if tc.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(wrapped.parameters(), max_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        tokens_seen += tokens_per_step
        window_tokens += tokens_per_step
        loss_value = ctx.all_reduce_sum([float(loss_sum) / tc.grad_accum])[0] / ctx.world_size
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        now = time.perf_counter()
        rec = {
            "step": step,
            "loss": loss_value,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens": tokens_seen,
            "elapsed_s": round(now - start_time, 3),
        }
        if not math.isfinite(loss_value):
            raise TrainingDiverged(f"training diverged at step {step} (loss {loss_value}); lower train.lr")
        log.record(rec)
        if step % tc.log_every == 0 or step == tc.max_steps:
            tps = window_tokens / max(now - window_t0, 1e-9)
            window_t0, window_tokens = now, 0
            info = f"loss {loss_value:.3f}  lr {lr:.2e}  {tps:,.0f} tok/s"
            log.advance(step, info)
            if log._progress is None:  # a log: where the run is, how long it took, how long it will take
                elapsed = now - start_time
                eta = elapsed / (step - first_step) * (tc.max_steps - step)
                log.say(
                    f"step {step}/{tc.max_steps}  {info}  {format_seconds(elapsed)} elapsed"
                    + (f", ETA {format_seconds(eta)}" if step < tc.max_steps else "")
                )
        if step % tc.eval_every == 0 or step == tc.max_steps:
            last_val, last_val_step = (
                evaluate_windows(wrapped, val_windows, eval_batch, ctx.device, tc.precision, ctx, separator),
                step,
            )
            log.record({"step": step, "split": "val", "val_loss": last_val["loss"], "val_ppl": last_val["ppl"]})
            log.say(
                f"step {step}: val loss {last_val['loss']:.4f}, ppl {last_val['ppl']:.2f} "
                f"(bigram {baseline['bigram_ppl']:.2f})"
            )
        if (tc.checkpoint_every and step % tc.checkpoint_every == 0) or step == tc.max_steps:
            save_checkpoint(ckpt_root, step, wrapped, optimizer, checkpoint_meta(), tc.keep_checkpoints, ctx.is_main)
            ctx.barrier()
    # the reported number: the final weights on the final windows (the whole validation split by default)
    if final_windows is val_windows and last_val_step == step:
        final = last_val
    else:
        final = evaluate_windows(wrapped, final_windows, eval_batch, ctx.device, tc.precision, ctx, separator)
    now = time.perf_counter()
    # wall from the call (data preparation included), CPU of the whole process (all threads, imports included)
    seconds, session_seconds, cpu_seconds = now - start_time, now - session_t0, time.process_time()
    result = TrainResult(
        run_dir,
        step,
        final["loss"],
        final["ppl"],
        baseline["bigram_ppl"],
        baseline["unigram_ppl"],
        tokens_seen,
        seconds,
        num_params,
    )
    if ctx.is_main:
        bpc = _bits_per_char(final, data)
        bigram_bpc = _bits_per_char({"loss": baseline.get("bigram_loss", math.nan), "tokens": baseline["tokens"]}, data)
        log.record(
            {
                "step": step,
                "event": "final",
                "split": "val",
                "final_val_loss": final["loss"],
                "final_val_ppl": final["ppl"],
                "final_val_tokens": final["tokens"],
                "final_bigram_ppl": baseline["bigram_ppl"],
                **({"bits_per_char": bpc} if bpc else {}),
                **({"bigram_bits_per_char": bigram_bpc} if bigram_bpc else {}),
            }
        )
        summary = {
            "steps": step,
            "val_loss": final["loss"],
            "val_ppl": final["ppl"],
            "val_tokens": final["tokens"],
            "bigram_ppl": baseline["bigram_ppl"],
            "unigram_ppl": baseline["unigram_ppl"],
            "bigram_ratio": baseline["bigram_ppl"] / final["ppl"],
            "val_bits_per_char": bpc,
            "bigram_bits_per_char": bigram_bpc,
            "num_params": num_params,
            "tokens": tokens_seen,
            "precision": tc.precision,
            "train_seconds_this_session": round(seconds, 1),
            "wall_seconds_this_session": round(session_seconds, 1),
            "process_cpu_seconds": round(cpu_seconds, 1),
        }
        atomic_write_json(run_dir / "summary.json", summary, indent=1)
        log.say(
            f"done: validation {bigram_verdict(final['ppl'], baseline['bigram_ppl'])}; "
            f"unigram ppl {baseline['unigram_ppl']:.2f}; on {final['tokens']:,} validation tokens"
            f"{f' ({bpc:.3f} bits/char, bigram {bigram_bpc:.3f})' if bpc and bigram_bpc else ''}; "
            f"{session_seconds:.0f} s wall, {cpu_seconds:.0f} s CPU "
            f"(this process, all threads); run directory {run_dir}"
        )
    return result


def _bits_per_char(res: dict, data: PreparedData) -> float | None:
    """Total validation loss over the split's characters, in bits (comparable across vocabularies);
    None unless ``res`` scored every token of the split (all but the first)."""
    chars = data.meta.get("splits", {}).get("val", {}).get("chars")
    if not chars or not res["tokens"] or res["tokens"] != len(data.split("val")) - 1:
        return None
    return res["loss"] * res["tokens"] / (chars * math.log(2))


@contextlib.contextmanager
def _grad_sync(model: nn.Module, enabled: bool):
    """Skip the gradient all-reduce on accumulation micro-steps before the last (DDP and FSDP)."""
    if enabled:
        yield
        return
    if hasattr(model, "no_sync"):  # DDP
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


# ------------------------------------------------------------------------------------ evaluating runs
def text_token_stream(path: str | Path, tok, doc_chars: int) -> np.ndarray:
    """The token stream of a user's text file (or folder, or record file) packed as the prepared
    splits are: documents cut as ``data prepare`` cuts them, each after a separator token, so that a
    model meets the text as it met its training data."""
    docs = path_documents(Path(path), doc_chars)
    sep = separator_id(tok)
    ids = [tid for doc in encode_documents(tok, [d.text for d in docs]) for tid in (sep, *doc)]
    return np.asarray(ids, dtype=np.int64)


def evaluate_run(
    run_dir: str | Path,
    split: str = "test",
    max_windows: int = 0,
    batch_size: int = 8,
    text: str | Path | None = None,
    context: int | None = None,
    device: str = "cpu",
    per_document: bool = False,
) -> dict:
    """Perplexity and per-position loss of a run's latest checkpoint on a split of its data, or on
    a text file (``text``, tokenized with the run's tokenizer), in windows of ``context`` tokens
    (default train.seq_len), with the bigram and unigram baselines (counted on the train split) on
    the same tokens. A run trained with ``train.pack`` is scored packed, as it was trained
    (``document_packing``: no token reads another document).

    ``per_document``: also every document alone (``document_scores``): its perplexity from its own
    separator on, in windows of ``context`` tokens, and the perplexity over all of them.

    A context longer than training measures length extrapolation: position-free mixers and
    sinusoidal codes run at any length, learned positions stop at model.max_seq_len (refused).
    """
    if text is not None and not str(text).strip():
        raise InputError("--text is empty; give a text file or a folder of text files")
    cfg = read_run_config(run_dir)
    seq = cfg.train.seq_len if context is None else context
    if seq < 1:
        raise InputError(f"--context must be >= 1, got {seq}")
    dev = resolve_device(device)
    run = load_run(run_dir, dev)
    limit = position_limit(run.model)
    if limit is not None and seq > limit:
        raise InputError(
            f"--context {seq} exceeds this model's learned positions (model.max_seq_len={limit}); "
            "a model with learned positions cannot score tokens past them"
        )
    data = prepare_data(run.config.data, wait=True)  # reuses the run's prepared directory (re-made if it was deleted)
    ids = data.split(split) if text is None else text_token_stream(text, run.tokenizer, run.config.data.doc_chars)
    windows = eval_windows(ids, seq, max_windows)
    if not windows or len(ids) < 2:
        raise InputError(
            f"'{text}' has fewer than 2 tokens" if text is not None else f"the {split} split of {data.dir} is empty"
        )
    separator = separator_id(run.tokenizer)
    res = evaluate_windows(run.model, windows, batch_size, dev, "fp32", separator=separator if cfg.train.pack else None)
    base = bigram_baseline(data.split("train"), windows, data.vocab_size)
    if per_document:
        names = data.meta["splits"][split]["documents"] if text is None else None
        res |= document_scores(run.model, ids, separator, seq, batch_size, dev, names)
    return {
        "split": split if text is None else None,
        "text": None if text is None else str(text),
        "context": seq,
        "train_seq_len": run.config.train.seq_len,
        "packed": cfg.train.pack,
        "device": str(dev),
        "step": run.meta["step"],
        "checkpoint": str(run.checkpoint),
        **res,
        "bigram_ppl": base["bigram_ppl"],
        "unigram_ppl": base["unigram_ppl"],
    }


def document_scores(
    model: nn.Module,
    ids: np.ndarray,
    separator: int,
    context: int,
    batch_size: int,
    device: torch.device,
    names: list[str] | None = None,
) -> dict:
    """Every document of a token stream ``[sep, doc..., sep, doc...]`` scored alone: its tokens from
    its separator on, in consecutive windows of ``context`` (each window from a fresh state), the
    separator that ends it included as its last target.

    Returns {"documents": [{"name", "tokens", "loss", "ppl"}], "document_ppl": the perplexity over
    all documents' tokens, "document_ppl_median": the median of the documents' perplexities}.
    """
    starts = np.flatnonzero(np.asarray(ids) == separator).tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    ends = [*starts[1:], len(ids) - 1]
    docs, total_nll, total_tokens = [], 0.0, 0
    for i, (s, e) in enumerate(zip(starts, ends)):
        if e <= s:
            continue
        res = evaluate_windows(model, eval_windows(ids[s : e + 1], context), batch_size, device)
        total_nll, total_tokens = total_nll + res["loss"] * res["tokens"], total_tokens + res["tokens"]
        name = names[i] if names is not None and len(names) == len(starts) else f"document {i}"
        docs.append({"name": name, "tokens": res["tokens"], "loss": res["loss"], "ppl": res["ppl"]})
    if not docs:
        raise InputError("no document to score: the stream holds fewer than 2 tokens")
    return {
        "documents": docs,
        "document_ppl": math.exp(total_nll / total_tokens),
        "document_ppl_median": float(np.median([d["ppl"] for d in docs])),
    }
