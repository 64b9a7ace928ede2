"""State tracking: parity and the A5 word problem, trained at length 16, tested at 16 and 64 (≤ 60 min on 2 cores).

The column where the 2025-26 mixers differ most from the older ones. Published claims it puts to
the test: negative eigenvalues let the delta rule track parity (Grazzi et al. 2025, "Unlocking state
tracking in linear RNNs through negative eigenvalues"); DeltaProduct with n_h >= 2 Householder steps
per token and PaTH's data-dependent Householder transforms track non-solvable groups that diagonal /
gated linear recurrences cannot (Siems et al. 2025; Yang et al. 2025). A5 (60 elements, even
permutations of 5) is non-solvable like S5 and every element is a product of two reflections, so
n_h = 2 can write one per token; S5 needs more. Every row is two layers of its mixer with an MLP,
width 32, one head, no position code (so the 4x test length is an extrapolation, not an unseen
position embedding); two learning rates (max over them by validation), three seeds.

Budget by learning (``SyntheticTrainConfig``'s patience fields), as the frontier's: a run stops once
its validation has gained neither ``MIN_GAIN`` of accuracy nor ``MIN_LOSS_GAIN`` of loss in
``PATIENCE_STEPS`` steps, never before ``MIN_STEPS``, at most ``STEPS``; parity's rows reach their plateau
(or 99 %) well inside it. The
claims (``study/state.py``) are decided at the training length; a group no row learns within the
budget leaves its claims "untested", with the runs' curves as the evidence (development runs of
DeltaProduct and PaTH on A5, 5000-8000 steps at widths 32 and 64, lengths 8 and 16, both learning
rates: docs/notes/frontier.md).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from tokenmix.runs.synthetic import SyntheticRunConfig, SyntheticTrainConfig
from tokenmix.study.curricula import with_curriculum
from tokenmix.study.durations import stated
from tokenmix.study.presets.base import Preset, register_preset, registered
from tokenmix.study.state import A5, DELTA, DELTA_NEG, PARITY, PATH, PRODUCT, state_section

TRAIN_LEN, TEST_LENGTHS = 16, (64,)
TASKS = {PARITY: dict(group="parity", seq_len=TRAIN_LEN), A5: dict(group="A5", seq_len=TRAIN_LEN)}
# every row's A5 runs start with a length curriculum (the usual remedy: short products first), parity's
# reach their plateau without one (study/curricula.py)
CURRICULA = {A5: ("length", 1000)}
LRS = (1e-3, 3e-3)
SEEDS = (0, 1, 2)
STEPS = 4000
MIN_STEPS = 2000
PATIENCE_STEPS = 1000
MIN_GAIN = 0.02
MIN_LOSS_GAIN = 0.05  # nats of validation loss that also count as a gain (as the frontier's)
MODEL = dict(d_model=32, n_heads=1, mlp=True, tie_weights=False, positions="none")
TRAIN = SyntheticTrainConfig(
    batch_size=32,
    steps=STEPS,
    warmup_steps=50,
    train_examples=20_000,
    val_examples=256,
    test_examples=512,
    eval_every=100,
    early_stop_acc=0.99,
    test_lengths=TEST_LENGTHS,
    patience_steps=PATIENCE_STEPS,
    min_gain=MIN_GAIN,
    min_loss_gain=MIN_LOSS_GAIN,
    min_steps=MIN_STEPS,
)

# row label -> (mixer, config overrides); variants of one mixer are rows of their own
ROWS: dict[str, tuple[str, dict]] = {
    "attention": ("attention", {}),
    "mamba2": ("mamba2", {}),
    "gla": ("gla", {}),
    "deltanet": ("deltanet", {}),
    DELTA: ("gated_deltanet", {}),
    DELTA_NEG: ("gated_deltanet", {"allow_neg_eigval": True}),
    **{PRODUCT.format(n): ("gated_delta_product", {"n_h": n, "allow_neg_eigval": True}) for n in (1, 2, 3)},
    PATH: ("path_attention", {}),
    "rg_lru": ("rg_lru", {}),
    "pow2": ("pow2", {}),
    "sq1": ("sq1", {}),
    "dense_recurrence": ("dense_recurrence", {}),
    "chacal": ("chacal", {}),
}
DEFAULT_MIXERS = tuple(dict.fromkeys(mixer for mixer, _ in ROWS.values()))

NOTES = f"""\
Group state tracking (tasks/state_tracking.py): every position's label is the running product of the
group elements so far. Trained at length {TRAIN_LEN}, tested at {TRAIN_LEN} and {", ".join(map(str, TEST_LENGTHS))} (the
"@{TEST_LENGTHS[0]}" columns), no position code. Each row: two layers of its mixer, MLP, width 32, one head;
lr in {LRS} (best by validation), seeds {SEEDS}; budget by learning: batches of 32, a run stops once its
validation gained neither {100 * MIN_GAIN:.0f} points of accuracy nor {MIN_LOSS_GAIN} nats of loss in
{PATIENCE_STEPS} steps, never before
step {MIN_STEPS}, at most {STEPS} steps; A5's runs first train {CURRICULA[A5][1]} steps at half the length
({TRAIN_LEN // 2}): a length curriculum (the patience counts from its end). Negative-eigenvalue variants
use beta in (0, 2) (allow_neg_eigval);
DeltaProduct rows
differ only in n_h. Guessing levels: the first label is the first input itself, so copying it and
guessing uniformly elsewhere gives 53.1 % on parity and 7.8 % on A5 at length 16."""


def _model(mixer: str, overrides: dict) -> dict:
    return {**MODEL, "layers": [mixer, mixer], "mixer_overrides": {mixer: overrides} if overrides else {}}


def state(extra_mixers: Sequence[str] = ()) -> list[SyntheticRunConfig]:
    known = set(registered(DEFAULT_MIXERS)[0])
    rows = {label: spec for label, spec in ROWS.items() if spec[0] in known}
    rows.update({m: (m, {}) for m in extra_mixers if m not in rows})
    return [
        with_curriculum(
            SyntheticRunConfig(
                label=label,
                task="state_tracking",
                task_args=args,
                model=_model(mixer, overrides),
                train=replace(TRAIN, lr=lr),
                seed=seed,
                column=column,
            ),
            *CURRICULA.get(column, ("natural", 0)),
        )
        for seed in SEEDS
        for column, args in TASKS.items()
        for lr in LRS
        for label, (mixer, overrides) in rows.items()
    ]


PRESET = register_preset(
    Preset(
        name="state",
        kind="compare",
        build=state,
        notes=NOTES,
        default_mixers=DEFAULT_MIXERS,
        summary="state tracking: parity and A5, trained at 16, tested at 16 and 64, the published "
        f"claims decided ({stated('compare state')})",
        source=__name__,
        report_section=state_section,
    )
)
