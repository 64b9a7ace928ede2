"""Every independent cross-check registered in tokenmix.checks (``tokenmix check`` runs the same
functions), found by discovery: the mixers come from the registry, the checks from their
registrations (``register_crosscheck`` in the registry family's module, ``family_module_name``,
imported by ``load_all_crosschecks``).

Each mixer of a family that has a checks module has at least one cross-check, registered in that
module; each check states its reference and metric in its label, stays within its tolerance (NaN
fails; no looser than the ceiling for its dtype), compares every mode of its mixer with the
quantities it declares, and the ops it declares. The assertions live in tests/crosscheck_assertions.py
(functions of a mixer name or a check), so tests/mixers/test_enrolment.py runs them on a mixer it registers.

References: fla-core 0.6.0's pure-PyTorch naive.py files (loaded by path), torch SDPA, and explicit
formulas (ChaCAL's dense inverse, H-LRU's per-channel loop, ...).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tokenmix.checks
from crosscheck_assertions import assert_crosscheck_passes, assert_crosschecked, assert_declaration
from tokenmix.checks import CROSSCHECKS, family_module_name, family_modules, load_all_crosschecks
from tokenmix.mixers.registry import families, mixer_names

load_all_crosschecks()


CHECKS = [
    pytest.param(check, id=f"{name}: {check.label}") for name in mixer_names() for check in CROSSCHECKS.get(name, [])
]


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


def test_checks_are_keyed_by_the_registry_family():
    """A cross-check is registered only in the checks module of a registry family (the module
    ``family_module_name`` names), and every such module registers one."""
    assert set(family_modules()) <= set(families())
    registering = {c.module for checks in CROSSCHECKS.values() for c in checks}
    keyed = {family_module_name(family) for family in family_modules()}
    assert registering <= keyed, f"cross-checks outside a family's checks module: {sorted(registering - keyed)}"
    for family, module in family_modules().items():
        assert module.__name__ == family_module_name(family), (module.__name__, family)
        assert module.__name__ in registering, f"{module.__name__} registers no cross-check"


def test_checks_modules_import_no_private_names_of_each_other():
    package = Path(tokenmix.checks.__file__).parent
    found = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tokenmix.checks"):
                found += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert not found, f"private names imported across checks modules (make them public in checks/common.py): {found}"
