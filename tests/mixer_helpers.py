"""The mixers every generic test runs over, the test-size mixer they build, and a decode loop."""

from __future__ import annotations

import torch

from tokenmix.checks.equivalence import small_mixer
from tokenmix.mixers.registry import mixer_names

ALL_MIXERS = mixer_names()


def decode_tokens(m, x: torch.Tensor, start, prefill: int):
    """A recurrent-mode prefill of ``prefill`` tokens (token by token, by the cache's strategy), then
    one ``step`` per token: (y [B, T, D], the final state)."""
    state = m.init_state(x.shape[0], dtype=x.dtype, start=start, device=x.device)
    y, state = m(x[:, :prefill], state, "recurrent")
    ys = [y]
    for i in range(prefill, x.shape[1]):
        y_t, state = m.step(x[:, i], state)
        ys.append(y_t[:, None])
    return torch.cat(ys, 1), state


__all__ = ["ALL_MIXERS", "decode_tokens", "small_mixer"]
