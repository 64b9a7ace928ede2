"""Every Python snippet in README.md runs (catches documentation drift)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from progress_guard import run_guarded

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_snippets():
    assert len(SNIPPETS) >= 4


@pytest.mark.parametrize("i", range(len(SNIPPETS)))
def test_snippet_runs(i):
    exec(compile(SNIPPETS[i], f"README.md snippet {i}", "exec"), {})


HF_COMMANDS = re.search(r"<!-- hf-commands -->\n```bash\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.slow
def test_hugging_face_commands_run_as_written(tmp_path):
    """The README's train -> export -> from_pretrained/generate -> lm_eval lines, each run as written
    (in a scratch folder, with the data cache there)."""
    import os
    import shlex
    import sys

    assert HF_COMMANDS is not None
    lines = [line for line in HF_COMMANDS.group(1).splitlines() if line.strip()]
    assert [shlex.split(line)[0] for line in lines] == ["tokenmix", "tokenmix", "python", "lm_eval"]
    bindir = Path(sys.executable).parent
    env = dict(
        os.environ,
        TOKENMIX_CACHE=str(tmp_path / "cache"),
        HF_HOME=str(tmp_path / "hf_home"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    outputs = []
    for line in lines:
        done = run_guarded(shlex.split(line), cwd=tmp_path, env=env, cpu_seconds=600)
        assert done.returncode == 0, f"{line}\n{done.stderr[-3000:]}"
        outputs.append(done.stdout)
    assert outputs[2].startswith("To be, or not") and len(outputs[2]) > len("To be, or not")
    assert "tokenmix_heldout" in outputs[3] and "tokenmix_continuation" in outputs[3]
