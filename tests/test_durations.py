"""Durations are stated once (study/durations.py): README, ``tokenmix --help`` and the presets' lines
state the table's numbers, and README states no duration the table does not hold."""

from __future__ import annotations

import re
from pathlib import Path

from tokenmix.cli.main import build_parser
from tokenmix.study.durations import DURATIONS, stated
from tokenmix.study.presets import get_preset

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()

# where README states each duration: the text around it, {} standing for the table's value
README_PLACES = {
    "make compare    # the main job on built-in defaults ({};": "compare quick",
    "exactly what CI runs ({};": "make test",
    "Fast tests, kernels against references ({}):": "fast tests",
    "copy / recall / multi-hop (quick preset, {})": "compare quick",
    "with a plot ({})": "design",
    "modes, cost and cache ({});": "list",
    "the independent cross-checks with their errors ({})": "check all",
    "for the `train lm` of that preset ({})": "data prepare",
    "atomic safetensors checkpoints; {})": "train lm",
    "`bench mixers` take {} at their defaults": "bench default",
    "`--preset small` ({}) learns words": "lm small",
}
DURATION = re.compile(r"[~≤] ?\d+ (?:s|min)\b")


def test_readme_states_the_tables_durations():
    for place, key in README_PLACES.items():
        assert place.format(stated(key)) in README, f"README should say {place.format(stated(key))!r}"


def test_readme_states_no_other_duration():
    assert len(DURATION.findall(README)) == len(README_PLACES), DURATION.findall(README)


def test_presets_state_the_tables_durations():
    for key in DURATIONS:
        kind, _, name = key.partition(" ")
        if kind in ("compare", "lm"):  # a preset's own line
            assert f"({stated(key)}" in get_preset(kind, name).summary, (key, get_preset(kind, name).summary)
    assert f"({stated('train lm')})" in get_preset("lm", "default").summary  # train lm's default preset


def test_help_states_the_tables_durations():
    text = build_parser().format_help()
    for key in ("compare quick", "make test", "check all"):
        assert stated(key) in text, (key, text)
