"""``tokenmix design --train TASK --top K``: does the front learn? Train its best candidates on a
synthetic task with the harness of ``tokenmix compare`` and add their accuracy to the design table.

The front itself is ``analysis/design.py`` (no training there: analysis may not import training).
What this adds, and why it is built this way:

* Which candidates: the front members ranked by max path, then cost (then cache, then name); when K
  exceeds the front, the next in-budget candidates in the same order. Dominated candidates are only
  trained when the front is too small, since the question is whether the *front* learns. On MQAR
  (``assoc_recall``, alias ``mqar``) the structure says more than the path: each candidate's ceiling
  (the share of the task's validation queries whose layer reads the position holding key and value
  in one hop, then within two, behind quick's token shift: ``study.theory.RecallReads``, the column
  the frontier reports) ranks the candidates first, before anything is trained.
* The model is the ``quick`` compare preset's row recipe (``study/presets/quick.py``: a window-2
  local-attention token shift, then the row mixer, width 32, one head, learned positions, no MLP)
  and its task sizes (copy / assoc_recall / multi_hop at length 32; another registered task runs at
  its defaults), so an accuracy here reads like a ``tokenmix compare`` cell. The row mixer is the
  registered structured mixer ``CARRIER`` with the candidate's pattern as a config override
  (``mixer_overrides``: ``pattern`` = the spec, ``cache_efficient``), in the dense mode quick uses
  for structured rows. The candidate is trained at the task's length, not at the design's n: a
  pattern is the same rule at every length, and the metrics at n say how it scales.
* Budget: one learning rate (3e-3, quick's rate for every task), one seed and quick's step
  budget for the task (copy 100, multi_hop 250, assoc_recall 800 steps; 200 otherwise), so the
  default K = 2 takes about a minute on two cores; ``steps`` / ``seeds`` raise it.
* Resumable and with progress: the runs go through ``training.synthetic.run_sweep`` into
  ``<out>/train``; a rerun skips finished runs (the run id hashes the resolved config, pattern
  included), and the bar shows the steps of the runs left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from tokenmix.analysis.design import DesignRequest, DesignResult, DesignRow, explore, write_outputs
from tokenmix.analysis.outputs import FIGURE_FORMATS, prepare_out_dir
from tokenmix.core.errors import InputError
from tokenmix.models.reads import binding_window
from tokenmix.runs.synthetic import SyntheticRunConfig
from tokenmix.study.presets import quick
from tokenmix.study.theory import pattern_recall_reads
from tokenmix.tasks import make_task, task_names
from tokenmix.training.sweep import check_device, run_sweep, validate_sweep
from tokenmix.training.synthetic import dataset, summarize

CARRIER = "pow2"  # a registered structured-recurrence mixer; its pattern is overridden per candidate
DEFAULT_LR = 3e-3  # quick's rate on every task (its only one on assoc_recall)
MAX_TOP = 32
TASK_ALIASES = {"mqar": "assoc_recall"}  # the name the anchors use


@dataclass(frozen=True)
class DesignTraining:
    """What ``--train`` runs: ``top`` candidates on ``task``, each for ``steps`` (None: quick's budget for
    the task) at learning rate ``lr`` over ``seeds``; the sweep's workers / threads / device."""

    task: str
    top: int = 2
    steps: int | None = None
    lr: float = DEFAULT_LR
    seeds: tuple[int, ...] = (0,)
    workers: int | None = None
    threads: int = 1
    device: str = "cpu"
    progress: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "task", TASK_ALIASES.get(self.task, self.task))
        if self.task not in task_names():
            raise InputError(f"unknown task '{self.task}'; known: {', '.join(task_names())}")
        if not 1 <= self.top <= MAX_TOP:
            raise InputError(f"--top must be in [1, {MAX_TOP}], got {self.top}")
        if self.steps is not None and self.steps < 1:
            raise InputError(f"--steps must be >= 1, got {self.steps}")
        if not self.seeds or any(s < 0 for s in self.seeds):
            raise InputError(f"--seeds must be non-negative integers, got {list(self.seeds)}")
        if self.workers is not None and self.workers < 1:
            raise InputError(f"--workers must be >= 1, got {self.workers}")
        if self.threads < 1:
            raise InputError(f"--threads must be >= 1, got {self.threads}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise InputError(f"--lr must be a positive finite number, got {self.lr}")
        check_device(self.device)

    @property
    def step_budget(self) -> int:
        return self.steps if self.steps is not None else quick.recipe_of(self.task).steps


def attach_recall_ceilings(result: DesignResult, training: DesignTraining) -> None:
    """Each in-budget candidate's MQAR ceiling (reads in one hop / within two) on the validation
    set of the run it would train, behind that run's token shift (``run_config``)."""
    rows = [r for r in result.rows if r.in_budget and r.path_max is not None]
    if not rows:
        return
    cfg = run_config(rows[0], training, 0)
    task = cfg.task_config()
    data = dataset(task, cfg.train.val_examples, cfg.train.val_seed)
    window = binding_window(cfg.model_config(), CARRIER)
    for r in rows:
        reads = pattern_recall_reads(r.name, r.candidate.pattern(), data, task.num_kv_pairs, window)
        r.reads_one_hop, r.reads_two_hops = reads.fraction, reads.two_hop_fraction


def pick_top(result: DesignResult, k: int) -> list[DesignRow]:
    """The k candidates to train: front members by (max path, cost, cache, name), then the other
    in-budget candidates in the same order; candidates with an MQAR ceiling (``attach_recall_ceilings``)
    by that ceiling first (one hop, then two, highest first)."""

    def rank(r: DesignRow):
        ceiling = (-(r.reads_one_hop or 0.0), -(r.reads_two_hops or 0.0))
        return (*ceiling, r.point()[2], r.cost, r.cache, r.name)

    measured = [r for r in result.rows if r.in_budget and r.path_max is not None]
    front = sorted((r for r in measured if r.on_front), key=rank)
    rest = sorted((r for r in measured if not r.on_front), key=rank)
    return (front + rest)[:k]


def run_config(row: DesignRow, training: DesignTraining, seed: int) -> SyntheticRunConfig:
    """The quick preset's row recipe with the candidate's pattern in the carrier mixer."""
    task = training.task
    recipe = quick.recipe_of(task)
    task_args = dict(recipe.args)
    length = make_task(task, **task_args).length
    model = quick.model_for(CARRIER, task)
    overrides = dict(model["mixer_overrides"])
    overrides[CARRIER] = {"pattern": row.candidate.spec, "cache_efficient": row.candidate.cache_efficient}
    model = {**model, "mixer_overrides": overrides, "max_seq_len": max(model["max_seq_len"], length)}
    train = replace(
        quick.TRAIN,
        lr=training.lr,
        steps=training.step_budget,
        mode="dense",
        warmup_steps=min(quick.TRAIN.warmup_steps, max(training.step_budget // 4, 1)),
        eval_every=min(quick.TRAIN.eval_every, training.step_budget),
        min_lr_ratio=quick.TRAIN.min_lr_ratio if recipe.min_lr_ratio is None else recipe.min_lr_ratio,
    )
    return SyntheticRunConfig(label=row.name, task=task, task_args=task_args, model=model, train=train, seed=seed)


def plan_training(result: DesignResult, training: DesignTraining) -> tuple[list[DesignRow], list[SyntheticRunConfig]]:
    """The candidates ``train_top`` trains and their run configs, every one validated: what is
    refused is refused before anything is written (the device was checked with ``training``)."""
    if training.task == "assoc_recall":
        attach_recall_ceilings(result, training)
    rows = pick_top(result, training.top)
    configs = validate_sweep([run_config(r, training, s) for s in training.seeds for r in rows])
    return rows, configs


def train_top(
    result: DesignResult,
    training: DesignTraining,
    out: Path,
    plan: tuple[list[DesignRow], list[SyntheticRunConfig]],
    console: Any = None,
) -> None:
    """Train the top candidates under ``out/train`` (finished runs are skipped) and write their mean test
    accuracy over seeds into the rows (``accuracy``, ``accuracy_std``, ``task``); ``plan``: what
    ``plan_training`` returned."""
    rows, configs = plan
    outcome = run_sweep(
        configs,
        Path(out) / "train",
        workers=training.workers or 1,
        threads=training.threads,
        progress=training.progress,
        console=console,
        device=training.device,
    )
    by_label = {s["label"]: s for s in summarize(outcome.results)}
    for r in rows:
        s = by_label[r.name]
        r.accuracy, r.accuracy_std, r.task = s["acc_mean"], s["acc_std"], training.task
    result.training = {
        "task": training.task,
        "top": training.top,
        "steps": training.step_budget,
        "lr": training.lr,
        "seeds": list(training.seeds),
        "trained": outcome.trained,
        "skipped": outcome.skipped,
        "runs": str(Path(out) / "train"),
        "candidates": [r.name for r in rows],
        "carrier": CARRIER,
        "recipe": "study/presets/quick.py",
    }


def run_design(
    req: DesignRequest,
    out: Path,
    *,
    training: DesignTraining | None = None,
    formats: tuple[str, ...] = FIGURE_FORMATS,
    plots: bool = True,
    progress: Callable[[str], None] | None = None,
    console: Any = None,
) -> tuple[DesignResult, list[Path]]:
    """Explore, write the outputs, and with ``training`` train the top candidates and write them again
    with the accuracy column (so a stopped training still leaves the front on disk). ``out`` is made
    only once the front is derived and the training planned and validated: bad input leaves nothing."""
    result = explore(req, progress)
    plan = plan_training(result, training) if training is not None else None
    out = prepare_out_dir(out, "design")
    files = write_outputs(result, out, formats, plots)
    if training is not None:
        train_top(result, training, out, plan, console)
        files = write_outputs(result, out, formats, plots)
    return result, files
