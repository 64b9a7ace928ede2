"""Learning-rate schedule: linear warmup to the peak, then cosine decay to ``min_ratio`` × peak."""

from __future__ import annotations

import math

import torch

from tokenmix.core.errors import InputError


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, min_ratio: float = 0.1) -> float:
    """Multiplier of the peak learning rate at optimiser step ``step`` (0-based).

    Linear from 1/warmup to 1 over ``warmup_steps``, then cosine from 1 to ``min_ratio`` at
    ``total_steps``; constant ``min_ratio`` beyond.
    """
    if total_steps <= 0:
        raise InputError(f"total_steps must be > 0, got {total_steps}")
    if warmup_steps < 0:
        raise InputError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if not 0.0 <= min_ratio <= 1.0:
        raise InputError(f"min_ratio must be in [0, 1], got {min_ratio}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(total_steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / decay_steps, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int, min_ratio: float = 0.1
) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` applying ``warmup_cosine``; call ``scheduler.step()`` after each optimiser step."""
    warmup_cosine(0, total_steps, warmup_steps, min_ratio)  # validate now
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, total_steps, warmup_steps, min_ratio)
    )
