"""CLI of the core engine: one line and exit status 2 on bad input; JSON that parses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tokenmix.cli.main import main


def test_patterns_json(capsys):
    assert main(["patterns", "--pattern", "pow2", "--cache-efficient", "--n", "2048", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["cache_size"] == 11 and rep["pattern"] == "pow2_ce"


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["patterns", "--pattern", "nope"], "unknown pattern"),
        (["patterns", "--pattern", "pow2", "--n", "0"], "--n must be >= 1"),
        (["patterns", "--pattern", "f:2-k"], "strictly increasing"),
        (["bench", "solver", "--n", "-3"], "--n must be >= 1"),
    ],
)
def test_bad_input_one_line_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_module_entry_point():
    out = subprocess.run(
        [sys.executable, "-m", "tokenmix", "patterns", "--pattern", "sq1", "--n", "64"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "shortest_path_max=4" in out.stdout
