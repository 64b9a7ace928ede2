"""Multi-query associative recall (MQAR), generated exactly as zoology's ``multiquery_ar``
(Arora et al. 2023, HazyResearch/zoology ``zoology/data/multiquery_ar.py``).

Generator, per example (``numpy.random.RandomState(seed)``, the same draws in the same order as
zoology's ``np.random.seed(seed)`` + ``np.random.choice``):
    1. keys: ``num_kv_pairs`` distinct ids from [1, V/2); values: as many distinct ids from [V/2, V).
    2. context: key_0 value_0 key_1 value_1 ... (2·kv tokens), repeated ``num_passes`` times
       (JRT-style repetition; zoology's default is one pass).
    3. queries: the remaining L − context positions hold (L − context)/2 gap slots at even offsets;
       kv slots are drawn without replacement with p(g) ∝ a·g^(a−1), a = ``power_a`` (0.01), so
       queries cluster right after the context. Slot g holds key_i at offset 2g.
    4. labels: −100 everywhere except at each query position, whose label is the bound value
       (the token the model must emit next).
    5. filler: the remaining positions are 0; with ``random_non_queries`` (zoology's default) they
       are replaced by uniform random ids in [0, V) (drawn from ``torch.Generator`` seeded with seed).

Constraints (zoology's asserts): L even, V > L, 2·kv·passes + 2·kv ≤ L.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from tokenmix.tasks.base import IGNORE_INDEX, TaskConfig, TaskData, positive, register_task, require

RANK_GUESS_EXAMPLES = 2000  # enough for the rank guess's accuracy to ±1 point at 4 pairs


@register_task
@dataclass(frozen=True)
class AssocRecallConfig(TaskConfig):
    name = "assoc_recall"

    vocab_size: int = 8192
    seq_len: int = 64
    num_kv_pairs: int = 4
    power_a: float = 0.01
    num_passes: int = 1
    random_non_queries: bool = True

    def __post_init__(self) -> None:
        positive(
            self.name,
            vocab_size=self.vocab_size,
            seq_len=self.seq_len,
            num_kv_pairs=self.num_kv_pairs,
            num_passes=self.num_passes,
        )
        require(self.seq_len % 2 == 0, self.name, "'seq_len even'", f"seq_len={self.seq_len}")
        require(
            self.vocab_size > self.seq_len,
            self.name,
            "'vocab_size > seq_len'",
            f"vocab_size={self.vocab_size}, seq_len={self.seq_len}",
        )
        need = 2 * self.num_kv_pairs * self.num_passes + 2 * self.num_kv_pairs
        require(
            need <= self.seq_len,
            self.name,
            "'2*num_kv_pairs*num_passes + 2*num_kv_pairs <= seq_len'",
            f"{need} > {self.seq_len}",
        )
        require(
            self.num_kv_pairs < self.vocab_size // 2,
            self.name,
            "'num_kv_pairs < vocab_size/2 - 1'",
            f"{self.num_kv_pairs} distinct keys from {self.vocab_size // 2 - 1} key ids",
        )
        require(0.0 < self.power_a <= 1.0, self.name, "'0 < power_a <= 1'", f"power_a={self.power_a}")

    def baselines(self) -> dict[str, float]:
        return {
            "uniform value": 1 / (self.vocab_size - self.vocab_size // 2),
            "a value of the context": 1 / self.num_kv_pairs,
            "the value of the pair ranked as the query": rank_guess(self),
        }

    def _generate(self, num_examples: int, seed: int) -> TaskData:
        rng = np.random.RandomState(seed)
        v, length, kv = self.vocab_size, self.seq_len, self.num_kv_pairs
        context_size = kv * 2 * self.num_passes

        key_vocab_size = v // 2
        key_choices = np.arange(1, key_vocab_size)
        value_choices = np.arange(key_vocab_size, v)
        keys = np.apply_along_axis(rng.choice, 1, np.tile(key_choices, (num_examples, 1)), replace=False, size=kv)
        values = np.apply_along_axis(rng.choice, 1, np.tile(value_choices, (num_examples, 1)), replace=False, size=kv)

        kvs = np.zeros((num_examples, kv * 2), dtype=np.int64)
        kvs[:, 0::2] = keys
        kvs[:, 1::2] = values
        kvs = np.tile(kvs, (1, self.num_passes))

        # power law over gap slots: queries are more likely right after the context
        space = (length - context_size) // 2
        p = self.power_a * np.arange(1, space + 1) ** (self.power_a - 1)
        p = p / p.sum()
        slots = np.stack([np.arange(space, dtype=int)] * num_examples)
        gaps = np.apply_along_axis(rng.choice, 1, slots, replace=False, p=p, size=kv)

        queries = np.zeros((num_examples, length - context_size + 1), dtype=np.int64)
        np.put_along_axis(queries, gaps * 2, values=keys, axis=1)
        examples = np.concatenate([kvs, queries], axis=1)

        labels = np.full((num_examples, length + 1), IGNORE_INDEX, dtype=np.int64)
        np.put_along_axis(labels, gaps * 2 + context_size + 1, values=values, axis=1)

        inputs = torch.tensor(examples[:, :-1])
        labels_t = torch.tensor(labels[:, 1:])
        if self.random_non_queries:
            gen = torch.Generator().manual_seed(seed)
            noise = torch.randint(v, size=inputs.shape, generator=gen)
            inputs = torch.where(inputs == 0, noise, inputs)
        return TaskData(inputs, labels_t)


@lru_cache(maxsize=None)
def rank_guess(config: AssocRecallConfig) -> float:
    """Accuracy of answering the r-th query (in position order) with the value of the r-th pair of the
    context, a guess that reads positions only, never a key.

    It beats "a value of the context" because the generator draws the query slots key by key with a
    power law that favours early slots, so queries tend to come in the keys' order (4 pairs at
    length 32, zoology's a = 0.01: about 30 % against 25 %; a = 1, uniform slots: 1 / kv). Estimated
    on ``RANK_GUESS_EXAMPLES`` examples of a fixed seed: a property of the generator, not of a split.
    """
    data = config.build(RANK_GUESS_EXAMPLES, seed=0)
    hits = total = 0
    for inputs, scored in zip(data.inputs.tolist(), data.scored.tolist()):
        for rank, q in enumerate(i for i, s in enumerate(scored) if s):
            total += 1
            hits += inputs.index(inputs[q]) == 2 * rank  # the queried key's place in the context
    return hits / max(total, 1)
