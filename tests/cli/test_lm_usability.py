"""Issue 19, items 4b, 5 and 6: LM runs a person can drive and read.

eval on any text and at longer contexts (and --device), the LM report page, "worse than the bigram"
said plainly, the TensorBoard warning, BPE progress, --print-config / --config / --init-from, the
schedule a resume may extend, `list --json` with config fields, and one --mixers syntax.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lm_helpers import one_line_error, run_cli
from tokenmix.cli.main import main
from tokenmix.core import progress

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = [
    "--preset",
    "tiny",
    "--no-progress",
    "--set",
    "train.threads=1",
    "train.eval_windows=1",
    "train.final_eval_windows=2",
    "train.tensorboard=false",
]
HEX64 = re.compile(r"\b[0-9a-f]{64}\b")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("usability_cache")


@pytest.fixture(autouse=True)
def _cache_env(cache, monkeypatch):
    monkeypatch.setenv("TOKENMIX_CACHE", str(cache))


def _train(out: Path, *sets: str, extra: tuple[str, ...] = ()) -> None:
    rc = main(["train", "lm", "--out", str(out), "--quiet", *extra, *BASE, *sets])
    assert rc == 0


@pytest.fixture(scope="module")
def run(cache, tmp_path_factory) -> Path:
    """A finished tiny position-free run (4 steps)."""
    os.environ["TOKENMIX_CACHE"] = str(cache)
    try:
        out = tmp_path_factory.mktemp("usability") / "run"
        _train(out, "train.max_steps=4", "train.eval_every=2")
    finally:
        del os.environ["TOKENMIX_CACHE"]
    return out


def _by_hand_loss(model, ids: list[int], context: int) -> float:
    """Mean next-token loss over consecutive windows of ``context`` targets, computed here."""
    total, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, context):
            w = torch.tensor(ids[s : s + context + 1]).unsqueeze(0)
            logits, _ = model(w[:, :-1])
            total += F.cross_entropy(logits.flatten(0, 1).double(), w[0, 1:], reduction="sum").item()
            count += w.shape[1] - 1
    return total / count


# ------------------------------------------------------------------------------------------ eval
def test_eval_text_equals_the_same_windows_by_hand(run, tmp_path, capsys):
    from tokenmix.data.corpora import excerpt_text
    from tokenmix.data.tokenizer import separator_id
    from tokenmix.runs.lm import load_run

    text = " ".join(excerpt_text()[5000:7000].split())  # one paragraph: one document
    path = tmp_path / "mine.txt"
    path.write_text(text)
    loaded = load_run(run)
    ids = [separator_id(loaded.tokenizer), *loaded.tokenizer.encode(text, add_special_tokens=False).ids]
    for context in (None, 64):  # the training length (32), and twice it: position-free mixers extrapolate
        argv = ["eval", "--run", str(run), "--text", str(path), "--json"]
        rc, out, err = run_cli(argv + (["--context", str(context)] if context else []), capsys)
        assert rc == 0, err
        res = json.loads(out)
        expected = _by_hand_loss(loaded.model, ids, context or 32)
        assert math.isfinite(res["loss"]) and res["loss"] == pytest.approx(expected, rel=1e-5)
        assert res["tokens"] == len(ids) - 1 and res["text"] == str(path)
        assert len(res["per_position_loss"]) == (context or 32) and res["context"] == (context or 32)
    rc, out, err = run_cli(["eval", "--run", str(run), "--text", str(path), "--context", "64"], capsys)
    assert rc == 0 and "context 64 (trained at 32)" in out and "than the bigram" in out
    one_line_error(run_cli(["eval", "--run", str(run), "--text", str(path), "--split", "val"], capsys), "not both")
    one_line_error(run_cli(["eval", "--run", str(run), "--text", str(tmp_path / "nope.txt")], capsys), "nope.txt")


def test_context_past_learned_positions_is_one_line(tmp_path, capsys):
    learned = tmp_path / "learned"
    _train(learned, "train.max_steps=1", "model.positions=learned", "model.max_seq_len=32")
    rc, out, err = run_cli(["eval", "--run", str(learned), "--context", "32", "--max-windows", "2", "--json"], capsys)
    assert rc == 0, err
    one_line_error(
        run_cli(["eval", "--run", str(learned), "--context", "64"], capsys), "--context 64", "max_seq_len=32"
    )


def test_device_cuda_without_cuda_is_one_line(run, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    one_line_error(
        run_cli(["eval", "--run", str(run), "--device", "cuda"], capsys), "--device cuda", "CUDA is not available"
    )
    one_line_error(
        run_cli(["generate", "--run", str(run), "--prompt", "A", "--device", "cuda"], capsys),
        "--device cuda",
        "CUDA is not available",
    )
    rc, out, err = run_cli(["eval", "--run", str(run), "--device", "auto", "--max-windows", "1", "--json"], capsys)
    assert rc == 0 and json.loads(out)["device"] == "cpu"
    rc, out, err = run_cli(
        ["generate", "--run", str(run), "--prompt", "A", "--device", "auto", "--max-new-tokens", "3", "--json"], capsys
    )
    assert rc == 0 and json.loads(out)[0]["new_tokens"] == 3


# ---------------------------------------------------------------------------------------- report
def test_report_page_shows_curves_baselines_generations_and_hides_hashes(run, tmp_path, capsys):
    out = tmp_path / "page"
    rc, text, err = run_cli(["report", str(run), "--out", str(out)], capsys)
    assert rc == 0, err
    assert (out / "figures" / "loss.png").read_bytes().startswith(b"\x89PNG")
    assert (out / "figures" / "lr.png").is_file()
    page = (out / "report.html").read_text()
    main_part, appendix = page.split('id="appendix"')
    summary = json.loads((run / "summary.json").read_text())
    for number in (summary["val_ppl"], summary["bigram_ppl"], summary["unigram_ppl"]):
        assert f"{number:.4g}" in main_part  # the result table: the model next to both baselines
    assert "than the bigram" in main_part and main_part.count("data:image/png;base64,") >= 2
    assert 'alt="loss.png"' in main_part
    assert "<pre><strong>" in main_part  # generations
    assert not HEX64.search(main_part)  # checkpoint hashes are kept out of the main page ...
    assert HEX64.search(appendix) and "param_groups" in appendix  # ... in the appendix, with the optimizer's
    assert "param_groups" not in main_part
    md = (out / "report.md").read_text()
    md_main, md_appendix = md.split("## Appendix")
    assert "](figures/loss.png)" in md_main and not HEX64.search(md_main) and HEX64.search(md_appendix)


def test_a_run_worse_than_the_bigram_says_so_in_words(tmp_path, capsys):
    from tokenmix.runs.lm import bigram_verdict

    assert bigram_verdict(10.0, 20.0) == "better than the bigram (perplexity 10.00 vs 20.00, 2.00x lower)"
    assert bigram_verdict(40.0, 20.0) == "worse than the bigram (perplexity 40.00 vs 20.00, 2.00x higher)"
    rc, out, err = run_cli(
        ["train", "lm", "--out", str(tmp_path / "untrained"), *BASE, "train.max_steps=1", "train.lr=1e-9"], capsys
    )
    assert rc == 0, err
    done = [line for line in out.splitlines() if line.startswith("done:")]
    assert len(done) == 1 and "worse than the bigram" in done[0] and "x higher" in done[0], done
    assert "lower" not in done[0]


def test_tensorboard_requested_but_missing_warns_once(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # an import of it fails, installed or not
    base = [a for a in BASE if a != "train.tensorboard=false"]
    rc, _, err = run_cli(
        ["train", "lm", "--out", str(tmp_path / "tb"), *base, "train.max_steps=3", "train.tensorboard=true"], capsys
    )
    assert rc == 0, err
    assert err.count("tensorboard is not installed") == 1
    rc, _, err = run_cli(["train", "lm", "--out", str(tmp_path / "notb"), *BASE, "train.max_steps=1"], capsys)
    assert rc == 0 and "tensorboard" not in err


def test_one_bigram_baseline_from_the_first_line_to_the_summary(tmp_path, capsys):
    """The baseline is counted once, on the targets of the final evaluation (the periodic passes here
    score fewer windows): the start line, the validation lines, the closing line and summary.json
    show the same number, and metrics.jsonl holds one baseline record."""
    run = tmp_path / "run"
    rc, out, err = run_cli(["train", "lm", "--out", str(run), *BASE, "train.max_steps=2", "train.eval_every=1"], capsys)
    assert rc == 0, err
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    bases = [r for r in recs if "bigram_ppl" in r and "event" in r and "baseline" in r["event"]]
    assert len(bases) == 1 and bases[0]["event"] == "baseline"
    bigram = json.loads((run / "summary.json").read_text())["bigram_ppl"]
    assert bases[0]["bigram_ppl"] == bigram
    shown = re.findall(r"bigram(?: ppl)? ([0-9.]+)|perplexity [0-9.]+ vs ([0-9.]+)", out)
    values = {a or b for a, b in shown}
    assert len(shown) >= 4 and values == {f"{bigram:.2f}"}, out


def test_data_prepare_prepares_what_train_reads_and_says_where(tmp_path, capsys, monkeypatch):
    """``data prepare --preset P`` prepares the data ``train lm --preset P`` reads (the presets differ in
    vocabulary), and says where the cache is and which command reuses it."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TOKENMIX_CACHE", str(cache))
    rc, out, err = run_cli(["data", "prepare", "--corpus", "excerpt", "--preset", "tiny"], capsys)
    assert rc == 0, err
    prepared = sorted(p for p in (cache / "prepared").iterdir() if not p.name.startswith("."))
    assert len(prepared) == 1
    assert f"cache: {cache} ($TOKENMIX_CACHE)" in out.splitlines()
    assert "`tokenmix train lm --corpus excerpt --preset tiny` reads it without preparing again" in out
    run = tmp_path / "run"
    argv = ["train", "lm", "--corpus", "excerpt", "--preset", "tiny", "--out", str(run), "--quiet"]
    assert run_cli([*argv, "--set", "train.max_steps=1", "train.threads=1", "train.eval_windows=1"], capsys)[0] == 0
    assert sorted(p for p in (cache / "prepared").iterdir() if not p.name.startswith(".")) == prepared
    assert json.loads((run / "config.json").read_text())["data"]["dir"] == str(prepared[0])


