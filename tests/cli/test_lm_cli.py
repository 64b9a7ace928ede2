"""The LM commands as a user types them (in process): data prepare, train lm, eval, generate, and
one clear line with exit status 2 for every kind of bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from lm_helpers import SHORT_RUN, one_line_error, run_cli, tiny_lm_argv
from tokenmix.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    """A user text file: the first 60 KB of the shipped excerpt."""
    from tokenmix.data.corpora import excerpt_text

    path = tmp_path_factory.mktemp("user") / "plays.txt"
    path.write_text(excerpt_text()[:60_000])
    return path


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, corpus_file) -> Path:
    """`tokenmix train lm` on a user file with a hybrid layer pattern (in this process)."""
    import os

    cache = tmp_path_factory.mktemp("cli_cache")
    os.environ["TOKENMIX_CACHE"] = str(cache)
    out = tmp_path_factory.mktemp("cli_runs") / "run"
    try:
        steps = ("train.max_steps=12", "train.eval_every=6", "train.log_every=6", "train.tensorboard=false")
        rc = main(tiny_lm_argv(out, *steps, corpus=corpus_file, log=True, options=("--layers", "pow2,attention")))
    finally:
        del os.environ["TOKENMIX_CACHE"]
    assert rc == 0
    return out


def test_train_writes_a_complete_run_directory(trained_run, capsys):
    cfg = json.loads((trained_run / "config.json").read_text())
    assert cfg["model"]["layers"] == ["pow2", "attention"] and cfg["model"]["vocab_size"] == 300
    assert Path(cfg["data"]["dir"]).is_dir()  # resolved: the prepared data this run used
    metrics = [json.loads(l) for l in (trained_run / "metrics.jsonl").read_text().splitlines()]
    steps = [m["step"] for m in metrics if "loss" in m]
    assert steps == list(range(1, 13))
    assert metrics[0]["event"] == "baseline" and metrics[0]["bigram_ppl"] > 1
    assert [m["step"] for m in metrics if "val_loss" in m] == [6, 12]
    summary = json.loads((trained_run / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["val_ppl"] == pytest.approx(math.exp(summary["val_loss"]))
    assert json.loads((trained_run / "checkpoints" / "latest.json").read_text())["step"] == 12


def test_eval_reports_perplexity_and_per_position_loss(trained_run, capsys):
    rc, out, err = run_cli(["eval", "--run", str(trained_run), "--json"], capsys)
    assert rc == 0, err
    res = json.loads(out)
    assert res["split"] == "test" and res["step"] == 12 and res["tokens"] > 0
    assert len(res["per_position_loss"]) == 32  # train.seq_len of the tiny preset
    assert res["ppl"] == pytest.approx(math.exp(res["loss"]))
    assert res["unigram_ppl"] > res["bigram_ppl"] > 1
    rc, out, err = run_cli(["eval", "--run", str(trained_run), "--split", "val", "--max-windows", "3"], capsys)
    assert rc == 0 and out.startswith("val loss ") and "per-position loss" in out


def test_generate_streams_a_continuation(trained_run, capsys):
    rc, out, err = run_cli(
        ["generate", "--run", str(trained_run), "--prompt", "KING.", "--max-new-tokens", "10", "--seed", "3"], capsys
    )
    assert rc == 0, err
    assert out.startswith("KING.") and len(out) > len("KING.\n")
    rc, again, _ = run_cli(
        ["generate", "--run", str(trained_run), "--prompt", "KING.", "--max-new-tokens", "10", "--seed", "3"], capsys
    )
    assert again == out  # seeded
    rc, out, err = run_cli(
        [
            "generate",
            "--run",
            str(trained_run),
            "--prompt",
            "A",
            "--prompt",
            "Enter the king",
            "--max-new-tokens",
            "5",
            "--json",
            "--temperature",
            "0",
        ],
        capsys,
    )
    items = json.loads(out)
    assert rc == 0 and [i["prompt"] for i in items] == ["A", "Enter the king"]
    assert all(i["new_tokens"] == 5 for i in items)


def test_data_prepare_prints_a_summary(tmp_path, corpus_file, capsys):
    rc, out, err = run_cli(
        [
            "data",
            "prepare",
            "--corpus",
            str(corpus_file),
            "--vocab-size",
            "280",
            "--out",
            str(tmp_path / "prep"),
            "--json",
        ],
        capsys,
    )
    assert rc == 0, err
    s = json.loads(out)
    assert s["vocab_size"] == 280 and s["splits"]["val"]["tokens"] > 0 and s["splits"]["train"]["documents"] > 10


def test_bad_input_is_one_line_and_exit_2(tmp_path, trained_run, capsys, monkeypatch):
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path / "cache"))
    missing = tmp_path / "nope.txt"
    one_line_error(run_cli(["data", "prepare", "--corpus", str(missing)], capsys), "nope.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    one_line_error(
        run_cli(["train", "lm", "--corpus", str(empty), "--preset", "tiny", "--out", str(tmp_path / "r1")], capsys),
        "empty",
    )
    binary = tmp_path / "latin1.txt"
    binary.write_bytes(b"na\xefve " * 100)
    one_line_error(run_cli(["data", "prepare", "--corpus", str(binary)], capsys), "not UTF-8")
    one_line_error(
        run_cli(["train", "lm", "--preset", "tiny", "--layers", "pow2,mamba9", "--out", str(tmp_path / "r2")], capsys),
        "unknown mixer 'mamba9'",
    )
    one_line_error(run_cli(["train", "lm", "--set", "train.lrate=1"], capsys), "unknown config key")
    long_prompt = "to be or not to be " * 40
    one_line_error(
        run_cli(["generate", "--run", str(trained_run), "--prompt", long_prompt], capsys),
        "prompt is",
        "at most 31 tokens",
    )
    one_line_error(run_cli(["eval", "--run", str(tmp_path / "no_run")], capsys), "does not exist")
    one_line_error(run_cli(["train", "lm", "--resume", str(trained_run), "--set", "train.lr=1"], capsys), "--resume")
    one_line_error(
        run_cli(["train", "lm", "--preset", "tiny", "--out", str(trained_run)], capsys), "already holds a run"
    )


def test_bf16_autocast_trains_close_to_fp32(tmp_path, corpus_file, capsys, monkeypatch):
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path / "cache"))
    first_losses = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision
        argv = tiny_lm_argv(out, *SHORT_RUN, "train.max_steps=3", f"train.precision={precision}", corpus=corpus_file)
        rc, _, err = run_cli(argv, capsys)
        assert rc == 0, err
        first_losses[precision] = [
            json.loads(l)["loss"] for l in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in l
        ]
    fp32, bf16 = first_losses["fp32"], first_losses["bf16"]
    assert fp32 != bf16  # autocast really ran the matmuls in bfloat16
    assert max(abs(a - b) for a, b in zip(fp32, bf16)) < 0.05


def test_generate_refuses_prompts_past_learned_positions(tmp_path, corpus_file, capsys, monkeypatch):
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "learned"
    argv = tiny_lm_argv(out, *SHORT_RUN, "model.positions=learned", "model.max_seq_len=32", corpus=corpus_file)
    rc, _, err = run_cli(argv, capsys)
    assert rc == 0, err
    rc, text, err = run_cli(["generate", "--run", str(out), "--prompt", "KING.", "--max-new-tokens", "100"], capsys)
    assert rc == 0, err  # capped to the 32 learned positions, with a note
    assert "capped" in err
    one_line_error(
        run_cli(["generate", "--run", str(out), "--prompt", "to be or not to be " * 10], capsys),
        "prompt is",
        "at most 31 tokens",
        "max_seq_len=32",
    )
    one_line_error(
        run_cli(["generate", "--run", str(out), "--prompt", "KING.", "--max-context", "64"], capsys),
        "--max-context 64",
        "max_seq_len=32",
    )


def test_summary_reports_the_whole_validation_split_against_the_bigram(trained_run):
    from tokenmix.data.prepare import PreparedData

    cfg = json.loads((trained_run / "config.json").read_text())
    data = PreparedData(cfg["data"]["dir"])
    summary = json.loads((trained_run / "summary.json").read_text())
    val_tokens = len(data.split("val"))
    assert summary["val_tokens"] == val_tokens - 1  # every target of the split, not the periodic sample
    assert summary["bigram_ratio"] == pytest.approx(summary["bigram_ppl"] / summary["val_ppl"])
    nats = summary["val_loss"] * summary["val_tokens"]
    assert summary["val_bits_per_char"] == pytest.approx(nats / (data.meta["splits"]["val"]["chars"] * math.log(2)))
    bigram_nats = math.log(summary["bigram_ppl"]) * summary["val_tokens"]  # the bigram on the same targets
    assert summary["bigram_bits_per_char"] == pytest.approx(
        bigram_nats / (data.meta["splits"]["val"]["chars"] * math.log(2))
    )
    final = [json.loads(l) for l in (trained_run / "metrics.jsonl").read_text().splitlines() if '"final"' in l]
    assert len(final) == 1 and final[0]["final_val_ppl"] == pytest.approx(summary["val_ppl"])
    assert summary["precision"] == cfg["train"]["precision"] == "fp32" and summary["process_cpu_seconds"] > 0


def test_precision_auto_resolves_by_cpu_flags(tmp_path, corpus_file, capsys, monkeypatch):
    import torch

    from tokenmix.training import lm_eval as lm

    assert lm.resolve_precision("auto", torch.device("cpu"))[0] == (
        "bf16" if lm.native_bf16(torch.device("cpu"))[0] else "fp32"
    )
    monkeypatch.setattr(lm, "native_bf16", lambda device: (False, "no native bf16 here"))
    assert lm.resolve_precision("auto", torch.device("cpu")) == ("fp32", "precision fp32 (no native bf16 here)")
    assert "much slower" in lm.resolve_precision("bf16", torch.device("cpu"))[1]
    monkeypatch.setattr(lm, "native_bf16", lambda device: (True, "AMX"))
    assert lm.resolve_precision("auto", torch.device("cpu"))[0] == "bf16"
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "auto"
    argv = tiny_lm_argv(out, *SHORT_RUN, "train.max_steps=1", "train.precision=auto", corpus=corpus_file, log=True)
    rc, text, err = run_cli(argv, capsys)
    assert rc == 0, err
    assert "precision bf16 autocast (AMX)" in text
    assert json.loads((out / "config.json").read_text())["train"]["precision"] == "bf16"  # what ran, not "auto"


def test_tensorboard_events_when_installed(tmp_path, corpus_file, capsys, monkeypatch):
    import importlib.util

    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "tb_run"
    rc, _, err = run_cli(tiny_lm_argv(out, *SHORT_RUN, "train.tensorboard=true", corpus=corpus_file), capsys)
    assert rc == 0, err
    if importlib.util.find_spec("tensorboard") is None:  # optional: the run still works, and writes no tb/
        assert not (out / "tb").exists()
        return
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [1, 2]
    assert acc.Scalars("final_val_ppl")[0].value > 1


def test_a_repeated_set_keeps_every_override(tmp_path, capsys):
    """``--set a=1 --set b=2`` applies both (argparse kept only the last ``--set``), in every command
    taking ``--set`` (and ``analyze cost --time-n``, the other option that takes a list)."""
    from tokenmix.cli.main import build_parser

    argv = ["train", "lm", "--preset", "tiny", "--set", "train.pack=true", "--set", "train.max_steps=50"]
    rc, out, err = run_cli([*argv, "--print-config"], capsys)
    assert rc == 0, err
    cfg = json.loads(out)
    assert cfg["train"]["pack"] is True and cfg["train"]["max_steps"] == 50
    parser = build_parser()
    args = parser.parse_args(["data", "prepare", "--set", "data.vocab_size=300", "--set", "data.val_fraction=0.2"])
    assert args.set == ["data.vocab_size=300", "data.val_fraction=0.2"]
    args = parser.parse_args(["train", "lm", "--set", "a=1", "b=2", "--set", "c=3"])
    assert args.set == ["a=1", "b=2", "c=3"]
    assert parser.parse_args(["train", "lm"]).set == []
    assert parser.parse_args(["analyze", "cost", "--time-n", "64", "--time-n", "128"]).time_n == [64, 128]
    assert parser.parse_args(["analyze", "cost", "--time-n"]).time_n == []
    assert parser.parse_args(["analyze", "cost"]).time_n is None


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "lm", "--set", "train.steps=50"],
        ["train", "lm", "--preset", "tiny", "--set", "train.max_steps=50", "--set", "train.lr=nan"],
        ["train", "lm", "--set", "model.d_model=wide"],
        ["data", "prepare", "--set", "data.nosuch=1"],
    ],
    ids=["unknown key", "nan", "not a number", "data prepare"],
)
def test_a_bad_set_is_refused_before_the_presets_load(argv):
    """An unknown key or a value of the wrong type is answered before the preset registry (and the
    analysis modules and matplotlib it loads) is imported, not after: a fresh process."""
    code = (
        "import sys\n"
        "from tokenmix.cli.main import main\n"
        f"rc = main({argv!r})\n"
        "print(rc, 'tokenmix.study.presets' in sys.modules, 'matplotlib' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.split() == ["2", "False", "False"], (proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_packed_run_on_data_without_a_separator_writes_nothing(tmp_path, capsys, monkeypatch):
    """``train.pack=true`` on prepared data whose tokenizer has no separator is refused before the run
    folder gets config.json, tokenizer.json or an empty metrics.jsonl."""
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path / "cache"))
    prep = tmp_path / "prep"
    rc, _, err = run_cli(["data", "prepare", "--preset", "tiny", "--out", str(prep), "--json"], capsys)
    assert rc == 0, err
    tok = prep / "tokenizer.json"
    tok.write_text(tok.read_text().replace("<|endoftext|>", "<|notaseparator|>"))
    out = tmp_path / "run"
    argv = tiny_lm_argv(out, "train.pack=true", f"data.dir={prep}")
    one_line_error(run_cli(argv, capsys), "no document separator")
    assert not out.exists() and {p.name for p in tmp_path.iterdir()} <= {"cache", "prep"}


def test_a_packed_run_says_so_in_its_log_and_its_eval(tmp_path, capsys, monkeypatch):
    """The training log opens with labelled lines (the precision is part of the model line, not a
    bare ``precision fp32`` line), and ``eval`` says when it scored packed."""
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    rc, log, err = run_cli(tiny_lm_argv(out, *SHORT_RUN, "train.pack=true", log=True), capsys)
    assert rc == 0, err
    lines = [line for line in log.splitlines() if line.strip() and not line.startswith("warning:")]
    assert lines[0].startswith("model: ") and "precision fp32" in lines[0], lines[:2]
    assert not any(line.startswith("precision") for line in lines)
    rc, text, err = run_cli(["eval", "--run", str(out), "--max-windows", "2"], capsys)
    assert rc == 0, err
    assert "packed as trained" in text.splitlines()[0]


def test_eval_per_document_counts_the_files_documents_whatever_their_text(trained_run, tmp_path, capsys):
    """A literal ``<|endoftext|>`` in an ``eval --text`` file is text: the file is as many documents
    as without it (each literal used to start a document of its own)."""
    plain, marked = tmp_path / "plain", tmp_path / "marked"
    for folder, extra in ((plain, ""), (marked, " <|endoftext|> ")):
        folder.mkdir()
        for i in range(3):
            (folder / f"d{i}.txt").write_text(" ".join(f"word{j}{extra if j % 5 == 0 else ''}" for j in range(60)))
    counts = []
    for folder in (plain, marked):
        rc, out, err = run_cli(
            ["eval", "--run", str(trained_run), "--text", str(folder), "--per-document", "--json"], capsys
        )
        assert rc == 0, err
        counts.append(len(json.loads(out)["documents"]))
    assert counts == [3, 3]
