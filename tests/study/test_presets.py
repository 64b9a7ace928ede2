"""One preset mechanism, shipped inside the package: every preset resolves from the installed
``tokenmix`` (a wheel has no source tree), builds what its kind promises, and is listed by the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tokenmix
from tokenmix.cli.main import main
from tokenmix.runs.lm import LMRunConfig
from tokenmix.runs.synthetic import SyntheticRunConfig
from tokenmix.study.presets import KINDS, AnalysisPlan, get_preset, presets
from tokenmix.study.presets.lm import build_run_config

PACKAGE = Path(tokenmix.__file__).resolve().parent


def test_every_preset_resolves_from_the_installed_package(tmp_path):
    """In a fresh interpreter started in an unrelated folder, each preset's defining module is a
    file inside the imported package, never a path into a source checkout."""
    code = (
        "import json, sys, tokenmix\n"
        "from tokenmix.study.presets import presets\n"
        "print(json.dumps({'package': tokenmix.__file__, 'presets': "
        "[[p.kind, p.name, sys.modules[p.source].__file__] for p in presets()]}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    found = json.loads(out.stdout)
    package = Path(found["package"]).resolve().parent
    assert {(k, n) for k, n, _ in found["presets"]} >= {
        ("compare", "quick"),
        ("compare", "recall"),
        ("compare", "paper"),
        ("compare", "depth"),
        ("compare", "depth_long"),
        ("lm", "default"),
        ("lm", "small"),
        ("lm", "tiny"),
        ("analysis", "quick"),
        ("analysis", "full"),
    }
    for kind, name, file in found["presets"]:
        assert Path(file).resolve().is_relative_to(package), (kind, name, file)
    # and nothing in the package looks for a top-level experiments/ folder any more
    assert not any("experiments/" in p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("kind", KINDS)
def test_each_preset_builds_what_its_kind_promises(kind):
    assert presets(kind), f"no {kind} presets registered"
    for p in presets(kind):
        assert p.summary and "\n" not in p.summary
        if kind == "compare":
            runs = p.build()
            assert runs and all(isinstance(r, SyntheticRunConfig) for r in runs)
            runs[0].validate()
        elif kind == "lm":
            assert isinstance(build_run_config(p.name), LMRunConfig)
        else:
            assert isinstance(p.build(), AnalysisPlan)


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown preset 'nope'.*quick"):
        get_preset("compare", "nope")


def test_cli_lists_every_preset_with_one_line(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for p in presets():
        assert p.name in out and p.summary[:40] in out
    assert main(["compare", "--list-presets"]) == 0
    out = capsys.readouterr().out
    assert "depth_long" in out and "tiny" not in out