def test_a_default_run_prints_no_warning(tmp_path, capsys, monkeypatch):
    """TensorBoard is in no extra, so a run that does not ask for it is not told it is missing (on a
    quiet machine: a busy one is worth its one warning, tests/cli/test_progress_in_logs.py)."""
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # missing, installed or not
    monkeypatch.setattr(progress, "busy_cores", lambda: 0.0)
    argv = ["train", "lm", "--preset", "tiny", "--out", str(tmp_path / "run"), "--set", "train.max_steps=2"]
    rc, out, err = run_cli([*argv, "train.threads=1", "train.eval_windows=1", "train.final_eval_windows=1"], capsys)
    assert rc == 0, err
    said = [line for line in (out + err).splitlines() if "warning" in line.lower() or "tensorboard" in line.lower()]
    assert said == []
    assert not (tmp_path / "run" / "tb").exists()


def test_bpe_training_shows_progress_where_asked(monkeypatch):
    from tokenmix.data import tokenizer as tk

    seen = []
    real = tk.trainers.BpeTrainer

    def spy(**kw):
        seen.append(kw["show_progress"])
        return real(**kw)

    monkeypatch.setattr(tk.trainers, "BpeTrainer", spy)
    tk.train_bpe(["to be or not to be"] * 5, 260, show_progress=True)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    tk.train_bpe(["to be or not to be"] * 5, 260)  # default: only on a terminal
    assert seen == [True, False]


