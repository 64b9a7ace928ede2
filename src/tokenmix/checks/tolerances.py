"""Every tolerance of the numerical checks, stated once, with the metrics they bound.

Used by the tests, ``tokenmix check`` and the cross-checks (checks/<family>.py). Two kinds:
a mixer's own modes against each other (keyed by dtype and by whether the fast path reassociates
exponentials), and a mixer against an independent implementation (keyed by the reference's dtype
and the metric each cross-check's label states).
"""

from __future__ import annotations

from torch import Tensor

from tokenmix.core.errors import InputError

__all__ = [
    "FLOAT64_EXACT",
    "FLOAT64_REASSOCIATED",
    "GRADIENT_FACTOR",
    "FLOAT32_REL_RMS",
    "FLOAT32_REL_TOL",
    "FLOAT32_ABS_TOL",
    "FLOAT32_LONG_REL_TOL",
    "FLOAT64_ABS_TOL",
    "FLOAT64_REL_TOL",
    "FLOAT64_CONV_REL_TOL",
    "MISMATCHES_ALLOWED",
    "CROSSCHECK_CEILING",
    "mode_tolerance",
    "max_abs_err",
    "max_rel_err",
    "rel_rms",
    "assert_close",
]

# ---------------------------------------------------------------- a mixer's modes against each other
FLOAT64_EXACT = 1e-10  # max abs, modes that are the same arithmetic up to rounding
FLOAT64_REASSOCIATED = 1e-8  # max abs, chunked forms that factor exp(G_i - G_j) through chunk boundaries
GRADIENT_FACTOR = 10  # gradients are compared at this multiple of the output tolerance
FLOAT32_REL_RMS = 1e-5  # relative RMS, float32 modes against the fast mode

# ---------------------------------------------------------------- against independent implementations
FLOAT32_REL_TOL = 1e-5  # max rel, float32 references (fla-core's naive.py files compute in float32)
FLOAT32_ABS_TOL = 1e-5  # max abs, float32 attention outputs against float32 references
FLOAT32_LONG_REL_TOL = 1e-4  # max rel, float32 chunked forms against the token loop at 16k tokens, extreme gates
FLOAT64_ABS_TOL = 1e-10  # max abs, float64 formulas: ChaCAL's dense inverse (I - gamma P stays well
# conditioned, |inverse| <= 1 / (1 - gamma) = 1000), H-LRU's per-channel loop
FLOAT64_REL_TOL = 1e-10  # max rel, float64 formulas and loops written from a paper's equations
FLOAT64_CONV_REL_TOL = 1e-12  # max rel, the short convolution (sums of k products) against float64 formulas
MISMATCHES_ALLOWED = 0.0  # integer patterns (Fenwick levels): no entry may differ

#: the loosest tolerance a cross-check may declare, by the dtype its metric names
CROSSCHECK_CEILING = {"float32": FLOAT32_REL_TOL, "float64": FLOAT64_REL_TOL}


def mode_tolerance(mixer) -> float:
    """Float64 max-abs tolerance of a mixer's (class or instance) modes against its fast mode."""
    return FLOAT64_REASSOCIATED if getattr(mixer, "reassociates", False) else FLOAT64_EXACT


def max_abs_err(actual: Tensor, expected: Tensor) -> float:
    """max |actual - expected| in float64; shapes must match (no silent broadcasting)."""
    if actual.shape != expected.shape:
        raise InputError(f"shape {tuple(actual.shape)} != reference shape {tuple(expected.shape)}")
    return (actual.double() - expected.double()).abs().max().item() if actual.numel() else 0.0


def max_rel_err(actual: Tensor, expected: Tensor) -> float:
    """max |actual - expected| / max |expected| in float64; shapes must match."""
    return max_abs_err(actual, expected) / max(expected.double().abs().max().item(), 1e-30)


def rel_rms(actual: Tensor, expected: Tensor) -> float:
    """Relative RMS error ||actual - expected|| / ||expected|| (fla's metric), in float64."""
    a, b = actual.double(), expected.double()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def assert_close(actual: Tensor, expected: Tensor, atol: float, what: str) -> None:
    """Same shape and max abs error <= atol; the message reports max abs and relative RMS."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    err = max_abs_err(actual, expected)
    assert err <= atol, f"{what}: max abs err {err:.3e} > {atol:.0e} (rel rms {rel_rms(actual, expected):.3e})"
