"""Selective copying, in MAD's setting (Poli et al. 2024, athms/mad-lab): the tokens to copy are
scattered among blanks; after a copy marker the model reproduces them in order.

Generator, per example (``numpy.random.default_rng(seed)``), with N = ``num_tokens_to_copy``:
    symbols: ids [0, V − 2); BLANK = V − 2; COPY = V − 1 (MAD's special-token layout)
    1. N symbols drawn uniformly with replacement;
    2. scattered part: the N symbols and T − 2N blanks, in a random order that keeps the symbols'
       relative order;
    3. full sequence = scattered part + COPY + the N symbols (T + 1 tokens);
    4. inputs = sequence[:-1], labels = sequence[1:] at the last N positions (the copied symbols,
       next-token style, teacher forced), −100 elsewhere.

MAD's baseline is vocab 16, seq 256, 16 tokens (the defaults); ``SELECTIVE_COPY_PRESETS`` holds
smaller CPU-sized settings. Constraints: T ≥ 2N + 1, V ≥ 3.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tokenmix.tasks.base import IGNORE_INDEX, TaskConfig, TaskData, positive, register_task, require

SELECTIVE_COPY_PRESETS: dict[str, dict[str, int]] = {
    "mad": dict(vocab_size=16, seq_len=256, num_tokens_to_copy=16),
    "small": dict(vocab_size=16, seq_len=128, num_tokens_to_copy=8),
    "tiny": dict(vocab_size=10, seq_len=32, num_tokens_to_copy=4),
}


@register_task
@dataclass(frozen=True)
class SelectiveCopyConfig(TaskConfig):
    name = "selective_copy"

    vocab_size: int = 16
    seq_len: int = 256
    num_tokens_to_copy: int = 16

    def __post_init__(self) -> None:
        positive(
            self.name, vocab_size=self.vocab_size, seq_len=self.seq_len, num_tokens_to_copy=self.num_tokens_to_copy
        )
        require(
            self.vocab_size >= 3,
            self.name,
            "'vocab_size >= 3'",
            f"vocab_size={self.vocab_size} leaves no symbol besides blank and copy",
        )
        require(
            self.seq_len >= 2 * self.num_tokens_to_copy + 1,
            self.name,
            "'seq_len >= 2*num_tokens_to_copy + 1'",
            f"seq_len={self.seq_len}, num_tokens_to_copy={self.num_tokens_to_copy}",
        )

    @property
    def blank(self) -> int:
        return self.vocab_size - 2

    @property
    def copy_marker(self) -> int:
        return self.vocab_size - 1

    def baselines(self) -> dict[str, float]:
        return {"uniform symbol": 1 / (self.vocab_size - 2)}

    def _generate(self, num_examples: int, seed: int) -> TaskData:
        rng = np.random.default_rng(seed)
        n, t = self.num_tokens_to_copy, self.seq_len
        scattered_len = t - n
        seq = np.empty((num_examples, t + 1), dtype=np.int64)
        symbols = rng.integers(0, self.vocab_size - 2, size=(num_examples, n))
        for ex in range(num_examples):
            where = np.sort(rng.choice(scattered_len, size=n, replace=False))
            part = np.full(scattered_len, self.blank, dtype=np.int64)
            part[where] = symbols[ex]
            seq[ex, :scattered_len] = part
        seq[:, scattered_len] = self.copy_marker
        seq[:, scattered_len + 1 :] = symbols
        labels = np.full((num_examples, t), IGNORE_INDEX, dtype=np.int64)
        labels[:, t - n :] = seq[:, t + 1 - n :]
        return TaskData(torch.from_numpy(seq[:, :-1].copy()), torch.from_numpy(labels))
