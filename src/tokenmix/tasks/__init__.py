"""Synthetic benchmark tasks, one per file; each registers its config under its name.

make_task("assoc_recall", seq_len=64, num_kv_pairs=8).build(num_examples, seed) -> TaskData
"""

from tokenmix.tasks.base import (
    IGNORE_INDEX,
    READ_CLASSES,
    CompareRecipe,
    TaskConfig,
    TaskData,
    compared_tasks,
    get_task_cls,
    make_task,
    masked_accuracy,
    register_task,
    task_names,
)
from tokenmix.tasks import copy  # copy
from tokenmix.tasks import assoc_recall  # assoc_recall (MQAR)
from tokenmix.tasks import multi_hop  # multi_hop
from tokenmix.tasks import entity_tracking  # entity_tracking
from tokenmix.tasks import state_tracking  # state_tracking
from tokenmix.tasks import selective_copy  # selective_copy

__all__ = [
    "IGNORE_INDEX",
    "READ_CLASSES",
    "CompareRecipe",
    "TaskConfig",
    "TaskData",
    "compared_tasks",
    "get_task_cls",
    "make_task",
    "masked_accuracy",
    "register_task",
    "task_names",
]
