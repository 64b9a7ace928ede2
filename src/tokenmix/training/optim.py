"""AdamW with the usual split: weight decay on matrices (projections, embeddings), none on vectors
(norm gains, biases, gates' offsets). Shared by the synthetic harness and any LM trainer."""

from __future__ import annotations

import torch
from torch import nn

from tokenmix.core.errors import InputError


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: parameters with dim >= 2 decay, the rest do not. Tied weights appear once."""
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(
    model: nn.Module, lr: float, weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-8
) -> torch.optim.AdamW:
    """AdamW over ``param_groups(model, weight_decay)``; ``lr`` is the peak rate the schedule scales."""
    if lr <= 0:
        raise InputError(f"lr must be > 0, got {lr}")
    if weight_decay < 0:
        raise InputError(f"weight_decay must be >= 0, got {weight_decay}")
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, eps=eps)
