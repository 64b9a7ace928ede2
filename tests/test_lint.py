"""The tree is linted and formatted by ruff (settings: pyproject.toml's [tool.ruff]); CI runs this
through the README's test command. To fix: ``ruff check --fix . && ruff format .``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from progress_guard import run_guarded

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command):
    done = run_guarded([sys.executable, "-m", "ruff", *command, "src", "tests"], cwd=ROOT, cpu_seconds=300)
    assert done.returncode == 0, f"ruff {' '.join(command)}:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
