"""Train and evaluate the one generic model on one synthetic-task run.

Protocol (zoology's): AdamW, linear warmup + cosine decay, early stopping once the validation
accuracy reaches ``early_stop_acc``; the checkpoint with the best validation accuracy is scored on a
held-out test set (and kept: ``runs.synthetic.WEIGHTS``). A run's budget can be set by learning
instead of by tokens (``LearningBudget``: stop once validation has stopped gaining, never before a
floor of steps that lets a run leave its initial plateau). A run may start with a curriculum
(``CurriculumPhase``: phases of other training distributions, e.g. the instances its row's layer
reads in one hop, then its own task); the patience counts from the curriculum's end. The three splits
come from three seeds: training data from the run's seed, validation and test from ``val_seed`` /
``test_seed`` (the same for every run, so all rows are scored on the same examples, whatever their
curriculum: each run records the splits' hashes). Every run records its learning curve, its phases,
the steps to 50 % / 90 % of its best validation accuracy, whether the step budget stopped it while
still rising, and -- for tasks whose answers have a source -- its test accuracy split by what the
row's layer reads (``RowReads``). ``summarize`` reports, per (row, task, width), the learning rate
whose mean validation accuracy over seeds is highest, with the test accuracy's mean ± std there.

What a run is and where its files go: ``runs/synthetic.py``; sweeps of runs (resumable, in worker
processes): ``training/sweep.py``.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from tokenmix.core.files import atomic_write_json, atomic_write_text
from tokenmix.core.packing import Packing
from tokenmix.models import MixerModel
from tokenmix.models.reads import binding_window, layer_hops, row_layer
from tokenmix.runs.synthetic import (
    WEIGHTS,
    SyntheticRunConfig,
    SyntheticTrainConfig,
    data_hash,
    results_to_csv,
    run_dir,
    save_run_weights,
)
from tokenmix.tasks import IGNORE_INDEX, READ_CLASSES, TaskConfig, TaskData, make_task
from tokenmix.training.optim import build_optimizer
from tokenmix.training.schedule import build_scheduler

# ---------------------------------------------------------------------------------------- training


@lru_cache(maxsize=3)  # train, validation and test split of one (task, seed): presets keep those runs together
def _dataset(task_json: str, num_examples: int, seed: int) -> TaskData:
    args = json.loads(task_json)
    return make_task(args.pop("task"), **args).build(num_examples, seed)


def dataset(task: TaskConfig, num_examples: int, seed: int) -> TaskData:
    """``task.build(num_examples, seed)``, memoised per process (runs of a sweep share their data)."""
    return _dataset(json.dumps(task.to_dict(), sort_keys=True), num_examples, seed)


def answer_logits(
    model: MixerModel, inputs: Tensor, labels: Tensor, mode: str | None = None, pack: int = 1
) -> tuple[Tensor, Tensor]:
    """(logits [M, V] at the M answer positions of the batch, their mask [N, T] bool).

    The head runs on the answer positions only (``MixerModel.features``): the loss and accuracy
    read nothing else, and with a large vocabulary (MQAR's 8192) a full [N, T, V] head would cost
    more than the mixers. The same numbers as slicing the full logits. ``pack`` > 1: the examples
    run ``pack`` to a row, each a document of its own (the same answers, in the same order).
    """
    answered = labels != IGNORE_INDEX
    n, t = inputs.shape
    packing = None
    if pack > 1:
        inputs = inputs.reshape(n // pack, pack * t)
        packing = Packing.from_lengths([[t] * pack] * (n // pack))
    h, _ = model.features(inputs, mode=mode, packing=packing)
    return model.head(h.reshape(n, t, -1)[answered]), answered


@dataclass(frozen=True)
class Scores:
    """Accuracy over the scored answer positions and the mean cross-entropy over every answer
    position (scored or only trained on: the quantity the training loss averages)."""

    acc: float
    loss: float


@torch.no_grad()
def score(
    model: MixerModel,
    data: TaskData,
    batch_size: int = 256,
    mode: str | None = None,
    by_group: dict[str, float] | None = None,
) -> Scores:
    """:class:`Scores` of ``model`` on ``data`` (labels != −100; accuracy within ``score_mask``).

    ``by_group``: filled, for data with answer groups, with each group's accuracy over all of its
    answer positions (scored or only trained on), from the same forward passes.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    correct = total = answers = 0
    loss_sum = 0.0
    k = len(data.group_names) if data.groups is not None else 0
    group_correct, group_total = torch.zeros(k, dtype=torch.long), torch.zeros(k, dtype=torch.long)
    for i in range(0, len(data), batch_size):
        part = data[i : i + batch_size]
        logits, answered = answer_logits(model, part.inputs.to(device), part.labels.to(device), mode)
        answered = answered.cpu()
        target = part.labels[answered]
        wide = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 logits summed in fp32
        loss_sum += float(F.cross_entropy(wide, target.to(device), reduction="sum"))
        answers += int(answered.sum())
        hit = logits.argmax(-1).cpu() == target  # [M], one per answer position
        scored = part.scored[answered]  # scored answers among them
        correct, total = correct + int(hit[scored].sum()), total + int(scored.sum())
        if k:
            g = part.groups[answered]  # grouped positions are answers
            grouped = g >= 0
            g, hit = g[grouped], hit[grouped]
            group_total += torch.bincount(g, minlength=k)
            group_correct += torch.bincount(g[hit], minlength=k)
    model.train(was_training)
    if by_group is not None:
        by_group.update(
            {name: int(c) / int(n) for name, c, n in zip(data.group_names, group_correct, group_total) if n > 0}
        )
    return Scores(correct / max(total, 1), loss_sum / max(answers, 1))


def evaluate(
    model: MixerModel,
    data: TaskData,
    batch_size: int = 256,
    mode: str | None = None,
    by_group: dict[str, float] | None = None,
) -> float:
    """Accuracy over the scored answer positions of ``data`` (:func:`score`'s ``acc``)."""
    return score(model, data, batch_size, mode, by_group).acc


class LearningBudget:
    """When a run stops, by learning rather than by tokens (``SyntheticTrainConfig``'s budget fields).

    A *gain* is a validation accuracy at least ``min_gain`` above the accuracy of the last accuracy
    gain, or (with ``min_loss_gain`` > 0) a validation loss at least ``min_loss_gain`` below the loss of
    the last loss gain (so a slow climb counts once it adds up; the loss is what moves on the plateau
    before a transition). The run stops at ``early_stop_acc``, or once ``patience_steps`` steps have
    passed since the last gain of either kind and at least ``min_steps`` were trained, or at ``steps``.
    ``still_rising``: a run stopped by ``steps`` that the patience rule would have continued (its last
    gain is within the patience window); without a patience rule, a gain of 2 points over the last
    quarter of the curve (``curve_still_rising``).
    """

    def __init__(self, tc: SyntheticTrainConfig) -> None:
        self.tc = tc
        # a curriculum's phases before the task's own data do not count against the run: the patience
        # rule gives it ``patience_steps`` on its own data after them
        self.floor = max(tc.min_steps, tc.curriculum_steps + tc.patience_steps if tc.curriculum_steps else 0)
        self.reference = -1.0  # accuracy of the last accuracy gain
        self.reference_loss = math.inf  # loss of the last loss gain
        self.last_gain_step = 0

    def observe(self, step: int, val_acc: float, val_loss: float = math.inf) -> str | None:
        """Record a validation; the stop reason if the run should stop after it, else None."""
        tc = self.tc
        if val_acc >= self.reference + tc.min_gain and (val_acc > self.reference):
            self.reference, self.last_gain_step = val_acc, step
        if tc.min_loss_gain and val_loss <= self.reference_loss - tc.min_loss_gain:
            self.reference_loss, self.last_gain_step = val_loss, step
        if val_acc >= tc.early_stop_acc:
            return "early_stop_acc"
        if tc.patience_steps and step >= self.floor and step - self.last_gain_step >= tc.patience_steps:
            return "patience"
        return None

    def still_rising(self, stop_reason: str, step: int, curve: Sequence[dict[str, float]]) -> bool:
        if stop_reason != "max_steps":
            return False
        if self.tc.patience_steps:
            return step - self.last_gain_step < self.tc.patience_steps
        return curve_still_rising(curve)


def steps_to_fraction(curve: Sequence[dict[str, float]], final: float, fraction: float) -> int | None:
    """The first curve step whose validation accuracy reaches ``fraction`` × ``final`` (None if final <= 0)."""
    if final <= 0:
        return None
    return next((c["step"] for c in curve if c["val_acc"] >= fraction * final), None)


def train_step(model: MixerModel, opt: torch.optim.Optimizer, x: Tensor, y: Tensor, tc: SyntheticTrainConfig) -> Tensor:
    """One optimiser step on a batch (inputs x, labels y [B, T]): the loss over the answer positions,
    backward, gradient clipping, the update; returns the loss (not yet synchronised)."""
    logits, answered = answer_logits(model, x, y, tc.mode, tc.pack_examples)
    loss = F.cross_entropy(logits, y[answered])  # the mean over answer positions, as ignore_index gives
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if tc.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
    opt.step()
    return loss


#: torch threads of a run by default: the models of synthetic tasks are small, so one thread per
#: process is fastest (a second one waits for work more than it does any) and leaves the other cores
#: to the sweep's other runs; what the CLI's workers use, and a library caller gets the same
RUN_THREADS = 1


def train_one(
    cfg: SyntheticRunConfig,
    on_steps: Callable[[int, bool], None] | None = None,
    device: str = "cpu",
    threads: int | None = RUN_THREADS,
    weights_to: Path | None = None,
) -> dict[str, Any]:
    """Train and evaluate one run on ``device``; returns its result dict (see module docstring).

    ``on_steps(k, credited)`` is called as training advances by k steps (progress); when training
    stops early the remaining budget is reported with ``credited=True``, so the total always
    equals ``train.steps`` and an ETA can tell trained steps from skipped ones. ``threads``: torch's
    intra-op threads during the run (restored after; None: leave torch's setting). ``weights_to``: write
    the checkpoint the test scores (best validation) there as safetensors (``runs.synthetic.WEIGHTS``).
    """
    if threads is None:
        return _train_one(cfg, on_steps, device, weights_to)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train_one(cfg, on_steps, device, weights_to)
    finally:
        torch.set_num_threads(before)


class RowReads:
    """What the run's row layer reads, at each sequence length asked (``models.reads.layer_hops``,
    computed once per length): the one-hop curriculum's instances and the test accuracy split by
    ``READ_CLASSES`` read it."""

    def __init__(self, model: MixerModel, label: str) -> None:
        cfg = model.cfg
        self.layer = row_layer(cfg, label)
        self.mixer = model.blocks[self.layer].mixer
        self.window = binding_window(cfg, cfg.layers[self.layer])
        self._hops: dict[int, Any] = {}

    def hops(self, n: int) -> Any:
        if n not in self._hops:
            self._hops[n] = layer_hops(self.mixer, n)
        return self._hops[n]

    def split(self, model: MixerModel, task: TaskConfig, data: TaskData, mode: str | None) -> dict[str, Any]:
        """Test accuracy and share of the scored answers per read class ({} for tasks without sources)."""
        if not task.has_answer_sources:
            return {}
        classes = task.answer_reads(data, self.hops(data.inputs.shape[1]), self.window)
        if classes is None:
            return {}
        acc: dict[str, float] = {}
        score(
            model, TaskData(data.inputs, data.labels, data.score_mask, classes, READ_CLASSES), mode=mode, by_group=acc
        )
        counts = torch.bincount(classes[classes >= 0], minlength=len(READ_CLASSES))
        total = max(int(counts.sum()), 1)
        return {
            "acc": acc,
            "share": {name: int(c) / total for name, c in zip(READ_CLASSES, counts)},
            "window": self.window,
            "layer": self.layer,
        }


def _test_scores(
    cfg: SyntheticRunConfig, model: MixerModel, reads: RowReads, test_data: TaskData, scored: bool
) -> dict[str, Any]:
    """The kept checkpoint on the test set: accuracy, per answer group, per read class, and at the
    other test lengths (same test seed: extrapolation); zeros and empty splits when not ``scored``."""
    tc = cfg.train
    by_group: dict[str, float] = {}
    test_acc = evaluate(model, test_data, mode=tc.mode, by_group=by_group) if scored else 0.0
    at = {
        str(n): evaluate(model, dataset(cfg.test_task(n), tc.test_examples, tc.test_seed), mode=tc.mode)
        if scored
        else 0.0
        for n in tc.test_lengths
    }
    return {
        "test_acc": test_acc,
        "test_acc_by_group": by_group,  # empty unless the task has answer groups
        "test_acc_at": at,  # {seq_len: test accuracy}, empty unless train.test_lengths is set
        # accuracy and share of the test answers per READ_CLASSES (how the row's layer reads each
        # answer's source), for tasks whose answers have one; {} otherwise
        "test_reads": reads.split(model, cfg.task_config(), test_data, tc.mode) if scored else {},
    }


class _Batches:
    """The training batches step by step: the curriculum's phase at each step, its data (built when
    the phase starts; the run's own split for the task's phases) in an order drawn from the run's
    seed, drawn again when the data changes or runs out. A phase of the task's own data after
    another one keeps the data and its order: a one-phase curriculum of the task is the plain run."""

    def __init__(self, cfg: SyntheticRunConfig, natural: TaskData, reads: RowReads) -> None:
        self.cfg, self.natural, self.reads = cfg, natural, reads
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.phase = cfg.train.phase_at(1)
        self.data = _phase_data(cfg, self.phase, natural, reads)
        self.started = [{"phase": self.phase, "from_step": 1, "data_sha1": data_hash(self.data)}]
        self.order, self.cursor = torch.randperm(len(self.data), generator=self.gen), 0

    def at(self, step: int) -> tuple[Tensor, Tensor]:
        """(inputs, labels) [batch_size, T] of training step ``step`` (1-based, called in order)."""
        tc = self.cfg.train
        if tc.phase_at(step) != self.phase:  # the curriculum moves on: new data (unless the same), a new order
            self.phase = tc.phase_at(step)
            new = _phase_data(self.cfg, self.phase, self.natural, self.reads)
            self.started.append({"phase": self.phase, "from_step": step, "data_sha1": data_hash(new)})
            if new is not self.data:
                self.data, self.order, self.cursor = new, torch.randperm(len(new), generator=self.gen), 0
        if self.cursor + tc.batch_size > len(self.data):
            self.order, self.cursor = torch.randperm(len(self.data), generator=self.gen), 0
        idx = self.order[self.cursor : self.cursor + tc.batch_size]
        self.cursor += tc.batch_size
        return self.data.inputs[idx], self.data.labels[idx]

    def phases(self, last_step: int) -> list[dict[str, Any]]:
        """The phases trained, each with its steps, what it trained on and its data's hash."""
        tc = self.cfg.train
        out = [dict(p) for p in self.started]
        for a, b in zip(out, out[1:] + [{"from_step": last_step + 1}]):
            a["to_step"] = b["from_step"] - 1
            a["what"] = tc.curriculum[a["phase"]].describe() if a["phase"] < len(tc.curriculum) else "the task"
        return out


def _phase_data(cfg: SyntheticRunConfig, phase: int, natural: TaskData, reads: RowReads) -> TaskData:
    """Training data of curriculum phase ``phase`` (``len(curriculum)``: the run's own, after the last)."""
    tc = cfg.train
    if phase == len(tc.curriculum) or tc.curriculum[phase].natural:
        return natural
    spec = tc.curriculum[phase]
    task = cfg.phase_task(spec)
    if spec.data == "one_hop":
        return task.build_one_hop(tc.train_examples, cfg.seed, reads.hops(task.length))
    return dataset(task, tc.train_examples, cfg.seed)


def _train_one(
    cfg: SyntheticRunConfig,
    on_steps: Callable[[int, bool], None] | None,
    device: str,
    weights_to: Path | None = None,
) -> dict[str, Any]:
    cfg.validate()
    tc = cfg.train
    task = cfg.task_config()
    mcfg = cfg.model_config()
    train_data = dataset(task, tc.train_examples, cfg.seed)
    val_data = dataset(task, tc.val_examples, tc.val_seed)
    test_data = dataset(task, tc.test_examples, tc.test_seed)

    torch.manual_seed(cfg.seed)
    model = MixerModel(mcfg).to(device)
    reads = RowReads(model, cfg.label)
    opt = build_optimizer(model, tc.lr, tc.weight_decay)
    sched = build_scheduler(opt, tc.steps, tc.warmup_steps, tc.min_lr_ratio)
    batches = _Batches(cfg, train_data, reads)
    losses: list[float] = []
    curve: list[dict[str, float]] = []  # the learning curve: one point per validation
    budget = LearningBudget(tc)
    best_val, best_state = -1.0, None
    stop_reason = "max_steps"
    train_seconds = cpu_seconds = 0.0
    tokens = 0
    reported = 0
    wall0 = time.perf_counter()
    step = 0
    model.train()
    for step in range(1, tc.steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        x, y = batches.at(step)
        x, y = x.to(device), y.to(device)
        loss = train_step(model, opt, x, y, tc)
        sched.step()
        losses.append(loss.item())  # synchronises on an accelerator, so the timing below is real
        train_seconds += time.perf_counter() - t0
        cpu_seconds += time.process_time() - c0
        tokens += x.numel()
        if not math.isfinite(losses[-1]):
            stop_reason = "diverged"
            break
        if step % tc.eval_every == 0 or step == tc.steps:
            val = score(model, val_data, mode=tc.mode)
            window = losses[-tc.eval_every :]
            curve.append({"step": step, "loss": sum(window) / len(window), "val_acc": val.acc, "val_loss": val.loss})
            if val.acc > best_val:
                best_val = val.acc
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            if on_steps is not None:
                on_steps(step - reported, False)
                reported = step
            reason = budget.observe(step, val.acc, val.loss)
            if reason is not None:
                stop_reason = reason
                break
    phases = batches.phases(step)
    if on_steps is not None and tc.steps > reported:
        on_steps(tc.steps - reported, reported == step)  # the steps after the last validation were trained
    if best_state is not None:
        model.load_state_dict(best_state)
        if weights_to is not None:
            save_run_weights(weights_to, best_state)
    head = losses[: min(10, len(losses))]
    tail = losses[-min(10, len(losses)) :]
    return {
        "run_id": cfg.run_id,
        "label": cfg.label,
        "task": cfg.task,
        "column": cfg.column_name,
        "layers": list(mcfg.layers),
        "d_model": mcfg.d_model,
        "lr": tc.lr,
        "seed": cfg.seed,
        # a run that diverged before its first validation has no checkpoint worth scoring
        **_test_scores(cfg, model, reads, test_data, scored=best_state is not None),
        "phases": phases,  # the training distributions step by step (one entry without a curriculum)
        "data_sha1": {"val": data_hash(val_data), "test": data_hash(test_data)},
        "best_val_acc": best_val,
        "steps_done": step,
        "stop_reason": stop_reason,
        "still_rising": budget.still_rising(stop_reason, step, curve),  # stopped by the budget, still learning
        "steps_to_half": steps_to_fraction(curve, best_val, 0.5),  # of the best validation accuracy
        "steps_to_90": steps_to_fraction(curve, best_val, 0.9),
        "train_loss_first": sum(head) / len(head),
        "train_loss_last": sum(tail) / len(tail),
        "curve": curve,
        "tokens_per_s": tokens / train_seconds if train_seconds > 0 else 0.0,
        # per second of this process's CPU time: what one free core would give (load-independent)
        "tokens_per_cpu_s": tokens / cpu_seconds if cpu_seconds > 0 else 0.0,
        "train_seconds": train_seconds,
        "train_cpu_seconds": cpu_seconds,
        "wall_seconds": time.perf_counter() - wall0,
        "num_params": model.num_params(),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "config": cfg.to_dict(),
    }


# ------------------------------------------------------------------------------------- one run's files


def execute_run(
    cfg_dict: dict[str, Any], out: str, threads: int | None, progress_queue: Any = None, device: str = "cpu"
) -> dict[str, Any]:
    """Train one run and write its files (``run_dir``: config first, result last): what a sweep's
    worker does for each of its runs (``training/sweep.py``)."""
    cfg = SyntheticRunConfig.from_dict(cfg_dict)
    rdir = run_dir(Path(out), cfg)
    rdir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(rdir / "config.json", cfg.to_dict())
    on_steps = (lambda k, credited: progress_queue.put((k, credited))) if progress_queue is not None else None
    result = train_one(cfg, on_steps, device, threads=threads, weights_to=rdir / WEIGHTS)
    atomic_write_text(rdir / "result.csv", results_to_csv([result]))
    atomic_write_json(rdir / "result.json", result)  # last: its presence marks the run finished
    return result


# --------------------------------------------------------------------------------------- summaries


def summarize(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (label, column, d_model): the learning rate with the highest mean *validation* accuracy over
    seeds (zoology's max over learning rates), and the mean ± std over seeds of the *test* accuracy at
    that learning rate. The test set never chooses anything: selecting on the numbers one reports
    would bias them upwards.

    Row order follows the first appearance of each (label, column, d_model) in ``results``; the column
    is the task name unless the run config names another (e.g. one task at several sizes).
    """
    groups: dict[tuple[str, str, int], dict[float, list[dict[str, Any]]]] = {}
    for r in results:
        groups.setdefault((r["label"], r.get("column", r["task"]), r["d_model"]), {}).setdefault(r["lr"], []).append(r)
    rows = []
    for (label, task, d_model), by_lr in groups.items():
        per_lr = {}
        for lr, rs in by_lr.items():
            accs = [r["test_acc"] for r in rs]
            vals = [r["best_val_acc"] for r in rs]
            per_lr[lr] = (
                statistics.fmean(accs),
                statistics.stdev(accs) if len(accs) > 1 else 0.0,
                len(accs),
                statistics.fmean(vals),
            )
        best_lr = max(per_lr, key=lambda lr: (per_lr[lr][3], -lr))  # ties: the smaller learning rate
        mean, std, n, val = per_lr[best_lr]
        best_runs = by_lr[best_lr]
        rows.append(
            {
                "label": label,
                "column": task,
                "task": by_lr[next(iter(by_lr))][0]["task"],
                "d_model": d_model,
                "best_lr": best_lr,
                "acc_mean": mean,
                "acc_std": std,
                "n_seeds": n,
                "val_mean": val,
                "acc_by_lr": {f"{lr:g}": per_lr[lr][0] for lr in sorted(per_lr)},
                "acc_by_group": _mean_by_group(best_runs),
                "acc_at": _mean_at_lengths(best_runs),
                "val_by_lr": {f"{lr:g}": per_lr[lr][3] for lr in sorted(per_lr)},
                "tokens_per_s": statistics.fmean(r["tokens_per_s"] for rs in by_lr.values() for r in rs),
                "tokens_per_cpu_s": statistics.fmean(
                    r.get("tokens_per_cpu_s", 0.0) for rs in by_lr.values() for r in rs
                ),
                "train_seconds": sum(r["train_seconds"] for rs in by_lr.values() for r in rs),
                "train_cpu_seconds": sum(r.get("train_cpu_seconds", 0.0) for rs in by_lr.values() for r in rs),
                "steps_mean": statistics.fmean(r["steps_done"] for r in best_runs),
                "max_steps": max(
                    r["config"]["train"]["steps"] if "config" in r else r["steps_done"] for r in best_runs
                ),
                "stopped_early": sum(r.get("stop_reason") == "early_stop_acc" for r in best_runs),
                "still_rising": sum(run_still_rising(r) for r in best_runs),
            }
        )
    return rows


def _mean_at_lengths(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean over runs of the test accuracy at each extra test length (``train.test_lengths``)."""
    per_run = [r.get("test_acc_at") or {} for r in runs]
    lengths = [n for n in per_run[0] if all(n in p for p in per_run)] if per_run else []
    return {n: statistics.fmean(p[n] for p in per_run) for n in lengths}


def _mean_by_group(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean over runs of each answer group's test accuracy (groups every run reports; results
    written before groups existed have none)."""
    per_run = [r.get("test_acc_by_group") or {} for r in runs]
    names = [g for g in per_run[0] if all(g in p for p in per_run)] if per_run else []
    return {g: statistics.fmean(p[g] for p in per_run) for g in names}


def run_still_rising(result: dict[str, Any]) -> bool:
    """The run's own flag (``LearningBudget.still_rising``); results written before it existed: the
    curve's tail (``curve_still_rising``) of a run stopped by its step budget."""
    if "still_rising" in result:
        return bool(result["still_rising"])
    return result.get("stop_reason") == "max_steps" and curve_still_rising(result.get("curve", []))


def curve_still_rising(curve: Sequence[dict[str, float]], tail: float = 0.25, min_gain: float = 0.02) -> bool:
    """True if the validation accuracy gained at least ``min_gain`` over the last ``tail`` fraction
    of the validations of a run: the run was stopped by its step budget while still learning."""
    if len(curve) < 4:
        return False
    k = max(1, round(len(curve) * tail))
    return max(c["val_acc"] for c in curve[-k:]) - max(c["val_acc"] for c in curve[:-k]) >= min_gain
