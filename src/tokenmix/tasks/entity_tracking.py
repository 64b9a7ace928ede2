"""Entity tracking (ChaCAL's toy task, Fagnou et al. 2024): objects moved between boxes n times;
query the final content of a box.

Every event is one token, so the dependency between events is the only thing a layer has to
resolve (no key/value pairing across positions):
    PUT(b, o)    box b now holds object o
    MOVE(b, a)   box b now holds what box a holds (a != b)
    ASK(b)       what does box b hold?  -> label: the object id o

Generator, per example (``numpy.random.default_rng(seed)``):
    1. ``num_chains`` chains of n + 1 distinct boxes b_0 .. b_n (all boxes distinct across chains,
       drawn from ``num_boxes``) and one object per chain (distinct, from ``num_objects``);
    2. events of chain c: PUT(b_0, o_c), MOVE(b_1, b_0), ..., MOVE(b_n, b_{n-1}) -- n state
       changes; the chains' events are interleaved at random, each chain keeping its order;
    3. then ASK(b_n) for every chain, in random order; label = o_c at these positions, −100 elsewhere.
       With ``ask_all_boxes`` every box of every chain is asked (depths 0 .. n, random order): the
       shallow questions give a learning signal for one lookup that the deep ones compose. With
       ``score_deepest`` as well, only the questions about each chain's last box b_n (depth n) are
       scored (``score_mask``); the shallower ones are trained on. Every ASK's depth is its answer
       group ("depth 0" .. "depth n": d + 1 links from the ASK to the PUT), so reports can show which
       depths a model answers.
Answering ASK(b_n) follows a dependency path of depth n + 1 back to the PUT. ChaCAL's bound: a
stack of attention layers (B = 0) needs ≥ ceil(log2(n + 1)) layers for n state changes, a dense
recurrence can follow the chain within one layer.

Token ids: 0 pad, objects [1, 1+O) (answers only), PUT, MOVE (K·K ids, the a == b ids unused),
ASK blocks after them. Sequence length = num_chains · (n + 2), or num_chains · 2(n + 1) when every
box is asked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tokenmix.tasks.base import IGNORE_INDEX, TaskConfig, TaskData, positive, register_task, require


@register_task
@dataclass(frozen=True)
class EntityTrackingConfig(TaskConfig):
    name = "entity_tracking"

    num_changes: int = 3  # n, MOVE events per chain
    num_chains: int = 4  # independent chains (one query each)
    num_boxes: int = 16  # K
    num_objects: int = 8  # O
    ask_all_boxes: bool = False  # ask every box (depths 0..n), not only each chain's last one
    score_deepest: bool = False  # with ask_all_boxes: score only the depth-n questions

    def __post_init__(self) -> None:
        positive(
            self.name,
            num_changes=self.num_changes,
            num_chains=self.num_chains,
            num_boxes=self.num_boxes,
            num_objects=self.num_objects,
        )
        boxes = self.num_chains * (self.num_changes + 1)
        require(
            boxes <= self.num_boxes,
            self.name,
            "'num_chains*(num_changes+1) <= num_boxes'",
            f"{boxes} distinct boxes from {self.num_boxes}",
        )
        require(
            self.num_chains <= self.num_objects,
            self.name,
            "'num_chains <= num_objects'",
            f"{self.num_chains} distinct objects from {self.num_objects}",
        )
        require(
            self.ask_all_boxes or not self.score_deepest,
            self.name,
            "'score_deepest needs ask_all_boxes'",
            "only the deepest box is asked already",
        )

    # -- token layout
    @property
    def put_base(self) -> int:
        return 1 + self.num_objects

    @property
    def move_base(self) -> int:
        return self.put_base + self.num_boxes * self.num_objects

    @property
    def ask_base(self) -> int:
        return self.move_base + self.num_boxes * self.num_boxes

    @property
    def vocab_size(self) -> int:
        return self.ask_base + self.num_boxes

    @property
    def num_asks(self) -> int:
        return self.num_chains * ((self.num_changes + 1) if self.ask_all_boxes else 1)

    @property
    def seq_len(self) -> int:
        return self.num_chains * (self.num_changes + 1) + self.num_asks

    def put(self, box: int, obj: int) -> int:
        return self.put_base + box * self.num_objects + obj

    def move(self, dst: int, src: int) -> int:
        return self.move_base + dst * self.num_boxes + src

    def ask(self, box: int) -> int:
        return self.ask_base + box

    def baselines(self) -> dict[str, float]:
        return {"uniform object": 1 / self.num_objects, "an object of the context": 1 / self.num_chains}

    def _generate(self, num_examples: int, seed: int) -> TaskData:
        rng = np.random.default_rng(seed)
        c, n = self.num_chains, self.num_changes
        events = c * (n + 1)
        inputs = np.zeros((num_examples, self.seq_len), dtype=np.int64)
        labels = np.full((num_examples, self.seq_len), IGNORE_INDEX, dtype=np.int64)
        scored = np.zeros((num_examples, self.seq_len), dtype=bool)
        groups = np.full((num_examples, self.seq_len), -1, dtype=np.int64)
        for ex in range(num_examples):
            boxes = rng.choice(self.num_boxes, size=c * (n + 1), replace=False).reshape(c, n + 1)
            objects = rng.choice(self.num_objects, size=c, replace=False)
            order = rng.permutation(np.repeat(np.arange(c), n + 1))
            step = np.zeros(c, dtype=np.int64)
            for pos, ch in enumerate(order):
                k = step[ch]
                inputs[ex, pos] = (
                    self.put(boxes[ch, 0], objects[ch]) if k == 0 else self.move(boxes[ch, k], boxes[ch, k - 1])
                )
                step[ch] += 1
            asked = boxes.reshape(-1) if self.ask_all_boxes else boxes[:, n]  # chain-major
            chain_of = np.repeat(np.arange(c), n + 1) if self.ask_all_boxes else np.arange(c)
            depth_of = np.tile(np.arange(n + 1), c) if self.ask_all_boxes else np.full(c, n)
            for i, k in enumerate(rng.permutation(len(asked))):
                inputs[ex, events + i] = self.ask(asked[k])
                labels[ex, events + i] = 1 + objects[chain_of[k]]
                scored[ex, events + i] = depth_of[k] == n
                groups[ex, events + i] = depth_of[k]
        score_mask = torch.from_numpy(scored) if self.score_deepest else None
        return TaskData(
            torch.from_numpy(inputs),
            torch.from_numpy(labels),
            score_mask,
            torch.from_numpy(groups),
            tuple(f"depth {d}" for d in range(n + 1)),
        )
