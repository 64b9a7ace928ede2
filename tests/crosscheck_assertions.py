"""The assertions of the cross-check discovery, as functions of a mixer name or a check: the discovery
test (tests/checks/test_crosschecks.py) runs them on every registered mixer, the enrolment test
(tests/mixers/test_enrolment.py) on a mixer it registers itself."""

from __future__ import annotations

import re

from tokenmix.checks import CROSSCHECKS, CrossCheck, family_modules
from tokenmix.checks.tolerances import CROSSCHECK_CEILING
from tokenmix.mixers.registry import build_mixer, get_mixer_spec


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
        assert not checks, (
            f"{name}: cross-checks registered in {sorted({c.module for c in checks})}, but its "
            f"family {family!r} has no checks module tokenmix.checks.{family_slug(family)}"
        )
        return checks
    assert checks, (
        f"{name} (family {family!r}) has no registered cross-check: add one with "
        f"@register_crosscheck({name!r}, ...) in {module.__name__}"
    )
    misplaced = [f"{c.label} in {c.module}" for c in checks if c.module != module.__name__]
    assert not misplaced, f"{name}: cross-checks outside its family's module {module.__name__}: {misplaced}"
    return checks


def assert_declaration(check: CrossCheck) -> None:
    """The label names the reference and the metric; the tolerance is no looser than its dtype's ceiling."""
    what = f"{check.mixer} vs {check.label}"
    assert check.reference and check.metric and check.label == f"{check.reference} ({check.metric})", what
    dtype = check.metric.split()[0]
    if dtype in CROSSCHECK_CEILING:
        assert check.tolerance <= CROSSCHECK_CEILING[dtype], (
            f"{what}: tolerance {check.tolerance:.0e} is looser than {CROSSCHECK_CEILING[dtype]:.0e} for {dtype}"
        )
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
        assert any(op.search(q) and q.endswith(".output") for q in errors), (
            f"{what}: op {impl} not compared with the reference"
        )
    if check.op_states:
        assert any(re.search(r"(^| )op\.\S*\.state", q) for q in errors), f"{what}: no op final state compared"
