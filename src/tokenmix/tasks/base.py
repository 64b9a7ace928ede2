"""What every synthetic task shares: a frozen config that validates its sizes, a deterministic
generator ``build(num_examples, seed) -> TaskData``, and answer-only accuracy.

Convention (zoology's): ``inputs`` and ``labels`` are both [N, T] long; ``labels[n, t]`` is what the
model must output at position t after reading ``inputs[n, : t + 1]``, and is ``IGNORE_INDEX`` (−100)
wherever the task asks nothing. Loss and accuracy count only the answer positions. A task may also
ask easier questions that are trained on but not scored (a curriculum inside each example, e.g. the
shallower lookups of a chain): ``score_mask`` then marks the answer positions accuracy counts.

A task config is built from its registered name: ``make_task("assoc_recall", seq_len=64, ...)``.
Unknown task names and unknown or impossible fields raise ``ValueError`` naming what is wrong.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from tokenmix.core.errors import InputError

IGNORE_INDEX = -100
# How a row's layer reads the source of an answer (``TaskConfig.answer_reads``), in this order:
# the source position itself in one hop; only a position of the binding window behind it (a short
# convolution in front of the layer: the positions that hold key and value together) in one hop;
# within two hops (what the second layer of a stack can add); not within two.
READ_CLASSES = ("source in one hop", "window in one hop", "within two hops", "not read")

_TASKS: dict[str, type["TaskConfig"]] = {}


@dataclass(frozen=True)
class TaskData:
    """A generated split.

    Attributes:
        inputs: [N, T] long token ids in [0, vocab_size).
        labels: [N, T] long; target ids at answer positions (trained on), ``IGNORE_INDEX`` elsewhere.
        score_mask: [N, T] bool, the answer positions that accuracy counts; None = every answer position.
        groups: [N, T] long or None: for a task whose questions differ in kind (e.g. how many lookups
            they compose), the index into ``group_names`` of every answer position, scored or only
            trained on, and -1 elsewhere. Reports give accuracy per group beside the scored accuracy.
        group_names: the groups' names, e.g. ("depth 0", "depth 1", ...).
    """

    inputs: Tensor
    labels: Tensor
    score_mask: Tensor | None = None
    groups: Tensor | None = None
    group_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.inputs.shape != self.labels.shape or self.inputs.dim() != 2:
            raise InputError(
                f"inputs {tuple(self.inputs.shape)} and labels {tuple(self.labels.shape)} must both be [N, T]"
            )
        if self.score_mask is not None:
            if self.score_mask.shape != self.labels.shape or self.score_mask.dtype != torch.bool:
                raise InputError(f"score_mask must be a bool tensor shaped like labels {tuple(self.labels.shape)}")
            if bool((self.score_mask & (self.labels == IGNORE_INDEX)).any()):
                raise InputError("score_mask marks positions without an answer")
        if self.groups is not None:
            if self.groups.shape != self.labels.shape or self.groups.dtype != torch.long:
                raise InputError(f"groups must be a long tensor shaped like labels {tuple(self.labels.shape)}")
            grouped = self.groups >= 0
            if bool((grouped & (self.labels == IGNORE_INDEX)).any()) or bool(
                (self.groups >= len(self.group_names)).any()
            ):
                raise InputError("groups must index group_names at answer positions and be -1 elsewhere")

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def __getitem__(self, index: slice | Tensor) -> "TaskData":
        """The examples ``index`` (a slice or index tensor) of this split."""
        mask = None if self.score_mask is None else self.score_mask[index]
        groups = None if self.groups is None else self.groups[index]
        return TaskData(self.inputs[index], self.labels[index], mask, groups, self.group_names)

    @property
    def scored(self) -> Tensor:
        """[N, T] bool: the positions accuracy counts."""
        answered = self.labels != IGNORE_INDEX
        return answered if self.score_mask is None else self.score_mask

    def answers_per_example(self) -> float:
        return float((self.labels != IGNORE_INDEX).sum()) / max(len(self), 1)


@dataclass(frozen=True)
class CompareRecipe:
    """How a task is trained at CPU size when rows are compared on it: the quick compare preset's
    column and ``tokenmix design --train``'s budget. A task with a recipe joins both by registering.

    args: the task's fields (length 32 in the quick preset). steps: the step budget. lrs: the
    learning rates swept (best by validation). min_lr_ratio: where the cosine ends (None: the
    preset's). shift_window: the window of the token shift in front of each row (the binding a
    row's mixer reads)."""

    args: dict[str, Any]
    steps: int
    lrs: tuple[float, ...] = (3e-3, 1e-2)
    min_lr_ratio: float | None = None
    shift_window: int = 2


@dataclass(frozen=True)
class TaskConfig(ABC):
    """Base of every task config. Subclasses are frozen dataclasses that check their sizes in
    ``__post_init__`` and implement ``vocab_size`` / ``seq_len`` (fields or properties) and
    ``_generate``."""

    name: ClassVar[str] = ""
    # whether each answer copies the token at one source position (``answer_reads``, ``build_one_hop``)
    has_answer_sources: ClassVar[bool] = False
    # how rows are compared on the task at CPU size (None: the task is not a column of the quick preset)
    recipe: ClassVar[CompareRecipe | None] = None

    @property
    def model_vocab_size(self) -> int:
        """Number of token ids (inputs and labels) the model must embed and predict."""
        return self.vocab_size  # type: ignore[attr-defined]

    @property
    def length(self) -> int:
        """Sequence length T of every generated example."""
        return self.seq_len  # type: ignore[attr-defined]

    def build(self, num_examples: int, seed: int) -> TaskData:
        """Generate ``num_examples`` examples; identical for identical (config, seed)."""
        if num_examples <= 0:
            raise InputError(f"{self.name}: num_examples must be > 0, got {num_examples}")
        data = self._generate(num_examples, seed)
        if data.inputs.shape != (num_examples, self.length):
            raise RuntimeError(
                f"{self.name} generated {tuple(data.inputs.shape)}, expected {(num_examples, self.length)}"
            )
        return data

    @abstractmethod
    def _generate(self, num_examples: int, seed: int) -> TaskData:
        """The task's generator (each task file documents it)."""

    @abstractmethod
    def baselines(self) -> dict[str, float]:
        """Expected accuracy of guessers that read no binding: uniform over the possible answers, and
        (where the task has one) a guess among the candidates that the context shows. A model at one
        of these levels has learned what an answer looks like, not how to find it."""

    def answer_reads(self, data: TaskData, hops: Any, window: int) -> Tensor | None:
        """[N, T] long: for each scored answer of ``data`` the index into ``READ_CLASSES`` of how a layer
        whose fewest hops from input j to output i are ``hops`` [T, T] (``models.reads.layer_hops``),
        behind a layer mixing the last ``window`` positions, reads the answer's source; -1 elsewhere.
        None for a task whose answers have no single source position (the default)."""
        return None

    def build_one_hop(self, num_examples: int, seed: int, hops: Any) -> TaskData:
        """Examples whose every answer the layer of ``hops`` [T, T] reads at its source in one hop
        (the one-hop curriculum's data); tasks without a source per answer refuse."""
        raise InputError(f"task '{self.name}' has no one-hop instances (its answers have no single source position)")

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.name, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}


