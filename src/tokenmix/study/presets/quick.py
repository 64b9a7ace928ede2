"""`tokenmix compare` default: the paper's table (framework §5.1) at CPU size, ≤ 10 minutes on 2 cores.

Rows: the nine structures of the paper's Table 1 (plus ``extra_mixers``); the paper's "Diagonal SSM"
is ``first_order``. Tasks at length 32: copy (6 symbols, offset 26), MQAR (4 pairs) and 2-hop recall;
three seeds. Every row is [token shift, row mixer]: a window-2 local attention (window 3 on MQAR) then
the row's mixer, width 32, one head, learned positions, untied head, no MLP (local attention: two
window-8 layers). Why: the shift gives every row the previous-token binding it otherwise learns late;
offset 26 = 5² + 1 is one sq1 hop and three pow2 hops, so copy separates the patterns (the lattice
variants route 3 of 6 answers through free positions); window 3 on MQAR puts the key-value binding at
both parities, so even pattern distances can read it. Copy and multi-hop take the better of lr 3e-3
and 1e-2 (≤ 100 / 250 steps); MQAR one rate, 3e-3, held constant for 800 steps. Structured rows train
in dense mode, the cheapest exact mode at n = 32.

Development runs and measurements: docs/notes/compare-presets.md; results: docs/results.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from tokenmix.runs.synthetic import SyntheticRunConfig, SyntheticTrainConfig
from tokenmix.study.durations import stated
from tokenmix.study.paper import PAPER_ROWS
from tokenmix.study.presets.base import Preset, preset_rows, register_preset
from tokenmix.tasks import CompareRecipe, compared_tasks, get_task_cls

DEFAULT_MIXERS = PAPER_ROWS  # the paper's rows, in its table order

# the columns: every registered task with a CompareRecipe (tasks/*.py: sizes, steps, learning rates, the
# shift's window), in registration order -- copy, MQAR, multi-hop; a task registered with a recipe joins
SEEDS = (0, 1, 2)
DEFAULT_STEPS = 200  # a task without a recipe (trained by `tokenmix design --train`)

SHIFT = "local_attention"  # block 1 of every row but local attention's own
LOCAL_WINDOW = 8
MODEL = dict(d_model=32, n_heads=1, mlp=False, tie_weights=False, positions="learned", max_seq_len=32)
MIXER_OVERRIDES: dict[str, dict] = {"local_attention": {"window": LOCAL_WINDOW}}
STRUCTURED = ("first_order", "kth_order", "dense_recurrence", "pow2", "pow2_ce", "sq1", "sq1_ce")
TRAIN = SyntheticTrainConfig(
    batch_size=64,
    warmup_steps=50,
    train_examples=10_000,
    val_examples=256,
    test_examples=1_000,
    eval_every=50,
    early_stop_acc=0.99,
)

NOTES = """\
Recipe: every row is [window-2 local attention, row mixer] (window 3 on MQAR; local attention:
two window-8 layers), width 32, one head, learned positions, untied head, no MLP; see
`docs/notes/compare-presets.md` for why
(each choice was made on validation accuracy of development runs).

What each task tests here: copy at offset 26 is one hop for sq1 (26 = 5² + 1) and three for pow2
(16 + 8 + 2, also after the shift's hop of 1), so the theory predicts sq1 ≥ pow2; the lattice
variants route only 3 of the 6 answers through free positions, the exact patterns all 6. Local
attention reaches 14 positions < 26. MQAR needs a key found anywhere in the context: in one
pattern layer only the queries that read a position holding their key and its value (behind the
window-3 shift: the value's position and the next) can be answered by content (the report gives
the fraction per row). In development runs the pattern rows reached 27-41 % against the 25 %
plateau, but only partly through those reads, and a positional prior (the query's rank) is worth
about 30 %: recall claims between pattern rows compare small margins at this size.
Multi-hop needs two lookups composed, which one attention layer behind a token shift cannot do
and a dense recurrence does in one layer.

Scale: the paper's sizes, steps and widths are unknown (framework §5.1); this preset trains for at
most 100-800 steps of 64 sequences, so "not learned yet" and "cannot" both show as low accuracy:
the claims' notes flag runs still improving at the end of their budget."""


def model_for(mixer: str, task: str | None = None) -> dict:
    """The row recipe: a token shift (window 2; 3 on MQAR), then the row's mixer (local attention:
    two windows of 8)."""
    if mixer == SHIFT:
        return {**MODEL, "layers": [mixer, mixer], "mixer_overrides": {mixer: MIXER_OVERRIDES[mixer]}}
    overrides = {SHIFT: {"window": recipe_of(task).shift_window}}
    if mixer in MIXER_OVERRIDES:
        overrides[mixer] = MIXER_OVERRIDES[mixer]
    return {**MODEL, "layers": [SHIFT, mixer], "mixer_overrides": overrides}


def recipe_of(task: str | None) -> CompareRecipe:
    """The task's recipe; tasks without one (a design run's) get a default: shift window 2, 200 steps."""
    if task is not None and get_task_cls(task).recipe is not None:
        return get_task_cls(task).recipe
    return CompareRecipe({}, steps=DEFAULT_STEPS)


def train_for(mixer: str, task: str, lr: float) -> SyntheticTrainConfig:
    # dense mode materialises A, B and solves: at n = 32 the cheapest exact mode of the structured
    # rows (the shift layer has a dense mode too); other rows keep their fast default
    recipe = recipe_of(task)
    return replace(
        TRAIN,
        lr=lr,
        steps=recipe.steps,
        min_lr_ratio=TRAIN.min_lr_ratio if recipe.min_lr_ratio is None else recipe.min_lr_ratio,
        mode="dense" if mixer in STRUCTURED else None,
    )


def quick(extra_mixers: Sequence[str] = ()) -> list[SyntheticRunConfig]:
    mixers = preset_rows(DEFAULT_MIXERS, extra_mixers)
    recipes = compared_tasks()
    return [
        SyntheticRunConfig(
            label=m,
            task=task,
            task_args=dict(recipe.args),
            model=model_for(m, task),
            train=train_for(m, task, lr),
            seed=seed,
        )
        for seed in SEEDS
        for task, recipe in recipes.items()
        for lr in recipe.lrs
        for m in mixers
    ]


PRESET = register_preset(
    Preset(
        name="quick",
        kind="compare",
        summary=f"the paper's rows on copy / MQAR / multi-hop at length 32, three seeds ({stated('compare quick')})",
        build=quick,
        notes=NOTES,
        default_mixers=DEFAULT_MIXERS,
        source=__name__,
    )
)
