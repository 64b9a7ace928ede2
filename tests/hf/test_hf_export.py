"""``tokenmix export --run DIR --hf OUT`` and the registration ``import tokenmix.hf`` makes.

A trained tiny run is exported once; a fresh interpreter that only did ``import tokenmix.hf`` loads
the folder with ``AutoModelForCausalLM`` / ``AutoTokenizer`` offline, and its logits, encodings and
greedy tokens equal tokenmix's own (``load_run``). Bad input is one line and exit status 2, and writes
nothing. ``import tokenmix`` stays light (no torch, no transformers) and registers nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lm_helpers import one_line_error, run_cli, train_tiny_run
from progress_guard import run_guarded
from tokenmix.cli.main import main
from tokenmix.data.tokenizer import separator_id
from tokenmix.generation import SamplingConfig, generate
from tokenmix.runs.lm import load_run

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello<|endoftext|>world",
    "  spaces\n\nand lines ",
    "é ü 漢字",
]
SUBPROCESS_SECONDS = 120  # CPU seconds: a fresh interpreter imports torch and transformers (~5 s of CPU)


def python(code: str, tmp: Path) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(tmp / "hf_home")
    )
    done = run_guarded(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cpu_seconds=SUBPROCESS_SECONDS,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_export")
    run = train_tiny_run(root, main)
    out = root / "hf"
    out.mkdir()  # an empty folder is taken
    rc = main(["export", "--run", str(run), "--hf", str(out)])
    assert rc == 0
    return run, out


def test_export_folder_holds_weights_config_and_tokenizer(exported):
    run, out = exported
    assert {p.name for p in out.iterdir()} >= {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    cfg = json.loads((out / "config.json").read_text())
    trained = json.loads((run / "config.json").read_text())["model"]
    assert cfg["model_type"] == "tokenmix" and cfg["architectures"] == ["TokenmixForCausalLM"]
    assert cfg["layers"] == trained["layers"] and cfg["d_model"] == trained["d_model"]
    weights = load_file(out / "model.safetensors")
    model = load_run(run).model
    assert set(weights) == {f"model.net.{k}" for k in model.state_dict()} - {"model.net.head.weight"}  # tied: once
    for k, v in model.state_dict().items():
        if k != "head.weight":
            assert torch.equal(weights[f"model.net.{k}"], v), k


def test_export_writes_a_model_card(exported):
    """README.md in the folder: what the model is (parameters, every layer's mixer and (A, B) form),
    its training data, its measured results from the run's summary, how to load it, the version."""
    run, out = exported
    card = (out / "README.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    trained = json.loads((run / "config.json").read_text())
    assert card.startswith("---\nlibrary_name: transformers")
    for name in trained["model"]["layers"]:
        assert f"`{name}`" in card
    assert f"{summary['val_ppl']:.2f}" in card and f"{summary['bigram_ppl']:.2f}" in card
    assert trained["data"]["corpus"] in card and "AutoModelForCausalLM.from_pretrained" in card
    assert "tokenmix_heldout" in card and "Written by tokenmix " in card


def test_a_fresh_process_loads_the_export_after_import_tokenmix_hf(exported, tmp_path):
    """Only ``import tokenmix.hf``, then transformers' own classes, offline."""
    run, out = exported
    result = tmp_path / "result.safetensors"
    done = python(
        f"""
        import json, sys
        import tokenmix.hf
        from transformers import AutoModelForCausalLM, AutoTokenizer
        import torch
        from safetensors.torch import save_file
        model = AutoModelForCausalLM.from_pretrained({str(out)!r}, local_files_only=True)
        tok = AutoTokenizer.from_pretrained({str(out)!r}, local_files_only=True)
        texts = {TEXTS!r}
        enc = [tok(t)["input_ids"] for t in texts]
        batch = tok(texts[:2], padding=True, return_tensors="pt")
        with torch.no_grad():
            logits = model(torch.tensor([enc[0]])).logits
            greedy = model.generate(**batch, max_new_tokens=8, do_sample=False)
        save_file({{"logits": logits.contiguous(), "greedy": greedy, "mask": batch["attention_mask"]}}, {str(result)!r})
        print(json.dumps({{"enc": enc, "type": type(model).__name__, "eos": tok.eos_token_id, "pad": tok.pad_token_id,
                          "side": tok.padding_side, "decoded": tok.decode(enc[1])}}))
    """,
        tmp_path,
    )
    info = json.loads(done.stdout.strip().splitlines()[-1])
    loaded = load_run(run)
    sep = separator_id(loaded.tokenizer)
    ours = [loaded.tokenizer.encode(t).ids for t in TEXTS]
    assert info["enc"] == ours and info["decoded"] == TEXTS[1]
    assert info["type"] == "TokenmixForCausalLM" and info["eos"] == info["pad"] == sep and info["side"] == "left"
    tensors = load_file(result)
    with torch.no_grad():
        want, _ = loaded.model(torch.tensor([ours[0]]))
    assert torch.equal(tensors["logits"], want)  # bit for bit
    # greedy, a left-padded batch: transformers stops a row at the separator (then pads with it)
    width = tensors["mask"].shape[1]
    mine = generate(loaded.model, ours[:2], SamplingConfig(max_new_tokens=8, temperature=0.0, stop_token=sep))
    for row, seq in zip(tensors["greedy"][:, width:].tolist(), mine):
        assert row[: len(seq)] == seq and all(t == sep for t in row[len(seq) :])


def test_registration_is_import_tokenmix_hf_and_nothing_else(exported, tmp_path):
    """``import tokenmix`` then transformers registers nothing (no import hook: transformers offers
    only the folder's trust_remote_code shims); ``import tokenmix.hf`` registers the classes."""
    _, out = exported
    python(
        f"""
        import sys
        import tokenmix
        from transformers import AutoConfig, AutoModel
        assert "tokenmix.hf" not in sys.modules
        try:
            AutoConfig.from_pretrained({str(out)!r}, local_files_only=True)
        except ValueError as e:
            assert "custom code" in str(e), e  # only the config's auto_map shims: trust_remote_code
        else:
            raise AssertionError("registered without import tokenmix.hf")
        import tokenmix.hf
        cfg = AutoConfig.from_pretrained({str(out)!r}, local_files_only=True)
        assert type(cfg).__name__ == "TokenmixConfig", type(cfg)
        assert type(AutoModel.from_pretrained({str(out)!r}, local_files_only=True)).__name__ == "TokenmixModel"
    """,
        tmp_path,
    )


def test_import_tokenmix_loads_neither_torch_nor_transformers(tmp_path):
    """``import tokenmix`` (what the command line does first, before it sets OMP_WAIT_POLICY and
    torch loads) imports neither; nor does the command line's parser module load transformers."""
    python(
        """
        import sys
        import tokenmix
        assert "torch" not in sys.modules and "transformers" not in sys.modules, "import tokenmix is not light"
        import tokenmix.cli.main
        assert "transformers" not in sys.modules, "the command line imports transformers"
    """,
        tmp_path,
    )


def test_export_bad_input_is_one_line_and_writes_nothing(exported, tmp_path, capsys):
    run, out = exported
    before = sorted(p.name for p in out.iterdir())
    a_file = tmp_path / "model.bin"
    a_file.write_text("not a folder\n")
    one_line_error(
        run_cli(["export", "--run", str(tmp_path / "missing"), "--hf", str(tmp_path / "x")], capsys), "does not exist"
    )
    one_line_error(
        run_cli(["export", "--run", str(tmp_path), "--hf", str(tmp_path / "x")], capsys), "not a run directory"
    )
    one_line_error(run_cli(["export", "--run", str(run), "--hf", str(a_file)], capsys), "is a file")
    one_line_error(run_cli(["export", "--run", str(run), "--hf", str(out)], capsys), "not empty")
    one_line_error(
        run_cli(["export", "--run", str(run), "--hf", str(tmp_path / "no" / "such")], capsys), "does not exist"
    )
    one_line_error(run_cli(["export", "--run", str(run)], capsys), "--hf")
    assert a_file.read_text() == "not a folder\n"
    assert sorted(p.name for p in out.iterdir()) == before
    assert not (tmp_path / "x").exists() and not (tmp_path / "no").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind


def test_lm_eval_runs_the_shipped_local_tasks_on_the_export(exported, tmp_path):
    """Plain ``lm_eval`` (a process that never imports tokenmix itself) loads the export through its
    trust_remote_code shims and scores both local tasks; the held-out perplexity is finite and the
    multiple-choice accuracy a fraction."""
    run, out = exported
    assert {p.name for p in (out / "lm_eval_tasks").iterdir()} == {
        "tokenmix_heldout.yaml",
        "heldout.jsonl",
        "tokenmix_continuation.yaml",
        "continuation.jsonl",
    }
    items = [json.loads(line) for line in (out / "lm_eval_tasks" / "continuation.jsonl").read_text().splitlines()]
    assert items and all(len(i["choices"]) == 4 and 0 <= i["label"] < 4 for i in items)
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf_home"),
    )
    lm_eval = Path(sys.executable).with_name("lm_eval")
    done = run_guarded(
        [
            str(lm_eval),
            "--model",
            "hf",
            "--model_args",
            f"pretrained={out},trust_remote_code=True",
            "--include_path",
            str(out / "lm_eval_tasks"),
            "--tasks",
            "tokenmix_heldout,tokenmix_continuation",
            "--limit",
            "4",
            "--device",
            "cpu",
            "--batch_size",
            "2",
            "--output_path",
            str(tmp_path / "res"),
        ],
        env=env,
        cpu_seconds=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(next((tmp_path / "res").rglob("results_*.json")).read_text())["results"]
    ppl = results["tokenmix_heldout"]["word_perplexity,none"]
    acc = results["tokenmix_continuation"]["acc,none"]
    assert torch.isfinite(torch.tensor(ppl)) and ppl > 1 and 0.0 <= acc <= 1.0
    # our task files state every metric's aggregation and direction: lm-eval warns about none of them
    task_warnings = [
        line
        for line in done.stderr.splitlines()
        if "WARNING" in line and any(w in line for w in ("aggregation", "higher_is_better", "tokenmix_"))
    ]
    assert not task_warnings, task_warnings
