"""A task is one file + registration: a throw-away task registered here with a ``CompareRecipe``
joins the quick compare preset (a column of its own, trained with its recipe's budget) and
``tokenmix design --train`` (the candidate runs use its sizes and steps); without a recipe it is in
neither the preset nor changes its runs."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch

from tokenmix.analysis.design import Candidate
from tokenmix.study.design import DesignTraining, run_config
from tokenmix.study.presets.quick import SEEDS, quick
from tokenmix.tasks import base as task_base
from tokenmix.tasks.base import IGNORE_INDEX, CompareRecipe, TaskConfig, TaskData
from tokenmix.training.sweep import run_sweep

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass(frozen=True)
class EchoConfig(TaskConfig):
    """Echo the token one position back (a throw-away task for the enrolment test)."""

    name = "echo_for_enrolment"
    recipe = CompareRecipe(dict(vocab_size=8, seq_len=12), steps=7, lrs=(1e-2,), shift_window=2)

    vocab_size: int = 8
    seq_len: int = 16

    def baselines(self) -> dict[str, float]:
        return {"uniform": 1 / self.vocab_size}

    def _generate(self, num_examples: int, seed: int) -> TaskData:
        g = torch.Generator().manual_seed(seed)
        inputs = torch.randint(self.vocab_size, (num_examples, self.seq_len), generator=g)
        labels = torch.full_like(inputs, IGNORE_INDEX)
        labels[:, 1:] = inputs[:, :-1]
        return TaskData(inputs, labels)


@pytest.fixture
def enrolled(monkeypatch):
    monkeypatch.setitem(task_base._TASKS, EchoConfig.name, EchoConfig)  # registration, undone after the test
    return EchoConfig


def test_a_task_with_a_recipe_joins_the_quick_preset(enrolled, tmp_path):
    runs = quick()
    echo = [r for r in runs if r.task == enrolled.name]
    assert len(echo) == len({r.label for r in runs}) * len(SEEDS)  # every row and seed, at its one rate
    assert {r.train.steps for r in echo} == {7} and {r.train.lr for r in echo} == {1e-2}
    assert all(r.task_config().seq_len == 12 for r in echo)
    one = [replace(r, train=replace(r.train, train_examples=32, val_examples=8, test_examples=8)) for r in echo[:1]]
    outcome = run_sweep(one, tmp_path, progress=False)
    assert outcome.results[0]["column"] == enrolled.name and outcome.results[0]["steps_done"] == 7


def test_a_task_with_a_recipe_joins_design(enrolled):
    training = DesignTraining(task=enrolled.name)
    assert training.step_budget == 7
    row = type("Row", (), {"name": "geom:1.5", "candidate": Candidate("geom:1.5", "geom", "f:3**k", False)})()
    cfg = run_config(row, training, 0)
    cfg.validate()
    assert cfg.task == enrolled.name and cfg.task_config().seq_len == 12 and cfg.train.steps == 7


def test_a_task_without_a_recipe_stays_out_of_the_preset(monkeypatch):
    ids = [r.run_id for r in quick()]
    bare = type("Bare", (EchoConfig,), {"name": "bare_for_enrolment", "recipe": None})
    monkeypatch.setitem(task_base._TASKS, bare.name, bare)
    assert [r.run_id for r in quick()] == ids  # the preset's runs are unchanged
    assert DesignTraining(task=bare.name).step_budget == 200  # design's default budget
