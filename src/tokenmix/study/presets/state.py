"""State tracking: parity and the A5 word problem, trained at length 16, tested at 16 and 64 (~30 min on 2 cores).

The column where the 2025-26 mixers differ most from the older ones. Published claims it puts to
the test: negative eigenvalues let the delta rule track parity (Grazzi et al. 2025, "Unlocking state
tracking in linear RNNs through negative eigenvalues"); DeltaProduct with n_h >= 2 Householder steps
per token and PaTH's data-dependent Householder transforms track non-solvable groups that diagonal /
gated linear recurrences cannot (Siems et al. 2025; Yang et al. 2025). A5 (60 elements, even
permutations of 5) is non-solvable like S5 and every element is a product of two reflections, so
n_h = 2 can write one per token; S5 needs more. Every row is two layers of its mixer with an MLP,
width 32, one head, no position code (so the 4x test length is an extrapolation, not an unseen
position embedding); two learning rates (max over them by validation), three seeds.

What a longer budget changes: at 600 steps of 32 sequences the harder rows may still be rising (the
report flags runs whose validation curve still rose at the end); ``state_long`` style budgets
(more steps, patience) or zoology's longer curriculum would separate "cannot" from "not yet".
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from tokenmix.runs.synthetic import SyntheticRunConfig, SyntheticTrainConfig
from tokenmix.study.presets.base import Preset, register_preset, registered

TRAIN_LEN, TEST_LENGTHS = 16, (64,)
TASKS = {"parity": dict(group="parity", seq_len=TRAIN_LEN), "A5": dict(group="A5", seq_len=TRAIN_LEN)}
LRS = (1e-3, 3e-3)
SEEDS = (0, 1, 2)
STEPS = 600
MODEL = dict(d_model=32, n_heads=1, mlp=True, tie_weights=False, positions="none")
TRAIN = SyntheticTrainConfig(batch_size=32, steps=STEPS, warmup_steps=50, train_examples=20_000, val_examples=256,
                             test_examples=512, eval_every=100, early_stop_acc=0.99, test_lengths=TEST_LENGTHS)

# row label -> (mixer, config overrides); variants of one mixer are rows of their own
ROWS: dict[str, tuple[str, dict]] = {
    "attention": ("attention", {}),
    "mamba2": ("mamba2", {}),
    "gla": ("gla", {}),
    "deltanet": ("deltanet", {}),
    "gated_deltanet": ("gated_deltanet", {}),
    "gated_deltanet (neg. eig.)": ("gated_deltanet", {"allow_neg_eigval": True}),
    "gated_delta_product n_h=1": ("gated_delta_product", {"n_h": 1, "allow_neg_eigval": True}),
    "gated_delta_product n_h=2": ("gated_delta_product", {"n_h": 2, "allow_neg_eigval": True}),
    "gated_delta_product n_h=3": ("gated_delta_product", {"n_h": 3, "allow_neg_eigval": True}),
    "path_attention": ("path_attention", {}),
    "rg_lru": ("rg_lru", {}),
    "pow2": ("pow2", {}),
    "sq1": ("sq1", {}),
    "dense_recurrence": ("dense_recurrence", {}),
    "chacal": ("chacal", {}),
}
DEFAULT_MIXERS = tuple(dict.fromkeys(mixer for mixer, _ in ROWS.values()))

NOTES = f"""\
Group state tracking (tasks/state_tracking.py): every position's label is the running product of the
group elements so far. Trained at length {TRAIN_LEN}, tested at {TRAIN_LEN} and {', '.join(map(str, TEST_LENGTHS))} (the
"@{TEST_LENGTHS[0]}" columns), no position code. Each row: two layers of its mixer, MLP, width 32, one head;
lr in {LRS} (best by validation), seeds {SEEDS}, at most {STEPS} steps of 32 sequences. Negative-eigenvalue
variants use beta in (0, 2) (allow_neg_eigval); DeltaProduct rows differ only in n_h. The uniform guess
is 50 % on parity and 1/60 = 1.7 % on A5."""


def _model(mixer: str, overrides: dict) -> dict:
    return {**MODEL, "layers": [mixer, mixer], "mixer_overrides": {mixer: overrides} if overrides else {}}


def state(extra_mixers: Sequence[str] = ()) -> list[SyntheticRunConfig]:
    known = set(registered(DEFAULT_MIXERS)[0])
    rows = {label: spec for label, spec in ROWS.items() if spec[0] in known}
    rows.update({m: (m, {}) for m in extra_mixers if m not in rows})
    return [SyntheticRunConfig(label=label, task="state_tracking", task_args=args, model=_model(mixer, overrides),
                               train=replace(TRAIN, lr=lr), seed=seed, column=column)
            for seed in SEEDS for column, args in TASKS.items() for lr in LRS
            for label, (mixer, overrides) in rows.items()]


PRESET = register_preset(Preset(name="state", kind="compare", build=state, notes=NOTES, default_mixers=DEFAULT_MIXERS,
                                summary="state tracking: parity and A5, trained at 16, tested at 16 and 64 (~30 min)",
                                source=__name__))
