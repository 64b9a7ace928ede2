"""The Makefile's install step: a .venv that already works (README's manual install) is kept; one that
does not import is (re)installed. Run against a copy of the Makefile with a fake .venv/bin/python
and pip that only record their calls."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
case "$*" in -c*) exit {import_status};; esac
exit 0
"""


def _make(tmp_path: Path, import_status: int, stamp: bool = False) -> list[str]:
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    bindir = tmp_path / ".venv" / "bin"
    bindir.mkdir(parents=True)
    log = tmp_path / "calls.log"
    for name in ("python", "pip"):
        (bindir / name).write_text(FAKE.format(log=log, import_status=import_status))
        (bindir / name).chmod(0o755)
    if stamp:
        (tmp_path / ".venv" / ".installed-stamp").touch()
    done = subprocess.run(["make", "test"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / ".venv" / ".installed-stamp").exists()
    return log.read_text().splitlines()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_working_manual_install_is_kept(tmp_path):
    calls = _make(tmp_path, import_status=0)
    assert not any(c.startswith("pip ") for c in calls), calls  # nothing reinstalled
    assert calls[-1] == "python -m pytest"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_venv_that_does_not_import_is_installed(tmp_path):
    calls = _make(tmp_path, import_status=1)
    assert "pip install --quiet torch==2.13.0 -e .[dev]" in calls, calls
    assert calls[-1] == "python -m pytest"
