"""Every Python snippet in README.md runs (catches documentation drift)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_snippets():
    assert len(SNIPPETS) >= 4


@pytest.mark.parametrize("i", range(len(SNIPPETS)))
def test_snippet_runs(i):
    exec(compile(SNIPPETS[i], f"README.md snippet {i}", "exec"), {})
