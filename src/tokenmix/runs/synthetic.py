"""The record of a synthetic-task run: its config, its result row, and where both live on disk.

A run is a ``SyntheticRunConfig``: which task (and its sizes), which model (``ModelConfig`` fields:
layers of registered mixers, width, heads, MLP), how to train (``SyntheticTrainConfig``) and the
seed. A sweep is a list of runs (the compare presets in ``study/presets`` build them with
comprehensions); ``training/synthetic.py`` trains them and writes these files, ``study`` reads them.

Run directory layout::

    <out>/sweep.json                   every resolved run config of the sweep
    <out>/runs/<run_id>/config.json    resolved config of one run (written when it starts)
    <out>/runs/<run_id>/result.json    its result (written atomically when it finishes)
    <out>/runs/<run_id>/result.csv     the same as one CSV row
    <out>/runs/<run_id>/model.safetensors  the checkpoint its test scored (best validation accuracy)
    <out>/results.json, results.csv    all finished runs

The run id ends with a hash of the resolved config, so changing anything about a run gives it a new
id, and a run whose ``result.json`` exists is finished.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.core.files import atomic_write_bytes, read_json, read_regular_bytes
from tokenmix.mixers.registry import get_mixer_spec
from tokenmix.models import ModelConfig
from tokenmix.tasks import TaskConfig, make_task

WEIGHTS = "model.safetensors"  # a run's scored checkpoint, in its run folder
LEARNING_BUDGET_FIELDS = ("patience_steps", "min_gain", "min_loss_gain", "min_steps")
PHASE_DATA = ("natural", "one_hop")  # a curriculum phase's training distribution (``CurriculumPhase.data``)


@dataclass(frozen=True)
class CurriculumPhase:
    """One phase of a run's training curriculum: ``steps`` optimiser steps on one distribution.

    ``data``: "natural", the run's task (with ``task_args`` changed, e.g. a shorter ``seq_len`` or fewer
    ``num_kv_pairs``); "one_hop", only instances whose every answer the row's own layer reads at its
    source in one hop (``TaskConfig.build_one_hop``: for attention and the linear recurrences the
    natural distribution, for a first-order row the value right before the query, for a lattice its
    lattice points). The validation and test splits never change: they are the run's task."""

    steps: int
    data: str = "natural"
    task_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps <= 0:
            raise InputError(f"curriculum phase: steps must be a positive integer, got {self.steps!r}")
        if self.data not in PHASE_DATA:
            raise InputError(f"curriculum phase: data must be one of {PHASE_DATA}, got {self.data!r}")
        if not isinstance(self.task_args, dict):
            raise InputError(f"curriculum phase: task_args must be a mapping, got {self.task_args!r}")

    @property
    def natural(self) -> bool:
        """Whether the phase trains on the run's own training data."""
        return self.data == "natural" and not self.task_args

    def describe(self) -> str:
        what = "one-hop instances" if self.data == "one_hop" else "the task"
        changed = ", ".join(f"{k}={v}" for k, v in sorted(self.task_args.items()))
        return f"{self.steps} steps on {what}" + (f" ({changed})" if changed else "")


