"""Library-level checks shared by ``tokenmix check`` and the tests.

``equivalence.mode_errors(name)`` measures how far every mode of a registered mixer is from its
fast mode (outputs, final states, gradients) in float64. Cross-checks against independent
implementations live in one module per registry family (the ``family`` a mixer is registered with,
``mixers.registry.families``): ``family_module_name`` names it, ``checks/<family in snake_case>.py``,
and it registers each check with ``@register_crosscheck(mixer, reference, metric, tolerance)``: a
function returning a dict of named errors. ``load_all_crosschecks()`` imports every module of this
package (``pkgutil``), so a new family module needs no list entry; ``family_modules()`` maps each
registry family to its module.
Shared helpers: ``checks/common.py``; every tolerance: ``checks/tolerances.py``;
``fla_naive(name)`` loads fla-core's pure-PyTorch reference by file path.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType

from tokenmix.core.errors import InputError
from tokenmix.mixers.registry import families


@dataclass(frozen=True)
class CrossCheck:
    """One independent cross-check of a registered mixer, as declared by ``register_crosscheck``.

    Attributes:
        mixer: the registered mixer's name.
        reference: the independent implementation (e.g. "fla naive_recurrent_gla"); one check per
            reference and mixer.
        metric: how the errors are measured (e.g. "float32 max rel").
        tolerance: the largest error accepted (checks/tolerances.py).
        fn: ``fn() -> {quantity: error}``.
        module: the module that registered it (its family's checks module).
        ops: op implementations it compares as well: some key ``op.<impl>...output`` for each.
        op_states: whether some ``op.*.state`` key compares an op's final state too.
        per_mode: quantities every mode of the mixer reports: a key ``<mode><q>``, alone or after a
            case prefix (``"w=4 chunked.output"``).
        compares_modes: False for a check of something other than the mixer's modes.
    Unpacks as ``(label, fn, tolerance)``.
    """

    mixer: str
    reference: str
    metric: str
    tolerance: float
    fn: Callable[[], dict[str, float]]
    module: str
    ops: tuple[str, ...] = ()
    op_states: bool = False
    per_mode: tuple[str, ...] = (".output",)
    compares_modes: bool = True

    @property
    def label(self) -> str:
        return f"{self.reference} ({self.metric})"

    def __iter__(self) -> Iterator:
        return iter((self.label, self.fn, self.tolerance))


CROSSCHECKS: dict[str, list[CrossCheck]] = {}


def register_crosscheck(
    mixer: str,
    reference: str,
    metric: str,
    tolerance: float,
    *,
    ops: tuple[str, ...] = (),
    op_states: bool = False,
    per_mode: tuple[str, ...] = (".output",),
    compares_modes: bool = True,
):
    """Decorator: ``fn() -> {quantity: error}``, each error compared with ``tolerance`` (``CrossCheck``)."""

    def deco(fn):
        if any(c.reference == reference for c in CROSSCHECKS.get(mixer, [])):
            raise InputError(f"mixer '{mixer}': a cross-check against '{reference}' is registered twice")
        CROSSCHECKS.setdefault(mixer, []).append(
            CrossCheck(
                mixer,
                reference,
                metric,
                tolerance,
                fn,
                fn.__module__,
                tuple(ops),
                op_states,
                tuple(per_mode),
                compares_modes,
            )
        )
        return fn

    return deco


def checks_modules() -> dict[str, ModuleType]:
    """Every module of this package (found with ``pkgutil.iter_modules``), imported: {name: module}."""
    return {info.name: importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)}


def load_all_crosschecks() -> None:
    """Import every module of this package, so that every cross-check is registered."""
    checks_modules()


def family_module_name(family: str) -> str:
    """The checks module of a registry family: "log-linear attention" -> "tokenmix.checks.log_linear_attention"."""
    return f"{__name__}.{re.sub(r'[^a-z0-9]+', '_', family.lower()).strip('_')}"


def family_modules() -> dict[str, ModuleType]:
    """{family: its checks module} for each registry family that has one (``family_module_name``)."""
    modules = {mod.__name__: mod for mod in checks_modules().values()}  # (their imports register every mixer)
    named = {family: family_module_name(family) for family in families()}
    return {family: modules[name] for family, name in named.items() if name in modules}


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
