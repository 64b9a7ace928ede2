"""Curricula in the synthetic harness (``CurriculumPhase``): a one-phase curriculum of the task's own
data is the plain run bitwise; phases switch at their declared steps; the validation and test splits
never change (by hash); the run records its phases; the one-hop instances are what the row's layer
reads in one hop; the patience rule counts from the end of the curriculum."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from tokenmix.core.errors import InputError
from tokenmix.models import MixerModel
from tokenmix.models.reads import layer_hops, row_layer
from tokenmix.runs.synthetic import CurriculumPhase, SyntheticRunConfig, SyntheticTrainConfig
from tokenmix.tasks import make_task
from tokenmix.training import synthetic as harness
from tokenmix.training.synthetic import LearningBudget, train_one

pytestmark = pytest.mark.usefixtures("one_thread")

MQAR = dict(vocab_size=40, seq_len=32, num_kv_pairs=4, power_a=1.0, random_non_queries=False)
TRAIN = SyntheticTrainConfig(
    lr=3e-3,
    steps=12,
    batch_size=8,
    warmup_steps=2,
    min_lr_ratio=1.0,
    train_examples=64,
    val_examples=16,
    test_examples=24,
    eval_every=4,
    early_stop_acc=1.01,
)


def mqar_run(mixer: str = "sq1", **train) -> SyntheticRunConfig:
    return SyntheticRunConfig(
        label=mixer,
        task="assoc_recall",
        task_args=MQAR,
        model=dict(
            d_model=16,
            n_heads=2,
            mlp=False,
            layers=["short_conv", mixer],
            mixer_overrides={"short_conv": {"kernel_size": 4}},
        ),
        train=replace(TRAIN, **train),
    )


def _same_weights_and_numbers(a: dict, b: dict) -> None:
    for key in ("test_acc", "best_val_acc", "train_loss_first", "train_loss_last", "curve", "test_reads", "data_sha1"):
        assert a[key] == b[key], key


def test_one_phase_of_the_task_is_the_plain_run_bitwise(tmp_path):
    plain = train_one(mqar_run(), weights_to=tmp_path / "plain.safetensors")
    one = train_one(mqar_run(curriculum=(CurriculumPhase(TRAIN.steps),)), weights_to=tmp_path / "one.safetensors")
    _same_weights_and_numbers(plain, one)
    assert (tmp_path / "plain.safetensors").read_bytes() == (tmp_path / "one.safetensors").read_bytes()
    assert [p["what"] for p in one["phases"]] == [f"{TRAIN.steps} steps on the task"]
    # a phase of the task's own data that ends early changes nothing either: the data stays, no reshuffle
    split = train_one(mqar_run(curriculum=(CurriculumPhase(5),)))
    _same_weights_and_numbers(plain, split)
    assert [(p["from_step"], p["to_step"]) for p in split["phases"]] == [(1, 5), (6, 12)]


def test_phases_switch_at_their_steps_and_the_evaluation_splits_stay(monkeypatch):
    seen: list[tuple[int, int]] = []  # (sequence length, answers) of every batch trained on
    real = harness.train_step

    def spy(model, opt, x, y, tc):
        seen.append((x.shape[1], int((y != -100).sum())))
        return real(model, opt, x, y, tc)

    monkeypatch.setattr(harness, "train_step", spy)
    curriculum = (
        CurriculumPhase(3, task_args={"seq_len": 16, "num_kv_pairs": 2}),  # length
        CurriculumPhase(4, "one_hop"),
        CurriculumPhase(2, task_args={"num_kv_pairs": 1}),  # pairs
    )
    res = train_one(mqar_run(curriculum=curriculum))
    plain = train_one(mqar_run())
    assert [x[0] for x in seen[:3]] == [16] * 3 and {x[0] for x in seen[3:]} == {32}
    assert all(n == 8 for _, n in seen[7:9])  # one pair per example: one answer each
    assert seen[9:12] == [(32, 32)] * 3  # the task: 4 answers x 8 examples
    assert [(p["from_step"], p["to_step"], p["phase"]) for p in res["phases"]] == [
        (1, 3, 0),
        (4, 7, 1),
        (8, 9, 2),
        (10, 12, 3),
    ]
    assert res["phases"][1]["what"] == "4 steps on one-hop instances"
    assert len({p["data_sha1"] for p in res["phases"]}) == 4
    assert res["phases"][3]["data_sha1"] == plain["phases"][0]["data_sha1"]  # the task's own training data
    assert res["data_sha1"] == plain["data_sha1"]  # validation and test unchanged
    assert res["config"]["train"]["curriculum"][1] == {"steps": 4, "data": "one_hop", "task_args": {}}
    back = SyntheticRunConfig.from_dict(res["config"])
    assert back.train.curriculum == curriculum and back.run_id == res["run_id"]
    assert "curriculum" not in plain["config"]["train"]  # runs without one keep their ids


@pytest.mark.parametrize("mixer", ["sq1", "pow2_ce", "first_order", "attention"])
def test_one_hop_instances_are_read_in_one_hop(mixer):
    torch.manual_seed(0)
    cfg = mqar_run(mixer)
    model = MixerModel(cfg.model_config())
    hops = layer_hops(model.blocks[row_layer(model.cfg, mixer)].mixer, MQAR["seq_len"])
    task = make_task("assoc_recall", **MQAR)
    data = task.build_one_hop(200, 3, hops)
    classes = task.answer_reads(data, hops, 4)
    scored = data.scored
    assert bool((scored.sum(1) >= 1).all())
    assert bool((classes[scored] == 0).all()) and bool((classes[~scored] == -1).all())
    if mixer == "first_order":  # only the last value, right before the first query slot
        assert bool((scored.sum(1) == 1).all()) and bool(scored[:, 2 * MQAR["num_kv_pairs"]].all())
    if mixer == "attention":  # every value in one hop: every pair asked, as in the task
        assert bool((scored.sum(1) == MQAR["num_kv_pairs"]).all())
    natural = task.build(200, 3)
    share = float((task.answer_reads(natural, hops, 4)[natural.scored] == 0).float().mean())
    assert (share == 1.0) == (mixer == "attention")


def test_read_classes_by_hand():
    task = make_task("assoc_recall", vocab_size=40, seq_len=16, num_kv_pairs=2, power_a=1.0, random_non_queries=False)
    data = task.build(1, 0)
    q = [int(i) for i in torch.nonzero(data.scored[0])]
    inputs = data.inputs[0].tolist()
    v = [inputs.index(inputs[i]) + 1 for i in q]
    hops = np.full((16, 16), 3)
    hops[q[0], v[0]] = 1  # the value itself
    hops[q[1], v[1] + 2] = 1  # a later position of its window of 4 (holds key and value)
    classes = task.answer_reads(data, hops, 4)[0]
    assert [int(classes[i]) for i in q] == [0, 1]
    assert int(task.answer_reads(data, hops, 2)[0][q[1]]) == 3  # window 2: only the value holds both
    hops[q[1], v[1]] = 2
    assert int(task.answer_reads(data, hops, 2)[0][q[1]]) == 2


def test_no_one_hop_instances_and_tasks_without_sources_are_refused():
    task = make_task("assoc_recall", **MQAR)
    with pytest.raises(InputError, match="no one-hop instances"):
        task.build_one_hop(4, 0, np.full((32, 32), 3))
    copy = make_task("copy", vocab_size=6, seq_len=8, copy_len=3, offset=4)
    with pytest.raises(InputError, match="no one-hop instances"):
        copy.build_one_hop(4, 0, np.ones((8, 8)))
    for bad in (dict(steps=0), dict(steps=2, data="two_hop"), dict(steps=True)):
        with pytest.raises(InputError, match="curriculum phase"):
            CurriculumPhase(**bad)
    with pytest.raises(InputError, match="more than the run"):
        replace(TRAIN, curriculum=(CurriculumPhase(20, "one_hop"),))
    with pytest.raises(InputError, match="has no field"):
        mqar_run(curriculum=(CurriculumPhase(2, task_args={"pairs": 3}),)).validate()


def test_patience_counts_from_the_end_of_the_curriculum():
    tc = replace(
        TRAIN,
        steps=100,
        patience_steps=10,
        min_steps=5,
        min_gain=0.5,
        curriculum=(CurriculumPhase(30, "one_hop"), CurriculumPhase(10)),
    )
    assert tc.curriculum_steps == 30 and [tc.phase_at(s) for s in (1, 30, 31, 40, 41)] == [0, 0, 1, 1, 2]
    budget = LearningBudget(tc)
    assert all(budget.observe(s, 0.1) is None for s in range(4, 40, 4))  # no gain since step 4, kept on
    assert budget.observe(40, 0.1) == "patience"  # 30 curriculum steps + 10 of patience
    plain = LearningBudget(replace(tc, curriculum=()))
    assert plain.observe(4, 0.1) is None and plain.observe(16, 0.1) == "patience"
