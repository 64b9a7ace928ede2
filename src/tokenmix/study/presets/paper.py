"""The full-size grid (hours on a GPU, days on a CPU): zoology's MQAR protocol applied to the
paper's three tasks, with the quick preset's model recipe (``quick.model_for``: a window-2 token
shift, window 3 on MQAR, then the row's mixer; one head, learned positions, untied head, no MLP).

Length 256: MQAR with vocab 8192 and 16 key-value pairs (zoology's ICLR'24 Figure 2 setting at
L = 256), 2-hop recall with 16 chains (their middle entities asked too, not scored), copy of 96
tokens at offset 150 (pow2: 4 hops, 128 + 16 + 4 + 2; sq1: 2 hops, 145 + 5; beyond local attention's
two windows of 32). Widths 64, 128, 256; learning rates logspace(-4, -2, 4); three seeds; up to
20 000 steps of 64 sequences with early stopping at 99 % validation accuracy.
Run it with ``tokenmix compare --preset paper --device cuda`` where a GPU exists.

Design notes: docs/notes/compare-presets.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from tokenmix.runs.synthetic import SyntheticRunConfig, SyntheticTrainConfig
from tokenmix.study.presets import quick as QUICK  # the row recipe is shared with the quick preset
from tokenmix.study.presets.base import Preset, preset_rows, register_preset

DEFAULT_MIXERS = QUICK.DEFAULT_MIXERS

TASKS = {
    "copy": dict(vocab_size=32, seq_len=256, copy_len=96, offset=150),
    "assoc_recall": dict(vocab_size=8192, seq_len=256, num_kv_pairs=16, random_non_queries=False),
    "multi_hop": dict(vocab_size=8192, seq_len=256, num_chains=16, hops=2, shallow_queries=True),
}
WIDTHS = (64, 128, 256)
LRS = (1e-4, 4.6416e-4, 2.1544e-3, 1e-2)
LOCAL_WINDOW = 32
TRAIN = SyntheticTrainConfig(
    steps=20_000,
    batch_size=64,
    warmup_steps=500,
    train_examples=100_000,
    val_examples=1_000,
    test_examples=3_000,
    eval_every=500,
    early_stop_acc=0.99,
)
SEEDS = (0, 1, 2)


def model_for(mixer: str, d_model: int, task: str | None = None) -> dict:
    model = QUICK.model_for(mixer, task)
    overrides = dict(model["mixer_overrides"])
    if mixer == QUICK.SHIFT:
        overrides[mixer] = {"window": LOCAL_WINDOW}
    return {**model, "d_model": d_model, "max_seq_len": 256, "mixer_overrides": overrides}


def paper(extra_mixers: Sequence[str] = ()) -> list[SyntheticRunConfig]:
    mixers = preset_rows(DEFAULT_MIXERS, extra_mixers)
    return [
        SyntheticRunConfig(
            label=m, task=task, task_args=args, model=model_for(m, d, task), train=replace(TRAIN, lr=lr), seed=seed
        )
        for seed in SEEDS
        for task, args in TASKS.items()
        for d in WIDTHS
        for lr in LRS
        for m in mixers
    ]


PRESET = register_preset(
    Preset(
        name="paper",
        kind="compare",
        summary="the full grid at the paper's lengths: widths 64-256, four learning rates (hours)",
        build=paper,
        notes="",
        default_mixers=DEFAULT_MIXERS,
        source=__name__,
    )
)
