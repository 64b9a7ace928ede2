"""``train.pack``: LM windows whose documents keep to themselves, in training and evaluation, and
``tokenmix eval --per-document``.

- the packing of a window begins a document at every separator;
- a packed window's loss is the sum of its documents' losses, each scored alone (float64 model);
- a packed run's first step trains on exactly that loss (recomputed here from its first batch and
  its initial weights), which differs from the unpacked loss of the same batch;
- ``eval --per-document`` scores every document of the split once: each target once, the split's
  document names in order, the overall perplexity the token-weighted one.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from lm_helpers import run_cli, train_tiny_run
from tokenmix.cli.main import main
from tokenmix.data.loader import TokenBatches
from tokenmix.data.prepare import PreparedData
from tokenmix.data.tokenizer import separator_id
from tokenmix.models import MixerModel
from tokenmix.models.model import ModelConfig
from tokenmix.runs.lm import read_run_config
from tokenmix.training.lm_eval import document_packing, evaluate_windows

pytestmark = pytest.mark.usefixtures("one_thread")

SEP = 7


def test_documents_begin_at_separators():
    p = document_packing(torch.tensor([[5, SEP, 3, SEP, SEP, 4]]), SEP)
    assert p.starts.tolist() == [[0, 1, 1, 3, 4, 4]]
    assert document_packing(torch.tensor([[5, SEP]]), None) is None


def test_a_packed_window_scores_each_document_alone():
    torch.manual_seed(0)
    model = MixerModel(ModelConfig(vocab_size=12, d_model=16, n_heads=2, layers=("mamba2", "attention"))).double()
    window = torch.tensor([3, 4, SEP, 5, 6, 2, SEP, 9, 1])
    pieces = [window[:3], window[2:7], window[6:]]  # each document with the separator that ends it
    packed = evaluate_windows(model, [window], 1, torch.device("cpu"), separator=SEP)
    alone = [evaluate_windows(model, [w], 1, torch.device("cpu")) for w in pieces]
    unpacked = evaluate_windows(model, [window], 1, torch.device("cpu"))
    assert packed["tokens"] == sum(a["tokens"] for a in alone) == len(window) - 1
    want = sum(a["loss"] * a["tokens"] for a in alone)
    assert packed["loss"] * packed["tokens"] == pytest.approx(want, rel=1e-12)
    assert abs(unpacked["loss"] - packed["loss"]) > 1e-6  # the unpacked window reads across documents


def test_a_packed_run_trains_on_the_documents_alone_and_evaluates_per_document(tmp_path, capsys):
    # documents of ~400 tokens, so that the first batch's windows hold separators
    run = train_tiny_run(
        tmp_path, main, "train.pack=true", "data.doc_chars=400", "train.seq_len=128", "train.batch_size=16"
    )
    cfg = read_run_config(run)
    data = PreparedData(sorted((tmp_path / "cache").rglob("meta.json"))[0].parent)
    sep = separator_id(data.tokenizer)
    batch = TokenBatches(data.split("train"), cfg.train.seq_len, cfg.train.batch_size, cfg.train.seed).next_batch()
    assert bool((batch[:, 1:-1] == sep).any())  # else the two losses could not differ
    torch.manual_seed(cfg.train.seed)
    model = MixerModel(cfg.model)
    with torch.no_grad():
        losses = {}
        for key, packing in (("packed", document_packing(batch[:, :-1], sep)), ("unpacked", None)):
            logits, _ = model(batch[:, :-1], packing=packing)
            losses[key] = float(F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()))
    first = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line][0]
    assert first["step"] == 1
    # at the initial weights the two differ little (logits near uniform), but far beyond float32 noise
    gap = abs(losses["packed"] - losses["unpacked"])
    assert gap > 1e-5
    assert abs(first["loss"] - losses["packed"]) < gap / 20

    rc, out, err = run_cli(["eval", "--run", str(run), "--split", "val", "--per-document", "--json"], capsys)
    assert rc == 0, err
    res = json.loads(out)
    assert res["packed"] is True
    docs = res["documents"]
    assert [d["name"] for d in docs] == data.meta["splits"]["val"]["documents"]
    assert sum(d["tokens"] for d in docs) == len(data.split("val")) - 1  # every target once
    total = sum(d["loss"] * d["tokens"] for d in docs) / sum(d["tokens"] for d in docs)
    assert res["document_ppl"] == pytest.approx(math.exp(total))
