"""The quick preset's MQAR column trained to its plateau (about 20 minutes on 2 cores).

At the quick preset's 800 steps the pattern rows are still climbing, near the ~30 % positional guess.
This preset keeps the same task, rows, model recipe (``quick.model_for``), learning rate (3e-3,
constant after the warmup) and seeds, for up to 6000 steps with patience: a run stops after 1000
steps without a new best validation accuracy. 6000 steps because the slowest row was still rising at
4000 in development. Run it with ``tokenmix compare --preset recall``.

Development runs and measurements: docs/notes/compare-presets.md; results: docs/results.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from tokenmix.runs.synthetic import SyntheticRunConfig
from tokenmix.study.durations import stated
from tokenmix.study.presets import quick as QUICK  # rows, task, model recipe and training shared with the quick preset
from tokenmix.study.presets.base import Preset, preset_rows, register_preset

DEFAULT_MIXERS = QUICK.DEFAULT_MIXERS

TASK = "assoc_recall"
STEPS = 6000
PATIENCE_STEPS = 1000  # steps without a new best validation accuracy

NOTES = f"""\
The quick preset's MQAR column (same task, rows, recipe, learning rate and seeds) with up to {STEPS}
steps instead of 800, stopping after {PATIENCE_STEPS} steps without a new best: where each row's recall
levels off. Direct reads (the report's per-row fraction) bound what one pattern layer can answer by
content; the rest can only be guessed (the positional guess is about 30 %)."""


def recall(extra_mixers: Sequence[str] = ()) -> list[SyntheticRunConfig]:
    mixers = preset_rows(DEFAULT_MIXERS, extra_mixers)
    args = QUICK.recipe_of(TASK).args
    return [
        SyntheticRunConfig(
            label=m,
            task=TASK,
            task_args=args,
            model=QUICK.model_for(m, TASK),
            train=replace(QUICK.train_for(m, TASK, lr), steps=STEPS, patience_steps=PATIENCE_STEPS),
            seed=seed,
        )
        for seed in QUICK.SEEDS
        for lr in QUICK.recipe_of(TASK).lrs
        for m in mixers
    ]


PRESET = register_preset(
    Preset(
        name="recall",
        kind="compare",
        summary=f"the quick preset's MQAR column trained to its plateau, up to 6000 steps ({stated('compare recall')})",
        build=recall,
        notes=NOTES,
        default_mixers=DEFAULT_MIXERS,
        source=__name__,
    )
)
