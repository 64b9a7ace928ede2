"""Entity tracking accuracy vs depth (ChaCAL's claim, framework §6.2): a 1-layer dense recurrence
(and ChaCAL) follows n state changes that attention (B = 0) needs ceil(log2(n + 1)) layers for.

Rows: ``dense_recurrence x1``, ``chacal x1`` and ``attention xL`` for L = 1 .. 4 (plus
``extra_mixers`` at one layer); one column per n: n = 3 (bound 2 layers) and n = 4 (bound 3). The
known attention solution, pointer doubling, needs ceil(log2(n + 2)) = 3 layers for both (the ASK is
one more link; ``compare.doubling_layers``), within the 4 layers of the grid.
Two chains per example; every box is asked (depths 0 .. n, the shallow questions are a curriculum
inside each example: one lookup, which the deep answers compose) and only the questions about each
chain's last box (depth n) are scored, so the guessing level is 50 % (one of the two objects).
Width 64, one head, no position code (the task needs none: every box is set once, so "the event
that set box b" is found by content alone), untied head, no MLP; learning rates 3e-3 and 1e-2 (max
over them on validation), three seeds, up to 2500 steps of 32 sequences (early stop at 99 %).

Development runs (seed 0, validation accuracy on the depth-n questions; runs/ of the branch that
made this preset): the dense recurrence left the 50 % plateau abruptly, at step ~650 for n = 3 and
~900 for n = 4, but not in 2000 steps for n = 5 nor in 3000 for n = 7 (learning rates 3e-3 and
1e-2), hence n = 3 and 4 here (bounds 2 and 3). Attention with 1-3 layers and ChaCAL (discount
initialised at 0.5 or 0.9) stayed at 50 % for n = 3 through 1500 steps. Those runs had learned
positions, which are what kept ChaCAL at the guess (seed 0, n = 3, lr 3e-3, validation accuracy by
question depth 0 / 1 / 2 / 3 after 1500 steps): with learned positions 50 / 51 / 46 / 49 (two heads
and an MLP: 81 / 51 / 49 / 50); without a position code 100 / 100 / 100 / 100 from step 500 on, with
or without the second head and the MLP (n = 4: every depth at 100 % from step 1000). In the
learned-position run ChaCAL's mean self-weight p_ii fell from 0.16 to 0.001 within 200 steps, at
the PUTs from 0.42 to 0.000 by step 500, and the attention mass on the event a token must read (a
PUT itself, else the setter of its box) stayed at 0.20; without positions the PUTs' self-weight rose
to 0.99 and that mass to 0.95 by step 500: the exact solution, in which a PUT reading only itself
outputs its object and every later event passes it on. Attention without positions learned what it
learned with them (depth_long's development runs), so the preset has none.

Measured 2026-12-01 on the shared 2-core machine (``OMP_WAIT_POLICY=PASSIVE tokenmix compare --preset
depth``): 72 runs, 21:04 wall, 2400 CPU s. Test accuracy on the depth-n questions, n = 3 / n = 4:
dense_recurrence x1 99.8 / 99.7, chacal x1 99.9 / 99.7 (early stops at ~500 and ~1200 steps),
attention x1..x4 49.4-50.7 in both columns (the one-link questions answered, nothing that composes).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from tokenmix.training.harness import RunConfig, TrainConfig
from tokenmix.training.presets import registered

CHANGES = (3, 4)
ONE_LAYER = ("dense_recurrence", "chacal")
MAX_ATTENTION_LAYERS = max(math.ceil(math.log2(n + 1)) for n in CHANGES) + 1  # one past the largest bound
MODEL = dict(d_model=64, n_heads=1, mlp=False, tie_weights=False, positions="none", max_seq_len=32)
LRS = (3e-3, 1e-2)
TRAIN = TrainConfig(steps=2500, batch_size=32, warmup_steps=50, train_examples=10_000, val_examples=256,
                    test_examples=1_000, eval_every=50, early_stop_acc=0.99)
TRAIN_MODE = {"dense_recurrence": "dense"}  # the cheapest exact mode at these lengths
SEEDS = (0, 1, 2)

NOTES = """\
Entity tracking with two chains; only the depth-n questions are scored (guessing: 50 %). The bound
ceil(log2(n + 1)) is a lower bound for attention: fewer layers cannot follow n changes, more layers
need not learn to. Within this preset's budget "cannot" and "has not learned yet" look alike; the
claims' notes flag runs still improving at the end of their budget."""


def task_args(n: int) -> dict:
    return dict(num_changes=n, num_chains=2, num_boxes=2 * (n + 1), num_objects=8, ask_all_boxes=True,
                score_deepest=True)


def rows(extra_mixers: Sequence[str] = ()) -> list[tuple[str, str, int]]:
    """(label, mixer, layers) of every row."""
    one = registered(ONE_LAYER)[0] + [m for m in extra_mixers if m not in ONE_LAYER]
    return ([(f"{m} x1", m, 1) for m in one]
            + [(f"attention x{layers}", "attention", layers) for layers in range(1, MAX_ATTENTION_LAYERS + 1)])


def depth(extra_mixers: Sequence[str] = ()) -> list[RunConfig]:
    return [RunConfig(label=label, task="entity_tracking", task_args=task_args(n), column=f"entity n={n}",
                      model={**MODEL, "layers": [mixer] * layers},
                      train=replace(TRAIN, lr=lr, mode=TRAIN_MODE.get(mixer)), seed=seed)
            for seed in SEEDS for n in CHANGES for lr in LRS for label, mixer, layers in rows(extra_mixers)]
