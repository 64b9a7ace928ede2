"""Library-level checks shared by ``tokenmix check`` and the tests.

``equivalence.mode_errors(name)`` measures how far every mode of a registered mixer is from its
fast mode (outputs, final states, gradients) in float64. Cross-checks against independent
implementations register with ``@register_crosscheck("mixer_name")`` and return a dict of named
relative errors; ``fla_naive(name)`` loads fla-core's pure-PyTorch reference by file path.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Callable

CROSSCHECKS: dict[str, list[tuple[str, Callable[[], dict[str, float]], float]]] = {}


def register_crosscheck(mixer: str, label: str, tolerance: float):
    """Decorator: ``fn() -> {quantity: relative error}`` compared with ``tolerance``."""

    def deco(fn):
        CROSSCHECKS.setdefault(mixer, []).append((label, fn, tolerance))
        return fn

    return deco


class ReferenceUnavailable(RuntimeError):
    """fla-core (the independent reference) is not installed."""


def fla_naive(name: str):
    """Load ``fla/ops/<name>/naive.py`` by path (importing fla.ops needs Triton; the naive files don't)."""
    try:
        import fla
    except ImportError:
        raise ReferenceUnavailable("fla-core==0.6.0 is not installed (pip install -e '.[dev]')") from None
    path = os.path.join(os.path.dirname(fla.__file__), "ops", name, "naive.py")
    modname = "fla_naive_" + name.replace("/", "_")
    if modname in sys.modules:
        return sys.modules[modname]
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod  # registered first, as torch.compile needs
    spec.loader.exec_module(mod)
    return mod


def rel_err(a, b) -> float:
    """Relative RMS error ||a - b|| / ||b|| (fla's metric), in float64."""
    a, b = a.double(), b.double()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def load_all_crosschecks() -> None:
    """Import every cross-check module (one line each)."""
    for mod in CROSSCHECK_MODULES:
        importlib.import_module(f"tokenmix.checks.{mod}")


CROSSCHECK_MODULES: list[str] = ["attention_family", "delta_family", "linear_family",
                                 "attention_2025", "delta_2025", "hierarchical_2025", "recurrent_2025",
                                 "convolution"]
