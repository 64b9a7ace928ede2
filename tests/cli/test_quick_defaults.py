"""A newcomer's first hour, item 3: ``analyze cost``, ``bench solver`` and ``bench mixers`` answer in
about a minute at their defaults (a few mixers and lengths; measured in docs/results.md), the whole
sweep is ``--full``, and the help says how long each takes."""

from __future__ import annotations

import argparse

import pytest

from lm_helpers import run_cli
from tokenmix.analysis.defaults import COST_FULL_TIME_N, COST_QUICK_MIXERS, COST_QUICK_TIME_N
from tokenmix.bench import mixers, solver
from tokenmix.bench.settings import (
    FULL_MIXER_SIZES,
    FULL_SOLVER_SIZES,
    QUICK_MIXER_SIZES,
    QUICK_MIXERS,
    QUICK_SOLVER_PATTERNS,
    QUICK_SOLVER_SIZES,
)
from tokenmix.cli import analysis_cmd
from tokenmix.cli.main import build_parser
from tokenmix.mixers.registry import mixer_names

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def seen(monkeypatch):
    calls = {}

    def fake(kind):
        def run(*args, **kwargs):
            calls[kind] = (args, kwargs)
            return {"summary": {}, "threads": 1} if kind == "cost" else {}

        return run

    monkeypatch.setattr(mixers, "run", fake("mixers"))
    monkeypatch.setattr(solver, "run", fake("solver"))
    monkeypatch.setattr(analysis_cmd, "run_accounting", fake("cost"))
    return calls


@pytest.mark.parametrize("full", [False, True])
def test_bench_mixers_and_solver_default_to_a_minute_and_full_to_the_sweep(seen, capsys, full):
    flag = ["--full"] if full else []
    assert run_cli(["bench", "mixers", *flag], capsys)[0] == 0
    sizes, names = seen["mixers"][0][:2]
    assert sizes == list(FULL_MIXER_SIZES if full else QUICK_MIXER_SIZES)
    assert names == (mixer_names() if full else list(QUICK_MIXERS))
    assert run_cli(["bench", "solver", *flag], capsys)[0] == 0
    sizes, patterns = seen["solver"][0][:2]
    assert sizes == list(FULL_SOLVER_SIZES if full else QUICK_SOLVER_SIZES)
    assert patterns == (None if full else list(QUICK_SOLVER_PATTERNS))  # None: every structured pattern


@pytest.mark.parametrize("full", [False, True])
def test_analyze_cost_defaults_to_a_minute_and_full_to_every_mixer(seen, capsys, tmp_path, full):
    rc, _, err = run_cli(["analyze", "cost", "--out", str(tmp_path / "o"), *(["--full"] if full else [])], capsys)
    assert rc == 0, err
    args, kwargs = seen["cost"]
    assert args[0] == (mixer_names() if full else list(COST_QUICK_MIXERS))
    assert kwargs["time_ns"] == list(COST_FULL_TIME_N if full else COST_QUICK_TIME_N)


def _subcommand_help(group: str, name: str) -> str:
    parser = build_parser()
    groups = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub = next(a for a in groups.choices[group]._actions if isinstance(a, argparse._SubParsersAction))
    return next(a.help for a in sub._choices_actions if a.dest == name)


@pytest.mark.parametrize("command", [("bench", "mixers"), ("bench", "solver"), ("analyze", "cost")])
def test_the_help_says_how_long(command):
    assert "~1 min" in _subcommand_help(*command)
