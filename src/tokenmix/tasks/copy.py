"""Copy at a fixed offset: output position j + L reproduces input position j.

This is the task behind the paper's congestion metric (framework §4.3): every source j must reach
its target j + L through the mixer's communication graph, and all S flows use the same offset, so a
translation-invariant pattern routes them with the same hop decomposition of L.

Generator, per example (``numpy.random.default_rng(seed)``):
    inputs  = s_0 .. s_{S-1}  BLANK ... BLANK            (T tokens; s_j uniform in [2, V), BLANK = 1)
    labels[j + L] = s_j  for j < S;  −100 elsewhere.
The blanks carry no information, so the answer at j + L can only come from position j: no
content-based shortcut (such as an induction head) exists. Token 0 is unused (kept as padding).

Constraints: 1 ≤ offset, copy_len + offset ≤ seq_len, vocab_size ≥ 3.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tokenmix.tasks.base import IGNORE_INDEX, CompareRecipe, TaskConfig, TaskData, positive, register_task, require

BLANK = 1
FIRST_SYMBOL = 2


@register_task
@dataclass(frozen=True)
class CopyConfig(TaskConfig):
    name = "copy"
    recipe = CompareRecipe(dict(vocab_size=16, seq_len=32, copy_len=6, offset=26), steps=100)

    vocab_size: int = 16  # ids 0 (pad) and 1 (blank) plus vocab_size − 2 symbols
    seq_len: int = 64
    copy_len: int = 32  # S, the segment to reproduce
    offset: int | None = None  # L; None means copy_len (the copy starts right after the segment)

    def __post_init__(self) -> None:
        positive(self.name, vocab_size=self.vocab_size, seq_len=self.seq_len, copy_len=self.copy_len)
        if self.offset is not None:
            positive(self.name, offset=self.offset)
        require(
            self.vocab_size >= 3,
            self.name,
            "'vocab_size >= 3'",
            f"vocab_size={self.vocab_size} leaves no symbol besides pad and blank",
        )
        require(
            self.copy_len + self.shift <= self.seq_len,
            self.name,
            "'copy_len + offset <= seq_len'",
            f"{self.copy_len} + {self.shift} > {self.seq_len}",
        )

    @property
    def shift(self) -> int:
        """The offset L actually used."""
        return self.copy_len if self.offset is None else self.offset

    def baselines(self) -> dict[str, float]:
        return {"uniform symbol": 1 / (self.vocab_size - FIRST_SYMBOL)}

    def _generate(self, num_examples: int, seed: int) -> TaskData:
        rng = np.random.default_rng(seed)
        s, t, shift = self.copy_len, self.seq_len, self.shift
        segment = rng.integers(FIRST_SYMBOL, self.vocab_size, size=(num_examples, s))
        inputs = np.full((num_examples, t), BLANK, dtype=np.int64)
        inputs[:, :s] = segment
        labels = np.full((num_examples, t), IGNORE_INDEX, dtype=np.int64)
        labels[:, shift : shift + s] = segment
        return TaskData(torch.from_numpy(inputs), torch.from_numpy(labels))
