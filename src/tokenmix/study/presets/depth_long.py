"""The depth claim at n = 3 with a recipe and budget under which attention learns entity tracking
(about an hour on 2 cores).

In the depth preset (one head, no MLP, 2500 steps) attention stays at the 50 % guess with every
number of layers, so it cannot show attention *needing* ceil(log2(n + 1)) layers, only failing below
them. Here every row has two heads, an MLP and no position code (the task needs none), one learning
rate (3e-3) and up to 40 000 steps of 32 sequences, early stop at 99 % validation accuracy: in
development two attention layers passed 90 % on the depth-3 questions only after ~26 000 steps.
Rows: the one-layer dense recurrence and ChaCAL, and attention with 1, 2 and 3 layers (the bound is
2; pointer doubling needs 3, see ``study.theory.doubling_layers``). Three seeds.
Run it with ``tokenmix compare --preset depth_long``.

Development runs and measurements: docs/notes/compare-presets.md; results: docs/results.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from tokenmix.runs.synthetic import SyntheticRunConfig
from tokenmix.study.durations import stated
from tokenmix.study.presets import depth as DEPTH  # task and training defaults shared with the depth preset
from tokenmix.study.presets.base import Preset, preset_rows, register_preset

CHANGES = 3
ATTENTION_LAYERS = (1, 2, 3)
ONE_LAYER = ("dense_recurrence", "chacal")
MODEL = {**DEPTH.MODEL, "n_heads": 2, "mlp": True, "positions": "none"}
TRAIN = replace(DEPTH.TRAIN, steps=40_000, lr=3e-3, eval_every=100)
SEEDS = DEPTH.SEEDS

NOTES = (
    DEPTH.NOTES
    + """
This preset: two heads, an MLP and no position code in every row, one learning rate (3e-3), up to
40 000 steps: the budget under which two attention layers learned the composed questions in
development runs."""
)


def depth_long(extra_mixers: Sequence[str] = ()) -> list[SyntheticRunConfig]:
    one = preset_rows(ONE_LAYER, extra_mixers)
    rows = [(f"{m} x1", m, 1) for m in one] + [(f"attention x{L}", "attention", L) for L in ATTENTION_LAYERS]
    return [
        SyntheticRunConfig(
            label=label,
            task="entity_tracking",
            task_args=DEPTH.task_args(CHANGES),
            column=f"entity n={CHANGES}",
            model={**MODEL, "layers": [mixer] * layers},
            train=replace(TRAIN, mode=DEPTH.TRAIN_MODE.get(mixer)),
            seed=seed,
        )
        for seed in SEEDS
        for label, mixer, layers in rows
    ]


PRESET = register_preset(
    Preset(
        name="depth_long",
        kind="compare",
        summary="the depth preset's n = 3 column with two heads, an MLP and 40 000 steps "
        f"({stated('compare depth_long')})",
        build=depth_long,
        notes=NOTES,
        default_mixers=(),
        source=__name__,
    )
)
