"""A newcomer's first hour, item 1: long commands show progress in a log too (stderr/stdout that is
not a terminal, as under ``make ... > log`` or CI): done/total, elapsed, ETA, and one warning when
other work already loads the machine."""

from __future__ import annotations

import os
import re

import pytest

from lm_helpers import run_cli
from tokenmix.core import progress

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_benchmark_logs_each_case_with_its_count_and_eta(capsys, monkeypatch):
    monkeypatch.setattr(progress, "busy_cores", lambda: 1.6)  # other work holds 1.6 cores
    rc, out, err = run_cli(
        ["bench", "packed", "--mixers", "first_order,attention", "--rows", "1", "--row-length", "32", "--repeats", "1"],
        capsys,
    )
    assert rc == 0, err
    assert re.search(r"bench packed: 1/2 cases \(50%\), \d+:\d\d elapsed, ETA \d+:\d\d -- mixer=first_order", err), err
    assert re.search(r"bench packed: 2/2 cases \(100%\), \d+:\d\d elapsed -- mixer=attention", err), err
    assert err.count("the machine is busy") == 1
    assert out.lstrip().startswith("{")  # stdout holds the JSON alone


def test_train_lm_logs_steps_with_elapsed_and_eta(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress, "busy_cores", lambda: 1.6)
    monkeypatch.setitem(os.environ, "TOKENMIX_CACHE", str(tmp_path / "cache"))
    rc, out, err = run_cli(
        [
            "train",
            "lm",
            "--preset",
            "tiny",
            "--out",
            str(tmp_path / "run"),
            "--no-progress",
            "--set",
            "train.max_steps=4",
            "train.log_every=2",
            "train.eval_every=4",
            "train.eval_windows=1",
            "train.final_eval_windows=1",
            "train.threads=1",
        ],
        capsys,
    )
    assert rc == 0, err
    assert re.search(r"step 2/4  loss [\d.]+ .* tok/s  \d+:\d\d elapsed, ETA \d+:\d\d", out), out
    assert re.search(r"step 4/4  loss [\d.]+ .* tok/s  \d+:\d\d elapsed\n", out), out
    assert (out + err).count("the machine is busy") == 1
