"""Every independent cross-check registered in tokenmix.checks (``tokenmix check`` runs the same
functions), found by discovery: the mixers come from the registry, the checks from their
registrations (``register_crosscheck`` in the family's module ``checks/<family>.py``, imported by
``load_all_crosschecks``).

Each mixer of a family that has a checks module has at least one cross-check, registered in that
module; each check states its reference and metric in its label, stays within its tolerance (NaN
fails; no looser than the ceiling for its dtype), compares every mode of its mixer with the
quantities it declares, and the ops it declares. The assertions are functions of a mixer name or a
check, so tests/test_enrolment.py runs them on a mixer it registers itself.

References: fla-core 0.6.0's pure-PyTorch naive.py files (loaded by path), torch SDPA, and explicit
formulas (ChaCAL's dense inverse, H-LRU's per-channel loop, ...).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import tokenmix.checks
from tokenmix.checks import CROSSCHECKS, CrossCheck, family_modules, load_all_crosschecks
from tokenmix.checks.tolerances import CROSSCHECK_CEILING
from tokenmix.mixers.registry import build_mixer, get_mixer_spec, mixer_names

load_all_crosschecks()


def family_slug(family: str) -> str:
    """The checks module name of a family: "log-linear attention" -> "log_linear_attention"."""
    return re.sub(r"[^a-z0-9]+", "_", family.lower()).strip("_")


def reported(errors: dict[str, float], quantity: str) -> bool:
    """Whether ``errors`` has the key ``quantity``, alone or after a case prefix (``"w=4 <quantity>"``)."""
    return any(q == quantity or q.endswith(" " + quantity) for q in errors)


def assert_crosschecked(name: str) -> list[CrossCheck]:
    """A mixer of a family with a checks module has a cross-check, registered in that module; a mixer
    of another family has none. Returns the mixer's checks."""
    family = get_mixer_spec(name).family
    module = family_modules().get(family)
    checks = CROSSCHECKS.get(name, [])
    if module is None:
        assert not checks, (f"{name}: cross-checks registered in {sorted({c.module for c in checks})}, but its "
                            f"family {family!r} has no checks module tokenmix.checks.{family_slug(family)}")
        return checks
    assert checks, (f"{name} (family {family!r}) has no registered cross-check: add one with "
                    f"@register_crosscheck({name!r}, ...) in {module.__name__}")
    misplaced = [f"{c.label} in {c.module}" for c in checks if c.module != module.__name__]
    assert not misplaced, f"{name}: cross-checks outside its family's module {module.__name__}: {misplaced}"
    return checks


def assert_declaration(check: CrossCheck) -> None:
    """The label names the reference and the metric; the tolerance is no looser than its dtype's ceiling."""
    what = f"{check.mixer} vs {check.label}"
    assert check.reference and check.metric and check.label == f"{check.reference} ({check.metric})", what
    dtype = check.metric.split()[0]
    if dtype in CROSSCHECK_CEILING:
        assert check.tolerance <= CROSSCHECK_CEILING[dtype], \
            f"{what}: tolerance {check.tolerance:.0e} is looser than {CROSSCHECK_CEILING[dtype]:.0e} for {dtype}"
    else:
        assert not check.compares_modes, f"{what}: a check of the mixer's modes names its dtype in its metric"


def assert_crosscheck_passes(check: CrossCheck) -> None:
    """Run the check: every error within the tolerance, every mode of the mixer compared with the
    quantities the check declares, every declared op compared (and its final state, if declared)."""
    what = f"{check.mixer} vs {check.label}"
    errors = check.fn()
    assert errors, f"{what}: the check returned no errors"
    too_large = {q: e for q, e in errors.items() if not e <= check.tolerance}  # NaN counts as too large
    assert not too_large, f"{what}: errors above {check.tolerance:.0e}: {too_large}"
    if check.compares_modes:
        modes = build_mixer(check.mixer, 12, n_heads=2).modes
        uncovered = [mode for mode in modes if not any(f"{mode}." in q for q in errors)]
        assert not uncovered, f"{what}: modes not compared with the reference: {uncovered}"
        missing = [mode + q for mode in modes for q in check.per_mode if not reported(errors, mode + q)]
        assert not missing, f"{what}: modes/quantities not compared with the reference: {missing}"
    for impl in check.ops:
        op = re.compile(rf"(^| )op\.{re.escape(impl)}[.(]")
        assert any(op.search(q) and q.endswith(".output") for q in errors), \
            f"{what}: op {impl} not compared with the reference"
    if check.op_states:
        assert any(re.search(r"(^| )op\.\S*\.state", q) for q in errors), f"{what}: no op final state compared"


CHECKS = [pytest.param(check, id=f"{name}: {check.label}") for name in mixer_names()
          for check in CROSSCHECKS.get(name, [])]


@pytest.mark.parametrize("name", mixer_names())
def test_mixer_of_a_checked_family_is_crosschecked(name):
    assert_crosschecked(name)


@pytest.mark.parametrize("check", CHECKS)
def test_crosscheck_declaration(check):
    assert_declaration(check)


@pytest.mark.parametrize("check", CHECKS)
def test_crosscheck_within_tolerance(check):
    assert_crosscheck_passes(check)


def test_every_registered_check_is_of_a_registered_mixer():
    unknown = sorted(set(CROSSCHECKS) - set(mixer_names()))
    assert not unknown, f"cross-checks registered for mixers that are not registered: {unknown}"


def test_one_checks_module_per_family_named_for_it():
    families = {get_mixer_spec(n).family for n in mixer_names()}
    for family, module in family_modules().items():
        assert family in families, f"{module.__name__} declares FAMILY = {family!r}, no registered mixer's family"
        assert module.__name__ == f"tokenmix.checks.{family_slug(family)}", (module.__name__, family)
        assert any(c.module == module.__name__ for checks in CROSSCHECKS.values() for c in checks), \
            f"{module.__name__} registers no cross-check"


def test_checks_modules_import_no_private_names_of_each_other():
    package = Path(tokenmix.checks.__file__).parent
    found = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tokenmix.checks"):
                found += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert not found, f"private names imported across checks modules (make them public in checks/common.py): {found}"
