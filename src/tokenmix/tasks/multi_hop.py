"""Multi-hop recall: chained key -> value lookups, answered after h hops (default 2).

Each example holds ``num_chains`` disjoint chains e_0 -> e_1 -> ... -> e_h of distinct entity ids
from [1, V). Every link is written as two tokens ``e_i e_{i+1}`` (a key, then its value, as in
MQAR); the query ``e_0`` must be answered with ``e_h``, which takes h successive lookups.

Generator, per example (``numpy.random.default_rng(seed)``):
    1. draw num_chains·(h+1) distinct entities and cut them into chains;
    2. context: the num_chains·h links in a random interleaving of the chains. With
       ``causal_order`` (default) the links of one chain appear last hop first
       (e_{h-1} e_h, ..., e_0 e_1), so every link refers to a fact already seen: a reader going
       left to right can resolve each chain as it goes, the setting of ChaCAL's entity tracking.
       Without it the links of a chain are shuffled too.
    3. queries: e_0 of every chain, at distinct uniformly drawn even offsets of the remaining
       (L − context) positions; filler positions are 0. With ``shallow_queries`` every chain's
       e_1 .. e_{h-1} are asked too (fewer hops to the same end e_h): trained on, not scored
       (``score_mask`` keeps the h-hop answers). They teach the one-hop lookup the h-hop answer is
       composed of, as ``entity_tracking``'s ``ask_all_boxes`` does for its chains.
    4. labels: e_h at each query position, −100 elsewhere.

Constraints: L even, 2·chains·h + 2·queries ≤ L (queries = chains, or chains·h with shallow
queries), chains·(h+1) ≤ V − 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tokenmix.tasks.base import IGNORE_INDEX, CompareRecipe, TaskConfig, TaskData, positive, register_task, require


@register_task
@dataclass(frozen=True)
class MultiHopConfig(TaskConfig):
    name = "multi_hop"
    recipe = CompareRecipe(dict(vocab_size=64, seq_len=32, num_chains=3, hops=2, shallow_queries=True), steps=250)

    vocab_size: int = 128
    seq_len: int = 64
    num_chains: int = 4
    hops: int = 2
    causal_order: bool = True
    shallow_queries: bool = False  # also ask e_1 .. e_{h-1} (trained on, not scored)

    def __post_init__(self) -> None:
        positive(
            self.name, vocab_size=self.vocab_size, seq_len=self.seq_len, num_chains=self.num_chains, hops=self.hops
        )
        require(self.seq_len % 2 == 0, self.name, "'seq_len even'", f"seq_len={self.seq_len}")
        need = 2 * self.num_chains * self.hops + 2 * self.num_queries
        require(
            need <= self.seq_len,
            self.name,
            "'2*num_chains*hops + 2*num_queries <= seq_len'",
            f"{need} > {self.seq_len} with {self.num_queries} queries",
        )
        ents = self.num_chains * (self.hops + 1)
        require(
            ents <= self.vocab_size - 1,
            self.name,
            "'num_chains*(hops+1) <= vocab_size - 1'",
            f"{ents} distinct entities from {self.vocab_size - 1} ids",
        )

    @property
    def num_queries(self) -> int:
        return self.num_chains * (self.hops if self.shallow_queries else 1)

    def baselines(self) -> dict[str, float]:
        # chain ends are the context's values that are never a key: guessing one of them needs no lookup
        return {"uniform entity": 1 / (self.vocab_size - 1), "a chain end of the context": 1 / self.num_chains}

    def _generate(self, num_examples: int, seed: int) -> TaskData:
        rng = np.random.default_rng(seed)
        c, h, length = self.num_chains, self.hops, self.seq_len
        context = 2 * c * h
        space = (length - context) // 2
        inputs = np.zeros((num_examples, length), dtype=np.int64)
        labels = np.full((num_examples, length), IGNORE_INDEX, dtype=np.int64)
        scored = np.zeros((num_examples, length), dtype=bool)
        for n in range(num_examples):
            chains = rng.choice(np.arange(1, self.vocab_size), size=c * (h + 1), replace=False).reshape(c, h + 1)
            # interleave: a random order of chain ids, each appearing h times
            order = rng.permutation(np.repeat(np.arange(c), h))
            seen = np.zeros(c, dtype=np.int64)
            hop_of = np.empty(c * h, dtype=np.int64)
            perms = [rng.permutation(h) for _ in range(c)] if not self.causal_order else None
            for pos, ch in enumerate(order):
                k = seen[ch]
                hop_of[pos] = h - 1 - k if self.causal_order else perms[ch][k]
                seen[ch] += 1
            inputs[n, 0:context:2] = chains[order, hop_of]
            inputs[n, 1:context:2] = chains[order, hop_of + 1]
            slots = rng.choice(space, size=self.num_queries, replace=False)
            q_pos = (context + 2 * slots).reshape(-1, c)  # row k: the queries of e_k, one per chain
            for k, pos in enumerate(q_pos):
                inputs[n, pos] = chains[:, k]
                labels[n, pos] = chains[:, h]
            scored[n, q_pos[0]] = True
        score_mask = torch.from_numpy(scored) if self.shallow_queries else None
        return TaskData(torch.from_numpy(inputs), torch.from_numpy(labels), score_mask)