# ---------------------------------------------------------------------------------- configuration
def test_print_config_is_the_config_train_uses(tmp_path, capsys, monkeypatch, cache):
    from tokenmix.cli import lm_cmd
    from tokenmix.runs.lm import LMRunConfig, LMTrainConfig

    argv = [
        "train",
        "lm",
        "--preset",
        "tiny",
        "--layers",
        "pow2,attention",
        "--set",
        "train.lr=3e-3",
        "model.d_model=48",
        "train.max_steps=1",
        "train.threads=1",
        "train.eval_windows=1",
        "train.final_eval_windows=1",
        "train.tensorboard=false",
    ]
    rc, out, err = run_cli(argv + ["--print-config", "--out", str(tmp_path / "never")], capsys)
    assert rc == 0, err
    printed = json.loads(out)
    assert not (tmp_path / "never").exists()  # nothing trained, nothing written
    assert set(printed["train"]) == {f.name for f in dataclasses.fields(LMTrainConfig)}  # defaults included
    assert printed["model"]["layers"] == ["pow2", "attention"] and printed["train"]["lr"] == 3e-3
    seen = []
    monkeypatch.setattr(lm_cmd, "train_lm", lambda cfg, run_dir, **kw: seen.append(cfg))
    assert run_cli(argv + ["--out", str(tmp_path / "r")], capsys)[0] == 0
    assert seen[0].to_dict() == printed and LMRunConfig.from_dict(printed) == seen[0]
    monkeypatch.undo()
    monkeypatch.setenv("TOKENMIX_CACHE", str(cache))
    rc, _, err = run_cli(argv + ["--out", str(tmp_path / "real"), "--quiet"], capsys)
    assert rc == 0, err
    written = json.loads((tmp_path / "real" / "config.json").read_text())
    for resolved in (("model", "vocab_size"), ("data", "dir")):  # what the prepared data fixes
        written[resolved[0]].pop(resolved[1])
        printed[resolved[0]].pop(resolved[1])
    assert written == printed


