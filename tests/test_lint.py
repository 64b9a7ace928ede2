"""The tree is linted and formatted by ruff (settings: pyproject.toml's [tool.ruff]); CI runs this
through the README's test command. To fix: ``ruff check --fix . && ruff format .``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command):
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "src", "tests"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"ruff {' '.join(command)}:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