def register_task(cls: type[TaskConfig]) -> type[TaskConfig]:
    """Class decorator: registers a task config under its ``name`` class attribute."""
    if not cls.name:
        raise InputError(f"task config {cls.__name__} has no name")
    if cls.name in _TASKS:
        raise InputError(f"task name '{cls.name}' registered twice")
    _TASKS[cls.name] = cls
    return cls


def task_names() -> list[str]:
    return list(_TASKS)


def compared_tasks() -> dict[str, CompareRecipe]:
    """Every registered task with a :class:`CompareRecipe`, in registration order."""
    return {name: cls.recipe for name, cls in _TASKS.items() if cls.recipe is not None}


def get_task_cls(name: str) -> type[TaskConfig]:
    if name not in _TASKS:
        raise InputError(f"unknown task '{name}'; known tasks: {', '.join(_TASKS)}")
    return _TASKS[name]


def make_task(name: str, **fields: Any) -> TaskConfig:
    """Build a task config by name; unknown fields raise ``ValueError`` listing the known ones."""
    cls = get_task_cls(name)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise InputError(f"task '{name}' has no field(s) {unknown}; known: {sorted(known)}")
    return cls(**fields)


def masked_accuracy(logits: Tensor, labels: Tensor, score_mask: Tensor | None = None) -> tuple[int, int]:
    """(correct, answered) over the answer positions only.

    Args:
        logits: [N, T, V].
        labels: [N, T], ``IGNORE_INDEX`` where nothing is asked.
        score_mask: [N, T] bool, the answer positions to count (None = all of them).
    """
    mask = labels != IGNORE_INDEX
    if score_mask is not None:
        mask = mask & score_mask
    correct = (logits.argmax(-1) == labels) & mask
    return int(correct.sum()), int(mask.sum())


def require(cond: bool, task: str, constraint: str, detail: str) -> None:
    """Raise ``ValueError("<task>: constraint <constraint> violated (<detail>)")`` if not cond."""
    if not cond:
        raise InputError(f"{task}: constraint {constraint} violated ({detail})")


def positive(task: str, **values: int) -> None:
    for field_name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise InputError(f"{task}: {field_name} must be a positive integer, got {v!r}")


def long_tensor(a) -> Tensor:
    return torch.as_tensor(a, dtype=torch.long)
