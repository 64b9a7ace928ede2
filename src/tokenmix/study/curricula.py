"""Curriculum rules a compare preset gives every row alike: each rule turns a run into the same run
with the curriculum phases (``runs.synthetic.CurriculumPhase``) that its training starts with.

    natural   no curriculum: the task from the first step
    one_hop   ``steps`` on instances whose every answer the row's own layer reads at its source in one
              hop (``TaskConfig.build_one_hop``), then the task: structure-aware. A row whose layer
              reads every source in one hop (attention, the linear recurrences, the dense recurrence)
              gets the task itself, i.e. no curriculum: its run is the natural run
    length    ``steps`` at half the sequence length (and half the pairs, for tasks that have pairs),
              then the task
    pairs     ``steps`` with a quarter of the pairs (at least one), then the task

A rule is data, not code in the preset: the preset names it and its steps; every row of the sweep
gets it, and each run records the phases it trained (``result["phases"]``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from tokenmix.core.errors import InputError
from tokenmix.models import MixerModel, ModelConfig
from tokenmix.models.reads import layer_hops, row_layer
from tokenmix.runs.synthetic import CurriculumPhase, SyntheticRunConfig

CURRICULA = ("natural", "one_hop", "length", "pairs")


def reads_every_source(cfg: SyntheticRunConfig) -> bool:
    """Whether the row's layer reads every earlier position in one hop: then its one-hop instances are
    the task's own distribution (the curriculum would only redraw the same data)."""
    if not cfg.task_config().has_answer_sources:
        return False
    return _reads_everything(cfg.label, json.dumps(cfg.to_dict()["model"], sort_keys=True), cfg.task_config().length)


@functools.lru_cache(maxsize=None)  # a sweep asks once per row and cell, not once per seed
def _reads_everything(label: str, model_json: str, n: int) -> bool:
    model_args = {k: v for k, v in json.loads(model_json).items()}
    model_args["layers"] = tuple(model_args["layers"])
    torch.manual_seed(0)
    model = MixerModel(ModelConfig(**model_args))
    hops = layer_hops(model.blocks[row_layer(model.cfg, label)].mixer, n)
    return bool((hops[np.tril_indices(n)] <= 1).all())


def curriculum_phases(rule: str, steps: int, task_args: dict[str, Any]) -> tuple[CurriculumPhase, ...]:
    """The phases of ``rule`` for a run of task fields ``task_args``."""
    if rule not in CURRICULA:
        raise InputError(f"unknown curriculum '{rule}'; known: {', '.join(CURRICULA)}")
    if rule == "natural":
        return ()
    if rule == "one_hop":
        return (CurriculumPhase(steps, "one_hop"),)
    pairs = task_args.get("num_kv_pairs")
    if rule == "length":
        if "seq_len" not in task_args:
            raise InputError("the length curriculum needs a task with seq_len")
        short = {"seq_len": task_args["seq_len"] // 2 // 2 * 2}
        return (CurriculumPhase(steps, task_args={**short, **({"num_kv_pairs": max(1, pairs // 2)} if pairs else {})}),)
    if not pairs:
        raise InputError("the pairs curriculum needs a task with num_kv_pairs")
    return (CurriculumPhase(steps, task_args={"num_kv_pairs": max(1, pairs // 4)}),)


def with_curriculum(cfg: SyntheticRunConfig, rule: str, steps: int) -> SyntheticRunConfig:
    """``cfg`` with the curriculum of ``rule`` (a one-hop rule on a row that reads every source in one
    hop leaves the run as it is: the natural run, the same run id)."""
    if rule == "one_hop" and reads_every_source(cfg):
        return cfg
    return replace(cfg, train=replace(cfg.train, curriculum=curriculum_phases(rule, steps, cfg.task_args)))
