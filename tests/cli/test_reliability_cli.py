"""Issue 20's command-line items, one test each: absurd sizes refused up front naming the limit
(7, 10), ``tokenmix report`` on what is not a run and through symbolic-link loops (8), non-finite
sampling settings (11), ``bench solver|mixers`` exit status (12), contradictory options (13),
``--path-limit -1`` (14), and one clear line for invalid UTF-8, huge seeds, wrong config types, bad
head lists, files given as runs and special files given as corpora (20)."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from lm_helpers import train_tiny_run, within
from progress_guard import run_guarded
from tokenmix.cli.main import main
from tokenmix.generation import SamplingConfig, sample_next

pytestmark = pytest.mark.usefixtures("one_thread")
HUGE = "1000000000000"


def fails(argv: list[str], capsys, *needles: str, seconds: float = 15.0) -> str:
    """main(argv) exits 2 with exactly one line on stderr holding every needle; returns the line."""
    capsys.readouterr()
    with within(seconds):
        rc = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1, (rc, err)
    for needle in needles:
        assert needle in err[0], err[0]
    return err[0]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    return train_tiny_run(tmp_path_factory.mktemp("reliability"), main)


# ------------------------------------------------------------------------------------------ item 7
def test_absurd_pattern_and_expressivity_lengths_are_refused_naming_the_limit(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = fails(
        ["patterns", "--pattern", "dense", "--n", HUGE],
        capsys,
        "--n 1,000,000,000,000 is too large",
        "of memory available",
        "the largest --n that fits is",
    )
    largest = int(line.rsplit(" ", 1)[1].replace(",", ""))
    assert 1000 < largest < 10**7  # dense: an [n, n - 1] table
    fails(["analyze", "expressivity", "--n", HUGE], capsys, "too large", "the largest --n that fits is")
    assert not any(tmp_path.iterdir())  # no runs/analyze-expressivity-* folder left behind


# ------------------------------------------------------------------------------------------ item 8
def test_report_refuses_a_folder_that_is_not_a_run_and_writes_nothing(capsys, tmp_path):
    folder = tmp_path / "holiday"
    (folder / "photos").mkdir(parents=True)
    (folder / "photos" / "notes.txt").write_text("sea\n")
    fails(["report", str(folder)], capsys, "is not a tokenmix run directory", "quick")
    assert sorted(p.name for p in folder.rglob("*")) == ["notes.txt", "photos"]


def test_report_does_not_follow_symlink_loops(capsys, tmp_path):
    run = tmp_path / "run"
    (run / "a").mkdir(parents=True)
    (run / "results.csv").write_text("mixer,accuracy\npow2,0.5\n")
    os.symlink("..", run / "a" / "up")
    os.symlink(run, run / "a" / "again")
    with within(30):
        assert main(["report", str(run), "--quiet"]) == 0
    text = (run / "report" / "report.html").read_text()
    assert "0.5" in text and "symbolic links, not followed" in text
    not_run = tmp_path / "loops_only"
    not_run.mkdir()
    os.symlink(not_run, not_run / "self")
    fails(["report", str(not_run)], capsys, "is not a tokenmix run directory")


# ------------------------------------------------------------------------------------------ item 10
def test_huge_sizes_are_refused_before_allocating(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fails(["patterns", "--pattern", "pow2", "--n", HUGE], capsys, "the largest --n that fits")
    fails(["bench", "decode", "--n", HUGE, "--mixers", "pow2"], capsys, "the largest --n that fits")
    fails(["analyze", "cost", "--mixers", "pow2", "--cache-n", HUGE, "--time-n"], capsys, "the largest --cache-n")
    fails(["analyze", "cost", "--mixers", "pow2", "--time-n", HUGE], capsys, "the largest --time-n")
    fails(
        ["bench", "lm", "--contexts", HUGE, "--mixers", "pow2"],
        capsys,
        "context 1,000,000,000,000",
        "of memory available",
    )
    assert not any(tmp_path.iterdir())


def test_vocab_size_is_checked_before_the_tokenizer_trainer(tmp_path):
    # tokenizers aborts the whole process (status 134) when asked for 10^12 entries: a real process
    env = {**os.environ, "TOKENMIX_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    proc = run_guarded(
        [sys.executable, "-m", "tokenmix", "data", "prepare", "--vocab-size", HUGE, "--out", str(tmp_path / "prep")],
        env=env,
        cpu_seconds=120,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-1500:]
    assert "--vocab-size must be <= 16,777,216" in proc.stderr
    assert not (tmp_path / "prep").exists()


# ------------------------------------------------------------------------------------------ item 11
@pytest.mark.parametrize(
    "field,value", [("temperature", math.nan), ("temperature", math.inf), ("top_p", math.nan), ("top_p", math.inf)]
)
def test_non_finite_sampling_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=f"{field} must be a finite number"):
        SamplingConfig(**{field: value})


def test_tiny_temperature_samples_the_greedy_token_instead_of_nan():
    logits = torch.tensor([[1.0, 3.0, 2.0], [5.0, -1.0, 4.5]])
    cfg = SamplingConfig(temperature=1e-40)
    gens = [torch.Generator().manual_seed(0) for _ in range(2)]
    assert sample_next(logits, cfg, gens).tolist() == [1, 0]


def test_generate_refuses_nan_settings_in_one_line(trained_run, capsys):
    fails(
        ["generate", "--run", str(trained_run), "--prompt", "hi", "--temperature", "nan"],
        capsys,
        "temperature must be a finite number",
    )
    fails(
        ["generate", "--run", str(trained_run), "--prompt", "hi", "--top-p", "nan"],
        capsys,
        "top_p must be a finite number",
    )


# ------------------------------------------------------------------------------------------ item 12
def test_bench_solver_and_mixers_exit_2_on_unknown_mixers_and_absurd_sizes(capsys):
    fails(["bench", "solver", "--patterns", "nosuch", "--n", "64"], capsys, "unknown mixer 'nosuch'")
    fails(["bench", "solver", "--patterns", "attention", "--n", "64"], capsys, "has no compiled/chunked mode")
    fails(["bench", "mixers", "--mixers", "nosuch", "--n", "64"], capsys, "unknown mixer 'nosuch'")
    fails(["bench", "solver", "--n", HUGE], capsys, "the largest --n that fits")
    fails(["bench", "mixers", "--n", HUGE], capsys, "the largest --n that fits")


# ------------------------------------------------------------------------------------------ item 13
def test_matrix_refuses_contradictory_sources(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fails(["analyze", "matrix", "--mixer", "pow2", "--run", str(tmp_path), "--text", "hi"], capsys, "not both")
    fails(["analyze", "matrix", "--mixer", "pow2", "--text", "hi"], capsys, "--text needs --run")
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------ item 14
def test_negative_path_limits_are_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fails(["patterns", "--pattern", "pow2", "--n", "64", "--path-limit", "-1"], capsys, "--path-limit must be >= 0")
    fails(["analyze", "expressivity", "--n", "64", "--path-limit", "-1"], capsys, "--path-limit must be >= 0")
    fails(["analyze", "expressivity", "--n", "64", "--operator-limit", "-1"], capsys, "--operator-limit must be >= 0")


# ------------------------------------------------------------------------------------------ item 20
def test_parse_errors_are_one_line(capsys):
    line = fails(["generate", "--run", "x", "--seed", "1e20"], capsys, "--seed", "invalid int value: '1e20'")
    assert line.startswith("tokenmix generate: error:")
    fails(["patterns", "--pattern", "pow2", "--n", "abc"], capsys, "invalid int value")
    fails([], capsys, "required")


def test_invalid_utf8_and_huge_seed_are_named(trained_run, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    bad = b"caf\xe9".decode("utf-8", "surrogateescape")  # how Python hands over such an argument
    fails(["generate", "--run", str(trained_run), "--prompt", bad], capsys, "--prompt is not valid UTF-8", "0xe9")
    fails(["analyze", "matrix", "--run", str(trained_run), "--text", bad], capsys, "--text is not valid UTF-8")
    fails(
        ["generate", "--run", str(trained_run), "--prompt", "hi", "--seed", str(10**20)],
        capsys,
        "seed must be in [0, 2**63)",
    )
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "section,key,value,needle",
    [
        ("model", "d_model", "32", "model.d_model must be an integer, got '32'"),
        ("model", "layers", 5, "model.layers must be a list of names"),
        ("model", "mixer_overrides", [1], "model.mixer_overrides must be a JSON object"),
        ("data", "vocab_size", None, "data.vocab_size must be an integer, got None"),
        ("train", "seq_len", "abc", "train.seq_len must be"),
    ],
)
def test_wrong_types_in_a_runs_config_are_named(trained_run, tmp_path, capsys, section, key, value, needle):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    cfg = json.loads((run / "config.json").read_text())
    cfg[section][key] = value
    (run / "config.json").write_text(json.dumps(cfg))
    fails(["generate", "--run", str(run), "--prompt", "hi"], capsys, needle)
    fails(["eval", "--run", str(run)], capsys, needle)


def test_show_heads_file_runs_and_special_corpora_are_named(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path / "cache"))
    fails(
        ["analyze", "matrix", "--mixer", "pow2", "--show-heads", "a,b"],
        capsys,
        "--show-heads takes comma-separated head indices",
    )
    fails(
        ["analyze", "matrix", "--mixer", "pow2", "--n", "8", "--d-model", "8", "--show-heads", "5"],
        capsys,
        "--show-heads 5 out of range",
    )
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    fails(["eval", "--run", str(plain)], capsys, "is not a run directory", "file")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fails(["data", "prepare", "--corpus", str(fifo), "--out", str(tmp_path / "p1")], capsys, "is a FIFO")
    fails(["data", "prepare", "--corpus", "/dev/zero", "--out", str(tmp_path / "p2")], capsys, "is a character device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "plain.txt"]
