"""`tokenmix compare` default: the paper's table (framework §5.1) at CPU size, ≤ 10 minutes on 2 cores.

Rows: the nine structures of the paper's Table 1 (plus ``extra_mixers``), each as a 2-layer model
without MLP (zoology's MQAR setting) of width 32, trained from scratch on each of copy,
associative recall (MQAR) and 2-hop recall at length 32, one learning rate, three seeds.
Budget: 600 steps of 32 sequences per run at most (early stop at 99 % validation accuracy), which
is far from convergence for recall: the numbers rank early learning speed at equal budget.

Cost (one thread, free core): 6–12 ms per step for the attention and pattern rows, about 20 ms
for the dense recurrence and 47 ms for the diagonal SSM (N = 16 states per channel); 81 runs on
two worker processes take about 7 minutes. Sizes were chosen for that cost and so that the copy
offset needs the same number of hops in pow2 (20 = 16 + 4) and sq1 (20 = 10 + 10) and lies beyond
local attention's reach (window 8, two layers: 14 positions). Nothing was tuned on a test set.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from tokenmix.training.harness import RunConfig, TrainConfig
from tokenmix.training.presets import registered

DEFAULT_MIXERS = ("attention", "local_attention", "diag_ssm", "kth_order", "dense_recurrence",
                  "pow2", "pow2_ce", "sq1", "sq1_ce")

TASKS = {
    "copy": dict(vocab_size=16, seq_len=32, copy_len=12, offset=20),
    "assoc_recall": dict(vocab_size=64, seq_len=32, num_kv_pairs=4, random_non_queries=False),
    "multi_hop": dict(vocab_size=64, seq_len=32, num_chains=3, hops=2),
}
LAYERS = 2
MODEL = dict(d_model=32, n_heads=2, mlp=False)
MIXER_OVERRIDES = {"local_attention": {"window": 8},
                   "diag_ssm": {"chunk_size": 8}}  # same function as the default chunks, faster at n = 32
# the fastest exact mode per mixer at this length (all modes compute the same function)
TRAIN_MODE = {"dense_recurrence": "dense"}
TRAIN = TrainConfig(lr=3e-3, steps=600, batch_size=32, warmup_steps=50, train_examples=10_000,
                    val_examples=256, test_examples=1_000, eval_every=50, early_stop_acc=0.99)
SEEDS = (0, 1, 2)


def model_for(mixer: str, layers: int = LAYERS) -> dict:
    overrides = {mixer: MIXER_OVERRIDES[mixer]} if mixer in MIXER_OVERRIDES else {}
    return {**MODEL, "layers": [mixer] * layers, "mixer_overrides": overrides}


def quick(extra_mixers: Sequence[str] = ()) -> list[RunConfig]:
    mixers = registered(DEFAULT_MIXERS)[0] + [m for m in extra_mixers if m not in DEFAULT_MIXERS]
    return [RunConfig(label=m, task=task, task_args=args, model=model_for(m),
                      train=replace(TRAIN, mode=TRAIN_MODE.get(m)), seed=seed)
            for seed in SEEDS for task, args in TASKS.items() for m in mixers]