def test_config_file_round_trips_and_set_applies_on_top(tmp_path, capsys):
    rc, first, _ = run_cli(["train", "lm", "--preset", "tiny", "--set", "train.lr=4e-3", "--print-config"], capsys)
    assert rc == 0
    full = tmp_path / "full.json"
    full.write_text(first)
    rc, again, err = run_cli(["train", "lm", "--config", str(full), "--print-config"], capsys)
    assert rc == 0 and json.loads(again) == json.loads(first), err
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"train": {"lr": 0.005}, "model": {"layers": ["pow2", "attention"]}}))
    rc, out, _ = run_cli(["train", "lm", "--preset", "tiny", "--config", str(partial), "--print-config"], capsys)
    rc2, expected, _ = run_cli(
        ["train", "lm", "--preset", "tiny", "--set", "train.lr=0.005", "model.layers=pow2,attention", "--print-config"],
        capsys,
    )
    assert rc == rc2 == 0 and json.loads(out) == json.loads(expected)  # missing fields keep the preset's
    rc, out, _ = run_cli(["train", "lm", "--config", str(partial), "--set", "train.lr=0.007", "--print-config"], capsys)
    assert rc == 0 and json.loads(out)["train"]["lr"] == 0.007
    bad = tmp_path / "bad.json"
    for content, words in (
        ("{not json", ("not valid JSON",)),
        ('{"train": {"lrate": 1}}', ("train.lrate",)),
        ('{"train": {"lr": "fast"}}', ("train.lr", "finite number")),
        ('{"model": {"layers": "pow2"}}', ("model.layers", "list of names")),
        ('{"optimizer": {}}', ("unknown config section",)),
        ("[1, 2]", ("JSON object",)),
    ):
        bad.write_text(content)
        one_line_error(run_cli(["train", "lm", "--config", str(bad), "--print-config"], capsys), str(bad), *words)
    one_line_error(run_cli(["train", "lm", "--config", str(tmp_path / "none.json")], capsys), "does not exist")


def test_init_from_starts_a_new_run_from_the_source_weights(run, tmp_path, capsys):
    from tokenmix.data.loader import DataPosition, TokenBatches
    from tokenmix.data.prepare import PreparedData
    from tokenmix.runs.lm import load_run, read_metrics

    new = tmp_path / "new"
    rc, out, err = run_cli(
        ["train", "lm", "--out", str(new), "--init-from", str(run), *BASE, "train.max_steps=2"], capsys
    )
    assert rc == 0, err
    assert "initial weights from" in out
    records = read_metrics(new)
    init = [r for r in records if r.get("event") == "init_from"]
    assert init and init[0]["checkpoint"] == "step_0000004" and init[0]["source_step"] == 4
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]  # a new run: the step, schedule and optimizer start at 0
    # the first step's loss is the source checkpoint's model on the first batch
    source = load_run(run)
    cfg = source.config
    batch = TokenBatches(
        PreparedData(cfg.data.dir).split("train"),
        cfg.train.seq_len,
        cfg.train.batch_size,
        cfg.train.seed,
        DataPosition(),
    ).next_batch()
    with torch.no_grad():
        logits, _ = source.model(batch[:, :-1])
        expected = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).item()
    assert steps[0]["loss"] == pytest.approx(expected, rel=1e-5)
    fresh = [r["loss"] for r in read_metrics(run) if r.get("step") == 1 and "loss" in r]
    assert fresh[0] != pytest.approx(expected, rel=1e-4)  # freshly initialised weights give another loss
    one_line_error(
        run_cli(
            ["train", "lm", "--out", str(tmp_path / "wide"), "--init-from", str(run), *BASE, "model.d_model=64"], capsys
        ),
        "--init-from",
        "model.d_model 32 vs 64",
    )
    assert not (tmp_path / "wide").exists()
    one_line_error(run_cli(["train", "lm", "--resume", str(run), "--init-from", str(run)], capsys), "--init-from")


