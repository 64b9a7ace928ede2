"""The language-model training loop: optimizer steps over token batches, the periodic validation
passes and checkpoints, the final evaluation and summary.json, and what the run says as it goes
(``RunLogger``: metrics.jsonl, console lines or a progress bar, optional TensorBoard).

    run_loop(cfg, run_dir, ctx, data, wrapped, optimizer, batches, ...) -> TrainResult

Set-up (data, model, resume) is ``training/lm.py``'s; scoring is ``training/lm_eval.py``'s. The
learning rate is a function of the step alone, so a resumed run computes what the uninterrupted run
computes; under ``torchrun`` rank 0 alone logs and writes checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.core.errors import InputError
from tokenmix.core.files import atomic_write_json
from tokenmix.core.progress import format_eta, format_seconds
from tokenmix.data.loader import TokenBatches, shard
from tokenmix.data.prepare import PreparedData
from tokenmix.data.tokenizer import separator_id
from tokenmix.runs.checkpoint import save_checkpoint
from tokenmix.runs.lm import LMRunConfig, bigram_verdict
from tokenmix.training.distributed import DistContext
from tokenmix.training.lm_eval import (
    bigram_baseline,
    bits_per_char,
    document_packing,
    evaluate_windows,
    precision_autocast,
)
from tokenmix.training.schedule import warmup_cosine


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


# ------------------------------------------------------------------------------------ what the run says
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


@contextlib.contextmanager
def grad_sync(model: nn.Module, enabled: bool):
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


@dataclass
class _Pace:
    """The wall clocks of a session's steps: since its first step, and since the last console line."""

    start: float
    first_step: int
    window_t0: float
    window_tokens: int = 0