@dataclass(frozen=True)
class SyntheticTrainConfig:
    """Optimisation and evaluation of one run."""

    lr: float = 1e-3  # peak learning rate
    steps: int = 1000  # maximum optimiser steps
    batch_size: int = 64
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1  # cosine decays to this fraction of the peak
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # max global gradient norm (0 = off)
    train_examples: int = 10_000  # size of the training set (generated from the run's seed)
    val_examples: int = 256
    test_examples: int = 1_000
    eval_every: int = 50  # steps between validation passes (one point of the learning curve each)
    early_stop_acc: float = 0.99  # stop once validation accuracy reaches this (> 1 = never)
    # budget by learning: stop once validation has not gained for ``patience_steps`` steps (0 = off):
    # neither accuracy by ``min_gain`` nor loss by ``min_loss_gain`` over their last counted gains
    # (on the plateau MQAR-like tasks sit on before they bind keys the loss still falls while the
    # accuracy does not), never before ``min_steps``; ``steps`` is the hard maximum
    patience_steps: int = 0
    min_gain: float = 0.0  # accuracy points (as a fraction) that count as a gain
    min_loss_gain: float = 0.0  # validation loss (nats per answer) that counts as a gain (0 = loss not read)
    min_steps: int = 0
    val_seed: int = 1_000_003
    test_seed: int = 2_000_003
    mode: str | None = None  # mixer mode used for training and evaluation (None = fast default)
    # training rows of this many examples back to back, each a document of its own (core/packing.py):
    # the same loss as one example per row, computed in fewer, longer rows (evaluation stays unpacked)
    pack_examples: int = 1
    test_lengths: tuple[int, ...] = ()  # also test at these sequence lengths (the task's seq_len), e.g. 4x
    # the training length: extrapolation of models without a position code
    # the training distribution phase by phase from step 1 (``CurriculumPhase``); after the last phase
    # the run's task until ``steps``. Empty: the run's task throughout
    curriculum: tuple[CurriculumPhase, ...] = ()

    def __post_init__(self) -> None:
        for name in ("lr", "min_lr_ratio", "weight_decay", "grad_clip", "min_gain", "min_loss_gain"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise InputError(f"train config: {name} must be a finite number, got {v!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise InputError(f"train config: min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        for name in (
            "steps",
            "batch_size",
            "train_examples",
            "val_examples",
            "test_examples",
            "eval_every",
            "pack_examples",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise InputError(f"train config: {name} must be a positive integer, got {v!r}")
        if not self.lr > 0:
            raise InputError(f"train config: lr must be > 0, got {self.lr}")
        for name in ("warmup_steps", "patience_steps", "min_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InputError(f"train config: {name} must be an integer >= 0, got {v!r}")
        if not 0.0 <= self.min_gain < 1.0:
            raise InputError(f"train config: min_gain must be in [0, 1), got {self.min_gain}")
        if self.min_loss_gain < 0:
            raise InputError(f"train config: min_loss_gain must be >= 0, got {self.min_loss_gain}")
        if self.grad_clip < 0 or self.weight_decay < 0:
            raise InputError("train config: grad_clip and weight_decay must be >= 0")
        if not isinstance(self.test_lengths, tuple) or any(
            isinstance(n, bool) or not isinstance(n, int) or n <= 0 for n in self.test_lengths
        ):
            raise InputError(f"train config: test_lengths must be positive integers, got {self.test_lengths!r}")
        if self.val_seed == self.test_seed:
            raise InputError("train config: val_seed and test_seed must differ (held-out test set)")
        if not isinstance(self.curriculum, tuple) or not all(isinstance(c, CurriculumPhase) for c in self.curriculum):
            raise InputError(f"train config: curriculum must be a tuple of CurriculumPhase, got {self.curriculum!r}")
        if self.curriculum_steps > self.steps:
            raise InputError(
                f"train config: the curriculum's phases before the task's own data take {self.curriculum_steps} "
                f"steps, more than the run's {self.steps}"
            )
        if self.batch_size % self.pack_examples:
            raise InputError(
                f"train config: batch_size {self.batch_size} is not a multiple of pack_examples {self.pack_examples}"
            )

    @property
    def curriculum_steps(self) -> int:
        """Steps before the run trains on its own data for good: the phases up to the last one that
        is not the natural distribution (0 without such a phase)."""
        end = total = 0
        for phase in self.curriculum:
            total += phase.steps
            if not phase.natural:
                end = total
        return end

    def phase_at(self, step: int) -> int:
        """Index of the curriculum phase that trains step ``step`` (1-based); len(curriculum) after the last."""
        total = 0
        for i, phase in enumerate(self.curriculum):
            total += phase.steps
            if step <= total:
                return i
        return len(self.curriculum)


@dataclass(frozen=True)
class SyntheticRunConfig:
    """One training run: a row label, a task, a model and its training."""

    label: str  # row name in tables, e.g. "pow2" or "attention x3"
    task: str  # registered task name
    task_args: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields (vocab_size comes from the task)
    train: SyntheticTrainConfig = field(default_factory=SyntheticTrainConfig)
    seed: int = 0
    column: str | None = None  # table column; None = the task name

    @property
    def column_name(self) -> str:
        return self.column or self.task

    def task_config(self) -> TaskConfig:
        return make_task(self.task, **self.task_args)

    def model_config(self) -> ModelConfig:
        """The run's resolved ``ModelConfig`` (vocabulary from the task), derived once per run config:
        the harness, the table's structure columns, the theory and the frontier all read this one."""
        cached = self.__dict__.get("_model_config")
        if cached is None:
            cached = self._derive_model_config()
            object.__setattr__(self, "_model_config", cached)  # frozen fields untouched: a cache only
        return cached

    def _derive_model_config(self) -> ModelConfig:
        if "vocab_size" in self.model:
            raise InputError(f"run '{self.label}': vocab_size is set by the task, not the model config")
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        unknown = sorted(set(self.model) - known)
        if unknown:
            raise InputError(f"run '{self.label}': model config has no field(s) {unknown}; known: {sorted(known)}")
        kw = dict(self.model)
        if "layers" in kw and isinstance(kw["layers"], list):
            kw["layers"] = tuple(kw["layers"])
        return ModelConfig(vocab_size=self.task_config().model_vocab_size, **kw)

    def validate(self) -> None:
        """Build the task and model configs (raises ValueError on unknown names or impossible sizes)."""
        task = self.task_config()
        self.model_config()
        if self.seed in (self.train.val_seed, self.train.test_seed):
            raise InputError(f"run '{self.label}': seed {self.seed} collides with the validation/test seeds")
        if self.train.mode is not None:
            for name in self.model_config().layers:
                if self.train.mode not in get_mixer_spec(name).cls.modes:
                    raise InputError(f"run '{self.label}': mixer '{name}' has no mode '{self.train.mode}'")
        for phase in self.train.curriculum:
            self.phase_task(phase)
        if self.train.test_lengths:
            if "seq_len" not in task.to_dict():
                raise InputError(f"run '{self.label}': task '{self.task}' has no seq_len to test other lengths at")
            model = self.model_config()
            longest = max(self.train.test_lengths)
            if model.positions == "learned" and longest > model.max_seq_len:
                raise InputError(
                    f"run '{self.label}': test length {longest} > max_seq_len {model.max_seq_len} of "
                    "learned positions (test other lengths with positions='none')"
                )
            for n in self.train.test_lengths:
                self.test_task(n)
        del task

    def phase_task(self, phase: CurriculumPhase) -> TaskConfig:
        """The task a curriculum phase trains on: the run's with the phase's ``task_args``."""
        return make_task(self.task, **{**self.task_args, **phase.task_args})

    def test_task(self, seq_len: int) -> TaskConfig:
        """The run's task at another sequence length (``train.test_lengths``)."""
        return make_task(self.task, **{**self.task_args, "seq_len": seq_len})

    def to_dict(self) -> dict[str, Any]:
        """Resolved config: task and model with every default filled in (what run dirs store)."""
        task = self.task_config().to_dict()
        task.pop("task")
        model = dataclasses.asdict(self.model_config())
        model["layers"] = list(model["layers"])
        train = dataclasses.asdict(self.train)
        if not train["test_lengths"]:
            del train["test_lengths"]  # configs without extra lengths keep the run ids they had before the field
        else:
            train["test_lengths"] = list(train["test_lengths"])
        for name in LEARNING_BUDGET_FIELDS:  # likewise for runs without a budget by learning
            if train[name] == 0:
                del train[name]
        if train["pack_examples"] == 1:
            del train["pack_examples"]  # and for unpacked runs
        if not train["curriculum"]:
            del train["curriculum"]  # and for runs without a curriculum (phases keep the task fields they change)
        return {
            "label": self.label,
            "task": self.task,
            "column": self.column_name,
            "task_args": task,
            "model": model,
            "train": train,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SyntheticRunConfig":
        model = {k: v for k, v in d["model"].items() if k != "vocab_size"}
        train = {
            **d["train"],
            "test_lengths": tuple(d["train"].get("test_lengths", ())),
            "curriculum": tuple(CurriculumPhase(**phase) for phase in d["train"].get("curriculum", ())),
        }
        legacy = train.pop("patience", 0)  # written before budgets by learning: validations, not steps
        if legacy and "patience_steps" not in train:
            train["patience_steps"] = legacy * train.get("eval_every", SyntheticTrainConfig.eval_every)
        return cls(
            label=d["label"],
            task=d["task"],
            task_args=dict(d["task_args"]),
            model=model,
            train=SyntheticTrainConfig(**train),
            seed=int(d["seed"]),
            column=None if d.get("column", d["task"]) == d["task"] else d["column"],
        )

    @property
    def run_id(self) -> str:
        resolved = self.to_dict()
        digest = hashlib.sha1(json.dumps(resolved, sort_keys=True).encode()).hexdigest()[:10]
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", self.label).strip("-") or "run"
        col = "" if self.column_name == self.task else "-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", self.column_name)
        return f"{self.task}{col}__{slug}__d{resolved['model']['d_model']}__lr{self.train.lr:g}__s{self.seed}__{digest}"


# ------------------------------------------------------------------------------------ results


def result_csv_row(result: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "run_id",
        "label",
        "task",
        "column",
        "layers",
        "d_model",
        "lr",
        "seed",
        "test_acc",
        "best_val_acc",
        "steps_done",
        "stop_reason",
        "still_rising",
        "steps_to_half",
        "steps_to_90",
        "train_loss_first",
        "train_loss_last",
        "tokens_per_s",
        "tokens_per_cpu_s",
        "train_seconds",
        "train_cpu_seconds",
        "num_params",
    )
    row = {k: result.get(k) for k in keys}
    row["layers"] = "+".join(result.get("layers", []))
    return row


def results_to_csv(results: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    rows = [result_csv_row(r) for r in results]
    fieldnames = list(result_csv_row({}).keys())
    writer = csv.DictWriter(buf, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def run_dir(out: Path, cfg: SyntheticRunConfig) -> Path:
    return out / "runs" / cfg.run_id


def load_result(out: Path, cfg: SyntheticRunConfig) -> dict[str, Any] | None:
    """The finished result of ``cfg`` under ``out``, or None if it has not finished."""
    path = run_dir(out, cfg) / "result.json"
    if not path.is_file():
        return None
    try:
        res = read_json(path, "run result", within=out)
    except InputError:  # a result cut mid-write or damaged: the run is not finished, train it again
        return None
    return res if isinstance(res, dict) and res.get("run_id") == cfg.run_id else None


def data_hash(data: Any) -> str:
    """SHA-1 of a split's inputs and labels (``TaskData``): a run records its splits' hashes, so two
    runs can be shown to have been validated and tested on the same examples."""
    h = hashlib.sha1()
    for t in (data.inputs, data.labels):
        h.update(str(tuple(t.shape)).encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def save_run_weights(path: Path, state: dict[str, Tensor]) -> None:
    """Write a run's checkpoint (parameters and buffers by name) as safetensors, atomically."""
    atomic_write_bytes(path, save_safetensors({k: v.detach().cpu().contiguous() for k, v in state.items()}))


def load_run_weights(rdir: Path) -> dict[str, Tensor]:
    """The checkpoint a run's test scored (``WEIGHTS`` in its folder); one line for a missing or
    damaged file (nothing is unpickled: safetensors only)."""
    path = rdir / WEIGHTS
    if not path.is_file():
        raise InputError(f"{rdir}: no {WEIGHTS} (runs trained before checkpoints were kept have none: train it again)")
    try:
        return load_safetensors(read_regular_bytes(path, "run checkpoint", within=rdir, max_bytes=1 << 32))
    except SafetensorError as e:
        raise InputError(f"{path}: not a readable safetensors checkpoint ({str(e).splitlines()[0]})") from None