def test_resume_takes_only_a_longer_schedule(run, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    rc, out, err = run_cli(["train", "lm", "--resume", str(copy)], capsys)
    assert rc == 0 and "finished" in out and "--set train.max_steps=N" in out
    one_line_error(
        run_cli(["train", "lm", "--resume", str(copy), "--set", "train.lr=1"], capsys),
        "--resume",
        "train.max_steps",
        "train.lr=1",
    )
    one_line_error(
        run_cli(["train", "lm", "--resume", str(copy), "--set", "train.max_steps=3"], capsys),
        "train.max_steps=3",
        "step 4",
    )
    rc, out, err = run_cli(["train", "lm", "--resume", str(copy), "--quiet", "--set", "train.max_steps=6"], capsys)
    assert rc == 0, err
    steps = [json.loads(l)["step"] for l in (copy / "metrics.jsonl").read_text().splitlines() if '"loss"' in l]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert json.loads((copy / "config.json").read_text())["train"]["max_steps"] == 6  # the next resume knows
    rc, out, _ = run_cli(["train", "lm", "--resume", str(copy)], capsys)
    assert rc == 0 and "step 6 of train.max_steps=6" in out
    rc, out, _ = run_cli(["train", "lm", "--resume", str(copy), "--set", "train.max_steps=9", "--print-config"], capsys)
    assert rc == 0 and json.loads(out)["train"]["max_steps"] == 9


# --------------------------------------------------------------------------------------- registry
def test_list_json_gives_every_mixer_with_its_config_fields(capsys):
    from tokenmix.mixers.registry import get_mixer_spec, mixer_names

    rc, out, err = run_cli(["list", "--json"], capsys)
    assert rc == 0, err
    rows = {r["name"]: r for r in json.loads(out)}
    assert list(rows) == mixer_names()
    for name, row in rows.items():
        spec = get_mixer_spec(name)
        made = spec.make_config()
        assert [f["name"] for f in row["config"]] == [f.name for f in dataclasses.fields(spec.config_cls)]
        for f in row["config"]:
            value = getattr(made, f["name"])
            assert f["default"] == (list(value) if isinstance(value, tuple) else value), (name, f)
            assert set(f) == {"name", "type", "default", "help"}
    fields = {f["name"]: f for f in rows["sq1"]["config"]}
    assert fields["pattern"]["default"] == "sq1"  # the registered defaults, not the class's
    assert "tokenmix.patterns" in fields["pattern"]["help"] and fields["chunk_size"]["help"]
    documented = sum(bool(f["help"]) for r in rows.values() for f in r["config"])
    assert documented >= len(rows)  # every mixer has comments on its own fields


def test_every_mixers_option_takes_one_syntax(tmp_path, capsys, monkeypatch):
    from tokenmix.cli import compare_cmd
    from tokenmix.cli.validate import mixer_list
    from tokenmix.mixers.registry import mixer_names

    assert mixer_list(" pow2, attention ,pow2") == ["pow2", "attention"]
    assert mixer_list("all") == mixer_names() and mixer_list(None, default=["pow2"]) == ["pow2"]
    assert mixer_list("none", allow_none=True) == []
    monkeypatch.chdir(tmp_path)
    assert mixer_list(["pow2,attention", "gla"]) == ["pow2", "attention", "gla"]  # commas and spaces
    commands = [
        ["analyze", "cost"],
        ["analyze", "expressivity"],
        ["analyze", "norms"],
        ["compare"],
        ["bench", "decode", "--n", "16"],
        ["bench", "mixers", "--n", "16"],
        ["bench", "lm"],
        ["bench", "hf"],
    ]
    for cmd in commands:
        unknown = one_line_error(run_cli([*cmd, "--mixers", "pow2,nosuch"], capsys), "unknown mixer 'nosuch'")
        empty = one_line_error(run_cli([*cmd, "--mixers", " , "], capsys), "--mixers is empty", "separated by commas")
        assert (
            unknown.split(": error: ")[1]
            == one_line_error(run_cli([*commands[0], "--mixers", "pow2,nosuch"], capsys)).split(": error: ")[1]
        )
        assert empty.split(": error: ")[1].startswith("--mixers is empty; give registered mixer names")
    for cmd in (["analyze", "cost"], ["analyze", "norms"]):
        one_line_error(run_cli([*cmd, "--mixers", "none"], capsys), "--mixers none", "at least one mixer")
    assert not any(tmp_path.iterdir())
    seen = []
    monkeypatch.setattr(compare_cmd, "run_compare", lambda req, console=None: seen.append(req) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main(["compare", "--mixers", "pow2,attention", "gla"])
    assert seen[0].extra_mixers == ("pow2", "attention", "gla")
