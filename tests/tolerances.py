"""One table of tolerances, keyed by dtype and by whether the fast path reassociates exponentials."""
from __future__ import annotations

import torch

FLOAT64_EXACT = 1e-10          # max abs, modes that are the same arithmetic up to rounding
FLOAT64_REASSOCIATED = 1e-8    # max abs, chunked forms that factor exp(G_i - G_j) through chunk boundaries
FLOAT32_REL_RMS = 1e-5


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    err = max_abs(actual, expected)
    assert err <= atol, f"{what}: max abs err {err:.3e} > {atol:.0e} (rel rms {rel_rms(actual, expected):.3e})"
