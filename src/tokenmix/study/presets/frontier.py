"""The complexity–expressivity frontier on MQAR at lengths 64-256 (``frontier``, under 60 min on 2 cores)
and zoology's full grid (``frontier_full``, for a GPU or a long CPU run).

Protocol (zoology's MQAR, ``tasks/assoc_recall.py``): vocabulary 8192, key-value pairs growing with
the length, queries at power-law gaps after the context, noise elsewhere; the loss and accuracy read
the answer positions only (the harness's head runs there alone). Every row is two layers of its
mixer, each behind a short causal convolution (``short_conv``, kernel 4: zoology's recent recipe puts
a short convolution in front of every sequence mixer), with MLPs, no position code, tied embeddings.
Every run is also tested at 2x and 4x its length (same checkpoint): extrapolation.

What ``frontier`` keeps and cuts to fit 60 minutes (measured wall time: docs/results.md):
    lengths 64, 128, 256 at width 64, and 256 at width 32 (zoology: 64 ... 512+, widths 64 ... 256);
    pairs L/16 (4, 8, 16; zoology's figure-2 grid uses up to L/4);
    one learning rate (3e-3, zoology's sweeps pick from 1e-4 ... 1e-2), one seed, at most
    STEPS steps of 32 sequences (zoology trains 100k examples for up to 64 epochs).
``frontier_full`` is the uncut grid: lengths 64-512, pairs L/4, widths 64, 128, 256, four learning rates, three seeds, 20 000 steps.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from tokenmix.runs.synthetic import SyntheticRunConfig, SyntheticTrainConfig
from tokenmix.study.frontier import frontier_column, frontier_section
from tokenmix.study.presets.base import Preset, register_preset, registered

DEFAULT_MIXERS = ("attention", "local_attention", "first_order", "mamba2", "gla", "gated_deltanet", "log_linear",
                  "log_linear_mamba2", "log_linear_gated_deltanet", "pow2", "pow2_ce", "sq1", "sq1_ce",
                  "dense_recurrence", "chacal")
CONV = "short_conv"
CONV_KERNEL = 4
VOCAB = 8192
MODEL = dict(n_heads=2, mlp=True, tie_weights=True, positions="none")
EXTRAPOLATE = (2, 4)     # test lengths as multiples of the training length

# (length, width) cells and pairs per length
CELLS = ((64, 64), (128, 64), (256, 64), (256, 32))
PAIRS_PER_LENGTH = 16    # num_kv_pairs = L / 16
LRS = (3e-3,)
SEEDS = (0,)
STEPS = 300
TRAIN = SyntheticTrainConfig(batch_size=32, steps=STEPS, warmup_steps=40, min_lr_ratio=0.1, train_examples=20_000,
                             val_examples=128, test_examples=256, eval_every=50, early_stop_acc=0.99)

FULL_CELLS = tuple((n, d) for n in (64, 128, 256, 512) for d in (64, 128, 256))
FULL_PAIRS_PER_LENGTH = 4
FULL_LRS = (3e-4, 1e-3, 3e-3, 1e-2)
FULL_SEEDS = (0, 1, 2)
FULL_TRAIN = SyntheticTrainConfig(batch_size=64, steps=20_000, warmup_steps=500, train_examples=100_000,
                                  val_examples=512, test_examples=3_000, eval_every=500, early_stop_acc=0.99,
                                  patience=10)

NOTES = f"""\
MQAR as zoology runs it (vocabulary {VOCAB}, pairs L/{PAIRS_PER_LENGTH}, power-law query gaps, noise between), at
(length, width) cells {list(CELLS)}; every row is [short_conv (kernel {CONV_KERNEL}), mixer] x 2 with MLPs, no
position code; lr {LRS[0]:g}, seed(s) {list(SEEDS)}, at most {STEPS} steps of {TRAIN.batch_size} sequences; each
checkpoint also tested at {' and '.join(f'{m}x' for m in EXTRAPOLATE)} its length. Cut to fit 60 minutes on 2 cores:
the 512 length, widths above 64, pairs up to L/4, the learning-rate sweep and seeds (all in `frontier_full`).
At this budget "not learned yet" and "cannot" both read as low accuracy: the report flags runs still rising."""

FULL_NOTES = f"""\
zoology's MQAR grid uncut: (length, width) cells {list(FULL_CELLS)}, pairs L/{FULL_PAIRS_PER_LENGTH}, vocabulary {VOCAB},
every row [short_conv (kernel {CONV_KERNEL}), mixer] x 2 with MLPs, no position code; lrs {list(FULL_LRS)}, seeds
{list(FULL_SEEDS)}, up to {FULL_TRAIN.steps} steps of {FULL_TRAIN.batch_size} sequences (patience {FULL_TRAIN.patience} validations);
tested at {' and '.join(f'{m}x' for m in EXTRAPOLATE)} the training length. Meant for `--device cuda` or a long CPU run."""


def _model(mixer: str, width: int) -> dict:
    return {**MODEL, "d_model": width, "layers": [CONV, mixer, CONV, mixer],
            "mixer_overrides": {CONV: {"kernel_size": CONV_KERNEL}}}


def _runs(mixers: Sequence[str], cells, pairs_per_length: int, lrs, seeds, train: SyntheticTrainConfig
          ) -> list[SyntheticRunConfig]:
    return [SyntheticRunConfig(label=m, task="assoc_recall", column=frontier_column(n, d),
                               task_args=dict(vocab_size=VOCAB, seq_len=n, num_kv_pairs=n // pairs_per_length),
                               model=_model(m, d), seed=seed,
                               train=replace(train, lr=lr, test_lengths=tuple(k * n for k in EXTRAPOLATE)))
            for seed in seeds for (n, d) in cells for lr in lrs for m in mixers]


def _rows(extra_mixers: Sequence[str]) -> list[str]:
    return registered(DEFAULT_MIXERS)[0] + [m for m in extra_mixers if m not in DEFAULT_MIXERS]


def frontier(extra_mixers: Sequence[str] = ()) -> list[SyntheticRunConfig]:
    return _runs(_rows(extra_mixers), CELLS, PAIRS_PER_LENGTH, LRS, SEEDS, TRAIN)


def frontier_full(extra_mixers: Sequence[str] = ()) -> list[SyntheticRunConfig]:
    return _runs(_rows(extra_mixers), FULL_CELLS, FULL_PAIRS_PER_LENGTH, FULL_LRS, FULL_SEEDS, FULL_TRAIN)


PRESET = register_preset(Preset(
    name="frontier", kind="compare", build=frontier, notes=NOTES, default_mixers=DEFAULT_MIXERS, source=__name__,
    summary="MQAR (zoology's protocol) at lengths 64-256, accuracy vs state size and length, 2x/4x extrapolation (<60 min)",
    report_section=frontier_section))
FULL = register_preset(Preset(
    name="frontier_full", kind="compare", build=frontier_full, default_mixers=DEFAULT_MIXERS, source=__name__,
    notes=FULL_NOTES,
    summary="zoology's full MQAR grid (lengths 64-512, widths 64-256, 4 lrs, 3 seeds): for a GPU or a long CPU run",
    report_section=frontier_section))
