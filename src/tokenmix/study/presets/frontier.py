"""The complexity–expressivity frontier on MQAR: ``frontier`` (its main cell, L = 64 at d = 64, three
seeds, every row trained to its plateau after the one-hop curriculum and without it, ≤ 2 h on 2 cores),
``frontier_long`` (longer sequences
and the second width, hours on a CPU, resumable) and ``frontier_full`` (zoology's grid, for a GPU).

Protocol: MQAR from zoology's generator (``tasks/assoc_recall.py``): key-value pairs growing with the
length, queries after the context, random tokens elsewhere; the loss and accuracy read the answer
positions only (the harness's head runs there alone). Every row is two layers of its mixer, each
behind a short causal convolution (``short_conv``, kernel 4: zoology's recent recipe puts one in
front of every sequence mixer), no position code. Every run is also tested at 2x and 4x its length
(same checkpoint): extrapolation.

What ``frontier`` and ``frontier_long`` change from zoology's grid, each measured in development
(docs/notes/frontier.md):
* Budgets by learning, not by tokens: a run stops when its validation has stopped gaining
  (``PATIENCE_STEPS`` without ``MIN_GAIN`` of accuracy or ``MIN_LOSS_GAIN`` of loss: MQAR models sit
  on a plateau before they bind keys, where the loss still falls and the accuracy does not, and an
  equal-token budget stopped every sub-quadratic row inside it), never before ``MIN_STEPS``, at most
  ``MAX_STEPS``; a run the maximum stops while still gaining is flagged in every table.
* Query gaps uniform (``power_a`` = 1) instead of zoology's power law, which puts most queries right
  after the context: there a window of 32 reads most pairs, and a row could score by position.
  Local attention keeps a window of ``LOCAL_WINDOW``, which reaches about a quarter of the pairs.
* Vocabulary ``VOCAB`` (zoology: 8192): the smallest round size above 4 x 64, since the generator
  needs vocabulary > length and the runs are tested at 4x the training length. Each id is then seen
  often enough for its embedding to be learnt within a CPU budget (Mamba-2's transition came within
  6000 steps at 264, not at 520). The filler positions hold 0 (``random_non_queries`` off, as the
  quick preset's MQAR): random ids at that vocabulary repeat a query's key before it for about one
  query in ten, which held attention at 92 %.
* The quick preset's MQAR recipe (no MLP, untied head, learning rate held after the warmup).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from tokenmix.runs.synthetic import SyntheticRunConfig, SyntheticTrainConfig
from tokenmix.study.curricula import with_curriculum
from tokenmix.study.durations import stated
from tokenmix.study.frontier import MAIN_CELL, NATURAL, frontier_column, frontier_section
from tokenmix.study.presets.base import Preset, preset_rows, register_preset

# the main cell's rows: every row a claim compares and attention (the calibration); local attention,
# the paper's O(n) rows and log-linear attention are `frontier_long` rows (or `--mixers local_attention,
# dense_recurrence,chacal,log_linear` here): 2 hours hold 11 rows x 3 seeds and the natural runs
DEFAULT_MIXERS = (
    "attention",
    "first_order",
    "mamba2",
    "gla",
    "gated_deltanet",
    "log_linear_mamba2",
    "log_linear_gated_deltanet",
    "pow2",
    "pow2_ce",
    "sq1",
    "sq1_ce",
)
LONG_MIXERS = DEFAULT_MIXERS + ("local_attention", "dense_recurrence", "chacal", "log_linear")
FULL_MIXERS = LONG_MIXERS
CONV = "short_conv"
CONV_KERNEL = 4
EXTRAPOLATE = (2, 4)  # test lengths as multiples of the training length (those below the vocabulary)

VOCAB = 264  # > 4 x 64: the main cell is tested at 4x its length
POWER_A = 1.0  # uniform query gaps
NOISE = False  # filler positions hold 0, not random ids (which collide with keys at this vocabulary)
LOCAL_WINDOW = 16  # local attention's window: its cache is 16 positions at every length
# numerics only (every mode is exact): the chunk sizes whose steps are cheapest at L = 64
# (docs/notes/frontier.md: the delta rules' UT transform costs C^2 per token, ChaCAL's chunks C)
ROW_OVERRIDES = {
    "local_attention": {"window": LOCAL_WINDOW},
    "gated_deltanet": {"chunk_size": 16},
    "log_linear_gated_deltanet": {"chunk_size": 16},
    "chacal": {"chunk_size": 32},
}
MODEL = dict(n_heads=2, mlp=False, tie_weights=False, positions="none")
PAIRS_PER_LENGTH = 16  # num_kv_pairs = L / 16
LRS = (3e-3,)
SEEDS = (0, 1, 2)
# the protocol every row gets: first CURRICULUM_STEPS on instances its own layer reads in one hop,
# then MQAR (study/curricula.py; rows that read every position in one hop train on MQAR throughout).
# Each row is also trained on MQAR from the first step: the table's natural column
CURRICULUM = "one_hop"
CURRICULUM_STEPS = 1000
MAX_STEPS = 5500  # at L = 64 (``FrontierGrid.steps_at`` scales it for other lengths)
MIN_STEPS = 2000
PATIENCE_STEPS = 1000
MIN_GAIN = 0.02  # accuracy ...
MIN_LOSS_GAIN = 0.05  # ... or validation loss (nats): Mamba-2's fell 0.3 over its accuracy plateau (notes)
TRAIN = SyntheticTrainConfig(
    batch_size=64,
    steps=MAX_STEPS,
    warmup_steps=50,
    min_lr_ratio=1.0,
    train_examples=20_000,
    val_examples=512,
    test_examples=500,
    eval_every=100,
    early_stop_acc=0.99,
    patience_steps=PATIENCE_STEPS,
    min_gain=MIN_GAIN,
    min_loss_gain=MIN_LOSS_GAIN,
    min_steps=MIN_STEPS,
)
CELLS = (MAIN_CELL,)
LONG_CELLS = ((64, 32), (128, 64), (256, 64))  # same vocabulary: tested at 2x / 4x where below it

FULL_VOCAB = 8192  # zoology's
FULL_MODEL = dict(n_heads=2, mlp=True, tie_weights=True, positions="none")
FULL_CELLS = tuple((n, d) for n in (64, 128, 256, 512) for d in (64, 128, 256))
FULL_PAIRS_PER_LENGTH = 4
FULL_LRS = (3e-4, 1e-3, 3e-3, 1e-2)
FULL_SEEDS = (0, 1, 2)
FULL_TRAIN = SyntheticTrainConfig(
    batch_size=64,
    steps=20_000,
    warmup_steps=500,
    train_examples=100_000,
    val_examples=512,
    test_examples=3_000,
    eval_every=500,
    early_stop_acc=0.99,
    patience_steps=5000,
)


@dataclass(frozen=True)
class FrontierGrid:
    """One frontier sweep's settings.

    ``train`` is the budget at length ``base_length``; a cell at length L trains for
    ``steps_at(L)`` = steps x (L / base_length) ** ``length_scaling`` (and the budget-by-learning
    floors in proportion): 1 gives longer sequences, with more pairs, more steps; -1 gives every
    cell the same tokens (zoology's grid)."""

    vocab: int
    model: dict
    cells: tuple[tuple[int, int], ...]  # (training length, width)
    pairs_per_length: int  # num_kv_pairs = L / pairs_per_length
    lrs: tuple[float, ...]
    seeds: tuple[int, ...]
    train: SyntheticTrainConfig
    power_a: float = POWER_A  # query gaps: 1 uniform, zoology's 0.01 right after the context
    noise: bool = NOISE  # random ids at the filler positions (zoology's default)
    length_scaling: float = 1.0
    base_length: int = 64
    row_overrides: dict = field(default_factory=lambda: dict(ROW_OVERRIDES))  # mixer -> config fields
    curriculum: str = CURRICULUM  # the rule every row gets (study/curricula.py), its steps at base_length
    curriculum_steps: int = CURRICULUM_STEPS
    natural_column: bool = True  # also train each row whose curriculum changes its data without one

    def steps_at(self, length: int) -> int:
        return max(1, round(self.train.steps * (length / self.base_length) ** self.length_scaling))

    def train_at(self, length: int, lr: float) -> SyntheticTrainConfig:
        scale = self.steps_at(length) / self.train.steps
        return replace(
            self.train,
            lr=lr,
            steps=self.steps_at(length),
            min_steps=round(self.train.min_steps * scale),
            patience_steps=round(self.train.patience_steps * scale),
            test_lengths=tuple(k * length for k in EXTRAPOLATE if k * length < self.vocab),
        )

    def runs(self, mixers: Sequence[str]) -> list[SyntheticRunConfig]:
        """Every row under the grid's curriculum (column ``frontier_column``) and, where that curriculum
        changes a row's data, the row trained on MQAR from the first step (the column with ``NATURAL``
        after it)."""
        out = []
        for cfg in self._natural_runs(mixers):
            steps = round(self.curriculum_steps * cfg.train.steps / self.train.steps)
            taught = with_curriculum(cfg, self.curriculum, steps)
            out.append(taught)
            if taught is not cfg and self.natural_column:
                out.append(replace(cfg, column=cfg.column + NATURAL))
        return out

    def _natural_runs(self, mixers: Sequence[str]) -> list[SyntheticRunConfig]:
        return [
            SyntheticRunConfig(
                label=m,
                task="assoc_recall",
                column=frontier_column(n, d),
                seed=seed,
                task_args=dict(
                    vocab_size=self.vocab,
                    seq_len=n,
                    num_kv_pairs=n // self.pairs_per_length,
                    power_a=self.power_a,
                    random_non_queries=self.noise,
                ),
                model={
                    **self.model,
                    "d_model": d,
                    "layers": [CONV, m, CONV, m],
                    "mixer_overrides": {
                        CONV: {"kernel_size": CONV_KERNEL},
                        **({m: self.row_overrides[m]} if m in self.row_overrides else {}),
                    },
                },
                train=self.train_at(n, lr),
            )
            for seed in self.seeds
            for (n, d) in self.cells
            for lr in self.lrs
            for m in mixers
        ]


GRID = FrontierGrid(VOCAB, MODEL, CELLS, PAIRS_PER_LENGTH, LRS, SEEDS, TRAIN)
LONG_SEEDS = (0,)  # one seed: a long cell costs up to 4x the main cell's steps' time
LONG_GRID = replace(GRID, cells=LONG_CELLS, seeds=LONG_SEEDS, length_scaling=0.0)
FULL_GRID = FrontierGrid(
    FULL_VOCAB,
    FULL_MODEL,
    FULL_CELLS,
    FULL_PAIRS_PER_LENGTH,
    FULL_LRS,
    FULL_SEEDS,
    FULL_TRAIN,
    power_a=0.01,
    noise=True,
    length_scaling=-1.0,
    row_overrides={"local_attention": {"window": 32}},
)

NOTES = f"""\
MQAR generated as zoology does (random tokens between the queries) with uniform query gaps, vocabulary
{VOCAB}, pairs L/{PAIRS_PER_LENGTH} and no random ids at the filler positions, at the main cell L = {MAIN_CELL[0]},
d = {MAIN_CELL[1]}; every row is [short_conv
(kernel {CONV_KERNEL}), mixer] x 2 (local attention: window {LOCAL_WINDOW}), no MLP, untied head, no position code; lr
{LRS[0]:g} held after a {TRAIN.warmup_steps}-step warmup, seeds {list(SEEDS)}, batches of {TRAIN.batch_size}.
Curriculum ({CURRICULUM}): every row first trains {CURRICULUM_STEPS} steps on MQAR instances whose every query its own
layer reads at the value's position in one hop, then on MQAR (rows whose layer reads every position in one hop
train on MQAR throughout); each row whose data the curriculum changes is also trained on MQAR alone (the
"natural" column). Budget by learning (counted from the end of the curriculum): a run
stops once its validation has gained neither {100 * MIN_GAIN:.0f} points of accuracy nor {MIN_LOSS_GAIN} nats
of loss in {PATIENCE_STEPS}
steps, never before step {MIN_STEPS}, at most {MAX_STEPS} steps (or at {100 * TRAIN.early_stop_acc:.0f} %);
each checkpoint is also tested at
{" and ".join(f"{m}x" for m in EXTRAPOLATE)} its length. The claims are decided at the main cell after the
calibration (attention ≥ 95 %, zoology's anchor). Local attention, the paper's O(n) rows (dense recurrence,
ChaCAL) and log-linear attention are rows of `frontier_long` (add them here with --mixers). Longer sequences and the
second width: `frontier_long`; zoology's grid: `frontier_full`."""

LONG_NOTES = f"""\
The frontier's recipe (uniform gaps, pairs L/{PAIRS_PER_LENGTH}, [short_conv, mixer] x 2, budget by learning) at
(length, width) cells {list(LONG_CELLS)}, vocabulary {VOCAB} (the longer cells are tested at the multiples of
their length below it), seed {list(LONG_SEEDS)}; the same step budget at every length (a step at L = 256 costs
about four at 64). Hours on a CPU: resumable (rerun the
same command), with progress and an ETA."""

FULL_NOTES = f"""\
zoology's MQAR grid: vocabulary {FULL_VOCAB}, power-law query gaps, (length, width) cells {list(FULL_CELLS)},
pairs L/{FULL_PAIRS_PER_LENGTH}; every row [short_conv (kernel {CONV_KERNEL}), mixer] x 2 with MLPs, tied embeddings, no
position code; lrs {list(FULL_LRS)}, seeds {list(FULL_SEEDS)}, batches of {FULL_TRAIN.batch_size},
{FULL_TRAIN.steps} steps at L = 64
and fewer in proportion at longer L, patience {FULL_TRAIN.patience_steps} steps; tested at
{" and ".join(f"{m}x" for m in EXTRAPOLATE)} the training length. Meant for `--device cuda`."""


def frontier(extra_mixers: Sequence[str] = ()) -> list[SyntheticRunConfig]:
    return GRID.runs(preset_rows(DEFAULT_MIXERS, extra_mixers))


def frontier_long(extra_mixers: Sequence[str] = ()) -> list[SyntheticRunConfig]:
    return LONG_GRID.runs(preset_rows(LONG_MIXERS, extra_mixers))


def frontier_full(extra_mixers: Sequence[str] = ()) -> list[SyntheticRunConfig]:
    return FULL_GRID.runs(preset_rows(FULL_MIXERS, extra_mixers))


PRESET = register_preset(
    Preset(
        name="frontier",
        kind="compare",
        build=frontier,
        notes=NOTES,
        default_mixers=DEFAULT_MIXERS,
        source=__name__,
        summary="MQAR at L = 64, d = 64, three seeds, every row to its plateau after the one-hop curriculum and "
        "without it: accuracy vs state, accuracy by read, the frontier's claims decided "
        f"({stated('compare frontier')})",
        report_section=frontier_section,
    )
)
LONG = register_preset(
    Preset(
        name="frontier_long",
        kind="compare",
        build=frontier_long,
        notes=LONG_NOTES,
        default_mixers=LONG_MIXERS,
        source=__name__,
        report_section=frontier_section,
        summary="the frontier at L = 128 and 256 and at width 32, budgets by learning (hours on a CPU, resumable)",
    )
)
FULL = register_preset(
    Preset(
        name="frontier_full",
        kind="compare",
        build=frontier_full,
        notes=FULL_NOTES,
        default_mixers=FULL_MIXERS,
        source=__name__,
        report_section=frontier_section,
        summary="zoology's full MQAR grid (vocab 8192, lengths 64-512, widths 64-256, 4 lrs, 3 seeds): GPU",
    )
)
