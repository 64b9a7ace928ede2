"""``tokenmix bench hf`` at test size: the table and JSON, the two loops giving the same tokens, and bad input."""

from __future__ import annotations

import json

import pytest

from lm_helpers import one_line_error, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [
    "--d-model",
    "16",
    "--layers",
    "1",
    "--n-heads",
    "2",
    "--prompt",
    "5",
    "--new-tokens",
    "8",
    "--warmup",
    "2",
    "--repeats",
    "1",
    "--threads",
    "1",
]


def test_bench_hf_prints_a_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "hf.json"
    rc, stdout, _ = run_cli(["bench", "hf", "--mixers", "pow2_ce", "mamba2", *TINY, "--out", str(out)], capsys)
    assert rc == 0
    lines = stdout.strip().splitlines()
    assert "HF/tokenmix" in lines[1] and [l.split()[0] for l in lines[2:]] == ["pow2_ce", "mamba2"]
    report = json.loads(out.read_text())
    for r in report["results"]:
        assert r["same_tokens"] is True
        assert r["hf_ms_per_token"] > 0 and r["tokenmix_ms_per_token"] > 0
        assert r["ratio_hf_over_tokenmix"] == pytest.approx(r["hf_ms_per_token"] / r["tokenmix_ms_per_token"])
        assert r["timed_steps"] == 8 - 1 - 2


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--mixers", "nope"], "unknown mixer 'nope'"),
        (["--new-tokens", "3"], "--new-tokens must be >= warmup + 2"),
        (["--d-model", "0"], "--d-model must be >= 1"),
        (["--d-model", "100000000"], "--d-model 100,000,000 is too large"),
        (["--out", "/nonexistent-folder/x.json"], "does not exist"),
    ],
)
def test_bench_hf_bad_input_is_one_line(argv, words, capsys):
    one_line_error(run_cli(["bench", "hf", *argv], capsys), words)
