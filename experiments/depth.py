"""Entity tracking accuracy vs depth (ChaCAL's claim, framework §6.2): a 1-layer dense recurrence
(and ChaCAL) follows n state changes that attention (B = 0) needs ceil(log2(n + 1)) layers for.

Rows: ``dense_recurrence x1``, ``chacal x1`` and ``attention xL`` for L = 1 .. ceil(log2(n + 1)) + 1,
(plus ``extra_mixers`` at one layer); one column per n (n = 3 and n = 7 state changes, two chains
each, every box asked, so accuracy mixes depths 0..n: a model that follows d hops scores about
(d + 1)/(n + 1) plus chance on the rest). Width 64 without MLP, one learning rate, three seeds.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from tokenmix.training.harness import RunConfig, TrainConfig
from tokenmix.training.presets import registered

CHANGES = (3, 7)
ONE_LAYER = ("dense_recurrence", "chacal")
MODEL = dict(d_model=64, n_heads=2, mlp=False)
TRAIN = TrainConfig(lr=3e-3, steps=1500, batch_size=32, warmup_steps=50, train_examples=10_000,
                    val_examples=256, test_examples=1_000, eval_every=50, early_stop_acc=0.99)
TRAIN_MODE = {"dense_recurrence": "dense"}
SEEDS = (0, 1, 2)


def task_args(n: int) -> dict:
    # every box is asked (depths 0..n): the shallow lookups are the learning signal the deep ones build on
    return dict(num_changes=n, num_chains=2, num_boxes=2 * (n + 1), num_objects=8, ask_all_boxes=True)


def rows(extra_mixers: Sequence[str] = ()) -> list[tuple[str, str, int]]:
    """(label, mixer, layers) of every row."""
    max_layers = max(math.ceil(math.log2(n + 1)) for n in CHANGES) + 1
    one = registered(ONE_LAYER)[0] + [m for m in extra_mixers if m not in ONE_LAYER]
    return ([(f"{m} x1", m, 1) for m in one]
            + [(f"attention x{layers}", "attention", layers) for layers in range(1, max_layers + 1)])


def depth(extra_mixers: Sequence[str] = ()) -> list[RunConfig]:
    return [RunConfig(label=label, task="entity_tracking", task_args=task_args(n), column=f"entity n={n}",
                      model={**MODEL, "layers": [mixer] * layers},
                      train=replace(TRAIN, mode=TRAIN_MODE.get(mixer)), seed=seed)
            for seed in SEEDS for n in CHANGES for label, mixer, layers in rows(extra_mixers)]
