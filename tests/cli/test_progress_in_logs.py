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
    assert re.search(r"bench packed: 1/2 cases \(50%\), \d+:\d\d elapsed, ETA in \d+:\d\d -- mixer=first_order", err), (
        err
    )
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
    assert re.search(r"step 2/4  loss [\d.]+ .* tok/s  \d+:\d\d elapsed, ETA in \d+:\d\d", out), out
    assert re.search(r"step 4/4  loss [\d.]+ .* tok/s  \d+:\d\d elapsed\n", out), out
    assert (out + err).count("the machine is busy") == 1


def test_check_logs_each_mixer_as_it_finishes(capsys, monkeypatch):
    """Issue 40 item 4: ``check --all`` was silent until every mixer was done."""
    monkeypatch.setattr(progress, "busy_cores", lambda: 0.0)
    rc, out, err = run_cli(["check", "--mixer", "first_order", "attention", "--json"], capsys)
    assert rc == 0, err
    assert re.search(r"check: 0/2 mixers \(0%\), \d+:\d\d elapsed -- started", err), err
    assert re.search(r"check: 1/2 mixers \(50%\), \d+:\d\d elapsed, ETA in \d+:\d\d -- first_order ok", err), err
    assert re.search(r"check: 2/2 mixers \(100%\), \d+:\d\d elapsed -- attention ok", err), err
    assert out.lstrip().startswith("{")  # stdout holds the JSON alone
    rc, _, err = run_cli(["check", "--mixer", "first_order", "--quiet"], capsys)
    assert rc == 0 and err == ""


def test_data_prepare_logs_its_stages(tmp_path, capsys, monkeypatch):
    """Issue 40 item 4: ``data prepare`` was silent through tokenizer training."""
    monkeypatch.setitem(os.environ, "TOKENMIX_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"paragraph {i}: the quick brown fox jumps over the lazy dog" for i in range(60)))
    argv = ["data", "prepare", "--corpus", str(corpus), "--vocab-size", "300", "--out", str(tmp_path / "prep")]
    rc, out, err = run_cli(argv, capsys)
    assert rc == 0, err
    lines = err.splitlines()
    assert re.fullmatch(r"data prepare: 0/2 stages \(0%\), \d+:\d\d elapsed -- started", lines[0]), err
    assert re.search(r"corpus.txt: \d+ documents, [\d,]+ characters; training the tokenizer \(300-token BPE\)", err)
    assert re.search(r"data prepare: 1/2 stages \(50%\), .* -- encoding and writing", err), err
    assert lines[-1].startswith("data prepare: 2/2 stages (100%)") and lines[-1].endswith("-- done"), err
    assert "prepared" in out