def run_loop(
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
    """Train from ``step`` to ``train.max_steps``, validating and checkpointing on the way, then score
    the final weights on ``final_windows`` and write summary.json."""
    tc = cfg.train
    separator = separator_id(data.tokenizer) if tc.pack else None  # documents keep to themselves
    ckpt_root = run_dir / "checkpoints"
    micro = tc.batch_size // (tc.grad_accum * ctx.world_size)
    eval_batch = max(micro, 1)
    baseline = _baseline(cfg, ctx, data, final_windows, num_params, log, resumed, step, tokens_seen, precision_note)
    last_val, last_val_step = None, -1
    wrapped.train()
    window_t0 = time.perf_counter()
    pace = _Pace(start=time.perf_counter(), first_step=step, window_t0=window_t0)
    tokens_per_step = tc.batch_size * tc.seq_len
    while step < tc.max_steps:
        lr = tc.lr * warmup_cosine(step, tc.max_steps, tc.warmup_steps, tc.min_lr_ratio)  # a function of the step alone
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_value, grad_norm = _optimizer_step(wrapped, optimizer, batches.next_batch(), cfg, ctx, separator)
        step += 1
        tokens_seen += tokens_per_step
        pace.window_tokens += tokens_per_step
        now = time.perf_counter()
        rec = {
            "step": step,
            "loss": loss_value,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens": tokens_seen,
            "elapsed_s": round(now - pace.start, 3),
        }
        if not math.isfinite(loss_value):
            raise TrainingDiverged(f"training diverged at step {step} (loss {loss_value}); lower train.lr")
        log.record(rec)
        if step % tc.log_every == 0 or step == tc.max_steps:
            _progress_line(log, pace, step, tc.max_steps, f"loss {loss_value:.3f}  lr {lr:.2e}", now)
        if step % tc.eval_every == 0 or step == tc.max_steps:
            last_val, last_val_step = (
                _validate(wrapped, val_windows, eval_batch, ctx, cfg, separator, step, log, baseline),
                step,
            )
        if (tc.checkpoint_every and step % tc.checkpoint_every == 0) or step == tc.max_steps:
            meta = _checkpoint_meta(cfg, step, tokens_seen, batches, num_params)
            save_checkpoint(ckpt_root, step, wrapped, optimizer, meta, tc.keep_checkpoints, ctx.is_main)
            ctx.barrier()
    # the reported number: the final weights on the final windows (the whole validation split by default)
    if final_windows is val_windows and last_val_step == step:
        final = last_val
    else:
        final = evaluate_windows(wrapped, final_windows, eval_batch, ctx.device, tc.precision, ctx, separator)
    return _finish(cfg, run_dir, ctx, data, final, baseline, step, tokens_seen, num_params, log, pace.start, session_t0)


def _baseline(
    cfg: LMRunConfig,
    ctx: DistContext,
    data: PreparedData,
    final_windows: list[Tensor],
    num_params: int,
    log: RunLogger,
    resumed: bool,
    step: int,
    tokens_seen: int,
    precision_note: str,
) -> dict:
    """The bigram and unigram baselines (rank 0 counts them, every rank gets them) and the run's start lines."""
    tc = cfg.train
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
    return ctx.broadcast_object(baseline)


def _optimizer_step(
    wrapped: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Tensor,
    cfg: LMRunConfig,
    ctx: DistContext,
    separator: int | None,
) -> tuple[float, float]:
    """One optimizer step over ``batch`` in ``train.grad_accum`` micro-steps: (mean loss over all ranks, grad norm)."""
    tc = cfg.train
    loss_sum = torch.zeros((), dtype=torch.float64)
    for a in range(tc.grad_accum):
        x = shard(batch, a, tc.grad_accum, ctx.rank, ctx.world_size).to(ctx.device)
        last_micro = a == tc.grad_accum - 1
        with grad_sync(wrapped, enabled=last_micro), precision_autocast(ctx.device, tc.precision):
            logits, _ = wrapped(x[:, :-1], packing=document_packing(x[:, :-1], separator))
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        (loss / tc.grad_accum).backward()
        loss_sum += loss.detach().double().cpu()
    max_norm = tc.grad_clip if tc.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(wrapped.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    loss_value = ctx.all_reduce_sum([float(loss_sum) / tc.grad_accum])[0] / ctx.world_size
    grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    return loss_value, grad_norm


def _progress_line(log: RunLogger, pace: _Pace, step: int, max_steps: int, loss_lr: str, now: float) -> None:
    """The console line (or progress bar) of ``step``: loss, learning rate and tokens per second since the last."""
    tps = pace.window_tokens / max(now - pace.window_t0, 1e-9)
    pace.window_t0, pace.window_tokens = now, 0
    info = f"{loss_lr}  {tps:,.0f} tok/s"
    log.advance(step, info)
    if log._progress is None:  # a log: where the run is, how long it took, how long it will take
        elapsed = now - pace.start
        eta = elapsed / (step - pace.first_step) * (max_steps - step)
        log.say(
            f"step {step}/{max_steps}  {info}  {format_seconds(elapsed)} elapsed"
            + (f", {format_eta(eta)}" if step < max_steps else "")
        )


def _validate(
    wrapped: nn.Module,
    val_windows: list[Tensor],
    eval_batch: int,
    ctx: DistContext,
    cfg: LMRunConfig,
    separator: int | None,
    step: int,
    log: RunLogger,
    baseline: dict,
) -> dict:
    """A periodic validation pass, recorded and said."""
    val = evaluate_windows(wrapped, val_windows, eval_batch, ctx.device, cfg.train.precision, ctx, separator)
    log.record({"step": step, "split": "val", "val_loss": val["loss"], "val_ppl": val["ppl"]})
    log.say(f"step {step}: val loss {val['loss']:.4f}, ppl {val['ppl']:.2f} (bigram {baseline['bigram_ppl']:.2f})")
    return val


def _checkpoint_meta(cfg: LMRunConfig, step: int, tokens_seen: int, batches: TokenBatches, num_params: int) -> dict:
    """What a checkpoint holds besides the weights and the optimizer: where the data and the schedule stand."""
    tc = cfg.train
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


def _finish(
    cfg: LMRunConfig,
    run_dir: Path,
    ctx: DistContext,
    data: PreparedData,
    final: dict,
    baseline: dict,
    step: int,
    tokens_seen: int,
    num_params: int,
    log: RunLogger,
    start_time: float,
    session_t0: float,
) -> TrainResult:
    """The run's result; on rank 0 also its final record, summary.json and closing line."""
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
        _write_final(result, cfg, data, final, baseline, log, session_seconds, cpu_seconds)
    return result


def _write_final(
    result: TrainResult,
    cfg: LMRunConfig,
    data: PreparedData,
    final: dict,
    baseline: dict,
    log: RunLogger,
    session_seconds: float,
    cpu_seconds: float,
) -> None:
    """The final record of metrics.jsonl, summary.json and the closing line of a run's ``result``
    (its folder, steps, tokens, parameters and training seconds); ``session_seconds``: wall seconds
    from the call, ``cpu_seconds``: the process's CPU seconds."""
    run_dir, step = result.run_dir, result.steps
    bpc = bits_per_char(final, data)
    bigram_bpc = bits_per_char({"loss": baseline.get("bigram_loss", math.nan), "tokens": baseline["tokens"]}, data)
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
        "num_params": result.num_params,
        "tokens": result.tokens,
        "precision": cfg.train.precision,
        "train_seconds_this_session": round(result.seconds, 1),
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
