"""Entity tracking accuracy vs depth (ChaCAL's claim, framework §6.2): a 1-layer dense recurrence
(and ChaCAL) follows n state changes that attention (B = 0) needs ceil(log2(n + 1)) layers for.

Rows: ``dense_recurrence x1``, ``chacal x1`` and ``attention xL`` for L = 1 .. 4 (plus
``extra_mixers`` at one layer); one column per n: n = 3 (bound 2 layers) and n = 4 (bound 3), the
depths a one-layer recurrence learned within budget in development. Pointer doubling, the known
attention solution, needs ceil(log2(n + 2)) = 3 layers for both
(``study.theory.doubling_layers``), within the grid.
Two chains per example; every box is asked (the shallow questions are a curriculum) and only the
depth-n questions are scored, so guessing is 50 %. Width 64, one head, no position code (the task
needs none, and learned positions kept ChaCAL at the guess), untied head, no MLP; learning rates 3e-3
and 1e-2, three seeds, up to 2500 steps of 32 sequences (early stop at 99 %).

Development runs and measurements: docs/notes/compare-presets.md; results: docs/results.md.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from tokenmix.runs.synthetic import SyntheticRunConfig
from tokenmix.study.durations import stated
from tokenmix.study.presets import quick as QUICK  # the data splits, warmup and early stop of the quick preset
from tokenmix.study.presets.base import Preset, preset_rows, register_preset

CHANGES = (3, 4)
ONE_LAYER = ("dense_recurrence", "chacal")
MAX_ATTENTION_LAYERS = max(math.ceil(math.log2(n + 1)) for n in CHANGES) + 1  # one past the largest bound
MODEL = dict(d_model=64, n_heads=1, mlp=False, tie_weights=False, positions="none", max_seq_len=32)
LRS = (3e-3, 1e-2)
TRAIN = replace(QUICK.TRAIN, steps=2500, batch_size=32)
TRAIN_MODE = {"dense_recurrence": "dense"}  # the cheapest exact mode at these lengths
SEEDS = (0, 1, 2)

NOTES = """\
Entity tracking with two chains; only the depth-n questions are scored (guessing: 50 %). The bound
ceil(log2(n + 1)) is a lower bound for attention: fewer layers cannot follow n changes, more layers
need not learn to. Within this preset's budget "cannot" and "has not learned yet" look alike; the
claims' notes flag runs still improving at the end of their budget."""


def task_args(n: int) -> dict:
    return dict(
        num_changes=n, num_chains=2, num_boxes=2 * (n + 1), num_objects=8, ask_all_boxes=True, score_deepest=True
    )


def rows(extra_mixers: Sequence[str] = ()) -> list[tuple[str, str, int]]:
    """(label, mixer, layers) of every row."""
    one = preset_rows(ONE_LAYER, extra_mixers)
    return [(f"{m} x1", m, 1) for m in one] + [
        (f"attention x{layers}", "attention", layers) for layers in range(1, MAX_ATTENTION_LAYERS + 1)
    ]


def depth(extra_mixers: Sequence[str] = ()) -> list[SyntheticRunConfig]:
    return [
        SyntheticRunConfig(
            label=label,
            task="entity_tracking",
            task_args=task_args(n),
            column=f"entity n={n}",
            model={**MODEL, "layers": [mixer] * layers},
            train=replace(TRAIN, lr=lr, mode=TRAIN_MODE.get(mixer)),
            seed=seed,
        )
        for seed in SEEDS
        for n in CHANGES
        for lr in LRS
        for label, mixer, layers in rows(extra_mixers)
    ]


PRESET = register_preset(
    Preset(
        name="depth",
        kind="compare",
        summary=f"entity tracking with 3 and 4 state changes against attention layers 1-4 ({stated('compare depth')})",
        build=depth,
        notes=NOTES,
        default_mixers=(),
        source=__name__,
    )
)
