"""The complexity–expressivity frontier on MQAR at lengths 64-256 (``frontier``, under 60 min on 2 cores)
and zoology's full grid (``frontier_full``, for a GPU or a long CPU run).

Protocol: MQAR from zoology's generator (``tasks/assoc_recall.py``): key-value pairs growing with the
length, queries at power-law gaps after the context, random tokens elsewhere; the loss and accuracy
read the answer positions only (the harness's head runs there alone). Every row is two layers of its
mixer, each behind a short causal convolution (``short_conv``, kernel 4: zoology's recent recipe puts
one in front of every sequence mixer), no position code. Every run is also tested at 2x and 4x its
length (same checkpoint): extrapolation. Every run of a grid sees the same tokens (steps ∝ 1 / L), and
as the pairs grow with L, the same number of answers.

What ``frontier`` keeps and cuts to fit 60 minutes (measured: docs/results.md), each cut measured in
development (docs/notes/frontier.md): vocabulary 520 instead of 8192 (with 8192, attention stayed
at 0 % after 600 steps; with 1024, 34 % after 1200), the quick preset's recipe (no MLP, untied head,
constant learning rate: with MLPs, tied embeddings and a cosine schedule attention reached 17 %
against 85 %), lengths 64-256 with width 32 only at 64, pairs L/16, one learning rate and one seed.
``frontier_full`` is zoology's grid: vocabulary 8192, lengths 64-512, widths 64-256, pairs L/4, MLPs,
four learning rates, three seeds, 20 000 steps at L = 64.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from tokenmix.runs.synthetic import SyntheticRunConfig, SyntheticTrainConfig
from tokenmix.study.frontier import frontier_column, frontier_section
from tokenmix.study.presets.base import Preset, register_preset, registered

DEFAULT_MIXERS = ("attention", "local_attention", "first_order", "mamba2", "gla", "gated_deltanet", "log_linear",
                  "pow2", "pow2_ce", "sq1", "sq1_ce", "dense_recurrence", "chacal")
FULL_MIXERS = DEFAULT_MIXERS + ("log_linear_mamba2", "log_linear_gated_deltanet")
CONV = "short_conv"
CONV_KERNEL = 4
LOCAL_WINDOW = 32        # local attention's window: its cache O(w) stays 32 positions at every length
EXTRAPOLATE = (2, 4)     # test lengths as multiples of the training length (those below the vocabulary)

# the shipped preset: (length, width) cells, pairs L/16, the quick preset's MQAR recipe (no MLP, untied
# head, constant learning rate after the warmup), and the same tokens for every cell (steps ∝ 1/L)
VOCAB = 520              # zoology's generator needs vocab > length: the smallest round size above 4 x 128
MODEL = dict(n_heads=2, mlp=False, tie_weights=False, positions="none")
CELLS = ((64, 32), (64, 64), (128, 64), (256, 64))
PAIRS_PER_LENGTH = 16    # num_kv_pairs = L / 16
LRS = (3e-3,)
SEEDS = (0,)
STEP_TOKENS = 1200 * 64  # steps x L per run: 1200 steps at L = 64, 600 at 128, 300 at 256
TRAIN = SyntheticTrainConfig(batch_size=64, steps=1200, warmup_steps=50, min_lr_ratio=1.0, train_examples=20_000,
                             val_examples=128, test_examples=256, eval_every=50, early_stop_acc=0.99)

FULL_VOCAB = 8192        # zoology's
FULL_MODEL = dict(n_heads=2, mlp=True, tie_weights=True, positions="none")
FULL_CELLS = tuple((n, d) for n in (64, 128, 256, 512) for d in (64, 128, 256))
FULL_PAIRS_PER_LENGTH = 4
FULL_LRS = (3e-4, 1e-3, 3e-3, 1e-2)
FULL_SEEDS = (0, 1, 2)
FULL_STEP_TOKENS = 20_000 * 64
FULL_TRAIN = SyntheticTrainConfig(batch_size=64, steps=20_000, warmup_steps=500, train_examples=100_000,
                                  val_examples=512, test_examples=3_000, eval_every=500, early_stop_acc=0.99,
                                  patience_steps=5000)

NOTES = f"""\
MQAR generated as zoology does (pairs L/{PAIRS_PER_LENGTH}, power-law query gaps, random tokens between) with
vocabulary {VOCAB}, at (length, width) cells {list(CELLS)}; every row is [short_conv (kernel {CONV_KERNEL}),
mixer] x 2 (local attention: window {LOCAL_WINDOW}), no MLP, untied head, no position code; lr {LRS[0]:g} held after a {TRAIN.warmup_steps}-step warmup,
seed(s) {list(SEEDS)}, batches of {TRAIN.batch_size}, {STEP_TOKENS // 64} steps at L = 64 and fewer in proportion
at longer L (every run sees the same tokens and answers); each checkpoint also tested at
{' and '.join(f'{m}x' for m in EXTRAPOLATE)} its length where that stays below the vocabulary.
Cut to fit 60 minutes on 2 cores (all kept by `frontier_full`): zoology's vocabulary of 8192 (at this budget
not even attention learns with it), MLPs, length 512, widths above 64, pairs up to L/4, the learning-rate
sweep and seeds. "Not learned yet" and "cannot" both read as low accuracy: the report flags runs still rising."""

FULL_NOTES = f"""\
zoology's MQAR grid: vocabulary {FULL_VOCAB}, (length, width) cells {list(FULL_CELLS)}, pairs L/{FULL_PAIRS_PER_LENGTH};
every row [short_conv (kernel {CONV_KERNEL}), mixer] x 2 with MLPs, tied embeddings, no position code; lrs
{list(FULL_LRS)}, seeds {list(FULL_SEEDS)}, batches of {FULL_TRAIN.batch_size}, {FULL_STEP_TOKENS // 64} steps at L = 64
and fewer in proportion at longer L, patience {FULL_TRAIN.patience_steps} steps; tested at
{' and '.join(f'{m}x' for m in EXTRAPOLATE)} the training length. Meant for `--device cuda` or a long CPU run."""


@dataclass(frozen=True)
class FrontierGrid:
    """One frontier sweep's settings (the shipped preset's, or zoology's full grid)."""

    vocab: int
    model: dict
    cells: tuple[tuple[int, int], ...]   # (training length, width)
    pairs_per_length: int                # num_kv_pairs = L / pairs_per_length
    lrs: tuple[float, ...]
    seeds: tuple[int, ...]
    step_tokens: int                     # steps x L of every run (steps = step_tokens / L)
    train: SyntheticTrainConfig

    def runs(self, mixers: Sequence[str]) -> list[SyntheticRunConfig]:
        return [SyntheticRunConfig(
                    label=m, task="assoc_recall", column=frontier_column(n, d), seed=seed,
                    task_args=dict(vocab_size=self.vocab, seq_len=n, num_kv_pairs=n // self.pairs_per_length),
                    model={**self.model, "d_model": d, "layers": [CONV, m, CONV, m],
                           "mixer_overrides": {CONV: {"kernel_size": CONV_KERNEL},
                                               **({m: {"window": LOCAL_WINDOW}} if m == "local_attention" else {})}},
                    train=replace(self.train, lr=lr, steps=self.step_tokens // n,
                                  test_lengths=tuple(k * n for k in EXTRAPOLATE if k * n < self.vocab)))
                for seed in self.seeds for (n, d) in self.cells for lr in self.lrs for m in mixers]


GRID = FrontierGrid(VOCAB, MODEL, CELLS, PAIRS_PER_LENGTH, LRS, SEEDS, STEP_TOKENS, TRAIN)
FULL_GRID = FrontierGrid(FULL_VOCAB, FULL_MODEL, FULL_CELLS, FULL_PAIRS_PER_LENGTH, FULL_LRS, FULL_SEEDS,
                         FULL_STEP_TOKENS, FULL_TRAIN)


def _rows(defaults: Sequence[str], extra_mixers: Sequence[str]) -> list[str]:
    return registered(defaults)[0] + [m for m in extra_mixers if m not in defaults]


def frontier(extra_mixers: Sequence[str] = ()) -> list[SyntheticRunConfig]:
    return GRID.runs(_rows(DEFAULT_MIXERS, extra_mixers))


def frontier_full(extra_mixers: Sequence[str] = ()) -> list[SyntheticRunConfig]:
    return FULL_GRID.runs(_rows(FULL_MIXERS, extra_mixers))


PRESET = register_preset(Preset(
    name="frontier", kind="compare", build=frontier, notes=NOTES, default_mixers=DEFAULT_MIXERS, source=__name__,
    summary="MQAR (zoology's generator) at lengths 64-256: accuracy vs state size and length, 2x/4x extrapolation (<60 min)",
    report_section=frontier_section))
FULL = register_preset(Preset(
    name="frontier_full", kind="compare", build=frontier_full, notes=FULL_NOTES, default_mixers=FULL_MIXERS,
    source=__name__, report_section=frontier_section,
    summary="zoology's full MQAR grid (vocab 8192, lengths 64-512, widths 64-256, 4 lrs, 3 seeds): GPU or long CPU run"))
